"""The real-turn scenario: the real ``hermes`` (hermes-agent 0.19) against an instant local fake model.

One DM round trip = bob's turn + the wake-up turn of alice, timed from the
hand-over (the ack) to alice's wake-up request reaching the fake model
(127.0.0.1, answers at once). The model costs nothing, so the round trip is
pure overhead. :mod:`bench.hermes_round_trip` does the work, with the test
helpers' fake model and offline ``HERMES_HOME`` roots:

- ``ours`` — warm turns: our actors hosted inside ``hermes gateway run``, turns
  through its API server, no process start per turn;
- ``baseline`` — the seed's design: a ``hermes chat`` CLI process per turn
  (bob's turn and alice's wake-up), the turn lock taken by ``flock`` attempts
  100 ms apart and the reply file polled every 250 ms (modelled; the seed's
  runner process is a thread here, which favours the seed).

``ratio.p50`` is baseline/ours as everywhere; ``ours.overhead_vs_seed`` is
the goal's figure, ours/seed (median round trip). Full runs only (each CLI turn
costs seconds of CPU); skipped with ``--quick`` or without hermes-agent.
"""

from __future__ import annotations

import statistics

from bench.hermes_round_trip import locate_cli, measure
from bench.measure import summarize
from bench.registry import BenchContext, ScenarioResult, scenario

__all__: list[str] = []


@scenario(
    "hermes-roundtrip",
    "real turns: the real `hermes` (hermes-agent 0.19) on an instant local fake model; bob's turn + alice's "
    "wake-up, ack → wake-up at the model; ours with warm turns (actors inside `hermes gateway run`) vs the "
    "seed's design (a `hermes chat` process per turn, 100 ms lock polling, 250 ms reply polling; alice woken by "
    "a fresh `hermes chat` turn, where the seed in a running gateway wakes her session through hermes' "
    "background-process watcher, every 5 s in 0.19, and a warm turn: about as long on average); full run only",
)
def hermes_roundtrip(ctx: BenchContext) -> ScenarioResult:
    """Ours (warm turns) against the seed's process per turn, on the real hermes CLI."""
    if ctx.quick:
        return ScenarioResult.skip("full run only (every seed-side turn is a `hermes` process: seconds of CPU)")
    cli = locate_cli()
    if cli is None:
        return ScenarioResult.skip("hermes-agent is not installed (pip install 'hermes-actors[hermes]')")
    rounds = ctx.count(3, 3, minimum=2)
    runs: dict[str, list[tuple[float, float]]] = {}
    for side, mode in (("ours", "warm"), ("baseline", "seed")):
        ctx.progress.start(f"hermes-roundtrip {side} ({mode}): setting up", rounds)

        def advance(_mode: str, _i: int, _bob: float, _wake: float) -> None:
            ctx.progress.advance()

        def ready(side: str = side, mode: str = mode) -> None:
            ctx.progress.start(f"hermes-roundtrip {side} ({mode}) round trips", rounds)

        try:
            # A warm host's first turn pays lazy imports: one unmeasured round. Every seed-side turn is a
            # fresh process anyway, so a warm-up there would only measure the same cold start again.
            runs[side] = measure(mode, rounds, cli, report=advance, warmup=1 if mode == "warm" else 0,
                                 on_ready=ready)
        finally:
            ctx.progress.finish()
    metrics = {}
    for side, results in runs.items():
        wakes = [wake for _, wake in results]
        block = summarize(wakes, sum(wakes))
        block["bob_turn_p50_ms"] = round(statistics.median(bob for bob, _ in results) * 1000.0, 1)
        metrics[side] = block
    ours, base = metrics["ours"], metrics["baseline"]
    ours["overhead_vs_seed"] = round(ours["p50_ms"] / base["p50_ms"], 4) if base["p50_ms"] > 0 else None
    return ScenarioResult(ours, base, {side: [w for _, w in r] for side, r in runs.items()})
