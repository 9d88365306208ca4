"""Pure pieces of the send path: the ack payload, journal records of a Delivery."""

from __future__ import annotations

import math
import time
from dataclasses import fields
from typing import Any, get_args

import pykka

from hermes_actors.core.ids import is_delivery_id
from hermes_actors.core.names import HANDLE_RE
from hermes_actors.core.reasons import RUNTIME_OFFLINE, UNKNOWN
from hermes_actors.core.targets import dm_body, message_length_problem, text_problem
from hermes_actors.core.wake import WAKE_ORIGIN, wake_text_problem
from hermes_actors.errors import ValidationError
from hermes_actors.messages import Delivery, Outcome, PendingAck
from hermes_actors.records import BOT_CHAT_SESSION, PEER_ORIGIN, REDIS_ORIGIN, RELAY_ORIGIN, Origin, outcome_status
from hermes_actors.store.relay_protocol import envelope_message_problem

__all__ = [
    "LIVE_OWNER_DETAIL",
    "accepted_record",
    "ack_payload",
    "delivery_from_record",
    "delivery_problem",
    "delivery_record",
    "journal_refusal",
    "outcome_from_record",
    "resolve_ack",
    "unconfirmed_answer",
]


# The seed's detail of a DM handed to the target's live Bot Chat owner (an open window), word for word.
LIVE_OWNER_DETAIL = "Durably queued for the live Bot Chat owner. Do NOT wait or resend; finish your turn."


def ack_payload(delivery_id: str, label: str, *, now: float, live_owner: bool = False) -> dict[str, Any]:
    """Pure: the tool's success JSON (docs/protocol.md, "The message_agent tool"); ``detail`` is the seed's text
    word for word.

    Args:
        delivery_id: the DM's id.
        label: how the target is shown (``@bob``).
        now: when it was accepted (``queued_at``).
        live_owner: the target's Bot Chat has a live owner the DM is handed to (the seed's live branch).

    Returns:
        The ack dict.
    """
    return {
        "status": "queued",
        "delivery_id": delivery_id,
        "to": label,
        "reply_delivery": "notification",
        "detail": LIVE_OWNER_DETAIL if live_owner else (
            f"Message queued for {label}: this acknowledges the hand-off to a "
            "background delivery process, not a delivery receipt — do NOT wait or poll. "
            "Finish your turn now; that process's completion notification carries the "
            "delivery outcome — the reply (relay it then, attributed to that agent) or "
            "the delivery failure (report it; the message was NOT delivered)."
        ),
        "queued_at": int(now),
    }


def resolve_ack(answer: Any, *, timeout: float) -> dict[str, Any]:
    """The ack dict from a SendRequest answer (waiting for the journal in durable mode).

    A PendingAck may be answered with another one (the relay does not reach a ``bot_peers`` peer: the peer DM's
    own ack then waits for its ``accepted`` record); ``timeout`` bounds the whole wait. One not answered in time
    is :func:`unconfirmed_answer`: its DM goes on without the sender (a journal commit that stalled lands and the
    DM runs, the relay queues the envelope), so it is never answered "NOT queued".

    Raises:
        TypeError: the answer is neither a dict nor a PendingAck.
    """
    deadline = time.monotonic() + timeout
    while isinstance(answer, PendingAck):
        try:
            answer = answer.future.get(timeout=max(0.0, deadline - time.monotonic()))
        except pykka.Timeout:
            return unconfirmed_answer(f"{answer.waiting_for} did not confirm within {timeout}s")
    if not isinstance(answer, dict):
        raise TypeError(f"SendRequest answered {type(answer).__name__}, expected a dict")
    return answer


def unconfirmed_answer(why: str) -> dict[str, Any]:
    """Pure: the answer to a sender whose DM may or may not have been queued: its fate is unknown.

    The request reached the gateway's machinery (a journal commit, the relay, the Dispatcher's mailbox),
    which did not say in time whether it took it: the DM may still be queued and run. A resend could deliver
    it twice, so the text says not to resend, and never that it was NOT queued.

    Args:
        why: what did not confirm, as a clause (``"The delivery journal did not confirm within 30.0s"``).

    Returns:
        The refusal-shaped dict, ``{"error", "reason": "unknown"}``.
    """
    return {
        "error": f"{why}, so whether the message was queued is unknown: it may still be delivered. Do NOT resend "
        "it (a resend could deliver it twice); if it was queued, its outcome notification follows.",
        "reason": UNKNOWN,
    }


