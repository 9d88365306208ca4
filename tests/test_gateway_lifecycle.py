"""The Gateway's lifecycle against other threads: registrations during start(), wait_outcome and a second stop()
during a stop (found by the concurrency review)."""

from __future__ import annotations

import gc
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from roots import RecordingRunner, make_root, send_dm

from actors.testkit import await_condition
from hermes_actors import CallableRunner, Gateway
from hermes_actors.messages import Turn
from hermes_actors.system import ActorSystem

WAIT = 20.0


class WatchedCondition(threading.Condition):
    """A condition that says (``waited``) once a thread waits on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waited = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waited.set()
        return super().wait(timeout)


def test_a_subscriber_and_a_live_owner_given_while_start_runs_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: subscribe() and attach_live_owner() from another thread while start() ran went into the dicts
    start() had already read, then cleared: the subscriber never saw an outcome, and the owner's DMs ran through
    the runner although attach_live_owner had returned."""
    started, proceed = threading.Event(), threading.Event()
    original = ActorSystem.start

    def paused_start(self: ActorSystem, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)  # it has read the early registrations
        started.set()
        proceed.wait(WAIT)

    monkeypatch.setattr(ActorSystem, "start", paused_start)
    runner = RecordingRunner()
    owner = RecordingRunner(lambda turn: "from the owner")
    seen: list[dict[str, Any]] = []
    gw = Gateway(make_root(tmp_path), runner=runner)
    registrations = WatchedCondition()
    gw._registrations._lock = registrations  # to see the registrar block on the start under way
    starter = threading.Thread(target=gw.start)
    starter.start()
    try:
        assert started.wait(WAIT)

        def register() -> None:
            gw.subscribe(seen.append)
            gw.attach_live_owner("bob", owner)

        registrar = threading.Thread(target=register)
        registrar.start()
        # Let start() end only once the registration is inside it: blocked until the start ends, or (before the
        # fix) already returned. A fixed wait here let a slow registrar come after the start and pass regardless.
        await_condition(lambda: registrations.waited.is_set() or not registrar.is_alive(), timeout=WAIT,
                        message="the registrar reached the registrations while start() ran")
        proceed.set()
        starter.join(WAIT)
        registrar.join(WAIT)
        assert not registrar.is_alive() and not starter.is_alive()
        key = send_dm(gw, "who answers?")
        out = gw.wait_outcome(key, timeout=WAIT)
        assert out["reply"] == "from the owner" and runner.entered == [], out
        await_condition(lambda: [o["delivery_id"] for o in seen] == [key], timeout=WAIT,
                        message="the subscriber given during start() sees the outcome")
    finally:
        proceed.set()
        starter.join(WAIT)
        gw.stop()


class HeldRunner:
    """A runner whose turns wait until the test releases them."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, turn: Turn) -> str:
        self.entered.set()
        self.release.wait(WAIT)
        return "done"


@pytest.mark.parametrize("durable", [False, True], ids=["in-memory", "durable"])
def test_wait_outcome_during_a_stop_waits_for_the_turn_the_stop_waits_for(tmp_path: Path, durable: bool) -> None:
    """Regression: while stop() waited for a running turn, wait_outcome() of that DM raised at once (KeyError in
    memory, TimeoutError in durable mode) although the turn then finished inside the stop's timeout."""
    runner = HeldRunner()
    gw = Gateway(make_root(tmp_path), runner=runner, durable=durable).start()
    key = send_dm(gw, "slow one")
    assert runner.entered.wait(WAIT)
    stopper = threading.Thread(target=gw.stop, kwargs={"timeout": WAIT})
    stopper.start()
    try:
        await_condition(lambda: not gw.running, timeout=WAIT, message="the stop began")
        releaser = threading.Thread(target=lambda: (await_condition(lambda: gw._outcomes.waiting, timeout=WAIT),
                                                    runner.release.set()))
        releaser.start()
        out = gw.wait_outcome(key, timeout=WAIT)
        assert (out["status"], out["reply"]) == ("replied", "done"), out
        releaser.join(WAIT)
    finally:
        runner.release.set()
        stopper.join(WAIT)


