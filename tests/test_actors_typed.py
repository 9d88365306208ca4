"""Typed dispatch, ask/tell and crash handling of ``actors.TypedActor``."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import FrozenInstanceError, dataclass
from typing import Any

import pykka
import pytest

from actors import (
    ActorGone,
    AskTimeout,
    HandlerAborted,
    Probe,
    TypedActor,
    UnexpectedReply,
    UnknownMessageError,
    ask,
    ask_later,
    ask_reply_to,
    await_condition,
    handles,
    tell,
)
from actors.messages import Request

pytestmark = pytest.mark.usefixtures("stop_all_actors")  # conftest: stops the bare actors

# ── messages ────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Base:
    n: int = 0


@dataclass(frozen=True)
class Derived(Base):
    pass


@dataclass(frozen=True)
class MoreDerived(Derived):
    pass


@dataclass(frozen=True)
class Sibling(Base):
    pass


@dataclass(frozen=True)
class Ping:
    pass


@dataclass(frozen=True)
class Pong:
    pass


@dataclass(frozen=True)
class Stranger:
    pass


@dataclass(frozen=True)
class Inc:
    pass


@dataclass(frozen=True)
class Get:
    pass


@dataclass(frozen=True)
class Fail:
    text: str = "handler failed"


@dataclass(frozen=True)
class Crash:
    pass


@dataclass(frozen=True)
class Block:
    gate: threading.Event
    entered: threading.Event | None = None


@dataclass(frozen=True)
class Echo:
    value: Any


# ── actors ──────────────────────────────────────────────────────────────────


class Router(TypedActor):
    @handles(Base)
    def on_base(self, msg: Base) -> tuple[str, str]:
        return ("base", type(msg).__name__)

    @handles(Derived)
    def on_derived(self, msg: Derived) -> tuple[str, str]:
        return ("derived", type(msg).__name__)

    @handles(Ping, Pong)
    def on_ping_or_pong(self, msg: Ping | Pong) -> tuple[str, str]:
        return ("ping", type(msg).__name__)


class SpecialRouter(Router):
    """Inherits Router's handlers and adds a more specific one in the subclass."""

    @handles(MoreDerived)
    def on_more(self, msg: MoreDerived) -> tuple[str, str]:
        return ("more", type(msg).__name__)


class OverridingRouter(Router):
    """Re-registers Derived under a new name: the subclass's registration wins."""

    @handles(Derived)
    def on_derived_v2(self, msg: Derived) -> tuple[str, str]:
        return ("derived-v2", type(msg).__name__)


class Empty(TypedActor):
    pass


class Worker(TypedActor):
    def __init__(self, crashes: list[tuple[BaseException | None, list[Any]]] | None = None) -> None:
        super().__init__()
        self.count = 0
        self.crashes = crashes if crashes is not None else []

    @handles(Inc)
    def inc(self, msg: Inc) -> int:
        self.count += 1
        return self.count

    @handles(Get)
    def get(self, msg: Get) -> int:
        return self.count

    @handles(Fail)
    def fail(self, msg: Fail) -> None:
        raise ValueError(msg.text)

    @handles(Crash)
    def crash(self, msg: Crash) -> None:
        raise RuntimeError("crash on purpose")

    @handles(Block)
    def block(self, msg: Block) -> None:
        if msg.entered is not None:
            msg.entered.set()
        assert msg.gate.wait(10), "test forgot to open the gate"

    @handles(Echo)
    def echo(self, msg: Echo) -> Any:
        return msg.value


class RecordingWorker(Worker):
    """Records what on_crash was handed, then behaves like the default."""

    def on_crash(self, error: BaseException | None, pending: list[Any], salvage: Any) -> None:
        self.crashes.append((error, [m.message if isinstance(m, Request) else m for m in pending]))
        super().on_crash(error, pending, salvage)


# ── fixtures ────────────────────────────────────────────────────────────────


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=8) as pool:
        yield pool


def _inbox_size(ref: pykka.ActorRef[Any]) -> int:
    return ref.actor_inbox.qsize()  # type: ignore[attr-defined]


def _block(ref: pykka.ActorRef[Any]) -> threading.Event:
    """Make ``ref`` busy until the returned gate is set (and wait until it is busy)."""
    gate, entered = threading.Event(), threading.Event()
    ref.tell(Block(gate, entered))
    assert entered.wait(5)
    return gate