def journal_refusal(error: BaseException) -> dict[str, Any]:
    """Pure: the refusal when the acceptance could not be made durable (nothing was acked).

    ``runtime_offline`` (retryable), as for a turn whose start could not be recorded: this gateway
    cannot take DMs right now. Not ``unknown``, which names a teammate that does not exist.
    """
    return {
        "error": f"The delivery could not be recorded durably ({error}), so it was NOT queued. "
        "Free disk space or fix the journal directory, then resend.",
        "reason": RUNTIME_OFFLINE,
    }


def delivery_record(delivery: Delivery) -> dict[str, Any]:
    """Pure: a Delivery as the journal stores it (every field; ``author`` copied).

    Written out rather than ``dataclasses.asdict``, which deep-copies field by field
    and was the largest single cost of a durable DM.
    """
    record = {name: getattr(delivery, name) for name in _DELIVERY_FIELDS}
    record["author"] = dict(delivery.author)
    return record


_DELIVERY_FIELDS = tuple(f.name for f in fields(Delivery))


def accepted_record(delivery: Delivery) -> dict[str, Any]:
    """Pure: the journal's ``accepted`` record of ``delivery`` (on disk before its ack is given)."""
    return {"t": "accepted", "id": delivery.delivery_id, "d": delivery_record(delivery)}


_TEXT_FIELDS = ("sender_handle", "content", "label")  # free text: any valid UTF-8 without controls


def _name_problem(field_name: str, value: Any, *, blank_ok: bool) -> str | None:
    """Pure: why ``value`` is not a profile folder id / handle (the grammar every live name has), or None."""
    if blank_ok and value == "":
        return None
    if isinstance(value, str) and HANDLE_RE.match(value):
        return None
    return f"{field_name} {value!r} is not a profile name"


def _text_field_problem(field_name: str, value: Any) -> str | None:
    """Pure: why ``value`` is not usable text for ``field_name`` (not a str, a lone surrogate, a control
    character such as a newline in a session title), or None."""
    if not isinstance(value, str):
        return f"{field_name} is a {type(value).__name__}, not text"
    if field_name != "content" and any(ord(c) < 32 or ord(c) == 127 for c in value):
        return f"{field_name} {value!r} holds a control character"
    return text_problem(field_name, value)


def _content_length_problem(content: str, origin: Any, sender_handle: Any) -> str | None:
    """Pure: why ``content`` is longer than the live path gives a delivery of ``origin``, or None.

    Each origin's own rule, the one its live path applies: a relayed-in DM's text is its envelope's message
    (:func:`~hermes_actors.store.relay_protocol.envelope_message_problem`), a wake's is :func:`wake_text`'s
    (:func:`~hermes_actors.core.wake.wake_text_problem`), any other is a DM's header and message, held to
    :func:`~hermes_actors.core.targets.message_length_problem` (16,000 characters).
    """
    if origin == RELAY_ORIGIN:
        problem = envelope_message_problem(content)
        return None if problem is None else f"content: the envelope's {problem}"
    if origin == WAKE_ORIGIN:
        return wake_text_problem(content)
    problem = message_length_problem(dm_body(content, sender_handle if isinstance(sender_handle, str) else ""))
    return None if problem is None else f"content: {problem}"


