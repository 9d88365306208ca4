"""The report's "Details" lines: resources, CPU per DM against the floor, the special scenarios' figures.

Pure functions of a result dict (the JSON the harness writes); the terminal table and
the ``docs/benchmarks.md`` page (:mod:`bench.report`) print the same lines.
"""

from __future__ import annotations

from typing import Any

from bench.figures import floor_cpu, num

__all__ = ["extra_lines", "resource_lines"]


def resource_lines(result: dict[str, Any]) -> list[str]:
    """One line per scenario that measured RSS / threads."""
    out = []
    for name, entry in result["scenarios"].items():
        ours = entry.get("ours") or {}
        if "rss_mb" in ours or "threads" in ours:
            out.append(
                f"{name}: peak RSS {num(ours.get('rss_mb'), 1)} MB, peak threads {num(ours.get('threads'))}; "
                f"after idle stop: RSS {num(ours.get('rss_mb_after'), 1)} MB, "
                f"threads {num(ours.get('threads_after'))}"
            )
    return out


def _metrics_text(m: dict[str, Any]) -> str:
    return (f"n {num(m['n'])}, p50 {num(m['p50_ms'], 3)} ms, p99 {num(m['p99_ms'], 3)} ms, "
            f"{num(m['throughput_per_s'])}/s")


def _cpu_lines(result: dict[str, Any]) -> list[str]:
    """The floor, and CPU per DM of every side that measured it (as a multiple of the floor for ours)."""
    floors = result.get("floors") or {}
    floor = floor_cpu(result)
    out = []
    if floor is not None:
        samples = floors.get("samples_cpu_us") or []
        wall, asks = num(floors.get("pykka_ask_wall_us")), num(floors.get("pykka_ask_n"))
        where = {"two_cpus": "caller and actor pinned to two CPUs", "one_cpu": "caller and actor on one CPU"}
        out.append(f"floor: one pykka ask round trip costs {num(floor)} µs of CPU ({wall} µs wall; {asks} asks, "
                   f"{where.get(str(floors.get('placement')), 'unpinned')}; lowest of "
                   f"{', '.join(num(v) for v in samples)} µs measured before and after the scenarios)")
        one = (floors.get("by_placement") or {}).get("one_cpu")
        if one and floors.get("placement") != "one_cpu":
            out.append(f"floor on one CPU: {num(one['cpu_us'])} µs of CPU per ask ({num(one['wall_us'])} µs wall): "
                       "a wake-up that stays on its CPU costs less; an unpinned pair lands either way, which is "
                       "why both are pinned here")
        if floors.get("pykka_pipelined_ask_cpu_us") is not None:
            out.append(f"floor, pipelined: {num(floors['pykka_pipelined_ask_cpu_us'])} µs of CPU per ask when 8 "
                       "threads ask 100 actors without waiting (local-throughput's shape, nothing but pykka)")
    for name, entry in result["scenarios"].items():
        for side in ("ours", "baseline"):
            block = entry.get(side) or {}
            cpu = block.get("cpu_per_dm_us")
            if cpu is None:
                continue
            text = f"{name}, {side}: {num(cpu)} µs CPU per DM in this process"
            if block.get("cpu_per_dm_us_with_children") is not None:
                text += f", {num(block['cpu_per_dm_us_with_children'])} µs with the turn processes"
            elif side == "ours" and floor is not None:  # in-process turns only: a turn process is no hop
                text += f" = {cpu / floor:.2f}× one pykka ask"
                one = (floors.get("by_placement") or {}).get("one_cpu")
                if one and floors.get("placement") != "one_cpu" and one["cpu_us"] > 0:
                    text += f" ({cpu / one['cpu_us']:.2f}× one on one CPU"
                    pipelined = floors.get("pykka_pipelined_ask_cpu_us")
                    text += f", {cpu / pipelined:.1f}× one pipelined)" if pipelined else ")"
            out.append(text)
            if block.get("runs"):
                listed = "; ".join(f"{num(run['throughput_per_s'])}/s at {num(run['cpu_per_dm_us'])} µs"
                                   for run in block["runs"])
                out.append(f"{name}, {side}: the run of median throughput of {len(block['runs'])} "
                           f"(in the order run: {listed})")
            split = block.get("cpu_split_us") or {}
            if split:
                parts = ", ".join(f"{group} {num(us, 1)}" for group, us in split.items())
                out.append(f"{name}, {side}, that CPU by thread (µs per DM; subscriber callbacks run on the "
                           f"NotifierActor): {parts}")
    return out


