"""Bounded state: after many DMs the timer heap and the per-DM tables hold nothing per DM.

A profile arms one re-armed timer for its queue's turn-wait budgets, and every
turn run on a worker arms its turn timeout and cancels it when it ends; the scheduler compacts
cancelled entries, so the heap's size follows the live timers (a few per
active profile), not the number of DMs ever sent. The Dispatcher's table of
pending DMs empties as outcomes settle (read through ``Gateway.stats()``), and
its table of settled outcomes keeps the newest ``SETTLED_KEEP`` (here one
batch) plus at most one generation: ``wait_outcome`` forgets the older ones.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from roots import RecordingRunner, make_root, send_dm, start_gateway

from hermes_actors import Gateway
from hermes_actors.core import outcomes
from hermes_actors.core.targets import PeerRoute
from hermes_actors.core.wake import wake_id
from hermes_actors.local import outcome_book
from hermes_actors.messages import Delivery, Outcome, Turn
from hermes_actors.store.journal_records import parse_lines

PROFILES = ("alice", "bob", "carol")
SENDERS = 4
PER_SENDER = 300  # 1,200 DMs a batch: every one arms at least one timer with a due time far in the future
# Live timers at rest: the roster's rescan, one idle timer per profile actor (+ one spare each); cancelled
# entries may stay until they are half the heap (at least 64), so allow twice that plus the compaction floor.
HEAP_BOUND = 2 * (1 + 2 * len(PROFILES)) + 64


def instant(turn: Turn) -> str:
    return "ok"


def send_batch(gw: Gateway) -> list[str]:
    """SENDERS threads send PER_SENDER DMs each without waiting, round-robin over the profiles."""
    ids: list[list[str]] = [[] for _ in range(SENDERS)]
    gate = threading.Barrier(SENDERS)

    def send(k: int) -> None:
        gate.wait()
        for i in range(PER_SENDER):
            sender, target = PROFILES[(k + i) % 3], PROFILES[(k + i + 1) % 3]
            ids[k].append(send_dm(gw, f"dm {k}-{i}", target=target, sender=sender))

    threads = [threading.Thread(target=send, args=(k,)) for k in range(SENDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [d for part in ids for d in part]


def _remembered(gw: Gateway, ids: list[str]) -> int:
    """How many of ``ids`` ``wait_outcome`` still answers (a forgotten id is a KeyError at once)."""
    known = 0
    for did in ids:
        try:
            gw.wait_outcome(did, timeout=60)
        except KeyError:
            continue
        known += 1
    return known


def test_timer_heap_and_per_dm_tables_stay_bounded_after_many_dms(
    root: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    keep = SENDERS * PER_SENDER  # the settled table remembers one batch (and at most one generation more)
    monkeypatch.setattr(outcome_book, "SETTLED_KEEP", keep)
    # Sends are acked without waiting for any actor: a whole batch may queue on one profile at once.
    config = {"bot_mode": {"max_pair_rate": 0, "turn_wait_seconds": 300, "turn_timeout_seconds": 600,
                           "idle_stop_seconds": 600, "max_queued": SENDERS * PER_SENDER}}
    gw = start_gateway(gateways, root, instant, config=config, durable=False)
    heaps = []
    batches = []
    for batch in range(2):
        ids = send_batch(gw)
        batches.append(ids)
        outcomes = [gw.wait_outcome(did, timeout=60) for did in ids]
        assert [o["status"] for o in outcomes] == ["replied"] * len(ids)
        stats = gw.stats()
        assert stats["pending"] == 0, stats
        assert stats["settled"] == (batch + 1) * SENDERS * PER_SENDER, stats
        heaps.append(stats["timers"])
    assert heaps[-1] <= HEAP_BOUND, f"timer heap after {2 * SENDERS * PER_SENDER} DMs: {heaps}"
    assert heaps[-1] >= 1  # the roster's rescan timer: the field does count what is there
    assert _remembered(gw, batches[1]) == keep  # the newest outcomes are all answered
    assert _remembered(gw, batches[0]) <= keep // outcome_book.GENERATIONS  # the older ones are forgotten


class AnsweringPeer:
    """A ``bot_peers`` transport whose peer answers every DM at once."""

    def deliver(self, delivery: Delivery, route: PeerRoute) -> Outcome:
        return outcomes.from_reply(delivery.delivery_id, route.label, "peer reply")


def test_peer_dms_that_wake_their_sender_leave_no_per_dm_state_and_one_delivered_record_each(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Review: each peer DM that woke its sender left its id in the journal's table of DMs whose ``delivered`` record
    rides with their wake (nothing discards it for a peer DM), and wrote two ``delivered`` records: one in its wake's
    batch, which could land before (and without) its ``finished`` record, and one with its ``finished`` record. A
    peer DM's ``delivered`` record now goes with its ``finished`` record only; its wake's batch holds the wake's."""
    count = 20
    root = make_root(tmp_path)
    gw = start_gateway(gateways, root, RecordingRunner(),
                       config={"bot_peers": {"mini": {}}, "bot_mode": {"wake_sender": True}},
                       peer_transport=AnsweringPeer())
    keys = [send_dm(gw, f"hi {n}", target="mini/bob") for n in range(count)]
    assert [gw.wait_outcome(key, timeout=30)["status"] for key in keys] == ["replied"] * count
    assert [gw.wait_outcome(wake_id(key), timeout=30)["status"] for key in keys] == ["replied"] * count
    assert gw.stats()["pending"] == 0  # an ask: the Dispatcher is past the messages that settled them
    assert gw._journal is not None and gw._journal.listener is not None
    durability = vars(gw._journal)["listener"].__self__  # the listener is the Dispatcher's JournalDurability._landed
    tables = {name: len(getattr(durability, name, ()))
              for name in ("_with_wake", "_wakes", "_held_wakes", "_held", "_again", "_parked")}
    assert tables == dict.fromkeys(tables, 0), tables
    gw.stop()
    records = [r for path in (root / "bot_relay" / "journal").glob("j-*.log")
               for r in parse_lines(path.read_bytes().splitlines()) if r is not None]
    for key in keys:
        kinds = [r["t"] for r in records if r["id"] == key]
        # its acceptance before its ack (acklost peerkill.py: a kill -9 before the outcome left no trace), then
        # the pair; compaction keeps them as they are
        assert kinds == ["accepted", "finished", "delivered"], (key, kinds)
