"""The one drain of relay envelopes: claim by rename → read → quarantine → expire.

Three places take envelopes off the relay files, with the same rules:

- the Desktop's ``bot_relay.outbox.drain`` RPC (served by the RelayActor) and
  the hub take them from a root's ``outbox/`` (claimed into ``claimed/``);
- the RelayActor takes the ones the hub posted to its ``inbox/`` (into ``taken/``).

The rename decides who owns an envelope; a file that cannot be read as an
envelope is quarantined, never followed; an envelope older than the TTL is not
delivered but answered ``queued_expired``. An envelope is read once, where it waits,
before the claim: a file still empty or not JSON yet that changed within the write
grace (a writer that creates it, then writes it) is not claimed at all: it is left
where it waits and looked at again at its close-write event or the next rescan
(:func:`~hermes_actors.store.safe_read.may_be_unfinished`). What was read is used
when the file claimed is the one read, unchanged (same inode, size and mtime);
otherwise the claimed file is read again. :func:`drain_envelope` does the
claim, the read and the quarantine, and *decides* the rest: it returns what the
caller must do (deliver, or write the expiry reply where its replies go), so
each caller keeps its own reply path and counters.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from loguru import logger

from hermes_actors.core.ids import validate_delivery_id
from hermes_actors.errors import StoreError, UnfinishedFileError, ValidationError
from hermes_actors.store import relay_files as rf
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.atomic import read_json_file
from hermes_actors.store.relay_dirfd import lexists_below, relay_dir
from hermes_actors.store.relay_inbox import (
    InboxPaths,
    inbox_ttl,
    parse_inbox_envelope,
    reply_connection_of,
    take_from_inbox,
)
from hermes_actors.store.relay_quarantine import quarantine
from hermes_actors.store.relay_shelf import find_on_shelves
from hermes_actors.store.safe_read import read_json_file_stat

__all__ = [
    "Box",
    "DrainResult",
    "Expired",
    "NotOurs",
    "Quarantined",
    "ToDeliver",
    "Unfinished",
    "drain_envelope",
    "drain_outbox",
    "expiry_deadline",
    "expiry_of",
    "expiry_reply",
    "past_deadline",
    "settle_claimed",
]

Box = Literal["outbox", "inbox"]
"""Where the envelope waits: ``outbox/`` (queued by a sender) or ``inbox/`` (posted by the hub)."""


@dataclass(frozen=True, slots=True)
class ToDeliver:
    """The envelope is ours and fresh: deliver it (``reply_connection`` is "" for an outbox envelope)."""

    envelope: dict[str, Any]
    reply_connection: str = ""


@dataclass(frozen=True, slots=True)
class Expired:
    """The envelope is ours but older than the TTL: write ``reply`` (``queued_expired``), do not deliver."""

    envelope: dict[str, Any]
    reply: dict[str, Any]
    reply_connection: str = ""


@dataclass(frozen=True, slots=True)
class Quarantined:
    """We claimed a file that is not a valid envelope; it was moved to ``quarantine/``.

    ``reply``: the error reply its sender is owed (write it where the caller's replies go, ``reply_connection``
    for an inbox envelope), or None when its id (or, from ``inbox/``, its sender's connection) is not to be trusted,
    and for a file from ``inbox/`` that could not be read at all (nothing then names its sender's root).
    """

    envelope_id: str
    why: str
    reply: dict[str, Any] | None = None
    reply_connection: str = ""


@dataclass(frozen=True, slots=True)
class NotOurs:
    """Nothing to do: another drainer won the rename, or the claim failed (``why``, logged)."""

    envelope_id: str
    why: str = ""


@dataclass(frozen=True, slots=True)
class Unfinished:
    """Nothing to do yet: the file is empty or not JSON yet and changed within the write grace, so its writer
    may still be writing it (``why``). It was left unclaimed where it waits; it is looked at again at its
    close-write event or the next rescan, and quarantined once it is still bad past the grace."""

    envelope_id: str
    why: str = ""


DrainResult = ToDeliver | Expired | Quarantined | NotOurs | Unfinished


def expiry_reply(envelope: dict[str, Any], ttl: float, now: float) -> dict[str, Any]:
    """Pure: the seed's ``queued_expired`` reply record for an envelope that waited past ``ttl``.

    Args:
        envelope: a validated envelope.
        ttl: the TTL in seconds (shown in the text).
        now: the current time (the record's ``at``).

    Returns:
        The reply record.
    """
    text = rp.expired_error_text(envelope["target_handle"], envelope["target_connection"], ttl)
    return rp.make_reply(envelope["id"], error=text, reason="queued_expired", now=now)


def _box(paths: InboxPaths, box: Box) -> Path:
    """The directory an envelope of ``box`` waits in."""
    return paths.relay.outbox if box == "outbox" else paths.inbox


@dataclass(frozen=True, slots=True)
class _Read:
    """What the read where the envelope waits gave: its JSON and the file's stat then (None: the claimed file is
    read instead: the read failed for another reason than an unfinished file)."""

    data: Any = None
    seen: os.stat_result | None = None


def _read_where_it_waits(paths: InboxPaths, box: Box, envelope_id: str, now: float) -> _Read | Unfinished:
    """The envelope's one read, where it waits, before any claim: the claim's rename changes the file's ctime,
    which the write grace is judged by.

    Never raises: anything else wrong with the file (gone, refused, malformed) is the claim's and its read's to
    decide, as before.

    Returns:
        :class:`Unfinished` when it may still be being written (empty or not JSON yet, changed within the grace);
        else what was read (nothing, when the read failed).
    """
    directory = _box(paths, box)
    try:
        path = paths.relay.id_file(directory, envelope_id)
        with relay_dir(paths.relay.base, directory) as fd:
            data, seen = read_json_file_stat(path, dir_fd=fd, unfinished_at=now)
    except UnfinishedFileError as exc:
        return Unfinished(envelope_id, str(exc))
    except (OSError, ValidationError):  # HostileFileError and a bad id included: the claim decides
        return _Read()
    return _Read(data, seen)


def _is_what_was_read(claimed: Path, seen: os.stat_result) -> bool:
    """Whether the file claimed is the one read where it waited, unchanged since (same inode, size and mtime)."""
    try:
        now = os.lstat(claimed)
    except OSError:
        return False
    return ((now.st_dev, now.st_ino, now.st_size, now.st_mtime_ns)
            == (seen.st_dev, seen.st_ino, seen.st_size, seen.st_mtime_ns))


def _claim(paths: InboxPaths, box: Box, envelope_id: str) -> Path | None:
    if box == "outbox":
        return rf.claim_envelope(paths.relay, envelope_id)
    return take_from_inbox(paths, envelope_id)


def _load(paths: InboxPaths, path: Path) -> Any:
    """The claimed file's JSON, read through its shelf's descriptor (a shelf swapped for a symlink is refused)."""
    with relay_dir(paths.relay.base, path.parent) as fd:
        return read_json_file(path, dir_fd=fd)


def _parse(box: Box, data: Any, path: Path) -> tuple[dict[str, Any], str]:
    """Pure: the claimed envelope and its reply connection ("" from ``outbox/``); raises ValidationError."""
    if box == "outbox":
        return rp.parse_envelope(data, file_id=path.stem), ""
    return parse_inbox_envelope(data, path)


def _refused(box: Box, data: Any, path: Path, why: str, now: float) -> Quarantined:
    """Pure: a malformed envelope, with the error reply its sender is owed when it can be told who that is."""
    reply_connection = "" if box == "outbox" else reply_connection_of(data)
    reply = None if reply_connection is None else rp.malformed_reply(data, file_id=path.stem, why=why, now=now)
    return Quarantined(path.stem, why, reply, reply_connection or "")


def _unusable(path: Path, why: str, now: float, *, owed: bool) -> Quarantined:
    """Pure: a claimed file that could not be read as an envelope, with the error reply its sender is owed.

    From ``outbox/`` the sender is the root whose outbox it was in, waiting on the id of its name
    (:func:`~hermes_actors.store.relay_protocol.unusable_reply`), when that id is one of its DMs still undelivered
    (``owed``: :func:`_still_undelivered`); from ``inbox/`` its sender's root is named only inside it
    (``reply_connection``), which is not read: no reply.

    Args:
        path: the claimed file (its name carries the id).
        why: why it was refused (the read's error).
        now: the current time.
        owed: whether its sender is told NOT delivered.
    """
    return Quarantined(path.stem, why, rp.unusable_reply(path.stem, why=why, now=now) if owed else None)


def _still_undelivered(paths: InboxPaths, envelope_id: str) -> bool:
    """Whether a DM of the root whose ``outbox/`` held an unreadable file of that id provably never left it.

    Such a file is answered by its name's id, and the first reply written wins: put in ``outbox/`` under the id of
    a DM already taken (its reply on the way), its "NOT delivered" beat the real reply and the sender could resend
    a DM that ran. Answered only when that DM is this root's (``sent/`` records it: in flight), and no taker
    holds it: not on a hub's shelf, not in the real ``claimed/`` (``paths.relay.claimed`` is the hub's shelf in the
    hub's layout), no reply yet. Looked at in the order a taken envelope moves (a hub's shelf, then
    ``claimed/``), so one moving meanwhile is still seen. Never raises.

    Args:
        paths: the sender root's relay layout.
        envelope_id: the id of the file's name.

    Returns:
        True when all of that holds; False otherwise, when the id is invalid, or when a directory cannot be
        looked at (refused: a symlink, another user's): nothing then proves it undelivered.
    """
    base = paths.relay.base
    try:
        name = f"{validate_delivery_id(envelope_id, what='envelope id')}.json"
        return (not find_on_shelves(paths.hubclaims, name, base=base)
                and not lexists_below(base, base / rp.CLAIMED / name)
                and not lexists_below(base, paths.relay.replies / name)
                and lexists_below(base, paths.sent / name))
    except (OSError, ValidationError):  # HostileFileError included
        return False


def _mtime(path: Path) -> float | None:
    """The file's mtime (a rename keeps it): the seed's creation time for an envelope without one."""
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return None


def drain_envelope(paths: InboxPaths, box: Box, envelope_id: str, *, ttl: float, now: float) -> DrainResult:
    """Claim one envelope by rename, read it, quarantine it when hostile, and decide what it needs.

    Args:
        paths: the relay layout of the root the envelope waits in.
        box: ``"outbox"`` or ``"inbox"``.
        envelope_id: the envelope (a file stem seen in ``box``).
        ttl: the configured TTL; applied as the seed does (``int()``: 0.5 never expires). From ``inbox/`` the
            sender root's TTL the hub wrote in the record applies instead (:func:`inbox_ttl`), when it has one.
        now: the current time.

    An envelope without a ``created_at`` (missing or zero) is aged from its
    file's mtime, as the seed does.

    Returns:
        :class:`ToDeliver`, :class:`Expired` (the caller writes ``reply``),
        :class:`Quarantined`, :class:`NotOurs`, or :class:`Unfinished` (left unclaimed: empty or not JSON yet,
        changed within the write grace). Never raises for a bad or
        vanished file: a claimed file that cannot be read is quarantined (the
        claimed and taken directories are never rescanned).
    """
    read = _read_where_it_waits(paths, box, envelope_id, now)
    if isinstance(read, Unfinished):
        logger.debug("relay: left {} in {}/ for now: {}", envelope_id, box, read.why)
        return read
    try:
        claimed = _claim(paths, box, envelope_id)
    except (OSError, ValidationError) as exc:  # StoreError and HostileFileError included
        logger.warning("relay: could not claim {} from {}/: {}", envelope_id, box, exc)
        return NotOurs(envelope_id, str(exc))
    if claimed is None:
        return NotOurs(envelope_id)
    if read.seen is not None and _is_what_was_read(claimed, read.seen):
        return _decide(paths, box, claimed, read.data, ttl=ttl, now=now)
    return settle_claimed(paths, box, claimed, ttl=ttl, now=now)  # replaced or changed since: read what we hold


def settle_claimed(paths: InboxPaths, box: Box, claimed: Path, *, ttl: float, now: float) -> DrainResult:
    """Read an envelope already claimed onto ``claimed``, quarantine it when hostile, and decide what it needs.

    The second half of :func:`drain_envelope`, for a claim made earlier (a shelf adopted from a dead process).

    Args:
        paths: the relay layout of the root the envelope waited in.
        box: where it was claimed from (``"inbox"``: it carries its ``reply_connection`` and sender's TTL).
        claimed: the claimed file.
        ttl: the configured TTL; applied as the seed does (``int()``: 0.5 never expires); from ``inbox/``, the
            sender root's TTL in the record first (:func:`inbox_ttl`).
        now: the current time.

    Returns:
        :class:`ToDeliver`, :class:`Expired`, :class:`Quarantined`, or :class:`NotOurs` when the file vanished.
    """
    try:
        data = _load(paths, claimed)
    except FileNotFoundError:
        return NotOurs(claimed.stem, "the claimed file vanished")
    except (OSError, ValidationError) as exc:  # not JSON, a symlink, too big...: nothing in it is trusted
        quarantine(paths.relay, claimed, str(exc))  # first: our claim of it must not count as a taker's below
        return _unusable(claimed, str(exc), now, owed=box == "outbox" and _still_undelivered(paths, claimed.stem))
    return _decide(paths, box, claimed, data, ttl=ttl, now=now)


def _decide(paths: InboxPaths, box: Box, claimed: Path, data: Any, *, ttl: float, now: float) -> DrainResult:
    """What a claimed envelope whose JSON is ``data`` needs: quarantined when malformed, expired, or delivered."""
    try:
        envelope, reply_connection = _parse(box, data, claimed)
    except ValidationError as exc:  # a JSON object with a bad field: its sender is told, when its id is sound
        quarantine(paths.relay, claimed, str(exc))
        return _refused(box, data, claimed, str(exc), now)
    # from inbox/ it expires at its sender root's TTL, which the hub wrote in it, whoever takes it (inbox_ttl)
    reply = expiry_of(envelope, claimed, ttl=inbox_ttl(envelope, ttl) if box == "inbox" else ttl, now=now)
    if reply is not None:
        return Expired(envelope, reply, reply_connection)
    return ToDeliver(envelope, reply_connection)


def expiry_of(envelope: dict[str, Any], path: Path, *, ttl: float, now: float) -> dict[str, Any] | None:
    """The ``queued_expired`` reply when ``envelope`` (read from ``path``) waited past the TTL, else None.

    Args:
        envelope: the decoded envelope.
        path: its file (its mtime ages an envelope without ``created_at``, as the seed does).
        ttl: the configured TTL; applied as the seed does (``int()``: 0.5 never expires).
        now: the current time.
    """
    if past_deadline(expiry_deadline(envelope, ttl=ttl, mtime=_mtime(path)), now):
        return expiry_reply(envelope, rp.seed_ttl(ttl), now)
    return None


def past_deadline(deadline: float | None, now: float) -> bool:
    """Pure: whether an envelope whose expiry deadline is ``deadline`` is expired at ``now``.

    The rule of :func:`expiry_of`: expired once the clock is strictly past it (the hub's own waits use it too).

    Args:
        deadline: from :func:`expiry_deadline`; None: it never expires.
        now: the current time.

    Returns:
        True when it is expired.
    """
    return deadline is not None and now > deadline


def expiry_deadline(envelope: dict[str, Any], *, ttl: float, mtime: float | None) -> float | None:
    """Pure: when :func:`expiry_of` starts answering ``envelope`` expired (wall-clock time).

    Args:
        envelope: the decoded envelope.
        ttl: the configured TTL; applied as the seed does (``int()``: 0.5 never expires).
        mtime: its file's mtime (ages an envelope without ``created_at``, as the seed does); None: unknown.

    Returns:
        The time past which it is expired; None when it never expires (TTL off).
    """
    return rp.expires_at(envelope, rp.seed_ttl(ttl), fallback_created=mtime)


def drain_outbox(paths: InboxPaths, *, ttl: float, now: float | None = None) -> list[dict[str, Any]]:
    """``bot_relay.outbox.drain``: claim every queued envelope and return the fresh ones.

    Stale artifacts are swept first; an expired envelope gets its ``queued_expired``
    reply in ``replies/`` instead of being returned; hostile files are quarantined.

    Args:
        paths: the relay layout.
        ttl: the TTL in seconds (``<= 0``: never expire).
        now: the current time (default ``time.time()``).

    Returns:
        The claimed envelopes, oldest first (by their files' modification time, then id).
    """
    now = time.time() if now is None else now
    rf.sweep_stale(paths.relay, now=now)
    drained: list[dict[str, Any]] = []
    for envelope_id in rf.list_ids(paths.relay.outbox, oldest_first=True):
        result = drain_envelope(paths, "outbox", envelope_id, ttl=ttl, now=now)
        if isinstance(result, ToDeliver):
            drained.append(result.envelope)
        elif isinstance(result, Expired | Quarantined) and result.reply is not None:
            try:
                rf.write_reply(paths.relay, result.reply)
            except (StoreError, OSError, ValidationError) as exc:  # claimed: it is certainly NOT delivered
                logger.error("relay: could not write the error reply of {}: {}", envelope_id, exc)
    return drained
