"""The hub ⇄ gateway leg of the file relay (our extension; seed readers ignore it).

The Desktop delivers an envelope to the target gateway over RPC. Between
processes on one machine our hub does the same through files:

    bot_relay/inbox/<id>.json      envelope + "reply_connection" + "sender_ttl" (its TTL), posted by the hub
    bot_relay/taken/<id>.json      the gateway claimed it (rename decides); a stop puts back what never started
    bot_relay/delivered/<id>.json  {id, at, reply, error, reason, reply_connection}; first wins
    bot_relay/consumed/<id>.json   sender side: this reply was reported (so a restart never reports twice)
    bot_relay/gateways/<pid>.json  {"pid", "connection_id", "at"}: each gateway process's heartbeat
    bot_relay/started/<id>.json    {"id", "at"}: a relayed-in turn is about to run (written before it runs)
    bot_relay/sent/<id>.json       {"id", "at", "label"}: this root's gateway queued envelope <id> (before the ack)
    bot_relay/expiring/<id>.json   sender side: our own envelope, taken from outbox/ at its TTL; it moves on to
                                   claimed/ once its queued_expired reply is written (a restart finishes it)
    bot_relay/hubclaims/s-<token>/ the hub's claims between the outbox and the target's inbox

``taken/`` holds one shelf per gateway process (``taken/s-<token>/<id>.json``, see
:mod:`hermes_actors.store.relay_shelf`), so the envelopes of a gateway killed -9
are adopted by the next one; ``started/`` tells the adopter which of them may have
run (:mod:`hermes_actors.store.relay_marks`). ``sent/`` and ``expiring/`` are the
sender side's (:mod:`hermes_actors.store.relay_sent`), ``gateways/`` the heartbeats
(:mod:`hermes_actors.store.relay_heartbeat`). This module holds the layout
(:class:`InboxPaths`) and the hub ⇄ gateway records: ``inbox/``, the take from it,
``delivered/`` and ``consumed/``.

Same rules as the rest of the relay: 0600 files, 0700 dirs, temp files in the
temp directory beside ``bot_relay/`` (``RelayPaths.tmp``), ids validated before
any path is built.
"""

from __future__ import annotations

import stat
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hermes_actors.core.ids import validate_delivery_id
from hermes_actors.core.names import HANDLE_RE
from hermes_actors.errors import ValidationError
from hermes_actors.store.atomic import (
    atomic_write_json,
    create_exclusive_json,
    read_json_file,
)
from hermes_actors.store.private_dir import ensure_private_dir
from hermes_actors.store.relay_dirfd import lexists_below, lstat_below, rename_between
from hermes_actors.store.relay_paths import RelayPaths
from hermes_actors.store.relay_protocol import (
    EXPIRING_SHELVES,
    JOURNAL,
    REPLY_FILE_MAX_BYTES,
    ROOM_STARTS,
    ROOMS,
    RUN,
    UNCONFIRMED,
    is_number,
    parse_envelope,
    parse_reply,
    seed_ttl,
)
from hermes_actors.store.relay_shelf import find_on_shelves

__all__ = [
    "HEARTBEAT_DIR",
    "SENDER_TTL",
    "InboxPaths",
    "already_posted",
    "inbox_ttl",
    "is_consumed",
    "mark_consumed",
    "parse_delivered",
    "parse_inbox_envelope",
    "post_to_inbox",
    "read_delivered",
    "reply_connection_of",
    "return_to_inbox",
    "take_from_inbox",
    "write_delivered",
]

HEARTBEAT_DIR = "gateways"  # each gateway process's heartbeat: hermes_actors.store.relay_heartbeat
SENDER_TTL = "sender_ttl"  # in an inbox record: the sender root's envelope TTL, which expires it (inbox_ttl)


