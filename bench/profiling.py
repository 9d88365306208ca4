"""Profile a scenario across *all* threads: ``python -m bench.profiling local-throughput``.

``cProfile`` only sees the thread that enabled it, and hermes-actors does its
work on actor, worker and notifier threads. This wraps ``threading.Thread.run``
so every thread started while profiling gets its own profiler, then merges
the finished threads' stats with the main thread's and prints the top
functions by cumulative time.
"""

from __future__ import annotations

import argparse
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
from hermes_actors.cli.arg_types import Parser
from hermes_actors.core.clipping import shown

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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of ``python -m bench.profiling``.

    Args:
        argv: the arguments (``sys.argv[1:]`` when None).

    Returns:
        The parsed arguments: ``scenario``, ``top``, ``cpu``.

    Raises:
        SystemExit: with status 2 and argparse's message naming the bad
            argument (an unknown scenario lists the known ones).
    """
    parser = Parser(  # its errors name a huge value cut, not whole
        prog="python -m bench.profiling",
        description="Profile one scenario across all threads (quick counts; the whole "
        "scenario runs, baseline included: pick ours-only views from the listing).",
    )
    parser.add_argument("scenario", nargs="?", default="local-throughput",
                        choices=sorted(REGISTRY), metavar="SCENARIO",
                        help="the scenario to profile (default: local-throughput); one of: "
                        + ", ".join(sorted(REGISTRY)))
    parser.add_argument("top", nargs="?", type=_positive_int, default=15, metavar="TOP",
                        help="how many functions to list (default: 15)")
    parser.add_argument("--cpu", action="store_true",
                        help="time each thread's CPU clock and sort by own time, "
                        "instead of the wall clock and cumulative time")
    return parser.parse_args(argv)


_MAX_TOP = 10_000


def _positive_int(text: str) -> int:
    digits = text.strip()
    if not digits.isascii() or not digits.isdigit():
        raise argparse.ArgumentTypeError(f"TOP must be a whole number, not {shown(text)}")
    # the length first: int() of 5,000 digits raises
    if len(digits) > len(str(_MAX_TOP)) or not 1 <= int(digits) <= _MAX_TOP:
        raise argparse.ArgumentTypeError(f"TOP must be from 1 to {_MAX_TOP:,}, not {shown(text)}")
    return int(digits)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.profiling [SCENARIO] [TOP] [--cpu]``: profile a scenario (quick counts).

    Args:
        argv: the arguments (``sys.argv[1:]`` when None).

    Returns:
        The exit status: 0, or 130 after a Ctrl-C.
    """
    args = parse_args(argv)
    try:
        _profile(args)
    except KeyboardInterrupt:  # Ctrl-C: the run is dropped, nothing was written
        print("interrupted: no profile printed", file=sys.stderr)
        return 130
    return 0


def _profile(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="hermes-bench-profile-") as tmp:
        ctx = BenchContext(quick=True, scale=1.0, workdir=Path(tmp), progress=NullProgress())
        scenario = REGISTRY[args.scenario]
        print(profile_all_threads(lambda: scenario.fn(ctx), top=args.top, cpu=args.cpu,
                                  sort="tottime" if args.cpu else "cumulative"))


if __name__ == "__main__":
    sys.exit(main())
