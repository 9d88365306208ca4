"""The ``hermes-actors`` command: demo, roster, send, serve, relay, bench, enable, disable."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from loguru import logger

__all__ = ["main"]


def _enable_logging(verbose: int) -> None:
    logger.remove()
    logger.add(sys.stderr, level="DEBUG" if verbose > 1 else "INFO" if verbose else "WARNING")
    logger.enable("hermes_actors")
    logger.enable("actors")


def root_path(text: str) -> Path:
    """An argparse ``type`` for ``--root``: an empty value is refused, not read as the current directory.

    Args:
        text: the option's value.

    Returns:
        The path.

    Raises:
        argparse.ArgumentTypeError: the value is empty.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError("the Hermes root is empty; pass its directory (e.g. ~/.hermes)")
    return Path(text)


def _runner_for(kind: str, cli: str | None, root: Path) -> Any:
    """The ``Gateway(runner=...)`` of ``--runner``: None (the real Hermes, chosen at start), ``"demo"`` or a runner."""
    if kind == "demo":
        return "demo"
    from hermes_actors.core.config import load_config

    timeout = load_config(root).turn_timeout_seconds
    if kind == "hermes":
        if cli is None:
            return None
        from hermes_actors.hermes.select import default_runner

        return default_runner(root, cli=cli, timeout=timeout)
    from hermes_actors.local.command_runner import CommandRunner

    return CommandRunner(cli=cli, timeout=timeout)


def _cmd_demo(args: argparse.Namespace) -> int:
    from hermes_actors.demo.script import run_demo

    return run_demo(keep=args.keep, out=sys.stdout)


def _cmd_roster(args: argparse.Namespace) -> int:
    from hermes_actors.gateway import Gateway

    with Gateway(args.root, runner=lambda turn: "") as gw:
        rows = gw.roster()
    if args.json:
        print(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode())
        return 0
    print(f"{'handle':<20} {'profile':<20} {'title':<20} {'connection':<16} online")
    for row in rows:
        online = {True: "yes", False: "no", None: "unknown"}[row["online"]]
        conn = row["connection_id"] or "local"
        print(f"@{row['handle']:<19} {row['profile']:<20} {row['title'][:20]:<20} {conn:<16} {online}")
    return 0


def _print_outcome(outcome: dict[str, Any]) -> int:
    print(outcome["text"])
    return 0 if outcome["status"] in ("replied", "silent") else 1


def _send_via_host(args: argparse.Namespace) -> int | None:
    """Submit through the host serving the root; None when no host runs there."""
    import time

    from hermes_actors.hermes.submit_client import HostOffline, fetch_outcome, request

    payload = {"op": "send", "sender": args.sender, "target": args.target, "message": args.message, "hop": 0}
    try:
        ack = request(args.root, payload, timeout=30.0)
    except HostOffline:
        return None
    except TimeoutError:
        print(f"error: the host of {args.root} did not answer within 30s; the DM may or may not be queued",
              file=sys.stderr)
        return 3
    print(orjson.dumps(ack).decode())
    if "error" in ack:
        return 2
    if args.wait is None:
        return 0
    deadline = time.monotonic() + args.wait
    while True:  # the host waits for us, in slices it accepts
        try:
            wait = max(0.0, min(60.0, deadline - time.monotonic()))
            outcome = fetch_outcome(args.root, ack["delivery_id"], wait=wait)
        except (HostOffline, TimeoutError) as exc:
            print(f"error: lost the host of {args.root} while waiting for the outcome: {exc}", file=sys.stderr)
            return 3
        if outcome.get("status") not in ("pending", "unknown"):
            return _print_outcome(outcome)
        if outcome.get("status") == "unknown" or time.monotonic() >= deadline:
            why = outcome.get("error") or f"no outcome for delivery {ack['delivery_id']} within {args.wait}s"
            print(f"error: {why}", file=sys.stderr)
            return 3


def _cmd_send(args: argparse.Namespace) -> int:
    from hermes_actors.cli.serve import stop_gateway
    from hermes_actors.gateway import Gateway

    via_host = _send_via_host(args)
    if via_host is not None:
        return via_host
    print(f"note: no host serves {args.root} (start one with `hermes-actors serve --root {args.root}`); "
          "running this DM inside this command instead", file=sys.stderr)
    # This command prints the outcome itself: waking the sender's Bot Chat is for hosts (serve, the gateway).
    no_wake = {"bot_mode": {"wake_sender": False}}
    gw = Gateway(args.root, runner=_runner_for(args.runner, args.cli, args.root), config=no_wake).start()
    try:
        ack = gw.message_agent(sender=args.sender, target=args.target, message=args.message)
        print(orjson.dumps(ack).decode())
        if "error" in ack:
            return 2
        if args.wait is None:
            return 0
        try:
            outcome = gw.wait_outcome(ack["delivery_id"], timeout=args.wait)
        except TimeoutError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 3
        return _print_outcome(outcome)
    finally:  # a turn still running gets the stop grace, then its process group is ended (never orphaned)
        stop_gateway(gw, again=False)


