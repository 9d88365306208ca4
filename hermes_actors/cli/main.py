"""The ``hermes-actors`` command: demo, roster, send, outcome, status, doctor, room, serve, relay, bench,
enable, disable.

Exit codes (every command): 0 ok / replied, 1 refused, failed or ambiguous (a
doctor that found a blocker; ``outcome`` of a DM still pending or of an unknown
id), 2 usage error. Refusals and failures print one human line; ``--json`` prints the dict.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from loguru import logger

from hermes_actors.cli.after_action import USAGE_ERRORS, AfterActionError
from hermes_actors.cli.arg_types import (
    MAX_SUSTAINED_SECONDS,
    Parser,
    executable,
    root_path,
    seconds,
    sustained_seconds,
    user_path,
    utf8_text,
)
from hermes_actors.cli.gateway_options import given_gateway_options, host_ignored_note, runner_for, transport_config
from hermes_actors.cli.ops_commands import cmd_doctor, cmd_outcome, cmd_status
from hermes_actors.cli.render import (
    EXIT_FAILED,
    EXIT_SIGPIPE,
    EXIT_USAGE,
    not_managed_note,
    printable,
    roster_table,
)
from hermes_actors.cli.send import cmd_send
from hermes_actors.cli.streams import (
    StdoutError,
    devnull_onto,
    output_streams,
    print_json,
    stdout_error_line,
    stdout_target,
    unescaped,
    unescaped_output,
)
from hermes_actors.core.clipping import shown
from hermes_actors.core.shell import shell_command
from hermes_actors.errors import TransportError
from hermes_actors.ops.stop_signals import StopSignalled, StopSignals, signal_exit_code

__all__ = ["main"]


# loguru's default line (LOGURU_FORMAT replaces it, as it does loguru's); its message and exception are shown
# escaped (_log_line, _log_format)
_LOGURU_DEFAULT = ("<green>{time:YYYY-MM-DD HH:mm:ss.SSS Z}</green> | <level>{level: <8}</level> | "
                   "<cyan>{name}</cyan>:<cyan>{function}</cyan>:<cyan>{line}</cyan> - <level>{message}</level>")
_MESSAGE_FIELD = re.compile(r"\{message(?=[:!}])")
_EXCEPTION_FIELD = re.compile(r"\{exception(?=[:!}])")


def log_line(template: str) -> str:
    """Pure: the CLI's log line from a loguru format string (``LOGURU_FORMAT``, else loguru's default).

    Its ``{message}`` and ``{exception}`` fields (the exception after the line, as loguru adds it to a format
    string without one) read the escaped copies :func:`_log_format` puts in the record's ``extra``; colour
    markup and every other field stay as written.

    Args:
        template: a loguru format string (``<green>{time}</green> {message}``).

    Returns:
        The format the CLI's sink uses.
    """
    line = template if _EXCEPTION_FIELD.search(template) else template + "\n{exception}"
    line = _MESSAGE_FIELD.sub("{extra[printable_message]", line)
    return _EXCEPTION_FIELD.sub("{extra[printable_exception]", line)


def _exception_text(exception: Any) -> str:
    """Pure: a record's exception (loguru's ``(type, value, traceback)``, or None) as its traceback, escaped
    (:func:`printable`): its text names paths and values from disk. Frames only, never their variables (the
    ``diagnose=False`` of :func:`_enable_logging`)."""
    if exception is None:
        return ""
    return printable("".join(traceback.format_exception(exception.type, exception.value, exception.traceback)))


def _log_formatter(line: str) -> Callable[[Any], str]:
    """The sink's format function for ``line`` (:func:`log_line`)."""

    def _log_format(record: Any) -> str:
        """The CLI's log line of ``record``: its message, which names folders, paths and values from disk, and its
        exception's traceback are shown escaped (:func:`printable`) as every line the command prints; the sink
        writes below the escaping stream (:func:`~hermes_actors.cli.streams.unescaped`), so loguru's colours
        stay colours."""
        record["extra"]["printable_message"] = printable(record["message"])
        record["extra"]["printable_exception"] = _exception_text(record["exception"])
        return line

    return _log_format


