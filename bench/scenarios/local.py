"""Scenarios on one machine, one process: ours vs the seed-design baseline.

Ours is :class:`hermes_actors.Gateway` with an instant callable runner (the
turn returns ``"ok"`` in-process) and :data:`bench.roots.BENCH_CONFIG`; the
baseline is :class:`bench.baseline.BaselineGateway`, whose turn is an instant
``python -c`` subprocess. So these ratios compare the *messaging machinery*
(ours with an in-process turn) against the seed model *including* its process
per DM. ``local-roundtrip-subprocess`` is the like-for-like one: ours runs the
very same turn process per DM. Both sides run the same driver on equally
shaped roots in the same run.

Every measured side also records ``cpu_per_dm_us``: the CPU (user + system,
all threads of this process) spent while the driver ran, per DM;
``cpu_per_dm_us_with_children`` adds the turn subprocesses' CPU.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from bench.baseline import BaselineGateway
from bench.baseline.model import TURN_CODE
from bench.drivers import Run, System, fan_in, pipelined, sequential_roundtrip
from bench.floors import measure_spread_floor
from bench.measure import CpuClock, ResourceSampler, ThreadCpu, read_proc_status_kb, summarize, us_per_item
from bench.registry import BenchContext, ScenarioResult, scenario
from bench.roots import BENCH_CONFIG, write_root
from hermes_actors import CallableRunner, Gateway

__all__ = ["baseline_system", "instant_reply", "our_system", "subprocess_reply"]

SystemFactory = Callable[[Path], AbstractContextManager[Any]]


def _reply_ok(turn: Any) -> str:
    return "ok"


# Our runner for every benchmark: the turn answers at once and never blocks, and says so
# (``blocking=False``), so its turns run inline on the ProfileActor, as an embedder's would.
instant_reply = CallableRunner(_reply_ok, blocking=False)


def subprocess_reply(turn: Any) -> str:
    """Our runner for ``local-roundtrip-subprocess``: the baseline's very turn process.

    Writes the turn's text to a query file and runs ``python -c TURN_CODE -p
    <profile> --query-file <file>`` — the same command, interpreter and output
    the seed model's :class:`~bench.baseline.BaselineGateway` spawns per DM.
    """
    fd, path = tempfile.mkstemp(prefix="bench-turn-", suffix=".txt", text=True)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(str(turn.content))
        done = subprocess.run([sys.executable, "-c", TURN_CODE, "-p", str(turn.profile), "--query-file", path],
                              check=True, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              encoding="utf-8", errors="replace")
    finally:
        os.unlink(path)
    return done.stdout.strip()


def _local_kwargs() -> dict[str, Any]:
    """Gateway options of the local scenarios: the in-memory path, no journal.

    The durable journal (``durable=True``, the Gateway default once it landed)
    fsyncs every group commit; its cost is what the separate durable scenario
    measures. The seed's local path journals nothing either.
    """
    params = inspect.signature(Gateway).parameters
    return {"durable": False} if "durable" in params else {}


def our_system(root: Path, **options: Any) -> Gateway:
    """hermes-actors on ``root`` with the bench config, the instant runner, no journal (``options`` override)."""
    kwargs: dict[str, Any] = {"runner": instant_reply, "config": BENCH_CONFIG, **_local_kwargs(), **options}
    return Gateway(root, **kwargs)


def baseline_system(root: Path) -> BaselineGateway:
    """The seed-design model on ``root`` with the same turn budget."""
    return BaselineGateway(root, turn_wait_seconds=float(BENCH_CONFIG["bot_mode"]["turn_wait_seconds"]))


THROUGHPUT_RUNS = 3  # local-throughput runs ours this many times in a full run and reports the median run


@contextmanager
def _phase(ctx: BenchContext, label: str, total: int) -> Iterator[None]:
    ctx.progress.start(label, total)
    try:
        yield
    finally:
        ctx.progress.finish()


def _cpu_split(run: Run, threads: ThreadCpu, n: int) -> dict[str, float]:
    """CPU per DM by thread group, the driver's senders first (empty without per-thread CPU clocks)."""
    split = threads.per_item_us(n)
    if not split or run.sender_cpu_s <= 0:
        return {}
    return {"bench senders": us_per_item(run.sender_cpu_s, n, 1), **split}