def _cmd_serve(args: argparse.Namespace) -> int:
    from hermes_actors.cli.serve import serve

    config = {"bot_mode": {"transport": args.redis}} if args.redis else None
    try:
        return serve(args.root, connection_id=args.connection_id,
                     runner=_runner_for(args.runner, args.cli, args.root), config=config)
    except RuntimeError as exc:  # another process already hosts the root
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _cmd_enable(args: argparse.Namespace) -> int:
    from hermes_actors.hermes.setup import enable

    profiles = args.profiles.split(",") if args.profiles else None
    report = enable(args.root, profiles, gateway=args.gateway, port=args.port, cli=args.cli)
    print(f"hermes-actors enable on {args.root}:")
    print("\n".join(report.lines()))
    return 0


def _cmd_disable(args: argparse.Namespace) -> int:
    from hermes_actors.hermes.setup import disable

    report = disable(args.root, args.profiles.split(",") if args.profiles else None)
    print(f"hermes-actors disable on {args.root}:")
    print("\n".join(report.lines()))
    return 0


def _cmd_relay(args: argparse.Namespace) -> int:
    from hermes_actors.relay.hub import run_hub

    return run_hub([Path(r) for r in args.root], names=args.name or None)


def _cmd_bench(args: argparse.Namespace) -> int:
    from bench.harness import main as bench_main

    argv: list[str] = []
    if args.quick:
        argv.append("--quick")
    for name in args.scenario or ():
        argv += ["--scenario", name]
    if args.out:
        argv += ["--out", str(args.out)]
    result = bench_main(argv)
    return result if isinstance(result, int) else 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(
        prog="hermes-actors", description="Bot Mode agent-to-agent messaging as an actor system."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="run a scripted conversation among four offline demo bots")
    p.add_argument("--keep", action="store_true", help="keep the temporary Hermes root and print its path")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("roster", help="list the agents a root's gateway can reach")
    p.add_argument("--root", required=True, type=root_path, help="the Hermes root (default profile's home)")
    p.add_argument("--json", action="store_true", help="print JSON rows")
    p.set_defaults(func=_cmd_roster)

    def runner_opts(p: argparse.ArgumentParser) -> None:
        p.add_argument("--runner", choices=("hermes", "command", "demo"), default="hermes",
                       help="how turns run: hermes = the real Hermes (warm through the gateway's API server when "
                            "one serves the root, else the CLI); command = the CLI of a Bot-Mode hermes release; "
                            "demo = offline demo bots")
        p.add_argument("--cli", default=None, help="the hermes executable (default: beside python, then PATH)")

    p = sub.add_parser("send", help="send one DM on a real root")
    p.add_argument("--root", required=True, type=root_path, help="the Hermes root")
    p.add_argument("--from", dest="sender", required=True, help="sending profile (folder id or handle)")
    p.add_argument("target", help="teammate name, peer/agent, or handle@connection")
    p.add_argument("message", help="the message text")
    p.add_argument("--wait", nargs="?", type=float, const=120.0, default=None, help="wait for the outcome (seconds)")
    runner_opts(p)
    p.set_defaults(func=_cmd_send)

    p = sub.add_parser("serve", help="run a gateway on a root until interrupted")
    p.add_argument("--root", required=True, type=root_path, help="the Hermes root")
    p.add_argument("--connection-id", default=None, help="this gateway's connection id on the relay")
    p.add_argument("--redis", default=None, metavar="URL",
                   help="use the Redis Streams transport (redis://[user:password@]host:port/db, rediss:// for TLS, "
                        "or 'redis' to read REDIS_URL); needs --connection-id")
    runner_opts(p)
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("relay", help="play the Desktop relay hub for several local roots")
    p.add_argument("--root", action="append", required=True, type=root_path, help="a root to relay (repeat)")
    p.add_argument("--name", action="append", help="connection id for the matching --root (default: folder name)")
    p.set_defaults(func=_cmd_relay)

    p = sub.add_parser("enable", help="make a hermes-agent root's profiles Bot-Mode-managed (idempotent)")
    p.add_argument("--root", required=True, type=Path, help="the Hermes root")
    p.add_argument("--profiles", default=None, help="comma-separated folder ids (default: every profile)")
    p.add_argument("--gateway", action="store_true", help="also configure `hermes gateway run` to host the actors")
    p.add_argument("--port", type=int, default=8642, help="the API server port --gateway configures")
    p.add_argument("--cli", default=None, help="the hermes executable (default: beside python, then PATH)")
    p.set_defaults(func=_cmd_enable)

    p = sub.add_parser("disable", help="undo what enable changed")
    p.add_argument("--root", required=True, type=Path, help="the Hermes root")
    p.add_argument("--profiles", default=None, help="comma-separated folder ids (default: everything enable did)")
    p.set_defaults(func=_cmd_disable)

    p = sub.add_parser("bench", help="benchmark against a model of the seed design")
    p.add_argument("--quick", action="store_true", help="a short run (under a minute)")
    p.add_argument("--scenario", action="append", help="run only this scenario (repeat)")
    p.add_argument("--out", type=Path, default=None, help="results directory (default bench/results)")
    p.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    _enable_logging(args.verbose)
    try:
        return int(args.func(args))
    except (FileNotFoundError, PermissionError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
