"""``hermes-actors room create|send|show|list|disband``: group rooms on a root (docs/rooms.md).

Each command runs its own gateway on the root for as long as it takes (``send``
waits until the room settled, then stops it; a round cut short resumes at the next
start). A root a host serves is refused: two gateways would race on its rooms.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import orjson

from hermes_actors.cli.render import EXIT_FAILED, EXIT_USAGE, refusal_line

__all__ = ["add_room_parser"]


def _print_entry(entry: dict[str, Any]) -> None:
    tag = "" if entry["status"] == "said" else f" [{entry['status']}]"
    print(f"[{entry['round']}] {entry['author']}{tag}: {entry['text']}")


def _with_gateway(args: argparse.Namespace, act: Callable[[Any], int]) -> int:
    from hermes_actors.cli.main import _runner_for
    from hermes_actors.cli.serve import stop_gateway
    from hermes_actors.gateway import Gateway
    from hermes_actors.hermes.submit import ping

    if ping(args.root) is not None:
        print(f"error: a host serves {args.root}; stop it first (room commands run their own gateway on the root, "
              "and two gateways would race on its rooms)", file=sys.stderr)
        return EXIT_FAILED
    runner = _runner_for(getattr(args, "runner", "demo"), getattr(args, "cli", None), args.root)
    gw = Gateway(args.root, runner=runner, config={"bot_mode": {"wake_sender": False}}).start()
    try:
        return act(gw)
    except KeyError as exc:  # no such room: a bad argument
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        stop_gateway(gw, again=False)


def _create(args: argparse.Namespace) -> int:
    def act(gw: Any) -> int:
        print(orjson.dumps(gw.create_room(args.name, args.members)).decode())
        return 0

    return _with_gateway(args, act)


def _send(args: argparse.Namespace) -> int:
    def act(gw: Any) -> int:
        before = len(gw.room_transcript(args.room))
        ack = gw.room_send(args.room, args.sender, args.text)
        if "error" in ack:
            print(refusal_line(ack))
            return EXIT_FAILED
        print(orjson.dumps(ack).decode())
        try:
            state = gw.wait_room_idle(args.room, timeout=args.wait)
        except TimeoutError as exc:
            print(f"error: {exc}; the rounds go on at the next start on this root", file=sys.stderr)
            return EXIT_FAILED
        for entry in gw.room_transcript(args.room)[before + 1:]:
            _print_entry(entry)
        print(f"room is {state}")
        return 0

    return _with_gateway(args, act)


def _show(args: argparse.Namespace) -> int:
    def act(gw: Any) -> int:
        entries = gw.room_transcript(args.room)
        if args.json:
            print(orjson.dumps(entries, option=orjson.OPT_INDENT_2).decode())
        for entry in [] if args.json else entries:
            _print_entry(entry)
        return 0

    return _with_gateway(args, act)


def _list(args: argparse.Namespace) -> int:
    def act(gw: Any) -> int:
        rows = gw.list_rooms()
        if args.json:
            print(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode())
            return 0
        print(f"{'name':<24} {'room_id':<32} {'state':<10} members")
        for row in rows:
            members = ", ".join("@" + m for m in row["members"])
            print(f"{row['name'][:24]:<24} {row['room_id']:<32} {row['state']:<10} {members}")
        return 0

    return _with_gateway(args, act)


def _disband(args: argparse.Namespace) -> int:
    def act(gw: Any) -> int:
        print(orjson.dumps(gw.disband_room(args.room)).decode())
        return 0

    return _with_gateway(args, act)


def add_room_parser(
    sub: Any, root_type: Callable[[str], Any], runner_opts: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Add ``room`` and its subcommands to the ``hermes-actors`` parser.

    Args:
        sub: the top-level subparsers.
        root_type: the ``--root`` argparse type.
        runner_opts: adds ``--runner`` / ``--cli`` (how member turns run).
    """
    room = sub.add_parser("room", help="group rooms: several bots deliberate together")
    rsub = room.add_subparsers(dest="room_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--root", required=True, type=root_type, help="the Hermes root")
        runner_opts(p)

    p = rsub.add_parser("create", help="create a room of 2 to 6 local bots")
    p.add_argument("name", help="the room's name (members' turns run in the session 'Group: <name>')")
    p.add_argument("members", nargs="+", help="member names (handles or friendly names)")
    common(p)
    p.set_defaults(func=_create)

    p = rsub.add_parser("send", help="post a message to a room and wait until it settles")
    p.add_argument("room", help="the room's name or id")
    p.add_argument("text", help="the message")
    p.add_argument("--from", dest="sender", default="user", help="'user' (default) or a member")
    p.add_argument("--wait", type=float, default=600.0, help="seconds to wait for the room to settle")
    common(p)
    p.set_defaults(func=_send)

    p = rsub.add_parser("show", help="print a room's transcript")
    p.add_argument("room", help="the room's name or id")
    p.add_argument("--json", action="store_true", help="print JSON entries")
    common(p)
    p.set_defaults(func=_show)

    p = rsub.add_parser("list", help="list the rooms")
    p.add_argument("--json", action="store_true", help="print JSON rows")
    common(p)
    p.set_defaults(func=_list)

    p = rsub.add_parser("disband", help="delete a room (its members' sessions stay)")
    p.add_argument("room", help="the room's name or id")
    common(p)
    p.set_defaults(func=_disband)
