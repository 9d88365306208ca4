"""The relay across real processes: two racing drainers; two gateways and a hub; round-trip latency."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from relay_helpers import seed_envelope
from relay_procs import children, hub_argv, peer_argv
from roots import TurnLog, logged_turns, make_root

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.demo.bots import create_demo_root
from hermes_actors.store import relay_files as rf
from hermes_actors.store.relay_paths import RelayPaths


def test_two_drainer_processes_deliver_each_of_500_envelopes_exactly_once(tmp_path: Path) -> None:
    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    mini = make_root(tmp_path, name="mini")  # alice, bob, carol
    log = TurnLog(tmp_path / "turns.log")
    roots = {"alpha": alpha, "mini": mini}
    replies = alpha / "bot_relay" / "replies"
    try:
        with Gateway(mini, runner=log, connection_id="mini", config={"bot_mode": {"max_queued": 600}}), \
                children(tmp_path) as spawn:
            hubs = [spawn(f"hub{i}", hub_argv(roots)) for i in (1, 2)]
            for hub in hubs:
                hub.wait_line(lambda line: line.startswith("relay hub running"), timeout=20)
            paths = RelayPaths.from_root(alpha)
            envelopes = [
                seed_envelope(target_connection="mini", target_profile=("alice", "bob", "carol")[i % 3],
                              message=f"job {i}")
                for i in range(500)
            ]
            for env in envelopes:
                rf.enqueue_envelope(paths, env)  # while both hubs watch: they race for every one
            await_condition(lambda: len(rf.list_ids(replies)) >= 500, timeout=60, interval=0.05,
                            message="500 replies in alpha/replies")
            await_condition(lambda: not rf.list_ids(mini / "bot_relay" / "delivered"), timeout=10,
                            message="every delivered record forwarded and removed")
            for hub in hubs:
                assert hub.proc.poll() is None, hub.stderr_tail()
    finally:
        log.close()

    ids = [env["id"] for env in envelopes]
    turns = Counter(logged_turns(tmp_path / "turns.log"))
    assert set(turns) == set(ids)
    assert [i for i, n in turns.items() if n != 1] == []  # each delivered exactly once
    assert sorted(rf.list_ids(replies)) == sorted(ids)  # each exactly one reply (one file per id, first wins)
    for envelope_id in ids:
        reply = json.loads((replies / f"{envelope_id}.json").read_text(encoding="utf-8"))
        assert (reply["reply"], reply["error"]) == (f"done {envelope_id}", ""), reply
    assert rf.list_ids(alpha / "bot_relay" / "outbox") == []
    assert len(rf.list_ids(alpha / "bot_relay" / "claimed")) == 500
    assert rf.list_ids(mini / "bot_relay" / "inbox") == []
    for root in (alpha, mini):
        quarantine = root / "bot_relay" / "quarantine"
        assert not (quarantine.is_dir() and os.listdir(quarantine))


def _start_pair(tmp_path: Path, spawn, count_a: int, count_b: int, *extra: str):  # type: ignore[no-untyped-def]
    alpha = create_demo_root(tmp_path / "alpha")
    mini = create_demo_root(tmp_path / "mini")
    hub = spawn("hub", hub_argv({"alpha": alpha, "mini": mini}))
    hub.wait_line(lambda line: line.startswith("relay hub running"), timeout=20)
    peer_a = spawn("alpha", peer_argv(alpha, "alpha", "scout@mini", count_a, "--turn-log",
                                      str(tmp_path / "alpha.turns"), *extra))
    peer_b = spawn("mini", peer_argv(mini, "mini", "scout@alpha", count_b, "--turn-log",
                                     str(tmp_path / "mini.turns"), *extra))
    return hub, peer_a, peer_b


def test_two_gateway_processes_and_a_hub_process_exchange_200_dms_each_way(tmp_path: Path) -> None:
    with children(tmp_path) as spawn:
        hub, peer_a, peer_b = _start_pair(tmp_path, spawn, 200, 200)
        summary_a = peer_a.wait_json("sent", timeout=45)
        summary_b = peer_b.wait_json("sent", timeout=45)
        for child in (hub, peer_a, peer_b):
            assert child.proc.poll() is None, (child.name, child.stderr_tail())

    for summary, served_by in ((summary_a, tmp_path / "mini.turns"), (summary_b, tmp_path / "alpha.turns")):
        assert summary["refusals"] == []
        sent = summary["sent"]
        assert len(sent) == 200 and len(set(sent)) == 200
        assert set(summary["statuses"]) == {"replied"}, Counter(summary["statuses"])
        assert all(isinstance(r, str) and r for r in summary["replies"])
        turns = Counter(logged_turns(served_by))
        assert {i: turns[i] for i in sent if turns[i] != 1} == {}  # each delivered exactly once on the far side
        assert set(turns) == set(sent)  # and nothing else ran there
        with served_by.open(encoding="utf-8") as f:
            assert {line.split()[1] for line in f} == {"scout"}


def test_report_relay_round_trip_latency(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Measures (does not assert on) the latency of 50 sequential DMs: gateway → hub → gateway → hub → gateway."""
    with children(tmp_path) as spawn:
        _hub, peer_a, peer_b = _start_pair(tmp_path, spawn, 50, 0, "--sequential")
        summary = peer_a.wait_json("sent", timeout=45)
        peer_b.wait_json("sent", timeout=10)
    assert set(summary["statuses"]) == {"replied"}
    lat = summary["latency"]
    with capsys.disabled():
        print(f"\nrelay round trip over {lat['n']} sequential DMs: p50 {lat['p50_ms']:.1f} ms, "
              f"p90 {lat['p90_ms']:.1f} ms, max {lat['max_ms']:.1f} ms, min {lat['min_ms']:.1f} ms")
