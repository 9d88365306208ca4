"""The goals the design set for itself, each checked against a benchmark result.

:data:`TARGETS` lists them; :func:`evaluate_targets` measures each in a result dict and
says whether it was met. The page's "Targets" section (:mod:`bench.report`) and the
terminal table print what it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.figures import floor_cpu, num

__all__ = ["TARGETS", "Target", "evaluate_targets"]


@dataclass(frozen=True)
class Target:
    """A goal the design set for itself, checked against a result.

    ``measure(result)`` returns ``(value, text)`` — None when the scenario did
    not run — and ``met(value, result)`` decides.
    """

    goal: str
    scenario: str
    measure: Callable[[dict[str, Any]], tuple[float, str] | None]
    met: Callable[[float, dict[str, Any]], bool]


def _field(scenario: str, side: str, key: str, unit: str,
           digits: int = 2) -> Callable[[dict[str, Any]], tuple[float, str] | None]:
    def get(result: dict[str, Any]) -> tuple[float, str] | None:
        entry = result["scenarios"].get(scenario) or {}
        block = entry.get(side) or {}
        if block.get(key) is None:
            return None
        value = float(block[key])
        return value, f"{num(value, digits)}{unit}"

    return get


def _durable_roundtrip(result: dict[str, Any]) -> tuple[float, str] | None:
    trip = ((result["scenarios"].get("durable-throughput") or {}).get("ours") or {}).get("roundtrip") or {}
    if trip.get("p50_ms") is None:
        return None
    text = f"{num(trip['p50_ms'], 3)} ms (p99 {num(trip.get('p99_ms'), 3)} ms, n {trip.get('n')}"
    sync = trip.get("fdatasync_p50_ms")
    inside = trip.get("fdatasync_allocated_p50_ms")
    if isinstance(inside, int | float) and inside > 0 and isinstance(sync, int | float):
        text += (f"; one fdatasync here: {num(inside, 3)} ms inside allocated space as the journal writes"
                 f" ({num(sync, 3)} ms appending), so {float(trip['p50_ms']) / inside:.1f} of them")
    elif isinstance(sync, int | float) and sync > 0:
        text += f"; one fdatasync here: {num(sync, 3)} ms, so {float(trip['p50_ms']) / sync:.1f} of them"
    return float(trip["p50_ms"]), text + ")"


def _scale_rss(result: dict[str, Any]) -> tuple[float, str] | None:
    ours = (result["scenarios"].get("scale") or {}).get("ours") or {}
    if ours.get("rss_mb") is None:
        return None
    registered = ours.get("registered")
    where = f" at {registered:,} registered" if isinstance(registered, int) else ""
    return float(ours["rss_mb"]), f"{num(ours['rss_mb'], 1)} MB peak{where}"


def _scale_rss_met(value: float, result: dict[str, Any]) -> bool:
    registered = result["scenarios"]["scale"]["ours"].get("registered", 10_000)
    return value <= 300 and registered >= 10_000


def _scale_threads(result: dict[str, Any]) -> tuple[float, str] | None:
    ours = (result["scenarios"].get("scale") or {}).get("ours") or {}
    if ours.get("threads") is None or ours.get("threads_after") is None:
        return None
    active = ours.get("active_profiles")
    start = ours.get("threads_at_start")
    workers = ours.get("worker_threads_after")
    text = (f"peak {num(ours['threads'])}" + (f" with {num(active)} active" if active is not None else "")
            + f"; {num(ours['threads_after'])} after idle stop"
            + (f" ({num(workers)} idle turn workers)" if workers else "")
            + (f", {num(start)} at start" if start is not None else ""))
    return float(ours["threads"]), text


#: Headroom above "one thread per active profile": the turn worker cap (64) and a few fixed threads.
_THREAD_SLACK = 64 + 16


def _scale_threads_met(value: float, result: dict[str, Any]) -> bool:
    """Peak ≤ start + one per active profile + slack; after the idle stop, no profile thread is left.

    Turn workers (capped at 64) retire on their own after 30 s idle, so they are
    not counted against the after-idle figure.
    """
    ours = result["scenarios"]["scale"]["ours"]
    start = int(ours.get("threads_at_start") or 0)
    active = int(ours.get("active_profiles") or 0)
    workers = int(ours.get("worker_threads_after") or 0)
    return value <= start + active + _THREAD_SLACK and int(ours["threads_after"]) - workers <= start + 4


def _cpu_ratio(result: dict[str, Any]) -> tuple[float, str] | None:
    ours = (result["scenarios"].get("local-throughput") or {}).get("ours") or {}
    floor = floor_cpu(result)
    if floor is None or ours.get("cpu_per_dm_us") is None:
        return None
    ratio = float(ours["cpu_per_dm_us"]) / floor
    text = f"{ratio:.2f}× ({num(ours['cpu_per_dm_us'])} / {num(floor)} µs"
    floors = result.get("floors") or {}
    one = (floors.get("by_placement") or {}).get("one_cpu")
    if one and floors.get("placement") == "two_cpus" and one["cpu_us"] > 0:
        text += f", an ask across CPUs; {float(ours['cpu_per_dm_us']) / one['cpu_us']:.2f}× one on one CPU"
    return ratio, text + ")"


def _scale_ratio(result: dict[str, Any]) -> tuple[float, str] | None:
    ours = (result["scenarios"].get("scale") or {}).get("ours") or {}
    if ours.get("throughput_vs_fewer") is None:
        return None
    fewer = ours.get("fewer_active") or {}
    floor = (ours.get("pykka_floor") or {}).get("pykka_spread_1000_vs_100")
    bare = f"; bare pykka actors: {floor:.2f}×" if floor is not None else ""
    return float(ours["throughput_vs_fewer"]), (
        f"{ours['throughput_vs_fewer']:.2f}× ({num(ours['throughput_per_s'])} vs "
        f"{num(fewer.get('throughput_per_s'))}/s{bare})")


def _flat_rss(result: dict[str, Any]) -> tuple[float, str] | None:
    """RSS growth once the bounded tables are full, as a fraction of the peak (None: they never filled)."""
    ours = (result["scenarios"].get("sustained") or {}).get("ours") or {}
    growth = ours.get("rss_growth_after_tables_full_mb")
    if growth is None or not ours.get("rss_peak_mb"):
        return None
    return float(growth) / float(ours["rss_peak_mb"]), (
        f"{float(growth):+.1f} MB from {num(ours.get('tables_full_s'))} s (tables full) to the end of "
        f"{num(ours.get('duration_s'))} s (start {num(ours['rss_start_mb'], 1)}, "
        f"peak {num(ours['rss_peak_mb'], 1)}, end {num(ours['rss_end_mb'], 1)} MB)")


def _flat_rss_met(value: float, result: dict[str, Any]) -> bool:
    """Flat: once the bounded tables are full RSS grows by at most 5 % of the peak, on a ≥ 10-minute run."""
    ours = result["scenarios"]["sustained"]["ours"]
    return value <= 0.05 and float(ours.get("duration_s") or 0) >= 600


TARGETS: tuple[Target, ...] = (
    Target("local round trip p50 ≤ 1 ms", "local-roundtrip", _field("local-roundtrip", "ours", "p50_ms", " ms", 3),
           lambda v, r: v <= 1.0),
    Target("local round trip p99 ≤ 5 ms", "local-roundtrip", _field("local-roundtrip", "ours", "p99_ms", " ms", 3),
           lambda v, r: v <= 5.0),
    Target("machinery: local round trip ≥ 100× seed model (p50; in-process turn vs a process per DM)",
           "local-roundtrip", _field("local-roundtrip", "ratio", "p50", "×", 1), lambda v, r: v >= 100),
    Target("CPU per in-memory DM ≤ 1.5× one pykka ask (same run)", "local-throughput", _cpu_ratio,
           lambda v, r: v <= 1.5),
    Target("local throughput ≥ 10,000 DMs/s", "local-throughput",
           _field("local-throughput", "ours", "throughput_per_s", "/s"), lambda v, r: v >= 10_000),
    Target("machinery: local throughput ≥ 50× seed model", "local-throughput",
           _field("local-throughput", "ratio", "throughput", "×", 1), lambda v, r: v >= 50),
    Target("relay round trip p50 ≤ 3 ms", "relay-roundtrip", _field("relay-roundtrip", "ours", "p50_ms", " ms", 3),
           lambda v, r: v <= 3.0),
    Target("durable throughput ≥ 4,000 DMs/s", "durable-throughput",
           _field("durable-throughput", "ours", "throughput_per_s", "/s"), lambda v, r: v >= 4_000),
    Target("durable round trip p50 ≤ 1 ms (one sender, sequential, fsync on)", "durable-throughput",
           _durable_roundtrip, lambda v, r: v <= 1.0),
    Target("scale: RSS ≤ 300 MB at 10,000 registered", "scale", _scale_rss, _scale_rss_met),
    Target("scale: threads follow active profiles", "scale", _scale_threads, _scale_threads_met),
    Target("scale: 1,000 active profiles ≥ 0.8× the throughput of 100", "scale", _scale_ratio,
           lambda v, r: v >= 0.8),
    Target("real turns: ours ≤ 0.1× the seed's round-trip overhead", "hermes-roundtrip",
           _field("hermes-roundtrip", "ours", "overhead_vs_seed", "×", 3), lambda v, r: v <= 0.1),
    Target("flat memory: RSS flat over a 10-minute sustained run (once its bounded tables are full)", "sustained",
           _flat_rss, _flat_rss_met),
)


def evaluate_targets(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """Every target as ``(goal, scenario, measured text, "met" | "not met" | "not measured")``."""
    rows = []
    for target in TARGETS:
        got = target.measure(result)
        if got is None:
            rows.append((target.goal, target.scenario, "—", "not measured"))
            continue
        value, text = got
        rows.append((target.goal, target.scenario, text, "met" if target.met(value, result) else "not met"))
    return rows
