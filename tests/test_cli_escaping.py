"""Terminal control characters in what the CLI prints: names and paths from disk and values typed are shown
escaped (``\\x1b``), never acted on by the terminal, on every line of every command and in its log lines;
``--json`` stays JSON; a command printed to run is quoted to run as printed (``$'…'``)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from roots import make_root

from hermes_actors.cli.main import main

_ESC_ROOT = "root\x1b[7mX"  # a root whose path holds an ESC sequence (reverse video)
_RAW = ("\x1b", "\x07")


def _shown(path: Path) -> str:
    return str(path).replace("\x1b", "\\x1b")


def _no_raw_control(text: str) -> None:
    assert not any(raw in text for raw in _RAW), ascii(text)


def test_doctor_and_its_warnings_show_profile_folder_names_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (CLI review): a profile folder named with an OSC sequence reached the terminal raw, in doctor's
    `profile folders` line and in the WARNING log line: `…/profiles/lnk^[]0;pwned^G: it is a symlink…` set the
    terminal's title."""
    root = make_root(tmp_path)
    (root / "profiles" / "evil\x1b[31mRED").mkdir()
    (root / "profiles" / "lnk\x1b]0;pwned\x07").symlink_to(tmp_path)
    main(["doctor", "--root", str(root)])
    out, err = capsys.readouterr()
    _no_raw_control(out)
    _no_raw_control(err)
    link = f"{root}/profiles/lnk\\x1b]0;pwned\\x07"
    assert f"profile folders: skipping profile {link}: it is a symlink" in out, out
    assert "'evil\\x1b[31mRED'" in out, out
    assert [line for line in err.splitlines() if "WARNING" in line and f"{link}: it is a symlink" in line], err


@pytest.mark.parametrize(("argv", "line"), [
    (["enable", "--profiles", "a\x1b[2Jb"], "error: no such profile on R: a\\x1b[2Jb (known: default, alice, bob, "
                                            "carol)"),
    (["doctor", "--cli", "x\x1b[2Jy"], "error: --cli x\\x1b[2Jy: no executable file by that path or name on PATH; "
                                       "give the hermes executable's path, or leave --cli out (it is then found "
                                       "beside python, then on PATH)"),
], ids=["enable --profiles", "doctor --cli"])
def test_error_lines_show_the_values_typed_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], line: str
) -> None:
    """Regression (CLI review): `enable --profiles $'a\\e[2Jb'` printed `error: no such profile …: a^[[2Jb` (the
    screen cleared), `doctor --cli $'x\\e[2Jy'` `error: --cli x^[[2Jy: …`."""
    root = make_root(tmp_path)
    assert main([argv[0], "--root", str(root), *argv[1:]]) == 2
    assert capsys.readouterr().err == line.replace("R", str(root), 1) + "\n"


def test_enable_and_disable_show_a_root_path_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression (CLI review): on a root whose path holds an ESC, enable and disable printed
    `hermes-actors enable on …root^[[7mX:` and each `changed: …` line raw."""
    root = make_root(tmp_path, managed=False, name=_ESC_ROOT)
    for command in ("enable", "disable"):
        assert main([command, "--root", str(root)]) == 0
        out, err = capsys.readouterr()
        _no_raw_control(out + err)
        lines = out.splitlines()
        assert lines[0] == f"hermes-actors {command} on {_shown(root)}:", lines
        assert f"  changed: {_shown(root)}/config.yaml: " in out, out


def test_serve_shows_a_root_path_escaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (CLI review): on such a root serve printed `gateway serving …root^[[7mX as …`."""
    from hermes_actors.cli import serve as serve_module

    root = make_root(tmp_path, name=_ESC_ROOT)
    stop = threading.Event()
    real_serve = serve_module.serve

    def serve_until_ready(*args: Any, **kwargs: Any) -> int:  # the command's own serve, stopped once it serves
        return real_serve(*args, **kwargs, stop=stop, on_ready=lambda _: stop.set())

    monkeypatch.setattr(serve_module, "serve", serve_until_ready)
    assert main(["serve", "--root", str(root), "--runner", "demo"]) == 0
    out, err = capsys.readouterr()
    _no_raw_control(out + err)
    assert out.startswith(f"gateway serving {_shown(root)} as (no connection id): @hermes"), out