@dataclass(frozen=True)
class InboxPaths:
    """The extension's directories beside a :class:`RelayPaths`."""

    relay: RelayPaths
    inbox: Path
    taken: Path
    delivered: Path
    consumed: Path
    heartbeat: Path
    started: Path
    sent: Path
    hubclaims: Path
    expiring: Path
    taken_parent: Path  # ``taken`` is the process's own shelf once it has one; this stays ``bot_relay/taken``

    @classmethod
    def from_root(cls, root: Path | str) -> InboxPaths:
        relay = RelayPaths.from_root(root)
        base = relay.base
        return cls(relay, base / "inbox", base / "taken", base / "delivered", base / "consumed", base / HEARTBEAT_DIR,
                   base / "started", base / "sent", base / "hubclaims", base / "expiring", base / "taken")

    @property
    def journal(self) -> Path:
        """``bot_relay/journal``: the delivery journal's directory (made by the journal's start)."""
        return self.relay.base / JOURNAL

    @property
    def run(self) -> Path:
        """``bot_relay/run``: the host's submit socket and lock (made by the host's submit endpoint)."""
        return self.relay.base / RUN

    @property
    def rooms(self) -> Path:
        """``bot_relay/rooms``: the group rooms (made by the rooms' start)."""
        return self.relay.base / ROOMS

    @property
    def unconfirmed(self) -> Path:
        """``bot_relay/unconfirmed``: the sends Redis did not answer (made by the Redis transport when it keeps one)."""
        return self.relay.base / UNCONFIRMED

    @property
    def room_starts(self) -> Path:
        """``bot_relay/rooms/.started``: the room member turns that began (made by the first one)."""
        return self.rooms / ROOM_STARTS

    @property
    def expiring_shelves(self) -> Path:
        """``bot_relay/hubclaims/expiring``: the hub's shelves of envelopes it expires (made by the hub)."""
        return self.hubclaims / EXPIRING_SHELVES

    def directories(self) -> tuple[Path, ...]:
        """The directories :meth:`ensure` makes, ``bot_relay/`` first (not those their user makes: :meth:`journal`...).

        Returns:
            The relay's (:meth:`RelayPaths.directories`), then inbox, taken, delivered, consumed, gateways,
            started, sent, hubclaims, expiring.
        """
        return (*self.relay.directories(), *self._extension_directories())

    def _extension_directories(self) -> tuple[Path, ...]:
        return (self.inbox, self.taken_parent, self.delivered, self.consumed, self.heartbeat, self.started, self.sent,
                self.hubclaims, self.expiring)

    def ensure(self) -> InboxPaths:
        """Create every directory (0700), refusing hostile ones."""
        self.relay.ensure()
        for directory in self._extension_directories():
            ensure_private_dir(directory, within=self.relay.root)
        return self

    def on_shelf(self, shelf: Path) -> InboxPaths:
        """The same layout with ``taken`` pointing at this process's shelf."""
        return replace(self, taken=shelf)


def post_to_inbox(
    paths: InboxPaths, envelope: dict[str, Any], reply_connection: str, *, sender_ttl: float | None = None
) -> Path:
    """Hub side: hand an envelope to the target gateway.

    Args:
        paths: the target root's layout.
        envelope: the envelope claimed from the sender root's ``outbox/``.
        reply_connection: the sender root's connection id (its ``replies/`` gets the reply).
        sender_ttl: the sender root's ``envelope_ttl_seconds``, kept in the record (``sender_ttl``, as the seed
            applies it: ``int()``) for whoever expires the envelope there (:func:`inbox_ttl`); None leaves it out.

    Returns:
        The inbox file.
    """
    if not HANDLE_RE.match(reply_connection or ""):
        raise ValidationError(f"invalid reply connection id: {reply_connection!r}")
    # a sender_ttl the envelope itself carried is never passed on: only the hub, which read the sender's config, says it
    record = {k: v for k, v in parse_envelope(envelope).items() if k != SENDER_TTL}
    if sender_ttl is not None:
        record[SENDER_TTL] = seed_ttl(sender_ttl)
    record["reply_connection"] = reply_connection
    target = paths.relay.id_file(paths.inbox, record["id"])
    atomic_write_json(target, record, tmp_dir=paths.relay.tmp, within=paths.relay.base)
    return target


