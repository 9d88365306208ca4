"""Timers: ``Scheduler`` on the real clock, ``ManualScheduler`` driven by ``advance()``, ``TimerSet``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from loguru import logger

from actors import ManualScheduler, Probe, Scheduler, TimerSet, TypedActor, await_condition, handles

pytestmark = pytest.mark.usefixtures("stop_all_actors")  # conftest: stops the bare actors

# ── helpers ─────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Tick:
    n: int = 0


@dataclass(frozen=True)
class Arm:
    delay: float
    every: float


@dataclass(frozen=True)
class Crash:
    pass


class Recorder:
    """A plain-callable timer target that records (label, scheduler time) when fired."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.fired: list[tuple[str, float]] = []
        self.lock = threading.Lock()

    def target(self, label: str) -> Any:
        def fire() -> None:
            with self.lock:
                self.fired.append((label, self.scheduler.clock()))

        return fire

    def labels(self) -> list[str]:
        with self.lock:
            return [label for label, _ in self.fired]


class TimerOwner(TypedActor):
    """Owns timers in a TimerSet; cancels them on stop and on crash."""

    def __init__(self, scheduler: Scheduler, ticks: list[Tick]) -> None:
        super().__init__()
        self.timers = self.own_timers(scheduler)  # cancelled by the base when this actor stops or crashes
        self.ticks = ticks

    @handles(Arm)
    def arm(self, msg: Arm) -> int:
        self.timers.after(msg.delay, Tick(-1))
        self.timers.every(msg.every, Tick(1))
        return len(self.timers)

    @handles(Tick)
    def tick(self, msg: Tick) -> None:
        self.ticks.append(msg)

    @handles(Crash)
    def crash(self, msg: Crash) -> None:
        raise RuntimeError("crash on purpose")



class ForgetfulTimerOwner(TimerOwner):
    """Overrides on_stop without calling super(): its timers are cancelled all the same."""

    def on_stop(self) -> None:
        self.ticks.append(Tick(99))


@pytest.fixture
def manual() -> ManualScheduler:
    return ManualScheduler()


@pytest.fixture
def real() -> Iterator[Scheduler]:
    with Scheduler() as scheduler:
        yield scheduler


def _scheduler_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "actors-scheduler"}


def _errors(records: list[Any]) -> list[Any]:
    return [r for r in records if r["level"].no >= logger.level("ERROR").no]


# ── ManualScheduler ─────────────────────────────────────────────────────────


def test_manual_after_fires_once_at_its_due_time(manual: ManualScheduler) -> None:
    rec = Recorder(manual)
    manual.after(5, rec.target("once"))
    assert manual.advance(4.999) == 0
    assert rec.fired == []
    assert manual.advance(0.001) == 1
    assert rec.fired == [("once", 5.0)]
    assert manual.advance(100) == 0
    assert rec.fired == [("once", 5.0)]
    assert manual.pending() == 0


def test_manual_every_fires_repeatedly_in_order(manual: ManualScheduler) -> None:
    rec = Recorder(manual)
    manual.every(1, rec.target("tick"))
    assert manual.advance(3.5) == 3
    assert rec.fired == [("tick", 1.0), ("tick", 2.0), ("tick", 3.0)]
    assert manual.advance(1) == 1
    assert rec.fired[-1] == ("tick", 4.0)
    assert manual.pending() == 1


def test_manual_timers_interleave_by_due_time_then_scheduling_order(manual: ManualScheduler) -> None:
    rec = Recorder(manual)
    manual.every(1, rec.target("t"))
    manual.after(2.5, rec.target("a"))
    manual.after(2, rec.target("b"))  # due with the second tick, which is scheduled later (when tick 1 fires)
    manual.after(1, rec.target("c"))  # due with the first tick, scheduled after it
    manual.after(0, rec.target("now"))
    assert manual.advance(3) == 7
    assert rec.fired == [("now", 0.0), ("t", 1.0), ("c", 1.0), ("b", 2.0), ("t", 2.0), ("a", 2.5), ("t", 3.0)]


