"""The local submit endpoint's wire format and texts: pure functions, no I/O.

One request per connection, one answer, both a single line of JSON::

    {"op": "send", "sender": "alice", "target": "bob", "message": "hi", "hop": 1, "session": "<hermes session id>"}
        → the ack or refusal dict exactly as ``Gateway.message_agent`` returns it
        (``hop`` and ``session`` are optional: a DM sent from a session the host is running a
        warm turn on is one hop deeper than that turn, whatever ``hop`` says)
    {"op": "ping"}
        → {"op": "pong", "pid": 1234, "root": "/path/to/root", "version": "0.1.0"}
    {"op": "outcome", "delivery_id": "<32 hex>", "wait": 5}
        → the outcome dict, or {"status": "pending" | "unknown", "delivery_id": ...}
    {"op": "status"}
        → the host's status (:func:`hermes_actors.ops.status.live_status`)
    {"op": "roster"}
        → {"rows": [...]}: ``Gateway.roster()`` of the host (local, relay/Redis and peer agents)
    {"op": "room", "action": "create" | "send" | "show" | "list" | "disband" | "wait", ...}
        → the host's group rooms (:mod:`hermes_actors.rooms.remote` says what each action takes and answers)

A malformed request is answered ``{"error": <what is wrong>, "reason": "unknown"}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from hermes_actors.core.hops import MAX_HOP, is_hop
from hermes_actors.core.ids import is_delivery_id
from hermes_actors.core.reasons import RUNTIME_OFFLINE, UNKNOWN
from hermes_actors.core.shell import shell_command

__all__ = [
    "MAX_ANSWER_BYTES",
    "MAX_OUTCOME_WAIT",
    "MAX_REQUEST_BYTES",
    "ROOM_ACTIONS",
    "STOPPING_OP",
    "OutcomeCall",
    "Ping",
    "RoomCall",
    "RosterCall",
    "SendCall",
    "StatusCall",
    "bad_request",
    "encode",
    "offline_refusal",
    "parse_request",
    "refused_unknown_field",
    "socket_path",
]

MAX_REQUEST_BYTES = 256 * 1024  # a 16,000-char message is at most 64 KiB of UTF-8; the rest is headroom
# An answer carries an outcome, whose reply (unbounded: a model's long answer) is in it twice (reply, text).
MAX_ANSWER_BYTES = 16 * 1024 * 1024
MAX_OUTCOME_WAIT = 300.0
RUN_DIR = ("bot_relay", "run")
SOCKET_NAME = "submit.sock"
LOCK_NAME = "submit.lock"
# The answer a stopping host gives the connections still waiting in its backlog: their requests were
# never read (the client raises HostOffline: safe to send elsewhere), unlike a connection dropped mid-request.
STOPPING_OP = "stopping"

_NAME_MAX = 256
_FIELDS = {
    "send": {"op", "sender", "target", "message", "hop", "author", "session"},
    "ping": {"op"},
    "outcome": {"op", "delivery_id", "wait"},
    "status": {"op"},
    "roster": {"op"},
    "room": {"op", "action", "name", "members", "room", "sender", "text", "wait"},
}
ROOM_ACTIONS = {  # action → the fields it takes besides ``op`` and ``action``
    "create": {"name", "members"},
    "send": {"room", "sender", "text"},
    "show": {"room"},
    "list": set(),
    "disband": {"room"},
    "wait": {"room", "wait"},
}
_MAX_MEMBERS_SENT = 64  # the room rules allow 2 to 6 and say so; this only bounds what is parsed


@dataclass(frozen=True, slots=True)
class SendCall:
    """Send a DM as ``sender``; ``hop`` is its depth in the conversation (0 and 1 both mean "first").

    ``session`` is the hermes session id the DM is sent from ("" when not sent from a turn, or
    by a client older than the field): the host makes a DM from its own warm turn one hop deeper.
    """

    sender: str
    target: str
    message: str
    hop: int = 0
    author: dict[str, Any] = field(default_factory=dict)
    session: str = ""


@dataclass(frozen=True, slots=True)
class OutcomeCall:
    """Ask for a delivery's outcome, waiting at most ``wait`` seconds."""

    delivery_id: str
    wait: float = 0.0


