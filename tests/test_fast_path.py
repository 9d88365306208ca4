"""The DM fast path: caller-side admission, inline turns, the re-armed wait timer, batched notifications.

- A first-hop local DM is admitted on the sender's thread and told to the Dispatcher
  (``AcceptLocal``); one that arrives after the Dispatcher stopped accepting still gets
  an outcome (in memory it was acked already) or, durable, stays journaled and the next
  start runs it. A durable one is on disk before its ack, committed by the sender's thread.
- A runner that declared ``blocking=False`` runs its turns on the ProfileActor's thread,
  unless another process holds the profile's flock: then the turn waits on a worker.
- One re-armed timer per profile expires every queued DM whose wait ran out.
- Outcomes reach subscribers in batches, every one exactly once, in order.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykka
import pytest
from roots import CRASHING_REPLY, LogCapture, crash_on_reply, send_dm, start_gateway

from actors import Link, Scheduler, SupervisorActor, WorkerPool, ask, await_condition, handles
from hermes_actors import CallableRunner, Gateway
from hermes_actors.core.acks import accepted_record, ack_payload
from hermes_actors.core.config import load_config
from hermes_actors.core.ids import new_delivery_id
from hermes_actors.local.profile_actor import ProfileActor
from hermes_actors.local.profile_deps import ProfileDeps
from hermes_actors.local.runners import runs_inline
from hermes_actors.local.turns import turn_for
from hermes_actors.messages import (
    AcceptLocal,
    Deliver,
    Delivery,
    Outcome,
    OutcomeReady,
    OutcomesReady,
    ProfileInfo,
    SendRequest,
    StatsRequest,
    StopAccepting,
    Turn,
)
from hermes_actors.store.turnlock import TurnLock, turn_lock_path


class ThreadRecorder:
    """A runner that records the name of the thread each turn ran on."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def __call__(self, turn: Turn) -> str:
        self.threads.append(threading.current_thread().name)
        return f"ok {turn.delivery_id}"


@pytest.mark.parametrize(
    ("runner", "expected"),
    [
        (CallableRunner(lambda turn: "x", blocking=False), True),
        (CallableRunner(lambda turn: "x"), False),
        (lambda turn: "x", False),
        (type("Obj", (), {"blocking": False, "run_turn": lambda self, turn: "x"})(), True),
        (type("Obj", (), {"blocking": 0, "run_turn": lambda self, turn: "x"})(), False),  # only False counts
        (type("Obj", (), {"run_turn": lambda self, turn: "x"})(), False),
    ],
)
def test_runs_inline_only_for_an_explicit_blocking_false(runner: Any, expected: bool) -> None:
    assert runs_inline(runner) is expected


def test_callable_runner_refuses_a_blocking_flag_that_is_not_a_bool() -> None:
    with pytest.raises(TypeError, match="blocking must be True or False"):
        CallableRunner(lambda turn: "x", blocking="no")  # type: ignore[arg-type]


@pytest.mark.parametrize("blocking", [False, True])
def test_a_non_blocking_runner_runs_its_turns_on_the_profile_actor(
    blocking: bool, root: Path, gateways: list[Gateway]
) -> None:
    recorder = ThreadRecorder()
    gw = start_gateway(gateways, root, CallableRunner(recorder, blocking=blocking), durable=False)
    ids = [send_dm(gw, f"dm {i}", target="bob") for i in range(5)]
    assert [gw.wait_outcome(i, timeout=30)["status"] for i in ids] == ["replied"] * 5
    on_actor = [name.startswith("ProfileActor") for name in recorder.threads]
    assert on_actor == [not blocking] * 5, recorder.threads
    if not blocking:
        assert gw.stats()["worker_threads"] == 0  # no turn ever needed a worker


