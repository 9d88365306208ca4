"""``hermes-actors send``: one DM on a real root, through the host serving it, else run by this command.

Through a host the command returns after the ack (or waits for the outcome with
``--wait``); with no host it starts a gateway of its own, runs the DM and waits
for its outcome, since a turn it left running would be abandoned.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from hermes_actors.cli.after_action import action_taken
from hermes_actors.cli.render import (
    EXIT_FAILED,
    ack_line,
    answer_exit_code,
    not_managed_note,
    outcome_command,
    outcome_exit_code,
    outcome_line,
    printable,
    refusal_line,
    refused_as_unmanaged,
)
from hermes_actors.cli.streams import print_json
from hermes_actors.core.clipping import shown
from hermes_actors.core.shell import shell_command
from hermes_actors.ops.stop_signals import StopSignals

__all__ = ["ambiguous_send_line", "cmd_send", "no_host_note"]


def _print_answer(answer: dict[str, Any], args: argparse.Namespace) -> int:
    """Print a send's ack or refusal; the exit code when the command ends here."""
    if args.json:
        print_json(answer)
    elif "error" in answer:
        print(refusal_line(answer))
        if refused_as_unmanaged(answer):  # the tool's text names no fix; a person needs one, host or not
            print(not_managed_note(args.root), file=sys.stderr)
    else:
        print(ack_line(answer, str(args.root)))
    return answer_exit_code(answer)


def _print_outcome(outcome: dict[str, Any], args: argparse.Namespace) -> int:
    if args.json:
        print_json(outcome)
    else:
        print(outcome_line(outcome))
    return outcome_exit_code(outcome)


def no_host_note(root: object, sender: str) -> str:
    """Pure: the note ``send`` prints when no host serves the root: it runs the DM itself and wakes nobody.

    Said up front: a host would also wake the sender's Bot Chat with the outcome; this command does not
    (the wake is decided where the DM is acked and journaled with it: a host running this DM later wakes
    nobody either). docs/hermes.md "wake_sender".

    Args:
        root: the Hermes root.
        sender: ``--from`` as given (a blank one is refused next: the note then says "the sender").

    Returns:
        The note.
    """
    serve = shell_command("hermes-actors", "serve", "--root", root)
    who = shown(sender, sender) if sender.strip() else "the sender"
    return printable(f"note: no host serves {root} (start one with `{serve}`); this command runs the DM itself and "
                     f"prints its outcome: {who} is not woken with it in Bot Chat (only a host wakes senders)")


def ambiguous_send_line(root: object, why: str, delivery_id: str | None = None) -> str:
    """Pure: the line ``send`` prints when the host took its DM but did not say readably whether it queued it.

    Args:
        root: the Hermes root.
        why: what happened (the host did not answer in time, closed without answering, answered garbage).
        delivery_id: the DM's id when the answer gave one: looked for with ``outcome``, else with ``status``.

    Returns:
        e.g. ``ambiguous: …; the DM may or may not be queued (do not resend it blindly; look for it with:
        hermes-actors status --root /r)``.
    """
    look = (outcome_command(root, delivery_id) if delivery_id is not None
            else shell_command("hermes-actors", "status", "--root", root))
    return printable(f"ambiguous: {why}; the DM may or may not be queued (do not resend it blindly; look for it "
                     f"with: {look})")