@dataclass(frozen=True, slots=True)
class Ping:
    """Ask who serves the endpoint."""


@dataclass(frozen=True, slots=True)
class StatusCall:
    """Ask the host what it is doing (profiles, in-flight deliveries, counters, relay)."""


@dataclass(frozen=True, slots=True)
class RosterCall:
    """Ask for the host's roster (what ``hermes-actors roster`` prints)."""


@dataclass(frozen=True, slots=True)
class RoomCall:
    """One call on the host's group rooms (``action`` names the ``Gateway`` room method it maps to).

    ``room`` is a room id or name; ``sender`` is ``"user"`` or a member; ``wait`` is
    the most seconds the host waits for the room to settle (``wait`` only).
    """

    action: str
    room: str = ""
    name: str = ""
    members: tuple[str, ...] = ()
    sender: str = "user"
    text: str = ""
    wait: float = 0.0


Request = SendCall | OutcomeCall | Ping | StatusCall | RosterCall | RoomCall


def socket_path(root: str | Path) -> Path:
    """Where the submit socket of ``root`` lives: ``<root>/bot_relay/run/submit.sock``."""
    return Path(root).expanduser().joinpath(*RUN_DIR, SOCKET_NAME)


def bad_request(what: str) -> dict[str, Any]:
    """The answer to a malformed request."""
    return {"error": f"bad submit request: {what}", "reason": UNKNOWN}


def offline_refusal(root: str | Path) -> dict[str, Any]:
    """The refusal when nothing hosts the actors on ``root`` (the message was not queued)."""
    text = (
        f"Bot Mode is not running on {root}: no process hosts the agents' actors, so the message was NOT "
        f"sent. Start the host with `{shell_command('hermes-actors', 'serve', '--root', root)}` (or `hermes gateway "
        f"run` once `{shell_command('hermes-actors', 'enable', '--root', root, '--gateway')}` turned its hosting on), "
        "then send it again."
    )
    return {"error": text, "reason": RUNTIME_OFFLINE}


def _unknown_fields_text(op: str, names: list[str]) -> str:
    return f"unknown field(s) for op {op!r}: {', '.join(names)}"


def refused_unknown_field(answer: dict[str, Any], op: str, name: str) -> bool:
    """Whether ``answer`` is a host's refusal of a request for its one field ``name`` it does not know.

    A host older than an optional field refuses the whole request before acting on it,
    so the client may send it again without the field.

    Args:
        answer: the host's answer.
        op: the request's op.
        name: the field.

    Returns:
        True only for exactly that refusal.
    """
    return answer.get("error") == bad_request(_unknown_fields_text(op, [name]))["error"]


def encode(answer: dict[str, Any]) -> bytes:
    """One answer or request line."""
    return orjson.dumps(answer) + b"\n"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and value == value  # NaN is not a number here


def _parse_send(data: dict[str, Any]) -> SendCall | dict[str, Any]:
    """The send call, or the bad_request of a field that is not even of its type.

    Only the framing is checked here (the request's size, each field's type): what the values say (an
    empty sender, a target too long to be anyone's, an empty message) is the gateway's to refuse, in the
    words of ``core.targets.plan_send``, as it refuses them without a host.
    """
    sender, target, message = data.get("sender"), data.get("target"), data.get("message")
    if not isinstance(sender, str):
        return bad_request(f"'sender' must be a string, got {type(sender).__name__}")
    if not isinstance(target, str):
        return bad_request(f"'target' must be a string, got {type(target).__name__}")
    if not isinstance(message, str):
        return bad_request(f"'message' must be a string, got {type(message).__name__}")
    hop = data.get("hop", 0)
    if not is_hop(hop):
        return bad_request(f"'hop' must be an integer from 0 to {MAX_HOP}, got {hop!r}")
    author = data.get("author")
    if author is None:
        author = {}
    if not isinstance(author, dict):
        return bad_request(f"'author' must be an object, got {type(author).__name__}")
    session = data.get("session", "")
    if not isinstance(session, str) or len(session) > _NAME_MAX:
        return bad_request(f"'session' must be the hermes session id the DM is sent from (a string of at most "
                           f"{_NAME_MAX} chars), got {session!r:.80}")
    return SendCall(sender=sender, target=target, message=message, hop=hop, author=author, session=session)


