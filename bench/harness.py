"""The benchmark harness: ``hermes-actors bench [--quick] [--scenario NAME ...] [--sustained-seconds S] [--out DIR]``.

Runs the registered scenarios (:mod:`bench.scenarios`), ours and the
seed-design baseline side by side in one process, shows a progress bar on
stderr, prints a table, and writes ``<out>/<UTC timestamp>.json`` shaped::

    {"machine": {...},
     "floors": {"pykka_ask_cpu_us", "pykka_ask_wall_us", "pykka_ask_n", "placement", "by_placement",
                "pykka_pipelined_ask_cpu_us", "samples_cpu_us"},
     "scenarios": {NAME: {"ours": M, "baseline": M | null,
                          "ratio": {"p50": base_p50 / ours_p50,
                                    "throughput": ours / base} | null}}}

with ``M = {"n", "throughput_per_s", "p50_ms", "p95_ms", "p99_ms", "max_ms"}``
(plus ``cpu_per_dm_us``, ``rss_mb``, ``threads`` … where measured), and a PNG
plot next to it. ``floors`` is the CPU of one pykka ``ask`` round trip, measured
before and after the scenarios in the same process (each figure the lower of
the two) with the caller and the actor pinned to two CPUs (the floor) and to
one (``by_placement``), and of a pipelined ask, so ``local-throughput``'s
``cpu_per_dm_us`` can be read as a multiple of them. A
scenario that cannot run on this machine (``redis-roundtrip`` without
``redis-server``) is written as ``{"ours": null, "baseline": null, "ratio": null,
"skipped": REASON}``. Only a full run — not ``--quick``, and every scenario,
no ``--scenario`` — regenerates ``docs/benchmarks.md`` and ``docs/benchmarks.png``.

``HERMES_BENCH_TINY=1`` shrinks every count (for the smoke test).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bench.scenarios  # noqa: F401  (registers every scenario)
from bench.floors import measure_floors
from bench.measure import machine_info
from bench.plot import plot_results
from bench.progress import NullProgress, Progress
from bench.registry import REGISTRY, BenchContext
from bench.report import render_table, write_docs
from hermes_actors.cli.arg_types import MAX_SUSTAINED_SECONDS, Parser, sustained_seconds, user_path
from hermes_actors.core.clipping import shown

__all__ = ["DEFAULT_OUT", "MAX_SUSTAINED_SECONDS", "TINY_SCALE", "check_scenarios", "main", "results_dir", "run_bench",
           "run_command"]

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = BENCH_DIR / "results"
DEFAULT_DOCS = BENCH_DIR.parent / "docs"
TINY_SCALE = 0.02


def _scale_from_env() -> float:
    """The count multiplier: ``HERMES_BENCH_TINY=1`` → :data:`TINY_SCALE`, else 1."""
    return TINY_SCALE if os.environ.get("HERMES_BENCH_TINY", "").strip() not in ("", "0") else 1.0


def _ratio(ours: dict[str, Any], base: dict[str, Any] | None) -> dict[str, float] | None:
    if not base or ours["p50_ms"] <= 0 or base["throughput_per_s"] <= 0:
        return None
    return {
        "p50": round(base["p50_ms"] / ours["p50_ms"], 3),
        "throughput": round(ours["throughput_per_s"] / base["throughput_per_s"], 3),
    }


def _timestamp_path(out_dir: Path, stamp: str, suffix: str) -> Path:
    path = out_dir / f"{stamp}{suffix}"
    n = 1
    while path.exists():
        path, n = out_dir / f"{stamp}-{n}{suffix}", n + 1
    return path


def run_bench(
    quick: bool,
    scenarios: list[str] | None,
    out_dir: Path,
    progress: bool = True,
    *,
    scale: float | None = None,
    docs_dir: Path | None = None,
    sustained_s: float | None = None,
) -> dict[str, Any]:
    """Run scenarios, print the table, write the result JSON and the plot.

    Args:
        quick: small counts (the whole quick run stays under a minute on 2 cores).
        scenarios: names to run, in registry order; None or empty: all. A run that
            names scenarios never writes the docs page (it would drop the others).
        out_dir: where ``<UTC timestamp>.json`` and ``.png`` go.
        progress: draw the progress bar on stderr.
        scale: count multiplier (default: from ``HERMES_BENCH_TINY``).
        docs_dir: where a full run of all scenarios writes ``benchmarks.md`` / ``.png`` (default: ``docs/``).
        sustained_s: how long the ``sustained`` scenario holds its load (None: 600 s full, 10 s quick).

    Returns:
        The result dict, as written to the JSON file.

    Raises:
        ValueError: an unknown scenario name.
    """
    check_scenarios(scenarios)
    wanted = list(scenarios or REGISTRY)
    names = [name for name in REGISTRY if name in wanted]
    bar: Progress = Progress() if progress else NullProgress()
    factor = _scale_from_env() if scale is None else scale
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    result: dict[str, Any] = {"machine": machine_info(), "floors": {}, "scenarios": {}}
    samples: dict[str, dict[str, list[float]]] = {}
    started = time.perf_counter()
    asks = max(500, round((5_000 if quick else 20_000) * factor))
    floors = [measure_floors(asks)]
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"hermes-bench-{name}-") as tmp:
            ctx = BenchContext(quick=quick, scale=factor, workdir=Path(tmp), progress=bar, sustained_s=sustained_s)
            outcome = REGISTRY[name].fn(ctx)
        if outcome.skipped is not None:
            result["scenarios"][name] = {"ours": None, "baseline": None, "ratio": None, "skipped": outcome.skipped}
            print(f"{name}: skipped — {outcome.skipped}", file=sys.stderr)
        else:
            result["scenarios"][name] = {
                "ours": outcome.ours,
                "baseline": outcome.baseline,
                "ratio": _ratio(outcome.ours, outcome.baseline),
            }
        samples[name] = outcome.samples
    floors.append(measure_floors(asks))
    result["floors"] = combine_floors(floors)
    elapsed = time.perf_counter() - started

    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = _timestamp_path(out_dir, stamp, ".json")
    json_path.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    png_path: Path | None = json_path.with_suffix(".png")
    assert png_path is not None
    if plot_results(result, samples, png_path) is None:
        warnings.warn("matplotlib is not installed: skipping the plot (pip install 'hermes-actors[bench]')",
                      stacklevel=2)
        png_path = None

    print(render_table(result))
    print(f"\n{'quick' if quick else 'full'} run: {len(names)} scenario(s) in {elapsed:.1f}s", file=sys.stderr)
    print(f"results: {json_path}" + (f"\nplot:    {png_path}" if png_path else ""), file=sys.stderr)
    if quick or scenarios:
        print("docs:    not regenerated (only a full run of every scenario, without --quick or --scenario, "
              "rewrites docs/benchmarks.md)", file=sys.stderr)
    else:
        try:
            source = str(json_path.relative_to(BENCH_DIR.parent))
        except ValueError:
            source = str(json_path)
        page = write_docs(result, png_path, docs_dir or DEFAULT_DOCS, source)
        print(f"docs:    {page}", file=sys.stderr)
    return result


def check_scenarios(scenarios: list[str] | None) -> None:
    """Refuse a scenario name the registry does not know.

    Args:
        scenarios: the names asked for (None: all).

    Raises:
        ValueError: naming each unknown one (a huge one cut) and the known ones.
    """
    unknown = [name for name in scenarios or () if name not in REGISTRY]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(shown(name) for name in unknown)}; known: "
                         f"{', '.join(REGISTRY)}")


def build_parser(prog: str = "hermes-actors bench") -> argparse.ArgumentParser:
    """The ``bench`` command's arguments.

    Args:
        prog: the command as the user typed it (``python -m bench`` runs the same parser).

    Returns:
        The parser.
    """
    parser = Parser(  # its errors name a huge --scenario or --sustained-seconds cut, not whole
        prog=prog,
        description="Benchmark hermes-actors against a model of the seed design, side by side.",
    )
    parser.add_argument("--quick", action="store_true", help="small counts: finishes in under a minute")
    # no `choices=`: an unknown name is refused by check_scenarios, the one rule and text of both entries
    parser.add_argument("--scenario", action="append", metavar="NAME",
                        help=f"run only this scenario (repeatable): {', '.join(REGISTRY)}")
    parser.add_argument("--out", type=user_path, default=DEFAULT_OUT, metavar="DIR",
                        help=f"where the JSON and PNG go (default: {DEFAULT_OUT})")
    parser.add_argument("--sustained-seconds", type=sustained_seconds, default=None, metavar="S",
                        help="how long the `sustained` scenario holds its fixed rate (default: 600 full, 10 quick; "
                        f"at most {MAX_SUSTAINED_SECONDS:,.0f})")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return parser


def results_dir(path: Path) -> Path:
    """``--out``, created when missing and shown to take a file: checked before the scenarios run for minutes,
    not when their results are written.

    Args:
        path: the ``--out`` directory.

    Returns:
        The directory.

    Raises:
        ValueError: it cannot be created or written, naming the path and the system's reason.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):  # a real write: permission bits say nothing to root or a read-only mount
            pass
    except OSError as exc:
        # os.path's exists, not Path's: a name too long raises from Path.exists() (exit 1, the name whole)
        is_file = os.path.exists(path) and not os.path.isdir(path)
        reason = "it is a file, not a directory" if is_file else exc.strerror or str(exc)
        raise ValueError(f"--out {shown(str(path))} must be a directory bench can create and write its results in "
                         f"({reason})") from None
    return path