def _measure(
    ctx: BenchContext, name: str, side: str, factory: SystemFactory, root: Path, total: int,
    drive: Callable[[System], Run], samples: dict[str, list[float]],
) -> dict[str, Any]:
    """Start a system on ``root``, run ``drive`` on it under a progress phase, summarize.

    The raw latencies are stored in ``samples[side]``; the metrics carry
    ``cpu_per_dm_us`` (this process's CPU while ``drive`` ran, per DM), when
    turn subprocesses ran ``cpu_per_dm_us_with_children``, and for ours, where the
    platform has per-thread CPU clocks (:class:`ThreadCpu`), ``cpu_split_us``: that CPU
    per DM by thread group (``bench senders``: the driver's sender threads, measured by
    themselves).
    """
    with factory(root) as system, _phase(ctx, f"{name} {side}", total):
        clock = CpuClock().start()
        threads = ThreadCpu().start()
        run = drive(system)
        threads.stop()
        clock.stop()
    samples[side] = run.latencies_s
    metrics = summarize(run.latencies_s, run.wall_s)
    n = int(metrics["n"])
    metrics["cpu_per_dm_us"] = clock.per_item_us(n)
    if side == "ours" and (split := _cpu_split(run, threads, n)):
        metrics["cpu_split_us"] = split
    if clock.children_s > 0:
        metrics["cpu_per_dm_us_with_children"] = clock.per_item_us(n, children=True)
    return metrics


def _shares(pairs: list[tuple[str, str]], senders: int) -> list[list[tuple[str, str]]]:
    return [pairs[i::senders] for i in range(senders)]


# ── scenarios ────────────────────────────────────────────────────────────────


@scenario(
    "local-roundtrip",
    "messaging machinery: one sender, one target, sequential (send, wait for the outcome, repeat); ours runs "
    "an in-process turn, the seed model spawns a process per DM — so the ratio is machinery + process start",
)
def local_roundtrip(ctx: BenchContext) -> ScenarioResult:
    """Latency of one DM end to end, nothing else in flight."""
    root = ctx.workdir / "root"
    sender, target = write_root(root, 2)
    results: dict[str, dict[str, Any]] = {}
    samples: dict[str, list[float]] = {}
    for side, factory, n in (
        ("ours", our_system, ctx.count(1000, 20000, minimum=5)),
        ("baseline", baseline_system, ctx.count(20, 150, minimum=3)),
    ):
        def drive(system: System, n: int = n) -> Run:
            return sequential_roundtrip(system, sender, target, n, ctx.progress)

        results[side] = _measure(ctx, "local-roundtrip", side, factory, root, n, drive, samples)
    return ScenarioResult(results["ours"], results["baseline"], samples)


@scenario(
    "local-roundtrip-subprocess",
    "end to end, like for like: as `local-roundtrip`, but ours runs the very same `python -c` turn process "
    "per DM as the seed model (same command, same query file); the ratio is what the machinery saves "
    "when both sides pay a process per turn",
)
def local_roundtrip_subprocess(ctx: BenchContext) -> ScenarioResult:
    """Latency of one DM end to end when both sides spawn the same turn process."""
    root = ctx.workdir / "root"
    sender, target = write_root(root, 2)
    results: dict[str, dict[str, Any]] = {}
    samples: dict[str, list[float]] = {}

    def ours_factory(path: Path) -> Gateway:
        return our_system(path, runner=subprocess_reply)

    n = ctx.count(20, 150, minimum=3)
    for side, factory in (("ours", ours_factory), ("baseline", baseline_system)):
        def drive(system: System) -> Run:
            return sequential_roundtrip(system, sender, target, n, ctx.progress)

        results[side] = _measure(ctx, "local-roundtrip-subprocess", side, factory, root, n, drive, samples)
    return ScenarioResult(results["ours"], results["baseline"], samples)