def _parse_outcome(data: dict[str, Any]) -> OutcomeCall | dict[str, Any]:
    delivery_id = data.get("delivery_id")
    if not is_delivery_id(delivery_id):
        return bad_request(f"'delivery_id' must be a delivery id (32 lowercase hex characters), got {delivery_id!r}")
    wait = data.get("wait", 0)
    if not _is_number(wait) or not 0 <= wait <= MAX_OUTCOME_WAIT:
        return bad_request(f"'wait' must be a number of seconds from 0 to {MAX_OUTCOME_WAIT:g}, got {wait!r}")
    return OutcomeCall(delivery_id=delivery_id, wait=float(wait))


def _short_string(data: dict[str, Any], key: str, default: str | None = None) -> str | dict[str, Any]:
    """``data[key]`` when it is a non-empty string of at most ``_NAME_MAX`` chars, else the bad_request.

    A new room's ``name`` may be empty: the room rules refuse it in their own words ("room name is required").
    """
    value = data.get(key, default)
    if not isinstance(value, str) or (key != "name" and not value.strip()) or len(value) > _NAME_MAX:
        return bad_request(f"'{key}' must be a non-empty string of at most {_NAME_MAX} chars, got {value!r:.80}")
    return value


def _parse_room(data: dict[str, Any]) -> RoomCall | dict[str, Any]:
    action = data.get("action")
    if not isinstance(action, str) or action not in ROOM_ACTIONS:
        return bad_request(f"unknown room action {action!r:.80} (expected one of: {', '.join(sorted(ROOM_ACTIONS))})")
    extra = sorted(str(key) for key in data if key not in {"op", "action", *ROOM_ACTIONS[action]})
    if extra:
        return bad_request(f"unknown field(s) for room action {action!r}: {', '.join(extra)}")
    fields: dict[str, Any] = {}
    for key in ROOM_ACTIONS[action] & {"room", "name", "sender"}:
        value = _short_string(data, key, "user" if key == "sender" else None)
        if isinstance(value, dict):
            return value
        fields[key] = value
    if action == "create":
        members = data.get("members")
        if (not isinstance(members, list) or len(members) > _MAX_MEMBERS_SENT
                or not all(isinstance(m, str) and 0 < len(m) <= _NAME_MAX for m in members)):
            return bad_request(f"'members' must be a list of at most {_MAX_MEMBERS_SENT} names (non-empty strings "
                               f"of at most {_NAME_MAX} chars), got {members!r:.80}")
        fields["members"] = tuple(members)
    if action == "send":
        text = data.get("text")
        if not isinstance(text, str):
            return bad_request(f"'text' must be a string, got {type(text).__name__}")
        fields["text"] = text
    if action == "wait":
        wait = data.get("wait", 0)
        if not _is_number(wait) or not 0 <= wait <= MAX_OUTCOME_WAIT:
            return bad_request(f"'wait' must be a number of seconds from 0 to {MAX_OUTCOME_WAIT:g}, got {wait!r}")
        fields["wait"] = float(wait)
    return RoomCall(action=action, **fields)


def parse_request(raw: bytes) -> Request | dict[str, Any]:
    """Decode one request line.

    Args:
        raw: the bytes the client sent (without the newline).

    Returns:
        The request, or the error dict to answer (naming what is wrong).
    """
    if len(raw) > MAX_REQUEST_BYTES:
        return bad_request(f"the request is {len(raw)} bytes, the limit is {MAX_REQUEST_BYTES}")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return bad_request(f"the request is not valid JSON ({exc})")
    if not isinstance(data, dict):
        return bad_request(f"the request must be a JSON object, got {type(data).__name__}")
    op = data.get("op")
    if not isinstance(op, str) or op not in _FIELDS:
        return bad_request(f"unknown op {op!r} (expected one of: {', '.join(sorted(_FIELDS))})")
    unknown = sorted(str(key) for key in data if key not in _FIELDS[op])
    if unknown:
        return bad_request(_unknown_fields_text(op, unknown))
    if op == "send":
        return _parse_send(data)
    if op == "outcome":
        return _parse_outcome(data)
    if op == "status":
        return StatusCall()
    if op == "roster":
        return RosterCall()
    if op == "room":
        return _parse_room(data)
    return Ping()
