"""Recovery that knows about live owners, and owners attached before start()."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pykka
import pytest
from roots import make_root

from hermes_actors import Gateway
from hermes_actors.core.acks import delivery_record
from hermes_actors.core.ids import new_delivery_id
from hermes_actors.core.recovery import TurnPlace, plan_recovery, running_at_stop_text, stopped_mid_turn_text
from hermes_actors.facade.options import ASK_TIMEOUT
from hermes_actors.local.live_handoff import LiveMailbox
from hermes_actors.messages import Delivery
from hermes_actors.store.journal_records import DeliveryState, fold_records
from hermes_actors.store.journal_state import JournalState


def _delivery(target: str = "bob") -> Delivery:
    return Delivery(new_delivery_id(), "alice", "alice", target, target, "Message from 🤖 alice (@alice): hi",
                    label=f"@{target}")


def _judged(plan: Any) -> dict[str, list[str]]:
    return {
        "ambiguous": [o.status for _, o in plan.ambiguous],
        "reoffer": ["reoffer" for _ in plan.reoffer],
        "replied": [o.status for o in plan.redeliver if o.status == "replied"],
        "failed": [o.status for o in plan.redeliver if o.status == "failed"],
    }


@pytest.mark.parametrize(
    ("live", "expected"),
    [
        (None, "ambiguous"),
        ({"status": "claimed"}, "ambiguous"),
        ({"status": "ambiguous"}, "ambiguous"),
        # the journal says the owner was called: a record set back to queued (by another writer of our uid) is
        # not believed; before, it was re-offered and the owner ran the DM twice
        ({"status": "queued"}, "ambiguous"),
        ({"status": "settled", "reply": "done in the window"}, "replied"),
        ({"status": "failed", "error": "429 rate limit", "reason": "provider_rate_limit"}, "failed"),
    ],
)
@pytest.mark.parametrize("idempotent_runner", [False, True])
def test_a_started_handoff_is_judged_by_its_live_mailbox_record_and_never_reoffered(
    live: dict[str, Any] | None, expected: str, idempotent_runner: bool
) -> None:
    delivery = _delivery()
    states = {delivery.delivery_id: DeliveryState(delivery_record(delivery), started=1, live=True)}
    plan = plan_recovery(states, idempotent_runner=idempotent_runner, live_record=lambda d: live)
    kinds = _judged(plan)
    assert kinds[expected] == [expected]
    assert sum(len(v) for v in kinds.values()) == 1
    if expected == "replied":
        assert plan.redeliver[0].reply == "done in the window"
    if expected == "failed":
        assert plan.redeliver[0].reason == "provider_rate_limit"


@pytest.mark.parametrize("status", ["queued", "claimed", "settled", "failed", "cancelled"])
def test_a_started_turn_not_handed_to_an_owner_never_asks_the_live_mailbox(status: str) -> None:
    """Regression (hostile files): a runner's turn killed mid-turn, with a ``queued`` record planted in the profile's
    mailbox, was re-offered and the runner ran it twice. A started record without ``live`` (a runner's turn, or a
    journal written before handoffs said so) is judged as a runner's turn, whatever the mailbox holds."""
    delivery = _delivery()
    states = {delivery.delivery_id: DeliveryState(delivery_record(delivery), started=1)}
    asked: list[str] = []

    def planted(d: Delivery) -> dict[str, Any]:
        asked.append(d.delivery_id)
        return {"status": status, "reply": "forged"}

    assert _judged(plan_recovery(states, live_record=planted))["ambiguous"] == ["ambiguous"]
    assert _judged(plan_recovery(states, idempotent_runner=True, live_record=planted))["reoffer"] == ["reoffer"]
    assert asked == []


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ({}, "reoffer"),  # acked, never started: run it now, marked as a re-offer
        ({"started": 1}, "ambiguous"),  # may have run: never twice
        ({"outcome": {"status": "replied", "reply": "hi"}}, "redeliver"),  # finished, sender maybe not told
        ({"outcome": {"status": "replied", "reply": "hi"}, "delivered": True}, "known"),  # told: remembered only
        ({"started": 1, "delivered": True}, "none"),  # delivered without a journaled outcome: nothing to do
        ({"delivery": None}, "none"),  # a torn record without its acceptance: nothing was acked
    ],
)
def test_the_plan_gives_each_journaled_delivery_one_fate(state: dict[str, Any], expected: str) -> None:
    delivery = _delivery()
    key = delivery.delivery_id
    plan = plan_recovery({key: DeliveryState(**{"delivery": delivery_record(delivery), **state})})
    fates = {
        "reoffer": [d.delivery_id for d in plan.reoffer],
        "ambiguous": [d.delivery_id for d, _ in plan.ambiguous],
        "redeliver": [o.delivery_id for o in plan.redeliver],
        "known": list(plan.known),
    }
    assert fates == {fate: [key] if fate == expected else [] for fate in fates}, fates
    if expected == "reoffer":
        assert plan.reoffer[0].origin == "recovered"  # a wake would stay a wake (test_wake.py)


