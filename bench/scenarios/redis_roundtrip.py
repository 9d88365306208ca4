"""The Redis scenario: one DM at a time over the Redis Streams transport.

Ours is three processes: a real ``redis-server`` (:mod:`bench.redis_server`,
loopback, free port, AOF with ``appendfsync always``, in the scenario's temp
dir), the sending gateway ``alpha`` (in the benchmark process) and the far
gateway ``mini`` (:mod:`bench.relay_peer` with ``--transport URL``, instant
runner), both with ``config={"bot_mode": {"transport": url}}``. A DM to
``dave@mini`` goes alpha → ``XADD <p>:in:mini`` → mini's reader → turn →
``XADD <p>:replies:alpha`` → alpha's reader → outcome.

There is no baseline: the seed design has no Redis transport (compare with
``relay-roundtrip``, the file relay, by eye). Without ``redis-server`` or
redis-py the scenario is skipped with the reason in the result.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from bench.drivers import Run, sequential_roundtrip
from bench.measure import summarize
from bench.redis_server import redis_binary, start_redis, stop_redis
from bench.registry import BenchContext, ScenarioResult, scenario
from bench.roots import BENCH_CONFIG
from bench.scenarios.local import instant_reply
from bench.scenarios.relay import SENDER, TARGET, await_target, peer_process, relay_roots
from hermes_actors import Gateway

__all__ = ["redis_missing"]

APPENDFSYNC = "always"


def redis_missing() -> str | None:
    """Why the scenario cannot run here (no ``redis-server`` binary, no redis-py), or None."""
    if redis_binary() is None:
        return "redis-server is not installed (apt-get install -y redis-server); Redis round trip not measured"
    if importlib.util.find_spec("redis") is None:
        return "redis-py is not installed (pip install 'hermes-actors[redis]'); Redis round trip not measured"
    return None


def _config(url: str) -> dict[str, dict[str, Any]]:
    return {"bot_mode": {**BENCH_CONFIG["bot_mode"], "transport": url}}


def _ours(ctx: BenchContext, url: str, n: int, warmup: int) -> Run:
    """The far gateway process (started first, so alpha's first roster read sees it), alpha, ``n`` DMs."""
    alpha, mini = relay_roots(ctx.workdir / "ours")
    peer_log = ctx.workdir / "peer-redis.log"
    argv = [sys.executable, "-m", "bench.relay_peer", "--root", str(mini), "--connection-id", "mini",
            "--transport", url]
    with peer_process(argv, peer_log, ready_line="ready"):
        gateway = Gateway(alpha, runner=instant_reply, config=_config(url), connection_id="alpha", durable=False)
        with gateway:
            await_target(gateway, TARGET, [peer_log, ctx.workdir / "redis" / "redis.log"])
            ctx.progress.start("redis-roundtrip ours", n)
            try:
                return sequential_roundtrip(gateway, SENDER, TARGET, n, ctx.progress, warmup=warmup)
            finally:
                ctx.progress.finish()


@scenario(
    "redis-roundtrip",
    "sequential DMs alpha → `dave@mini` over Redis Streams: a real `redis-server` (loopback, AOF "
    f"`appendfsync {APPENDFSYNC}`) and two gateway processes; latency = send call start → outcome; "
    "no baseline (the seed has no Redis transport)",
)
def redis_roundtrip(ctx: BenchContext) -> ScenarioResult:
    """Latency of one cross-connection DM over Redis, nothing else in flight."""
    missing = redis_missing()
    if missing is not None:
        return ScenarioResult.skip(missing)
    n = ctx.count(40, 1000, minimum=5)
    proc, url = start_redis(ctx.workdir / "redis", fsync=APPENDFSYNC)
    try:
        run = _ours(ctx, url, n, warmup=5)
    finally:
        stop_redis(proc)
    ours: dict[str, Any] = summarize(run.latencies_s, run.wall_s)
    return ScenarioResult(ours, None, {"ours": run.latencies_s})
