"""Supervision: restarts with fresh state, mailbox hand-over, bounded intensity, escalation."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pykka
import pytest

from actors import (
    ActorGone,
    ChildFailed,
    EscalatedFailure,
    Link,
    RestartPolicy,
    SupervisorActor,
    TypedActor,
    ask,
    ask_later,
    await_condition,
    handles,
    tell,
)
from actors.messages import Request

pytestmark = pytest.mark.usefixtures("stop_all_actors")  # conftest: stops the bare actors

# ── messages ────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Inc:
    pass


@dataclass(frozen=True)
class Get:
    pass


@dataclass(frozen=True)
class Record:
    value: int


@dataclass(frozen=True)
class Seen:
    pass


@dataclass(frozen=True)
class Crash:
    pass


@dataclass(frozen=True)
class Fail:
    pass


@dataclass(frozen=True)
class Block:
    gate: threading.Event
    entered: threading.Event


@dataclass(frozen=True)
class WhoAmI:
    pass


@dataclass(frozen=True)
class StartChild:
    name: str = "c"


@dataclass(frozen=True)
class ChildRef:
    name: str = "c"


@dataclass(frozen=True)
class Forget:
    name: str = "c"


@dataclass(frozen=True)
class Escalated:
    pass


@dataclass(frozen=True)
class IsDown:
    name: str = "c"


# ── actors ──────────────────────────────────────────────────────────────────


class Counter(TypedActor):
    """A child with state that a restart must rebuild."""

    def __init__(self, *, link: Link | None = None, start: int = 0) -> None:
        super().__init__(link=link)
        self.count = start
        self.seen: list[int] = []

    @handles(Inc)
    def inc(self, msg: Inc) -> int:
        self.count += 1
        return self.count

    @handles(Get)
    def get(self, msg: Get) -> int:
        return self.count

    @handles(Record)
    def record(self, msg: Record) -> None:
        self.seen.append(msg.value)

    @handles(Seen)
    def on_seen(self, msg: Seen) -> tuple[int, ...]:
        return tuple(self.seen)

    @handles(Crash)
    def crash(self, msg: Crash) -> None:
        raise RuntimeError("child crash on purpose")

    @handles(Fail)
    def fail(self, msg: Fail) -> None:
        raise ValueError("an ask failure is not a crash")

    @handles(Block)
    def block(self, msg: Block) -> None:
        msg.entered.set()
        assert msg.gate.wait(10), "test forgot to open the gate"

    @handles(WhoAmI)
    def who(self, msg: WhoAmI) -> tuple[str, int]:
        assert self.link is not None
        return (self.link.name, self.link.generation)


class SalvagingCounter(Counter):
    """Hands its count to the next instance."""

    def salvage(self) -> Any:
        return self.count


class FailsFirstStart(Counter):
    """Its first instance fails in ``on_start``; a restarted one starts."""

    def on_start(self) -> None:
        assert self.link is not None
        if self.link.generation == 0:
            raise RuntimeError("start failure on purpose")


class FailsToReport(Counter):
    """Its ``on_crash`` override fails before it reports (the supervisor must hear of the crash all the same)."""

    def on_crash(self, error: BaseException | None, pending: list[Any], salvage: Any) -> None:
        raise RuntimeError("on_crash failure on purpose")


class AnswersGetAfterCrash(Counter):
    """Answers ``Get`` itself once crashed (``answer_after_crash``) instead of handing it on."""

    def answer_after_crash(self, message: Any) -> tuple[bool, Any]:
        return (True, -1) if isinstance(message, Get) else (False, None)


class StopsAtGate(Counter):
    """Its first stop (the crashed instance's, on ``Retire``) waits at ``GATE`` once queued."""

    GATE = threading.Event()
    STOPPING = threading.Event()

    def stop(self) -> None:
        super().stop()
        if not StopsAtGate.STOPPING.is_set():
            StopsAtGate.STOPPING.set()
            assert StopsAtGate.GATE.wait(10)


class FailsEveryStartBelow(Counter):
    """Fails in ``on_start`` up to generation ``LAST_FAILING`` (a bound, should escalation never come)."""

    LAST_FAILING = 200

    def on_start(self) -> None:
        assert self.link is not None
        if self.link.generation <= FailsEveryStartBelow.LAST_FAILING:
            raise RuntimeError("start failure on purpose")


@dataclass
class Factory:
    """factory(link, salvage) -> ref, recording every call."""

    actor_class: type[Counter] = Counter
    calls: list[tuple[Link, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, link: Link, salvage: Any) -> pykka.ActorRef[Any]:
        with self.lock:
            self.calls.append((link, salvage))
        return self.actor_class.start(link=link, start=salvage or 0)

    def count(self) -> int:
        with self.lock:
            return len(self.calls)


class Sup(SupervisorActor):
    def __init__(
        self,
        factory: Callable[[Link, Any], pykka.ActorRef[Any]],
        *,
        policy: RestartPolicy | None = None,
        clock: Callable[[], float] | None = None,
        link: Link | None = None,
        restarted: list[tuple[str, str]] | None = None,
    ) -> None:
        if clock is None:
            super().__init__(policy=policy, link=link)
        else:
            super().__init__(policy=policy, clock=clock, link=link)
        self.factory = factory
        self.restarted = restarted if restarted is not None else []

    @handles(StartChild)
    def on_start_child(self, msg: StartChild) -> pykka.ActorRef[Any]:
        return self.start_child(msg.name, self.factory)

    @handles(ChildRef)
    def on_child_ref(self, msg: ChildRef) -> pykka.ActorRef[Any] | None:
        return self.child_ref(msg.name)

    @handles(Forget)
    def on_forget(self, msg: Forget) -> None:
        self.forget_child(msg.name)

    @handles(Escalated)
    def on_escalated(self, msg: Escalated) -> dict[str, BaseException | None]:
        return dict(self.escalated)

    @handles(IsDown)
    def on_is_down(self, msg: IsDown) -> bool:
        return self.child_down(msg.name)

    def on_child_restarted(self, name: str, ref: pykka.ActorRef[Any]) -> None:
        self.restarted.append((name, ref.actor_urn))


class BlockableSup(Sup):
    """A supervisor a test can hold (``Block``) or crash (``Crash``)."""

    @handles(Block)
    def on_block(self, msg: Block) -> None:
        msg.entered.set()
        assert msg.gate.wait(10), "test forgot to open the gate"

    @handles(Crash)
    def on_crash_message(self, msg: Crash) -> None:
        raise RuntimeError("supervisor crash on purpose")


class RecordingSup(Sup):
    """Records escalations instead of crashing."""

    def __init__(self, *args: Any, escalations: list[tuple[str, BaseException | None]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.escalations = escalations

    def on_escalation(self, name: str, error: BaseException | None) -> None:
        self.escalations.append((name, error))


class Parent(Sup):
    """A supervisor of supervisors that also records the ChildFailed reports it gets."""

    def __init__(self, *args: Any, reports: list[ChildFailed], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reports = reports

    def _on_child_failed(self, msg: ChildFailed) -> None:
        self.reports.append(msg)
        super()._on_child_failed(msg)


class StartsItsChild(BlockableSup):
    """A supervisor (itself supervised) that starts child ``c`` in ``on_start`` and records the ChildFailed
    reports it handles."""

    def __init__(self, *args: Any, reports: list[ChildFailed], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reports = reports

    def on_start(self) -> None:
        self.start_child("c", self.factory)

    def _on_child_failed(self, msg: ChildFailed) -> None:
        self.reports.append(msg)
        super()._on_child_failed(msg)


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ── fixtures & helpers ──────────────────────────────────────────────────────


def _child(sup: pykka.ActorRef[Any], name: str = "c") -> pykka.ActorRef[Any] | None:
    ref: pykka.ActorRef[Any] | None = ask(sup, ChildRef(name), timeout=5)
    return ref


def _await_new_child(sup: pykka.ActorRef[Any], old: pykka.ActorRef[Any], name: str = "c") -> pykka.ActorRef[Any]:
    def fresh() -> pykka.ActorRef[Any] | None:
        ref = _child(sup, name)
        return ref if ref is not None and ref.actor_urn != old.actor_urn and ref.is_alive() else None

    ref = await_condition(fresh, message=f"a restarted {name!r}")
    assert ref is not None
    return ref


def _block(ref: pykka.ActorRef[Any]) -> threading.Event:
    gate, entered = threading.Event(), threading.Event()
    ref.tell(Block(gate, entered))
    assert entered.wait(5)
    return gate


def _crash_once(sup: pykka.ActorRef[Any], child: pykka.ActorRef[Any]) -> pykka.ActorRef[Any]:
    child.tell(Crash())
    return _await_new_child(sup, child)


# ── starting ────────────────────────────────────────────────────────────────


def test_supervisor_starts_a_child_through_its_factory_with_a_link() -> None:
    factory = Factory()
    sup = Sup.start(factory)
    child = ask(sup, StartChild(), timeout=5)
    assert child.is_alive()
    assert factory.count() == 1
    link, salvage = factory.calls[0]
    assert link.name == "c"
    assert link.generation == 0
    assert link.supervisor.actor_urn == sup.actor_urn
    assert salvage is None
    assert ask(child, WhoAmI(), timeout=5) == ("c", 0)
    assert _child(sup).actor_urn == child.actor_urn  # type: ignore[union-attr]


def test_start_child_returns_the_running_child() -> None:
    factory = Factory()
    sup = Sup.start(factory)
    first = ask(sup, StartChild(), timeout=5)
    again = ask(sup, StartChild(), timeout=5)
    assert again.actor_urn == first.actor_urn
    assert factory.count() == 1


def test_start_child_after_the_child_stopped_starts_a_new_generation() -> None:
    factory = Factory()
    sup = Sup.start(factory)
    first = ask(sup, StartChild(), timeout=5)
    first.stop()
    second = ask(sup, StartChild(), timeout=5)
    assert second.actor_urn != first.actor_urn
    assert ask(second, WhoAmI(), timeout=5) == ("c", 1)


def test_forget_child_drops_it() -> None:
    sup = Sup.start(Factory())
    ask(sup, StartChild(), timeout=5)
    ask(sup, Forget(), timeout=5)
    assert _child(sup) is None
    assert _child(sup, "never-started") is None


# ── restart ─────────────────────────────────────────────────────────────────


def test_a_crashing_child_is_restarted_with_fresh_state() -> None:
    factory = Factory()
    restarted: list[tuple[str, str]] = []
    sup = Sup.start(factory, restarted=restarted)
    child = ask(sup, StartChild(), timeout=5)
    for _ in range(3):
        child.tell(Inc())
    assert ask(child, Get(), timeout=5) == 3
    new = _crash_once(sup, child)
    assert not child.is_alive()
    assert ask(new, Get(), timeout=5) == 0  # state rebuilt from scratch
    assert ask(new, WhoAmI(), timeout=5) == ("c", 1)
    assert factory.count() == 2
    assert factory.calls[1][1] is None
    assert restarted == [("c", new.actor_urn)]


def test_a_child_that_fails_in_on_start_is_reported_and_restarted() -> None:
    factory = Factory(actor_class=FailsFirstStart)
    restarted: list[tuple[str, str]] = []
    sup = Sup.start(factory, restarted=restarted)
    child = ask(sup, StartChild(), timeout=5)
    new = _await_new_child(sup, child)  # pykka alone would stop it unreported: never restarted
    assert ask(new, WhoAmI(), timeout=5) == ("c", 1)
    assert ask(new, Inc(), timeout=5) == 1
    assert factory.count() == 2
    assert restarted == [("c", new.actor_urn)]


def test_a_child_whose_on_crash_fails_is_still_reported_with_its_mailbox() -> None:
    sup = Sup.start(Factory(actor_class=FailsToReport))
    child = ask(sup, StartChild(), timeout=5)
    gate = _block(child)
    child.tell(Crash())
    child.tell(Record(7))  # queued behind the crash: handed to the restarted instance
    gate.set()
    new = _await_new_child(sup, child)
    assert ask(new, Seen(), timeout=5) == (7,)


def test_a_crashed_child_is_down_from_its_crash_report_until_its_restart() -> None:
    StopsAtGate.GATE.clear()
    StopsAtGate.STOPPING.clear()
    sup = Sup.start(Factory(actor_class=StopsAtGate))
    child = ask(sup, StartChild(), timeout=5)
    assert ask(sup, IsDown(), timeout=5) is False
    try:
        child.tell(Crash())
        assert StopsAtGate.STOPPING.wait(5)  # it got Retire: the supervisor handled its ChildCrashed
        assert child.is_alive()  # still alive (its stop is queued): what is told to it now comes behind the stop
        assert ask(sup, IsDown(), timeout=5) is True
    finally:
        StopsAtGate.GATE.set()
    _await_new_child(sup, child)
    assert ask(sup, IsDown(), timeout=5) is False


def test_a_tell_and_an_ask_behind_a_crashed_childs_stop_go_to_the_restarted_instance() -> None:
    """Regression: what reached a crashed child between its queued stop (on Retire) and pykka marking it
    stopped went to pykka's teardown: the tell was dropped silently, the ask failed (ActorGone) though
    the restarted instance runs. It is collected as the child stops and handed over, in order."""
    StopsAtGate.GATE.clear()
    StopsAtGate.STOPPING.clear()
    sup = Sup.start(Factory(actor_class=StopsAtGate))
    child = ask(sup, StartChild(), timeout=5)
    try:
        child.tell(Crash())
        assert StopsAtGate.STOPPING.wait(5)  # it handled Retire: its stop is queued, it is still alive
        assert tell(child, Record(7))  # accepted, behind the stop
        reply = ask_later(child, Seen())
    finally:
        StopsAtGate.GATE.set()
    assert reply.get(timeout=5) == (7,)  # answered by the restarted instance, after the tell
    new = _await_new_child(sup, child)
    assert ask(new, Seen(), timeout=5) == (7,)


def test_an_ask_answered_after_the_crash_is_not_handed_to_the_restarted_instance() -> None:
    sup = Sup.start(Factory(actor_class=AnswersGetAfterCrash))
    child = ask(sup, StartChild(), timeout=5)
    gate = _block(child)
    child.tell(Crash())
    reply = ask_later(child, Get())
    child.tell(Record(3))
    gate.set()
    assert reply.get(timeout=5) == -1  # from the crashed instance
    new = _await_new_child(sup, child)
    assert ask(new, Seen(), timeout=5) == (3,)  # the tell still moved on


@pytest.mark.parametrize("how", ["stops", "crashes"])
def test_a_supervisor_that_ends_before_it_handles_a_crash_report_stops_the_crashed_child(how: str) -> None:
    """The child's ChildCrashed lands behind its supervisor's stop (or crash): no Retire ever comes.
    The supervisor stops its children as it ends, so the crashed one does not wait for ever."""
    sup = BlockableSup.start(Factory(actor_class=AnswersGetAfterCrash))
    child = ask(sup, StartChild(), timeout=5)
    sup_gate = _block(sup)
    if how == "stops":
        sup.stop(block=False)
    else:
        sup.tell(Crash())
    child.tell(Crash())
    # Answered by the crashed instance: its crash began, so its ChildCrashed is already queued, behind the
    # supervisor's end (the supervisor is held).
    assert ask(child, Get(), timeout=5) == -1
    sup_gate.set()
    assert sup.actor_stopped.wait(5)
    assert child.actor_stopped.wait(5), "the crashed child outlived its supervisor"


def test_a_forgotten_instance_crashing_late_never_takes_down_its_successor() -> None:
    """Generations keep rising across forget_child: the forgotten instance's crash report (generation 0)
    is stale, so the healthy successor (generation 1) is neither marked down nor restarted over."""
    factory = Factory()
    reports: list[ChildFailed] = []
    sup = Parent.start(factory, reports=reports)
    first = ask(sup, StartChild(), timeout=5)
    gate = _block(first)
    ask(sup, Forget(), timeout=5)  # an idle stop forgot it before it handled its stop
    second = ask(sup, StartChild(), timeout=5)
    assert ask(second, WhoAmI(), timeout=5) == ("c", 1)
    first.tell(Crash())
    gate.set()
    await_condition(lambda: len(reports) == 1, timeout=5, message="the forgotten instance's ChildFailed")
    assert reports[0].generation == 0
    assert _child(sup) == second and ask(sup, IsDown(), timeout=5) is False  # both of its reports were stale
    assert second.is_alive() and ask(second, WhoAmI(), timeout=5) == ("c", 1)
    assert [link.generation for link, _ in factory.calls] == [0, 1]


def test_a_restarted_supervisor_never_takes_its_predecessors_child_report_for_its_own_child() -> None:
    """S crashes while its child c's crash report is queued: the parent hands S's mailbox to S', whose own
    fresh c has generation 0 too. The report names the old instance, so S' treats it as stale: it never
    restarts over its healthy c (two live instances of c before)."""
    children = Factory()
    reports: list[ChildFailed] = []
    sups: list[pykka.ActorRef[Any]] = []

    def start_sup(link: Link, salvage: Any) -> pykka.ActorRef[Any]:
        ref = StartsItsChild.start(children, link=link, reports=reports)
        sups.append(ref)
        return ref

    parent = BlockableSup.start(start_sup)
    first = ask(parent, StartChild("s"), timeout=5)
    old_c = ask(first, ChildRef("c"), timeout=5)
    parent_gate, sup_gate = _block(parent), _block(first)
    old_c.tell(Crash())  # its ChildCrashed waits in S behind the Block
    await_condition(lambda: first.actor_inbox.qsize() == 1, timeout=5, message="c's crash report queued in S")
    first.tell(Crash())  # S answers c's report (Retire), then crashes
    sup_gate.set()
    assert old_c.actor_stopped.wait(5)  # c reported ChildFailed to S, which collects it for S'
    parent_gate.set()
    await_condition(lambda: len(reports) == 1 and len(sups) == 2, timeout=5, message="S' handled the old report")
    fresh = ask(sups[1], ChildRef("c"), timeout=5)
    assert reports[0].ref is old_c and fresh is not old_c and fresh.is_alive()
    assert ask(sups[1], IsDown("c"), timeout=5) is False
    assert children.count() == 2  # the first c and S''s own; no restart over the healthy one
    assert [ref for ref in pykka.ActorRegistry.get_by_class(Counter) if ref.is_alive()] == [fresh]


def test_a_restarted_child_is_rebuilt_from_its_salvage() -> None:
    factory = Factory(SalvagingCounter)
    sup = Sup.start(factory)
    child = ask(sup, StartChild(), timeout=5)
    for _ in range(3):
        child.tell(Inc())
    new = _crash_once(sup, child)
    assert factory.calls[1][1] == 3
    assert ask(new, Get(), timeout=5) == 3
    assert ask(new, Inc(), timeout=5) == 4


def test_an_ask_failure_is_not_a_crash() -> None:
    factory = Factory()
    sup = Sup.start(factory)
    child = ask(sup, StartChild(), timeout=5)
    child.tell(Inc())
    with pytest.raises(ValueError):
        ask(child, Fail(), timeout=5)
    assert ask(child, Get(), timeout=5) == 1
    assert factory.count() == 1


def test_the_crashed_childs_mailbox_moves_to_the_new_instance_in_order() -> None:
    sup = Sup.start(Factory())
    child = ask(sup, StartChild(), timeout=5)
    child.tell(Record(0))  # handled by the old instance: lost with its state
    gate = _block(child)
    child.tell(Crash())
    first_ask = ask_later(child, Seen())
    child.tell(Record(1))
    child.tell(Record(2))
    inc_ask = ask_later(child, Inc())
    child.tell(Record(3))
    last_ask = ask_later(child, Seen())
    gate.set()
    # the asks queued behind the crash are answered by the new instance, in mailbox order
    assert first_ask.get(timeout=5) == ()
    assert inc_ask.get(timeout=5) == 1
    assert last_ask.get(timeout=5) == (1, 2, 3)
    new = _await_new_child(sup, child)
    assert ask(new, WhoAmI(), timeout=5) == ("c", 1)


def test_asks_queued_behind_a_crash_through_ask_get_answers() -> None:
    sup = Sup.start(Factory())
    child = ask(sup, StartChild(), timeout=5)
    gate = _block(child)
    child.tell(Crash())
    results: list[Any] = []
    errors: list[BaseException] = []
    done = threading.Event()
    ready = threading.Barrier(2)

    def asker() -> None:
        try:
            ready.wait(5)
            results.append(ask(child, WhoAmI(), timeout=10))
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=asker, daemon=True).start()
    ready.wait(5)
    await_condition(lambda: child.actor_inbox.qsize() == 2, message="crash + ask queued")
    gate.set()
    assert done.wait(10)
    assert errors == []
    assert results == [("c", 1)]


def test_a_stale_generation_report_hands_its_asks_to_the_running_child() -> None:
    sup = Sup.start(Factory())
    child = ask(sup, StartChild(), timeout=5)
    future: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
    sup.tell(ChildFailed("c", 7, RuntimeError("old"), (Request(WhoAmI(), relay=future),)))
    assert future.get(timeout=5) == ("c", 0)  # answered by the running instance
    assert _child(sup).actor_urn == child.actor_urn  # type: ignore[union-attr]  # nothing restarted


def test_a_report_for_an_unknown_child_fails_its_asks_instead_of_hanging() -> None:
    sup = Sup.start(Factory())
    future: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
    sup.tell(ChildFailed("nobody", 0, RuntimeError("old"), (Request(Get(), relay=future),)))
    with pytest.raises(pykka.ActorDeadError):
        future.get(timeout=5)


def test_requeue_into_a_dead_replacement_fails_the_asks() -> None:
    calls = [0]

    def factory(link: Link, salvage: Any) -> pykka.ActorRef[Any]:
        calls[0] += 1
        ref = Counter.start(link=link)
        if calls[0] > 1:
            ref.stop()  # the replacement is dead on arrival
        return ref

    sup = Sup.start(factory)
    child = ask(sup, StartChild(), timeout=5)
    gate = _block(child)
    child.tell(Crash())
    queued = ask_later(child, Get())
    gate.set()
    with pytest.raises(ActorGone):
        queued.get(timeout=5)


def test_tells_a_dead_replacement_could_not_take_reach_the_instance_after_it() -> None:
    """Regression: the crashed child's told mailbox was dropped when its replacement died before taking it."""
    calls = [0]

    def factory(link: Link, salvage: Any) -> pykka.ActorRef[Any]:
        calls[0] += 1
        ref = Counter.start(link=link)
        if calls[0] == 2:
            ref.stop()  # the first replacement is dead on arrival
        return ref

    handed: list[tuple[str, tuple[Any, ...]]] = []

    class Counting(Sup):
        def on_held_handed_over(self, name: str, messages: tuple[Any, ...]) -> None:
            handed.append((name, messages))

    sup = Counting.start(factory)
    child = ask(sup, StartChild(), timeout=5)
    gate = _block(child)
    child.tell(Crash())
    child.tell(Record(1))
    child.tell(Record(2))
    gate.set()
    await_condition(lambda: calls[0] == 2, message="the crash restarted the child (dead on arrival)")
    replacement = ask(sup, StartChild(), timeout=5)  # the next start: it takes what was held
    assert calls[0] == 3
    assert ask(replacement, Seen(), timeout=5) == (1, 2)
    assert handed == [("c", (Record(1), Record(2)))]  # the hook saw them (the Dispatcher counts its Delivers)


def test_a_stale_report_hands_its_salvage_to_the_running_child_through_the_hook() -> None:
    handed: list[tuple[str, Any]] = []

    class Salvaging(Sup):
        def on_stale_failure(self, name: str, ref: pykka.ActorRef[Any], failure: ChildFailed) -> None:
            handed.append((name, failure.salvage))
            super().on_stale_failure(name, ref, failure)

    sup = Salvaging.start(Factory())
    child = ask(sup, StartChild(), timeout=5)
    sup.tell(ChildFailed("c", 7, RuntimeError("old"), (Record(5),), salvage="queued work"))
    await_condition(lambda: handed == [("c", "queued work")], message="the hook saw the stale salvage")
    assert ask(child, Seen(), timeout=5) == (5,)  # its mailbox too


def test_a_factory_failing_on_restart_fails_the_queued_asks() -> None:
    """Regression: the pending envelopes were lost with the supervisor, so those asks hung forever."""
    calls = [0]

    def factory(link: Link, salvage: Any) -> pykka.ActorRef[Any]:
        calls[0] += 1
        if calls[0] > 1:
            raise OSError("cannot start the replacement")
        return Counter.start(link=link)

    sup = Sup.start(factory)
    child = ask(sup, StartChild(), timeout=5)
    gate = _block(child)
    child.tell(Crash())
    queued = ask_later(child, Get())
    gate.set()
    with pytest.raises(ActorGone):
        queued.get(timeout=5)
    await_condition(lambda: not sup.is_alive(), message="the supervisor to crash on the factory error")


# ── intensity & escalation ──────────────────────────────────────────────────


def test_more_restarts_than_allowed_escalate() -> None:
    clock = FakeClock()
    factory = Factory()
    escalations: list[tuple[str, BaseException | None]] = []
    sup = RecordingSup.start(
        factory, policy=RestartPolicy(max_restarts=2, within_seconds=10), clock=clock, escalations=escalations
    )
    child = ask(sup, StartChild(), timeout=5)
    for _ in range(2):  # two restarts are allowed
        clock.now += 1
        child = _crash_once(sup, child)
    assert factory.count() == 3
    # the third crash within the window escalates
    gate = _block(child)
    child.tell(Crash())
    queued = [ask_later(child, Get()) for _ in range(3)]
    clock.now += 1
    gate.set()
    for future in queued:
        with pytest.raises(ActorGone):
            future.get(timeout=5)
    await_condition(lambda: escalations, message="on_escalation")
    name, error = escalations[0]
    assert name == "c"
    assert isinstance(error, RuntimeError)
    assert _child(sup) is None  # the child stays down
    assert not child.is_alive()
    assert factory.count() == 3  # and was not started again
    assert set(ask(sup, Escalated(), timeout=5)) == {"c"}
    assert sup.is_alive()  # this supervisor's hook did not crash it
    with pytest.raises(ActorGone):
        ask(child, Get(), timeout=5)


def test_more_than_64_restarts_allowed_still_escalate() -> None:
    """Regression: the restart history held 64 restarts, so a policy allowing more never escalated
    (the child was restarted for ever)."""
    factory = Factory(actor_class=FailsEveryStartBelow)
    escalations: list[tuple[str, BaseException | None]] = []
    sup = RecordingSup.start(
        factory, policy=RestartPolicy(max_restarts=65, within_seconds=10), clock=FakeClock(), escalations=escalations
    )
    ask(sup, StartChild(), timeout=5)  # every start fails at the same instant
    await_condition(
        lambda: escalations or factory.count() > FailsEveryStartBelow.LAST_FAILING,
        timeout=30,
        message="an escalation (or the bound on failing starts)",
    )
    assert [name for name, _error in escalations] == ["c"]
    assert factory.count() == 66  # the first start and 65 restarts


def test_start_child_after_escalation_clears_it() -> None:
    escalations: list[tuple[str, BaseException | None]] = []
    sup = RecordingSup.start(
        Factory(), policy=RestartPolicy(max_restarts=0, within_seconds=10), clock=FakeClock(), escalations=escalations
    )
    child = ask(sup, StartChild(), timeout=5)
    child.tell(Crash())
    await_condition(lambda: escalations, message="on_escalation")
    again = ask(sup, StartChild(), timeout=5)
    assert again.is_alive()
    assert ask(sup, Escalated(), timeout=5) == {}
    assert ask(again, WhoAmI(), timeout=5) == ("c", 1)  # generations never repeat for a name


@pytest.mark.parametrize(
    ("gap", "crashes", "escalates"),
    [
        (0.0, 3, True),  # max_restarts=2: the 3rd crash in the window escalates
        (0.0, 2, False),
        (4.0, 3, True),  # crashes at 0, 4, 8: all within 10 s of each other
        (6.0, 3, False),  # crashes at 0, 6, 12: the first one left the window
        (11.0, 6, False),  # slow crashes never escalate
    ],
)
def test_restart_window_with_an_injected_clock(gap: float, crashes: int, escalates: bool) -> None:
    clock = FakeClock()
    factory = Factory()
    escalations: list[tuple[str, BaseException | None]] = []
    sup = RecordingSup.start(
        factory, policy=RestartPolicy(max_restarts=2, within_seconds=10), clock=clock, escalations=escalations
    )
    child = ask(sup, StartChild(), timeout=5)
    for i in range(crashes):
        if i:
            clock.now += gap
        last = i == crashes - 1
        if last and escalates:
            child.tell(Crash())
            await_condition(lambda: escalations, message="on_escalation")
        else:
            child = _crash_once(sup, child)
    assert bool(escalations) is escalates
    assert factory.count() == (crashes if escalates else crashes + 1)


def test_default_escalation_crashes_the_supervisor() -> None:
    sup = Sup.start(Factory(), policy=RestartPolicy(max_restarts=0, within_seconds=10), clock=FakeClock())
    child = ask(sup, StartChild(), timeout=5)
    child.tell(Crash())
    await_condition(lambda: not sup.is_alive(), message="the supervisor to crash")
    with pytest.raises(ActorGone):
        ask(sup, ChildRef(), timeout=5)


def test_default_escalation_reports_to_the_parent_supervisor() -> None:
    child_factory = Factory()
    reports: list[ChildFailed] = []
    restarted: list[tuple[str, str]] = []

    def mid_factory(link: Link, salvage: Any) -> pykka.ActorRef[Any]:
        return Sup.start(
            child_factory, policy=RestartPolicy(max_restarts=0, within_seconds=10), clock=FakeClock(), link=link
        )

    parent = Parent.start(mid_factory, reports=reports, restarted=restarted)
    mid = ask(parent, StartChild("mid"), timeout=5)
    child = ask(mid, StartChild(), timeout=5)
    child.tell(Crash())  # mid allows no restart: it escalates, crashes, and reports to the parent
    new_mid = _await_new_child(parent, mid, "mid")
    assert not mid.is_alive()
    assert not child.is_alive()
    assert len(reports) == 1
    report = reports[0]
    assert (report.name, report.generation) == ("mid", 0)
    assert isinstance(report.error, EscalatedFailure)
    assert report.error.child == "c"
    assert isinstance(report.error.cause, RuntimeError)
    assert restarted == [("mid", new_mid.actor_urn)]
    assert parent.is_alive()
    # the restarted supervisor is a fresh one: it can start its child again
    new_child = ask(new_mid, StartChild(), timeout=5)
    assert ask(new_child, Inc(), timeout=5) == 1
    assert child_factory.count() == 2


# ── RestartPolicy ───────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("max_restarts", "within", "history", "now", "allowed"),
    [
        (3, 5.0, [], 0.0, True),
        (3, 5.0, [1.0, 2.0], 3.0, True),
        (3, 5.0, [1.0, 2.0, 3.0], 4.0, False),
        (3, 5.0, [0.0, 1.0, 2.0], 5.0, False),  # the window is inclusive: 5 - 0 <= 5
        (3, 5.0, [0.0, 1.0, 2.0], 5.001, True),  # the oldest left the window
        (3, 5.0, [0.0, 0.5, 1.0, 7.0, 8.0], 9.0, True),  # only the recent ones count
        (3, 5.0, [5.0, 6.0, 7.0, 8.0], 9.0, False),
        (1, 10.0, [], 0.0, True),
        (1, 10.0, [0.0], 10.0, False),
        (1, 10.0, [0.0], 10.5, True),
        (0, 10.0, [], 0.0, False),  # no restarts at all
        (2, 0.0, [1.0, 1.0], 1.0, False),  # a zero window still counts same-instant restarts
        (2, 0.0, [1.0, 1.0], 1.1, True),
    ],
)
def test_restart_policy_allows(
    max_restarts: int, within: float, history: list[float], now: float, allowed: bool
) -> None:
    policy = RestartPolicy(max_restarts=max_restarts, within_seconds=within)
    before = list(history)
    assert policy.allows(deque(history), now) is allowed
    assert history == before  # pure: the history is not changed


@pytest.mark.parametrize("max_restarts", [0, 1, 3, 64, 65, 1000])
def test_a_restart_history_lets_a_policy_count_all_it_allows(max_restarts: int) -> None:
    policy = RestartPolicy(max_restarts=max_restarts, within_seconds=10)
    history = policy.new_history()
    restarts = 0
    while policy.allows(history, 0.0) and restarts <= max_restarts:  # at one instant: all in the window
        history.append(0.0)
        restarts += 1
    assert restarts == max_restarts
    assert not policy.allows(history, 0.0)
    assert policy.allows(history, 10.5) is (max_restarts > 0)  # they all left the window


def test_restart_policy_defaults() -> None:
    policy = RestartPolicy()
    assert (policy.max_restarts, policy.within_seconds) == (3, 5.0)


def test_escalated_failure_names_the_child_and_cause() -> None:
    cause = RuntimeError("root cause")
    error = EscalatedFailure("worker-1", cause)
    assert error.child == "worker-1"
    assert error.cause is cause
    assert "worker-1" in str(error)
    assert "root cause" in str(error)