@pytest.mark.parametrize("delay", [0, -1, -0.5])
def test_manual_after_with_a_non_positive_delay_fires_at_the_next_advance(
    manual: ManualScheduler, delay: float
) -> None:
    rec = Recorder(manual)
    manual.after(delay, rec.target("x"))
    assert manual.advance(0) == 1
    assert rec.fired == [("x", 0.0)]


def test_manual_advance_moves_time_even_without_timers(manual: ManualScheduler) -> None:
    assert manual.advance(7) == 0
    assert manual.now == 7
    assert manual.clock() == 7


def test_manual_cancel_prevents_firing(manual: ManualScheduler) -> None:
    rec = Recorder(manual)
    once = manual.after(1, rec.target("once"))
    periodic = manual.every(1, rec.target("periodic"))
    kept = manual.after(1, rec.target("kept"))
    once.cancel()
    once.cancel()  # idempotent
    assert once.cancelled
    assert manual.pending() == 2
    assert manual.advance(2) == 3  # kept + periodic twice
    periodic.cancel()
    assert manual.pending() == 0
    assert manual.advance(10) == 0
    assert rec.labels() == ["periodic", "kept", "periodic"]
    assert not kept.cancelled


def test_manual_periodic_timer_cancelled_from_its_own_callback(manual: ManualScheduler) -> None:
    fired: list[float] = []
    handle = None

    def fire() -> None:
        fired.append(manual.now)
        if len(fired) == 3:
            assert handle is not None
            handle.cancel()

    handle = manual.every(2, fire)
    manual.advance(20)
    assert fired == [2.0, 4.0, 6.0]
    assert manual.pending() == 0


@pytest.mark.parametrize("interval", [0, 0.0, -1, -0.001])
@pytest.mark.parametrize("scheduler_class", [Scheduler, ManualScheduler])
def test_every_rejects_a_non_positive_interval(scheduler_class: type[Scheduler], interval: float) -> None:
    scheduler = scheduler_class()
    with pytest.raises(ValueError, match="interval must be > 0"):
        scheduler.every(interval, lambda: None)
    assert scheduler.pending() == 0


def test_timerset_every_rejects_a_non_positive_interval(manual: ManualScheduler) -> None:
    ref, _ = Probe.spawn()
    timers = TimerSet(manual, ref)
    with pytest.raises(ValueError):
        timers.every(0, Tick())
    assert len(timers) == 0


def test_manual_timer_tells_an_actor(manual: ManualScheduler) -> None:
    ref, probe = Probe.spawn()
    manual.every(1, ref, Tick(7))
    manual.after(1.5, ref, Tick(8))
    assert manual.advance(3) == 4
    assert probe.expect(Tick, count=4) == [Tick(7), Tick(8), Tick(7), Tick(7)]


def test_timer_to_a_dead_actor_is_cancelled_automatically(manual: ManualScheduler, log_records: list[Any]) -> None:
    ref, _ = Probe.spawn()
    periodic = manual.every(1, ref, Tick())
    ref.stop()
    assert manual.advance(1) == 1  # one attempt: the tell fails, the timer goes with the actor
    assert periodic.cancelled
    assert manual.pending() == 0
    assert manual.advance(10) == 0
    assert _errors(log_records) == []


def test_a_failing_callback_is_logged_and_other_timers_still_fire(
    manual: ManualScheduler, log_records: list[Any]
) -> None:
    rec = Recorder(manual)

    def broken() -> None:
        raise RuntimeError("callback bug")

    manual.every(1, broken)
    manual.every(1, rec.target("ok"))
    manual.advance(2)  # must not raise
    assert rec.labels() == ["ok", "ok"]
    failures = [r for r in log_records if "timer callback failed" in r["message"]]
    assert len(failures) == 2


# ── TimerSet ────────────────────────────────────────────────────────────────


def test_timerset_tracks_live_timers(manual: ManualScheduler) -> None:
    ref, probe = Probe.spawn()
    timers = TimerSet(manual, ref)
    once = timers.after(1, Tick(1))
    timers.every(2, Tick(2))
    assert len(timers) == 2
    manual.advance(1)  # the one-shot fired: it leaves the set
    assert len(timers) == 1
    assert once not in timers._live
    manual.advance(1)
    assert probe.expect(Tick, count=2) == [Tick(1), Tick(2)]
    assert len(timers) == 1