# ── dispatch ────────────────────────────────────────────────────────────────


def test_messages_are_frozen_dataclasses() -> None:
    with pytest.raises(FrozenInstanceError):
        Base(1).n = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("actor_class", "message", "expected"),
    [
        (Router, Base(), ("base", "Base")),
        (Router, Derived(), ("derived", "Derived")),  # most specific wins over Base
        (Router, MoreDerived(), ("derived", "MoreDerived")),  # nearest registered base
        (Router, Sibling(), ("base", "Sibling")),  # subclass without its own handler → base handler
        (Router, Ping(), ("ping", "Ping")),  # one handler, several types
        (Router, Pong(), ("ping", "Pong")),
        (SpecialRouter, MoreDerived(), ("more", "MoreDerived")),  # subclass actor adds a specific one
        (SpecialRouter, Derived(), ("derived", "Derived")),  # and inherits the rest
        (SpecialRouter, Base(), ("base", "Base")),
        (OverridingRouter, Derived(), ("derived-v2", "Derived")),
        (OverridingRouter, MoreDerived(), ("derived-v2", "MoreDerived")),
    ],
)
def test_handler_is_chosen_by_message_type(
    actor_class: type[TypedActor], message: object, expected: tuple[str, str]
) -> None:
    ref = actor_class.start()
    assert ask(ref, message, timeout=5) == expected


def test_dispatch_is_stable_across_repeated_messages() -> None:
    """The per-instance dispatch cache must not mix up types."""
    ref = SpecialRouter.start()
    sequence = [Base(), MoreDerived(), Derived(), Sibling(), MoreDerived(), Base(), Ping()]
    answers = [ask(ref, m, timeout=5)[0] for m in sequence]
    assert answers == ["base", "more", "derived", "base", "more", "base", "ping"]


def test_unknown_message_raises_to_the_asker_naming_actor_type_and_handled() -> None:
    ref = Router.start()
    with pytest.raises(UnknownMessageError) as info:
        ask(ref, Stranger(), timeout=5)
    text = str(info.value)
    assert "Router" in text
    assert "Stranger" in text
    assert "Base, Derived, Ping, Pong" in text
    assert isinstance(info.value, TypeError)
    assert ask(ref, Ping(), timeout=5) == ("ping", "Ping")  # still running


def test_unknown_message_to_an_actor_with_no_handlers_says_nothing() -> None:
    ref = Empty.start()
    with pytest.raises(UnknownMessageError, match="Empty has no handler for Stranger; it handles: nothing"):
        ask(ref, Stranger(), timeout=5)


def test_unknown_told_message_is_logged_and_the_actor_keeps_running(log_records: list[Any]) -> None:
    ref = Worker.start()
    ask(ref, Inc(), timeout=5)
    assert tell(ref, Stranger()) is True

    def dropped() -> list[Any]:
        return [r for r in log_records if "dropped a told message" in r["message"]]

    found = await_condition(dropped, message="a 'dropped' warning")
    assert found[0]["level"].name == "WARNING"
    assert "Stranger" in found[0]["message"]
    assert "Worker" in found[0]["message"]
    assert ref.is_alive()
    assert ask(ref, Get(), timeout=5) == 1  # state kept: it did not crash and restart


def test_unknown_told_message_does_not_reach_on_crash() -> None:
    crashes: list[tuple[BaseException | None, list[Any]]] = []
    ref = RecordingWorker.start(crashes)
    ref.tell(Stranger())
    assert ask(ref, Inc(), timeout=5) == 1
    assert crashes == []


# ── ask / tell ──────────────────────────────────────────────────────────────


@pytest.mark.parametrize("value", [0, 42, "text", None, (1, 2), {"k": [1]}])
def test_ask_returns_the_handlers_value(value: Any) -> None:
    ref = Worker.start()
    assert ask(ref, Echo(value), timeout=5) == value


@pytest.mark.parametrize(
    ("value", "expect"),
    [(42, int), ("x", str), (True, int), ((1,), tuple)],
)
def test_ask_expect_accepts_instances(value: Any, expect: type) -> None:
    ref = Worker.start()
    assert ask(ref, Echo(value), timeout=5, expect=expect) == value