@pytest.mark.parametrize(
    "state",
    [
        {},  # acked and handed to the transport: no record says whether it sent it
        {"started": 1},
        {"started": 1, "live": True},  # a planted live mark never makes the mailbox judge it
    ],
)
@pytest.mark.parametrize("idempotent_runner", [False, True])
def test_a_peer_dm_without_an_outcome_is_ambiguous_never_reoffered(
    state: dict[str, Any], idempotent_runner: bool
) -> None:
    """Regression (acklost ``peerkill.py``): a ``bot_peers`` DM is journaled (origin ``peer``, no local target)
    before its ack; the next start settles one without an outcome ``ambiguous``, as a clean stop does, and never
    re-offers it: re-offered it would run here, on no profile (or be sent to the peer a second time: the
    transport does not dedupe by delivery id)."""
    delivery = replace(_delivery(), target="", target_handle="", origin="peer", label="@bob on peer 'mini'")
    key = delivery.delivery_id
    asked: list[str] = []
    plan = plan_recovery({key: DeliveryState(**{"delivery": delivery_record(delivery), **state})},
                         idempotent_runner=idempotent_runner, live_record=lambda d: asked.append(key) or None)
    assert _judged(plan) == {"ambiguous": ["ambiguous"], "reoffer": [], "replied": [], "failed": []}
    ((_, outcome),) = plan.ambiguous
    assert outcome.error.startswith("The gateway stopped or crashed while the peer transport was delivering it.")
    assert asked == []


@pytest.mark.parametrize(
    ("relay_resumed", "state", "expected"),
    [
        (True, {}, "ambiguous"),  # the relay read Redis and did not resume it: Redis lost it
        (True, {"started": 1, "live": True}, "ambiguous"),  # a planted mark never makes the mailbox judge it
        (False, {}, "relayed"),  # Redis unreachable at the start: decided once the relay reads it
    ],
)
@pytest.mark.parametrize("idempotent_runner", [False, True])
def test_a_redis_dm_without_an_outcome_is_ambiguous_once_the_relay_lacks_it_never_reoffered(
    relay_resumed: bool, state: dict[str, Any], expected: str, idempotent_runner: bool
) -> None:
    """Regression (roomsrev ``wipe.py``): a DM sent over Redis is journaled (origin ``redis``) before its ack; one
    the relay did not resume (Redis lost it) is settled ``ambiguous`` (reason ``delivery_timeout``: its target may
    have run it), never re-offered (it would run here, on no profile) nor sent again."""
    delivery = replace(_delivery(), origin="redis", label="@bob on mini")
    key = delivery.delivery_id
    asked: list[str] = []
    plan = plan_recovery({key: DeliveryState(**{"delivery": delivery_record(delivery), **state})},
                         idempotent_runner=idempotent_runner, live_record=lambda d: asked.append(key) or None,
                         relay_resumed=relay_resumed)
    if expected == "relayed":
        assert (_judged(plan), plan.relayed) == ({"ambiguous": [], "reoffer": [], "replied": [], "failed": []},
                                                 [delivery])
    else:
        assert (_judged(plan), plan.relayed) == ({"ambiguous": ["ambiguous"], "reoffer": [], "replied": [],
                                                  "failed": []}, [])
        ((_, outcome),) = plan.ambiguous
        assert (outcome.reason, outcome.retryable) == ("delivery_timeout", False)
        assert outcome.error.startswith("The gateway restarted and Redis no longer holds this DM's envelope")
    assert asked == []