def test_a_second_stop_returns_once_the_first_is_done(tmp_path: Path) -> None:
    """Regression: stop() while another thread's stop() ran returned at once, before any actor stopped and before
    the subscriber callbacks were flushed (DESIGN: stop() flushes pending callbacks before it returns)."""
    runner = HeldRunner()
    seen: list[dict[str, Any]] = []
    gw = Gateway(make_root(tmp_path), runner=runner).start()
    gw.subscribe(seen.append)
    key = send_dm(gw, "stuck")
    assert runner.entered.wait(WAIT)
    first = threading.Thread(target=gw.stop, kwargs={"timeout": 2})  # the stuck turn ends ambiguous
    first.start()
    try:
        await_condition(lambda: not gw.running, timeout=WAIT, message="the first stop began")
        gw.stop()
        assert [(o["delivery_id"], o["status"]) for o in seen] == [(key, "ambiguous")]
        first.join(WAIT)
        assert not first.is_alive()
    finally:
        runner.release.set()
        first.join(WAIT)


def test_stop_called_again_from_its_own_on_wait_returns(tmp_path: Path) -> None:
    """Regression (today's second-stop wait): stop() called from the stopping thread itself (its on_wait
    callback) waited for its own end and hung for ever; it returns at once, as before."""
    runner = HeldRunner()
    gw = Gateway(make_root(tmp_path), runner=runner).start()
    send_dm(gw, "running")
    assert runner.entered.wait(WAIT)
    inner: list[bool] = []

    def on_wait(count: int, timeout: float) -> None:
        gw.stop()  # must not wait for the stop this very thread is running
        inner.append(gw.running)
        runner.release.set()

    stopper = threading.Thread(target=gw.stop, kwargs={"timeout": WAIT, "on_wait": on_wait}, daemon=True)
    stopper.start()
    stopper.join(WAIT)
    try:
        assert not stopper.is_alive(), "stop() hung on its own on_wait"
        assert inner == [False]
    finally:
        runner.release.set()


def test_a_stopped_gateway_keeps_its_settled_outcomes_compact_and_answers_each_in_full(tmp_path: Path) -> None:
    """Regression (soak review): stop() rebuilt every settled outcome into a plain dict for the stopped gateway,
    each long reply held in full twice (``reply`` and ``text``): 61 MB of RSS with 2,000 200 KB replies settled,
    832 MB after stop(). The outcomes are handed over as the Dispatcher kept them (compressed), so what the stop
    leaves and its peak stay far below the replies' size, and wait_outcome still rebuilds any of them whole."""
    count, size = 100, 100_000
    paragraph = "the same long reply, said again and again; "

    def long_reply(turn: Turn) -> str:
        return (turn.delivery_id + " " + paragraph * (size // len(paragraph) + 1))[:size]

    root = make_root(tmp_path, config={"bot_mode": {"max_pair_rate": 0}})
    gw = Gateway(root, runner=CallableRunner(long_reply, blocking=False), durable=False).start()
    try:
        keys = [send_dm(gw, f"long one {i}") for i in range(count)]
        settled = {key: gw.wait_outcome(key, timeout=WAIT) for key in keys}
    except BaseException:
        gw.stop()
        raise
    assert all(len(out["reply"]) == size for out in settled.values())
    gc.collect()
    tracemalloc.start()  # counts only what is allocated from here on: what the stop builds and leaves
    try:
        gw.stop()
        gc.collect()
        left, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    expanded = count * 2 * size  # the replies' characters, twice: the plain dicts the stop used to build
    assert left < expanded / 20, f"the stop left {left} bytes (the replies expanded: {expanded})"
    assert peak < expanded / 10, f"the stop peaked at {peak} bytes (the replies expanded: {expanded})"
    for key in (keys[0], keys[-1]):  # the oldest and the newest, each rebuilt whole and equal to the live answer
        assert gw.wait_outcome(key, timeout=0) == settled[key]
