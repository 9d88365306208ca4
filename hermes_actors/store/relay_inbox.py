"""The hub ⇄ gateway leg of the file relay (our extension; seed readers ignore it).

The Desktop delivers an envelope to the target gateway over RPC. Between
processes on one machine our hub does the same through files:

    bot_relay/inbox/<id>.json      envelope + "reply_connection", posted by the hub
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
run. ``sent/`` is the sender side's record of its own envelopes: only those are
resumed after a restart (an envelope a seed gateway queued on the same root, or a
forged one, is never taken for ours).

Same rules as the rest of the relay: 0600 files, 0700 dirs, temp files in the
temp directory beside ``bot_relay/`` (``RelayPaths.tmp``), ids validated before
any path is built.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hermes_actors.core.ids import id_of_file_name, validate_delivery_id
from hermes_actors.core.names import HANDLE_RE
from hermes_actors.errors import HostileFileError, StoreError, ValidationError
from hermes_actors.store.atomic import (
    DEFAULT_MAX_BYTES,
    atomic_write_json,
    create_exclusive_json,
    ensure_private_dir,
    read_json_file,
)
from hermes_actors.store.processes import pid_alive
from hermes_actors.store.relay_dirfd import rename_between
from hermes_actors.store.relay_paths import RelayPaths
from hermes_actors.store.relay_protocol import REPLY_FILE_MAX_BYTES, parse_envelope, parse_reply
from hermes_actors.store.relay_quarantine import quarantine, regular_or_quarantined
from hermes_actors.store.relay_shelf import find_on_shelves

__all__ = [
    "HEARTBEAT_DIR",
    "InboxPaths",
    "SentRecord",
    "TurnStartMarks",
    "already_posted",
    "claim_for_expiry",
    "clear_sent",
    "clear_started",
    "finish_expiry",
    "gateway_alive",
    "is_consumed",
    "list_sent",
    "mark_consumed",
    "post_to_inbox",
    "read_delivered",
    "read_sent",
    "record_sent",
    "recorded_sender",
    "remove_heartbeat",
    "return_to_inbox",
    "take_from_inbox",
    "was_started",
    "write_delivered",
    "write_heartbeat",
]

HEARTBEAT_DIR = "gateways"
HEARTBEAT_FRESH_SECONDS = 10.0


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

    def ensure(self) -> InboxPaths:
        """Create every directory (0700), refusing hostile ones."""
        self.relay.ensure()
        for directory in (self.inbox, self.taken_parent, self.delivered, self.consumed, self.heartbeat,
                          self.started, self.sent, self.hubclaims, self.expiring):
            ensure_private_dir(directory, within=self.relay.root)
        return self

    def on_shelf(self, shelf: Path) -> InboxPaths:
        """The same layout with ``taken`` pointing at this process's shelf."""
        return replace(self, taken=shelf)


def post_to_inbox(paths: InboxPaths, envelope: dict[str, Any], reply_connection: str) -> Path:
    """Hub side: hand an envelope to the target gateway."""
    if not HANDLE_RE.match(reply_connection or ""):
        raise ValidationError(f"invalid reply connection id: {reply_connection!r}")
    record = {**parse_envelope(envelope), "reply_connection": reply_connection}
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
    """
    name = f"{validate_delivery_id(envelope_id, what='envelope id')}.json"
    return (
        os.path.lexists(target.inbox / name)
        or find_on_shelves(target.taken_parent, name)
        or os.path.lexists(target.delivered / name)
        or os.path.lexists(source.relay.replies / name)
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


def _split_reply_connection(path: Path, what: str, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[dict[str, Any], str]:
    """Read a record that carries ``reply_connection``; return (the seed-format core, the connection)."""
    data = read_json_file(path, max_bytes=max_bytes)
    if not isinstance(data, dict):
        raise ValidationError(f"{path.name}: {what} must be a JSON object")
    reply_connection = str(data.get("reply_connection") or "")
    if not HANDLE_RE.match(reply_connection):
        raise ValidationError(f"{path.name}: invalid reply_connection {reply_connection!r}")
    return {k: v for k, v in data.items() if k != "reply_connection"}, reply_connection


def read_inbox_envelope(path: Path) -> tuple[dict[str, Any], str]:
    """Gateway side: the envelope and its reply connection; raises HostileFileError / ValidationError."""
    core, reply_connection = _split_reply_connection(path, "an inbox envelope")
    return parse_envelope(core, file_id=path.stem), reply_connection


def write_delivered(paths: InboxPaths, reply: dict[str, Any], reply_connection: str) -> bool:
    """Gateway side: the delivery's reply record; first write wins."""
    record = {**parse_reply(reply), "reply_connection": reply_connection}
    return create_exclusive_json(paths.relay.id_file(paths.delivered, record["id"]), record, tmp_dir=paths.relay.tmp,
                                 within=paths.relay.base)


