"""Pure constructors of the outcome a sender reads (docs/protocol.md, "Outcomes").

Every outcome has all keys; ``text`` is the one-line notification the sender's
agent reads; ``retryable`` follows the policy in ``reasons.is_retryable``.
"""

from __future__ import annotations

from typing import Any

from hermes_actors.core.reasons import is_intentional_silence, is_retryable, normalize_reason
from hermes_actors.messages import Delivery, Outcome

__all__ = [
    "AMBIGUOUS_TAIL",
    "INSTALL_HERMES",
    "NAME_THE_CLI",
    "RESEND_BLINDLY_TAIL",
    "TEXT_MAX_BYTES",
    "ambiguous",
    "as_sentence",
    "busy_text",
    "cancelled",
    "cut_text",
    "delivery_details",
    "failed",
    "from_relay_reply",
    "from_reply",
    "queue_full_text",
    "shown_sender",
    "valid_text",
]


_SILENCE_WORDS = " read your message and chose not to reply"
_SILENCE_TAIL = f"{_SILENCE_WORDS} (intentional silence). Nothing to relay."


# A reply or an error is text we did not write (a model's answer, an exception's message) and has no natural
# bound. Every outcome holds it twice (``reply`` and ``text``), the journal writes it as one line, a relay carries
# it in one file: so it is cut once, here, past TEXT_MAX_BYTES (with a note saying so) before it enters an outcome.
# The journal's and the relay's read limits are sized from this (JSON may escape every byte: 6 bytes each).
TEXT_MAX_BYTES = 4 << 20


def valid_text(text: str) -> str:
    """``text`` made fit for an outcome: valid (every lone surrogate replaced) and bounded (:func:`cut_text`).

    A lone surrogate (a model's answer cut in the middle of an emoji and parsed by
    ``json.loads``) is a valid ``str`` that no journal, socket or file can encode: it becomes
    U+FFFD (a surrogate pair becomes its character).
    """
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return cut_text(text)


def cut_text(text: str, limit: int = TEXT_MAX_BYTES) -> str:
    """Pure: ``text`` itself when its UTF-8 fits in ``limit`` bytes, else its first part and a note saying so.

    The result fits in ``limit`` bytes too, note included, so cutting twice changes nothing.

    Args:
        text: valid text (see :func:`valid_text`).
        limit: the most UTF-8 bytes kept (at least a few hundred, room for the note).

    Returns:
        The text, or its cut.
    """
    if len(text) <= limit // 4:  # four UTF-8 bytes per character at most: fits without encoding it
        return text
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    note = f"\n\n[cut here: the text was {len(text):,} characters; an outcome carries at most {limit:,} bytes]"
    kept = data[: max(0, limit - len(note.encode()))].decode("utf-8", "ignore")  # never half a character
    return kept + note


def from_reply(delivery_id: str, label: str, reply: str) -> Outcome:
    """A finished turn's reply: ``replied``, or ``silent`` for an empty reply or a silence marker."""
    reply = valid_text(reply)
    if not reply or reply.isspace() or is_intentional_silence(reply):  # (no stripped copy of a long reply)
        return Outcome(
            delivery_id,
            "silent",
            from_=label,
            text=f"{label}{_SILENCE_TAIL}",
        )
    return Outcome(delivery_id, "replied", reply=reply, from_=label, text=f"Reply from {label}: {reply}")


def failed(delivery_id: str, label: str, error: str, reason: str = "") -> Outcome:
    """A delivery that failed; the reason is normalized to the vocabulary."""
    error = valid_text(error)
    code = normalize_reason(reason, error)
    return Outcome(
        delivery_id,
        "failed",
        error=error,
        reason=code,
        retryable=is_retryable(code, "failed"),
        from_=label,
        text=f"Delivery to {label} failed [reason: {code}]: {error}",
    )


AMBIGUOUS_TAIL = " The message may have been delivered — do not resend."
# How a DM's ``delivery_timeout`` text (a turn that began and did not finish in time) ends: its advice to the sender.
RESEND_BLINDLY_TAIL = ", so do not resend blindly."
# A text ends as a sentence with one of these, maybe inside closing quotes or brackets ("(… stopped.)").
_SENTENCE_ENDS = frozenset(".!?…")
_CLOSERS = "\"')]’”»"


def as_sentence(text: str) -> str:
    """Pure: ``text`` ended as a sentence, so that another sentence may follow it (``"… lost (reset)"`` → ``"… lost
    (reset)."``).

    A why that is an exception's or a runner's text rarely ends with a full stop; joined as it was to the
    sentence after it, the sender read "… without response) The message may have been delivered".

    Args:
        text: any text.

    Returns:
        ``text`` without trailing whitespace, with a full stop added unless it already ends with ``.``, ``!``,
        ``?`` or ``…`` (maybe followed by closing quotes or brackets); ``""`` for a blank text.
    """
    text = text.rstrip()
    if not text or text.rstrip(_CLOSERS)[-1:] in _SENTENCE_ENDS:
        return text
    return f"{text}."


def ambiguous(delivery_id: str, label: str, why: str, reason: str = "unknown") -> Outcome:
    """The turn may have run but its result is unknown: the sender must not resend."""
    # cut so that the tail fits too (and the full stop as_sentence may add): a relay that cuts the error again must
    # not cut "do not resend" off
    why = as_sentence(cut_text(valid_text(why), TEXT_MAX_BYTES - len(AMBIGUOUS_TAIL.encode()) - 1))
    error = f"{why}{AMBIGUOUS_TAIL}"
    code = normalize_reason(reason, why)
    return Outcome(
        delivery_id,
        "ambiguous",
        error=error,
        reason=code,
        retryable=False,
        from_=label,
        text=f"Delivery to {label} is ambiguous: {error}",
    )