def test_cancelling_one_handle_removes_it_from_its_set(manual: ManualScheduler) -> None:
    ref, _ = Probe.spawn()
    timers = TimerSet(manual, ref)
    first = timers.every(1, Tick(1))
    timers.every(1, Tick(2))
    first.cancel()
    assert len(timers) == 1
    assert manual.pending() == 1


def test_timerset_cancel_all_stops_every_timer_of_the_actor(manual: ManualScheduler) -> None:
    ref, probe = Probe.spawn()
    other_ref, other = Probe.spawn()
    timers = TimerSet(manual, ref)
    others = TimerSet(manual, other_ref)
    timers.after(1, Tick(1))
    timers.every(1, Tick(2))
    timers.every(0.5, Tick(3))
    others.every(1, Tick(9))
    timers.cancel_all()
    assert len(timers) == 0
    assert manual.pending() == 1  # only the other actor's timer
    assert manual.advance(3) == 3
    assert other.expect(Tick, count=3) == [Tick(9)] * 3
    probe_ref_ticks = probe.records(Tick)
    assert probe_ref_ticks == []
    timers.cancel_all()  # idempotent


def test_an_actor_that_stops_cancels_its_timers(manual: ManualScheduler, log_records: list[Any]) -> None:
    ticks: list[Tick] = []
    ref = TimerOwner.start(manual, ticks)
    assert ref.ask(Arm(delay=5, every=1), timeout=5) == 2
    assert manual.advance(2) == 2
    await_condition(lambda: len(ticks) == 2, message="two ticks handled")
    ref.stop()
    assert manual.pending() == 0
    assert manual.advance(10) == 0  # nothing fires into the dead ref
    assert _errors(log_records) == []


def test_an_on_stop_override_without_super_still_cancels_the_timers(manual: ManualScheduler) -> None:
    ticks: list[Tick] = []
    ref = ForgetfulTimerOwner.start(manual, ticks)
    assert ref.ask(Arm(delay=5, every=1), timeout=5) == 2
    ref.stop()
    assert ticks == [Tick(99)]  # the override ran
    assert manual.pending() == 0
    assert manual.advance(10) == 0


def test_an_actor_that_crashes_cancels_its_timers(manual: ManualScheduler) -> None:
    ticks: list[Tick] = []
    ref = TimerOwner.start(manual, ticks)
    ref.ask(Arm(delay=5, every=1), timeout=5)
    ref.tell(Crash())
    await_condition(lambda: not ref.is_alive(), message="the owner to crash")
    await_condition(lambda: manual.pending() == 0, message="timers cancelled on crash")
    assert manual.advance(10) == 0


def test_timers_of_a_stopped_actor_that_did_not_cancel_never_raise(
    manual: ManualScheduler, log_records: list[Any]
) -> None:
    ref, _ = Probe.spawn()
    timers = TimerSet(manual, ref)
    timers.every(1, Tick())
    timers.after(1, Tick())
    ref.stop()
    manual.advance(5)  # must not raise
    assert manual.pending() == 0
    assert len(timers) == 0
    assert _errors(log_records) == []


# ── Scheduler (real clock) ──────────────────────────────────────────────────


def test_real_after_fires_once(real: Scheduler) -> None:
    fired: list[int] = []
    done = threading.Event()

    def fire() -> None:
        fired.append(1)
        done.set()

    real.after(0.02, fire)
    assert done.wait(5)
    # a later sentinel proves the one-shot did not fire again in between
    sentinel = threading.Event()
    real.after(0.1, sentinel.set)
    assert sentinel.wait(5)
    assert fired == [1]
    assert real.pending() == 0


def test_real_every_fires_repeatedly_in_order(real: Scheduler) -> None:
    ref, probe = Probe.spawn()
    counter = iter(range(1000))
    lock = threading.Lock()

    def fire() -> None:
        with lock:
            ref.tell(Tick(next(counter)))

    handle = real.every(0.01, fire)
    ticks = probe.expect(Tick, count=5)
    handle.cancel()
    assert [t.n for t in ticks[:5]] == [0, 1, 2, 3, 4]