def read_delivered(path: Path) -> tuple[dict[str, Any], str]:
    """Hub side: a delivered record and the connection whose replies/ it goes to."""
    core, reply_connection = _split_reply_connection(path, "a delivered record", REPLY_FILE_MAX_BYTES)
    return parse_reply(core, file_id=path.stem), reply_connection


def mark_consumed(paths: InboxPaths, envelope_id: str, *, now: float) -> None:
    """Sender side: remember that this reply was reported to the sender."""
    create_exclusive_json(paths.relay.id_file(paths.consumed, envelope_id), {"id": envelope_id, "at": int(now)},
                          tmp_dir=paths.relay.tmp, within=paths.relay.base)


def is_consumed(paths: InboxPaths, envelope_id: str) -> bool:
    return paths.relay.id_file(paths.consumed, envelope_id).exists()


def write_heartbeat(
    paths: InboxPaths, connection_id: str | None, *, now: float, routed_as: frozenset[str] = frozenset()
) -> None:
    """This gateway process says it is alive (the hub turns this into ``online`` flags).

    Args:
        paths: the root's relay layout.
        connection_id: this gateway's id ("" when unknown).
        now: the current time.
        routed_as: the ``target_connection`` names of the envelopes the hub handed to this root so far
            (``doctor`` compares them with ``connection_id``); written only when there are any.
    """
    payload: dict[str, object] = {"pid": os.getpid(), "connection_id": connection_id or "", "at": int(now)}
    if routed_as:
        payload["routed_as"] = sorted(routed_as)
    atomic_write_json(paths.heartbeat / f"{os.getpid()}.json", payload, tmp_dir=paths.relay.tmp,
                      within=paths.relay.base)


def remove_heartbeat(paths: InboxPaths) -> None:
    """A gateway that stops cleanly withdraws its heartbeat."""
    try:
        os.unlink(paths.heartbeat / f"{os.getpid()}.json")
    except FileNotFoundError:
        pass




def _beat_alive(beat: Any, now: float) -> bool:
    if not isinstance(beat, dict):
        return False
    try:
        at, pid = float(beat.get("at", 0)), int(beat.get("pid", 0))
    except (TypeError, ValueError, OverflowError):
        return False
    # Fresh: written at most HEARTBEAT_FRESH_SECONDS ago, and not from the future ("not": NaN is refused too)
    if not -HEARTBEAT_FRESH_SECONDS <= now - at <= HEARTBEAT_FRESH_SECONDS:
        return False
    return pid_alive(pid)


def gateway_alive(paths: InboxPaths, *, now: float | None = None) -> bool:
    """True when some gateway process on this root wrote a fresh heartbeat and still runs."""
    now = time.time() if now is None else now
    try:
        names = [n for n in os.listdir(paths.heartbeat) if n.endswith(".json") and n[:-5].isdigit()]
    except OSError:
        return False
    for name in names:
        try:
            beat = read_json_file(paths.heartbeat / name, max_bytes=4096)
        except (OSError, ValidationError):
            continue
        if _beat_alive(beat, now):
            return True
    return False


