"""Profile a scenario across *all* threads: ``python -m bench.profiling local-throughput``.

``cProfile`` only sees the thread that enabled it, and hermes-actors does its
work on actor, worker and notifier threads. This wraps ``threading.Thread.run``
so every thread started while profiling gets its own profiler, then merges
the finished threads' stats with the main thread's and prints the top
functions by cumulative time.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench.scenarios  # noqa: F401  (registers every scenario)
from bench.progress import NullProgress
from bench.registry import REGISTRY, BenchContext

__all__ = ["profile_all_threads"]


def profile_all_threads(
    fn: Callable[[], Any], top: int = 15, sort: str = "cumulative", cpu: bool = False
) -> str:
    """Run ``fn`` with every new thread profiled; the merged pstats summary text.

    Args:
        fn: the workload.
        top: how many functions to list.
        sort: the pstats sort key.
        cpu: time with each thread's CPU clock (``time.thread_time``) instead
            of the wall clock, so time spent blocked (locks, sleeps, the GIL)
            does not count.
    """
    timer: Callable[[], float] = time.thread_time if cpu else time.perf_counter
    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()
    original_run = threading.Thread.run

    def profiled_run(self: threading.Thread) -> None:
        profiler = cProfile.Profile(timer)
        profiler.enable()
        try:
            original_run(self)
        finally:
            profiler.disable()
            with lock:
                profiles.append(profiler)

    main = cProfile.Profile(timer)
    threading.Thread.run = profiled_run  # type: ignore[method-assign]
    try:
        main.enable()
        try:
            fn()
        finally:
            main.disable()
    finally:
        threading.Thread.run = original_run  # type: ignore[method-assign]
    out = io.StringIO()
    with lock:
        finished = list(profiles)
    stats = pstats.Stats(main, stream=out)
    for profiler in finished:
        stats.add(profiler)
    out.write(f"threads profiled: {len(finished)} (+ main)\n")
    stats.sort_stats(sort).print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.profiling [SCENARIO] [TOP] [--cpu]``: profile a scenario (quick counts).

    The whole scenario runs, baseline included; pick ``ours``-only views from the listing.
    """
    args = sys.argv[1:] if argv is None else argv
    cpu = "--cpu" in args
    args = [a for a in args if a != "--cpu"]
    name = args[0] if args else "local-throughput"
    top = int(args[1]) if len(args) > 1 else 15
    with tempfile.TemporaryDirectory(prefix="hermes-bench-profile-") as tmp:
        ctx = BenchContext(quick=True, scale=1.0, workdir=Path(tmp), progress=NullProgress())
        print(profile_all_threads(lambda: REGISTRY[name].fn(ctx), top=top, cpu=cpu,
                                  sort="tottime" if cpu else "cumulative"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
