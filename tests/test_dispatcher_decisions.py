"""Table tests of the Dispatcher's pure decisions: a drained envelope's step and which of its outcomes the journal
keeps (``local/relay_in.py``), the relayed-in DMs of a journal (``core/recovery.py``: ``relayed_in_states``), and
what a failed Dispatcher held (``local/dispatcher_failure.py``: ``read_failed_mailbox``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pykka
import pytest

from hermes_actors.core import outcomes
from hermes_actors.core.recovery import relayed_in_states
from hermes_actors.local.dispatcher_failure import read_failed_mailbox
from hermes_actors.local.outcome_book import Pending
from hermes_actors.local.relay_in import (
    RelayInAnswer,
    RelayInTurn,
    dead_holder_text,
    kept_across_restarts,
    relay_in_step,
)
from hermes_actors.messages import (
    AcceptLocal,
    AwaitOutcome,
    Delivery,
    OutcomeReady,
    OutcomesReady,
    ProfileInfo,
    RoomTurn,
)
from hermes_actors.relay.restart import AMBIGUOUS_WHY
from hermes_actors.store.journal_records import DeliveryState

BOB = ProfileInfo("bob", "bob", Path("/nonexistent/bob"), "Bob")
KEY = "e" * 32


def _env(**changes: Any) -> dict[str, Any]:
    env = {"id": KEY, "target_handle": "bob", "target_profile": "bob", "from_profile": "alice",
           "from_handle": "alice", "message": "hi", "hop": 1}
    return {**env, **changes}


def _step(env: dict[str, Any] | None = None, **kw: Any) -> RelayInAnswer | RelayInTurn | None:
    args: dict[str, Any] = {"pending": False, "record": None, "accepting": True, "index": {"bob": BOB},
                            "max_hops": 4, "now": 1.0, "reply_connection": "conn-a"}
    return relay_in_step(env or _env(), **{**args, **kw})


CANCELLED = outcomes.cancelled(KEY, "@bob").as_dict()
DEAD = dead_holder_text("vm-1-2-x")
REPLIED = outcomes.from_reply(KEY, "@bob", "hello").as_dict()


@pytest.mark.parametrize(
    ("env", "kw", "kind", "status", "stopping"),
    [
        (None, {"pending": True}, None, None, False),  # under way here: a second offer is ignored
        (None, {"accepting": False}, RelayInAnswer, "failed", True),  # taken as the stop began: put back
        (None, {"accepting": False, "record": CANCELLED}, RelayInAnswer, "failed", True),  # a reclaim
        (None, {"accepting": False, "record": REPLIED}, RelayInAnswer, "replied", False),  # ran: answered
        (None, {"record": REPLIED}, RelayInAnswer, "replied", False),  # reply not written before a crash
        (_env(target_profile="carol"), {}, RelayInAnswer, "failed", False),  # no such agent here
        (_env(hop=5), {}, RelayInAnswer, "failed", False),  # deeper than our limit
        (_env(hop=5), {"max_hops": 0}, RelayInTurn, None, False),  # no limit
        (None, {}, RelayInTurn, None, False),
        # its turn may have run in a process that died (a dead Redis consumer's claim, a dead file relay gateway's
        # start mark): never run here; the journaled outcome, else ambiguous
        (None, {"dead_why": DEAD, "record": REPLIED}, RelayInAnswer, "replied", False),
        (None, {"dead_why": DEAD}, RelayInAnswer, "ambiguous", False),
        (None, {"dead_why": DEAD, "accepting": False}, RelayInAnswer, "ambiguous", False),
        (None, {"dead_why": DEAD, "accepting": False, "record": REPLIED}, RelayInAnswer, "replied", False),
        (None, {"dead_why": DEAD, "pending": True}, None, None, False),
        (None, {"dead_why": AMBIGUOUS_WHY, "record": REPLIED}, RelayInAnswer, "replied", False),
        (None, {"dead_why": AMBIGUOUS_WHY}, RelayInAnswer, "ambiguous", False),
    ],
)
def test_relay_in_step(env: dict[str, Any] | None, kw: dict[str, Any], kind: type | None, status: str | None,
                       stopping: bool) -> None:
    step = _step(env, **kw)
    if kind is None:
        assert step is None
        return
    assert isinstance(step, kind)
    if isinstance(step, RelayInAnswer):
        assert (step.outcome.status, step.stopping) == (status, stopping)
    else:
        assert isinstance(step, RelayInTurn)
        assert step.info is BOB and step.delivery.delivery_id == KEY and step.delivery.origin == "relay"
        assert step.delivery.accepted_at == 1.0


def test_a_dead_holders_ambiguous_answer_names_it_and_says_do_not_resend() -> None:
    step = _step(dead_why=DEAD)
    assert isinstance(step, RelayInAnswer)
    assert step.outcome.error == (f"{dead_holder_text('vm-1-2-x')}. The message may have been delivered — "
                                  "do not resend.")
    assert step.outcome.error.startswith("The gateway process that was running this turn (vm-1-2-x) died before")


def test_a_dead_file_relay_gateways_envelope_without_a_recorded_outcome_is_answered_as_before() -> None:
    step = _step(dead_why=AMBIGUOUS_WHY)
    assert isinstance(step, RelayInAnswer)
    assert step.outcome.error == ("The receiving gateway stopped or crashed during the turn. The message may have "
                                  "been delivered — do not resend.")


@pytest.mark.parametrize(
    ("outcome", "kept"),
    [
        (outcomes.from_reply(KEY, "@bob", "hello"), True),
        (outcomes.from_reply(KEY, "@bob", "[SILENT]"), True),  # silent
        (outcomes.failed(KEY, "@bob", "insufficient_quota", "provider_quota_limit"), True),
        (outcomes.failed(KEY, "@bob", "busy", "target_busy"), True),  # a retry within the run gets it too
        (outcomes.ambiguous(KEY, "@bob", "The gateway stopped or crashed during the turn."), True),
        (outcomes.cancelled(KEY, "@bob"), False),  # never ran: its envelope comes back and runs then
    ],
)
def test_kept_across_restarts(outcome: Any, kept: bool) -> None:
    assert kept_across_restarts(outcome) is kept


def test_relayed_in_states_splits_by_the_journaled_origin_in_journal_order() -> None:
    relay_d = {"origin": "relay"}
    states = {
        "a": DeliveryState(delivery=relay_d, started=1),  # a relayed-in turn journaled at its start
        "b": DeliveryState(delivery={"origin": "local"}),
        "c": DeliveryState(outcome=REPLIED, delivered=True, origin="relay"),  # rewritten by compaction
        "d": DeliveryState(delivery={}),  # no origin: a local DM
        "e": DeliveryState(outcome=REPLIED),  # a DM sent through the relay: no accepted record, not relayed in
        "f": DeliveryState(delivery=relay_d, outcome=REPLIED, delivered=True),
    }
    relayed_in, others = relayed_in_states(states)
    assert list(relayed_in) == ["a", "c", "f"] and list(others) == ["b", "d", "e"]
    assert all(relayed_in[key] is states[key] for key in relayed_in)


def _delivery(key: str) -> Delivery:
    return Delivery(key, "alice", "alice", "bob", "bob", "hi", label="@bob")


def test_read_failed_mailbox_sorts_what_the_book_and_the_mailbox_held() -> None:
    pending = [("p1", Pending(_delivery("p1"), "local")), ("p2", Pending(_delivery("p2"), "relay"))]
    first, second = outcomes.from_reply("p1", "@bob", "a"), outcomes.from_reply("p1", "@bob", "b")

    def reply(outcome: Any) -> None:
        return None

    mailbox = [
        AcceptLocal(BOB, _delivery("m1"), {}, journaled=True),
        RoomTurn(_delivery("r1"), reply),
        OutcomeReady(first),
        OutcomesReady((second, outcomes.cancelled("m1", "@bob"))),
        AwaitOutcome("p1", pykka.ThreadingFuture()),  # not a held delivery: ignored here
    ]
    found = read_failed_mailbox(pending, mailbox)
    assert [(h.delivery_id, h.route, h.journaled, h.started) for h in found.held] == [
        ("p1", "local", False, True), ("p2", "relay", False, True),
        ("m1", "local", True, False), ("r1", "room", False, False),
    ]
    assert found.arrived == {"p1": first, "m1": outcomes.cancelled("m1", "@bob")}  # the first one wins
    assert found.rooms == {"r1": reply} and list(found.untaken) == ["m1"]