def already_posted(source: InboxPaths, target: InboxPaths, envelope_id: str) -> bool:
    """Whether an envelope claimed from ``source`` already reached ``target`` (hub restart).

    The places are checked in the order an envelope moves through them (inbox →
    a gateway's shelf → delivered → the sender's replies), each written before the
    previous one is removed, so an envelope moving meanwhile is still seen.

    Args:
        source: the sender root's layout.
        target: the target root's layout.
        envelope_id: the envelope.

    Returns:
        True when it must not be posted again.

    Raises:
        HostileFileError: a directory to look in is a symlink or not ours (looked at without following it):
            whether the envelope got there cannot be told.
    """
    name = f"{validate_delivery_id(envelope_id, what='envelope id')}.json"
    into = target.relay.base
    return (
        lexists_below(into, target.inbox / name)
        or find_on_shelves(target.taken_parent, name, base=into)
        or lexists_below(into, target.delivered / name)
        or lexists_below(source.relay.base, source.relay.replies / name)
    )


def take_from_inbox(paths: InboxPaths, envelope_id: str) -> Path | None:
    """Gateway side: claim an inbox envelope by rename; None when another taker won.

    The rename is done on directory descriptors opened without following symlinks,
    so an ``inbox/`` (or ``taken/``) swapped for a symlink is refused, never followed.

    Raises:
        HostileFileError: a relay directory on the way is a symlink or not ours.
        OSError: the rename failed for another reason.
    """
    taken = paths.relay.id_file(paths.taken, envelope_id)
    if not rename_between(paths.relay.base, paths.inbox, paths.taken, taken.name):
        return None
    return taken


def return_to_inbox(paths: InboxPaths, envelope_id: str) -> bool:
    """Gateway side: put an envelope we took, and never started, back into ``inbox/`` (the reverse of the take).

    One rename, on directory descriptors like :func:`take_from_inbox`: the envelope is
    on our shelf or in ``inbox/``, never in neither, so the hub never posts it twice and
    the next taker (this root's next gateway, or another one running on it) finds it.

    Returns:
        True when it went back; False when it is not on our shelf.

    Raises:
        HostileFileError: a relay directory on the way is a symlink or not ours.
        OSError: the rename failed for another reason.
    """
    name = paths.relay.id_file(paths.taken, envelope_id).name
    return rename_between(paths.relay.base, paths.taken, paths.inbox, name)


def reply_connection_of(data: Any) -> str | None:
    """Pure: the connection a decoded inbox or delivered record sends its reply to; None when it names no valid one.

    Args:
        data: the decoded record (anything).

    Returns:
        The connection id, or None.
    """
    if not isinstance(data, dict):
        return None
    reply_connection = str(data.get("reply_connection") or "")
    return reply_connection if HANDLE_RE.match(reply_connection) else None


def _split(data: Any, name: str, what: str) -> tuple[dict[str, Any], str]:
    """Pure: a record carrying ``reply_connection`` as (the seed-format core, the connection); ``name`` for errors."""
    if not isinstance(data, dict):
        raise ValidationError(f"{name}: {what} must be a JSON object")
    reply_connection = reply_connection_of(data)
    if reply_connection is None:
        raise ValidationError(f"{name}: invalid reply_connection {str(data.get('reply_connection') or '')!r}")
    return {k: v for k, v in data.items() if k != "reply_connection"}, reply_connection


def parse_inbox_envelope(data: Any, path: Path) -> tuple[dict[str, Any], str]:
    """Pure: a decoded inbox record (read from ``path``) as (the envelope, its reply connection).

    The envelope keeps the record's ``sender_ttl`` (read it with :func:`inbox_ttl`).

    Raises:
        ValidationError: it is not an inbox envelope for that file's name (a ``sender_ttl`` that is no finite
            number included).
    """
    core, reply_connection = _split(data, path.name, "an inbox envelope")
    envelope = parse_envelope(core, file_id=path.stem)
    ttl = envelope.get(SENDER_TTL)
    if SENDER_TTL in envelope and not is_number(ttl):
        raise ValidationError(f"inbox field {SENDER_TTL!r} is not a number of seconds: {ttl!r}")
    return envelope, reply_connection