@pytest.mark.parametrize(("runs_apart", "why"), [
    (None, "The gateway stopped or crashed during the turn."),  # a runner without the hook
    (False, "The gateway stopped or crashed during the turn."),  # the host was the hermes gateway itself
    # a host apart from the hermes gateway killed mid warm turn: the hermes gateway ran on and may have answered
    # (review: the text said "the gateway stopped", read as hermes' own; then it named serve, though the host may
    # be `send` or a Python program's Gateway, which a start cannot tell apart)
    (True, "The gateway (hermes-actors serve, or the process embedding it) stopped or crashed during the turn, "
           "which the hermes gateway ran in its own process: hermes may still have answered it."),
])
def test_a_turn_the_previous_host_lost_says_what_stopped(runs_apart: bool | None, why: str) -> None:
    delivery = _delivery()
    states = {delivery.delivery_id: DeliveryState(delivery_record(delivery), started=1)}
    plan = plan_recovery(states, runs_apart=None if runs_apart is None else lambda d: runs_apart)
    ((_, outcome),) = plan.ambiguous
    assert why == stopped_mid_turn_text(bool(runs_apart))
    assert (outcome.status, outcome.error) == ("ambiguous", f"{why} The message may have been delivered — do not "
                                                            "resend."), outcome


def test_a_serve_host_restarted_after_a_warm_turn_it_lost_says_hermes_may_have_answered(tmp_path: Path) -> None:
    """The runner's ``runs_apart`` hook (a warm runner on a ``serve`` host) words the recovered outcome."""

    class Warm:
        def run_turn(self, turn: Any) -> str:
            raise AssertionError("a started turn never runs again")

        def runs_apart(self, turn: Any) -> bool:
            return turn.profile == "bob"

    root = make_root(tmp_path)
    delivery = _delivery("bob")
    _dead_journal(root, [{"t": "accepted", "id": delivery.delivery_id, "d": delivery_record(delivery)},
                         {"t": "started", "id": delivery.delivery_id, "attempt": 1}])
    with Gateway(root, runner=Warm()) as gw:
        assert gw.recovered["ambiguous"] == 1
        outcome = gw.wait_outcome(delivery.delivery_id, timeout=10)
    assert outcome["status"] == "ambiguous"
    assert outcome["error"].startswith(stopped_mid_turn_text(True)), outcome


class _HeldTurn:
    """A runner whose turn runs until released; ``place`` says which of the stop's hooks lists it as running."""

    def __init__(self, place: TurnPlace) -> None:
        self.place = place
        self.entered, self.release = threading.Event(), threading.Event()
        self.running: list[str] = []

    def run_turn(self, turn: Any) -> str:
        self.running.append(turn.delivery_id)
        self.entered.set()
        assert self.release.wait(30), "the test never released the turn"
        return "too late"

    def running_turns(self) -> list[str]:  # a turn process of ours, which the stop ends (stop_turns)
        return list(self.running) if self.place == "process" else []

    def warm_turns(self) -> list[str]:  # in a hermes gateway apart from this host, which goes on with it
        return list(self.running) if self.place == "apart" else []

    def stop_turns(self, delivery_ids: Any = None) -> int:
        self.release.set()
        return 1


