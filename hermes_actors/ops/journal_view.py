"""Read-only view of a root's delivery journals, for ``status`` and ``outcome`` when no gateway answers.

The journal files (``bot_relay/journal/j-*.log``) belong to the gateways that
write them; this module only reads them, never takes their locks, and refuses
what it must not follow: a symlinked journal directory or file, or a file of
another uid. A line longer than the journal's own limit is skipped and counted
as corrupt, so a hostile file can cost at most one bounded read per line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hermes_actors.core import outcomes
from hermes_actors.core.names import remote_label
from hermes_actors.core.recovery import readable_states
from hermes_actors.core.shell import shell_command
from hermes_actors.errors import ValidationError
from hermes_actors.ops.journal_index import JournalIndex, journal_dir, read_each_journal
from hermes_actors.store.journal_records import JournalFolded, fold_lines, read_lines
from hermes_actors.store.journal_state import KEEP_DELIVERED
from hermes_actors.store.relay_files import read_envelope, read_reply
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.store.relay_sent import UNKNOWN_TARGET_LABEL, read_sent, sent_from_here

__all__ = ["JournalIndex", "find_outcome", "journal_dir", "read_journals", "relayed_target_label", "unknown_why"]


def read_journals(root: str | Path) -> tuple[JournalFolded, list[str]]:
    """Fold every journal file of ``root`` (living gateways' and dead ones'). Never raises.

    Args:
        root: the Hermes root.

    Returns:
        ``(folded, problems)``: the deliveries the journals know, and one line per
        file or directory that was refused or could not be read.
    """
    folded = JournalFolded()

    def fold(_path: Path, fd: int) -> None:
        with os.fdopen(os.dup(fd), "rb") as stream:
            fold_lines(read_lines(stream), folded)

    return folded, read_each_journal(root, fold)


def relayed_target_label(paths: InboxPaths, envelope_id: str) -> str:
    """How the target of one of this root's relayed envelopes is shown to its sender. Never raises.

    The ``sent/`` record keeps the label the ack showed (``@dave on Mini``) until the
    outcome is reported; after that the envelope the relay left in ``claimed/`` still names
    its target (``@dave on <connection id>``).
    """
    try:
        record = read_sent(paths, envelope_id)
        if record is not None:
            return record.label
    except (OSError, ValidationError):
        pass
    try:
        envelope = read_envelope(paths.relay.id_file(paths.relay.claimed, envelope_id))
        return remote_label(envelope["target_handle"], envelope["target_connection"])
    except (OSError, ValidationError):
        return UNKNOWN_TARGET_LABEL


def find_outcome(root: str | Path, delivery_id: str, *, index: JournalIndex | None = None,
                 unread_journals: list[str] | None = None) -> dict[str, Any]:
    """What the root's files know of ``delivery_id``. Never raises for a valid id.

    Local DMs are in the journals, and so are the outcomes of DMs sent to another connection
    (file relay or Redis) once they arrived; until then a file-relay DM is in the relay
    directories (``outbox/``/``claimed/`` while waiting, ``replies/`` once answered), and a
    Redis one is in Redis, which only a running host reads. A reply in ``replies/`` counts only
    for an envelope this root sent (:func:`~hermes_actors.store.relay_sent.sent_from_here`: its
    ``sent/`` record or ``consumed/`` mark); one planted for any other id is no outcome.

    Args:
        root: the Hermes root.
        delivery_id: a delivery id (32 lowercase hex characters).
        index: the journals as a caller that looks ids up again and again keeps them: only what
            was appended since its last look-up is read (None: every journal is read whole).
        unread_journals: told one line per journal file (or the journal directory) that was refused or
            could not be read (they are in an ``unknown`` answer's ``error`` too).

    Returns:
        The outcome dict (docs/protocol.md, "Outcomes"), or ``{"status": "pending" | "unknown",
        "delivery_id", "error"?}``.
    """
    state, problems = (index or JournalIndex()).state(root, delivery_id)
    unread = list(problems)  # the journal files not read: the DM may be in one of them
    if unread_journals is not None:
        unread_journals.extend(problems)
    # as a gateway's recovery reads the journals: it skips an unreadable one
    readable, unreadable = readable_states({} if state is None else {delivery_id: state})
    state = readable.get(delivery_id)
    if unreadable:
        problems.append("its 'accepted' journal record cannot be read (a corrupt or foreign line); "
                        "no gateway runs it")
    if state is not None and state.outcome is not None:
        return dict(state.outcome)
    if state is not None:
        began = "its turn began" if state.started else "it has not started"
        return {"status": "pending", "delivery_id": delivery_id, "error": f"accepted; {began}, no outcome yet"}
    inbox_paths = InboxPaths.from_root(Path(root).expanduser())
    paths = inbox_paths.relay
    reply = None
    if sent_from_here(inbox_paths, delivery_id):
        try:
            reply = read_reply(paths, delivery_id)
        except (OSError, ValidationError) as exc:
            problems.append(f"cannot read the relay reply of {delivery_id}: {exc}")
    elif os.path.lexists(paths.id_file(paths.replies, delivery_id)):
        # Anyone who writes into replies/ can put a file there under any id: only a reply to an envelope this
        # root sent (its sent/ record or consumed/ mark) is an outcome, as only those are waited for by the relay.
        problems.append(f"{paths.id_file(paths.replies, delivery_id)} is not taken as its outcome: this root never "
                        "sent it (no sent/ record or consumed/ mark names it)")
    if reply is not None:
        label = relayed_target_label(inbox_paths, delivery_id)
        return outcomes.from_relay_reply(delivery_id, label, str(reply.get("reply") or ""),
                                         str(reply.get("error") or ""), str(reply.get("reason") or "")).as_dict()
    # the entry's own name, not a listing: a claimed/ of 15,000 envelopes took 13 ms to list
    if any(os.path.lexists(paths.id_file(d, delivery_id)) for d in (paths.outbox, paths.claimed)):
        return {"status": "pending", "delivery_id": delivery_id, "error": "relayed; waiting for the reply"}
    return {"status": "unknown", "delivery_id": delivery_id, "error": unknown_why(root, unread, problems[len(unread):])}


def unknown_why(root: str | Path, unread: list[str], problems: list[str]) -> str:
    """Pure: why no file of ``root`` knows a DM (an ``unknown`` answer's ``error``).

    A journal file not read (a symlink, another user's file, one of ours we may not read) may hold it: that is
    said, with what to do, as ``wait_outcome``'s ``KeyError`` says it; before, "no journal or relay file of this
    root knows it" was said as a fact of a DM journaled in a symlinked file.

    Args:
        root: the Hermes root.
        unread: one line per journal file (or the journal directory) that was refused or could not be read.
        problems: the other problems met (a relay reply that cannot be read...).

    Returns:
        The text.
    """
    files = "journal or relay file of this root"
    if unread:
        files = "journal or relay file of this root that was read"
    why = (f"no {files} knows it (outcomes are kept for the last {KEEP_DELIVERED:,} deliveries; a DM on its way to "
           "another machine over Redis is known to the host that sent it, and to the next host on this root once it "
           "has started)")
    if unread:
        why += (f"; or it is journaled in a journal file that was not read: {'; '.join(unread)}: put that file right "
                f"as {shell_command('hermes-actors', 'doctor', '--root', root)} says (its journal check), then ask "
                "again")
    if problems:
        why += "; " + "; ".join(problems)
    return why