@pytest.mark.parametrize(
    ("value", "expect"),
    [(42, str), ("x", int), (None, int), (1.5, int)],
)
def test_ask_expect_mismatch_raises_unexpected_reply(value: Any, expect: type) -> None:
    ref = Worker.start()
    with pytest.raises(UnexpectedReply) as info:
        ask(ref, Echo(value), timeout=5, expect=expect)
    text = str(info.value)
    assert type(value).__name__ in text
    assert expect.__name__ in text
    assert "Echo" in text
    assert isinstance(info.value, TypeError)
    assert ask(ref, Get(), timeout=5) == 0


def test_slow_handler_times_out_within_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the asker waited for is read from the future's own wait, not from a wall clock a loaded machine
    # stretches: ask hands its whole timeout (no more, no less) to the one wait, and gives up while the
    # handler is still blocked, so the AskTimeout came from that wait and not from an answer.
    waits: list[float | None] = []
    real_get = pykka.ThreadingFuture.get
    me = threading.current_thread()

    def watched_get(future: pykka.ThreadingFuture[Any], *, timeout: float | None = None) -> Any:
        if threading.current_thread() is me:
            waits.append(timeout)
        return real_get(future, timeout=timeout)

    ref = Worker.start()
    gate = _block(ref)
    monkeypatch.setattr(pykka.ThreadingFuture, "get", watched_get)
    try:
        with pytest.raises(AskTimeout) as info:
            ask(ref, Get(), timeout=0.2)
        assert waits == [0.2]
        assert _inbox_size(ref) == 1, "the Get is still queued behind the blocked handler"
        assert "Get" in str(info.value) and "within 0.2s" in str(info.value)
        assert isinstance(info.value, TimeoutError)
    finally:
        gate.set()
    assert ask(ref, Inc(), timeout=5) == 1  # the actor is fine afterwards


def test_ask_a_stopped_actor_raises_actor_gone() -> None:
    ref = Worker.start()
    ref.stop()
    with pytest.raises(ActorGone, match="Get"):
        ask(ref, Get(), timeout=5)


def test_tell_reports_whether_the_actor_is_alive() -> None:
    ref = Worker.start()
    assert tell(ref, Inc()) is True
    assert ask(ref, Get(), timeout=5) == 1
    ref.stop()
    assert tell(ref, Inc()) is False


def test_handler_exception_is_reraised_at_the_asker_and_the_actor_survives() -> None:
    ref = Worker.start()
    assert ask(ref, Inc(), timeout=5) == 1
    with pytest.raises(ValueError, match="boom-42"):
        ask(ref, Fail("boom-42"), timeout=5)
    assert ref.is_alive()
    assert ask(ref, Inc(), timeout=5) == 2  # same instance, state kept


def test_ask_queued_behind_a_stop_fails_with_actor_gone(executor: ThreadPoolExecutor) -> None:
    ref = Worker.start()
    gate = _block(ref)
    ref.stop(block=False)
    # ask() checks liveness first; the actor is still alive, so this ask is queued behind the stop.
    future = executor.submit(ask, ref, Get(), timeout=10)
    await_condition(lambda: _inbox_size(ref) == 2, message="stop + ask queued")
    gate.set()
    with pytest.raises(ActorGone):
        future.result(timeout=5)


# ── crashes ─────────────────────────────────────────────────────────────────


def test_crash_on_a_tell_stops_the_actor(log_records: list[Any]) -> None:
    ref = Worker.start()
    ref.tell(Crash())
    await_condition(lambda: not ref.is_alive(), message="the crashed actor to stop")
    await_condition(
        lambda: any("crashed unsupervised" in r["message"] for r in log_records),
        message="the crash to be logged",
    )
    with pytest.raises(ActorGone):
        ask(ref, Get(), timeout=5)


def test_asks_queued_behind_a_crash_fail_promptly_when_unsupervised(executor: ThreadPoolExecutor) -> None:
    ref = Worker.start()
    gate = _block(ref)
    ref.tell(Crash())
    futures: list[Future[Any]] = [executor.submit(ask, ref, Get(), timeout=30) for _ in range(5)]
    await_condition(lambda: _inbox_size(ref) == 6, message="crash + 5 asks queued")
    gate.set()
    for future in futures:
        # An ask left to wait out its own 30 s would end in AskTimeout: ActorGone says the crash failed it.
        # (The 60 s here only keeps a hang from holding the test; it is not a timing claim.)
        with pytest.raises(ActorGone):
            future.result(timeout=60)
    assert not ref.is_alive()


