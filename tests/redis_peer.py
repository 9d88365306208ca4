"""A gateway process on the Redis transport, for the multi-process tests (not a test module).

    python tests/redis_peer.py --root R --connection-id alpha --redis URL \
        [--target scout@mini --count 500 [--sequential]] [--turn-log FILE] [--turn-seconds 0.1] \
        [--config '{"bot_mode": {...}}']

Serves ``--root`` as connection ``--connection-id`` on Redis, prints
``{"ready": true}`` once it runs (and ``--target`` is online), sends
``--count`` DMs, prints one JSON summary line (``sent``, ``statuses``,
``latency``), then keeps serving until SIGTERM or stdin closes.
``--turn-log`` appends ``<delivery_id> <profile>`` when each turn STARTS.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from roots import TurnLog, is_online

from hermes_actors.core.config import deep_merge
from hermes_actors.gateway import Gateway
from hermes_actors.messages import Turn


def logging_runner(log: Path | None, turn_seconds: float) -> TurnLog:
    """Logs each turn as it starts, then takes ``turn_seconds`` (a turn's length, simulated) to reply."""

    def reply(turn: Turn) -> str:
        if turn_seconds:
            time.sleep(turn_seconds)
        return f"done {turn.delivery_id} by {turn.profile}"

    return TurnLog(log, reply)


def _target_ready(gw: Gateway, target: str) -> bool:
    handle, _, conn = target.partition("@")
    return is_online(gw, handle, conn)


def _pct(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True, type=Path)
    p.add_argument("--connection-id", required=True)
    p.add_argument("--redis", required=True)
    p.add_argument("--sender", default="hermes")
    p.add_argument("--target", default=None, help="handle@connection")
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--sequential", action="store_true")
    p.add_argument("--turn-log", type=Path, default=None)
    p.add_argument("--turn-seconds", type=float, default=0.0)
    p.add_argument("--wait", type=float, default=120.0)
    p.add_argument("--config", default="{}")
    args = p.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()

    config = deep_merge({"bot_mode": {"transport": args.redis, "max_queued": max(256, args.count + 10),
                                      "redis_heartbeat_seconds": 0.5}}, json.loads(args.config))
    runner = logging_runner(args.turn_log, args.turn_seconds)
    with Gateway(args.root, runner=runner, config=config, connection_id=args.connection_id, durable=False) as gw:
        deadline = time.monotonic() + args.wait
        while args.target and not _target_ready(gw, args.target):
            if time.monotonic() > deadline or stop.is_set():
                print(json.dumps({"error": f"{args.target} never became reachable"}), flush=True)
                return 1
            stop.wait(0.02)
        print(json.dumps({"ready": True}), flush=True)
        if not args.target or not args.count:
            stop.wait()
            return 0
        results: list[dict[str, Any]] = []
        latencies: list[float] = []
        acks: list[dict[str, Any]] = []
        t0 = time.monotonic()
        for i in range(args.count):
            started = time.monotonic()
            ack = gw.message_agent(sender=args.sender, target=args.target, message=f"question {i}")
            if "delivery_id" not in ack:
                results.append({"ack": ack})
                continue
            if args.sequential:
                results.append(gw.wait_outcome(ack["delivery_id"], timeout=max(0.1, deadline - time.monotonic())))
                latencies.append(time.monotonic() - started)
            else:
                acks.append(ack)
        for ack in acks:
            try:
                results.append(gw.wait_outcome(ack["delivery_id"], timeout=max(0.1, deadline - time.monotonic())))
            except TimeoutError:
                results.append({"delivery_id": ack["delivery_id"], "status": "no-outcome"})
        summary: dict[str, Any] = {
            "sent": [r.get("delivery_id") for r in results],
            "statuses": [r.get("status") for r in results],
            "replies": [r.get("reply") for r in results],
            "refusals": [r["ack"] for r in results if "ack" in r],
            "elapsed": time.monotonic() - t0,
        }
        if latencies:
            ordered = sorted(latencies)
            summary["latency"] = {"n": len(ordered), "p50_ms": statistics.median(ordered) * 1000,
                                  "p95_ms": _pct(ordered, 0.95), "max_ms": ordered[-1] * 1000,
                                  "min_ms": ordered[0] * 1000}
        print(json.dumps(summary), flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
