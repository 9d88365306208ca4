"""Recovery that knows about live owners, and owners attached before start()."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pykka
import pytest
from roots import make_root

from hermes_actors import Gateway
from hermes_actors.core.acks import delivery_record
from hermes_actors.core.ids import new_delivery_id
from hermes_actors.core.recovery import plan_recovery
from hermes_actors.local.live_handoff import LiveMailbox
from hermes_actors.messages import Delivery
from hermes_actors.store.journal_records import DeliveryState


def _delivery(target: str = "bob") -> Delivery:
    return Delivery(new_delivery_id(), "alice", "alice", target, target, "Message from 🤖 alice (@alice): hi",
                    label=f"@{target}")


@pytest.mark.parametrize(
    ("live", "expected"),
    [
        (None, "ambiguous"),
        ({"status": "claimed"}, "ambiguous"),
        ({"status": "ambiguous"}, "ambiguous"),
        ({"status": "queued"}, "reoffer"),
        ({"status": "settled", "reply": "done in the window"}, "replied"),
        ({"status": "failed", "error": "429 rate limit", "reason": "provider_rate_limit"}, "failed"),
    ],
)
def test_a_started_turn_is_judged_by_its_live_mailbox_record(live: dict[str, Any] | None, expected: str) -> None:
    delivery = _delivery()
    states = {delivery.delivery_id: DeliveryState(delivery_record(delivery), started=1)}
    plan = plan_recovery(states, live_record=lambda d: live)
    kinds = {
        "ambiguous": [o.status for _, o in plan.ambiguous],
        "reoffer": ["reoffer" for _ in plan.reoffer],
        "replied": [o.status for o in plan.redeliver if o.status == "replied"],
        "failed": [o.status for o in plan.redeliver if o.status == "failed"],
    }
    assert kinds[expected] == [expected if expected != "reoffer" else "reoffer"]
    assert sum(len(v) for v in kinds.values()) == 1
    if expected == "replied":
        assert plan.redeliver[0].reply == "done in the window"
    if expected == "failed":
        assert plan.redeliver[0].reason == "provider_rate_limit"


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
                         {"t": "started", "id": delivery.delivery_id, "attempt": 1}])
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
                         {"t": "started", "id": delivery.delivery_id, "attempt": 1}])
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