def test_on_crash_gets_the_error_and_the_pending_mailbox_in_order() -> None:
    crashes: list[tuple[BaseException | None, list[Any]]] = []
    ref = RecordingWorker.start(crashes)
    gate = _block(ref)
    ref.tell(Crash())
    ref.tell(Inc())
    pending_ask = ask_later(ref, Echo("queued"))
    ref.tell(Get())
    gate.set()
    with pytest.raises(ActorGone):
        pending_ask.get(timeout=5)
    assert len(crashes) == 1
    error, pending = crashes[0]
    assert isinstance(error, RuntimeError)
    assert pending == [Inc(), Echo("queued"), Get()]


def test_blocking_stop_queued_behind_a_crash_is_answered() -> None:
    """Regression: the crash path dropped queued stop requests, so ref.stop() hung forever."""
    ref = Worker.start()
    gate = _block(ref)
    ref.tell(Crash())
    stopped = ref.stop(block=False)
    gate.set()
    assert stopped.get(timeout=5) is True
    assert not ref.is_alive()


class StopsAtGateWorker(RecordingWorker):
    """Its first stop (the crashed actor's own, on EndOfMailbox) waits at ``gate`` once queued."""

    def __init__(
        self, crashes: list[tuple[BaseException | None, list[Any]]], stopping: threading.Event, gate: threading.Event
    ) -> None:
        super().__init__(crashes)
        self.stopping, self.gate = stopping, gate

    def stop(self) -> None:
        super().stop()
        if not self.stopping.is_set():
            self.stopping.set()
            assert self.gate.wait(10), "test forgot to open the gate"


def test_what_is_told_behind_a_crashed_actors_stop_reaches_on_crash(log_records: list[Any]) -> None:
    """Regression: a tell that reached a crashed actor after its stop was queued, before pykka marked it
    stopped, was dropped by pykka's teardown, unreported. It is collected as the actor stops."""
    crashes: list[tuple[BaseException | None, list[Any]]] = []
    stopping, gate = threading.Event(), threading.Event()
    ref = StopsAtGateWorker.start(crashes, stopping, gate)
    try:
        ref.tell(Crash())
        assert stopping.wait(5)  # its stop is queued; it is still alive
        assert tell(ref, Inc())
        late_ask = ask_later(ref, Echo("late"))
    finally:
        gate.set()
    with pytest.raises(ActorGone, match="crashed before handling Echo"):  # failed by the crash report
        late_ask.get(timeout=5)
    assert ref.actor_stopped.wait(5)  # type: ignore[attr-defined]
    [(error, pending)] = crashes
    assert isinstance(error, RuntimeError)
    assert pending == [Inc(), Echo("late")]
    assert any("told Inc dropped" in r["message"] for r in log_records)  # unsupervised: dropped, and said so


def test_a_stop_behind_a_crashed_actors_stop_is_still_answered() -> None:
    """pykka's own messages behind the stop are left to pykka (a blocking stop gets its answer)."""
    crashes: list[tuple[BaseException | None, list[Any]]] = []
    stopping, gate = threading.Event(), threading.Event()
    ref = StopsAtGateWorker.start(crashes, stopping, gate)
    try:
        ref.tell(Crash())
        assert stopping.wait(5)
        stopped = ref.stop(block=False)
        ref.tell(Inc())
    finally:
        gate.set()
    assert stopped.get(timeout=5) is True
    assert ref.actor_stopped.wait(5)  # type: ignore[attr-defined]
    [(_error, pending)] = crashes
    assert pending == [Inc()]


def test_salvage_defaults_to_none() -> None:
    assert Worker().salvage() is None


# ── BaseException from a handler: one actor's problem, never the system's ──


@dataclass(frozen=True)
class Exit:
    error: BaseException


class Exiter(Worker):
    @handles(Exit)
    def exit(self, msg: Exit) -> None:
        raise msg.error


@pytest.mark.parametrize("error", [SystemExit(2), KeyboardInterrupt(), GeneratorExit()])
def test_a_told_base_exception_crashes_only_that_actor(error: BaseException) -> None:
    """Regression (issue 11 item 2): pykka stopped every actor in the process on a SystemExit."""
    bystander = Worker.start()
    ref = Exiter.start()
    ref.tell(Exit(error))
    await_condition(lambda: not ref.is_alive(), timeout=10, message="the exiting actor to stop")
    assert ask(bystander, Inc(), timeout=10) == 1  # the unrelated actor keeps answering
    assert ask(bystander, Inc(), timeout=10) == 2
    assert bystander.is_alive()