@pytest.mark.parametrize(("place", "why"), [
    ("here", "The turn was still running when the gateway stopped."),  # a Python runner: as before
    ("process", "The turn was still running when the gateway stopped and was stopped with it; it may have been "
                "partly done."),
    # review: a warm turn the stop of serve cut off said only "the gateway stopped", though hermes' gateway did not
    # stop and went on to answer; a kill -9 of serve got the right words at the next start
    # (and not "hermes-actors serve stopped": this host is a Python program's Gateway)
    ("apart", "The gateway (hermes-actors serve, or the process embedding it) stopped or crashed during the turn, "
              "which the hermes gateway ran in its own process: hermes may still have answered it."),
])
def test_a_turn_still_running_at_a_stop_says_what_became_of_it(tmp_path: Path, place: TurnPlace, why: str) -> None:
    runner = _HeldTurn(place)
    gw = Gateway(make_root(tmp_path), runner=runner).start()
    try:
        ack = gw.message_agent(sender="alice", target="bob", message="hi")
        assert runner.entered.wait(20)
        gw.stop(timeout=0.1)  # the turn is held until released: the stop's wait runs out
        outcome = gw.wait_outcome(ack["delivery_id"], timeout=0)
    finally:
        runner.release.set()
    assert why == running_at_stop_text(place)
    assert (outcome["status"], outcome["error"]) == ("ambiguous", f"{why} The message may have been delivered — "
                                                                   "do not resend."), outcome
    if place == "apart":  # the one text a stop and a kill -9 of serve give a warm turn
        assert why == stopped_mid_turn_text(True)


class _TwoTurns:
    """bob's turn runs in a turn process of ours (``running_turns`` lists it, ``stop_turns`` ends it), carol's in
    this process; ``warm_turns`` hangs until the test ends, or raises. Counts the calls of each place hook."""

    def __init__(self, warm: str) -> None:
        self.warm = warm
        self.entered = {"bob": threading.Event(), "carol": threading.Event()}
        self.release: dict[str, threading.Event] = {}
        self.by_profile: dict[str, str] = {}
        self.calls = {"running_turns": 0, "warm_turns": 0}
        self.stopped: list[list[str] | None] = []
        self.unhang = threading.Event()

    def run_turn(self, turn: Any) -> str:
        self.release[turn.delivery_id] = threading.Event()
        self.by_profile[turn.profile] = turn.delivery_id
        self.entered[turn.profile].set()
        assert self.release[turn.delivery_id].wait(60), "the test never released the turn"
        return "too late"

    def running_turns(self) -> list[str]:
        self.calls["running_turns"] += 1
        return [self.by_profile["bob"]]

    def warm_turns(self) -> list[str]:
        self.calls["warm_turns"] += 1
        if self.warm == "raises":
            raise KeyboardInterrupt  # runner code: even a BaseException only costs the wording
        assert self.unhang.wait(120), "the test never let warm_turns return"
        return []

    def stop_turns(self, delivery_ids: Any = None) -> int:
        self.stopped.append(None if delivery_ids is None else list(delivery_ids))
        for event in self.release.values():
            event.set()
        return 1


