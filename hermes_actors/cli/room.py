"""``hermes-actors room create|send|show|list|disband``: group rooms on a root (docs/rooms.md).

When a host serves the root (``hermes-actors serve``, or the hermes gateway with
the plugin), every command goes through its submit endpoint (the ``room`` op,
:mod:`hermes_actors.rooms.remote`): the host drives the root's rooms and runs the
member turns with its runner. Without a host, ``create`` and ``send`` run their own
gateway on the root for as long as it takes (``send`` waits until the room settled,
then stops it; a round cut short resumes at the next start); ``show``, ``list`` and
``disband`` start none: they work on the room files (:class:`~hermes_actors.rooms.store.RoomsOnDisk`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, Protocol

from hermes_actors.cli.after_action import action_taken
from hermes_actors.cli.arg_types import seconds, utf8_text
from hermes_actors.cli.render import EXIT_FAILED, EXIT_USAGE, refusal_line, rooms_table
from hermes_actors.cli.streams import print_json
from hermes_actors.core.shell import shell_command
from hermes_actors.errors import RoomStopped

__all__ = ["add_room_parser"]


def _print_entry(entry: dict[str, Any]) -> None:
    from hermes_actors.rooms.rules import entry_lines

    tag = "" if entry["status"] == "said" else f" [{entry['status']}]"
    # further lines indented as in the members' turns: a message's own lines never pass for other entries
    print(f"[{entry['round']}] " + entry_lines(f"{entry['author']}{tag}", str(entry["text"])))


def _act(act: Callable[[Any], int], rooms: Any) -> int:
    """Run ``act`` on a Gateway or the host's rooms; what they raise becomes one line and an exit code."""
    from hermes_actors.hermes.submit_client import HostLost, HostOffline, UnreadableAnswer

    try:
        return act(rooms)
    except UnreadableAnswer as exc:  # a ValueError, but the host took the request: never a usage error
        print(f"error: {exc}; the host may have acted on the request: look (hermes-actors room list, room show) "
              "before repeating it", file=sys.stderr)
        return EXIT_FAILED
    except (KeyError, ValueError) as exc:  # no such room, a bad name or members (one raised once the room call was
        # answered is an AfterActionError: cli.after_action)
        print(f"error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return EXIT_USAGE
    except (HostOffline, HostLost, TimeoutError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _with_gateway(args: argparse.Namespace, act: Callable[[Any], int], *, on_disk: bool = False) -> int:
    """Run ``act`` on the host's rooms, else on a gateway of our own (``on_disk``: on the room files).

    ``show``, ``list`` and ``disband`` must not start a gateway: its start resumes every pending
    round (a disbanded room's too, whose member turns would start before it is disbanded) and
    its stop cuts the member turns short after the grace.
    """
    from hermes_actors.cli.gateway_options import check_cli, given_gateway_options, host_ignored_note, runner_for
    from hermes_actors.cli.host_wait import ask_settled_host
    from hermes_actors.cli.serve import stop_gateway
    from hermes_actors.gateway import Gateway
    from hermes_actors.ops.stop_signals import StopSignals
    from hermes_actors.rooms.remote import HostRooms
    from hermes_actors.rooms.store import RoomsOnDisk
    from hermes_actors.store.hermes_root import existing_root

    check_cli(getattr(args, "cli", None))  # as every command taking --cli: whatever --runner says, host or not
    existing_root(args.root)  # a missing root, a profile's home or no root at all: refused before anything is made
    try:
        host = ask_settled_host(args.root, lambda: HostRooms.if_served(args.root))
    except TimeoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if host is not None:  # the host drives the root's rooms: ask it
        note = None if on_disk else host_ignored_note(args.root, given_gateway_options(args),
                                                      does="runs the rooms' member turns",
                                                      without=f"a room {args.room_command} that runs a gateway of "
                                                              "its own")
        if note is not None:
            print(note, file=sys.stderr)
        return _act(act, host)
    if on_disk:
        return _act(act, RoomsOnDisk(args.root))
    runner = runner_for(getattr(args, "runner", "demo"), getattr(args, "cli", None), args.root)
    # SIGTERM and SIGHUP as Ctrl-C, from the start to the end of the stop (ops/stop_signals.py)
    signals = StopSignals(interrupts=True)
    with signals.routed():
        gw = Gateway(args.root, runner=runner, config={"bot_mode": {"wake_sender": False}}).start()
        try:
            return _act(act, gw)
        finally:
            stop_gateway(gw, signals)


def _wait_cut_short(exc: BaseException, args: argparse.Namespace) -> str:
    """Pure: what ``room send`` prints when its wait ended before the room settled (the message is posted).

    No command waits without posting, so it names the one that shows the rounds later, not the
    ``wait_room_idle`` the Python API's text suggests.

    Args:
        exc: what the wait raised: ``TimeoutError`` (``--wait`` ran out), ``RoomStopped`` (the room's gateway, the
            host's or this command's, stopped, or its actor restarts), another ``RuntimeError`` (the host is
            stopping: its rooms are gone), ``HostOffline`` / ``HostLost`` (the host went), ``KeyboardInterrupt``
            (Ctrl-C; SIGTERM and SIGHUP too without a host: ops/stop_signals.py).
        args: the ``room send`` arguments (``root``, ``room``).

    Returns:
        The ``error: ...`` line, or for a stop signal the ``interrupted; ...`` line (as ``send`` says it).
    """
    later = f"(look later with: {shell_command('hermes-actors', 'room', 'show', '--root', args.root, args.room)})"
    if isinstance(exc, TimeoutError):
        return f"error: {exc}; the rounds go on {later}"
    # a stopped gateway's rounds resume at the root's next start, a restarted actor's at once
    goes_on = f"the message is posted and its rounds go on from the room's file {later}"
    if isinstance(exc, KeyboardInterrupt):
        return f"interrupted; {goes_on}"
    if isinstance(exc, RoomStopped):
        return (f"error: room {args.room!r} stopped before it became idle (its gateway stopped, or the room's actor "
                f"failed and restarts); {goes_on}")
    return f"error: {exc}; {goes_on}"


def _after(entries: list[dict[str, Any]], message_id: str) -> list[dict[str, Any]]:
    """Pure: the entries after the one with ``message_id`` (all of them when it is not there)."""
    for index, entry in enumerate(entries):
        if entry.get("message_id") == message_id:
            return entries[index + 1:]
    return entries


def _create(args: argparse.Namespace) -> int:
    def act(gw: Any) -> int:
        room = gw.create_room(args.name, args.members)
        with action_taken():
            if args.json:
                print_json(room)
            else:
                members = ", ".join("@" + m for m in room["members"])
                print(f"room {room['name']} created ({room['room_id']}): {members}")
            return 0

    return _with_gateway(args, act)


def _send(args: argparse.Namespace) -> int:
    from hermes_actors.hermes.submit_client import HostLost, HostOffline
    from hermes_actors.rooms.rules import no_room

    def act(gw: Any) -> int:
        ack = gw.room_send(args.room, args.sender, args.text)
        unknown = no_room(args.room)
        if ack.get("error") == unknown.args[0]:  # a bad argument, as show and disband answer it: not a refusal
            raise unknown
        with action_taken():
            if "error" in ack:
                if args.json:
                    print_json(ack)
                else:
                    print(refusal_line(ack))
                return EXIT_FAILED
            if args.json:
                print_json(ack)
            else:
                print(f"queued in room {args.room}: message {ack['message_id']}")
            return settle(gw, ack)

    def settle(gw: Any, ack: dict[str, Any]) -> int:
        try:
            state = gw.wait_room_idle(args.room, timeout=args.wait)
        except (TimeoutError, RuntimeError, HostOffline, HostLost) as exc:  # the message is posted all the same
            print(_wait_cut_short(exc, args), file=sys.stderr)
            return EXIT_FAILED
        except KeyboardInterrupt as exc:  # a stop signal while the rounds run: say so and where to look, as send
            # does; the exit code is the signal's (cli.main), once this command's own gateway stopped (_with_gateway).
            # One after the wait (the room settled, its lines printing) ends the command as any interrupt does.
            print(_wait_cut_short(exc, args), file=sys.stderr, flush=True)
            raise
        entries = _after(gw.room_transcript(args.room), ack["message_id"])
        if args.json:  # one JSON line per transcript entry, then the room's state
            for entry in entries:
                print_json(entry)
            print_json({"state": state})
            return 0
        for entry in entries:
            _print_entry(entry)
        print(f"room is {state}")
        return 0

    return _with_gateway(args, act)


def _show(args: argparse.Namespace) -> int:
    def act(gw: Any) -> int:
        entries = gw.room_transcript(args.room)
        with action_taken():
            if args.json:
                print_json(entries, indent=True)
            for entry in [] if args.json else entries:
                _print_entry(entry)
            if not entries and not args.json:  # say so: an empty output reads as a command that did nothing
                print(f"room {args.room} has no messages yet", file=sys.stderr)
            return 0

    return _with_gateway(args, act, on_disk=True)


def _list(args: argparse.Namespace) -> int:
    def act(gw: Any) -> int:
        rows = gw.list_rooms()
        with action_taken():
            if args.json:
                print_json(rows, indent=True)
                return 0
            print(rooms_table(rows))
            return 0

    return _with_gateway(args, act, on_disk=True)


def _disband(args: argparse.Namespace) -> int:
    def act(gw: Any) -> int:
        gone = gw.disband_room(args.room)
        with action_taken():
            if args.json:
                print_json(gone)
            else:
                print(f"room {gone.get('name', args.room)} disbanded ({gone.get('room_id', '')}); its "
                      "members' sessions stay")
            return 0

    return _with_gateway(args, act, on_disk=True)


class _NoTurnsHere(argparse.Action):
    """``--runner`` / ``--cli`` on ``room show``, ``list`` or ``disband``: refused naming the option (exit 2).

    Left unknown to argparse, ``room show --runner demo plan`` took ``demo`` for the room and refused
    "unrecognized arguments: --runner plan", naming the room as the stray value. Declared here (hidden from the
    help) with an optional value, every spelling is refused for what it is.
    """

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        """Refuse the option.

        Raises:
            argparse.ArgumentError: always (argparse prints it with the subcommand's usage, exit 2).
        """
        command = parser.prog.rsplit(" ", 1)[-1]
        raise argparse.ArgumentError(self, f"does not apply to room {command}: it asks the host or works on the "
                                           "room files, and runs no member turn (--runner and --cli are for room "
                                           "create and send)")


class _RunnerOptions(Protocol):
    """``runner_opts`` of :func:`hermes_actors.cli.main.build_parser`: adds ``--runner`` and ``--cli``."""

    def __call__(self, p: argparse.ArgumentParser, unused: str | None = None) -> None:
        """Add them to ``p``; ``unused``: their help, on a command that takes them and uses neither."""


# disband's --runner and --cli: it once ran a gateway, and scripts still pass them
_DISBAND_RUNNER_HELP = ("taken and unused: room disband runs no member turn (it asks the host or deletes the room's "
                        "file); kept for older scripts that pass it")


def add_room_parser(sub: Any, root_type: Callable[[str], Any], runner_opts: _RunnerOptions) -> None:
    """Add ``room`` and its subcommands to the ``hermes-actors`` parser.

    Args:
        sub: the top-level subparsers.
        root_type: the ``--root`` argparse type.
        runner_opts: adds ``--runner`` / ``--cli`` (how member turns run without a host: ``create`` and ``send``
            start a gateway of their own, which resumes pending rounds; not ``show`` and ``list``; ``disband`` takes
            them unused, and its help says so).
    """
    room = sub.add_parser("room", help="group rooms: several bots deliberate together")
    rsub = room.add_subparsers(dest="room_command", required=True)

    def common(p: argparse.ArgumentParser, *, runs_turns: bool = True, unused: str | None = None) -> None:
        p.add_argument("--root", required=True, type=root_type, help="the Hermes root")
        if runs_turns:
            runner_opts(p, unused)
        else:  # show and list ask the host or read the files: no turn runs, so a runner is refused
            p.add_argument("--runner", action=_NoTurnsHere)
            p.add_argument("--cli", action=_NoTurnsHere)

    p = rsub.add_parser("create", help="create a room of 2 to 6 local bots")
    p.add_argument("name", type=utf8_text, help="the room's name (members' turns run in the session 'Group: <name>')")
    p.add_argument("members", nargs="+", type=utf8_text, help="member names (handles or friendly names)")
    p.add_argument("--json", action="store_true", help="print the room as JSON")
    common(p)
    p.set_defaults(func=_create)

    p = rsub.add_parser("send", help="post a message to a room and wait until it settles")
    p.add_argument("room", type=utf8_text, help="the room's name or id")
    p.add_argument("text", type=utf8_text, help="the message")
    p.add_argument("--from", dest="sender", default="user", type=utf8_text, help="'user' (default) or a member")
    p.add_argument("--wait", type=seconds, default=600.0, help="seconds to wait for the room to settle (default: 600)")
    p.add_argument("--json", action="store_true",
                   help="print the ack, then each new transcript entry and the final state, as JSON lines")
    common(p)
    p.set_defaults(func=_send)

    p = rsub.add_parser("show", help="print a room's transcript")
    p.add_argument("room", type=utf8_text, help="the room's name or id")
    p.add_argument("--json", action="store_true", help="print JSON entries")
    common(p, runs_turns=False)
    p.set_defaults(func=_show)

    p = rsub.add_parser("list", help="list the rooms")
    p.add_argument("--json", action="store_true", help="print JSON rows")
    common(p, runs_turns=False)
    p.set_defaults(func=_list)

    p = rsub.add_parser("disband", help="delete a room (its members' sessions stay)")
    p.add_argument("room", type=utf8_text, help="the room's name or id")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    common(p, unused=_DISBAND_RUNNER_HELP)  # it runs no turn: --runner and --cli, which it once needed, are still
    # taken (scripts pass them)
    p.set_defaults(func=_disband)
