"""Pure pieces of the send path: the ack payload, journal records of a Delivery."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pykka

from hermes_actors.messages import Delivery, Outcome, PendingAck
from hermes_actors.records import outcome_status

__all__ = [
    "accepted_record",
    "ack_payload",
    "delivery_from_record",
    "delivery_record",
    "journal_refusal",
    "outcome_from_record",
    "resolve_ack",
]


def ack_payload(delivery_id: str, label: str, *, now: float) -> dict[str, Any]:
    """Pure: the tool's success JSON (DESIGN section 6); ``detail`` is the seed's text word for word."""
    return {
        "status": "queued",
        "delivery_id": delivery_id,
        "to": label,
        "reply_delivery": "notification",
        "detail": (
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

    Raises:
        TypeError: the answer is neither a dict nor a PendingAck.
    """
    if isinstance(answer, PendingAck):
        try:
            answer = answer.future.get(timeout=timeout)
        except pykka.Timeout:
            return {
                "error": f"{answer.waiting_for} did not confirm within {timeout}s; the message was NOT queued.",
                "reason": "unknown",
            }
    if not isinstance(answer, dict):
        raise TypeError(f"SendRequest answered {type(answer).__name__}, expected a dict")
    return answer


def journal_refusal(error: BaseException) -> dict[str, Any]:
    """Pure: the refusal when the acceptance could not be made durable (nothing was acked)."""
    return {
        "error": f"The delivery could not be recorded durably ({error}), so it was NOT queued. "
        "Free disk space or fix the journal directory, then resend.",
        "reason": "unknown",
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


def delivery_from_record(record: dict[str, Any]) -> Delivery:
    """Pure: a journaled Delivery back (unknown keys from newer versions are ignored)."""
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