def test_real_timer_tells_an_actor(real: Scheduler) -> None:
    ref, probe = Probe.spawn()
    real.after(0.01, ref, Tick(3))
    assert probe.expect(Tick) == [Tick(3)]


def test_real_cancel_prevents_firing(real: Scheduler) -> None:
    fired: list[str] = []
    cancelled = real.after(0.05, lambda: fired.append("cancelled"))
    cancelled.cancel()
    sentinel = threading.Event()
    real.after(0.15, sentinel.set)  # due later: if the cancelled one fired, it fired first
    assert sentinel.wait(5)
    assert fired == []


def test_real_periodic_cancel_stops_it(real: Scheduler) -> None:
    count = [0]
    handle = real.every(0.01, lambda: count.__setitem__(0, count[0] + 1))
    await_condition(lambda: count[0] >= 2, message="two ticks")
    handle.cancel()
    seen = count[0]
    sentinel = threading.Event()
    real.after(0.1, sentinel.set)  # ten periods later
    assert sentinel.wait(5)
    assert count[0] <= seen + 1  # at most one tick already being fired when cancel() ran
    assert real.pending() == 0


def test_real_timer_to_a_dead_actor_is_cancelled(real: Scheduler) -> None:
    ref, _ = Probe.spawn()
    ref.stop()
    handle = real.every(0.01, ref, Tick())
    await_condition(lambda: handle.cancelled, message="the timer to cancel itself")
    assert real.pending() == 0


def test_scheduler_start_stop_leaves_no_thread_behind() -> None:
    before = _scheduler_threads()
    scheduler = Scheduler()
    assert _scheduler_threads() == before  # no thread until start()
    for _ in range(2):  # restartable
        scheduler.start()
        scheduler.start()  # idempotent: still one thread
        assert len(_scheduler_threads() - before) == 1
        done = threading.Event()
        scheduler.every(0.01, done.set)
        assert done.wait(5)
        scheduler.stop()
        assert _scheduler_threads() == before
        assert scheduler.pending() == 0  # pending timers dropped
    scheduler.stop()  # idempotent


def test_scheduler_context_manager_leaves_no_thread_behind() -> None:
    before = _scheduler_threads()
    with Scheduler() as scheduler:
        assert len(_scheduler_threads() - before) == 1
        fired = threading.Event()
        scheduler.after(0, fired.set)
        assert fired.wait(5)
        scheduler.every(10, lambda: None)
    assert _scheduler_threads() == before


def test_scheduler_stop_from_a_timer_callback_does_not_deadlock() -> None:
    before = _scheduler_threads()
    scheduler = Scheduler().start()
    stopped = threading.Event()

    def stop_it() -> None:
        scheduler.stop()
        stopped.set()

    scheduler.after(0, stop_it)
    assert stopped.wait(5)
    await_condition(lambda: _scheduler_threads() == before, message="the scheduler thread to exit")


def test_manual_scheduler_runs_no_thread() -> None:
    before = _scheduler_threads()
    manual = ManualScheduler()
    with manual:
        manual.every(1, lambda: None)
        manual.advance(3)
        assert _scheduler_threads() == before


def test_stopped_scheduler_ignores_new_timers_without_a_thread() -> None:
    before = _scheduler_threads()
    scheduler = Scheduler().start()
    scheduler.stop()
    fired = []
    scheduler.after(0, lambda: fired.append(1))
    assert _scheduler_threads() == before
    assert fired == []


# ── cancelled timers are not retained ───────────────────────────────────────


@pytest.mark.parametrize("scheduler_class", [ManualScheduler, Scheduler])
def test_cancelled_long_timers_do_not_stay_in_memory(scheduler_class: type[Scheduler]) -> None:
    """Regression (issue 11 item 8): every DM left a cancelled 600 s turn timer in the heap."""
    scheduler = scheduler_class()
    keep = scheduler.after(600, lambda: None)
    largest = 0
    for _ in range(100_000):
        scheduler.after(600, lambda: None).cancel()
        largest = max(largest, scheduler.heap_size())
    assert largest <= 200  # bounded: compacted long before 100k entries pile up
    assert scheduler.pending() == 1
    keep.cancel()
    assert scheduler.pending() == 0


