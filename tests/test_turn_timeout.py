"""A runner that hangs: the turn times out with delivery_timeout and the profile serves the next DM."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hermes_actors import Gateway
from hermes_actors.demo.bots import create_demo_root
from hermes_actors.facade.options import ASK_TIMEOUT
from hermes_actors.store.turnlock import turn_lock_path


def test_a_hung_turn_times_out_and_the_next_dm_is_served(tmp_path: Path) -> None:
    root = create_demo_root(tmp_path / "root")
    release = threading.Event()
    entered: list[str] = []

    def runner(turn: object) -> str:
        content = turn.content  # type: ignore[attr-defined]
        entered.append(content)
        if "hang" in content:
            release.wait(30)
        return "done"

    config = {"bot_mode": {"turn_timeout_seconds": 0.3, "turn_wait_seconds": 20}}
    with Gateway(root, runner=runner, config=config, durable=False) as gw:
        hung = gw.message_agent(sender="hermes", target="scout", message="please hang")
        after = gw.message_agent(sender="hermes", target="scout", message="and then this")
        first = gw.wait_outcome(hung["delivery_id"], timeout=10)
        second = gw.wait_outcome(after["delivery_id"], timeout=10)
        release.set()
    assert first["status"] == "failed"
    assert first["reason"] == "delivery_timeout"
    assert first["retryable"] is False
    assert "do not resend blindly" in first["error"]
    assert "it may still complete" in first["error"]  # an in-process turn cannot be ended: it may
    assert second["status"] == "replied" and second["reply"] == "done"
    assert len(entered) == 2  # the hung DM ran once; the next one ran after it timed out


def test_a_turn_within_the_timeout_is_not_cut_short(tmp_path: Path) -> None:
    root = create_demo_root(tmp_path / "root")
    with Gateway(root, runner=lambda turn: "fine", config={"bot_mode": {"turn_timeout_seconds": 5}}) as gw:
        ack = gw.message_agent(sender="hermes", target="scout", message="quick one")
        outcome = gw.wait_outcome(ack["delivery_id"], timeout=10)
    assert outcome["status"] == "replied"


def _flock_held(path: Path) -> bool:
    """Whether another open file description holds the flock of ``path`` now (tried without waiting)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also lets go of the flock when it was free
    return False


class _HookRunner:
    """A Python runner with a turn process's hooks: the turn of a DM saying "hang" blocks until the test releases
    it; ``running_turns`` hangs until the test ends, or raises."""

    def __init__(self, hook: str) -> None:
        self.hook = hook
        self.stop_called = threading.Event()
        self.release = threading.Event()
        self.unhang = threading.Event()
        self.hook_calls = 0

    def run_turn(self, turn: Any) -> str:
        if "hang" in turn.content:
            assert self.release.wait(60), "the test never released the timed-out turn"
            return "too late"
        return "done"

    def running_turns(self) -> list[str]:
        self.hook_calls += 1
        if self.hook == "raises":
            raise RuntimeError("running_turns broke")
        assert self.unhang.wait(120), "the test never let running_turns return"
        return []

    def stop_turns(self, delivery_ids: Any = None) -> int:
        self.stop_called.set()
        return 0


@pytest.mark.parametrize("hook", ["hangs", "raises"])
def test_a_running_turns_hook_that_hangs_or_raises_at_a_timeout_never_holds_the_profile(
    tmp_path: Path, hook: str, logs: Any
) -> None:
    """Regression (review of 2c61843): the ProfileActor called the runner's ``running_turns()`` in its TurnTimeout
    handler: one that hung held the actor for good (the bot's next DM got no outcome, the stop's WindDown went
    unanswered), one that raised crashed it (its restart left the timed-out DM without any outcome, and the turn
    was never ended). Now the hook is asked off the actor, bounded: the timed-out DM is reported
    ``delivery_timeout``, ``stop_turns`` is asked to end its turn, the flock stays held until that turn returns
    (not known to run in no process of ours, it may hold it), then the next DM runs, and the stop is clean."""
    root = create_demo_root(tmp_path / "root")
    runner = _HookRunner(hook)
    # 2 s: the next DM's turn (its wait for the flock included) must finish within it on a loaded machine
    config = {"bot_mode": {"turn_timeout_seconds": 2, "turn_wait_seconds": 20}}
    gw = Gateway(root, runner=runner, config=config, durable=False).start()
    try:
        hung = gw.message_agent(sender="hermes", target="scout", message="please hang")
        first = gw.wait_outcome(hung["delivery_id"], timeout=10)
        assert runner.stop_called.wait(10), "stop_turns was never asked to end the timed-out turn"
        kept = _flock_held(turn_lock_path(root, "scout"))  # the timed-out turn has not returned yet
        runner.release.set()
        after = gw.message_agent(sender="hermes", target="scout", message="and then this")
        second = gw.wait_outcome(after["delivery_id"], timeout=10)
        began = time.monotonic()
        gw.stop(timeout=5)
        took = time.monotonic() - began
    finally:
        runner.unhang.set()
        runner.release.set()
        gw.stop()
    assert (first["status"], first["reason"]) == ("failed", "delivery_timeout"), first
    # not known to run in a turn process: the plain text, never "was stopped"
    assert "it may still complete" in first["error"], first["error"]
    assert kept, "the flock was let go while the timed-out turn, maybe in a process of ours, still ran"
    assert (second["status"], second.get("reply")) == ("replied", "done"), second
    assert took < ASK_TIMEOUT, f"the stop took {took:.1f}s"
    assert not logs.matching("not clean"), logs.lines
    assert not logs.matching("crash"), logs.lines
    assert runner.hook_calls == 1
    if hook == "hangs":
        assert len(logs.matching("running_turns() did not answer")) == 1, logs.lines