def delivery_problem(record: Any, delivery_id: str | None = None) -> str | None:
    """Pure: why a journaled ``accepted`` record is not one this gateway could have written, or None.

    The journal is a file on disk: a corrupt or planted line must not run a turn with a delivery id of
    ``../../x`` or a target of ``../etc``. Each field is held to what the live path gives it: the id to
    :func:`hermes_actors.core.ids.is_delivery_id` (and to the record's own ``id``), profile names to the
    handle grammar (the target may be blank for a ``bot_peers`` DM, origin ``peer``, or one sent over Redis, origin
    ``redis``: recovery never runs one
    here, :func:`~hermes_actors.core.recovery.plan_recovery`), the texts to valid UTF-8, ``content`` to the length
    its origin's live path allows (a DM's message to 16,000 characters: :func:`_content_length_problem`), ``hop`` a
    non-negative int, ``accepted_at`` a finite number, ``origin`` one of :data:`hermes_actors.records.Origin`,
    ``wake`` a bool or None, and ``session`` to :data:`~hermes_actors.records.BOT_CHAT_SESSION` (or absent): the
    only session a journaled DM runs in
    (``message_agent`` is refused in any other, a DM never takes its caller's title, and a room's member
    turns, ``Group: <name>``, are never journaled). A runner passes the session as the title of the
    session the turn posts into (``-c <title>``): a foreign record must not pick that session.

    Args:
        record: the record's ``d`` (untrusted).
        delivery_id: the record's ``id`` (the journal's key for it), when known.

    Returns:
        The first problem found, naming the field; None for a well-formed record.
    """
    if not isinstance(record, dict):
        return f"the delivery is a {type(record).__name__}, not an object"
    key = record.get("delivery_id")
    if not is_delivery_id(key):
        return f"delivery_id {key!r} is not 32 lowercase hex characters"
    if delivery_id is not None and key != delivery_id:
        return f"delivery_id {key!r} differs from the record's id {delivery_id!r}"
    # a bot_peers DM, a DM sent over Redis: no local target, never run here
    peer = record.get("origin") in (PEER_ORIGIN, REDIS_ORIGIN)
    checks = (
        _name_problem("target", record.get("target"), blank_ok=peer),
        _name_problem("target_handle", record.get("target_handle"), blank_ok=peer),
        _name_problem("sender", record.get("sender"), blank_ok=True),  # "": a wake for a remote DM's sender
        *(_text_field_problem(name, record[name]) for name in _TEXT_FIELDS if name in record),
    )
    problem = next((p for p in checks if p is not None), None)
    if problem is not None:
        return problem
    if isinstance(record.get("content"), str):
        problem = _content_length_problem(record["content"], record.get("origin", "local"), record.get("sender_handle"))
        if problem is not None:
            return problem
    session = record.get("session", BOT_CHAT_SESSION)  # absent: a record of a version before rooms
    if session != BOT_CHAT_SESSION:
        return f"session {session!r} is not {BOT_CHAT_SESSION!r}, the only session a DM runs in"
    author, hop, accepted_at = record.get("author", {}), record.get("hop", 0), record.get("accepted_at", 0.0)
    origin, wake = record.get("origin", "local"), record.get("wake")
    if not isinstance(author, dict):
        return f"author is a {type(author).__name__}, not an object"
    if isinstance(hop, bool) or not isinstance(hop, int) or hop < 0:  # bool: True is an int to Python
        return f"hop {hop!r} is not a non-negative integer"
    if isinstance(accepted_at, bool) or not isinstance(accepted_at, int | float) or not math.isfinite(accepted_at):
        return f"accepted_at {accepted_at!r} is not a time"
    if origin not in get_args(Origin):
        return f"origin {origin!r} is not one of {', '.join(get_args(Origin))}"
    if wake is not None and not isinstance(wake, bool):
        return f"wake {wake!r} is not true, false or null"
    return None


def delivery_from_record(record: dict[str, Any], delivery_id: str | None = None) -> Delivery:
    """Pure: a journaled Delivery back (unknown keys from newer versions are ignored).

    Args:
        record: the ``accepted`` record's ``d`` (from a file: untrusted).
        delivery_id: the record's ``id``, which the delivery's must equal, when known.

    Returns:
        The delivery.

    Raises:
        ValidationError: a field is not what the live path gives it (see :func:`delivery_problem`).
        TypeError: a required field is missing.
    """
    problem = delivery_problem(record, delivery_id)
    if problem is not None:
        raise ValidationError(f"journaled delivery refused: {problem}")
    fields = Delivery.__dataclass_fields__
    return Delivery(**{k: v for k, v in record.items() if k in fields})


def outcome_from_record(delivery_id: str, record: dict[str, Any]) -> Outcome:
    """Pure: an outcome dict (as journaled or exported) back into an Outcome."""
    return Outcome(
        delivery_id,
        outcome_status(record.get("status", "ambiguous")),
        str(record.get("reply", "")),
        str(record.get("error", "")),
        str(record.get("reason", "")),
        bool(record.get("retryable", False)),
        str(record.get("from", "")),
        str(record.get("text", "")),
    )
