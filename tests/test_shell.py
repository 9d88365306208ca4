"""Commands we print for the user to run (``core.shell``): each word quoted, so the command runs as printed."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from hermes_actors.core.shell import shell_command


@pytest.mark.parametrize(
    ("words", "printed"),
    [
        (("hermes-actors", "serve", "--root", Path("/home/me/.hermes")), "hermes-actors serve --root /home/me/.hermes"),
        (("hermes-actors", "room", "show", "--root", "/srv/my hermes", "my team"),
         "hermes-actors room show --root '/srv/my hermes' 'my team'"),
        (("hermes-actors", "room", "show", "--root", "/r", "it's"), "hermes-actors room show --root /r 'it'\"'\"'s'"),
        (("hermes-actors", "outcome", "--root", "/r", ""), "hermes-actors outcome --root /r ''"),
        (("hermes-actors", "outcome", "--root", "/r;rm -rf ~"), "hermes-actors outcome --root '/r;rm -rf ~'"),
    ],
)
def test_shell_command_quotes_each_word_that_needs_it(words: tuple[object, ...], printed: str) -> None:
    assert shell_command(*words) == printed
    assert shlex.split(printed) == [str(word) for word in words]


def test_shell_command_sets_a_variable_the_shell_reads_as_an_assignment(tmp_path: Path) -> None:
    """``HERMES_HOME='/x y' hermes …``: quoting the whole ``NAME=value`` word would make it the command's name."""
    root = tmp_path / "my hermes"
    line = shell_command("sh", "-c", 'printf %s "$HERMES_HOME"', env={"HERMES_HOME": root})
    assert line.startswith(f"HERMES_HOME={shlex.quote(str(root))} sh -c "), line
    ran = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True, timeout=30)
    assert ran.stdout == str(root)  # pasted into a shell, it runs as printed


@pytest.mark.parametrize(
    ("words", "printed"),
    [
        (("hermes-actors", "serve", "--root", "/r/root\x1b[7mX"), "hermes-actors serve --root $'/r/root\\x1b[7mX'"),
        (("hermes-actors", "room", "show", "--root", "/r", "it's \\ plän\x07"),
         "hermes-actors room show --root /r $'it\\'s \\\\ plän\\x07'"),
        (("hermes-actors", "room", "show", "--root", "/r", "\u202eplan\x85"),
         "hermes-actors room show --root /r $'\\xe2\\x80\\xaeplan\\xc2\\x85'"),
    ],
    ids=["esc", "quote-backslash-bel", "bidi-c1"],
)
def test_a_word_with_a_control_character_is_ansi_c_quoted(words: tuple[object, ...], printed: str) -> None:
    """Regression (CLI review): `status` suggested `hermes-actors serve --root '/r/root\\x1b[7mX'` once its line was
    escaped for the terminal (shlex.quote left the ESC raw): pasted, the root it names is another one, with a
    backslash and an x. A control character is now written as the \\xHH of its UTF-8 bytes inside $'…', which
    shows no control character and which bash reads back as the word, whatever its locale."""
    from hermes_actors.core.printable import printable

    assert shell_command(*words) == printed
    assert printable(printed) == printed  # nothing left for the terminal to act on
    ran = subprocess.run(["bash", "-c", printed.replace("hermes-actors", 'printf "%s\\0"', 1)], capture_output=True,
                         check=True, timeout=30, env={"LC_ALL": "C"})
    assert ran.stdout.decode().split("\0")[:-1] == [str(word) for word in words[1:]]  # pasted, it runs as printed


def test_an_assigned_value_with_a_control_character_is_ansi_c_quoted(tmp_path: Path) -> None:
    root = tmp_path / "r\x1bX"
    line = shell_command("sh", "-c", 'printf %s "$HERMES_HOME"', env={"HERMES_HOME": root})
    assert line.startswith(f"HERMES_HOME=$'{tmp_path}/r\\x1bX' sh -c "), line
    ran = subprocess.run(["bash", "-c", line], capture_output=True, check=True, timeout=30)
    assert ran.stdout.decode() == str(root)


def test_a_byte_of_a_file_name_that_is_no_utf8_is_written_as_the_byte(tmp_path: Path) -> None:
    """Regression (docs review): ``shell_command("rm", "/x/j-\\udcff.log")`` printed ``rm '/x/j-\\udcff.log'``, the
    surrogate os.fsdecode gives for the byte 0xff, single-quoted: pasted, bash was given other bytes and said "No such
    file or directory". The byte is now written as ``\\xff`` inside $'…', as control characters are."""
    import os

    name = os.fsdecode(os.fsencode(str(tmp_path)) + b"/j-\xff.log")
    assert name.endswith("j-\udcff.log")
    Path(name).write_bytes(b"")
    line = shell_command("rm", name)
    assert line == f"rm $'{tmp_path}/j-\\xff.log'", line
    ran = subprocess.run(["bash", "-c", line], capture_output=True, timeout=30, env={"LC_ALL": "C"})
    assert ran.returncode == 0, ran.stderr
    assert not Path(name).exists()  # pasted, it removed the file it names
