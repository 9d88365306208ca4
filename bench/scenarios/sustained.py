"""The flat-memory scenario: a fixed DM rate held for minutes, RSS sampled every second.

Ours is :class:`hermes_actors.Gateway` on the in-memory path with the instant
runner (as in ``local-throughput``). One pacer thread sends at a fixed rate
(:data:`RATE_PER_S`) round-robin between :data:`PROFILES` profiles, for
``--sustained-seconds`` (default 600 s in a full run, 10 s with ``--quick``);
outcomes are counted through ``subscribe``. The driver itself allocates
nothing per DM that it keeps: latencies go to a preallocated ring of the last
:data:`WINDOW` DMs, the send-time table holds only DMs in flight.

Memory is bounded by design, not constant from the first DM: the Dispatcher
remembers the last ``SETTLED_KEEP`` outcomes (for ``wait_outcome``, dropped a
generation at a time). That table grows until it is full — ``tables_full_s`` into
the run at this rate — so flatness is judged after that point.

Reported on ``ours``: ``rss_start_mb`` (when the load starts, after a warm-up),
``rss_mid_mb``, ``rss_peak_mb``, ``rss_end_mb`` (when the last outcome
arrived), ``rss_growth_second_half_mb`` (end − mid), ``rss_at_tables_full_mb``
and ``rss_growth_after_tables_full_mb`` (end − that; None when the run is too
short to fill them), ``rss_series_mb`` (every 10 s), the achieved rate, and the
gateway's ``timers`` / ``pending`` at the end. No baseline.
"""

from __future__ import annotations

import threading
import time
from array import array
from typing import Any

from bench.drivers import BenchError
from bench.measure import CpuClock, read_proc_status_kb, summarize
from bench.registry import BenchContext, ScenarioResult, scenario
from bench.roots import write_root
from bench.scenarios.local import our_system
from hermes_actors.local.outcome_book import GENERATIONS, SETTLED_KEEP

__all__ = ["RATE_PER_S", "WINDOW"]

RATE_PER_S = 500  # well below what ours sustains on 2 loaded cores, so the run measures memory, not backlog
WINDOW = 20_000  # latencies kept (the last ones): a fixed buffer, so the driver's own memory stays flat
PROFILES = 4  # a few targets, each ProfileActor busy for the whole run
_DRAIN_S = 60.0


def _rss_mb() -> float:
    kb = read_proc_status_kb("VmRSS")
    return kb / 1024.0 if kb is not None else 0.0