@pytest.mark.parametrize("error", [SystemExit(2), KeyboardInterrupt(), GeneratorExit()])
def test_an_asked_base_exception_comes_back_as_handler_aborted(error: BaseException) -> None:
    bystander = Worker.start()
    ref = Exiter.start()
    with pytest.raises(HandlerAborted) as caught:
        ask(ref, Exit(error), timeout=10)
    assert caught.value.cause is error
    assert ask(ref, Inc(), timeout=10) == 1  # the asked actor itself survives, like any ask error
    assert ask(bystander, Inc(), timeout=10) == 1


HOOKS = ["on_crashing", "salvage", "answer_after_crash", "on_crash"]


class ExitsInAHook(Worker):
    """Its crash hook ``hook`` raises SystemExit; it records its actor thread (to join it)."""

    def __init__(self, hook: str, threads: list[threading.Thread]) -> None:
        super().__init__()
        self.hook = hook
        self.threads = threads

    def on_start(self) -> None:
        self.threads.append(threading.current_thread())

    def _exit_in(self, hook: str) -> None:
        if self.hook == hook:
            raise SystemExit(3)

    def on_crashing(self, error: BaseException) -> None:
        self._exit_in("on_crashing")

    def salvage(self) -> Any:
        self._exit_in("salvage")
        return None

    def answer_after_crash(self, message: Any) -> tuple[bool, Any]:
        self._exit_in("answer_after_crash")
        return False, None

    def on_crash(self, error: BaseException | None, pending: list[Any], salvage: Any) -> None:
        self._exit_in("on_crash")
        super().on_crash(error, pending, salvage)


@pytest.mark.parametrize("hook", HOOKS)
def test_a_system_exit_from_a_crash_hook_is_logged_and_stops_no_other_actor(hook: str, log_records: list[Any]) -> None:
    """Regression: a SystemExit from a crash hook reached pykka, which stopped every actor in the process."""
    bystander = Worker.start()
    threads: list[threading.Thread] = []
    ref = ExitsInAHook.start(hook, threads)
    gate = _block(ref)
    ref.tell(Crash())
    queued = ask_later(ref, Get())  # behind the crash: answer_after_crash sees it
    gate.set()
    with pytest.raises(ActorGone):  # the crash went on: unsupervised, its queued ask failed
        queued.get(timeout=10)
    [thread] = threads
    thread.join(10)  # the crashed actor's thread is done (pykka's stop of every actor would be done too)
    assert not thread.is_alive()
    assert bystander.is_alive()
    assert ask(bystander, Inc(), timeout=10) == 1
    assert any(f"{hook}() failed" in r["message"] for r in log_records)
    assert any("crashed unsupervised" in r["message"] for r in log_records)  # the report still ran


def test_a_system_exit_from_make_reply_is_logged_and_the_asked_actor_keeps_running(log_records: list[Any]) -> None:
    """Regression: ask_reply_to's make_reply runs on the asked actor's thread; its SystemExit stopped every actor."""
    bystander = Worker.start()
    worker = Worker.start()
    probe, log = Probe.spawn()

    def exits(value: Any, error: BaseException | None) -> Any:
        raise SystemExit(3)

    ask_reply_to(worker, Echo("hi"), reply_to=probe, make_reply=exits)
    assert ask(worker, Inc(), timeout=10) == 1  # queued behind it: the asked actor kept running
    assert ask(bystander, Inc(), timeout=10) == 1
    assert log.records() == []  # no reply could be built: the asker keeps its own deadline
    assert any("make_reply() failed" in r["message"] for r in log_records)


# ── ask_reply_to: the reply-later pattern ───────────────────────────────────


@dataclass(frozen=True)
class Answered:
    tag: str
    value: Any
    error: BaseException | None


def _reply_as(tag: str) -> Any:
    return lambda value, error: Answered(tag, value, error)


