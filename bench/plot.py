"""The result plot: a latency CDF per scenario (ours vs baseline) and throughput bars.

matplotlib is optional (the ``bench`` extra); without it :func:`plot_results`
returns None and the caller warns. The Agg backend is forced: no display needed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

__all__ = ["plot_results"]

_COLORS = {"ours": "#1f77b4", "baseline": "#d62728"}
_EXTRA_COLORS = ("#2ca02c", "#9467bd", "#ff7f0e")  # further sample sets (``"ours durable"`` …)


def plot_results(result: dict[str, Any], samples: dict[str, dict[str, list[float]]], path: Path) -> Path | None:
    """Draw ``result`` to a PNG.

    Args:
        result: the result dict (``{"machine", "scenarios"}``).
        samples: per scenario, the raw latencies in seconds under ``"ours"`` / ``"baseline"``.
        path: the PNG to write.

    Returns:
        ``path``, or None when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter
    except ImportError:
        return None

    names = list(result["scenarios"])
    panels = len(names) + 1
    cols = min(3, panels)
    rows = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.9 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, name in zip(flat, names, strict=False):
        runs = samples.get(name, {})
        if not any(runs.values()):  # a skipped scenario: say so instead of drawing empty axes
            ax.text(0.5, 0.5, f"{name}: skipped", ha="center", va="center", fontsize=10, transform=ax.transAxes)
            ax.set_axis_off()
            continue
        extra = [side for side in runs if side not in _COLORS]
        colors = {**_COLORS, **dict(zip(extra, _EXTRA_COLORS, strict=False))}
        for side in ["ours", *extra, "baseline"]:
            values = sorted(v * 1000.0 for v in runs.get(side, []))
            if not values:
                continue
            ys = [(i + 1) / len(values) for i in range(len(values))]
            ax.step(values, ys, where="post", color=colors.get(side, "#7f7f7f"),
                    label=f"{side} (n={len(values)})")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{name}: latency CDF", fontsize=10)
        ax.set_xlabel("latency (ms, log)")
        ax.set_ylabel("fraction of DMs")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")

    bars = flat[len(names)]
    width = 0.38
    drawn = 0
    for offset, side in ((-width / 2, "ours"), (width / 2, "baseline")):
        xs, heights = [], []
        for i, name in enumerate(names):
            metrics = result["scenarios"][name].get(side)
            if metrics:
                xs.append(i + offset)
                heights.append(metrics["throughput_per_s"])
        if heights:
            bars.bar(xs, heights, width=width, color=_COLORS[side], label=side)
            drawn += len(heights)
    if drawn:
        bars.set_xticks(range(len(names)))
        bars.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
        bars.set_yscale("log")
        bars.set_ylabel("DMs per second (log)")
        bars.set_title("throughput", fontsize=10)
        bars.grid(True, axis="y", which="both", alpha=0.3)
        bars.legend(fontsize=8)
    else:  # every scenario was skipped
        bars.text(0.5, 0.5, "no throughput measured", ha="center", va="center", fontsize=10,
                  transform=bars.transAxes)
        bars.set_axis_off()
    for ax in flat[panels:]:
        ax.set_visible(False)

    machine = result.get("machine", {})
    fig.suptitle(
        f"hermes-actors vs seed-design baseline — {machine.get('cpu_count')} CPUs, "
        f"Python {machine.get('python')}, measured side by side in one run",
        fontsize=11,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
