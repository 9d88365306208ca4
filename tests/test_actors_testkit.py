"""Test kit: await_condition and Probe."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pykka
import pytest

import actors.testkit
from actors import Probe, await_condition

pytestmark = pytest.mark.usefixtures("stop_all_actors")  # conftest: stops the bare actors


@dataclass(frozen=True)
class A:
    n: int


@dataclass(frozen=True)
class B:
    n: int


class FakeClock:
    """The ``time`` the test kit reads, frozen until it sleeps or waits: a deadline test asserts when the kit gave
    up on this clock, exactly, instead of bounding a wall-clock duration a loaded machine could stretch."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert len(self.waits) < 10_000, "the kit kept waiting past its deadline"
        self.waits.append(seconds)
        self.now += seconds


class FakeClockCondition:
    """A ``threading.Condition`` whose ``wait`` passes ``timeout`` on the :class:`FakeClock` instead of waiting."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.real = threading.Condition()

    def __enter__(self) -> Any:
        return self.real.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.real.__exit__(*exc)

    def notify_all(self) -> None:
        self.real.notify_all()

    def wait(self, timeout: float) -> bool:
        self.clock.sleep(timeout)
        return False


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """A fake clock in place of the test kit's ``time`` (only the kit's: the actors keep the real one)."""
    fake = FakeClock()
    monkeypatch.setattr(actors.testkit, "time", SimpleNamespace(monotonic=fake.monotonic, sleep=fake.sleep))
    return fake


# ── await_condition ─────────────────────────────────────────────────────────


@pytest.mark.parametrize("value", [True, 1, "ready", [0], {"k": 1}])
def test_await_condition_returns_the_truthy_value(value: object) -> None:
    assert await_condition(lambda: value) == value


def test_await_condition_polls_until_the_predicate_holds() -> None:
    calls = [0]

    def predicate() -> int | None:
        calls[0] += 1
        return calls[0] if calls[0] >= 5 else None

    assert await_condition(predicate, interval=0.001) == 5
    assert calls[0] == 5


def test_await_condition_sees_another_threads_change() -> None:
    box: list[str] = []
    threading.Thread(target=lambda: box.append("done"), daemon=True).start()
    assert await_condition(lambda: box) == ["done"]


def test_await_condition_times_out_with_the_message(clock: FakeClock) -> None:
    started = clock.now
    with pytest.raises(TimeoutError, match=r"within 0\.1s: .?the door to open"):
        await_condition(lambda: False, timeout=0.1, interval=0.03, message="the door to open")
    # It gave up at the first look past its deadline: neither before it nor a pause later.
    assert clock.waits == [0.03] * 4
    assert started + 0.1 <= clock.now < started + 0.1 + 0.03


def test_await_condition_without_a_message_names_the_predicate() -> None:
    def door_is_open() -> bool:
        return False

    with pytest.raises(TimeoutError, match="door_is_open"):
        await_condition(door_is_open, timeout=0.01)


@pytest.mark.parametrize("falsy", [False, 0, None, "", []])
def test_await_condition_treats_falsy_values_as_not_yet(falsy: object) -> None:
    with pytest.raises(TimeoutError):
        await_condition(lambda: falsy, timeout=0.02)


def test_await_condition_with_zero_timeout_evaluates_once() -> None:
    calls = [0]

    def predicate() -> bool:
        calls[0] += 1
        return False

    with pytest.raises(TimeoutError):
        await_condition(predicate, timeout=0)
    assert calls[0] == 1
    assert await_condition(lambda: "now", timeout=0) == "now"


def test_await_condition_propagates_a_predicate_error() -> None:
    def broken() -> bool:
        raise KeyError("missing")

    with pytest.raises(KeyError):
        await_condition(broken)


# ── Probe ───────────────────────────────────────────────────────────────────


def test_probe_records_in_order_and_filters_by_type() -> None:
    ref, probe = Probe.spawn()
    assert ref.is_alive()
    for message in [A(1), B(1), A(2), A(3)]:
        ref.tell(message)
    assert probe.expect(A, count=3) == [A(1), A(2), A(3)]
    assert probe.records(B) == [B(1)]
    assert probe.records() == [A(1), B(1), A(2), A(3)]


def test_probe_records_returns_a_copy() -> None:
    ref, probe = Probe.spawn()
    ref.tell(A(1))
    probe.expect(A)
    copy = probe.records()
    copy.append(B(9))
    assert probe.records() == [A(1)]


def test_probe_answers_asks_with_none() -> None:
    ref, probe = Probe.spawn()
    assert ref.ask(A(1), timeout=5) is None
    assert probe.records() == [A(1)]


def test_probe_expect_waits_for_messages_told_later() -> None:
    ref, probe = Probe.spawn()
    go = threading.Event()

    def later() -> None:
        go.wait(5)
        for i in range(3):
            ref.tell(A(i))

    threading.Thread(target=later, daemon=True).start()
    go.set()
    assert probe.expect(A, count=3, timeout=5) == [A(0), A(1), A(2)]


def test_probe_expect_returns_all_that_arrived_when_more_than_count() -> None:
    ref, probe = Probe.spawn()
    for i in range(4):
        ref.tell(A(i))
    ref.ask(B(0), timeout=5)  # everything before it has been recorded
    assert probe.expect(A, count=2) == [A(0), A(1), A(2), A(3)]


@pytest.mark.parametrize(("sent", "count"), [(0, 1), (2, 3), (1, 5)])
def test_probe_expect_times_out_counting_what_arrived(sent: int, count: int, clock: FakeClock) -> None:
    ref, probe = Probe.spawn()
    for i in range(sent):
        ref.tell(A(i))
    ref.tell(B(0))  # another type never counts
    probe.expect(B)  # everything told is recorded: the probe's condition is the test's from here on
    probe._cond = FakeClockCondition(clock)  # type: ignore[assignment]
    started = clock.now
    with pytest.raises(TimeoutError, match=rf"probe got {sent} of {count} A within 0\.1s"):
        probe.expect(A, count=count, timeout=0.1)
    assert clock.waits == [pytest.approx(0.1)]  # waited out its whole timeout, once, and no longer
    assert clock.now == pytest.approx(started + 0.1)


def test_probe_expect_matches_subclasses() -> None:
    @dataclass(frozen=True)
    class SubA(A):
        pass

    ref, probe = Probe.spawn()
    ref.tell(SubA(1))
    ref.tell(A(2))
    assert probe.expect(A, count=2) == [SubA(1), A(2)]


def test_probes_are_independent() -> None:
    ref1, probe1 = Probe.spawn()
    ref2, probe2 = Probe.spawn()
    ref1.tell(A(1))
    ref2.tell(B(2))
    assert probe1.expect(A) == [A(1)]
    assert probe2.expect(B) == [B(2)]
    assert probe1.records(B) == []
    assert probe2.records(A) == []


def test_a_probe_is_registered_and_stops() -> None:
    ref, _ = Probe.spawn()
    assert ref in pykka.ActorRegistry.get_all()
    ref.stop()
    assert not ref.is_alive()
    assert ref not in pykka.ActorRegistry.get_all()
