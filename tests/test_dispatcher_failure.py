"""A failed Dispatcher (an error escaped one of its handlers: a bug) never leaves an ack without an outcome.

The fault is injected at one seam: ``SenderWaker.settling``, which the Dispatcher calls
first when a DM's outcome arrives, raises for the DM whose body is "poison". Before the
fix, the Dispatcher stopped unsupervised and unreported: the gateway still said it was
running, a durable gateway went on acking DMs nothing would run, and the DMs held in
memory never got an outcome.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from roots import RecordingRunner, body_of, make_root, send_dm, start_gateway

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.core import outcomes
from hermes_actors.core.failure import HeldDelivery, failure_text, outcomes_after_failure
from hermes_actors.local.wake_hook import SenderWaker
from hermes_actors.messages import Turn
from hermes_actors.tool import message_agent_tool

WAIT = 10.0


class Poison(RuntimeError):
    pass


class PoisonSeam:
    """Where the Dispatcher fails; ``hold()`` keeps its thread there until ``fail()``."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.go.set()
        self.reached = threading.Event()
        self.crashing = threading.Event()  # set just before the injected error is raised
        self.armed = True
        self.once = False  # fail once per DM (a started-again gateway's recovery settles it without failing)
        self.failed_for: set[str] = set()

    def hold(self) -> None:
        self.go.clear()

    def fail(self) -> None:
        self.go.set()


@pytest.fixture
def poison_outcome(monkeypatch: pytest.MonkeyPatch) -> PoisonSeam:
    """The Dispatcher raises when the outcome of a DM saying "poison" reaches it."""
    seam = PoisonSeam()
    settling = SenderWaker.settling

    def failing(self: SenderWaker, key: str, entry: Any) -> None:
        if (seam.armed and entry is not None and body_of(entry.delivery.content) == "poison"
                and not (seam.once and key in seam.failed_for)):
            seam.failed_for.add(key)
            seam.reached.set()
            assert seam.go.wait(WAIT)
            seam.crashing.set()
            raise Poison("injected")
        settling(self, key, entry)

    monkeypatch.setattr(SenderWaker, "settling", failing)
    return seam


class Held:
    """A runner whose "hold" turns wait until released (so they are running when the Dispatcher fails)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    def __call__(self, turn: Turn) -> str:
        body = body_of(turn.content)
        if body == "hold":
            self.entered.set()
            assert self.release.wait(WAIT)
        return f"ok: {body}"


def failed_gateway(gateways: list[Gateway], root: Path, runner: Any, *, durable: bool) -> tuple[Gateway, list[Any]]:
    failures: list[Any] = []
    gw = start_gateway(gateways, root, RecordingRunner(runner), durable=durable, on_failure=failures.append)
    return gw, failures


def held_in_failure(
    gateways: list[Gateway], tmp_path: Path, seam: PoisonSeam
) -> tuple[Gateway, list[Any], str]:
    """An in-memory gateway whose Dispatcher's thread is held in the handler about to fail; and the poison DM."""
    seam.hold()
    gw, failures = failed_gateway(gateways, make_root(tmp_path), lambda turn: "ok", durable=False)
    poison = send_dm(gw, "poison")
    assert seam.reached.wait(WAIT)
    return gw, failures, poison


@pytest.mark.parametrize("durable", [False, True], ids=["in-memory", "durable"])
def test_a_failed_dispatcher_stops_the_acks_and_reports_the_failure(
    tmp_path: Path, gateways: list[Gateway], poison_outcome: PoisonSeam, durable: bool
) -> None:
    held = Held()
    gw, failures = failed_gateway(gateways, make_root(tmp_path), held, durable=durable)
    seen: list[dict[str, Any]] = []
    gw.subscribe(seen.append)
    running = send_dm(gw, "hold", target="carol")
    assert held.entered.wait(WAIT)
    poison = send_dm(gw, "poison")
    await_condition(lambda: bool(failures), timeout=WAIT, message="on_failure called")
    assert isinstance(failures[0], Poison)
    assert not gw.running
    with pytest.raises(RuntimeError, match="dispatcher failed"):  # nothing acked that nothing would run
        gw.message_agent(sender="alice", target="bob", message="after")
    refusal = orjson.loads(message_agent_tool(gw, sender="alice", target="bob", message="after"))
    assert refusal["reason"] == "runtime_offline" and "dispatcher failed" in refusal["error"], refusal
    if not durable:  # held in memory only: each has its outcome at once, nothing waits for a turn timer
        for key in (running, poison):
            out = gw.wait_outcome(key, timeout=WAIT)
            assert out["status"] == "ambiguous" and "dispatcher failed (Poison: injected)" in out["error"], out
        await_condition(lambda: {o["delivery_id"] for o in seen} >= {running, poison}, timeout=WAIT,
                        message="subscribers got both outcomes")
    held.release.set()
    gw.stop(timeout=WAIT)