def _special_lines(result: dict[str, Any]) -> list[str]:
    """The scale comparison, the sustained run's memory and the real-turn overhead ratio."""
    out = []
    scale = (result["scenarios"].get("scale") or {}).get("ours") or {}
    fewer = scale.get("fewer_active") or {}
    if fewer and scale.get("throughput_vs_fewer") is not None:
        out.append(
            f"scale: {num(scale.get('active_profiles'))} active profiles ran at "
            f"{num(scale['throughput_per_s'])}/s, {num(fewer.get('active_profiles'))} active at "
            f"{num(fewer['throughput_per_s'])}/s: {scale['throughput_vs_fewer']:.2f}× "
            f"(peak threads {num(scale.get('threads'))} vs {num(fewer.get('threads'))}, "
            f"peak RSS {num(scale.get('rss_mb'), 1)} vs {num(fewer.get('rss_mb'), 1)} MB)"
        )
    many_split, few_split = scale.get("cpu_split_us") or {}, fewer.get("cpu_split_us") or {}
    if many_split and few_split:
        groups = [g for g in many_split if many_split[g] >= 0.5 or few_split.get(g, 0.0) >= 0.5]
        parts = ", ".join(f"{g} {num(many_split[g], 1)} vs {num(few_split.get(g, 0.0), 1)}" for g in groups)
        out.append(f"scale, CPU per DM by thread (µs, {num(scale.get('active_profiles'))} vs "
                   f"{num(fewer.get('active_profiles'))} active): {parts}")
    floor = scale.get("pykka_floor") or {}
    if floor.get("pykka_spread_1000_vs_100") is not None:
        out.append(
            f"scale floor: bare pykka actors (started on first use, one ask each without waiting, "
            f"{num(floor.get('pykka_spread_n'))} messages) ran {num(floor['pykka_spread_1000_per_s'])}/s over "
            f"1000 actors vs {num(floor['pykka_spread_100_per_s'])}/s over 100: "
            f"{floor['pykka_spread_1000_vs_100']:.2f}× — what a thread per actor costs by itself"
        )
    held = (result["scenarios"].get("sustained") or {}).get("ours") or {}
    if held.get("rss_start_mb") is not None:
        out.append(
            f"sustained: {num(held.get('target_rate_per_s'))}/s for {num(held.get('duration_s'))} s "
            f"({num(held['n'])} DMs, achieved {num(held['throughput_per_s'])}/s): RSS start "
            f"{num(held['rss_start_mb'], 1)} MB, mid {num(held.get('rss_mid_mb'), 1)} MB, peak "
            f"{num(held['rss_peak_mb'], 1)} MB, end {num(held['rss_end_mb'], 1)} MB; bounded tables full after "
            f"{num(held.get('tables_full_s'))} s (RSS then {num(held.get('rss_at_tables_full_mb'), 1)} MB); timers "
            f"{num(held.get('timers_start'))} at start, {num(held.get('timers_end'))} at the end"
        )
    real = result["scenarios"].get("hermes-roundtrip") or {}
    ours, base = real.get("ours") or {}, real.get("baseline") or {}
    if ours.get("overhead_vs_seed") is not None:
        out.append(
            f"hermes-roundtrip: DM round trip (bob's turn + alice's wake-up) p50 {num(ours['p50_ms'])} ms "
            f"with warm turns vs {num(base.get('p50_ms'))} ms for the seed's process per turn: "
            f"ours = {ours['overhead_vs_seed']:.3f}× the seed's overhead; bob's turn reached the model after "
            f"{num(ours.get('bob_turn_p50_ms'))} ms vs {num(base.get('bob_turn_p50_ms'))} ms"
        )
    return out


def extra_lines(result: dict[str, Any]) -> list[str]:
    """Skipped scenarios, sub-metrics (``ours.<variant>`` dicts), journal counters, CPU, memory; one line each."""
    out = _cpu_lines(result) + _special_lines(result)
    for name, entry in result["scenarios"].items():
        if entry.get("skipped"):
            out.append(f"{name}: skipped — {entry['skipped']}")
        ours = entry.get("ours") or {}
        if ours.get("fsyncs"):
            out.append(
                f"{name}: {num(ours['fsyncs'])} fdatasyncs for {num(ours['n'])} DMs "
                f"({num(ours.get('dms_per_fsync'))} DMs, {num(ours.get('records_per_fsync'))} journal "
                f"records per fdatasync)"
            )
        for key, value in ours.items():
            if isinstance(value, dict) and {"n", "p50_ms", "p99_ms", "throughput_per_s"} <= set(value):
                label = {"durable": "durable=True (journal on)", "nondurable": "durable=False",
                         "fewer_active": f"{value.get('active_profiles')} active profiles",
                         "roundtrip": "one sender, sequential DMs (durable round trip)"}.get(key, key)
                out.append(f"{name}, ours with {label}: {_metrics_text(value)}")
    return out