def _to_stderr(message: str) -> None:
    # sys.stderr as it is at each write, not as it was at start: a process (a test) that swaps its stderr
    # and closes the old one must not leave a sink writing to a closed file.
    unescaped(sys.stderr).write(message)


def _enable_logging(verbose: int) -> None:
    logger.remove()
    # diagnose=False: an ERROR's traceback names the code, never the values of its variables (loguru's default
    # printed every frame's locals: a submit handler's request, with the DM's text, at ERROR)
    line = log_line(os.environ.get("LOGURU_FORMAT") or _LOGURU_DEFAULT)
    logger.add(_to_stderr, level="DEBUG" if verbose > 1 else "INFO" if verbose else "WARNING",
               format=_log_formatter(line), colorize=sys.stderr.isatty(), diagnose=False)
    logger.enable("hermes_actors")
    logger.enable("actors")


def _cmd_demo(args: argparse.Namespace) -> int:
    from hermes_actors.demo.script import run_demo

    # SIGTERM and SIGHUP as Ctrl-C (ops/stop_signals.py), until its temporary root is removed: before, they killed
    # the demo and left the root behind, with its gateway's heartbeat
    with StopSignals(interrupts=True).routed():
        return run_demo(keep=args.keep, out=sys.stdout)


def _cmd_roster(args: argparse.Namespace) -> int:
    import time

    from hermes_actors.core.config import load_config
    from hermes_actors.facade.options import redis_settings_for
    from hermes_actors.hermes.submit_client import HostLost, HostOffline, fetch_roster
    from hermes_actors.ops.remote_roster import read_remote_roster, roster_rows_read
    from hermes_actors.ops.status import transport_problems
    from hermes_actors.store.hermes_root import discover_profiles, existing_root, install_is_managed

    root = existing_root(args.root)
    overrides = transport_config(args)  # a bad --connection-id or --redis is refused, host or not
    profiles = discover_profiles(root)
    try:  # the running host's view (on Redis, a second process could not join its connection id anyway)
        rows = fetch_roster(args.root)
    except (HostOffline, HostLost):
        hosted = False
        config = load_config(args.root, overrides)
        # No gateway is started to list it: one would run the DMs journaled for the next host (with no runner
        # of its own) and, on Redis, take the connection's lease and read its inbox. The transport is checked
        # as a start checks it (a connection id for Redis, the [redis] extra), and its roster read below.
        connection_id = redis_settings_for(config, args.connection_id)[1]
    else:  # the host lists the roster of its own transport and connection id: --redis/--connection-id are not its
        hosted = True
        config = load_config(args.root)
        connection_id = None
        note = host_ignored_note(args.root, given_gateway_options(args), does="lists the roster",
                                 without="a roster that reads the transport itself")
        if note is not None:
            print(note, file=sys.stderr)
    # the roster where the transport keeps it: an unreachable Redis is said (as status and doctor say it)
    reading = read_remote_roster(root, config.raw, connection_id=connection_id)
    problems = transport_problems(root, reading)
    if not hosted:
        rows = roster_rows_read(profiles, reading, now=time.time())
    if args.json:
        print_json(rows, indent=True)
        for problem in problems:  # the rows stay the JSON; the note goes where a script's reader looks
            print(f"note: {problem}", file=sys.stderr)
        return 0
    print(roster_table(rows))
    peers = config.peers
    print(f"peers: {', '.join(peers)}" if peers else "peers: none (list peer gateways under bot_peers in config.yaml)")
    for problem in problems:
        print(f"note: {problem}")
    if not hosted:  # 'online' says a profile can take DMs, but only a host takes the bots' own
        print(f"note: no host serves {args.root}: the bots' message_agent calls are refused (runtime_offline) until "
              f"one runs (`{shell_command('hermes-actors', 'serve', '--root', args.root)}`, or `hermes gateway run` "
              "with the plugin); `hermes-actors send` still delivers, running the DM inside the command")
    if not install_is_managed(profiles):
        print(not_managed_note(args.root))
    return 0