def test_a_durable_gateway_started_again_settles_what_the_failed_one_held(
    tmp_path: Path, gateways: list[Gateway], poison_outcome: PoisonSeam
) -> None:
    root = make_root(tmp_path)
    held = Held()
    gw, failures = failed_gateway(gateways, root, held, durable=True)
    running = send_dm(gw, "hold", target="carol")
    assert held.entered.wait(WAIT)
    poison = send_dm(gw, "poison")
    await_condition(lambda: bool(failures), timeout=WAIT, message="on_failure called")
    held.release.set()
    gw.stop(timeout=WAIT)
    poison_outcome.armed = False  # the bug is fixed before the next start
    again = start_gateway(gateways, root, RecordingRunner(lambda turn: f"ok: {body_of(turn.content)}"))
    for key in (running, poison):  # both had started: the journal says they may have run
        assert again.wait_outcome(key, timeout=WAIT)["status"] == "ambiguous"
    out = again.wait_outcome(send_dm(again, "fresh"), timeout=WAIT)
    assert out["status"] == "replied" and out["reply"] == "ok: fresh", out


def test_dms_acked_while_the_dispatcher_fails_get_not_delivered_outcomes(
    tmp_path: Path, gateways: list[Gateway], poison_outcome: PoisonSeam
) -> None:
    """In memory, DMs acked by the senders' threads wait in the failing Dispatcher's mailbox: failed, not lost."""
    gw, failures, poison = held_in_failure(gateways, tmp_path, poison_outcome)
    queued = [send_dm(gw, f"queued {n}", target="carol") for n in range(3)]  # acked: told, not yet taken
    poison_outcome.fail()
    await_condition(lambda: bool(failures), timeout=WAIT, message="on_failure called")
    for key in queued:
        out = gw.wait_outcome(key, timeout=WAIT)
        assert out["status"] == "failed" and out["reason"] == "runtime_offline", out
        assert "NOT delivered" in out["error"], out
    assert gw.wait_outcome(poison, timeout=WAIT)["status"] == "ambiguous"
    gw.stop(timeout=WAIT)


class StoppableRunner:
    """Holds "hold" turns until released, and records which turns ``stop_turns`` was asked to end."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.stopped: list[str] = []

    def run_turn(self, turn: Turn) -> str:
        if body_of(turn.content) == "hold":
            self.entered.set()
            self.release.wait(WAIT)
        return f"ok: {body_of(turn.content)}"

    def stop_turns(self, delivery_ids: Any = None, **_: Any) -> int:
        self.stopped.extend(delivery_ids or ())
        self.release.set()  # as a killed turn process ends its turn
        return len(self.stopped)


@pytest.mark.parametrize("durable", [False, True], ids=["in-memory", "durable"])
def test_stopping_a_failed_gateway_ends_the_turns_it_left_running(
    tmp_path: Path, gateways: list[Gateway], poison_outcome: PoisonSeam, durable: bool
) -> None:
    """The stop asked the dead Dispatcher which turns run, gave up, and left their processes behind."""
    runner = StoppableRunner()
    failures: list[Any] = []
    gw = start_gateway(gateways, make_root(tmp_path), runner, durable=durable, on_failure=failures.append)
    running = send_dm(gw, "hold", target="carol")
    assert runner.entered.wait(WAIT)
    send_dm(gw, "poison")
    await_condition(lambda: bool(failures), timeout=WAIT, message="on_failure called")
    gw.stop(timeout=WAIT)
    assert running in runner.stopped


def test_a_wait_outcome_queued_behind_the_failure_is_answered_at_once(
    tmp_path: Path, gateways: list[Gateway], poison_outcome: PoisonSeam
) -> None:
    gw, _, poison = held_in_failure(gateways, tmp_path, poison_outcome)
    answers: list[dict[str, Any]] = []
    waiter = threading.Thread(target=lambda: answers.append(gw.wait_outcome(poison, timeout=120)))
    waiter.start()
    poison_outcome.fail()
    waiter.join(WAIT)  # it would wait its whole 120 s for an outcome nobody publishes any more
    assert not waiter.is_alive() and answers[0]["status"] == "ambiguous", answers


def test_an_ack_waiting_for_its_journal_commit_when_the_dispatcher_fails_is_answered_and_kept(
    tmp_path: Path, gateways: list[Gateway], poison_outcome: PoisonSeam, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DM the Dispatcher journals itself (from inside a turn, hop 2) waits for its commit: its sender waited
    for the ask's timeout and was told NOT queued, while the next start ran it."""
    import os

    gate, syncing, armed = threading.Event(), threading.Event(), threading.Event()
    real_sync = os.fdatasync

    def fdatasync(fd: int) -> None:
        if armed.is_set():
            syncing.set()
            assert gate.wait(WAIT)
        real_sync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    release, entered = threading.Event(), threading.Event()

    def behave(turn: Turn) -> str:
        if body_of(turn.content) == "poison":
            entered.set()
            assert release.wait(WAIT)
        return "ok"

    root = make_root(tmp_path)
    gw, failures = failed_gateway(gateways, root, behave, durable=True)
    send_dm(gw, "poison")
    assert entered.wait(WAIT)  # its start is on disk: the next commit is the sender's DM
    armed.set()
    answers: list[dict[str, Any]] = []
    sender = threading.Thread(target=lambda: answers.append(
        gw.message_agent(sender="alice", target="carol", message="from inside a turn", hop=2)))
    sender.start()
    assert syncing.wait(WAIT)  # the Dispatcher took the DM and waits for its commit to ack it
    release.set()  # the poison's outcome: the Dispatcher fails
    assert poison_outcome.crashing.wait(WAIT)
    gate.set()
    sender.join(WAIT)
    assert not sender.is_alive() and answers, "the sender got no answer"
    armed.clear()
    await_condition(lambda: bool(failures), timeout=WAIT, message="on_failure called")
    gw.stop(timeout=WAIT)
    poison_outcome.armed = False
    ran: list[str] = []
    again = start_gateway(gateways, root, RecordingRunner(lambda turn: ran.append(body_of(turn.content)) or "ok"))
    if "delivery_id" in answers[0]:  # acked: the next start runs it, once
        assert again.wait_outcome(answers[0]["delivery_id"], timeout=WAIT)["status"] == "replied"
        assert ran.count("from inside a turn") == 1
    else:  # refused: nothing may run it
        assert "NOT queued" in answers[0]["error"], answers
        send_dm(again, "marker")
        await_condition(lambda: "marker" in ran, timeout=WAIT, message="the marker ran")
        assert "from inside a turn" not in ran