def _send_via_host(args: argparse.Namespace) -> int | None:
    """Submit through the host serving the root; None when no host runs there."""
    from hermes_actors.cli.gateway_options import given_gateway_options, host_ignored_note
    from hermes_actors.hermes.submit_client import HostLost, HostOffline, UnreadableAnswer, request, send_answer_problem

    payload = {"op": "send", "sender": args.sender, "target": args.target, "message": args.message, "hop": 0}
    try:
        ack = request(args.root, payload, timeout=30.0)
    except HostOffline:
        return None
    except (TimeoutError, HostLost) as exc:  # never run in-process: the host may have queued it already
        why = f"the host of {args.root} did not answer within 30s" if isinstance(exc, TimeoutError) else str(exc)
        print(ambiguous_send_line(args.root, why), file=sys.stderr)
        return EXIT_FAILED
    except UnreadableAnswer as exc:  # it took the DM: never a usage error, never run in-process
        print(ambiguous_send_line(args.root, f"the host of {args.root} answered something unreadable ({exc})"),
              file=sys.stderr)
        return EXIT_FAILED
    problem = send_answer_problem(ack)
    if problem is not None:
        print(ambiguous_send_line(args.root, f"the host of {args.root} answered no ack and no refusal ({problem})"),
              file=sys.stderr)
        return EXIT_FAILED
    note = host_ignored_note(args.root, given_gateway_options(args), does="runs the DM",
                             without="a send that runs the DM itself")
    if note is not None:
        print(note, file=sys.stderr)
    # SIGTERM and SIGHUP as Ctrl-C (ops/stop_signals.py): before, they killed a --wait without a word
    with action_taken(), StopSignals(interrupts=True).routed():
        return _host_answered(ack, args)


def _host_answered(ack: dict[str, Any], args: argparse.Namespace) -> int:
    """Print the host's ack or refusal; with ``--wait``, wait for the DM's outcome at the host and print it.

    Args:
        ack: the host's answer to the send (an ack, or a refusal with ``error``).
        args: the parsed command line.

    Returns:
        The exit code.

    Raises:
        KeyboardInterrupt: a stop signal while it waited (:class:`StopSignalled` for SIGTERM and SIGHUP), once it
            said that the DM stays queued at the host.
    """
    from hermes_actors.hermes.submit_client import HostLost, HostOffline, UnreadableAnswer, fetch_outcome

    code = _print_answer(ack, args)
    if "error" in ack or args.wait is None:
        return code  # right after the ack: the host runs the turn
    deadline = time.monotonic() + args.wait
    while True:  # the host waits for us, in slices it accepts
        try:
            wait = max(0.0, min(60.0, deadline - time.monotonic()))
            outcome = fetch_outcome(args.root, ack["delivery_id"], wait=wait)
        except KeyboardInterrupt:  # only the wait ends: the host keeps the DM and runs it
            print(f"interrupted; the DM stays queued at the host; its outcome, once settled: "
                  f"{outcome_command(args.root, ack['delivery_id'])}", file=sys.stderr)
            raise
        except (HostOffline, HostLost, TimeoutError, UnreadableAnswer) as exc:
            print(f"ambiguous: lost the host of {args.root} while waiting for the outcome ({exc}); look it up "
                  f"later with: {outcome_command(args.root, ack['delivery_id'])}", file=sys.stderr)
            return EXIT_FAILED
        if outcome.get("status") not in ("pending", "unknown"):
            return _print_outcome(outcome, args)
        if outcome.get("status") == "unknown" or time.monotonic() >= deadline:
            why = outcome.get("error") or f"no outcome for delivery {ack['delivery_id']} within {args.wait:g}s"
            print(f"pending: {why}; look it up later with: {outcome_command(args.root, ack['delivery_id'])}",
                  file=sys.stderr)
            return EXIT_FAILED