def main(argv: list[str] | None = None, prog: str = "hermes-actors bench") -> int:
    """CLI entry: parse ``argv`` (default ``sys.argv[1:]``), run, return the exit code.

    Args:
        argv: the arguments.
        prog: the command as the user typed it, for the usage and error lines.

    Returns:
        The exit code (0).

    Raises:
        SystemExit: a bad argument (2, naming it) or ``--help`` (0).
    """
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        return run_command(args.quick, args.scenario, args.out, progress=not args.no_progress,
                           sustained_s=args.sustained_seconds)
    except ValueError as exc:  # a bad argument: exit 2 with the usage, whatever the OS error was
        parser.error(str(exc))


def run_command(quick: bool, scenarios: list[str] | None, out: Path | None, *, progress: bool,
                sustained_s: float | None) -> int:
    """The ``bench`` command once its arguments are parsed (``hermes-actors bench`` and ``python -m bench``): the
    values themselves, never written back out as arguments for another parse.

    Args:
        quick: ``--quick``.
        scenarios: ``--scenario`` (None: all).
        out: ``--out`` (None: :data:`DEFAULT_OUT`).
        progress: draw the progress bar (not ``--no-progress``).
        sustained_s: ``--sustained-seconds`` (None: the scenario's default).

    Returns:
        The exit code (0).

    Raises:
        ValueError: an unknown scenario, or an ``--out`` that cannot be created or written, before any scenario runs.
    """
    check_scenarios(scenarios)
    directory = results_dir(DEFAULT_OUT if out is None else out)
    run_bench(quick, scenarios, directory, progress=progress, sustained_s=sustained_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def combine_floors(floors: list[dict[str, Any]]) -> dict[str, Any]:
    """Pure: the ``floors`` block from the samples taken before and after the scenarios: each figure the
    lowest of its samples (the floor a noisy moment did not inflate), with the samples listed."""
    best = min(floors, key=lambda f: f["pykka_ask_cpu_us"])
    by_placement: dict[str, Any] = {}
    for sample in floors:
        for name, figures in (sample.get("by_placement") or {}).items():
            if name not in by_placement or figures["cpu_us"] < by_placement[name]["cpu_us"]:
                by_placement[name] = figures
    pipelined = [f["pykka_pipelined_ask_cpu_us"] for f in floors if f.get("pykka_pipelined_ask_cpu_us") is not None]
    return {**best, "by_placement": by_placement,
            "pykka_pipelined_ask_cpu_us": min(pipelined) if pipelined else None,
            "samples_cpu_us": [f["pykka_ask_cpu_us"] for f in floors]}
