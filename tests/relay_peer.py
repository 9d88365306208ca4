"""A relay peer process for the multi-process relay tests (not a test module).

    python tests/relay_peer.py --root A --connection-id alpha --target scout@mini \
        --count 200 [--sequential] [--turn-log FILE] [--wait 60] [--turn-seconds 0.02]

Runs a :class:`Gateway` on ``--root`` (so this process also serves the
root's ``inbox/``: it is one of the gateways), waits until ``--target``
resolves through the relay roster and is online, sends ``--count`` DMs,
waits for every outcome, prints one JSON summary line on stdout, and then
keeps serving until SIGTERM/SIGINT or stdin closes.

``--turn-log`` appends ``<delivery_id> <profile>`` for every turn this
gateway runs (the test counts lines per envelope id).
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

from hermes_actors.demo.bots import DEMO_BOTS, DemoRunner
from hermes_actors.gateway import Gateway


def _target_ready(gw: Gateway, target: str) -> bool:
    handle, _, conn = target.partition("@")
    return is_online(gw, handle, conn)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True, type=Path)
    p.add_argument("--connection-id", required=True)
    p.add_argument("--sender", default="hermes")
    p.add_argument("--target", required=True, help="handle@connection")
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--sequential", action="store_true", help="send one DM at a time (latency)")
    p.add_argument("--turn-log", type=Path, default=None)
    p.add_argument("--wait", type=float, default=60.0)
    p.add_argument("--rescan", type=float, default=2.0)
    p.add_argument("--turn-seconds", type=float, default=0.0, help="each turn of the demo bots takes this long")
    args = p.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()

    config = {"bot_mode": {"rescan_seconds": args.rescan, "max_queued": max(1024, args.count + 10)}}
    delays = {bot.profile: args.turn_seconds for bot in DEMO_BOTS} if args.turn_seconds else None
    runner = TurnLog(args.turn_log, DemoRunner(delays=delays).run_turn)  # the demo runner, logging every turn
    with Gateway(args.root, runner=runner, config=config, connection_id=args.connection_id) as gw:
        deadline = time.monotonic() + args.wait
        while not _target_ready(gw, args.target):
            if time.monotonic() > deadline or stop.is_set():
                print(json.dumps({"error": f"{args.target} never became reachable"}), flush=True)
                return 1
            stop.wait(0.02)
        print(json.dumps({"ready": True}), flush=True)
        results: list[dict[str, Any]] = []
        latencies: list[float] = []
        acks: list[tuple[dict[str, Any], float]] = []
        t0 = time.monotonic()
        for i in range(args.count):
            started = time.monotonic()
            text = f"question {i} from {args.connection_id}"
            ack = gw.message_agent(sender=args.sender, target=args.target, message=text)
            if "delivery_id" not in ack:
                results.append({"ack": ack})
                continue
            if args.sequential:
                out = gw.wait_outcome(ack["delivery_id"], timeout=max(0.1, deadline - time.monotonic()))
                latencies.append(time.monotonic() - started)
                results.append(out)
            else:
                acks.append((ack, started))
        for ack, _started in acks:
            try:
                results.append(gw.wait_outcome(ack["delivery_id"], timeout=max(0.1, deadline - time.monotonic())))
            except TimeoutError:
                results.append({"delivery_id": ack["delivery_id"], "status": "no-outcome"})
        elapsed = time.monotonic() - t0
        summary: dict[str, Any] = {
            "sent": [r.get("delivery_id") for r in results],
            "statuses": [r.get("status") for r in results],
            "replies": [r.get("reply") for r in results],
            "errors": [r.get("error") for r in results],
            "refusals": [r["ack"] for r in results if "ack" in r],
            "elapsed": elapsed,
        }
        if latencies:
            ordered = sorted(latencies)
            summary["latency"] = {
                "n": len(ordered),
                "p50_ms": statistics.median(ordered) * 1000,
                "p90_ms": ordered[int(0.9 * (len(ordered) - 1))] * 1000,
                "max_ms": ordered[-1] * 1000,
                "min_ms": ordered[0] * 1000,
            }
        print(json.dumps(summary), flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
