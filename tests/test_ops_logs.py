"""One INFO line per delivery, never the text: from a gateway (what ``serve`` logs) and from the relay hub."""

from __future__ import annotations

from pathlib import Path

from relay_helpers import hub_thread
from roots import LogCapture, RecordingRunner, make_root

from actors.testkit import await_condition
from hermes_actors import Gateway


def test_the_hub_and_both_gateways_log_one_line_per_relayed_dm(tmp_path: Path) -> None:
    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    with LogCapture("INFO") as logs, Gateway(mini, runner=RecordingRunner(), connection_id="mini"), \
            Gateway(alpha, runner=RecordingRunner(), connection_id="alpha") as gw, \
            hub_thread({"alpha": alpha, "mini": mini}):
        await_condition(lambda: any(r["handle"] == "moxie" and r["online"] for r in gw.roster()), timeout=20)
        ack = gw.message_agent(sender="alice", target="moxie@mini", message="the secret payload")
        key = ack["delivery_id"]
        outcome = gw.wait_outcome(key, timeout=30)
        assert outcome["status"] == "replied"
        await_condition(lambda: logs.matching("hub: delivery", key), timeout=10, message="the hub's line")
        gw.stats()  # the sender's Dispatcher logged before it answers this
    hub = logs.matching("hub: delivery", key)
    assert len(hub) == 1 and "@alice@alpha → @moxie@mini: replied in " in hub[0], hub
    sender_side = [line for line in logs.matching(f"delivery {key}") if "hub:" not in line]
    assert len(sender_side) == 2, sender_side  # alpha (the sender's gateway) and mini (it ran the turn)
    assert any(line.endswith(" s") and "alice → @moxie on mini: replied" in line for line in sender_side)
    assert not any("secret" in line for line in logs.lines)