def from_relay_reply(delivery_id: str, label: str, reply: str, error: str, reason: str) -> Outcome:
    """The outcome a relayed reply record carries (a file relay reply, a Redis reply entry).

    The file format is the seed's (``id, at, reply, error, reason``): it has no status, so an
    ambiguous turn on the receiving side travels as its error, which ends with
    :data:`AMBIGUOUS_TAIL` (:func:`ambiguous` wrote it); on Redis, as ``reason: "ambiguous"``.
    Either is ambiguous here too, never a plain failure.

    Args:
        delivery_id: the envelope id.
        label: how the target is shown (``@dave on Mini``).
        reply: the record's reply.
        error: the record's error ("" for a reply).
        reason: the record's reason.

    Returns:
        ``ambiguous``, ``failed``, or the reply's outcome (``replied`` or ``silent``).
    """
    if reason == "ambiguous":
        error = valid_text(error)
        return Outcome(delivery_id, "ambiguous", error=error, reason="unknown", retryable=False, from_=label,
                       text=f"Delivery to {label} is ambiguous: {error}")
    if error.endswith(AMBIGUOUS_TAIL):
        return ambiguous(delivery_id, label, error[: -len(AMBIGUOUS_TAIL)], reason or "unknown")
    if error:
        return failed(delivery_id, label, error, reason)
    return from_reply(delivery_id, label, reply)


def gone_text(profile: str) -> str:
    """Pure: why a DM to a profile removed since it was accepted is not delivered."""
    return f"The profile '{profile}' no longer exists; the message was NOT delivered."


def cancelled(delivery_id: str, label: str) -> Outcome:
    """A delivery that never ran because the gateway stopped."""
    return failed(
        delivery_id,
        label,
        f"Delivery to {label} was cancelled before its turn ran (the gateway is stopping). "
        "The message was NOT delivered; resend once the gateway is back.",
        "cancelled",
    )


def busy_text(profile: str, waited_seconds: float, *, owner_hung: bool = False) -> str:
    """Pure: the ``target_busy`` text after the bounded turn wait (the seed's, unless ``owner_hung``).

    Args:
        profile: the target profile.
        waited_seconds: how long the DM waited in the profile's queue.
        owner_hung: it waited behind the live Bot Chat owner's turn that was given up on at
            ``turn_timeout_seconds`` (that DM reported ``ambiguous``) and has not returned: no DM of the
            bot runs until it returns or the owner is detached. The seed's "another delivery turn is already
            running" would send the reader looking for a turn the gateway already reported.

    Returns:
        The outcome's error text.
    """
    if owner_hung:
        return (
            f"target_busy: the live Bot Chat owner of profile '{profile}' has not returned a turn given up on at "
            f"its timeout (that DM was reported ambiguous) — queued behind it for ~{round(waited_seconds)}s. "
            "The message was NOT delivered; the owner must return that turn or be detached (detach_live_owner) "
            "before DMs to this bot run again; then retry."
        )
    return (
        f"target_busy: another delivery turn is already running for profile '{profile}' — "
        f"queued behind it for ~{round(waited_seconds)}s without it finishing. "
        "The message was NOT delivered; retry shortly."
    )


# How a turn that found no hermes CLI says to get one, and how to name one on the command line and in Python: a
# turn's failure reaches both kinds of user (the command runner in local/ and the hermes runners say the same)
INSTALL_HERMES = "install hermes-agent (pip install 'hermes-actors[hermes]')"
NAME_THE_CLI = "--cli PATH (hermes-actors commands) or cli='PATH' (Python)"


def queue_full_text(profile: str, queued: int) -> str:
    """Backpressure refusal: the profile's queue is at its bound."""
    return (
        f"target_busy: the queue for profile '{profile}' is full ({queued} DMs waiting). "
        "The message was NOT delivered; retry shortly."
    )


def shown_sender(sender: str, sender_handle: str) -> str:
    """Pure: how a delivery's sender is named to operators (log line, outcome details, in-flight rows).

    Args:
        sender: its folder id (``default`` for the root's own profile; "" for a wake of a remote DM).
        sender_handle: its handle (``hermes`` for ``default``; a wake's: how its DM's target is shown).

    Returns:
        The handle, without ``@``; the folder id when the handle is empty.
    """
    return sender_handle or sender


def delivery_details(delivery: Delivery | None, now: float) -> dict[str, Any]:
    """What ``subscribe(details=True)`` adds to an outcome: who sent it to whom and how long it took.

    Args:
        delivery: the settled delivery (None when the Dispatcher no longer knew it).
        now: ``time.time()`` when the outcome was published.

    Returns:
        ``sender`` and ``target`` (handles, "" when unknown) and ``latency_seconds`` (from acceptance to
        the outcome; None when the acceptance time is unknown, e.g. a relay envelope resumed after a restart).
    """
    if delivery is None:
        return {"sender": "", "target": "", "latency_seconds": None}
    accepted = delivery.accepted_at
    return {
        "sender": shown_sender(delivery.sender, delivery.sender_handle),
        "target": delivery.target_handle or delivery.target or delivery.label.lstrip("@"),
        "latency_seconds": max(0.0, now - accepted) if accepted > 0 else None,
    }