def test_cancelling_timers_in_any_order_keeps_the_live_ones_firing_in_order(manual: ManualScheduler) -> None:
    fired: list[int] = []
    handles_ = [manual.after(i, lambda i=i: fired.append(i)) for i in range(1000)]  # type: ignore[misc]
    for i, handle in enumerate(handles_):
        if i % 3:
            handle.cancel()
    assert manual.heap_size() < 700  # compaction ran
    assert manual.pending() == 334
    assert manual.advance(1000) == 334
    assert fired == list(range(0, 1000, 3))
    assert manual.heap_size() == 0


def test_timerset_cancel_all_releases_the_heap(manual: ManualScheduler) -> None:
    ref, _ = Probe.spawn()
    timers = TimerSet(manual, ref)
    for _ in range(1000):
        timers.after(600, Tick())
    timers.cancel_all()
    assert manual.pending() == 0
    assert manual.heap_size() == 0


# ── user code never stops or doubles the scheduler thread (review actorsfix2) ──


@pytest.mark.parametrize("error", [SystemExit(0), KeyboardInterrupt(), GeneratorExit()], ids=type)
def test_a_callback_raising_any_base_exception_is_logged_and_the_other_timers_still_fire(
    real: Scheduler, error: BaseException, log_records: list[Any]
) -> None:
    """Regression (review, finding 3): a callable raising SystemExit killed the one scheduler thread without a
    word, and every other timer of the system stopped firing."""
    raised = threading.Event()

    def bad() -> None:
        raised.set()
        raise error

    periodic = real.every(0.01, bad)
    assert raised.wait(5)
    later = threading.Event()
    real.after(0, later.set)
    assert later.wait(5), "the scheduler thread died of the callback's error"
    assert not periodic.cancelled
    await_condition(lambda: any("timer callback failed" in r["message"] and type(error).__name__ in r["message"]
                                for r in log_records), message="the callback's error logged")


def test_manual_advance_logs_a_callbacks_system_exit_but_raises_a_ctrl_c_in_the_main_thread(
    manual: ManualScheduler, log_records: list[Any]
) -> None:
    """ManualScheduler.advance fires in the caller's thread: there a KeyboardInterrupt is the user's Ctrl-C
    and is not ours to swallow; SystemExit from a callback is logged like any error."""
    assert threading.current_thread() is threading.main_thread()
    rec = Recorder(manual)

    def exits() -> None:
        raise SystemExit(2)

    manual.after(1, exits)
    manual.after(1, rec.target("after-exit"))
    assert manual.advance(1) == 2  # must not raise
    assert rec.labels() == ["after-exit"]
    assert any("timer callback failed" in r["message"] and "SystemExit" in r["message"] for r in log_records)

    def interrupted() -> None:
        raise KeyboardInterrupt

    manual.after(1, interrupted)
    with pytest.raises(KeyboardInterrupt):
        manual.advance(1)


def test_start_replaces_a_scheduler_thread_that_died(log_records: list[Any]) -> None:
    """Regression (review, finding 3): start() kept the dead thread, so nothing ever fired again."""
    before = _scheduler_threads()
    broken = threading.Event()

    def clock() -> float:  # raises once, on the scheduler thread: its loop dies
        if threading.current_thread().name == "actors-scheduler" and not broken.is_set():
            broken.set()
            raise SystemExit("clock gone")
        return time.monotonic()

    scheduler = Scheduler(clock=clock).start()
    try:
        assert broken.wait(5)
        await_condition(lambda: _scheduler_threads() == before, message="the broken thread to end")
        assert any("the timer thread died" in r["message"] for r in log_records)
        scheduler.start()
        fired = threading.Event()
        scheduler.after(0, fired.set)
        assert fired.wait(5), "start() did not replace the dead thread"
        assert len(_scheduler_threads() - before) == 1
    finally:
        scheduler.stop()


