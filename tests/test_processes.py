"""pid_alive: the one answer to "does the process a file names still run?"."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hermes_actors.store.processes import PID_MAX, pid_alive


def test_this_process_is_alive_and_a_reaped_child_is_not() -> None:
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not pid_alive(child.pid)


def test_a_killed_child_not_reaped_yet_is_not_alive() -> None:
    """Regression: a gateway killed -9 stays a zombie until its parent reaps it; signal 0 still reached it, so
    its Redis lease blocked its own restart for up to 15 s."""
    import signal

    from actors.testkit import await_condition

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        child.send_signal(signal.SIGKILL)

        def zombie() -> bool:
            with open(f"/proc/{child.pid}/stat", "rb") as f:
                return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"

        await_condition(zombie, timeout=30, message="the killed child is a zombie (not reaped: we have not waited)")
        assert not pid_alive(child.pid)
    finally:
        child.wait()


@pytest.mark.parametrize("pid", [0, -1, PID_MAX + 1, 2**70, True, "1", 1.0, None])
def test_what_is_not_a_plausible_pid_is_not_alive(pid: object) -> None:
    assert pid_alive(pid) is False  # type: ignore[arg-type]


def test_another_users_process_counts_as_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")  # what os.kill says of another user's process

    monkeypatch.setattr(os, "kill", refuse)
    assert pid_alive(4242) is True
