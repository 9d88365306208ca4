"""Group rooms: time from ``room_send`` to the room settling, ours vs the upstream 2 s polling driver.

A room of 4 members; every turn is instant. Each member replies once to a new
user message and passes otherwise, so a send takes two rounds: four replies,
then a silent round that settles it. Ours is a Gateway (member turns through
the ProfileActors, room file fsync'd before each ack and each turn); the
baseline is :class:`bench.baseline.room.PollingRoom`.
"""

from __future__ import annotations

import random
import time
from typing import Any

from bench.baseline.room import ROOM_POLL_S, PollingRoom
from bench.drivers import BenchError
from bench.measure import summarize
from bench.registry import BenchContext, ScenarioResult, scenario
from bench.roots import BENCH_CONFIG, write_root
from hermes_actors import Gateway

__all__ = ["room_turn"]

_TEXT = "bench: status?"


def room_turn(turn: Any) -> str:
    """Our runner: reply once to a user message, else pass (instant)."""
    news = turn.content.splitlines()[1:-1]
    return "ok" if any(line.startswith("user: ") for line in news) else "[SILENT]"


def _ours(ctx: BenchContext, n: int) -> tuple[list[float], float]:
    root = ctx.workdir / "root"
    members = write_root(root, 4)
    latencies: list[float] = []
    with Gateway(root, runner=room_turn, config=BENCH_CONFIG) as gw:
        gw.create_room("bench", members)
        for _ in range(2):  # warm-up: each ProfileActor's first start
            gw.room_send("bench", "user", _TEXT)
            gw.wait_room_idle("bench", timeout=60)
        ctx.progress.start("room-settle ours", n)
        begin = time.perf_counter()
        for _ in range(n):
            t0 = time.perf_counter()
            ack = gw.room_send("bench", "user", _TEXT)
            if ack.get("status") != "queued":
                raise BenchError(f"room send refused: {ack}")
            if gw.wait_room_idle("bench", timeout=60) != "idle":
                raise BenchError("the room did not settle idle")
            latencies.append(time.perf_counter() - t0)
            ctx.progress.advance()
        wall = time.perf_counter() - begin
        ctx.progress.finish()
    return latencies, wall


def _baseline(ctx: BenchContext, n: int) -> tuple[list[float], float]:
    def turn(member: str, news: list[tuple[str, str]]) -> str:
        return "ok" if any(author == "user" for author, _ in news) else "[SILENT]"

    latencies: list[float] = []
    phase = random.Random(92760)
    with PollingRoom(["m0", "m1", "m2", "m3"], turn) as room:
        ctx.progress.start("room-settle baseline", n)
        for _ in range(n):
            # A user writes at any moment, not right after the tick that settled the last send:
            # a random phase in the poll period (not measured) keeps the model from always waiting a full 2 s.
            time.sleep(phase.uniform(0, ROOM_POLL_S))
            t0 = time.perf_counter()
            room.send(_TEXT)
            if not room.wait_idle(60):
                raise BenchError("the polling room did not settle")
            latencies.append(time.perf_counter() - t0)
            ctx.progress.advance()
        ctx.progress.finish()
    # The throughput's wall is the measured sends only, as ours (whose sends follow each other at once):
    # the idle phase before each send is the user's, not the room's.
    return latencies, sum(latencies)


@scenario(
    "room-settle",
    "a room of 4 bots, instant turns: `room_send` → idle (4 replies, then a silent round), sequential; "
    "baseline: the upstream driver polling every 2 s (one round per tick, sends at a random phase)",
)
def room_settle(ctx: BenchContext) -> ScenarioResult:
    """Latency of one room send until the room settled."""
    ours, ours_wall = _ours(ctx, ctx.count(100, 500, minimum=3))
    base, base_wall = _baseline(ctx, ctx.count(3, 10, minimum=2))
    return ScenarioResult(summarize(ours, ours_wall), summarize(base, base_wall), {"ours": ours, "baseline": base})
