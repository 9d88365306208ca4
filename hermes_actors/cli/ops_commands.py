"""``hermes-actors status``, ``outcome`` and ``doctor``: the operator's view of a root.

``status`` and ``outcome`` ask the running host (``serve``, or the hermes
gateway with the plugin) through the root's submit endpoint; when none answers
they read the root's files instead and say so.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from hermes_actors.cli.render import (
    EXIT_FAILED,
    EXIT_OK,
    outcome_exit_code,
    outcome_line,
    status_text,
)
from hermes_actors.cli.streams import print_json
from hermes_actors.core.clipping import shown
from hermes_actors.core.ids import is_delivery_id
from hermes_actors.ops.journal_index import JournalIndex
from hermes_actors.store.hermes_root import existing_root

__all__ = ["cmd_doctor", "cmd_outcome", "cmd_status", "host_status"]

_HOST_TIMEOUT = 10.0
_WAIT_SLICE = 60.0  # the host accepts waits up to MAX_OUTCOME_WAIT; we ask in slices


def host_status(root: Any) -> tuple[dict[str, Any], str | None]:
    """The root's status from its running host, else from its files.

    Returns:
        ``(status, note)``: ``note`` says why the files were read (None when the host answered).

    Raises:
        FileNotFoundError: no host answers and ``root`` is not a directory.
    """
    from hermes_actors.errors import HostileFileError
    from hermes_actors.hermes.submit_client import HostLost, HostOffline, fetch_status
    from hermes_actors.ops.status import file_status

    try:
        answer = fetch_status(root, timeout=_HOST_TIMEOUT)
    except (HostOffline, HostLost, HostileFileError):  # HostileFileError: bot_relay/ swapped; the files' status says so
        return file_status(root), None
    except (TimeoutError, PermissionError, ValueError, OSError) as exc:
        note = f"the host of {root} did not answer the status request ({exc}); showing what the files say"
        return file_status(root), note
    if "error" in answer:
        return file_status(root), f"the host of {root} refused the status request ({answer['error']}); " \
                                  "showing what the files say"
    return answer, None


def cmd_status(args: argparse.Namespace) -> int:
    """``status``: exit 0 (also when no gateway runs: that is a fact, not a failure)."""
    status, note = host_status(args.root)
    if note:
        print(f"note: {note}", file=sys.stderr)
    if args.json:
        print_json(status, indent=True)
    else:
        print(status_text(status))
    return EXIT_OK


def _lookup(root: Any, delivery_id: str, wait: float, journals: JournalIndex) -> dict[str, Any]:
    """One lookup: the host when one runs (waiting up to ``wait`` there), else the files.

    ``journals``: the root's journals as the previous lookups read them (only what was appended
    since is read).
    """
    from hermes_actors.hermes.submit import HostOffline, fetch_outcome
    from hermes_actors.ops.journal_view import find_outcome

    try:
        answer = fetch_outcome(root, delivery_id, wait=min(wait, _WAIT_SLICE))
    except (HostOffline, TimeoutError, PermissionError, ValueError, OSError):
        return find_outcome(root, delivery_id, index=journals)
    if answer.get("status") == "unknown" or "status" not in answer:
        return find_outcome(root, delivery_id, index=journals)  # e.g. journaled by another process on the root
    return answer


def cmd_outcome(args: argparse.Namespace) -> int:
    """``outcome ID``: 0 replied/silent, 1 failed/ambiguous/pending/unknown, 2 a malformed id."""
    delivery_id = args.delivery_id.strip().lower()
    if not is_delivery_id(delivery_id):
        print(f"error: {shown(args.delivery_id)} is not a delivery id (32 hexadecimal characters, as `send` prints)",
              file=sys.stderr)
        return 2
    existing_root(args.root)
    deadline = time.monotonic() + (args.wait or 0.0)
    journals = JournalIndex()  # a --wait polls the files: each poll reads only what was appended
    while True:
        outcome = _lookup(args.root, delivery_id, max(0.0, deadline - time.monotonic()), journals)
        if outcome.get("status") != "pending" or time.monotonic() >= deadline:
            break
        if not _waits_at_host(args.root):
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))  # the files change only when polled
    if args.json:
        print_json(outcome, indent=True)
    else:
        print(outcome_line(outcome))
    code = outcome_exit_code(outcome)
    if outcome.get("status") == "pending" and not args.json and args.wait:
        print(f"still pending after {args.wait:g}s", file=sys.stderr)
    return code


def _waits_at_host(root: Any) -> bool:
    from hermes_actors.hermes.submit import ping

    return ping(root) is not None


def cmd_doctor(args: argparse.Namespace) -> int:
    """``doctor``: every check with its fix; 1 when anything blocks DMs.

    Raises:
        ValueError: ``--cli`` names no executable (a usage error, as for ``send`` and ``serve``): the check of
            the hermes CLI would pass it over and say no hermes is installed, never naming the value.
    """
    from hermes_actors.cli.gateway_options import check_cli
    from hermes_actors.ops.doctor import run_doctor
    from hermes_actors.ops.doctor_checks import blocking

    check_cli(args.cli)
    checks = run_doctor(args.root, cli=args.cli)
    if args.json:
        print_json({"root": str(args.root), "blocking": blocking(checks), "checks": [c.as_dict() for c in checks]},
                   indent=True)
    else:
        print(f"hermes-actors doctor on {args.root}:")
        for check in checks:
            print(f"  [{check.level:<5}] {check.name}: {check.detail}")
            if check.fix:
                print(f"          fix: {check.fix}")
        verdict = "DMs are blocked until the [block] items are fixed" if blocking(checks) else "nothing blocks DMs"
        print(verdict)
    return EXIT_FAILED if blocking(checks) else EXIT_OK
