"""The CLI's own output channels: a command started with stdout (or stderr) closed, or with a stdout that cannot
be written (``> /dev/full``), through the real command in a child process."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.cli.streams import STDOUT_CLOSED_NOTE, stdout_error_line
from hermes_actors.demo.bots import create_demo_root

_MAIN = "from hermes_actors.cli.main import main; raise SystemExit(main())"


def _argv(args: list[str], redirect: str) -> list[str]:
    """The command run by a shell that sets up its descriptors as ``redirect`` says (``>&-``: stdout closed)."""
    return ["/bin/sh", "-c", f'exec "$@" {redirect}', "sh", sys.executable, "-c", _MAIN, *args]


def _run(args: list[str], redirect: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_argv(args, redirect), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120)


def _replied_delivery(root: Path) -> str:
    with Gateway(root, runner="demo") as gw:
        ack = gw.message_agent(sender="hermes", target="scout", message="hi")
        assert gw.wait_outcome(ack["delivery_id"], timeout=30)["status"] == "replied"
    return str(ack["delivery_id"])


def _status(root: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", _MAIN, "status", "--root", str(root), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


# (id, argv with R for the root and D for a replied delivery id, exit code: None as with stdout open)
COMMANDS = [
    ("status --json", ["status", "--root", "R", "--json"], 0),
    ("status", ["status", "--root", "R"], 0),
    ("doctor", ["doctor", "--root", "R"], None),
    ("roster", ["roster", "--root", "R"], 0),
    ("room list", ["room", "list", "--root", "R"], 0),
    ("outcome", ["outcome", "--root", "R", "D"], 0),
    ("send --wait", ["send", "--root", "R", "--from", "hermes", "scout", "hi", "--runner", "demo", "--wait", "60"], 0),
    ("demo", ["demo"], 0),
]


@pytest.mark.parametrize(("argv", "code"), [c[1:] for c in COMMANDS], ids=[c[0] for c in COMMANDS])
def test_a_command_with_stdout_closed_does_its_work_and_exits_as_it_went(
    tmp_path: Path, argv: list[str], code: int | None
) -> None:
    """Regression (CLI fuzz): every command started with stdout closed (`>&-`) did its work, then died on
    `sys.stdout.flush()` (AttributeError: 'NoneType' object has no attribute 'flush'), a traceback and exit 1: a
    `send` whose DM was replied read as a failure (a script would resend it). Now the output is dropped, said
    once on stderr, and the exit code is the command's."""
    root = create_demo_root(tmp_path / "root")
    delivery = _replied_delivery(root) if "D" in argv else ""
    args = [str(root) if a == "R" else delivery if a == "D" else a for a in argv]
    if code is None:  # what the command says with stdout open
        code = _run(args, "").returncode
    done = _run(args, ">&-")
    assert done.returncode == code, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.count(STDOUT_CLOSED_NOTE) == 1, done.stderr[-2000:]
    if argv[0] == "send":  # the DM was run and replied: what the exit code 0 says
        assert _status(root)["counters"]["by_status"] == {"replied": 1}


def test_serve_with_stdout_closed_serves_and_stops_cleanly(tmp_path: Path) -> None:
    """Regression (CLI fuzz): `serve >&-` served, stopped cleanly on Ctrl-C, then exited 1 with a traceback (a
    service manager read a failure)."""
    from hermes_actors.hermes.submit_client import fetch_outcome, fetch_roster, submit_dm
    from hermes_actors.hermes.submit_socket import HostLost, HostOffline

    root = create_demo_root(tmp_path / "root")
    proc = subprocess.Popen(_argv(["serve", "--root", str(root), "--runner", "demo"], ">&-"),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def hosted() -> bool:
            assert proc.poll() is None, "serve exited before it served"
            try:
                return bool(fetch_roster(root))
            except (HostOffline, HostLost):
                return False

        await_condition(hosted, timeout=60, interval=0.05, message="serve hosts the root")
        ack = submit_dm(root, "hermes", "scout", "hi")
        assert fetch_outcome(root, ack["delivery_id"], wait=30)["status"] == "replied"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "gateway stopped" in err, err
    assert err.count(STDOUT_CLOSED_NOTE) == 1, err


def test_relay_with_stdout_closed_stops_cleanly(tmp_path: Path) -> None:
    """Regression (CLI fuzz): `relay >&-` stopped on Ctrl-C, then exited 1 with a traceback."""
    root = create_demo_root(tmp_path / "root")
    proc = subprocess.Popen(_argv(["relay", "--root", str(root)], ">&-"), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().rstrip("\n") == STDOUT_CLOSED_NOTE
        # said once the hub runs (a hub of one root relays nothing, and says so)
        assert proc.stderr.readline().startswith("warning: a relay hub joins two or more roots")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert err.strip().splitlines() == ["relay hub stopped"], err


def test_a_command_with_stderr_closed_runs_and_exits_as_it_went(tmp_path: Path) -> None:
    """Regression (CLI fuzz, found with the stdout one): with stderr closed every command died before doing
    anything (`sys.stderr.isatty()` on None, a traceback nobody saw, exit 1), a missing root included."""
    root = create_demo_root(tmp_path / "root")
    done = _run(["send", "--root", str(root), "--from", "hermes", "scout", "hi", "--runner", "demo", "--wait", "60",
                 "--json"], "2>&-")
    assert done.returncode == 0
    assert json.loads(done.stdout.splitlines()[-1])["status"] == "replied"  # the outcome, on stdout
    assert _run(["status", "--root", str(tmp_path / "missing")], "2>&-").returncode == 2  # a usage error
    assert _run(["status", "--root", str(tmp_path / "missing")], "2>&- >&-").returncode == 2


def test_a_stdout_that_cannot_be_written_is_named_as_stdout(tmp_path: Path) -> None:
    """Regression (CLI fuzz): with stdout on a full disk (`> /dev/full`) a command said `error: [Errno 28] No
    space left on device; free space on its filesystem`, naming no file: it reads as the root's disk."""
    root = create_demo_root(tmp_path / "root")
    done = _run(["status", "--root", str(root), "--json"], "> /dev/full")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: cannot write stdout (/dev/full): No space left on device (ENOSPC); free space on its filesystem"]


@pytest.mark.parametrize(("code", "target", "line"), [
    (errno.ENOSPC, "/dev/full", "cannot write stdout (/dev/full): No space left on device (ENOSPC); free space on "
                                "its filesystem"),
    (errno.EIO, "/srv/out.txt", "cannot write stdout (/srv/out.txt): Input/output error (EIO)"),
    (errno.EDQUOT, None, "cannot write stdout: Disk quota exceeded (EDQUOT); free space or raise the disk quota of "
                         "the user running hermes-actors"),
])
def test_the_stdout_error_line_names_stdout_and_what_to_do(code: int, target: str | None, line: str) -> None:
    import os

    assert stdout_error_line(OSError(code, os.strerror(code)), target) == line