def _http_settings(args: argparse.Namespace) -> Any:
    """``serve --http``'s settings (None without --http). Raises ValueError naming what is wrong."""
    if args.http is None:
        if args.http_token is not None:
            raise ValueError("--http-token needs --http HOST:PORT")
        return None
    from hermes_actors.ops.http_config import http_settings

    settings = http_settings(args.http, args.http_token)
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise ValueError("--http needs the prometheus_client package: pip install 'hermes-actors[ops]'") from None
    return settings


def _cmd_serve(args: argparse.Namespace) -> int:
    from hermes_actors.cli.serve import serve
    from hermes_actors.store.hermes_root import existing_root

    existing_root(args.root)  # a missing root, or a profile's home, is a usage error before anything starts
    overrides = transport_config(args)  # before anything starts: so is a bad --connection-id or --redis
    http = _http_settings(args)  # before anything starts: a refused --http starts nothing
    try:
        return serve(args.root, connection_id=args.connection_id,
                     runner=runner_for(args.runner, args.cli, args.root), config=overrides or None, http=http)
    except RuntimeError as exc:  # another process already hosts the root, or --http cannot be bound
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _cmd_enable(args: argparse.Namespace) -> int:
    from hermes_actors.cli.gateway_options import check_cli
    from hermes_actors.hermes.setup import enable

    check_cli(args.cli)  # before anything is written: enable would pass it over for another hermes, saying nothing
    profiles = args.profiles.split(",") if args.profiles is not None else None
    return _setup_report("enable", args, lambda: enable(args.root, profiles, gateway=args.gateway, port=args.port,
                                                        cli=args.cli))


def _cmd_disable(args: argparse.Namespace) -> int:
    from hermes_actors.hermes.setup import disable

    return _setup_report("disable", args,
                         lambda: disable(args.root, args.profiles.split(",") if args.profiles is not None else None))


def _setup_report(command: str, args: argparse.Namespace, run: Callable[[], Any]) -> int:
    """Run ``enable`` or ``disable`` and print its report; one that stopped part-way prints what it changed, then
    its error is raised to be said as every error is (:func:`main`)."""
    from hermes_actors.hermes.recorded_edits import SetupStopped

    stopped: SetupStopped | None = None
    try:
        report = run()
    except SetupStopped as exc:
        report, stopped = exc.report, exc
    print(f"hermes-actors {command} on {args.root}:")
    print("\n".join(report.lines()))
    if stopped is not None:
        raise stopped.cause
    return 0


def _cmd_relay(args: argparse.Namespace) -> int:
    from hermes_actors.relay.hub import run_hub

    return run_hub([Path(r) for r in args.root], names=args.name or None)