# ── relayed-in turns: the "started" mark ────────────────────────────────────


def _write_mark(paths: InboxPaths, directory: Path, envelope_id: str, payload: dict[str, Any], *, fsync: bool) -> bool:
    name = f"{validate_delivery_id(envelope_id, what='envelope id')}.json"
    return create_exclusive_json(directory / name, payload, tmp_dir=paths.relay.tmp, fsync=fsync,
                                 within=paths.relay.base)


def was_started(paths: InboxPaths, envelope_id: str) -> bool:
    """Whether a relayed-in turn for this envelope was about to run (it may have run)."""
    return os.path.lexists(paths.relay.id_file(paths.started, envelope_id))


def _drop_mark(paths: InboxPaths, path: Path) -> None:
    """Remove a mark file; what cannot be removed (a directory in its place...) is moved aside, never raised."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:  # a hostile tree: the relay's actors must keep running (the rescan repairs it)
        quarantine(paths.relay, path, f"could not remove it: {exc}")


def clear_started(paths: InboxPaths, envelope_id: str) -> None:
    """Drop the mark once the envelope's reply is on disk (never raises)."""
    _drop_mark(paths, paths.relay.id_file(paths.started, envelope_id))


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
            _write_mark(self.paths, self.paths.started, envelope_id, {"id": envelope_id, "at": int(time.time())},
                        fsync=self.fsync)
        except HostileFileError as exc:  # a started/ or temp directory swapped for a symlink: the turn must not run
            raise StoreError(f"the start mark of {envelope_id} was refused: {exc}") from exc
        except StoreError:
            raise
        except OSError as exc:  # started/ swapped for a file meanwhile...: the turn never runs unmarked
            raise StoreError(f"the start mark of {envelope_id} could not be written: {exc}") from exc


# ── sender side: the record of our own envelopes ────────────────────────────


@dataclass(frozen=True)
class SentRecord:
    """One envelope this root's gateway queued and still waits a reply for.

    ``sender``, ``sender_handle``, ``hop``: the DM that sent it ("" and 0 in a record of an older version);
    ``wake``: whether its outcome wakes that sender (``Delivery.wake``; None in an older record).
    """

    envelope_id: str
    at: float
    label: str
    sender: str = ""
    sender_handle: str = ""
    hop: int = 0
    wake: bool | None = None


_SENDER_MAX = 64  # a folder id or handle longer than this in a sent record is ignored (not one of ours)


def record_sent(
    paths: InboxPaths, envelope_id: str, label: str, *, now: float, sender: str = "", sender_handle: str = "",
    hop: int = 0, wake: bool | None = None,
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

    Raises:
        ValidationError: the id is invalid.
        StoreError: the record could not be written (then nothing must be queued).
    """
    record: dict[str, Any] = {"id": envelope_id, "at": int(now), "label": label, "from": sender,
                              "from_handle": sender_handle, "hop": hop}
    if wake is not None:
        record["wake"] = wake
    _write_mark(paths, paths.sent, envelope_id, record, fsync=False)  # as durable as the envelope


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
    _drop_mark(paths, paths.relay.id_file(paths.sent, envelope_id))


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


def _read_sent_file(path: Path) -> SentRecord:
    stem = id_of_file_name(path.name) or ""
    data = read_json_file(path, max_bytes=4096)
    if not isinstance(data, dict) or data.get("id") != stem or not isinstance(data.get("label"), str):
        raise ValidationError(f"{path.name}: not a sent record")
    at = data.get("at")
    if isinstance(at, bool) or not isinstance(at, int | float):
        raise ValidationError(f"{path.name}: 'at' is not a number")
    return SentRecord(stem, float(at), data["label"], *recorded_sender(data))