def test_status_prints_a_start_command_that_runs_as_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (CLI review): status said `start one: hermes-actors serve --root '…/root\\x1b[7mX'`: safe to
    show, but pasted it names another root (a backslash, an x, ...), not the one with the ESC. The word is ANSI-C
    quoted now, which the shell reads back as the root's path."""
    root = make_root(tmp_path, name=_ESC_ROOT)
    assert main(["status", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    _no_raw_control(out)
    command = out.split("(start one: ", 1)[1].split(")\n", 1)[0]
    assert command == f"hermes-actors serve --root $'{_shown(root)}'", command
    argv = subprocess.run(["bash", "-c", command.replace("hermes-actors", 'printf "%s\\0"', 1)], capture_output=True,
                          check=True, timeout=30).stdout.decode().split("\0")[:-1]
    assert argv == ["serve", "--root", str(root)]


def test_json_output_stays_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The escaping of the human lines leaves a --json document as it is: a DEL or a bidi override in a title
    is the title's, and ``\\x7f`` would be no JSON."""
    title = "M\x7fX\u202eY\x1b"
    root = make_root(tmp_path, {"alice": {"title": title}, "bob": {}})
    assert main(["roster", "--root", str(root), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["title"] for row in rows if row["handle"] == "alice"] == [title]
    assert main(["roster", "--root", str(root)]) == 0
    assert "M\\x7fX\\u202eY\\x1b" in capsys.readouterr().out


def test_the_benchmark_progress_bar_draws_as_it_is(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bar redraws its line with ``\\r`` and an ESC sequence on purpose: `hermes-actors bench` runs the benchmark
    within ``unescaped_output``, so what it writes reaches the terminal as it is. Regression (diff review): this
    test called ``unescaped_output`` itself, never the command, so it passed with the wrapper gone from
    ``_cmd_bench``."""
    import bench.harness

    given: list[bool] = []

    def draw_the_bar(quick: bool, *args: object, **kwargs: object) -> int:  # the benchmark, stubbed: its bar only
        given.append(quick)
        sys.stderr.write("\r[###]\x1b[K")
        return 0

    monkeypatch.setattr(bench.harness, "run_command", draw_the_bar)
    assert main(["bench", "--quick"]) == 0
    assert given == [True]
    assert capsys.readouterr().err == "\r[###]\x1b[K"


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal (the CLI's log lines are then coloured)."""

    def isatty(self) -> bool:
        return True


def _log_a_failure(stderr: io.StringIO) -> str:
    """What the CLI's log sink writes to ``stderr`` for a WARNING with a traceback, both holding control sequences."""
    from loguru import logger

    from hermes_actors.cli.main import _enable_logging
    from hermes_actors.cli.streams import output_streams

    saved = sys.stderr
    sys.stderr = stderr
    try:
        with output_streams():
            _enable_logging(0)
            try:
                raise RuntimeError("runner failed in /srv/root\x1b]0;pwned\x07")
            except RuntimeError:
                logger.opt(exception=True).warning("message with ESC \x1b[2J here")
    finally:
        sys.stderr = saved
        logger.remove()
    return stderr.getvalue()


@pytest.mark.parametrize("stderr", [io.StringIO, _Terminal], ids=["plain", "terminal"])
def test_a_log_line_s_traceback_is_shown_escaped(
    stderr: type[io.StringIO], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (diff review): the log format escaped the message only: a traceback's last line
    (``RuntimeError: runner failed in /srv/root^[]0;pwned^G``) set the terminal's title. On a terminal the
    line's colours stay colours."""
    monkeypatch.delenv("LOGURU_FORMAT", raising=False)
    written = _log_a_failure(stderr())
    assert "\x1b]0;pwned" not in written and "\x1b[2J" not in written and "\x07" not in written, ascii(written)
    assert "message with ESC \\x1b[2J here" in written, ascii(written)
    assert "\nTraceback (most recent call last):\n" in written, ascii(written)
    assert written.endswith("RuntimeError: runner failed in /srv/root\\x1b]0;pwned\\x07\n"), ascii(written)
    assert ("\x1b[32m" in written) is (stderr is _Terminal), ascii(written)  # the time, green


def test_loguru_format_shapes_the_cli_s_log_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (diff review): the CLI's log line was a hard-coded copy of loguru's default, LOGURU_FORMAT no
    longer applied. It does again, its message and exception still shown escaped."""
    monkeypatch.setenv("LOGURU_FORMAT", "{level} | {message}")
    written = _log_a_failure(io.StringIO())
    assert written.startswith("WARNING | message with ESC \\x1b[2J here\nTraceback (most recent call last):\n")
    assert written.endswith("RuntimeError: runner failed in /srv/root\\x1b]0;pwned\\x07\n"), ascii(written)


@pytest.mark.parametrize(("template", "line"), [
    ("{time} {message}", "{time} {extra[printable_message]}\n{extra[printable_exception]}"),
    ("<red>{message:>10}</red> {name}", "<red>{extra[printable_message]:>10}</red> {name}\n"
                                        "{extra[printable_exception]}"),
    ("{message!r} then {exception}", "{extra[printable_message]!r} then {extra[printable_exception]}"),
    ("{messages} {exceptions}", "{messages} {exceptions}\n{extra[printable_exception]}"),
], ids=["plain", "spec-and-markup", "exception-in-place", "other-fields"])
def test_the_log_line_reads_the_escaped_message_and_exception(template: str, line: str) -> None:
    from hermes_actors.cli.main import log_line

    assert log_line(template) == line
