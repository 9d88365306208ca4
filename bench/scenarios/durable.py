"""The durable scenario: pipelined DMs with the journal on (group commit, fdatasync per batch).

Ours is :class:`hermes_actors.Gateway` with ``durable=True, fsync=True``: every
DM is journalled (accepted, started, finished) before its ack / turn /
outcome, and concurrent DMs share one fdatasync per group commit. The same
load runs on ``durable=False`` as a reference (``ours.nondurable``); the
baseline is the seed mechanism (a subprocess per delivery), which journals
nothing. Extra fields on ``ours``: ``fsyncs`` and ``journal_records`` during
the run, ``dms_per_fsync`` and ``records_per_fsync``, and ``roundtrip``: one
sender, sequential DMs (send, wait for the outcome) with the journal on — the
latency of a durable DM with nothing else in flight (three group commits:
``accepted`` before the ack, ``started`` before the turn, ``finished`` before
the outcome), with ``fdatasync_p50_ms``: one append + ``fdatasync`` in the same
directory, timed before and after it (the lower median), and
``fdatasync_allocated_p50_ms``: the same inside space allocated ahead, as the
journal writes (no sync commits a new file size): the floor a commit costs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.drivers import pipelined, sequential_roundtrip
from bench.floors import fdatasync_ms
from bench.measure import summarize
from bench.registry import BenchContext, ScenarioResult, scenario
from bench.roots import BENCH_CONFIG, write_root
from bench.scenarios.local import baseline_system, instant_reply
from hermes_actors import Gateway

__all__: list[str] = []

SENDERS = 16


def _system(root: Path, n: int, durable: bool) -> Gateway:
    """Ours with the bench config; each target's queue may hold every DM sent to it."""
    config = {"bot_mode": {**BENCH_CONFIG["bot_mode"], "max_queued": max(256, n // SENDERS + 16)}}
    return Gateway(root, runner=instant_reply, config=config, durable=durable, fsync=durable)


def _shares(profiles: list[str], n: int) -> list[list[tuple[str, str]]]:
    """Sender thread i sends as profile i to profile i+1 (mod 16): 16 senders, 16 targets."""
    per = max(1, n // SENDERS)
    return [[(profiles[i], profiles[(i + 1) % SENDERS])] * per for i in range(SENDERS)]


@scenario(
    "durable-throughput",
    "journal on (fdatasync per group commit): 16 sender threads to 16 profiles send without waiting; "
    "outcomes counted through `subscribe`; `durable=False` on the same load as a reference",
)
def durable_throughput(ctx: BenchContext) -> ScenarioResult:
    """Sustained DM rate when every DM is made durable before it is acked."""
    root = ctx.workdir / "root"
    profiles = write_root(root, SENDERS)
    samples: dict[str, list[float]] = {}
    n = ctx.count(800, 16000, minimum=SENDERS)

    gateway = _system(root, n, durable=True)
    with gateway:
        before = gateway.stats()
        shares = _shares(profiles, n)
        ctx.progress.start("durable-throughput ours (journal on)", sum(map(len, shares)))
        try:
            run = pipelined(gateway, shares, ctx.progress)
        finally:
            ctx.progress.finish()
        after = gateway.stats()
    ours: dict[str, Any] = summarize(run.latencies_s, run.wall_s)
    fsyncs = int(after.get("journal_fsyncs", 0)) - int(before.get("journal_fsyncs", 0))
    records = int(after.get("journal_records", 0)) - int(before.get("journal_records", 0))
    ours.update(
        fsyncs=fsyncs,
        journal_records=records,
        dms_per_fsync=round(ours["n"] / fsyncs, 2) if fsyncs else None,
        records_per_fsync=round(records / fsyncs, 2) if fsyncs else None,
    )
    samples["ours"] = run.latencies_s

    trip_root = ctx.workdir / "roundtrip"
    write_root(trip_root, 2)
    trip_n = ctx.count(100, 2000, minimum=10)
    syncs = [fdatasync_ms(trip_root)]  # the disk's floor, before and after, beside the journal
    allocated = [fdatasync_ms(trip_root, allocated=True)]
    with _system(trip_root, trip_n, durable=True) as gateway:
        ctx.progress.start("durable round trip ours (journal on, sequential)", trip_n)
        try:
            trip = sequential_roundtrip(gateway, profiles[0], profiles[1], trip_n, ctx.progress)
        finally:
            ctx.progress.finish()
    syncs.append(fdatasync_ms(trip_root))
    allocated.append(fdatasync_ms(trip_root, allocated=True))
    ours["roundtrip"] = {**summarize(trip.latencies_s, trip.wall_s), "fdatasync_p50_ms": min(syncs),
                         "fdatasync_samples_ms": syncs, "fdatasync_allocated_p50_ms": min(allocated),
                         "fdatasync_allocated_samples_ms": allocated}
    samples["ours round trip"] = trip.latencies_s

    reference_root = ctx.workdir / "nondurable"
    write_root(reference_root, SENDERS)
    with _system(reference_root, n, durable=False) as reference:
        shares = _shares(profiles, n)
        ctx.progress.start("durable-throughput ours (durable=False)", sum(map(len, shares)))
        try:
            ref = pipelined(reference, shares, ctx.progress)
        finally:
            ctx.progress.finish()
    ours["nondurable"] = summarize(ref.latencies_s, ref.wall_s)
    samples["ours durable=False"] = ref.latencies_s

    base_root = ctx.workdir / "baseline"
    write_root(base_root, SENDERS)
    base_n = ctx.count(16, 160, minimum=SENDERS)
    with baseline_system(base_root) as baseline:
        shares = _shares(profiles, base_n)
        ctx.progress.start("durable-throughput baseline", sum(map(len, shares)))
        try:
            brun = pipelined(baseline, shares, ctx.progress)
        finally:
            ctx.progress.finish()
    samples["baseline"] = brun.latencies_s
    return ScenarioResult(ours, summarize(brun.latencies_s, brun.wall_s), samples)