def inbox_ttl(envelope: Mapping[str, Any], ttl: float) -> float:
    """Pure: the TTL an envelope waiting in a root's ``inbox/`` expires at, whoever checks it.

    It is its sender root's, as for the seed, which checks a DM's age only where it is claimed from its
    sender's ``outbox/``, with the sender's config: the hub, which read that config, keeps it in the inbox record
    (``sender_ttl``), so the hub's own deadline for a DM no gateway takes, the gateway taking it and a restart
    adopting it apply one TTL (before, the gateway applied its own root's).

    Args:
        envelope: the envelope, as :func:`parse_inbox_envelope` read it.
        ttl: the checker's own TTL, for a record posted without one (by an older hub).

    Returns:
        The TTL in seconds (``<= 0``: expiry off).
    """
    carried = envelope.get(SENDER_TTL)
    return ttl if carried is None else float(carried)


def read_inbox_envelope(path: Path, *, dir_fd: int | None = None) -> tuple[dict[str, Any], str]:
    """Gateway side: the envelope and its reply connection; raises HostileFileError / ValidationError."""
    return parse_inbox_envelope(read_json_file(path, dir_fd=dir_fd), path)


def write_delivered(paths: InboxPaths, reply: dict[str, Any], reply_connection: str) -> bool:
    """Gateway side: the delivery's reply record; first write wins."""
    record = {**parse_reply(reply), "reply_connection": reply_connection}
    return create_exclusive_json(paths.relay.id_file(paths.delivered, record["id"]), record, tmp_dir=paths.relay.tmp,
                                 within=paths.relay.base)


def parse_delivered(data: Any, envelope_id: str, name: str) -> tuple[dict[str, Any], str]:
    """Pure: a delivered record (as read) as (the reply record, the connection whose replies/ it goes to).

    Args:
        data: the decoded record.
        envelope_id: the id it must carry.
        name: where it was read, for the error.

    Raises:
        ValidationError: it is not a delivered record for ``envelope_id``.
    """
    core, reply_connection = _split(data, name, "a delivered record")
    return parse_reply(core, file_id=envelope_id), reply_connection


def read_delivered(
    path: Path, *, dir_fd: int | None = None, unfinished_at: float | None = None,
) -> tuple[dict[str, Any], str]:
    """Hub side: a delivered record and the connection whose replies/ it goes to.

    Args:
        path: ``delivered/<id>.json``.
        dir_fd: ``delivered/`` opened by :func:`hermes_actors.store.relay_dirfd.relay_dir`: read relative to it.
        unfinished_at: the current time, when the file may still be being written: see ``read_json_file``.

    Raises:
        FileNotFoundError: the record is gone.
        UnfinishedFileError: (with ``unfinished_at``) empty or not JSON yet, changed within the write grace:
            leave it and read it again later.
        HostileFileError / ValidationError: the record is refused (quarantine it).
        OSError: it could not be read.
    """
    data = read_json_file(path, max_bytes=REPLY_FILE_MAX_BYTES, dir_fd=dir_fd, unfinished_at=unfinished_at)
    return parse_delivered(data, path.stem, path.name)


def mark_consumed(paths: InboxPaths, envelope_id: str, *, now: float) -> None:
    """Sender side: remember that this reply was reported to the sender."""
    create_exclusive_json(paths.relay.id_file(paths.consumed, envelope_id), {"id": envelope_id, "at": int(now)},
                          tmp_dir=paths.relay.tmp, within=paths.relay.base)


def is_consumed(paths: InboxPaths, envelope_id: str) -> bool:
    """Whether the envelope's ``consumed/`` mark (its outcome was reported) is there, through the checked walk.

    A ``consumed/`` swapped for a symlink (or a directory not ours) is never looked through: a file outside the root
    would make a DM count as reported and its ``sent/`` record be dropped unreported. Refused, it reads as not
    consumed: a second report of an outcome is preferred to a lost one. Only a regular file is a mark (a symlink
    planted at its name is none).

    Args:
        paths: the relay layout.
        envelope_id: the envelope.

    Returns:
        True when a regular file of that name is in ``consumed/``.
    """
    path = paths.relay.id_file(paths.consumed, envelope_id)
    try:
        info = lstat_below(paths.relay.base, path)
    except (OSError, ValidationError):  # FileNotFoundError (no mark, no consumed/), HostileFileError included
        return False
    return stat.S_ISREG(info.st_mode)