def test_an_inline_turn_waits_on_a_worker_while_another_process_holds_the_flock(
    root: Path, gateways: list[Gateway]
) -> None:
    released = threading.Event()
    ran: list[tuple[str, bool]] = []

    def runner(turn: Turn) -> str:
        ran.append((threading.current_thread().name, released.is_set()))
        return "ok"

    gw = start_gateway(gateways, root, CallableRunner(runner, blocking=False), durable=False,
                       config={"bot_mode": {"turn_wait_seconds": 60}})
    path = turn_lock_path(root, "bob")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # its own open file description: as another process
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with LogCapture(level="INFO") as logs:
            key = send_dm(gw, "wait for the lock", target="bob")
            # the turn found the flock taken and waits for it: only now is "released before it ran" a test
            await_condition(lambda: logs.matching("waiting for the lock"), timeout=30,
                            message="the turn waiting for the flock")
        released.set()
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    assert gw.wait_outcome(key, timeout=30)["status"] == "replied"
    assert len(ran) == 1
    thread, after_release = ran[0]
    assert after_release, "the turn ran while another holder had the profile's flock"
    assert not thread.startswith("ProfileActor"), "a turn that must wait for the flock waits on a worker"


class OutcomeSink(pykka.ThreadingActor):
    """Stands in for the Dispatcher: collects the outcomes a ProfileActor reports."""

    def __init__(self) -> None:
        super().__init__()
        self.outcomes: list[Outcome] = []
        self.all_in = threading.Event()
        self.expected = 0

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, OutcomeReady):
            self.outcomes.append(message.outcome)
        elif isinstance(message, OutcomesReady):
            self.outcomes.extend(message.outcomes)
        if len(self.outcomes) >= self.expected:
            self.all_in.set()
        return None


@dataclass(frozen=True)
class StartBob:
    """Ask the :class:`BobSupervisor` to start bob's ProfileActor (its child)."""


class BobSupervisor(SupervisorActor):
    """Restarts bob's crashed ProfileActor from its salvage, as the Dispatcher does."""

    def __init__(self, factory: Callable[[Link, Any], pykka.ActorRef[Any]]) -> None:
        super().__init__()
        self.factory = factory

    @handles(StartBob)
    def _on_start_bob(self, msg: StartBob) -> pykka.ActorRef[Any]:
        return self.start_child("bob", self.factory)

    def on_stop(self) -> None:
        for name in list(self.children):  # the restarted instances too: no actor thread outlives the test
            ref = self.child_ref(name)
            if ref is not None:
                ref.stop()


@contextlib.contextmanager
def bob_alone(
    root: Path, runner: Any, *, blocking: bool, supervised: bool = False
) -> Iterator[tuple[pykka.ActorRef[Any], pykka.ActorRef[Any]]]:
    """A real ProfileActor for bob, with an :class:`OutcomeSink` as its Dispatcher; (profile, sink).

    ``runner``: a callable (wrapped in a ``CallableRunner`` with ``blocking``), or a runner object.
    ``supervised``: started by a :class:`BobSupervisor`, which restarts it when it crashes.
    """
    scheduler = Scheduler().start()
    pool = WorkerPool(1, name="turn")
    sink = OutcomeSink.start()
    profile = supervisor = None
    info = ProfileInfo("bob", "bob", root / "profiles" / "bob", "Bob")
    try:
        deps = ProfileDeps(
            root=root, config=load_config(root), pool=pool,
            runner=runner if hasattr(runner, "run_turn") else CallableRunner(runner, blocking=blocking),
            scheduler=scheduler, dispatcher=sink, make_turn=lambda d, fd=None: turn_for(
                d, home=root, root=root, send=lambda target, message: {}, lock_fd=fd),
        )
        if supervised:
            supervisor = BobSupervisor.start(
                lambda link, salvage: ProfileActor.start(info, deps, link=link, salvage=salvage))
            profile = ask(supervisor, StartBob(), timeout=5)
        else:
            profile = ProfileActor.start(info, deps)
        yield profile, sink
    finally:
        if supervisor is not None:
            supervisor.stop()
        if profile is not None:
            profile.stop()
        sink.stop()
        pool.shutdown()
        scheduler.stop()