# ── serve restarts a failed gateway ─────────────────────────────────────────


def _serve_in_thread(root: Path, on_ready: Any) -> tuple[threading.Thread, threading.Event, list[int]]:
    from hermes_actors.cli.serve import serve

    stop = threading.Event()
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(
        serve(root, connection_id=None, runner=RecordingRunner(lambda turn: f"ok: {body_of(turn.content)}"),
              stop=stop, on_ready=on_ready)))
    thread.start()
    return thread, stop, codes


def test_serve_starts_a_failed_gateway_again_and_the_journaled_dms_are_settled(
    tmp_path: Path, poison_outcome: PoisonSeam, capsys: pytest.CaptureFixture[str]
) -> None:
    from hermes_actors.hermes.host import hosted_gateway

    poison_outcome.once = True
    root = make_root(tmp_path)
    ready: list[Gateway | None] = []
    thread, stop, codes = _serve_in_thread(root, lambda _: ready.append(hosted_gateway(root)))
    try:
        first = await_condition(lambda: ready[0] if ready else None, timeout=WAIT, message="serve ready")
        poison = send_dm(first, "poison")
        second = await_condition(lambda: ready[1] if len(ready) > 1 else None, timeout=WAIT * 3,
                                 message="serve started a new gateway")
        assert second is not first and not first.running
        assert second.wait_outcome(poison, timeout=WAIT)["status"] == "ambiguous"  # it had run: never again
        out = second.wait_outcome(send_dm(second, "fresh"), timeout=WAIT)
        assert out["reply"] == "ok: fresh", out
    finally:
        stop.set()
        thread.join(WAIT * 3)
    assert codes == [0]
    assert "restarting the gateway: its dispatcher failed (Poison('injected'))" in capsys.readouterr().err


def test_serve_gives_up_on_a_gateway_that_keeps_failing(
    tmp_path: Path, poison_outcome: PoisonSeam, capsys: pytest.CaptureFixture[str]
) -> None:
    from hermes_actors.cli.serve import RESTART_POLICY
    from hermes_actors.hermes.host import hosted_gateway

    poison_outcome.once = True
    root = make_root(tmp_path)
    served: list[Gateway] = []

    def on_ready(_: Any) -> None:  # every new gateway is sent a DM that makes it fail
        gw = hosted_gateway(root)
        assert gw is not None
        served.append(gw)
        send_dm(gw, "poison")

    thread, stop, codes = _serve_in_thread(root, on_ready)
    thread.join(WAIT * 6)
    stop.set()
    assert not thread.is_alive() and codes == [1]
    assert len(served) == RESTART_POLICY.max_restarts + 1
    err = capsys.readouterr().err
    assert f"the gateway failed {RESTART_POLICY.max_restarts + 1} times within 60 s" in err, err
    assert "giving up" in err


