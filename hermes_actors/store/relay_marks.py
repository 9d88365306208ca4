"""One-file marks per envelope under ``bot_relay/``, and the ``started/`` mark of a relayed-in turn.

``started/<id>.json`` (``{"id", "at"}``) is written before a relayed-in turn
runs, so a gateway that adopts the envelope after a crash knows the turn may
have run (:class:`TurnStartMarks`), and dropped once its reply is on disk. A
reply that could not be written to ``delivered/`` is kept in the mark
(``{"id", "at", "via", "reply"}``, :func:`keep_reply`) until it is; ``via`` names the
transport the envelope came in on (``relay``: this file relay, the default; ``redis``),
the only one that may write that reply. A mark without it (both transports wrote them
so before ``via``) is the file relay's while its envelope is on a file-relay shelf or its
reply in ``delivered/``, else Redis's (:func:`kept_reply`), which writes it only while its
sender still waits for it (:meth:`~hermes_actors.transports.redis.inbound.InboundDrain.load_owed`). The
sender side's ``sent/`` records (:mod:`hermes_actors.store.relay_sent`) are
written and dropped the same way (:func:`write_mark`, :func:`drop_mark`).
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any, NamedTuple

from loguru import logger

from hermes_actors.core.ids import validate_delivery_id
from hermes_actors.errors import HostileFileError, StoreError, ValidationError
from hermes_actors.store.atomic import atomic_write_json, create_exclusive_json, read_json_file
from hermes_actors.store.private_dir import ensure_private_dir
from hermes_actors.store.relay_dirfd import lexists_below, relay_dir, remove_below
from hermes_actors.store.relay_inbox import InboxPaths, parse_delivered, read_inbox_envelope
from hermes_actors.store.relay_protocol import REPLY_FILE_MAX_BYTES, parse_reply
from hermes_actors.store.relay_quarantine import quarantine
from hermes_actors.store.relay_shelf import find_on_shelves, holding_places

__all__ = ["FILE_RELAY", "REDIS", "KeptReply", "TurnStartMarks", "clear_started", "drop_mark", "holds_reply",
           "keep_reply", "kept_reply", "kept_reply_of_any", "on_a_shelf", "was_started", "write_mark"]

KEPT_MARK_MAX_BYTES = REPLY_FILE_MAX_BYTES + 4096  # a delivered record (the largest reply) and the mark around it
FILE_RELAY = "relay"  # the ``via`` of a reply kept by the file relay
REDIS = "redis"  # the ``via`` of a reply kept by the Redis transport


class KeptReply(NamedTuple):
    """A reply kept in a start mark, as :func:`kept_reply_of_any` reads it."""

    via: str  # the transport that kept it: FILE_RELAY or REDIS
    record: dict[str, Any]  # the reply record
    reply_connection: str  # where it goes
    named: bool  # the mark names ``via``; False: a mark of an older version, ``via`` told by _older_marks_via


def write_mark(paths: InboxPaths, directory: Path, envelope_id: str, payload: dict[str, Any], *, fsync: bool) -> bool:
    """Write ``<directory>/<id>.json`` once (0600, through the relay's temp directory); the first write wins.

    Args:
        paths: the relay layout.
        directory: ``started/`` or ``sent/``.
        envelope_id: the envelope (validated before any path is built).
        payload: the mark's record.
        fsync: flush it to stable storage.

    Returns:
        True when this write made the mark; False when it was there already.

    Raises:
        ValidationError: the id is invalid.
        HostileFileError: a directory on the way is refused.
        StoreError: the write failed.
    """
    name = f"{validate_delivery_id(envelope_id, what='envelope id')}.json"
    return create_exclusive_json(directory / name, payload, tmp_dir=paths.relay.tmp, fsync=fsync,
                                 within=paths.relay.base)


def was_started(paths: InboxPaths, envelope_id: str) -> bool:
    """Whether a relayed-in turn for this envelope was about to run (it may have run).

    Looked up through ``started/`` opened by the checked walk (:func:`lexists_below`), never by path: a
    ``started/`` swapped for a symlink is never followed, so a file outside the root never decides the
    envelope's fate. When that cannot be told (``started/`` refused or unreadable) the turn counts as started,
    said at WARNING: it is answered, never run a second time.

    Args:
        paths: the relay layout.
        envelope_id: the envelope.

    Returns:
        True when its start mark is there (whatever it is), or when that cannot be told.
    """
    mark = paths.relay.id_file(paths.started, envelope_id)
    try:
        return lexists_below(paths.relay.base, mark)
    except (OSError, ValidationError) as exc:  # HostileFileError included: not ours to look into
        logger.warning("relay: cannot tell whether the turn of {} started ({}); it counts as started, so it is "
                       "never run twice (the rescan puts a swapped started/ back)", envelope_id, exc)
        return True


def drop_mark(paths: InboxPaths, path: Path) -> None:
    """Remove a mark file; what cannot be removed (a directory in its place...) is moved aside, never raised.

    Removed through its checked directory (:func:`remove_below`): a ``started/`` or ``sent/`` swapped for a
    symlink is refused and said at WARNING, and nothing outside the root is removed through it (the rescan puts
    the directory back; the mark stays in the directory that was swapped away).

    Args:
        paths: the relay layout (its quarantine).
        path: the mark file.
    """
    try:
        remove_below(paths.relay.root, path)
    except HostileFileError as exc:  # its directory swapped: never followed, nothing to move aside either
        logger.warning("relay: the mark {} was not removed: {}", path, exc)
    except OSError as exc:  # a hostile tree: the relay's actors must keep running (the rescan repairs it)
        quarantine(paths.relay, path, f"could not remove it: {exc}")


def clear_started(paths: InboxPaths, envelope_id: str) -> None:
    """Drop the mark once the envelope's reply is on disk (never raises)."""
    drop_mark(paths, paths.relay.id_file(paths.started, envelope_id))


def keep_reply(paths: InboxPaths, record: dict[str, Any], reply_connection: str, *, now: float,
               via: str = FILE_RELAY, fsync: bool = True) -> None:
    """Put a relayed-in turn's reply into its ``started/`` mark: its ``delivered/`` write failed (or, ``via``
    Redis, before it is written).

    The mark then says more than "the turn may have run": here is its reply. A gateway that
    adopts the envelope after a restart writes that reply (:func:`kept_reply`) instead of
    answering ``ambiguous``, so the sender gets the real answer of a turn that ran.

    Args:
        paths: the relay layout.
        record: the reply record (validated).
        reply_connection: where the hub (or Redis) sends it.
        now: the mark's time.
        via: the transport the envelope came in on: only that one writes the reply (:func:`kept_reply`).
        fsync: flush the mark to stable storage (a kill -9 finds it either way).

    Raises:
        ValidationError: the record or the id is invalid.
        HostileFileError: ``started/`` (or a directory above it) is refused.
        StoreError: the write failed.
    """
    envelope_id = validate_delivery_id(str(record.get("id")), what="envelope id")
    delivered = {**parse_reply(record), "reply_connection": reply_connection}
    payload = {"id": envelope_id, "at": int(now), "via": via, "reply": delivered}
    atomic_write_json(paths.relay.id_file(paths.started, envelope_id), payload, tmp_dir=paths.relay.tmp, fsync=fsync,
                      within=paths.relay.base)


def kept_reply(paths: InboxPaths, envelope_id: str, *, via: str = FILE_RELAY) -> tuple[dict[str, Any], str] | None:
    """The reply :func:`keep_reply` put into this envelope's ``started/`` mark for transport ``via``, with its reply
    connection.

    A reply goes back on the transport its envelope came in on: a root that switched transports
    (file relay to Redis, or back) keeps the other one's kept replies for it, never sends them here.

    Args:
        paths: the relay layout.
        envelope_id: the envelope.
        via: the transport asking (``relay``, ``redis``).

    Returns:
        ``(reply record, reply_connection)``; None when there is no mark, a mark without a reply, or one
        another transport kept (a mark that names none: see :func:`_older_marks_via`).

    Raises:
        HostileFileError / ValidationError: the mark, or ``started/``, is refused.
        OSError: the mark could not be read.
    """
    mark = _read_kept(paths, envelope_id)
    if mark is None or mark[0] != via:
        return None
    return parse_delivered(mark[1], envelope_id, mark[2])


def kept_reply_of_any(paths: InboxPaths, envelope_id: str) -> KeptReply | None:
    """The reply kept in this envelope's ``started/`` mark by either transport, read once (a start that sorts
    the marks by transport).

    Args:
        paths: the relay layout.
        envelope_id: the envelope.

    Returns:
        The kept reply, its ``via`` :data:`FILE_RELAY` or :data:`REDIS` (as :func:`kept_reply` tells them) and
        whether the mark named it; None when there is no mark, a mark without a reply, or one that names
        another transport.

    Raises:
        HostileFileError / ValidationError: the mark, or ``started/``, is refused.
        OSError: the mark could not be read.
    """
    mark = _read_kept(paths, envelope_id)
    if mark is None or mark[0] not in (FILE_RELAY, REDIS):
        return None
    return KeptReply(mark[0], *parse_delivered(mark[1], envelope_id, mark[2]), named=mark[3])


def _read_kept(paths: InboxPaths, envelope_id: str) -> tuple[str, Any, str, bool] | None:
    """A start mark's kept reply, unparsed: ``(the transport that kept it, the reply as read, the mark's name,
    whether the mark named that transport)``; None without a mark or a reply in it."""
    path = paths.relay.id_file(paths.started, envelope_id)
    try:
        data = _read_mark(paths, path)
    except FileNotFoundError:
        return None
    if not isinstance(data, dict) or "reply" not in data:
        return None
    if "via" in data:
        return data["via"], data["reply"], path.name, True
    return _older_marks_via(paths, path.name), data["reply"], path.name, False


def _read_mark(paths: InboxPaths, path: Path) -> Any:
    """A start mark as read through ``started/``'s descriptor (never a symlink), at most KEPT_MARK_MAX_BYTES.

    Raises:
        FileNotFoundError: there is none.
        HostileFileError: a symlink, not a regular file, too large, another user's, or not JSON.
        OSError: ``started/`` or the mark cannot be opened (and ValidationError: ``started/`` itself refused).
    """
    with relay_dir(paths.relay.base, paths.started) as fd:
        return read_json_file(path, max_bytes=KEPT_MARK_MAX_BYTES, dir_fd=fd)


def holds_reply(paths: InboxPaths, mark_name: str) -> bool:
    """Whether the start mark ``<id>.json`` keeps a reply (:func:`keep_reply`), whichever transport kept it.

    Args:
        paths: the relay layout.
        mark_name: ``<id>.json``.

    Returns:
        True when it does, or when that cannot be told (unreadable, refused): as if it did. False when it
        is gone or holds none.
    """
    try:
        data = _read_mark(paths, paths.started / mark_name)
    except FileNotFoundError:
        return False
    except (OSError, ValidationError):  # HostileFileError included: a reply might be in it
        return True
    return not isinstance(data, dict) or "reply" in data


def _older_marks_via(paths: InboxPaths, mark_name: str) -> str:
    """The transport that kept the reply in a start mark without ``via``, as both transports wrote them before it.

    The file relay keeps a reply only while its envelope is on a shelf, and takes the envelope off once the
    reply is in ``delivered/`` (a kill before the mark's removal leaves both); Redis holds no envelope here
    and writes no ``delivered/``. So the mark is the file relay's when its envelope is on a shelf or its reply
    in ``delivered/``, Redis's otherwise. The disk cannot tell that from a file relay's mark whose reply the hub
    has since forwarded out of ``delivered/``: Redis, whose replies go only to a sender that waits for them,
    asks its sender before writing it (:attr:`KeptReply.named` is False for such a mark).

    Args:
        paths: the relay layout.
        mark_name: ``<id>.json``.

    Returns:
        :data:`FILE_RELAY` or :data:`REDIS`; the file relay's when that cannot be told (``delivered/`` or
        ``taken/`` refused or unreadable): it writes nothing to Redis, and it was the rule before. Only this
        envelope's entries decide (:func:`_held_on_a_shelf`): a shelf that cannot be read makes no other mark
        the file relay's.
    """
    try:
        if lexists_below(paths.relay.base, paths.delivered / mark_name):
            return FILE_RELAY
        return FILE_RELAY if _held_on_a_shelf(paths, mark_name) else REDIS
    except (OSError, ValidationError):  # HostileFileError included
        return FILE_RELAY


def _held_on_a_shelf(paths: InboxPaths, mark_name: str) -> bool:
    """Whether a file-relay gateway holds the envelope of the start mark ``<id>.json``: an envelope of that name in
    ``taken/`` (flat) or on a shelf that the relay's own reader takes (:func:`read_inbox_envelope`).

    Per envelope: a file relay reads, adopts and answers only what it can read, and quarantines the rest, so
    a shelf it cannot look into (its mode), or an entry of that name it refuses (a symlink, a directory, not
    ours, not an envelope), holds nothing it would answer from. Each is skipped, named in a WARNING; it
    decides nothing about this envelope or any other.

    Args:
        paths: the relay layout.
        mark_name: ``<id>.json``.

    Returns:
        True when such an envelope is there.

    Raises:
        HostileFileError: ``bot_relay/`` or ``taken/`` is a symlink or not ours.
        OSError: ``taken/`` could not be listed.
    """
    base = paths.relay.base
    for place in holding_places(paths.taken_parent, base=base):
        try:
            with relay_dir(base, place) as fd:
                read_inbox_envelope(place / mark_name, dir_fd=fd)
            return True
        except FileNotFoundError:
            continue
        except (OSError, ValidationError) as exc:  # HostileFileError included
            logger.warning("relay: the envelope {} cannot be read in {} ({}): no file relay answers from there, so "
                           "its start mark without via is decided without it. Give it back to this user "
                           "(a shelf 0700, an envelope a 0600 file) or move it out of bot_relay/taken/",
                           mark_name, place, exc)
    return False


def on_a_shelf(paths: InboxPaths, mark_name: str) -> bool:
    """Whether the envelope of the start mark ``<id>.json`` is on a file-relay gateway's shelf.

    Args:
        paths: the relay layout.
        mark_name: ``<id>.json``.

    Returns:
        True when it is, or when that cannot be told (``taken/`` refused): as if it were.
    """
    try:
        return find_on_shelves(paths.taken_parent, mark_name, base=paths.relay.base)
    except (OSError, ValidationError):  # HostileFileError included
        return True


@functools.lru_cache(maxsize=64)
def _layout_of(root: str) -> InboxPaths:
    return InboxPaths.from_root(root)


class TurnStartMarks:
    """The journal-shaped recorder a ProfileActor hands to a relayed-in turn.

    ``execute_turn`` calls ``append_durably({"t": "started", "id": …})`` before the
    runner runs; here that writes ``started/<id>.json``, so a gateway that adopts
    the envelope after a crash knows the turn may have run. A ``started/`` that
    is gone is created again; one that is not our directory refuses the turn.

    The mark is in place before the turn runs whatever ``fsync`` says, which is
    what a kill -9 of the gateway needs (the kernel keeps the file); ``fsync``
    adds a flush to stable storage against a power loss, as the journal's
    ``started`` record has when the gateway runs with fsync.

    Args:
        root: the Hermes root.
        fsync: flush the mark to stable storage before the turn runs.
    """

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.paths = _layout_of(os.fspath(root))  # one per relayed-in turn: the layout is built once per root
        self.fsync = fsync

    def append_durably(self, record: dict[str, Any], timeout: float = 30.0) -> None:
        """Record a turn's start.

        Args:
            record: ``{"t": "started", "id": <envelope id>, ...}``; other kinds are ignored.
            timeout: unused (the write is synchronous).

        Raises:
            StoreError: the mark could not be written, or was refused (a hostile
                directory): the turn must then not run.
        """
        if record.get("t") != "started":
            return
        envelope_id = str(record.get("id"))
        try:
            # removed under us: without it the turn would run unmarked
            ensure_private_dir(self.paths.started, within=self.paths.relay.root)
            write_mark(self.paths, self.paths.started, envelope_id, {"id": envelope_id, "at": int(time.time())},
                        fsync=self.fsync)
        except HostileFileError as exc:  # a started/ or temp directory swapped for a symlink: the turn must not run
            raise StoreError(f"the start mark of {envelope_id} was refused: {exc}") from exc
        except StoreError:
            raise
        except OSError as exc:  # started/ swapped for a file meanwhile...: the turn never runs unmarked
            raise StoreError(f"the start mark of {envelope_id} could not be written: {exc}") from exc