def test_a_burst_of_inline_turns_holds_the_flock_once_across_them(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken: list[bool] = []
    original = TurnLock.try_acquire

    def counting_try_acquire(self: TurnLock) -> bool:
        got = original(self)
        taken.append(got)
        return got

    monkeypatch.setattr(TurnLock, "try_acquire", counting_try_acquire)
    path = turn_lock_path(root, "bob")
    probe: list[bool] = []

    def runner(turn: Turn) -> str:
        # Another open file description (as another process would have) cannot take the flock now.
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            probe.append(False)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            probe.append(True)
        finally:
            os.close(fd)
        return f"ok {turn.delivery_id}"

    with bob_alone(root, runner, blocking=False) as (profile, sink):
        burst = tuple(Delivery(new_delivery_id(), "alice", "alice", "bob", "bob", f"dm {i}", label="@bob")
                      for i in range(4))
        sink.proxy().expected = len(burst)
        profile.tell(Deliver(burst))
        assert sink.proxy().all_in.get().wait(30), "the burst's outcomes never arrived"
        outcomes = sink.proxy().outcomes.get()
    assert [o.status for o in outcomes] == ["replied"] * 4
    assert [o.delivery_id for o in outcomes] == [d.delivery_id for d in burst], "in order"
    assert probe == [True] * 4, "every turn of the burst ran under the profile's flock"
    assert taken == [True], "one flock acquisition for the whole burst"
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if the burst left the flock held
    finally:
        os.close(fd)


def test_a_profile_never_queues_a_second_copy_of_a_delivery_it_holds(root: Path) -> None:
    gate = threading.Event()
    ran: list[str] = []

    def runner(turn: Turn) -> str:
        ran.append(turn.delivery_id)
        assert gate.wait(60), "the test never let the turn finish"
        return "ok"

    with bob_alone(root, runner, blocking=True) as (profile, sink):
        first, second = (Delivery(new_delivery_id(), "alice", "alice", "bob", "bob", f"dm {i}", label="@bob")
                         for i in range(2))
        sink.proxy().expected = 2
        try:
            profile.tell(Deliver((first, first, second)))  # a copy of one already queued
            await_condition(lambda: ran == [first.delivery_id], timeout=30, message="the first turn never started")
            profile.tell(Deliver((first, second)))  # copies of the running one and of the queued one
        finally:
            gate.set()
        assert sink.proxy().all_in.get().wait(30), "the outcomes never arrived"
        # Read through the profile's mailbox, so after the handler that settled the second outcome:
        # a copy accepted by mistake would be running (or queued) by then.
        assert profile.proxy().running.get(timeout=30) is None
        assert not profile.proxy().queue.get(timeout=30)
        outcomes = sink.proxy().outcomes.get()
    assert ran == [first.delivery_id, second.delivery_id], "each delivery ran once"
    assert [o.delivery_id for o in outcomes] == [first.delivery_id, second.delivery_id]


def test_a_dm_admitted_by_its_sender_after_the_dispatcher_stopped_accepting_still_ends(
    root: Path, gateways: list[Gateway]
) -> None:
    gw = start_gateway(gateways, root, ThreadRecorder(), durable=False)
    system = gw._system
    assert system is not None and system.dispatcher is not None and system.caller_admission is not None
    planned = system.caller_admission.plan_local(SendRequest("alice", "bob", "late"))
    assert planned is not None
    route, delivery = planned
    ask(system.dispatcher, StopAccepting(), timeout=10)  # stop began between the running check and the tell
    ack = ack_payload(delivery.delivery_id, route.label, now=delivery.accepted_at)
    system.dispatcher.tell(AcceptLocal(route.target, delivery, ack))
    outcome = gw.wait_outcome(delivery.delivery_id, timeout=30)
    assert (outcome["status"], outcome["reason"]) == ("failed", "cancelled"), outcome
    assert "NOT delivered" in outcome["error"]


def test_a_journaled_dm_that_reaches_a_stopping_dispatcher_is_run_by_the_next_start(
    root: Path, gateways: list[Gateway]
) -> None:
    first = ThreadRecorder()
    gw = start_gateway(gateways, root, first, durable=True)
    system = gw._system
    assert system is not None and system.dispatcher is not None and system.caller_admission is not None
    assert system.journal is not None
    planned = system.caller_admission.plan_local(SendRequest("alice", "bob", "late"))
    assert planned is not None
    route, delivery = planned
    # What the sender's thread does in durable mode: the acceptance is on disk, then the tell.
    system.journal.append_durably(accepted_record(delivery))
    ask(system.dispatcher, StopAccepting(), timeout=10)  # stop began between the journal write and the tell
    ack = ack_payload(delivery.delivery_id, route.label, now=delivery.accepted_at)
    system.dispatcher.tell(AcceptLocal(route.target, delivery, ack, journaled=True))
    assert ask(system.dispatcher, StatsRequest(), timeout=10)["pending"] == 0, "not run by the stopping gateway"
    gw.stop()
    assert first.threads == []

    second = ThreadRecorder()
    again = start_gateway(gateways, root, second, durable=True)
    outcome = again.wait_outcome(delivery.delivery_id, timeout=30)
    assert outcome["status"] == "replied" and outcome["reply"] == f"ok {delivery.delivery_id}", outcome
    assert len(second.threads) == 1, "the acked DM ran once, after the restart"


def test_a_durable_dm_is_on_disk_before_its_ack_and_the_sender_commits_it_itself(
    root: Path, gateways: list[Gateway]
) -> None:
    gw = start_gateway(gateways, root, ThreadRecorder(), durable=True)
    system = gw._system
    assert system is not None and system.journal is not None
    seen: list[tuple[str, bool]] = []
    real_write_now = system.journal._write_now

    def write_now(lines: list[bytes], *, flush: bool = True) -> None:
        seen.append((threading.current_thread().name, any(b'"accepted"' in line for line in lines)))
        real_write_now(lines, flush=flush)

    system.journal._write_now = write_now  # type: ignore[method-assign]
    acks: list[dict[str, Any]] = []
    sender = threading.Thread(target=lambda: acks.append(gw.message_agent(sender="alice", target="bob",
                                                                          message="hello")), name="sender")
    sender.start()
    sender.join(timeout=30)
    (ack,) = acks
    assert ack["status"] == "queued", ack
    # The ack came back only after the acceptance was written, and the sender's own thread wrote it:
    # with no commit running, the caller leads its group commit instead of waiting for the writer.
    assert ("sender", True) in seen, seen
    assert gw.wait_outcome(ack["delivery_id"], timeout=30)["status"] == "replied"
    # The main thread never commits (a signal handler's exception there would land inside the commit): its
    # call runs on the gateway's call thread, which commits its acceptance, before its ack all the same.
    seen.clear()
    ack = gw.message_agent(sender="alice", target="bob", message="from main")
    assert ("gateway-calls", True) in seen, seen
    assert gw.wait_outcome(ack["delivery_id"], timeout=30)["status"] == "replied"


def test_the_sender_side_admission_sees_the_roster_the_dispatcher_has(root: Path, gateways: list[Gateway]) -> None:
    gw = start_gateway(gateways, root, ThreadRecorder(), durable=False)
    system = gw._system
    assert system is not None and system.caller_admission is not None
    assert system.caller_admission.plan_local(SendRequest("alice", "nobody-yet", "hi")) is None
    refused = gw.message_agent(sender="alice", target="nobody-yet", message="hi")
    assert "error" in refused and gw.stats()["refused"] == 1  # refusals are counted by the Dispatcher
    # DMs from inside turns (hop >= 2) are never admitted on the sender's thread: the pair rate needs history.
    assert system.caller_admission.plan_local(SendRequest("alice", "bob", "deep", hop=2)) is None


def test_every_queued_dm_expires_and_the_timer_is_armed_again_for_later_ones(
    root: Path, gateways: list[Gateway]
) -> None:
    gate = threading.Event()
    started = threading.Event()

    def runner(turn: Turn) -> str:
        if "hold" in turn.content:
            started.set()
            assert gate.wait(60)
        return "ok"

    gw = start_gateway(gateways, root, runner, durable=False,
                       config={"bot_mode": {"turn_wait_seconds": 1, "turn_timeout_seconds": 120}})
    try:
        holder = send_dm(gw, "hold the turn", target="bob")
        assert started.wait(30)
        for _batch in range(2):  # the second batch arrives after the timer fired and was cleared
            queued = [send_dm(gw, f"queued {i}", target="bob") for i in range(5)]
            outcomes = [gw.wait_outcome(key, timeout=30) for key in queued]
            assert [(o["status"], o["reason"]) for o in outcomes] == [("failed", "target_busy")] * 5
    finally:
        gate.set()
    assert gw.wait_outcome(holder, timeout=30)["status"] == "replied"


def test_subscribers_get_every_outcome_once_in_order_with_details_when_asked(
    root: Path, gateways: list[Gateway]
) -> None:
    gw = start_gateway(gateways, root, CallableRunner(lambda turn: "ok", blocking=False), durable=False,
                       config={"bot_mode": {"max_queued": 1000}})  # a burst of 400: none refused queue-full
    plain: list[dict[str, Any]] = []
    detailed: list[dict[str, Any]] = []
    gw.subscribe(plain.append)
    gw.subscribe(detailed.append, details=True)
    senders = [threading.Thread(target=lambda k=k: [send_dm(gw, f"{k}-{i}", target="bob", sender="alice")
                                                     for i in range(100)]) for k in range(4)]
    for thread in senders:
        thread.start()
    for thread in senders:
        thread.join()
    await_condition(lambda: len(plain) >= 400 and len(detailed) >= 400, timeout=60,
                    message="400 outcomes at both subscribers")
    gw.stop()
    assert len(plain) == len(detailed) == 400
    assert len({o["delivery_id"] for o in plain}) == 400
    assert [o["delivery_id"] for o in plain] == [o["delivery_id"] for o in detailed]  # one order for all
    assert all("sender" not in o for o in plain)
    assert all(o["sender"] == "alice" and o["target"] == "bob" and o["latency_seconds"] >= 0 for o in detailed)


def test_a_burst_to_one_profile_runs_in_the_order_it_was_sent(root: Path, gateways: list[Gateway]) -> None:
    """Deliveries are handed to a ProfileActor in batches: a batch never reorders them."""
    order: list[str] = []
    gw = start_gateway(gateways, root, CallableRunner(lambda turn: order.append(turn.delivery_id) or "ok",
                                                      blocking=False), durable=False,
                       config={"bot_mode": {"max_queued": 1000}})
    ids = [send_dm(gw, f"burst {i}", target="bob") for i in range(300)]
    assert [gw.wait_outcome(key, timeout=30)["status"] for key in ids] == ["replied"] * 300
    assert order == ids


def test_a_crash_while_running_a_salvaged_queue_is_salvaged_again(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the restarted ProfileActor ran its salvaged queue in ``on_start``, where a second crash
    stopped it with no salvage and no restart: every DM behind it waited for ever."""
    crash_on_reply(monkeypatch)
    seen: list[str] = []

    def poison(turn: Turn) -> str:
        seen.append(turn.content)
        return CRASHING_REPLY if turn.content.startswith("poison") else f"got {turn.content}"

    with bob_alone(root, poison, blocking=False, supervised=True) as (profile, sink):
        burst = tuple(Delivery(new_delivery_id(), "alice", "alice", "bob", "bob", text, label="@bob")
                      for text in ("poison 1", "poison 2", "after"))
        sink.proxy().expected = len(burst)
        profile.tell(Deliver(burst))  # one Deliver: the two DMs behind the first crash are its salvage
        assert sink.proxy().all_in.get().wait(30), "a DM behind the crashes never got its outcome"
        outcomes = {o.delivery_id: o for o in sink.proxy().outcomes.get(timeout=5)}
    assert [outcomes[d.delivery_id].status for d in burst] == ["ambiguous", "ambiguous", "replied"]
    assert seen == ["poison 1", "poison 2", "after"]  # each ran once, in order


def _per_dm_functions() -> list[Any]:
    from hermes_actors.local import asking_turn, delivery_stats, outcome_book, sending, turns

    return [Gateway.message_agent, sending.send_dm, turns._execute_turn, asking_turn.asking_turn,
            delivery_stats.log_settled, outcome_book.OutcomeBook.settle]


@pytest.mark.parametrize("function", _per_dm_functions(), ids=lambda function: function.__qualname__)
def test_a_function_every_dm_passes_makes_no_cells_per_call(function: Any) -> None:
    # Each of these runs once per DM (the sender's call, its turn, its outcome). A closure built in one of them,
    # even on a path a DM rarely takes (the main thread's call, durable mode's callbacks), gave every DM cells
    # for what it closes over; those callables are partials or built in helpers now (bench/limits.md).
    assert function.__code__.co_cellvars == ()