def test_a_periodic_callable_that_lets_an_unrelated_actor_dead_error_escape_keeps_ticking(
    manual: ManualScheduler, log_records: list[Any]
) -> None:
    """Regression (review, finding 9): the ActorDeadError of some other actor a callback told cancelled the
    callback's own timer for good, without a log line. Only a message timer's dead target cancels it."""
    dead, _ = Probe.spawn()
    dead.stop()
    calls: list[int] = []

    def tells_a_dead_actor() -> None:
        calls.append(1)
        if len(calls) == 1:
            dead.tell(Tick())

    handle = manual.every(1, tells_a_dead_actor)
    assert manual.advance(3) == 3
    assert len(calls) == 3 and not handle.cancelled
    assert any("timer callback failed" in r["message"] and "ActorDeadError" in r["message"] for r in log_records)


def test_a_one_shot_timerset_timer_that_fires_at_once_is_not_left_counted_live() -> None:
    """Regression (review, finding 8): TimerSet.after pushed the timer before it owned it; fired in between,
    the one-shot was never forgotten and stayed in the set, counted live. The hook forces that interleaving:
    the push waits until the scheduler thread has told the timer's message."""
    ref, probe = Probe.spawn()

    class FiresBeforePushReturns(Scheduler):
        def _push(self, handle: Any) -> Any:
            pushed = super()._push(handle)
            await_condition(lambda: probe.records(Tick), message="the timer fired")
            return pushed

    with FiresBeforePushReturns() as scheduler:
        timers = TimerSet(scheduler, ref)
        timers.after(0, Tick(1))
        assert probe.records(Tick) == [Tick(1)]
        assert len(timers) == 0
        assert timers._live == set()


def test_stop_and_start_from_a_callback_leaves_one_scheduler_thread_and_a_final_stop_none() -> None:
    """Regression (review, finding 10): stop() then start() while a callback ran (here from the callback itself)
    had two threads serve one heap, and the older one outlived every later stop()."""
    before = _scheduler_threads()
    scheduler = Scheduler().start()
    restarted = threading.Event()

    def restart() -> None:
        scheduler.stop()
        scheduler.start()
        restarted.set()

    scheduler.after(0, restart)
    assert restarted.wait(5)
    await_condition(lambda: len(_scheduler_threads() - before) == 1, message="the replaced thread to exit")
    fired = threading.Event()
    scheduler.after(0, fired.set)
    assert fired.wait(5)  # the new thread serves the timers
    scheduler.stop()
    await_condition(lambda: _scheduler_threads() == before, message="every scheduler thread to exit")


def test_a_timer_due_with_a_callback_that_stops_the_scheduler_does_not_fire_after_the_stop() -> None:
    before = _scheduler_threads()
    scheduler = Scheduler()  # both timers are due together at the first look of the thread
    stopped = threading.Event()
    fired: list[str] = []

    def stop_it() -> None:
        scheduler.stop()
        stopped.set()

    scheduler.after(0, stop_it)
    scheduler.after(0, lambda: fired.append("after the stop"))
    scheduler.start()
    assert stopped.wait(5)
    await_condition(lambda: _scheduler_threads() == before, message="the scheduler thread to exit")
    assert fired == []


@pytest.mark.parametrize("scheduler_class", [ManualScheduler, Scheduler])
def test_a_timer_scheduled_on_a_stopped_scheduler_is_refused_and_not_counted(
    scheduler_class: type[Scheduler],
) -> None:
    """Regression (review, finding 10): such a timer was accepted and counted by pending(), and never fired."""
    scheduler = scheduler_class().start()
    scheduler.stop()
    ref, _ = Probe.spawn()
    timers = TimerSet(scheduler, ref)
    refused = [scheduler.after(0, lambda: None), scheduler.every(1, lambda: None), timers.after(0, Tick()),
               timers.every(1, Tick())]
    assert all(handle.cancelled for handle in refused)
    assert scheduler.pending() == 0 and scheduler.heap_size() == 0
    assert len(timers) == 0 and timers._live == set()
    scheduler.start()  # taken again after a start
    try:
        fired = threading.Event()
        handle = scheduler.after(0, fired.set)
        assert not handle.cancelled
        if isinstance(scheduler, ManualScheduler):
            scheduler.advance(0)
        assert fired.wait(5)
    finally:
        scheduler.stop()
