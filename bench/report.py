"""Render results: the terminal table and the ``docs/benchmarks.md`` page.

Both are pure functions of a result dict (the JSON the harness writes), so a
page can be regenerated from any stored result:

    python -m bench.report bench/results/20260101T120000Z.json > docs/benchmarks.md
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from bench.registry import REGISTRY

__all__ = ["render_markdown", "render_table", "write_docs"]

_COLUMNS = (
    "scenario", "ours n", "ours p50 ms", "ours p99 ms", "ours /s",
    "base n", "base p50 ms", "base p99 ms", "base /s", "p50 ratio", "thr ratio",
)


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, int):
        return str(value)
    number = float(value)
    if number >= 1000:
        return f"{number:,.0f}"
    if number >= 100:
        return f"{number:.1f}"
    return f"{number:.{digits}f}"


def _row(name: str, entry: dict[str, Any]) -> list[str]:
    ours, base, ratio = entry["ours"], entry.get("baseline"), entry.get("ratio")
    cells = [name, _num(ours["n"]), _num(ours["p50_ms"], 3), _num(ours["p99_ms"], 3), _num(ours["throughput_per_s"])]
    if base:
        cells += [_num(base["n"]), _num(base["p50_ms"]), _num(base["p99_ms"]), _num(base["throughput_per_s"])]
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
    extras = _resource_lines(result)
    return "\n".join(lines + (["", *extras] if extras else []))


def _resource_lines(result: dict[str, Any]) -> list[str]:
    """One line per scenario that measured RSS / threads."""
    out = []
    for name, entry in result["scenarios"].items():
        ours = entry["ours"]
        if "rss_mb" in ours or "threads" in ours:
            out.append(
                f"{name}: peak RSS {_num(ours.get('rss_mb'), 1)} MB, peak threads {_num(ours.get('threads'))}; "
                f"after idle stop: RSS {_num(ours.get('rss_mb_after'), 1)} MB, "
                f"threads {_num(ours.get('threads_after'))}"
            )
    return out


def render_markdown(result: dict[str, Any], plot_path: str | None = "benchmarks.png",
                    source: str | None = None) -> str:
    """The ``docs/benchmarks.md`` page for ``result``.

    Args:
        result: the result dict.
        plot_path: the plot's path relative to the page (None: no plot).
        source: the result JSON's path, named on the page.
    """
    machine = result.get("machine", {})
    head = "| " + " | ".join(_COLUMNS) + " |\n|" + "|".join(
        ":---" if i == 0 else "---:" for i in range(len(_COLUMNS))) + "|\n"
    body = "".join("| " + " | ".join(_row(name, entry)) + " |\n" for name, entry in result["scenarios"].items())
    resources = _resource_lines(result)
    parts = [
        "# Benchmarks\n",
        "hermes-actors (`ours`) against `bench/baseline/`, a small model of the seed design's\n"
        "delivery mechanism (`base`): one subprocess per delivery, the per-profile `flock` taken\n"
        "by non-blocking attempts polled every 100 ms, and the relay reply file polled every 250 ms.\n"
        "Both sides use an instant turn (ours: a callable returning `ok`; baseline: a `python -c`\n"
        "stand-in for the CLI turn), so the numbers measure the messaging machinery, not a model.\n"
        "The local scenarios run ours on its in-memory path (`durable=False`): the seed journals\n"
        "nothing there either, and the journal's fsync cost belongs to its own scenario.\n",
        "> **Read the ratios, not the absolute numbers.** Every figure below was measured\n"
        "> side by side in one run on a small, noisy 2-core machine; absolute latencies move from\n"
        "> run to run, the ratios much less. `p50 ratio` = baseline p50 / ours p50; `thr ratio` = ours\n"
        "> throughput / baseline throughput. Baseline runs use far fewer DMs (it spends a\n"
        "> subprocess per DM); `n` is reported for each side.\n",
        "## Results\n",
        head + body,
    ]
    if resources:
        parts.append("Resources (ours):\n\n" + "".join(f"- {line}\n" for line in resources))
    described = [(name, REGISTRY[name].description) for name in result["scenarios"] if name in REGISTRY]
    if described:
        parts.append("Scenarios:\n\n" + "".join(f"- `{name}` — {text}\n" for name, text in described))
    parts.append(
        "Latency is measured from the start of the `message_agent` call to the outcome. In the\n"
        "pipelined scenarios (`local-throughput`, `scale`) every DM is sent up front, so latency\n"
        "includes queueing behind the DMs sent before it and grows with `n`; since the baseline runs\n"
        "a much smaller `n`, read the throughput ratio there, not the p50 ratio.\n"
    )
    if plot_path:
        parts.append(f"## Plot\n\n![latency CDFs and throughput]({plot_path})\n")
    rows = "".join(f"| {key} | {value} |\n" for key, value in machine.items())
    parts.append("## Machine\n\n| key | value |\n|:---|:---|\n" + rows)
    regen = ("Regenerate with `hermes-actors bench` (a full run takes a few minutes); "
             "`--quick` runs never touch this page.")
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


if __name__ == "__main__":  # pragma: no cover — manual regeneration
    import bench.scenarios  # noqa: F401  (registers the scenario descriptions)

    with open(sys.argv[1], encoding="utf-8") as fh:
        sys.stdout.write(render_markdown(json.load(fh)))
