"""Group commit: concurrent senders share fsyncs; durable=False never fsyncs the journal."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from roots import RecordingRunner, body_of, make_root, send_dm, start_gateway

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.local import asking_turn
from hermes_actors.messages import Turn

SENDERS = 16
DMS = 800
PROFILES = 16


class SyncCounter:
    """Counts os.fsync / os.fdatasync calls (and still performs them)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        for name in ("fsync", "fdatasync"):
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name)))

    def _wrap(self, name: str, real: Callable[[int], None]) -> Callable[[int], None]:
        def counted(fd: int) -> None:
            with self.lock:
                self.calls[name] += 1
            real(fd)

        return counted

    @property
    def total(self) -> int:
        with self.lock:
            return sum(self.calls.values())


def _blast(gw: Gateway) -> list[str]:
    """16 threads send 800 DMs to 16 profiles; returns the acked ids."""
    ids: list[str] = []
    lock = threading.Lock()
    go = threading.Barrier(SENDERS)
    errors: list[Any] = []

    def sender(n: int) -> None:
        go.wait()
        for k in range(DMS // SENDERS):
            ack = gw.message_agent(sender="hermes", target=f"p{(n + k) % PROFILES:02d}", message=f"{n}-{k}")
            if "delivery_id" not in ack:
                errors.append(ack)
                continue
            with lock:
                ids.append(ack["delivery_id"])

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(SENDERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:3]
    assert len(ids) == DMS
    return ids


def test_group_commit_shares_fsyncs_across_concurrent_senders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_root(tmp_path, {f"p{i:02d}": {} for i in range(PROFILES)})
    syncs = SyncCounter(monkeypatch)  # before the gateway (and its journal) starts
    gw = Gateway(root, runner=lambda turn: "ok", durable=True, fsync=True).start()
    try:
        ids = _blast(gw)
        for key in ids:
            assert gw.wait_outcome(key, timeout=60)["status"] == "replied"
        stats = gw.stats()
    finally:
        gw.stop()
    # Each DM needs three durable journal writes (accepted, started, finished): without group
    # commit that would be 3 fsyncs per DM.
    ratio = syncs.total / DMS
    print(f"group commit: {syncs.total} fsync calls for {DMS} DMs ({dict(syncs.calls)}), ratio {ratio:.3f}; "
          f"journal_fsyncs={stats['journal_fsyncs']} journal_records={stats['journal_records']}")
    assert syncs.total > 0, "durable mode must fsync"
    assert stats["journal_records"] >= 3 * DMS
    assert stats["journal_fsyncs"] <= syncs.total
    assert syncs.total < 1.5 * DMS, f"{syncs.total} fsyncs for {DMS} DMs: group commit is not sharing them"


def test_not_durable_makes_no_journal_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_root(tmp_path, {f"p{i:02d}": {} for i in range(PROFILES)})
    syncs = SyncCounter(monkeypatch)
    gw = Gateway(root, runner=lambda turn: "ok", durable=False).start()
    try:
        ids = _blast(gw)
        for key in ids:
            assert gw.wait_outcome(key, timeout=60)["status"] == "replied"
        stats = gw.stats()
    finally:
        gw.stop()
    assert "journal_fsyncs" not in stats
    assert syncs.total == 0, dict(syncs.calls)
    journal_dir = root / "bot_relay" / "journal"
    assert not journal_dir.exists() or not list(journal_dir.iterdir())


def test_a_dm_whose_journal_commit_stalls_past_its_ack_wait_is_never_told_not_queued(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (finding, core/acks.py ``resolve_ack``): a durable DM sent from inside a turn is journaled by the
    Dispatcher, and its ack waits for that commit. One whose commit stalled past the wait (30 s; 0.2 s here) was
    answered "the message was NOT queued", yet the commit landed and the DM ran: a resend ran it twice. Now the
    answer says its fate is unknown and not to resend."""
    wait = 10.0
    gate, syncing, armed, answered = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    real_sync = os.fdatasync

    def fdatasync(fd: int) -> None:
        if armed.is_set():  # the stall: every commit from now on waits for the gate (opened once answered)
            syncing.set()
            gate.wait(wait)
        real_sync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    real_resolve = asking_turn.resolve_ack
    monkeypatch.setattr(asking_turn, "resolve_ack", lambda answer, *, timeout: real_resolve(answer, timeout=0.2))
    answers: list[dict[str, Any]] = []

    def behave(turn: Turn) -> str:
        if body_of(turn.content) == "ask carol":
            armed.set()
            answers.append(turn.message_agent("carol", "stalled"))
            answered.set()
        return "ok"

    runner = RecordingRunner(behave)
    gw = start_gateway(gateways, make_root(tmp_path), runner, durable=True)
    send_dm(gw, "ask carol")
    assert answered.wait(wait), "the turn's message_agent did not answer"
    assert syncing.wait(wait)  # the commit holding the DM's accepted record is the stalled one
    armed.clear()
    gate.set()
    await_condition(lambda: "stalled" in [body_of(t.content) for t in runner.entered], timeout=wait,
                    message="the DM whose commit stalled ran once the commit landed")
    answer = answers[0]
    assert "delivery_id" not in answer and answer["reason"] == "unknown", answer
    assert "NOT queued" not in answer["error"], answer
    assert "did not confirm within 0.2s" in answer["error"] and "Do NOT resend" in answer["error"], answer