class _Ledger:
    """Send times of DMs in flight and a ring of the last :data:`WINDOW` latencies."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: dict[str, float] = {}
        self.early: dict[str, float] = {}  # outcomes that beat their send's bookkeeping
        self.ring = array("d", bytes(8 * WINDOW))
        self.done = 0
        self.failed: list[dict[str, Any]] = []
        self.drained = threading.Condition(self.lock)

    def on_sent(self, delivery_id: str, t0: float) -> None:
        with self.lock:
            t1 = self.early.pop(delivery_id, None)
            if t1 is None:
                self.sent[delivery_id] = t0
            else:
                self._record(t1 - t0)

    def on_outcome(self, outcome: dict[str, Any]) -> None:
        now = time.perf_counter()
        with self.lock:
            if outcome.get("status") != "replied" and len(self.failed) < 10:
                self.failed.append(outcome)
            t0 = self.sent.pop(str(outcome.get("delivery_id")), None)
            if t0 is None:
                self.early[str(outcome.get("delivery_id"))] = now
            else:
                self._record(now - t0)

    def _record(self, latency: float) -> None:
        self.ring[self.done % WINDOW] = latency
        self.done += 1
        self.drained.notify_all()

    def latencies(self) -> list[float]:
        with self.lock:
            return list(self.ring[: min(self.done, WINDOW)])


@scenario(
    "sustained",
    f"flat memory: a fixed {RATE_PER_S} DMs/s round-robin over {PROFILES} profiles (in-memory path) held for "
    "`--sustained-seconds` (600 s in a full run, 10 s quick); RSS start / peak / end (ours only)",
)
def sustained(ctx: BenchContext) -> ScenarioResult:
    """Ours only: does a long steady load leave memory where it started?"""
    duration = ctx.sustained_s if ctx.sustained_s is not None else (10.0 if ctx.quick else 600.0) * ctx.scale
    duration = max(1.0, float(duration))
    root = ctx.workdir / "root"
    profiles = write_root(root, PROFILES)
    ledger = _Ledger()
    with our_system(root) as gateway:
        warm = [gateway.message_agent(sender=profiles[i], target=profiles[(i + 1) % PROFILES], message="warm")
                for i in range(PROFILES)]
        for ack in warm:
            gateway.wait_outcome(str(ack["delivery_id"]), 30)
        unsubscribe = gateway.subscribe(ledger.on_outcome)
        try:
            stats_start = gateway.stats()
            rss: list[float] = [_rss_mb()]
            ctx.progress.start(f"sustained ours: {RATE_PER_S}/s for {duration:.0f}s", round(duration))
            clock = CpuClock().start()
            begin = time.perf_counter()
            sent = _pace(gateway, profiles, ledger, begin, duration, rss, ctx)
            with ledger.lock:
                drained = ledger.drained.wait_for(lambda: ledger.done >= sent, _DRAIN_S)
            wall = time.perf_counter() - begin
            clock.stop()
            ctx.progress.finish()
            rss.append(_rss_mb())
            stats_end = gateway.stats()
        finally:
            unsubscribe()
    if not drained:
        raise BenchError(f"sustained: only {ledger.done}/{sent} outcomes within {_DRAIN_S:g}s of the end")
    if ledger.failed:
        raise BenchError(f"sustained: DMs did not get a reply (first: {ledger.failed[0]})")
    latencies = ledger.latencies()
    ours = summarize(latencies, wall, n=sent)
    mid = rss[len(rss) // 2]
    settled_most = SETTLED_KEEP + SETTLED_KEEP // GENERATIONS  # the settled table drops its oldest generation whole
    tables_full_s = settled_most / RATE_PER_S
    at_full = rss[int(tables_full_s)] if int(tables_full_s) < len(rss) - 1 else None
    ours.update(
        duration_s=round(duration, 1),
        target_rate_per_s=RATE_PER_S,
        latency_window=len(latencies),
        cpu_per_dm_us=clock.per_item_us(sent),
        rss_start_mb=round(rss[0], 1),
        rss_mid_mb=round(mid, 1),
        rss_peak_mb=round(max(rss), 1),
        rss_end_mb=round(rss[-1], 1),
        rss_growth_second_half_mb=round(rss[-1] - mid, 1),
        tables_full_s=round(tables_full_s, 1),
        rss_at_tables_full_mb=round(at_full, 1) if at_full is not None else None,
        rss_growth_after_tables_full_mb=round(rss[-1] - at_full, 1) if at_full is not None else None,
        rss_series_mb=[round(v, 1) for v in rss[::10]],
        rss_samples=len(rss),
        timers_start=stats_start.get("timers"),
        timers_end=stats_end.get("timers"),
        pending_end=stats_end.get("pending"),
    )
    return ScenarioResult(ours, None, {"ours": latencies})


def _pace(gateway: Any, profiles: list[str], ledger: _Ledger, begin: float, duration: float, rss: list[float],
          ctx: BenchContext) -> int:
    """Send at :data:`RATE_PER_S` until ``duration`` is over; sample RSS once a second. Returns DMs sent."""
    interval = 1.0 / RATE_PER_S
    sent = 0
    next_sample = begin + 1.0
    end = begin + duration
    while True:
        now = time.perf_counter()
        if now >= end:
            return sent
        if now >= next_sample:
            rss.append(_rss_mb())
            ctx.progress.advance()
            next_sample += 1.0
        due = begin + sent * interval
        if due > now:  # ahead of schedule: wait for the next slot (pacing, not synchronization)
            time.sleep(min(due - now, next_sample - now, end - now))
            continue
        i = sent % PROFILES
        t0 = time.perf_counter()
        ack = gateway.message_agent(sender=profiles[i], target=profiles[(i + 1) % PROFILES], message="bench ping")
        if ack.get("status") != "queued":
            raise BenchError(f"sustained: DM was not accepted: {ack}")
        ledger.on_sent(str(ack["delivery_id"]), t0)
        sent += 1