def test_the_hermes_gateways_shared_host_starts_a_failed_gateway_again(
    tmp_path: Path, poison_outcome: PoisonSeam
) -> None:
    from hermes_actors.hermes.host import acquire_host, hosted_gateway, release_host

    poison_outcome.once = True
    root = make_root(tmp_path)

    def factory(key: Path, on_failure: Any) -> Gateway:
        return Gateway(key, runner=RecordingRunner(lambda turn: f"ok: {body_of(turn.content)}"), serve_submit=True,
                       on_failure=on_failure)

    first = acquire_host(root, factory)
    try:
        assert acquire_host(root, factory) is first  # a second profile's platform shares it
        poison = send_dm(first, "poison")
        second = await_condition(lambda: (gw := hosted_gateway(root)) is not None and gw is not first and gw,
                                 timeout=WAIT * 3, message="the host started a new gateway")
        assert not first.running
        assert second.wait_outcome(poison, timeout=WAIT)["status"] == "ambiguous"
        assert second.wait_outcome(send_dm(second, "fresh"), timeout=WAIT)["reply"] == "ok: fresh"
    finally:
        assert release_host(root, timeout=WAIT) is False  # one platform still holds it
        assert release_host(root, timeout=WAIT) is True
    assert hosted_gateway(root) is None


def test_outcomes_after_failure_table() -> None:
    why = failure_text(Poison("x"))
    assert why == "The gateway's dispatcher failed (Poison: x)."
    assert failure_text(None) == "The gateway's dispatcher failed (an unknown error)."  # no exception to name
    arrived = outcomes.from_reply("r", "@bob", "done")
    held = [
        HeldDelivery("m1", "@bob", "local", journaled=False, started=True),   # may have run
        HeldDelivery("j1", "@bob", "local", journaled=True, started=True),    # the journal settles it
        HeldDelivery("o1", "@dave on Mini", "relay", journaled=False, started=True),  # the relay keeps it
        HeldDelivery("i1", "@bob", "relay-in", journaled=False, started=True),  # handed back by the relay
        HeldDelivery("r", "@bob", "local", journaled=False, started=True),    # its outcome had arrived
        HeldDelivery("q1", "@bob", "local", journaled=False, started=False),  # acked, never taken
        HeldDelivery("q1", "@bob", "local", journaled=False, started=False),  # (once only)
        HeldDelivery("p1", "@x on peer", "peer", journaled=False, started=True),
        HeldDelivery("jq", "@bob", "local", journaled=True, started=False),
    ]
    result = outcomes_after_failure(held, {"r": arrived}, why)
    assert [o.delivery_id for o in result] == ["m1", "r", "q1", "p1"]
    by_id = {o.delivery_id: o.as_dict() for o in result}
    assert by_id["m1"]["status"] == "ambiguous" and why in by_id["m1"]["error"]
    assert by_id["r"] == arrived.as_dict()
    assert by_id["q1"]["status"] == "failed" and by_id["q1"]["reason"] == "runtime_offline"
    assert "NOT delivered" in by_id["q1"]["error"]
    assert by_id["p1"]["status"] == "ambiguous"


def test_a_dm_acked_as_the_dispatcher_fails_is_collected_and_gets_its_outcome(
    tmp_path: Path, gateways: list[Gateway], poison_outcome: PoisonSeam, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sender past its check when the Dispatcher failed told its DM after the stop: acked, then never settled."""
    from hermes_actors.local.admission import CallerAdmission

    past_check, go_on = threading.Event(), threading.Event()
    plan_local = CallerAdmission.plan_local

    def held_plan(self: CallerAdmission, request: Any) -> Any:
        if request.message == "late":
            past_check.set()
            assert go_on.wait(WAIT)
        return plan_local(self, request)

    monkeypatch.setattr(CallerAdmission, "plan_local", held_plan)
    gw, failures = failed_gateway(gateways, make_root(tmp_path), lambda turn: "ok", durable=False)
    answers: list[dict[str, Any]] = []
    sender = threading.Thread(target=lambda: answers.append(
        gw.message_agent(sender="alice", target="carol", message="late")))
    sender.start()
    assert past_check.wait(WAIT)
    send_dm(gw, "poison")
    await_condition(lambda: not gw.running, timeout=WAIT, message="the gateway stopped acking")
    go_on.set()  # the sender, past its check, now hands its DM over
    sender.join(WAIT)
    assert answers and answers[0]["status"] == "queued", answers
    await_condition(lambda: bool(failures), timeout=WAIT, message="on_failure called")
    out = gw.wait_outcome(answers[0]["delivery_id"], timeout=WAIT)
    assert out["status"] == "failed" and "NOT delivered" in out["error"], out
