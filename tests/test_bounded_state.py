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
from roots import send_dm, start_gateway

from hermes_actors import Gateway
from hermes_actors.local import outcome_book
from hermes_actors.messages import Turn

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