@pytest.mark.parametrize("warm", ["hangs", "raises"])
def test_a_place_hook_that_hangs_or_raises_never_holds_the_stop_nor_keeps_it_from_ending_the_turns(
    tmp_path: Path, warm: str, logs: Any,
) -> None:
    """Regression (review of the stop's wording, hang_hook2.py): the Dispatcher called the runner's
    ``running_turns()``/``warm_turns()`` inside FinalizePending, once per running turn: a ``warm_turns`` that hung
    made the stop take 40 s ("gateway stop was not clean: DispatcherActor did not answer FinalizePending within
    30s"), ``stop_turns`` was never called (bob's turn process left running) and bob was told it "was stopped with
    it". Now the stopping thread asks each hook once, for a second at most: the stop is clean, ends the turn
    processes, and words each outcome by what the hooks answered (carol's neutrally)."""
    runner = _TwoTurns(warm)
    gw = Gateway(make_root(tmp_path), runner=runner).start()
    try:
        acks = {target: gw.message_agent(sender="alice", target=target, message="hi") for target in ("bob", "carol")}
        assert all(event.wait(20) for event in runner.entered.values())
        began = time.monotonic()
        gw.stop(timeout=0.1)  # both turns are held: the stop's wait runs out
        took = time.monotonic() - began
        outcomes = {target: gw.wait_outcome(ack["delivery_id"], timeout=0) for target, ack in acks.items()}
    finally:
        runner.unhang.set()
        for event in runner.release.values():
            event.set()
    assert took < ASK_TIMEOUT, f"the stop waited {took:.1f}s on runner code"  # it took ASK_TIMEOUT and more
    assert not logs.matching("not clean"), logs.lines
    # the turn processes are ended (one call, for the turns running when the stop began)
    assert [sorted(ids or []) for ids in runner.stopped] == [sorted(ack["delivery_id"] for ack in acks.values())]
    assert runner.calls == {"running_turns": 1, "warm_turns": 1}  # once per stop, not once per running turn
    suffix = " The message may have been delivered — do not resend."
    assert (outcomes["bob"]["status"], outcomes["bob"]["error"]) == ("ambiguous", running_at_stop_text("process")
                                                                     + suffix)
    assert (outcomes["carol"]["status"], outcomes["carol"]["error"]) == ("ambiguous", running_at_stop_text("here")
                                                                         + suffix)
    if warm == "hangs":
        assert logs.matching("warm_turns() did not answer within 1.0s"), logs.lines


def test_a_journal_keeps_the_live_mark_of_a_handoff_through_compaction_and_adoption() -> None:
    """Compaction and adoption rewrite a live delivery's records: a handoff's ``started`` keeps its ``live``."""
    handed, ran = _delivery(), _delivery()
    records = [{"t": "accepted", "id": handed.delivery_id, "d": delivery_record(handed)},
               {"t": "started", "id": handed.delivery_id, "attempt": 1, "live": True},
               {"t": "accepted", "id": ran.delivery_id, "d": delivery_record(ran)},
               {"t": "started", "id": ran.delivery_id, "attempt": 1}]
    adopted = fold_records(records)
    assert [adopted.states[d.delivery_id].live for d in (handed, ran)] == [True, False]
    state = JournalState()
    state.take_over(adopted, keep=10)
    rebuilt = fold_records(orjson.loads(line) for line in state.lines())
    assert [rebuilt.states[d.delivery_id].live for d in (handed, ran)] == [True, False]


def _dead_journal(root: Path, records: list[dict[str, Any]]) -> None:
    directory = root / "bot_relay" / "journal"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / f"j-{new_delivery_id()}.log"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    path.chmod(0o600)