@scenario(
    "local-throughput",
    "messaging machinery (ours: in-process turn; seed model: a process per DM): 8 sender threads over "
    "100 profiles send without waiting; outcomes counted through `subscribe`; "
    "throughput = DMs / (first send → last outcome); `cpu_per_dm_us` = this process's CPU per DM; ours runs "
    "3 times (fresh gateway each) and reports the run of median throughput, all three listed",
)
def local_throughput(ctx: BenchContext) -> ScenarioResult:
    """Sustained DM rate with many profiles busy at once."""
    root = ctx.workdir / "root"
    profiles = write_root(root, 100)
    senders = 8
    results: dict[str, dict[str, Any]] = {}
    samples: dict[str, list[float]] = {}
    for side, factory, n, repeats in (
        ("ours", our_system, ctx.count(2000, 20000, minimum=16), 1 if ctx.quick else THROUGHPUT_RUNS),
        ("baseline", baseline_system, ctx.count(24, 160, minimum=8), 1),
    ):
        # DM i goes from profile i to profile i+1 (mod 100): every profile sends and receives.
        pairs = [(profiles[i % 100], profiles[(i + 1) % 100]) for i in range(n)]

        def drive(system: System, pairs: list[tuple[str, str]] = pairs) -> Run:
            return pipelined(system, _shares(pairs, senders), ctx.progress)

        runs: list[tuple[dict[str, Any], list[float]]] = []
        for _ in range(repeats):
            run_samples: dict[str, list[float]] = {}
            runs.append((_measure(ctx, "local-throughput", side, factory, root, n, drive, run_samples),
                         run_samples[side]))
        results[side], samples[side] = median_run(runs)
    return ScenarioResult(results["ours"], results["baseline"], samples)


