"""The hub ⇄ gateway leg of the file relay (our extension; seed readers ignore it).

The Desktop delivers an envelope to the target gateway over RPC. Between
processes on one machine our hub does the same through files:

    bot_relay/inbox/<id>.json      envelope + "reply_connection", posted by the hub
    bot_relay/taken/<id>.json      the gateway claimed it (rename decides)
    bot_relay/delivered/<id>.json  {id, at, reply, error, reason, reply_connection}; first wins
    bot_relay/consumed/<id>.json   sender side: this reply was reported (so a restart never reports twice)
    bot_relay/gateways/<pid>.json  {"pid", "connection_id", "at"}: each gateway process's heartbeat

Same rules as the rest of the relay: 0600 files, 0700 dirs, temp files in
``tmp/``, ids validated before any path is built.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes_actors.core.names import HANDLE_RE
from hermes_actors.errors import ValidationError
from hermes_actors.store.atomic import atomic_write_json, create_exclusive_json, ensure_private_dir, read_json_file
from hermes_actors.store.relay_files import RelayPaths
from hermes_actors.store.relay_protocol import parse_envelope, parse_reply

__all__ = [
    "HEARTBEAT_DIR",
    "InboxPaths",
    "gateway_alive",
    "is_consumed",
    "mark_consumed",
    "post_to_inbox",
    "read_delivered",
    "remove_heartbeat",
    "take_from_inbox",
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

    @classmethod
    def from_root(cls, root: Path | str) -> InboxPaths:
        relay = RelayPaths.from_root(root)
        base = relay.base
        return cls(relay, base / "inbox", base / "taken", base / "delivered", base / "consumed", base / HEARTBEAT_DIR)

    def ensure(self) -> InboxPaths:
        """Create every directory (0700), refusing hostile ones."""
        self.relay.ensure()
        for directory in (self.inbox, self.taken, self.delivered, self.consumed, self.heartbeat):
            ensure_private_dir(directory)
        return self


def post_to_inbox(paths: InboxPaths, envelope: dict[str, Any], reply_connection: str) -> Path:
    """Hub side: hand an envelope to the target gateway."""
    if not HANDLE_RE.match(reply_connection or ""):
        raise ValidationError(f"invalid reply connection id: {reply_connection!r}")
    record = {**parse_envelope(envelope), "reply_connection": reply_connection}
    target = paths.relay.id_file(paths.inbox, record["id"])
    atomic_write_json(target, record, tmp_dir=paths.relay.tmp)
    return target


def take_from_inbox(paths: InboxPaths, envelope_id: str) -> Path | None:
    """Gateway side: claim an inbox envelope by rename; None when another taker won."""
    source, taken = paths.relay.id_file(paths.inbox, envelope_id), paths.relay.id_file(paths.taken, envelope_id)
    try:
        os.rename(source, taken)
    except FileNotFoundError:
        return None
    return taken


def _split_reply_connection(path: Path, what: str) -> tuple[dict[str, Any], str]:
    """Read a record that carries ``reply_connection``; return (the seed-format core, the connection)."""
    data = read_json_file(path)
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
    return create_exclusive_json(paths.relay.id_file(paths.delivered, record["id"]), record, tmp_dir=paths.relay.tmp)


def read_delivered(path: Path) -> tuple[dict[str, Any], str]:
    """Hub side: a delivered record and the connection whose replies/ it goes to."""
    core, reply_connection = _split_reply_connection(path, "a delivered record")
    return parse_reply(core, file_id=path.stem), reply_connection


def mark_consumed(paths: InboxPaths, envelope_id: str, *, now: float) -> None:
    """Sender side: remember that this reply was reported to the sender."""
    create_exclusive_json(paths.relay.id_file(paths.consumed, envelope_id), {"id": envelope_id, "at": int(now)},
                          tmp_dir=paths.relay.tmp)


def is_consumed(paths: InboxPaths, envelope_id: str) -> bool:
    return paths.relay.id_file(paths.consumed, envelope_id).exists()


def write_heartbeat(paths: InboxPaths, connection_id: str | None, *, now: float) -> None:
    """This gateway process says it is alive (the hub turns this into ``online`` flags)."""
    payload = {"pid": os.getpid(), "connection_id": connection_id or "", "at": int(now)}
    atomic_write_json(paths.heartbeat / f"{os.getpid()}.json", payload, tmp_dir=paths.relay.tmp)


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
    except (TypeError, ValueError):
        return False
    if now - at > HEARTBEAT_FRESH_SECONDS or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
