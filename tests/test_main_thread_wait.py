"""``ops.main_thread_wait.MainThreadWait``: the main thread's wait that any signal, a ``wake()`` or a set event ends."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from hermes_actors.ops.main_thread_wait import MainThreadWait

REPO = Path(__file__).resolve().parent.parent


def _in_a_child(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` as a script's main thread (a wait that never ends fails by the timeout, not by a hung suite)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                          stdin=subprocess.DEVNULL)


def test_a_wake_from_another_thread_ends_the_wait() -> None:
    done = threading.Event()
    with MainThreadWait() as waits:
        def finish() -> None:
            done.set()
            waits.wake()

        threading.Thread(target=finish).start()
        waits.until(done.is_set)
    assert done.is_set()


@pytest.mark.skipif(resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 1200, reason="needs 1200 open files")
def test_a_wait_whose_pipe_is_numbered_past_1023_works() -> None:
    """Regression (review): select() refuses a descriptor numbered 1024 or more, and serve and the hub raised
    "filedescriptor out of range in select()" at once in a process holding that many files."""
    result = _in_a_child(
        "import os, resource, threading\n"
        "from hermes_actors.ops.main_thread_wait import MainThreadWait\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))\n"
        "held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]\n"
        "looks = []\n"
        "with MainThreadWait() as waits:\n"
        "    assert waits._read >= 1024, waits._read\n"
        "    waits.wake()  # one wake-up waiting: the first look fails, so the wait polls once, then returns\n"
        "    waits.until(lambda: looks.append(1) or len(looks) > 1)\n"
        "print('woken')\n"
    )
    assert result.returncode == 0 and "woken" in result.stdout, result.stderr


def test_a_callers_event_set_by_another_thread_ends_the_main_threads_wait() -> None:
    """Regression (review): ``run_hub(stop=event)`` and ``serve(stop=event)`` on the main thread never returned
    when another thread set the event: only a signal or a ``wake()`` ended the wait."""
    result = _in_a_child(
        "import threading\n"
        "from hermes_actors.ops.main_thread_wait import MainThreadWait\n"
        "stop = threading.Event()\n"
        "with MainThreadWait() as waits:\n"
        "    assert waits.on_signals\n"
        "    threading.Thread(target=stop.set).start()\n"
        "    waits.until_set(stop)\n"
        "print('stopped')\n"
    )
    assert result.returncode == 0 and "stopped" in result.stdout, result.stderr


def test_waits_a_raising_signal_handler_ends_share_one_watcher_thread_which_ends_with_the_event() -> None:
    """Regression (review): ``until_set`` started a watcher thread per wait that ended only once the event was set;
    a wait ended by an exception instead (a signal's handler raising KeyboardInterrupt) left it waiting, one more
    thread per such wait for as long as the event stayed unset (20 interrupted waits: 20 threads). One watcher per
    event now, whichever waits use it (no polling: it ends when the event is set), and a later wait is still woken."""
    result = _in_a_child(
        "import os, signal, threading, time\n"
        "from hermes_actors.ops.main_thread_wait import MainThreadWait\n"
        "def interrupt(*_):\n"
        "    raise KeyboardInterrupt\n"
        "signal.signal(signal.SIGUSR1, interrupt)\n"
        "class Interrupted(MainThreadWait):\n"
        "    def until(self, done):  # the signal comes once the wait is under way: its handler raises in it\n"
        "        os.kill(os.getpid(), signal.SIGUSR1)\n"
        "        super().until(done)\n"
        "event = threading.Event()\n"
        "for _ in range(20):\n"
        "    with Interrupted() as waits:\n"
        "        try:\n"
        "            waits.until_set(event)\n"
        "        except KeyboardInterrupt:\n"
        "            pass\n"
        "        else:\n"
        "            raise SystemExit('the wait was not interrupted')\n"
        "watchers = [t for t in threading.enumerate() if t.name == 'stop-event-watch']\n"
        "print('watchers', len(watchers))\n"
        "threading.Timer(0.2, event.set).start()  # a later wait on the same event is woken by its set()\n"
        "with MainThreadWait() as waits:\n"
        "    waits.until_set(event)\n"
        "for thread in watchers:\n"
        "    thread.join(30)\n"
        "print('left', sum(t.is_alive() for t in watchers))\n"
    )
    assert result.returncode == 0, result.stderr
    assert "watchers 1\n" in result.stdout and "left 0" in result.stdout, result.stdout


def test_a_wait_interrupted_before_its_watcher_started_leaves_no_entry_behind() -> None:
    """Regression (review): an exception from a signal's handler landing between registering the wait and
    starting the event's watcher left the event registered with no watcher behind it: the next wait on the
    event found the entry, started none, and only another signal woke it (serve would not restart a failed
    gateway until a signal came). The handler's exception is put at that line with a trace function, as a
    handler runs between two bytecodes."""
    result = _in_a_child(
        "import inspect, signal, sys, threading\n"
        "from hermes_actors.ops import main_thread_wait as m\n"
        "src, first = inspect.getsourcelines(m.MainThreadWait.until_set)\n"
        "line = first + next(i for i, text in enumerate(src) if 'if waits is mine' in text)\n"
        "armed = [True]\n"
        "def tracer(frame, event, arg):\n"
        "    if frame.f_code is not m.MainThreadWait.until_set.__code__:\n"
        "        return None\n"
        "    def local(frame, event, arg):\n"
        "        if event == 'line' and frame.f_lineno == line and armed[0]:\n"
        "            armed[0] = False\n"
        "            raise KeyboardInterrupt('a handler raised')\n"
        "        return local\n"
        "    return local\n"
        "event = threading.Event()\n"
        "with m.MainThreadWait() as waits:\n"
        "    sys.settrace(tracer)\n"
        "    try:\n"
        "        waits.until_set(event)\n"
        "    except KeyboardInterrupt:\n"
        "        pass\n"
        "    sys.settrace(None)\n"
        "    assert not armed[0], 'the interrupt never landed'\n"
        "    print('entry left', event in m._WATCHED)\n"
        "    def too_late(*_):\n"
        "        raise SystemExit('the next wait was not woken by the set()')\n"
        "    signal.signal(signal.SIGALRM, too_late)\n"
        "    signal.alarm(30)  # before the child's own 60 s deadline: a clear failure\n"
        "    threading.Timer(0.1, event.set).start()\n"
        "    waits.until_set(event)\n"
        "    signal.alarm(0)\n"
        "print('woken by the set')\n"
    )
    assert result.returncode == 0, result.stderr
    assert "entry left False" in result.stdout and "woken by the set" in result.stdout, result.stdout


def _out_of_descriptors(*_args: Any) -> tuple[int, int]:
    raise OSError(errno.EMFILE, "Too many open files")


def test_a_wait_that_cannot_make_its_pipe_is_a_plain_wait_that_wake_and_events_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression (review): out of descriptors, entering the wait raised EMFILE (and so serve's stop on a SIGTERM)."""
    monkeypatch.setattr(os, "pipe2", _out_of_descriptors)
    done, event = threading.Event(), threading.Event()
    with MainThreadWait() as waits:
        assert not waits.on_signals  # no pipe: no signal wakes it, as on another thread

        def finish() -> None:
            done.set()
            waits.wake()

        threading.Thread(target=finish).start()
        waits.until(done.is_set)
        threading.Thread(target=event.set).start()
        waits.until_set(event)
    assert done.is_set() and event.is_set()
    with pytest.raises(RuntimeError, match="outside its with-block"):
        waits.until(done.is_set)


def test_serve_out_of_descriptors_at_its_stop_still_stops_its_gateway_and_exits_0(
    root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (review): a SIGTERM while serve's descriptors were exhausted (a flood of HTTP clients) failed in
    the stop's wait (os.pipe2: EMFILE): serve exited 1 with an error, its gateway stopped only at interpreter exit."""
    from hermes_actors.cli.serve import serve

    stop = threading.Event()

    def on_ready(_endpoint: Any) -> None:  # serving: from now on no pipe can be made, then the stop is asked
        monkeypatch.setattr(os, "pipe2", _out_of_descriptors)
        stop.set()

    code = serve(root, connection_id=None, runner=lambda turn: "ok", stop=stop, on_ready=on_ready)
    assert code == 0
    assert capsys.readouterr().err.splitlines()[-1] == "gateway stopped"
    assert not (root / "bot_relay" / "run" / "submit.sock").exists()  # the gateway's stop removed its endpoint
