"""Interop at the process boundary: another process holding a profile's turn flock.

An old gateway or the ``hermes`` CLI on the same root serializes its Bot Chat
turns on ``<root>/bot_relay/locks/<profile>.lock``. While another process
holds it our turn for that profile must wait (bounded by
``turn_wait_seconds``), and while we run a turn, the other process must not
get the lock.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from roots import RecordingRunner, body_of, start_gateway

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.messages import Turn
from hermes_actors.store import turnlock

# Holds the lock until it reads a line on stdin (mode "hold"), or tries it once without blocking ("try").
HOLDER = r"""
import fcntl, os, sys
mode, path = sys.argv[1], sys.argv[2]
os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
if mode == "try":
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("busy", flush=True)
    else:
        print("acquired", flush=True)
    sys.exit(0)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.readline()
fcntl.flock(fd, fcntl.LOCK_UN)
print("released", flush=True)
"""


def lock_path(root: Path, profile: str) -> Path:
    return root / "bot_relay" / "locks" / f"{profile}.lock"


class Holder:
    """Another process holding a profile's flock until :meth:`release`."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, "hold", str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "locked"

    def release(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write("\n")
            self.proc.stdin.flush()
            assert self.proc.stdout.readline().strip() == "released"
        self.proc.wait(timeout=10)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    held: list[Holder] = []
    yield held
    for h in held:
        h.kill()




def entering_runner() -> tuple[RecordingRunner, threading.Event]:
    entered = threading.Event()

    def behave(turn: Turn) -> str:
        entered.set()
        return f"got {body_of(turn.content)}"

    return RecordingRunner(behave), entered


class BusyFlocks:
    """Counts this process's non-blocking flock attempts refused because another process holds the lock."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.refused = 0
        self._lock = threading.Lock()
        real = turnlock.flock_now

        def flock(fd: int, operation: int) -> None:
            try:
                real(fd, operation)
            except BlockingIOError:
                with self._lock:
                    self.refused += 1
                raise

        monkeypatch.setattr(turnlock, "flock_now", flock)


def test_our_turn_waits_for_another_process_holding_the_lock(root: Path, gateways: list[Gateway],
                                                             holders: list[Holder],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    runner, entered = entering_runner()
    gw = start_gateway(gateways, root, runner)
    holder = Holder(lock_path(root, "bob"))
    holders.append(holder)
    busy = BusyFlocks(monkeypatch)

    ack = gw.message_agent(sender="alice", target="bob", message="after you")
    assert ack["status"] == "queued"  # the ack never waits for the lock
    # Not "nothing happened for a while": the turn's worker has tried the lock and been refused several times,
    # and the turn has not run meanwhile.
    await_condition(lambda: busy.refused >= 3, timeout=10, message="bob's turn tried the held lock")
    assert not entered.is_set(), "the turn ran while another process held the profile's lock"
    assert gw.stats()["pending"] == 1

    # Other profiles are not held up by bob's lock.
    other = gw.message_agent(sender="alice", target="carol", message="meanwhile")
    assert gw.wait_outcome(other["delivery_id"], timeout=10)["reply"] == "got meanwhile"
    assert runner.bodies() == ["meanwhile"]

    holder.release()
    out = gw.wait_outcome(ack["delivery_id"], timeout=10)
    assert out["status"] == "replied" and out["reply"] == "got after you"
    assert runner.bodies() == ["meanwhile", "after you"]


def test_lock_held_past_the_wait_budget_is_target_busy(root: Path, gateways: list[Gateway],
                                                       holders: list[Holder]) -> None:
    runner, _ = entering_runner()
    gw = start_gateway(gateways, root, runner, {"bot_mode": {"turn_wait_seconds": 0.3}})
    holder = Holder(lock_path(root, "bob"))
    holders.append(holder)

    ack = gw.message_agent(sender="alice", target="bob", message="too slow")
    out = gw.wait_outcome(ack["delivery_id"], timeout=10)
    assert out["status"] == "failed" and out["reason"] == "target_busy" and out["retryable"] is True
    assert out["error"].startswith("target_busy: another delivery turn is already running for profile 'bob'")
    assert out["error"].endswith("The message was NOT delivered; retry shortly.")
    assert runner.entered == []

    # The lock is not wedged: once the other process lets go, bob is served again.
    holder.release()
    again = gw.message_agent(sender="alice", target="bob", message="now")
    assert gw.wait_outcome(again["delivery_id"], timeout=10)["reply"] == "got now"
    assert runner.bodies() == ["now"]


def test_another_process_cannot_take_the_lock_during_our_turn(root: Path, gateways: list[Gateway]) -> None:
    inside, release = threading.Event(), threading.Event()

    def behave(turn: Turn) -> str:
        inside.set()
        assert release.wait(10)
        return "done"

    gw = start_gateway(gateways, root, behave)
    try:
        ack = gw.message_agent(sender="alice", target="bob", message="hold it")
        assert inside.wait(5)
        probe = [sys.executable, "-c", HOLDER, "try", str(lock_path(root, "bob"))]
        assert subprocess.run(probe, capture_output=True, text=True, timeout=10).stdout.strip() == "busy"
    finally:
        release.set()
    assert gw.wait_outcome(ack["delivery_id"], timeout=10)["reply"] == "done"
    # After the turn the lock is free again for the other process.
    assert subprocess.run(probe, capture_output=True, text=True, timeout=10).stdout.strip() == "acquired"


def test_a_turn_outliving_stop_keeps_the_lock_until_it_ends(root: Path) -> None:
    inside, release = threading.Event(), threading.Event()
    finished = threading.Event()

    def behave(turn: Turn) -> str:
        inside.set()
        try:
            assert release.wait(10)
            return "late"
        finally:
            finished.set()

    gw = Gateway(root, runner=behave, durable=False).start()
    probe = [sys.executable, "-c", HOLDER, "try", str(lock_path(root, "bob"))]
    try:
        ack = gw.message_agent(sender="alice", target="bob", message="slow")
        assert inside.wait(5)
        gw.stop(timeout=0.2)
        assert gw.wait_outcome(ack["delivery_id"], timeout=1)["status"] == "ambiguous"
        # The turn is still running in its worker: no other process may start a turn for bob yet.
        assert subprocess.run(probe, capture_output=True, text=True, timeout=10).stdout.strip() == "busy"
    finally:
        release.set()
    assert finished.wait(5)
    await_condition(
        lambda: subprocess.run(probe, capture_output=True, text=True, timeout=10).stdout.strip() == "acquired",
        timeout=5,
        message="the lock is free once the turn ended",
    )


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "durable"])
def test_a_turn_still_waiting_for_the_lock_at_stop_never_runs_and_is_cancelled_or_kept(
    root: Path, gateways: list[Gateway], holders: list[Holder], monkeypatch: pytest.MonkeyPatch, durable: bool
) -> None:
    """A DM whose worker waits for the flock another process holds had not begun: a stop ends it like a queued one.

    Not ``ambiguous`` (its runner was never called): ``cancelled`` in memory, journaled and run by the next
    start when durable. Its worker stops waiting for the flock at the stop, and never calls the runner.
    """
    busy = BusyFlocks(monkeypatch)
    waits: list[float | None] = []
    wait_ended = threading.Event()
    real_acquire = turnlock.TurnLock.acquire

    def acquire(lock: turnlock.TurnLock, deadline: float, **kwargs: Any) -> float | None:
        if lock.path != lock_path(root, "bob"):  # another lock (the rooms owner's, say)
            return real_acquire(lock, deadline, **kwargs)
        try:
            waited = real_acquire(lock, deadline, **kwargs)
            waits.append(waited)
            return waited
        finally:
            wait_ended.set()

    monkeypatch.setattr(turnlock.TurnLock, "acquire", acquire)
    runner, _ = entering_runner()
    gw = Gateway(root, runner=runner, durable=durable).start()
    holder = Holder(lock_path(root, "bob"))
    holders.append(holder)
    try:
        ids = [gw.message_agent(sender="alice", target="bob", message=m)["delivery_id"] for m in ("first", "second")]
        await_condition(lambda: busy.refused >= 3, timeout=10, message="bob's first turn waits for the held lock")
    finally:
        gw.stop(timeout=5)
    # the stop gave the wait up: it ended without the lock, long before the DM's 120 s wait budget
    assert wait_ended.wait(5), "the stopped gateway's worker still waits for the flock"
    assert waits == [None]
    for delivery_id in ids:
        if durable:  # never began: still journaled, no outcome from this gateway
            with pytest.raises(TimeoutError):
                gw.wait_outcome(delivery_id, timeout=0)
        else:
            out = gw.wait_outcome(delivery_id, timeout=0)
            assert (out["status"], out["reason"], out["retryable"]) == ("failed", "cancelled", True), out
    holder.release()
    assert runner.entered == []  # nothing ran after the stop, nor will: the worker's job is over
    if durable:
        again = start_gateway(gateways, root, runner, durable=True)
        assert [again.wait_outcome(d, timeout=10)["reply"] for d in ids] == ["got first", "got second"]
        assert runner.bodies() == ["first", "second"]
