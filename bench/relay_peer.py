"""The far side of the relay benchmarks, as its own process: ``python -m bench.relay_peer``.

    python -m bench.relay_peer --root R --connection-id mini [--durable] [--transport redis://…]

Starts a :class:`hermes_actors.Gateway` on ``--root`` with the benchmarks'
instant runner (every turn answers ``ok`` at once) and
:data:`bench.roots.BENCH_CONFIG`, prints ``ready`` on stdout, and serves the
root's relay ``inbox/`` (or, with ``--transport URL``, its Redis streams) until
SIGTERM/SIGINT — or until stdin closes, so a benchmark process that dies never
leaves it behind. The relay scenario runs this next to the hub process, the
Redis scenario next to a ``redis-server``, so the far gateway has its own
interpreter and GIL, as in production.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from bench.roots import BENCH_CONFIG
from hermes_actors import CallableRunner, Gateway

__all__ = ["main"]


def _reply_ok(turn: Any) -> str:
    return "ok"


# The turn answers at once and never blocks (the same runner the in-process scenarios use).
instant_reply = CallableRunner(_reply_ok, blocking=False)


def main(argv: list[str] | None = None) -> int:
    """Serve until told to stop; the exit code."""
    parser = argparse.ArgumentParser(prog="python -m bench.relay_peer")
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--connection-id", required=True)
    parser.add_argument("--durable", action="store_true", help="journal deliveries (fsync per group commit)")
    parser.add_argument("--transport", default=None, metavar="URL",
                        help="bot_mode.transport (a redis:// URL); default: the file relay")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    def watch_stdin() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch_stdin, name="stdin-watch", daemon=True).start()
    config: dict[str, dict[str, Any]] = {"bot_mode": {**BENCH_CONFIG["bot_mode"]}}
    if args.transport:
        config["bot_mode"]["transport"] = args.transport
    gateway = Gateway(args.root, runner=instant_reply, config=config, connection_id=args.connection_id,
                      durable=args.durable, fsync=args.durable)
    with gateway:
        print("ready", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