def _cmd_bench(args: argparse.Namespace) -> int:
    from bench.harness import run_command

    # the values parsed here, not written back out as arguments for bench's own parser: `--out=-results` was
    # taken here and refused there, `--sustained-seconds=-3` echoed back as '-3.0'
    with unescaped_output():  # its progress bar redraws its line with \r and an ESC sequence
        return run_command(args.quick, args.scenario, args.out, progress=not args.no_progress,
                           sustained_s=args.sustained_seconds)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    parser = Parser(
        prog="hermes-actors", description="Bot Mode agent-to-agent messaging as an actor system."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help=_VERBOSE_HELP)
    # -v also after the subcommand, where the docs put it (and after room's own: _sub_parser)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_sub_parser(1))

    p = sub.add_parser("demo", help="run a scripted conversation among four offline demo bots")
    p.add_argument("--keep", action="store_true", help="keep the temporary Hermes root and print its path")
    p.set_defaults(func=_cmd_demo)

    def transport_opts(p: argparse.ArgumentParser) -> None:
        p.add_argument("--connection-id", default=None, type=utf8_text,
                       help="this gateway's connection id on the relay or Redis (default: bot_mode.connection_id)")
        p.add_argument("--redis", default=None, metavar="URL", type=utf8_text,
                       help="use the Redis Streams transport (redis://[user:password@]host:port/db, rediss:// for "
                            "TLS, or 'redis' to read REDIS_URL); needs a connection id")

    p = sub.add_parser("roster", help="list the agents a root's gateway can reach")
    p.add_argument("--root", required=True, type=root_path, help="the Hermes root (default profile's home)")
    p.add_argument("--json", action="store_true", help="print JSON rows")
    transport_opts(p)
    p.set_defaults(func=_cmd_roster)

    def runner_opts(p: argparse.ArgumentParser, unused: str | None = None) -> None:
        """Add --runner and --cli; ``unused``: their help on a command that takes them and uses neither."""
        # default None, read as hermes (gateway_options.runner_for): `send` can tell a --runner given from none
        p.add_argument("--runner", choices=("hermes", "command", "demo"), default=None,
                       help=unused or "how turns run: hermes = the real Hermes (warm through the gateway's API server "
                                      "when one serves the root, else the CLI; the default); command = the CLI of a "
                                      "Bot-Mode hermes release; demo = offline demo bots")
        p.add_argument("--cli", type=executable, default=None,
                       help=unused or "the hermes executable (default: beside python, then PATH)")

    p = sub.add_parser("send", help="send one DM on a real root (through its host: returns after the ack unless "
                       "--wait; with no host it runs the DM itself and waits for the outcome)")
    p.add_argument("--root", required=True, type=root_path, help="the Hermes root")
    p.add_argument("--from", dest="sender", required=True, type=utf8_text,
                   help="sending profile (folder id or handle)")
    p.add_argument("target", type=utf8_text, help="teammate name, peer/agent, or handle@connection")
    p.add_argument("message", type=utf8_text, help="the message text")
    p.add_argument("--wait", nargs="?", type=seconds, const=120.0, default=None,
                   help="wait for the outcome (seconds, default 120)")
    p.add_argument("--json", action="store_true", help="print the raw ack/refusal and outcome dicts")
    runner_opts(p)
    transport_opts(p)
    p.set_defaults(func=cmd_send)

    about = ("the outcome of a delivery the root knows (exit 0 replied or silent, 1 failed, ambiguous, pending or "
             "unknown, 2 a malformed id or another usage error)")
    p = sub.add_parser("outcome", help=about, description=about)
    p.add_argument("--root", required=True, type=root_path, help="the Hermes root")
    p.add_argument("delivery_id", type=utf8_text, help="the delivery id `send` printed")
    p.add_argument("--wait", type=seconds, default=0.0, metavar="SECONDS", help="wait this long for a pending one")
    p.add_argument("--json", action="store_true", help="print the outcome dict")
    p.set_defaults(func=cmd_outcome)

    p = sub.add_parser("status", help="what the root's gateway is doing (from the running serve, else the files)")
    p.add_argument("--root", required=True, type=root_path, help="the Hermes root")
    p.add_argument("--json", action="store_true", help="print the status dict")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("doctor", help="check what Bot Mode needs on a root, with the fix for each problem")
    p.add_argument("--root", required=True, type=root_path, help="the Hermes root")
    p.add_argument("--cli", type=executable, default=None,
                   help="the hermes executable (default: beside python, then PATH)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(func=cmd_doctor)

    from hermes_actors.cli.room import add_room_parser

    add_room_parser(sub, root_path, runner_opts)

    p = sub.add_parser("serve", help="run a gateway on a root until interrupted")
    p.add_argument("--root", required=True, type=root_path, help="the Hermes root")
    transport_opts(p)
    p.add_argument("--http", default=None, metavar="HOST:PORT", type=utf8_text,
                   help="serve /metrics (Prometheus), /status (JSON) and a live page at / (default: off; "
                        "':9464' binds 127.0.0.1; any non-loopback host needs a bearer token)")
    p.add_argument("--http-token", default=None, metavar="TOKEN", type=utf8_text,
                   help="the bearer token --http requires (default: $HERMES_ACTORS_HTTP_TOKEN; prefer the variable: "
                        "options show in ps)")
    runner_opts(p)
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("relay", help="play the Desktop relay hub for several local roots")
    p.add_argument("--root", action="append", required=True, type=root_path, help="a root to relay (repeat)")
    p.add_argument("--name", action="append", type=utf8_text,
                   help="connection id for the matching --root (default: folder name)")
    p.set_defaults(func=_cmd_relay)

    p = sub.add_parser("enable", help="make a hermes-agent root's profiles Bot-Mode-managed (idempotent)")
    p.add_argument("--root", required=True, type=root_path, help="the Hermes root")
    p.add_argument("--profiles", default=None, type=utf8_text,
                   help="comma-separated folder ids (default: every profile)")
    p.add_argument("--gateway", action="store_true", help="also configure `hermes gateway run` to host the actors")
    p.add_argument("--port", type=int, default=None,
                   help="the API server port --gateway configures, 1-65535 (default 8642; given, it replaces the one "
                        "set); needs --gateway")
    p.add_argument("--cli", type=executable, default=None,
                   help="the hermes executable (default: beside python, then PATH)")
    p.set_defaults(func=_cmd_enable)

    p = sub.add_parser("disable", help="undo what enable changed")
    p.add_argument("--root", required=True, type=root_path, help="the Hermes root")
    p.add_argument("--profiles", default=None, type=utf8_text,
                   help="comma-separated folder ids (default: everything enable did)")
    p.set_defaults(func=_cmd_disable)

    p = sub.add_parser("bench", help="benchmark against a model of the seed design")
    p.add_argument("--quick", action="store_true", help="a short run (under a minute)")
    p.add_argument("--scenario", action="append", help="run only this scenario (repeat)")
    p.add_argument("--out", type=user_path, default=None,
                   help="results directory, created when missing and checked before any scenario runs "
                        "(default bench/results)")
    p.add_argument("--sustained-seconds", type=sustained_seconds, default=None,
                   help="how long the flat-memory scenario holds its rate (default 600, 10 with --quick; at most "
                        f"{MAX_SUSTAINED_SECONDS:,.0f})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=_cmd_bench)
    return parser


_VERBOSE_HELP = "more log output (-v info, -vv debug)"
_SUB_VERBOSE = "sub_verbose_"  # the dest of a subcommand's -v, followed by its depth (_verbose_options)


def _verbose_options(depth: int) -> argparse.ArgumentParser:
    """The ``-v`` of the subcommands ``depth`` levels down (1: ``room``, 2: ``room create``), counted under a dest
    of their own: argparse parses a subcommand into a fresh namespace and copies all of it over its parent's, so
    with one dest for all, ``room create``'s count (0) replaced the ``-v`` given before it (``room -v create``)."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("-v", "--verbose", dest=f"{_SUB_VERBOSE}{depth}", action="count", default=0,
                         help=_VERBOSE_HELP)
    return options


def _verbosity(args: argparse.Namespace) -> int:
    """Pure: the ``-v`` given on the whole line, wherever each is: before the command, after it, after room's.

    Args:
        args: the parsed command line.

    Returns:
        How many (0: warnings only, 1: info, 2 or more: debug).
    """
    return sum(count for dest, count in vars(args).items() if dest == "verbose" or dest.startswith(_SUB_VERBOSE))


def _sub_parser(depth: int) -> type[argparse.ArgumentParser]:
    """The parser class of the subcommands ``depth`` levels down: each takes ``-v`` (:func:`_verbose_options`),
    and so do its own subcommands (``room create``), a level further down."""
    verbose = _verbose_options(depth)

    class SubParser(Parser):
        def __init__(self, **kwargs: Any) -> None:
            kwargs["parents"] = [*kwargs.get("parents", ()), verbose]
            super().__init__(**kwargs)

        def add_subparsers(self, **kwargs: Any) -> Any:
            kwargs.setdefault("parser_class", _sub_parser(depth + 1))
            return super().add_subparsers(**kwargs)

        def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[Any, list[str]]:
            # argparse parses a subcommand's words with parse_known_args and hands what it did not know
            # to the top-level parser, whose error shows the top-level usage: refuse them here, with the
            # usage of the subcommand (room's nested ones included) they were given to.
            parsed, extras = super().parse_known_args(args, namespace)
            if extras:
                self.error(f"unrecognized arguments: {' '.join(shown(extra, extra) for extra in extras)}")
            return parsed, extras

    return SubParser


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (the console script's, which :mod:`hermes_actors.console` imports and runs).

    stdout or stderr closed (``>&-``): the command runs all the same, what it prints there is dropped
    (:func:`hermes_actors.cli.streams.output_streams`), and its exit code says how it went.

    Args:
        argv: the arguments (default: the process's).

    Returns:
        The exit code.
    """
    with output_streams():
        try:
            return _run(argv)
        except KeyboardInterrupt as exc:  # Ctrl-C before the command started (parsing its arguments): as in it
            return _interrupted(exc)


def _run(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    _enable_logging(_verbosity(args))
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # here, not at exit: a reader that left is a BrokenPipeError we handle
        return code
    except USAGE_ERRORS as exc:
        if isinstance(exc, PermissionError) and exc.errno is not None:  # the OS refused a file: not a usage error
            return _os_failure(args, exc)
        print(f"error: {exc}", file=sys.stderr)  # a missing root, a root you cannot use, a bad value
        return EXIT_USAGE
    except AfterActionError as exc:  # the request was answered (a DM acked, a room made): no bad argument
        if isinstance(exc.__cause__, OSError):  # a file operation failed: said as one, with what to do
            return _os_failure(args, exc.__cause__)
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except TransportError as exc:  # the transport can't be used as configured (credentials, lease, extra)
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt as exc:  # Ctrl-C; SIGTERM and SIGHUP too where a command runs a gateway itself
        return _interrupted(exc)
    except BrokenPipeError:  # `status | head`: the reader left; no traceback, and no second error at exit
        devnull_onto((sys.stdout.fileno(),))
        return EXIT_SIGPIPE
    except StdoutError as exc:  # `> /dev/full`: said as stdout's, not as a file of the root's
        print(f"error: {stdout_error_line(exc, stdout_target())}", file=sys.stderr)
        devnull_onto((sys.stdout.fileno(),))  # what stays in its buffer would fail again at exit
        return EXIT_FAILED
    except OSError as exc:  # the disk is full, a file is unreadable: one line (the traceback with -v)
        return _os_failure(args, exc)


def _interrupted(exc: KeyboardInterrupt) -> int:
    """The exit code of a command a stop signal ended: 128 + its number (a plain ``KeyboardInterrupt`` is Ctrl-C's)."""
    return signal_exit_code(exc.received if isinstance(exc, StopSignalled) else signal.SIGINT)


def _os_failure(args: argparse.Namespace, exc: OSError) -> int:
    """Say a failed file operation in one line (:func:`~hermes_actors.store.os_errors.os_error_message`: the path,
    what keeps you out of it and what to do; the traceback too with -v); exit 1."""
    from hermes_actors.store.os_errors import os_error_message

    if _verbosity(args):
        import traceback

        traceback.print_exception(exc)
    root = getattr(args, "root", None)
    print(f"error: {os_error_message(exc, root=root if isinstance(root, (str, Path)) else None)}", file=sys.stderr)
    return EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