def test_a_settled_live_delivery_is_recovered_with_the_owners_reply(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    delivery = _delivery("bob")
    _dead_journal(root, [{"t": "accepted", "id": delivery.delivery_id, "d": delivery_record(delivery)},
                         {"t": "started", "id": delivery.delivery_id, "attempt": 1, "live": True}])
    box = LiveMailbox(root / "profiles" / "bob")
    box.admit(delivery.delivery_id)
    box.transition(delivery.delivery_id, "settled", reply="answered in the open window")
    ran: list[str] = []
    with Gateway(root, runner=lambda turn: ran.append(turn.delivery_id) or "runner") as gw:
        assert gw.recovered["redelivered"] == 1
        outcome = gw.wait_outcome(delivery.delivery_id, timeout=10)
    assert outcome["status"] == "replied" and outcome["reply"] == "answered in the open window"
    assert ran == []  # never run again


def test_a_claimed_live_delivery_of_a_dead_gateway_is_recovered_ambiguous_and_recorded_so(tmp_path: Path) -> None:
    """The owner had the DM when its gateway died: recovery reported it ``ambiguous`` but left the mailbox
    record ``claimed``. The record now says ``ambiguous`` too, and the DM is never run again."""
    root = make_root(tmp_path)
    delivery = _delivery("bob")
    _dead_journal(root, [{"t": "accepted", "id": delivery.delivery_id, "d": delivery_record(delivery)},
                         {"t": "started", "id": delivery.delivery_id, "attempt": 1, "live": True}])
    box = LiveMailbox(root / "profiles" / "bob")
    box.admit(delivery.delivery_id)
    box.transition(delivery.delivery_id, "claimed")
    ran: list[str] = []
    with Gateway(root, runner=lambda turn: ran.append(turn.delivery_id) or "runner") as gw:
        assert gw.recovered["ambiguous"] == 1
        outcome = gw.wait_outcome(delivery.delivery_id, timeout=10)
    assert outcome["status"] == "ambiguous"
    record = box.read(delivery.delivery_id)
    assert record is not None and record["status"] == record["state"] == "ambiguous", record
    assert record["error"] == "The gateway stopped or crashed during the turn.", record
    assert ran == []


@pytest.mark.parametrize("handed", [False, True], ids=["runner-turn", "owner-turn"])
def test_a_queued_record_planted_for_a_started_dm_never_makes_it_run_again(tmp_path: Path, handed: bool) -> None:
    """Regression (hostile files, ``attack2c.py``): a gateway was killed -9 mid-turn and a ``queued`` record was
    written at ``profiles/bob/runtime/bot_live_delivery/<id>.json`` (a runner's turn: planted; an owner's turn: its
    ``claimed`` record set back). The next start re-offered the DM and it ran twice. Now the journal decides: the
    turn started, so it is ``ambiguous`` and runs no more."""
    root = make_root(tmp_path)
    delivery = _delivery("bob")
    started: dict[str, Any] = {"t": "started", "id": delivery.delivery_id, "attempt": 1}
    _dead_journal(root, [{"t": "accepted", "id": delivery.delivery_id, "d": delivery_record(delivery)},
                         {**started, "live": True} if handed else started])
    box = LiveMailbox(root / "profiles" / "bob")
    box.admit(delivery.delivery_id)  # queued: "never handed over", says the file
    ran: list[str] = []
    gw = Gateway(root, runner=lambda turn: ran.append(turn.delivery_id) or "runner ran it again")
    if handed:
        gw.attach_live_owner("bob", lambda turn: ran.append(turn.delivery_id) or "the owner ran it again")
    with gw:
        assert gw.recovered == {"reoffered": 0, "ambiguous": 1, "redelivered": 0, "known": 0}
        outcome = gw.wait_outcome(delivery.delivery_id, timeout=10)
    assert outcome["status"] == "ambiguous", outcome
    assert ran == []
    record = box.read(delivery.delivery_id)
    # the owner's record says what the sender was told; a runner's DM has no record of ours: the planted one is left
    assert record is not None and record["status"] == ("ambiguous" if handed else "queued"), record


def test_an_owner_attached_before_start_receives_the_recovered_dms(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    delivery = _delivery("bob")
    _dead_journal(root, [{"t": "accepted", "id": delivery.delivery_id, "d": delivery_record(delivery)}])
    to_owner: list[str] = []
    to_runner: list[str] = []
    gw = Gateway(root, runner=lambda turn: to_runner.append(turn.delivery_id) or "runner")
    gw.attach_live_owner("bob", lambda turn: to_owner.append(turn.delivery_id) or "from the window")
    with gw:
        assert gw.recovered["reoffered"] == 1
        outcome = gw.wait_outcome(delivery.delivery_id, timeout=10)
    assert outcome["reply"] == "from the window"
    assert to_owner == [delivery.delivery_id] and to_runner == []


def test_an_owner_for_an_unknown_profile_fails_start_and_leaves_nothing_running(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    gw = Gateway(root, runner=lambda turn: "x")
    gw.attach_live_owner("nobody", lambda turn: "x")
    with pytest.raises(KeyError, match="nobody"):
        gw.start()
    assert pykka.ActorRegistry.get_all() == []
    with pytest.raises(RuntimeError, match="gateway is not running"):
        gw.message_agent(sender="alice", target="bob", message="hi")