def cmd_send(args: argparse.Namespace) -> int:
    """``hermes-actors send``: through the host serving the root, else running the DM in this process.

    Args:
        args: the parsed command line.

    Returns:
        The exit code (0 replied, 1 refused, failed, ambiguous or still pending).
    """
    from hermes_actors.cli.gateway_options import check_cli, runner_for, transport_config
    from hermes_actors.cli.host_wait import ask_settled_host
    from hermes_actors.core.config import deep_merge, load_config
    from hermes_actors.gateway import Gateway
    from hermes_actors.store.hermes_root import existing_root

    # A bad option is refused before anything else is said or done (the "no host" note included).
    overrides = transport_config(args)
    check_cli(args.cli)
    # before the host is looked for: a missing root is the error to show, not "no host", and another user's
    # root is named as such, not by the Permission denied its run directory gives
    existing_root(args.root)
    try:
        via_host = ask_settled_host(args.root, lambda: _send_via_host(args))
    except TimeoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if via_host is not None:
        return via_host
    # Without a host the turn runs inside this command, so it must wait for it (else it would be abandoned).
    print(no_host_note(args.root, args.sender), file=sys.stderr)
    cfg = load_config(args.root)
    wait = args.wait if args.wait is not None else cfg.turn_wait_seconds + cfg.turn_timeout_seconds + 10.0
    # This command prints the outcome itself: waking the sender's Bot Chat is for hosts (serve, the gateway).
    config = deep_merge({"bot_mode": {"wake_sender": False}}, overrides)
    runner = runner_for(args.runner, args.cli, args.root)
    # SIGTERM and SIGHUP (`timeout`, a closed terminal) as Ctrl-C, from the start to the end of the stop: before,
    # they killed the command at once and its turn's process ran on, orphaned (ops/stop_signals.py)
    signals = StopSignals(interrupts=True)
    with signals.routed():
        # drive_rooms=False: it runs this DM, no room turn; the rooms stay with the host that drives them (a host
        # starting while this runs finds their lock free), and no pending round is resumed here to be cut short at
        # this command's stop
        gw = Gateway(args.root, runner=runner, config=config, connection_id=args.connection_id,
                     drive_rooms=False).start()
        return _send_here(gw, args, wait, signals)


def _send_here(gw: Any, args: argparse.Namespace, wait: float, signals: StopSignals) -> int:
    """Run the DM on ``gw`` (this command's own gateway), print its outcome and stop ``gw``; the exit code."""
    from hermes_actors.cli.serve import STOP_GRACE_SECONDS, stop_gateway

    stopped = False
    try:
        ack = gw.message_agent(sender=args.sender, target=args.target, message=args.message)
        with action_taken():
            code = _print_answer(ack, args)
            if "error" in ack:
                return code
            try:
                if args.wait is None and _relayed(gw, ack["delivery_id"]):  # nothing runs here: no wait for the reply
                    print(f"note: queued on the relay; its reply is read by the next host of {args.root}, then: "
                          f"{outcome_command(args.root, ack['delivery_id'])}", file=sys.stderr)
                    return code
                try:
                    outcome = gw.wait_outcome(ack["delivery_id"], timeout=wait)
                except TimeoutError as exc:
                    # The stop lets a running turn finish within its grace: its outcome is then known, say it.
                    print(f"pending: {exc}; stopping (a running turn gets up to {STOP_GRACE_SECONDS:.0f} s to "
                          "finish, else its outcome is ambiguous)", file=sys.stderr)
                    stopped = True
                    stop_gateway(gw, signals)
                    try:
                        outcome = gw.wait_outcome(ack["delivery_id"], timeout=0)
                    except (KeyError, TimeoutError):  # durable and never started: the next host on the root runs it
                        print(f"still pending: the next host on {args.root} runs it; then: "
                              f"{outcome_command(args.root, ack['delivery_id'])}", file=sys.stderr)
                        return EXIT_FAILED
            except KeyboardInterrupt:  # a stop signal once acked: the stop below lets a running turn finish first;
                # say where its outcome goes
                print(f"interrupted; the DM's outcome, once settled: "
                      f"{outcome_command(args.root, ack['delivery_id'])}", file=sys.stderr)
                raise
            return _print_outcome(outcome, args)
    finally:  # a turn still running gets the stop grace, then its process group is ended (never orphaned)
        if not stopped:
            stop_gateway(gw, signals)


def _relayed(gw: Any, delivery_id: str) -> bool:
    """Whether an acked DM left for another machine (its envelope is on the relay, the reply comes later)."""
    from hermes_actors.ops.status import live_status

    rows = live_status(gw)["in_flight"]
    return any(row["delivery_id"] == delivery_id and row["route"] == "relay" for row in rows)