def median_run(runs: list[tuple[dict[str, Any], list[float]]]) -> tuple[dict[str, Any], list[float]]:
    """The run of median throughput, whole (its CPU, split and latencies stay together), listing every run.

    On 2 cores the same load lands in a batched regime (~35 µs of CPU per DM) or one where
    every hand-off wakes a thread (~150 µs), from one run to the next: one run is one draw.

    Args:
        runs: each run's metrics and raw latencies.

    Returns:
        The median run's metrics, with ``runs`` (every run's throughput and CPU per DM, in
        the order run) when there was more than one, and its latencies.
    """
    ranked = sorted(runs, key=lambda run: float(run[0]["throughput_per_s"]))
    metrics, latencies = ranked[(len(ranked) - 1) // 2]
    if len(runs) > 1:
        metrics = {**metrics, "runs": [{"throughput_per_s": m["throughput_per_s"],
                                        "cpu_per_dm_us": m["cpu_per_dm_us"]} for m, _ in runs]}
    return metrics, latencies


@scenario("fan-in", "64 senders DM one profile at the same moment, in rounds: the cost of serializing its turns")
def fan_in_scenario(ctx: BenchContext) -> ScenarioResult:
    """Many senders contend for one profile's single turn at a time."""
    root = ctx.workdir / "root"
    profiles = write_root(root, 65)
    target, senders = profiles[0], profiles[1:]
    results: dict[str, dict[str, Any]] = {}
    samples: dict[str, list[float]] = {}
    for side, factory, rounds in (
        ("ours", our_system, ctx.count(10, 300)),
        ("baseline", baseline_system, ctx.count(1, 3)),
    ):
        def drive(system: System, rounds: int = rounds) -> Run:
            return fan_in(system, senders, target, rounds, ctx.progress)

        results[side] = _measure(ctx, "fan-in", side, factory, root, rounds * len(senders), drive, samples)
    return ScenarioResult(results["ours"], results["baseline"], samples)


def _wait_idle(gateway: Gateway, limit_s: float) -> None:
    """Wait (bounded) until every idle ProfileActor has stopped."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and gateway.stats().get("active_profiles", 0) > 0:
        time.sleep(0.1)


def _scale_phase(ctx: BenchContext, root: Path, targets: list[str], n: int, label: str) -> tuple[Run, dict[str, Any]]:
    """One scale phase on a fresh gateway: ``n`` pipelined DMs from ``default`` over ``targets``.

    Returns:
        The run and its resources: start time, threads at start, peak RSS / threads
        during the load, CPU per DM (and by thread group, ``cpu_split_us``: the
        ProfileActors' share is what grows with the spread), and RSS / threads once idle
        ProfileActors stopped.
    """
    pairs = [("default", targets[i % len(targets)]) for i in range(n)]
    gateway = our_system(root)
    t0 = time.perf_counter()
    gateway.start()
    start_s = time.perf_counter() - t0
    threads_at_start = threading.active_count()
    try:
        ctx.progress.note(f"scale: gateway start with the root's profiles took {start_s:.2f}s")
        with ResourceSampler() as sampler, _phase(ctx, f"scale ours, {label}", n):
            clock = CpuClock().start()
            threads = ThreadCpu().start()
            run = pipelined(gateway, _shares(pairs, 4), ctx.progress)
            threads.stop()
            clock.stop()
        idle_limit = float(BENCH_CONFIG["bot_mode"]["idle_stop_seconds"]) + 3.0
        _wait_idle(gateway, idle_limit)
        threads_after = threading.active_count()
        workers_after = int(gateway.stats().get("worker_threads", 0))
        rss_after_kb = read_proc_status_kb("VmRSS")
    finally:
        gateway.stop()
    return run, {
        "active_profiles": len(targets),
        "start_s": round(start_s, 3),
        "threads_at_start": threads_at_start,
        "rss_mb": round(sampler.peak_rss_mb, 1),
        "threads": sampler.peak_threads,
        "cpu_per_dm_us": clock.per_item_us(n),
        "cpu_split_us": _cpu_split(run, threads, n),
        "rss_mb_after": round(rss_after_kb / 1024.0, 1) if rss_after_kb else None,
        "threads_after": threads_after,
        "worker_threads_after": workers_after,
    }


@scenario(
    "scale",
    "10,000 registered profiles; the same pipelined load (4 senders) spread over 100 and then over 1,000 "
    "distinct active profiles, each on a fresh gateway: throughput side by side, peak RSS and thread count "
    "during the load and after idle ProfileActors stopped (ours only)",
)
def scale(ctx: BenchContext) -> ScenarioResult:
    """Ours only: does a large roster and a thousand active bots stay cheap, and as fast as a hundred?"""
    registered = ctx.count(10_000, 10_000, minimum=20)
    active = min(registered, ctx.count(1_000, 1_000, minimum=10))
    few = max(1, min(active, ctx.count(100, 100, minimum=2)))
    n = max(active, ctx.count(2_000, 10_000, minimum=20))
    root = ctx.workdir / "root"
    with _phase(ctx, f"scale: write {registered} profiles", registered):
        profiles = write_root(root, registered)
    many_targets = profiles[:: max(1, registered // active)][:active]
    few_targets = profiles[:: max(1, registered // few)][:few]
    few_run, few_res = _scale_phase(ctx, root, few_targets, n, f"{few} active")
    run, res = _scale_phase(ctx, root, many_targets, n, f"{active} active")
    ours = summarize(run.latencies_s, run.wall_s)
    ours.update(registered=registered, **res)
    ours["fewer_active"] = {**summarize(few_run.latencies_s, few_run.wall_s), **few_res}
    few_rate = float(ours["fewer_active"]["throughput_per_s"])
    ours["throughput_vs_fewer"] = round(float(ours["throughput_per_s"]) / few_rate, 3) if few_rate > 0 else None
    if few == 100 and active == 1_000:  # what a thread per actor costs by itself, under the same spread
        with _phase(ctx, "scale: bare pykka actors, 100 vs 1000", 2 * n):
            ours["pykka_floor"] = measure_spread_floor(n)
    return ScenarioResult(ours, None, {"ours": run.latencies_s, f"ours {few} active": few_run.latencies_s})
