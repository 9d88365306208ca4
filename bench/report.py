"""Render results: the terminal table and the ``docs/benchmarks.md`` page.

Both are pure functions of a result dict (the JSON the harness writes), so a
page can be regenerated from any stored result:

    python -m bench.report bench/results/20260101T120000Z.json > docs/benchmarks.md

The "Details" lines are :mod:`bench.detail_lines`', the targets :mod:`bench.targets`';
every figure is printed by :func:`bench.figures.num`.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from bench.detail_lines import extra_lines, resource_lines
from bench.figures import num
from bench.registry import REGISTRY
from bench.targets import evaluate_targets

#: Hand-written notes on where the time goes (from a CPU profile), included in the page.
LIMITS_FILE = Path(__file__).resolve().parent / "limits.md"

__all__ = ["LIMITS_FILE", "render_markdown", "render_table", "write_docs"]

_COLUMNS = (
    "scenario", "ours n", "ours p50 ms", "ours p99 ms", "ours /s",
    "base n", "base p50 ms", "base p99 ms", "base /s", "p50 ratio", "thr ratio",
)


def _row(name: str, entry: dict[str, Any]) -> list[str]:
    ours, base, ratio = entry.get("ours"), entry.get("baseline"), entry.get("ratio")
    if not ours:  # skipped (the reason is on its own line below the table)
        return [name, "skipped", *(["—"] * (len(_COLUMNS) - 2))]
    cells = [name, num(ours["n"]), num(ours["p50_ms"], 3), num(ours["p99_ms"], 3), num(ours["throughput_per_s"])]
    if base:
        cells += [num(base["n"]), num(base["p50_ms"]), num(base["p99_ms"]), num(base["throughput_per_s"])]
    else:
        cells += ["—"] * 4
    if ratio:
        cells += [f"{ratio['p50']:.1f}x", f"{ratio['throughput']:.1f}x"]
    else:
        cells += ["—", "—"]
    return cells


def render_table(result: dict[str, Any]) -> str:
    """A fixed-width text table of every scenario (ratios: baseline p50 / ours p50, ours/baseline rate)."""
    rows = [list(_COLUMNS)] + [_row(name, entry) for name, entry in result["scenarios"].items()]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]

    def fmt(row: list[str]) -> str:
        return "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths,
                                                                                                   strict=True)))

    lines = [fmt(rows[0]), "  ".join("-" * w for w in widths)] + [fmt(row) for row in rows[1:]]
    extras = resource_lines(result) + extra_lines(result)
    targets = evaluate_targets(result)
    if targets:
        tw = max(len(t[0]) for t in targets)
        mw = max(len(t[2]) for t in targets)
        extras += ["", "targets:"] + [f"  {goal.ljust(tw)}  {measured.rjust(mw)}  {status}"
                                      for goal, _, measured, status in targets]
    return "\n".join(lines + (["", *extras] if extras else []))


def _targets_markdown(result: dict[str, Any]) -> str:
    rows = evaluate_targets(result)
    met = sum(1 for row in rows if row[3] == "met")
    body = "".join(
        f"| {goal} | `{name}` | {measured} | {'met' if status == 'met' else f'**{status}**'} |\n"
        for goal, name, measured, status in rows
    )
    return (
        f"## Targets\n\n{met} of {len(rows)} met in this run (computed from the result JSON by "
        "`bench/report.py`).\n\n| target | scenario | measured | status |\n|:---|:---|---:|:---|\n" + body
    )


def render_markdown(result: dict[str, Any], plot_path: str | None = "benchmarks.png",
                    source: str | None = None, limits: str | None = None) -> str:
    """The ``docs/benchmarks.md`` page for ``result``.

    Args:
        result: the result dict.
        plot_path: the plot's path relative to the page (None: no plot).
        source: the result JSON's path, named on the page.
        limits: the "Limits" section's Markdown (default: :data:`LIMITS_FILE` when it exists).
    """
    machine = result.get("machine", {})
    head = "| " + " | ".join(_COLUMNS) + " |\n|" + "|".join(
        ":---" if i == 0 else "---:" for i in range(len(_COLUMNS))) + "|\n"
    body = "".join("| " + " | ".join(_row(name, entry)) + " |\n" for name, entry in result["scenarios"].items())
    resources = resource_lines(result)
    parts = [
        "# Benchmarks\n",
        "hermes-actors (`ours`) against `bench/baseline/`, a small model of the seed design's\n"
        "delivery mechanism (`base`): one subprocess per delivery, the per-profile `flock` taken\n"
        "by non-blocking attempts polled every 100 ms, and the relay reply file polled every 250 ms.\n\n"
        "**What each ratio compares.** In `local-roundtrip`, `local-throughput`, `fan-in` and\n"
        "`durable-throughput` ours runs an *in-process* turn (a callable returning `ok`, declared\n"
        "`blocking=False`, so it runs inline on the ProfileActor as an embedder's non-blocking runner\n"
        "would) while the seed model spawns a `python -c` process per DM: those ratios measure our\n"
        "messaging machinery\n"
        "against the seed's machinery *plus its process start* — they flatter us. `local-roundtrip-subprocess`\n"
        "is the like-for-like end-to-end one: both sides run the very same turn process per DM.\n"
        "`hermes-roundtrip` is what users feel: the real `hermes` (hermes-agent 0.19) against an instant\n"
        "local fake model, a DM round trip (bob's turn + alice's wake-up) with our warm turns vs the seed's\n"
        "`hermes chat` process per turn and its polling. The local scenarios run ours on its in-memory\n"
        "path (`durable=False`): the seed journals nothing there either; the journal's cost is\n"
        "`durable-throughput`. `relay-roundtrip` runs ours as three processes, as in production: the\n"
        "sending gateway, the relay hub (`hermes-actors relay`) and the far gateway\n"
        "(`bench/relay_peer.py`); its baseline models the seed's envelope files, a Desktop that drains\n"
        "the outbox every 50 ms (the seed leaves the cadence to the Desktop; 50 ms favours the baseline),\n"
        "a subprocess turn on the far side and the 250 ms reply-file waiter.\n\n"
        "**CPU per DM** (`cpu_per_dm_us`) is this process's CPU (user + system, every thread, senders and\n"
        "subscriber callbacks included) while the driver ran, divided by the DMs; the **floor** is the CPU\n"
        "of one pykka `ask` round trip (`floors.pykka_ask_cpu_us`), measured in the same process before\n"
        "and after the scenarios (the lower of the two), with the caller and the actor pinned to the two\n"
        "CPUs: the hop an actor system pays when a message wakes a thread on the other CPU. Pinned to one\n"
        "CPU the same ask costs about half (reported beside it, with a pipelined ask); an unpinned pair\n"
        "lands either way, so an unpinned floor flipped the CPU target between runs of one tree.\n",
        "> **Read the ratios, not the absolute numbers.** Every figure below was measured\n"
        "> side by side in one run on a small, noisy 2-core machine; absolute latencies move from\n"
        "> run to run, the ratios much less. `p50 ratio` = baseline p50 / ours p50; `thr ratio` = ours\n"
        "> throughput / baseline throughput. Baseline runs use far fewer DMs (it spends a\n"
        "> subprocess per DM); `n` is reported for each side.\n",
        "## Results\n",
        head + body,
    ]
    load, cpus = machine.get("load_avg_1m_at_start"), machine.get("cpu_count")
    if isinstance(load, int | float) and isinstance(cpus, int) and load > cpus:
        parts.insert(-2, (
            f"> **This run shared the machine:** the 1-minute load average was {load:.1f} on {cpus} CPUs\n"
            "> when it started (other jobs were running), so absolute latencies and rates are pessimistic.\n"
        ))
    extras = resources + extra_lines(result)
    if extras:
        parts.append("Details (ours):\n\n" + "".join(f"- {line}\n" for line in extras))
    described = [(name, REGISTRY[name].description) for name in result["scenarios"] if name in REGISTRY]
    if described:
        parts.append("Scenarios:\n\n" + "".join(f"- `{name}` — {text}\n" for name, text in described))
    parts.append(
        "Latency is measured from the start of the `message_agent` call to the outcome. In the\n"
        "pipelined scenarios (`local-throughput`, `durable-throughput`, `scale`) every DM is sent up\n"
        "front, so latency includes queueing behind the DMs sent before it and grows with `n`; since\n"
        "the baseline runs"
        " a much smaller `n`, read the throughput ratio there, not the p50 ratio.\n"
    )
    parts.append(_targets_markdown(result))
    if plot_path:
        parts.append(f"## Plot\n\n![latency CDFs and throughput]({plot_path})\n")
    if limits is None and LIMITS_FILE.exists():
        limits = LIMITS_FILE.read_text(encoding="utf-8")
    if limits:
        parts.append(limits.rstrip("\n") + "\n")
    rows = "".join(f"| {key} | {value} |\n" for key, value in machine.items())
    parts.append("## Machine\n\n| key | value |\n|:---|:---|\n" + rows)
    regen = ("Regenerate with `hermes-actors bench` (a full run takes about 20 minutes on 2 cores: 10 of them are "
             "the `sustained` scenario, a few the real-Hermes one); `--quick` and `--scenario` runs never touch "
             "this page.")
    parts.append(regen + (f" Source: `{source}`." if source else "") + "\n")
    return "\n".join(parts)


def write_docs(result: dict[str, Any], plot: Path | None, docs_dir: Path, source: str | None = None) -> Path:
    """Write ``docs_dir/benchmarks.md`` and copy the plot to ``docs_dir/benchmarks.png``.

    Returns:
        The Markdown file's path.
    """
    docs_dir.mkdir(parents=True, exist_ok=True)
    plot_rel = None
    if plot is not None and plot.exists():
        shutil.copyfile(plot, docs_dir / "benchmarks.png")
        plot_rel = "benchmarks.png"
    page = docs_dir / "benchmarks.md"
    page.write_text(render_markdown(result, plot_rel, source), encoding="utf-8")
    return page


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.report RESULT_JSON``: print the page of a stored result on stdout.

    Args:
        argv: the arguments (``sys.argv[1:]`` when None).

    Returns:
        The exit code (0).

    Raises:
        SystemExit: 2 naming the file when it cannot be read or is not a result the harness wrote; 0 for ``--help``.
    """
    import bench.scenarios  # noqa: F401  (registers the scenario descriptions)
    from hermes_actors.cli.arg_types import Parser
    from hermes_actors.core.clipping import shown

    parser = Parser(prog="python -m bench.report",
                    description="Render docs/benchmarks.md's text from a result the harness wrote, on stdout "
                    "(e.g. python -m bench.report bench/results/20260101T120000Z.json > docs/benchmarks.md).")
    parser.add_argument("result", metavar="RESULT_JSON", help="a result file the harness wrote (bench/results/*.json)")
    args = parser.parse_args(argv)
    try:
        with open(args.result, encoding="utf-8") as fh:
            result = json.load(fh)
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        parser.error(f"cannot read the result {shown(args.result)}: {reason}")
    if not isinstance(result, dict) or not isinstance(result.get("scenarios"), dict):
        parser.error(f"{shown(args.result)} is not a result the harness wrote (no \"scenarios\" object in it)")
    sys.stdout.write(render_markdown(result, source=args.result))  # the page names its result file, as a full run's
    return 0


if __name__ == "__main__":  # pragma: no cover — manual regeneration
    sys.exit(main())
