"""Sender side of the relay: this root's own envelopes, ``sent/`` and ``expiring/``.

``sent/<id>.json`` (``{"id", "at", "label", "from", "from_handle", "hop", "wake", "owner"}``)
is written before an envelope is queued: only the envelopes recorded there are
resumed after a restart (an envelope a seed gateway queued on the same root, or a
forged one, is never taken for ours). ``owner`` names the writing gateway's shelf
(``taken/s-<token>``, :mod:`hermes_actors.store.relay_shelf`), whose ``.lock`` it holds for
its whole life: a record is resumed only once that lock is free (its writer dead), so a
second gateway on the same root never waits for, and reports, the envelopes of a living one.
Once its writer is dead, its records are taken over by whoever holds that shelf's lock
(:func:`adopt_sent`): a gateway starting on the root, or one already running on it at its next
rescan (:meth:`~hermes_actors.relay.relay_actor.RelayActor._take_over`). They are rewritten to name
the adopter's shelf, so every later scan sees a living owner.
At its TTL our envelope is taken back from ``outbox/`` into ``expiring/`` and moves on to
``claimed/`` once its ``queued_expired`` reply is written (a restart finishes it).

The order of a send is what a restart reads back: the complete envelope is staged in the
temp directory under a name of its own (:func:`queueing_name`, ``.<id>.queueing``), held
under its writer's ``flock`` from its creation until its rename lands
(:mod:`hermes_actors.store.owner_lock`), then its ``sent/`` record is written, then the rename
queues it in ``outbox/``. A ``sent/`` record whose staged envelope is still there, its lock
free, never left a writer that died: :func:`withdraw_unqueued` takes it (the lock, then a
rename to ``.<id>.withdrawn``, kept under the taker's lock until the outcome is journaled),
and the restart settles it as never sent. One whose lock a living process holds (a second
gateway on the same root in the middle of that send, or a start that withdrew it and is
reporting it) is left to that process. A record without either was queued (or staged by an
older version: unknown).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from loguru import logger

from hermes_actors.core.ids import id_of_file_name, validate_delivery_id
from hermes_actors.errors import ValidationError
from hermes_actors.store.atomic import atomic_write_json, read_json_file
from hermes_actors.store.owner_lock import release, take_unowned
from hermes_actors.store.private_dir import ensure_private_dir
from hermes_actors.store.relay_dirfd import lexists_below, open_dir_below, rename_between
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.store.relay_marks import drop_mark, write_mark
from hermes_actors.store.relay_quarantine import regular_or_quarantined
from hermes_actors.store.relay_shelf import is_shelf_name
from hermes_actors.store.temp_file import discard

__all__ = [
    "UNKNOWN_TARGET_LABEL",
    "SentRecord",
    "Withdrawn",
    "adopt_sent",
    "claim_for_expiry",
    "clear_sent",
    "drop_withdrawn",
    "finish_expiry",
    "list_sent",
    "names_owner",
    "queueing_name",
    "read_sent",
    "record_sent",
    "recorded_sender",
    "restore_sent",
    "sent_from_here",
    "withdraw_unqueued",
    "withdrawn_name",
]


@dataclass(frozen=True)
class SentRecord:
    """One envelope this root's gateway queued and still waits a reply for.

    ``sender``, ``sender_handle``, ``hop``: the DM that sent it ("" and 0 in a record of an older version);
    ``wake``: whether its outcome wakes that sender (``Delivery.wake``; None in an older record);
    ``owner``: the name of its gateway's shelf ("" in an older record, or one naming no shelf: nobody).
    """

    envelope_id: str
    at: float
    label: str
    sender: str = ""
    sender_handle: str = ""
    hop: int = 0
    wake: bool | None = None
    owner: str = ""


_SENDER_MAX = 64  # a folder id or handle longer than this in a sent record is ignored (not one of ours)

# How the target of one of our envelopes is shown when nothing left on the root names it (its sent/ record gone or
# damaged, its envelope no longer in the relay's directories).
UNKNOWN_TARGET_LABEL = "the relayed target"


def record_sent(
    paths: InboxPaths, envelope_id: str, label: str, *, now: float, sender: str = "", sender_handle: str = "",
    hop: int = 0, wake: bool | None = None, owner: str = "",
) -> None:
    """Record (before the envelope is queued) that this envelope is ours, and which DM sent it.

    Args:
        paths: the relay layout.
        envelope_id: the envelope.
        label: how its target is shown to the sender.
        now: the time it is sent.
        sender: the sending profile's folder id (a restart wakes it with the outcome).
        sender_handle: its handle.
        hop: the DM's hop.
        wake: whether the outcome wakes the sender (decided where the DM was acked; None: undecided).
        owner: the sending gateway's shelf name (its lock says to another start whether it still waits).

    Raises:
        ValidationError: the id is invalid.
        StoreError: the record could not be written (then nothing must be queued).
    """
    record = SentRecord(envelope_id, now, label, sender, sender_handle, hop, wake, owner)
    write_mark(paths, paths.sent, envelope_id, _payload(record), fsync=False)  # as durable as the envelope


def restore_sent(paths: InboxPaths, record: SentRecord) -> bool:
    """Write again the ``sent/`` record of one of our envelopes whose record a start quarantined (damaged).

    The first write wins, as for any record: one already there (written meanwhile by another gateway) is left as
    it is.

    Args:
        paths: the relay layout.
        record: the record rebuilt (:func:`~hermes_actors.relay.restart.rebuilt_record`).

    Returns:
        True when this write made the record; False when one was there already.

    Raises:
        ValidationError: the id is invalid.
        HostileFileError: a directory on the way is refused.
        StoreError: the write failed.
    """
    return write_mark(paths, paths.sent, record.envelope_id, _payload(record), fsync=False)


def _payload(record: SentRecord) -> dict[str, Any]:
    """Pure: the ``sent/`` file of a record (``owner`` only when it names a shelf: anything else names nobody)."""
    payload: dict[str, Any] = {"id": record.envelope_id, "at": int(record.at), "label": record.label,
                               "from": record.sender, "from_handle": record.sender_handle, "hop": record.hop}
    if record.wake is not None:
        payload["wake"] = record.wake
    if is_shelf_name(record.owner):  # anything else (a layout without a shelf) names nobody: resumed as before
        payload["owner"] = record.owner
    return payload


def adopt_sent(paths: InboxPaths, owner: str, envelope_ids: list[str]) -> list[SentRecord]:
    """Make ours the ``sent/`` records of these envelopes that still name ``owner``, a dead writer's shelf.

    The caller holds ``owner``'s lock (:func:`~hermes_actors.store.relay_shelf.take_dead`), so it is the one
    adopter: each record is read again under it (one that another adopter took over before we got the lock
    names that adopter now, and is left to it) and rewritten atomically naming our shelf (``paths.taken``), so
    every later scan sees a living owner, us, until our own lock goes.

    Args:
        paths: the relay layout, ``taken`` being our shelf.
        owner: the dead writer's shelf name.
        envelope_ids: the records that named it when they were listed.

    Returns:
        The records adopted, now naming our shelf. One that cannot be read or rewritten is not adopted
        (logged): it still names its dead writer, and the next adopter tries again.
    """
    adopted: list[SentRecord] = []
    for envelope_id in envelope_ids:
        try:
            record = read_sent(paths, envelope_id)
            if record is None or record.owner != owner:
                continue  # its outcome was reported meanwhile, or another adopter took it over first
            ours = replace(record, owner=paths.taken.name)
            atomic_write_json(paths.relay.id_file(paths.sent, envelope_id), _payload(ours), tmp_dir=paths.relay.tmp,
                              within=paths.relay.base)
        except (OSError, ValidationError) as exc:  # StoreError, HostileFileError included
            logger.warning("relay: could not take over the sent record of {} from the stopped gateway {}: {}; left "
                           "for the next gateway that adopts it", envelope_id, owner, exc)
            continue
        adopted.append(ours)
    return adopted


def queueing_name(envelope_id: str) -> str:
    """Pure: the name of our envelope's complete temp while it is being queued (in the relay's temp directory).

    Hidden and never ``*.json`` (no watcher, no listing takes it for an envelope), and unlike the random temp
    names of every other write (``.<id>.json.<random>.tmp``: a reply's or a mark's for the same id look the
    same) it names only this: the envelope, staged before its ``sent/`` record, not yet in ``outbox/``.

    Raises:
        ValidationError: the id is invalid.
    """
    return f".{validate_delivery_id(envelope_id, what='envelope id')}.queueing"


def withdrawn_name(envelope_id: str) -> str:
    """Pure: the name a restart gives a staged envelope it took back (kept until its outcome is journaled).

    Raises:
        ValidationError: the id is invalid.
    """
    return f".{validate_delivery_id(envelope_id, what='envelope id')}.withdrawn"


@dataclass
class Withdrawn:
    """What a start found of our recorded envelopes in the temp directory (:func:`withdraw_unqueued`)."""

    # never reached outbox/, their writer dead: id → the descriptor holding the withdrawn file's lock (ours
    # now: :func:`drop_withdrawn` once the outcome is journaled, or released at stop for the next start)
    never: dict[str, int] = field(default_factory=dict)
    # staged or withdrawn under a living process's lock (a gateway mid-send on this root, or a start reporting
    # it): that process answers for it
    live: set[str] = field(default_factory=set)


def withdraw_unqueued(paths: InboxPaths, envelope_ids: list[str]) -> Withdrawn:
    """At a start: which of our recorded envelopes provably never reached ``outbox/``; take them back.

    Such an envelope's staged temp (:func:`queueing_name`) is still in the temp directory and its lock is
    free: its writer died between the ``sent/`` record and the rename into ``outbox/``. It is taken (the
    lock, then a rename to ``.<id>.withdrawn``, whose lock we keep). One already withdrawn by a start that
    died before its outcome was journaled (its lock free) counts too. A staged or withdrawn file whose lock
    a living process holds is that process's: a second gateway on the root in the middle of its send (which
    queues it and answers its caller), or a start reporting it. Nothing else proves it: a record without
    either was queued, or was written by an older version (which staged it under a random name), and is
    waited for as before; so is one whose temp cannot be looked at (logged).

    Args:
        paths: the relay layout.
        envelope_ids: the (valid) envelope ids ``sent/`` records as ours.

    Returns:
        What was found; the caller owns the locks in ``never``.

    Raises:
        HostileFileError: the temp directory (or a directory above it below the root) is refused.
        OSError: the temp directory could not be opened (missing, permission).
    """
    found = Withdrawn()
    if not envelope_ids:
        return found
    fd = open_dir_below(paths.relay.root, paths.relay.tmp)
    try:
        for envelope_id in envelope_ids:
            try:
                owned, lock = _withdraw(fd, paths.relay.tmp, envelope_id)
            except (OSError, ValidationError) as exc:  # HostileFileError included: unknown, waited for as before
                logger.warning("relay: could not tell whether {} left {} before the restart: {}; waiting for its "
                               "reply as for any envelope of ours", envelope_id, paths.relay.tmp, exc)
                continue
            if lock is not None:
                found.never[envelope_id] = lock
            elif owned:
                found.live.add(envelope_id)
    finally:
        os.close(fd)
    return found


def _withdraw(tmp_fd: int, tmp_dir: Path, envelope_id: str) -> tuple[bool, int | None]:
    """Take back one staged envelope from the temp directory ``tmp_fd`` if its writer died.

    Returns:
        (False, None): no staged or withdrawn file (queued, or staged by an older version); (True, None): a
        living process holds it; (True, lock): it never reached ``outbox/``, withdrawn, its lock ours.

    Raises:
        HostileFileError: the file found is not a regular file of ours.
        OSError: it could not be looked at, locked or renamed.
    """
    staged, withdrawn = queueing_name(envelope_id), withdrawn_name(envelope_id)
    try:
        lock = take_unowned(tmp_dir / staged, dir_fd=tmp_fd)
    except FileNotFoundError:
        pass
    else:
        if lock is None:
            return True, None  # its writer lives (or queued it just now): its send answers for it
        try:  # a start that dies before the outcome is journaled leaves this name: the next one still knows
            os.rename(staged, withdrawn, src_dir_fd=tmp_fd, dst_dir_fd=tmp_fd)
        except BaseException:
            release(lock)
            raise
        return True, lock
    try:
        lock = take_unowned(tmp_dir / withdrawn, dir_fd=tmp_fd)
    except FileNotFoundError:
        return False, None  # queued (its rename into outbox/ happened), or staged by an older version
    return True, lock  # None: a living start withdrew it and reports it


def drop_withdrawn(paths: InboxPaths, envelope_id: str, lock: int) -> None:
    """Remove a withdrawn envelope once its outcome is journaled, then let go of its lock.

    Never raises (the 6 h sweep is the fallback).

    Args:
        paths: the relay layout.
        envelope_id: the envelope.
        lock: the descriptor holding its lock (:class:`Withdrawn`'s ``never``); released in any case.
    """
    try:
        fd = open_dir_below(paths.relay.root, paths.relay.tmp)
    except (OSError, ValidationError):
        release(lock)
        return
    try:
        discard(withdrawn_name(envelope_id), fd, paths.relay.tmp)
    finally:
        os.close(fd)
        release(lock)  # last: while the file is there, only its lock says a living process answers for it


def recorded_sender(data: dict[str, Any], *, profile_key: str = "from") -> tuple[str, str, int, bool | None]:
    """The sending DM a record of one of our envelopes names: (profile, handle, hop, wake).

    Shared by the file relay's ``sent/`` records and the Redis transport's sent meta.

    Args:
        data: the record.
        profile_key: the key of the sending profile (``from`` in ``sent/``, ``from_profile`` in Redis).

    Returns:
        ``("", "", 0, None)`` when it names none (a record of an older version) or not in the expected
        shape; ``wake`` is None when the record does not say (an older version).
    """
    sender, handle, hop = data.get(profile_key, ""), data.get("from_handle", ""), data.get("hop", 0)
    if (not isinstance(sender, str) or not isinstance(handle, str) or len(sender) > _SENDER_MAX
            or len(handle) > _SENDER_MAX or isinstance(hop, bool) or not isinstance(hop, int) or not 0 <= hop <= 1000):
        return "", "", 0, None
    wake = data.get("wake")
    return sender, handle, hop, wake if isinstance(wake, bool) else None


def claim_for_expiry(paths: InboxPaths, envelope_id: str, *, adopt: bool = False) -> Path | None:
    """Take our own envelope out of ``outbox/`` at its TTL (into ``expiring/``), or find it there already.

    The rename decides against a drain that claims it at the same moment. With ``adopt``
    (an envelope resumed after a restart), one found in ``expiring/`` was taken by this
    root's gateway before the restart, which died before the reply was written: the
    caller finishes the expiry now. Without it, only the rename counts.

    Args:
        paths: the relay layout.
        envelope_id: the envelope.
        adopt: also take one already in ``expiring/``.

    Returns:
        The envelope in ``expiring/``; None when a drain claimed it (it will reply).

    Raises:
        ValidationError: the id is invalid.
        HostileFileError: a directory on the way is hostile.
        OSError: the rename failed for another reason than a missing source.
    """
    target = paths.relay.id_file(paths.expiring, envelope_id)
    ensure_private_dir(paths.expiring, within=paths.relay.root)
    if not rename_between(paths.relay.base, paths.relay.outbox, paths.expiring, target.name) and not adopt:
        return None
    return regular_or_quarantined(paths.relay, target, "expiring envelope")


def finish_expiry(paths: InboxPaths, envelope_id: str) -> None:
    """Move an expired envelope from ``expiring/`` to ``claimed/``, where the seed's expiry leaves it.

    Raises:
        HostileFileError: a directory on the way is hostile.
        OSError: the rename failed for another reason than a missing source.
    """
    name = paths.relay.id_file(paths.expiring, envelope_id).name
    ensure_private_dir(paths.relay.claimed, within=paths.relay.root)
    rename_between(paths.relay.base, paths.expiring, paths.relay.claimed, name)


def clear_sent(paths: InboxPaths, envelope_id: str) -> None:
    """Forget an envelope whose outcome was reported (never raises)."""
    drop_mark(paths, paths.relay.id_file(paths.sent, envelope_id))


def list_sent(paths: InboxPaths) -> tuple[list[SentRecord], list[Path]]:
    """The envelopes recorded as ours, and the files of ``sent/`` that are not valid records.

    Returns:
        ``(records, bad_files)``; bad files are for the caller to quarantine.
    """
    records: list[SentRecord] = []
    bad: list[Path] = []
    try:
        names = sorted(os.listdir(paths.sent))
    except OSError:
        return [], []
    for name in names:
        path = paths.sent / name
        try:
            records.append(_read_sent_file(path))
        except FileNotFoundError:
            continue
        except (OSError, ValidationError):
            bad.append(path)
    return records, bad


def names_owner(paths: InboxPaths, owner: str) -> bool:
    """Whether some valid ``sent/`` record still names the shelf ``owner`` as its writer.

    A gateway stopping cleanly asks it of its own shelf: while one does, the shelf is kept (empty, its lock
    released), so a gateway running on the root finds it dead at its next rescan and takes those DMs over.

    Args:
        paths: the relay layout.
        owner: a shelf's name (``s-<token>``).

    Returns:
        True when one does; False when none does, or ``sent/`` cannot be listed (nothing then proves one does).
    """
    return any(record.owner == owner for record in list_sent(paths)[0])


def read_sent(paths: InboxPaths, envelope_id: str) -> SentRecord | None:
    """The ``sent/`` record of one of our envelopes, if there is one.

    Returns:
        None when there is none (never sent from here, or its outcome was reported).

    Raises:
        ValidationError: the id is invalid, or the file is not a valid sent record.
        HostileFileError: the file is refused (a symlink, another uid's...).
        OSError: the file could not be read.
    """
    try:
        return _read_sent_file(paths.relay.id_file(paths.sent, envelope_id))
    except FileNotFoundError:
        return None


def sent_from_here(paths: InboxPaths, envelope_id: str) -> bool:
    """Whether this root's gateway sent envelope ``envelope_id``: its ``sent/`` record (its outcome not reported
    yet) or its ``consumed/`` mark (reported) is there.

    Only such an envelope's ``replies/<id>.json`` is its outcome: anyone who can write into ``replies/`` can put a
    reply there under any id, and one for an id never sent here answers no DM of ours. Never raises.

    Args:
        paths: the relay layout.
        envelope_id: the envelope.

    Returns:
        True when either entry is there; False otherwise, and when the id is invalid or a directory on the way
        is refused (a symlink, another user's) or cannot be opened: nothing there proves it ours.
    """
    try:
        return any(lexists_below(paths.relay.base, paths.relay.id_file(directory, envelope_id))
                   for directory in (paths.sent, paths.consumed))
    except (OSError, ValidationError):  # HostileFileError included
        return False


def _read_sent_file(path: Path) -> SentRecord:
    stem = id_of_file_name(path.name) or ""
    data = read_json_file(path, max_bytes=4096)
    if not isinstance(data, dict) or data.get("id") != stem or not isinstance(data.get("label"), str):
        raise ValidationError(f"{path.name}: not a sent record")
    at = data.get("at")
    if isinstance(at, bool) or not isinstance(at, int | float):
        raise ValidationError(f"{path.name}: 'at' is not a number")
    owner = data.get("owner")
    # a name that is not a shelf's names nobody (never looked up: no path is built from a forged value)
    return SentRecord(stem, float(at), data["label"], *recorded_sender(data),
                      owner=owner if isinstance(owner, str) and is_shelf_name(owner) else "")