def test_ask_reply_to_tells_the_answer_back_without_blocking_the_asker() -> None:
    worker = Worker.start()
    probe, log = Probe.spawn()
    gate = _block(worker)  # the worker is busy: the ask must still return at once
    ask_reply_to(worker, Echo("hi"), reply_to=probe, make_reply=_reply_as("echo"))
    assert log.records() == []
    gate.set()
    assert log.expect(Answered) == [Answered("echo", "hi", None)]


def test_ask_reply_to_tells_the_handler_error_back_and_the_actor_keeps_running() -> None:
    worker = Worker.start()
    probe, log = Probe.spawn()
    ask_reply_to(worker, Fail("no luck"), reply_to=probe, make_reply=_reply_as("fail"))
    (answer,) = log.expect(Answered)
    assert answer.value is None and isinstance(answer.error, ValueError) and str(answer.error) == "no luck"
    assert ask(worker, Inc(), timeout=5) == 1


def test_ask_reply_to_a_dead_actor_raises_actor_gone() -> None:
    worker = Worker.start()
    worker.stop()
    probe, _log = Probe.spawn()
    with pytest.raises(ActorGone):
        ask_reply_to(worker, Inc(), reply_to=probe, make_reply=_reply_as("inc"))


def test_ask_reply_to_needs_a_typed_actor() -> None:
    probe, _log = Probe.spawn()
    with pytest.raises(TypeError, match="TypedActor"):
        ask_reply_to(probe, Inc(), reply_to=probe, make_reply=_reply_as("inc"))


# ── after_message ───────────────────────────────────────────────────────────


class Batcher(TypedActor):
    """Gathers told Inc messages; after each message, records (what it gathered, whether it was an ask)."""

    def __init__(self, fail_after: bool = False) -> None:
        super().__init__()
        self.gathered = 0
        self.seen: list[tuple[int, bool]] = []
        self.fail_after = fail_after

    @handles(Inc)
    def _inc(self, msg: Inc) -> None:
        self.gathered += 1

    @handles(Get)
    def _get(self, msg: Get) -> list[tuple[int, bool]]:
        return list(self.seen)

    def after_message(self, *, asked: bool) -> None:
        self.seen.append((self.gathered, asked))
        if self.fail_after and self.gathered:
            raise RuntimeError("after_message broke")


def test_after_message_runs_after_every_handler_and_knows_an_ask() -> None:
    ref = Batcher.start()
    tell(ref, Inc())
    tell(ref, Inc())
    first = ask(ref, Get(), timeout=5)
    second = ask(ref, Get(), timeout=5)
    assert first == [(1, False), (2, False)]  # each told Inc, then the hook; the ask's hook runs after its answer
    assert second == [(1, False), (2, False), (2, True)]


def test_an_error_in_after_message_crashes_that_actor_only() -> None:
    broken, bystander = Batcher.start(fail_after=True), Batcher.start()
    tell(broken, Inc())
    tell(bystander, Inc())
    await_condition(lambda: not broken.is_alive(), timeout=10, message="the broken actor stopping")
    assert ask(bystander, Get(), timeout=5) == [(1, False)]


class FeederStoppingWorker(RecordingWorker):
    """Its on_crashing tells it one more message (as a feeding thread finishing its send would)."""

    def __init__(self, crashes: list[tuple[BaseException | None, list[Any]]], fail_hook: bool = False) -> None:
        super().__init__(crashes)
        self.fail_hook = fail_hook
        self.crashing: list[BaseException] = []

    def on_crashing(self, error: BaseException) -> None:
        self.crashing.append(error)
        self.actor_ref.tell(Echo("told while crashing"))
        if self.fail_hook:
            raise RuntimeError("on_crashing failed")


@pytest.mark.parametrize("fail_hook", [False, True], ids=["hook", "raising-hook"])
def test_on_crashing_runs_before_the_mailbox_is_collected(fail_hook: bool) -> None:
    crashes: list[tuple[BaseException | None, list[Any]]] = []
    ref = FeederStoppingWorker.start(crashes, fail_hook=fail_hook)
    gate = _block(ref)
    ref.tell(Crash())
    gate.set()
    ref.actor_stopped.wait(5)  # type: ignore[attr-defined]
    assert ref.actor_stopped.is_set()  # type: ignore[attr-defined]
    [(error, pending)] = crashes
    assert isinstance(error, RuntimeError) and str(error) == "crash on purpose"
    assert Echo("told while crashing") in pending  # collected and reported, never dropped behind the stop
