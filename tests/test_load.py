"""Load: many senders, many profiles, random latency and failures; exactly one outcome per acked DM.

The main-suite variants are small enough for ``make test``; the ``soak``
variant has the issue's full figures (32 senders × 5,000 DMs over 50
profiles, latency 0–20 ms, 1 % failures) and runs with ``make soak``.
Each run prints one ``LOAD {...}`` line with its figures (use ``-s``).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pykka
import pytest
from roots import make_root

from actors.testkit import await_condition
from hermes_actors import Gateway, TurnFailed

PROFILES = 50


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


class RandomRunner:
    """Seeded per delivery: latency in [0, max_latency] s, ``fail_rate`` of turns raise TurnFailed."""

    def __init__(self, seed: int, max_latency: float, fail_rate: float) -> None:
        self.seed, self.max_latency, self.fail_rate = seed, max_latency, fail_rate
        self.calls: Counter[str] = Counter()
        self.failed = 0
        self._lock = threading.Lock()

    def __call__(self, turn: Any) -> str:
        with self._lock:
            self.calls[turn.delivery_id] += 1
        rng = random.Random(f"{self.seed}:{turn.delivery_id}")
        time.sleep(rng.uniform(0.0, self.max_latency))
        if rng.random() < self.fail_rate:
            with self._lock:
                self.failed += 1
            raise TurnFailed("injected runner failure", reason="unknown")
        return f"ok {turn.profile}"


def run_load(tmp_path: Path, *, senders: int, per_sender: int, max_latency: float, fail_rate: float,
             durable: bool, seed: int = 8) -> dict[str, Any]:
    names = [f"p{i:02d}" for i in range(PROFILES)]
    root = make_root(tmp_path, {name: {"title": f"Bot {name}"} for name in names})
    runner = RandomRunner(seed, max_latency, fail_rate)
    threads_before = {t.ident for t in threading.enumerate()}
    non_daemon_before = {t.ident for t in threading.enumerate() if not t.daemon}
    actors_before = set(pykka.ActorRegistry.get_all())
    outcomes: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    reasons: Counter[str] = Counter()

    def on_outcome(outcome: dict[str, Any]) -> None:  # one notifier thread: no lock needed
        outcomes[outcome["delivery_id"]] += 1
        statuses[outcome["status"]] += 1
        if outcome["status"] != "replied":
            reasons[outcome["reason"]] += 1

    gw = Gateway(root, runner=runner, durable=durable, config={"bot_mode": {"turn_wait_seconds": 600}})
    gw.subscribe(on_outcome)
    gw.start()
    acked: list[list[str]] = [[] for _ in range(senders)]
    refused: list[list[dict[str, Any]]] = [[] for _ in range(senders)]
    errors: list[BaseException] = []

    def sender(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        me = names[index % PROFILES]
        try:
            for n in range(per_sender):
                target = rng.choice([x for x in names if x != me])
                ack = gw.message_agent(sender=me, target=target, message=f"dm {index}-{n}")
                if ack.get("status") == "queued":
                    acked[index].append(ack["delivery_id"])
                else:
                    refused[index].append(ack)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    started = time.monotonic()
    workers = [threading.Thread(target=sender, args=(i,), name=f"load-sender-{i}") for i in range(senders)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    sent_in = time.monotonic() - started
    ids = [i for chunk in acked for i in chunk]
    total = senders * per_sender
    budget = 60 + total * max(max_latency, 0.001) / PROFILES * 2
    try:
        assert not errors, errors[:3]
        await_condition(lambda: len(outcomes) >= len(ids), timeout=budget,
                        message=f"an outcome for each of {len(ids)} acked DMs")
        finished = time.monotonic() - started
        # A marker DM through the same path, from a profile that never sent (no pair limit applies): outcomes reach
        # the subscriber in order, so a late duplicate of an earlier DM is counted before the marker's outcome.
        assert senders < PROFILES, "names[-1] must be a profile no sender thread sends from"
        marker = gw.message_agent(sender=names[-1], target=names[0], message="the marker")
        assert marker["status"] == "queued", marker
        await_condition(lambda: marker["delivery_id"] in outcomes, timeout=60, message="the marker's outcome")
        assert outcomes.pop(marker["delivery_id"]) == 1
        assert runner.calls.pop(marker["delivery_id"]) == 1
    finally:
        gw.stop(timeout=30)
    peak_rss_kb = _status_kb("VmHWM")

    # Exactly one outcome per acked DM, none for anything else, and no DM ran two turns.
    assert len(set(ids)) == len(ids), "delivery ids are unique"
    assert set(outcomes) == set(ids)
    duplicated = sum(1 for k in ids if outcomes[k] > 1)
    lost = sum(1 for k in ids if outcomes[k] == 0)
    assert (lost, duplicated) == (0, 0)
    assert max(runner.calls.values(), default=1) == 1, "a DM ran two turns"
    assert set(runner.calls) <= set(ids)
    refusals = [r for chunk in refused for r in chunk]
    assert all(r.get("reason") == "target_busy" and "is full" in r["error"] for r in refusals), refusals[:3]
    assert len(ids) + len(refusals) == total
    assert statuses["failed"] == sum(reasons.values())
    assert reasons["unknown"] == runner.failed, (reasons, runner.failed)

    # No leak after stop: every actor stopped, every thread the gateway started is gone.
    assert [r for r in pykka.ActorRegistry.get_all() if r not in actors_before] == []
    await_condition(lambda: {t.ident for t in threading.enumerate() if not t.daemon} <= non_daemon_before,
                    timeout=10, message="non-daemon threads back to the baseline")
    await_condition(lambda: {t.ident for t in threading.enumerate()} <= threads_before, timeout=10,
                    message="every gateway thread exited")

    figures = {
        "durable": durable, "senders": senders, "dms_per_sender": per_sender, "profiles": PROFILES,
        "latency_ms": [0, max_latency * 1000], "fail_rate": fail_rate,
        "acked": len(ids), "refused_queue_full": len(refusals), "outcomes": sum(outcomes.values()), "lost": lost,
        "duplicated": duplicated,
        "turns_run": sum(runner.calls.values()), "statuses": dict(statuses), "failure_reasons": dict(reasons),
        "injected_failures": runner.failed, "send_seconds": round(sent_in, 2),
        "duration_seconds": round(finished, 2), "throughput_dms_per_s": round(len(ids) / finished, 1),
        "peak_rss_mb": round(peak_rss_kb / 1024, 1),
    }
    print("LOAD " + json.dumps(figures, sort_keys=True))
    return figures


def test_load_8_senders_x_500_dms_over_50_profiles(tmp_path: Path) -> None:
    figures = run_load(tmp_path, senders=8, per_sender=500, max_latency=0.005, fail_rate=0.01, durable=False)
    assert figures["acked"] == 4000 and figures["injected_failures"] > 0


def test_load_durable_4_senders_x_250_dms_over_50_profiles(tmp_path: Path) -> None:
    figures = run_load(tmp_path, senders=4, per_sender=250, max_latency=0.005, fail_rate=0.01, durable=True)
    assert figures["acked"] == 1000


@pytest.mark.soak
@pytest.mark.timeout(1800)
def test_soak_32_senders_x_5000_dms_over_50_profiles(tmp_path: Path) -> None:
    figures = run_load(tmp_path, senders=32, per_sender=5000, max_latency=0.020, fail_rate=0.01, durable=False)
    assert figures["acked"] + figures["refused_queue_full"] == 160_000
    assert figures["peak_rss_mb"] < 2048, "memory stays bounded"


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_soak_durable_8_senders_x_2500_dms_over_50_profiles(tmp_path: Path) -> None:
    figures = run_load(tmp_path, senders=8, per_sender=2500, max_latency=0.020, fail_rate=0.01, durable=True)
    assert figures["acked"] + figures["refused_queue_full"] == 20_000


@pytest.mark.parametrize("durable", [False, True])
def test_a_full_queue_refuses_at_once_with_target_busy_and_memory_does_not_grow(tmp_path: Path, durable: bool) -> None:
    """bot_mode.max_queued: past it a DM is refused in its ack (target_busy, NOT delivered), never acked.

    Regression: the ack was given first and the DM failed a moment later, so the bot was told "queued"."""
    root = make_root(tmp_path)
    release, entered = threading.Event(), threading.Event()
    gate_runner = RandomRunner(0, 0.0, 0.0)

    def runner(turn: Any) -> str:
        entered.set()
        release.wait(60)
        return gate_runner(turn)

    with Gateway(root, runner=runner, durable=durable, config={"bot_mode": {"max_queued": 5}}) as gw:
        first = gw.message_agent(sender="alice", target="bob", message="running")
        assert first["status"] == "queued" and entered.wait(10), "the first DM is running"
        queued = [gw.message_agent(sender="alice", target="bob", message=f"q{n}") for n in range(5)]
        assert [a["status"] for a in queued] == ["queued"] * 5, queued
        over = [gw.message_agent(sender="carol", target="bob", message=f"over{n}") for n in range(20)]
        # The running turn is held until release (set only below): the refusals did not wait for it.
        assert not release.is_set()
        for refusal in over:
            assert "delivery_id" not in refusal and refusal["reason"] == "target_busy", refusal
            assert "queue for profile 'bob' is full (5 DMs waiting)" in refusal["error"]
            assert "NOT delivered" in refusal["error"]
        assert gw.message_agent(sender="alice", target="carol", message="other")["status"] == "queued"  # only bob
        assert gw.stats()["refused"] == 20
        release.set()
        for key in [first["delivery_id"], *(a["delivery_id"] for a in queued)]:
            assert gw.wait_outcome(key, timeout=10)["status"] == "replied"
        # every place is free again once the DMs settled: bob takes a full queue's worth anew
        await_condition(lambda: gw.stats()["pending"] == 0, timeout=10, message="everything settled")
        again = [gw.message_agent(sender="alice", target="bob", message=f"again{n}") for n in range(6)]
        assert [a.get("status") for a in again] == ["queued"] * 6, again  # one in its turn and 5 waiting
        assert [gw.wait_outcome(a["delivery_id"], timeout=10)["status"] for a in again] == ["replied"] * 6
    assert {first["delivery_id"], *(a["delivery_id"] for a in queued)} <= set(gate_runner.calls), "a refused DM ran"
    assert len(gate_runner.calls) == 13  # first, 5 queued, the DM to carol, 6 again: no refused DM ran


@pytest.mark.parametrize("durable", [False, True])
def test_an_idle_profile_takes_max_queued_dms_behind_the_first_whatever_the_timing(tmp_path: Path,
                                                                                  durable: bool) -> None:
    """Regression (review): with max_queued 1, a bot's second DM in a row to an idle teammate was refused as the
    first had not started yet (its place counted it as waiting); the one in its turn holds the extra place."""
    release = threading.Event()
    with Gateway(make_root(tmp_path), runner=lambda turn: "ok" if release.wait(60) else "late", durable=durable,
                 config={"bot_mode": {"max_queued": 1}}) as gw:
        try:
            acks = [gw.message_agent(sender="alice", target="bob", message=f"m{n}") for n in range(3)]
            assert [a.get("status") for a in acks[:2]] == ["queued", "queued"], acks
            assert acks[2]["reason"] == "target_busy" and "(1 DMs waiting)" in acks[2]["error"], acks[2]
        finally:
            release.set()
        assert [gw.wait_outcome(a["delivery_id"], timeout=10)["status"] for a in acks[:2]] == ["replied"] * 2


def test_dms_re_offered_at_a_durable_start_hold_their_places(tmp_path: Path) -> None:
    """Regression (review): the DMs a durable start re-offered held no place, so new DMs to that profile were
    acked and then failed target_busy at the ProfileActor; now they are refused in their ack."""
    root = make_root(tmp_path)
    gates = [(threading.Event(), threading.Event()) for _ in range(2)]  # (entered, release) of each gateway

    def runner_of(entered: threading.Event, release: threading.Event) -> Any:
        def runner(turn: Any) -> str:
            entered.set()
            release.wait(60)
            return "ok"
        return runner

    config = {"bot_mode": {"max_queued": 3}}
    try:
        with Gateway(root, runner=runner_of(*gates[0]), config=config) as first:
            running = first.message_agent(sender="alice", target="bob", message="running")
            assert running["status"] == "queued" and gates[0][0].wait(10)
            kept = [first.message_agent(sender="alice", target="bob", message=f"kept{n}") for n in range(3)]
            assert [a["status"] for a in kept] == ["queued"] * 3
            first.stop(timeout=0.2)  # the running turn is ambiguous; the 3 queued ones stay in the journal
        gates[0][1].set()  # that turn ends (it holds bob's flock until then)
        with Gateway(root, runner=runner_of(*gates[1]), config=config) as again:
            assert gates[1][0].wait(20), "a re-offered DM is in its turn"
            new = [again.message_agent(sender="carol", target="bob", message=f"new{n}") for n in range(3)]
            # 1 in its turn + 2 re-offered waiting: one place left of max_queued 3
            assert [a.get("status") for a in new[:1]] == ["queued"], new
            assert [a.get("reason") for a in new[1:]] == ["target_busy", "target_busy"], new
            gates[1][1].set()
            for ack in [*kept, *new[:1]]:
                assert again.wait_outcome(ack["delivery_id"], timeout=10)["status"] == "replied"
    finally:
        for _, release in gates:
            release.set()


@pytest.mark.parametrize("durable", [False, True])
def test_dms_the_dispatcher_admits_are_refused_in_their_ack_past_the_bound_even_before_their_commit(
    tmp_path: Path, durable: bool
) -> None:
    """Regression (review): in durable mode a DM the Dispatcher admits (from inside a turn, hop 2) took its place
    only once its journal commit landed, so a burst of them all found the queue free: 12 acked, 9 then failed."""
    release = threading.Event()
    start = threading.Barrier(12)
    acks: list[dict[str, Any]] = []
    lock = threading.Lock()
    with Gateway(make_root(tmp_path), runner=lambda turn: "ok" if release.wait(60) else "late", durable=durable,
                 config={"bot_mode": {"max_queued": 2}}) as gw:

        def sender(n: int) -> None:
            start.wait(timeout=30)
            ack = gw.message_agent(sender="alice", target="bob", message=f"deep {n}", hop=2)
            with lock:
                acks.append(ack)

        threads = [threading.Thread(target=sender, args=(n,)) for n in range(12)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            queued = [a for a in acks if a.get("status") == "queued"]
            assert len(acks) == 12 and len(queued) == 3, acks  # one in its turn and max_queued waiting
            assert {a.get("reason") for a in acks if a not in queued} == {"target_busy"}
        finally:
            release.set()
        assert [gw.wait_outcome(a["delivery_id"], timeout=20)["status"] for a in queued] == ["replied"] * 3
