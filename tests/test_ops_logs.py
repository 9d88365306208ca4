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
    assert any(line.endswith(" s") and "@alice → @moxie on mini: replied" in line for line in sender_side)
    assert not any("secret" in line for line in logs.lines)


def test_serve_with_v_after_the_subcommand_logs_each_delivery(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    from hermes_actors.demo.bots import create_demo_root
    from hermes_actors.hermes.submit import fetch_outcome, submit_dm

    root = create_demo_root(tmp_path / "root")
    proc = subprocess.Popen([sys.executable, "-c", "from hermes_actors.cli.main import main; raise SystemExit(main())",
                             "serve", "--root", str(root), "--runner", "demo", "-v"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("gateway serving")  # the endpoint is up before this line
        ack = submit_dm(root, "hermes", "scout", "the secret question")
        outcome = fetch_outcome(root, ack["delivery_id"], wait=30)
        assert outcome["status"] == "replied"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    lines = [line for line in err.splitlines() if f"delivery {ack['delivery_id']}" in line]
    assert len(lines) == 1 and "INFO" in lines[0] and "@hermes → @scout: replied in " in lines[0], err
    assert "secret" not in err
