"""The ``bot_relay`` protocol, pure half: constants and record shapes.

Nothing here touches the filesystem or the clock: every function takes what
it needs (``now`` included) and returns a value. The roster rules are in
:mod:`hermes_actors.store.relay_roster`; the I/O half is
:mod:`hermes_actors.store.relay_files`, which re-exports both.

Formats are byte-compatible with the seed: the same keys, the same texts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from hermes_actors.core.hops import MAX_HOP, is_hop
from hermes_actors.core.ids import new_delivery_id, validate_delivery_id
from hermes_actors.core.json_depth import MAX_WRITABLE_DEPTH, nests_deeper_than
from hermes_actors.core.names import HANDLE_RE
from hermes_actors.core.outcomes import cut_text
from hermes_actors.errors import ValidationError
from hermes_actors.messages import RemoteAgent

RELAY_DIR = "bot_relay"
ROSTER_FILE = "roster.json"
OUTBOX = "outbox"
CLAIMED = "claimed"
REPLIES = "replies"
LOCKS = "locks"
TMP = ".bot_relay_tmp"  # beside bot_relay/ (under the Hermes root), outside every watched tree
QUARANTINE = "quarantine"
# Our extension's directories of bot_relay/ that their user makes when it first needs one (beside the relay's own,
# which every start makes: hermes_actors.store.relay_inbox.InboxPaths)
JOURNAL = "journal"  # the delivery journal (hermes_actors.store.journal)
RUN = "run"  # the host's submit socket and lock (hermes_actors.hermes.submit_protocol.RUN_DIR spells it too)
ROOMS = "rooms"  # the group rooms (hermes_actors.rooms.store)
UNCONFIRMED = "unconfirmed"  # the sends Redis did not answer (hermes_actors.transports.redis.outbound)
# ... and two below them
ROOM_STARTS = ".started"  # under rooms/: the member turns that began (hermes_actors.rooms.store.RoomStartMarks)
EXPIRING_SHELVES = "expiring"  # under hubclaims/: the hub's shelves of envelopes it expires (hermes_actors.relay.hub)

STALE_AFTER_SECONDS = 6 * 3600
ROSTER_FRESH_SECONDS = 600
DEFAULT_ENVELOPE_TTL_SECONDS = 900
REPLY_WAIT_SECONDS = 900
MAX_ENVELOPE_MESSAGE_CHARS = 32000


ENVELOPE_KEYS = (
    "id",
    "created_at",
    "from_profile",
    "from_handle",
    "target_connection",
    "target_profile",
    "target_handle",
    "message",
)
REPLY_KEYS = ("id", "at", "reply", "error", "reason")

_ENVELOPE_NAME_FIELDS = ("from_profile", "from_handle", "target_connection", "target_profile", "target_handle")
_REPLY_TEXT_FIELDS = ("reply", "error", "reason")


# ── envelopes and replies ───────────────────────────────────────────────────


def is_number(value: Any) -> bool:
    """Pure: True for a finite int/float that is not a bool (a timestamp, a TTL in seconds).

    Args:
        value: a decoded JSON value.

    Returns:
        Whether it is a usable timestamp.
    """
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def created_time(value: Any) -> float | None:
    """Pure: an envelope's ``created_at`` as the seed reads it, ``float(env.get("created_at") or mtime)``: the one
    rule for an envelope's age (:func:`expires_at`, and :func:`parse_envelope` through :func:`parse_created_at`).

    "Unknown" is what the seed's ``or`` falls through: a falsy value. A non-empty string is truthy, so ``"0"``,
    ``"0.0"`` and ``"-0"`` are epoch 0 there (the envelope is expired), never unknown.

    Args:
        value: the decoded ``created_at`` (anything).

    Returns:
        None when unknown (missing, null, 0, 0.0, "": the seed ages the envelope from its file's mtime);
        otherwise the finite number it is, or its string reads as.

    Raises:
        ValidationError: any other value (a bool, a list, a string that is no finite number, NaN, inf).
    """
    if not value:
        return None
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if math.isfinite(number):
            return number
    elif is_number(value):
        return float(value)
    raise ValidationError(f"envelope field 'created_at' is not a number: {value!r}")


def parse_created_at(value: Any) -> int | float | str:
    """Pure: the ``created_at`` a parsed envelope carries, read as the seed reads it (:func:`created_time`).

    The seed's reader takes a numeric string (``"1796595038"``) as well as a number, so a
    seed or Desktop writing one is delivered on both sides alike.

    Args:
        value: the decoded ``created_at`` (anything).

    Returns:
        0 for a missing, null, zero or empty value (unknown: aged from the file's mtime, as the
        seed does); the number it is; a numeric string as its number (a whole one as an int), except a
        string that reads as zero (``"0"``, ``"-0"``), kept as written: as the number 0 it would read as
        unknown, and the envelope posted on to a target's ``inbox/`` would be aged anew there.

    Raises:
        ValidationError: any other value (a bool, a list, a string that is no finite number, NaN, inf).
    """
    created = created_time(value)
    if created is None:
        return 0  # missing, null, zero, "" (any falsy value): the seed falls back to the file's mtime
    if isinstance(value, str):
        if created == 0:
            return value  # epoch 0, which only a (truthy) string can say: the number 0 means "unknown"
        return int(created) if created.is_integer() else created
    return float(value) if isinstance(value, float) else int(value)


def envelope_message_problem(message: str) -> str | None:
    """Pure: the one rule for how long a relayed envelope's message may be, or None when it fits.

    :func:`parse_envelope`'s, and the journal's for a relayed-in DM it holds
    (:func:`hermes_actors.core.acks.delivery_problem`: its text is the envelope's message).

    Args:
        message: the envelope's ``message``.

    Returns:
        ``'message' is too long (N > 32000 chars)``, or None.
    """
    if len(message) > MAX_ENVELOPE_MESSAGE_CHARS:
        return f"'message' is too long ({len(message)} > {MAX_ENVELOPE_MESSAGE_CHARS} chars)"
    return None


def parse_envelope(data: Any, *, file_id: str | None = None) -> dict[str, Any]:
    """Validate a decoded envelope.

    Args:
        data: the decoded JSON document.
        file_id: the stem of the file it came from, when it came from a file.

    Returns:
        A shallow copy of the envelope (unknown extra keys are kept). ``hop``,
        our extra field, may be absent (a seed's envelope, a first DM); present,
        it must be an integer from 0 to ``MAX_HOP`` (``core.hops.is_hop``:
        the one rule for a hop from outside, whichever transport carried it;
        it feeds the target's loop guard). ``created_at`` is read by
        :func:`parse_created_at` (a numeric string becomes its number, one
        that reads as zero stays the string: epoch 0); a missing, null or
        zero one is ``0`` (unknown: the seed uses the file's mtime instead,
        and so does :func:`is_expired` given ``fallback_created``). Read it
        back with :func:`created_time`.

    An envelope nesting JSON objects and arrays deeper than the relay can write again
    (``core.json_depth.MAX_WRITABLE_DEPTH``: an extra key 300 levels deep) is malformed too.

    Raises:
        ValidationError: naming the first bad field.
    """
    if not isinstance(data, dict):
        raise ValidationError(f"envelope is not a JSON object: {type(data).__name__}")
    validate_delivery_id(data.get("id"), what="envelope id", file_id=file_id)
    created = parse_created_at(data.get("created_at"))
    for key in _ENVELOPE_NAME_FIELDS:
        value = data.get(key)
        if not isinstance(value, str) or not HANDLE_RE.match(value):
            raise ValidationError(f"envelope field {key!r} is not a valid name: {value!r}")
    message = data.get("message")
    if not isinstance(message, str):
        raise ValidationError(f"envelope field 'message' is not a string: {type(message).__name__}")
    too_long = envelope_message_problem(message)
    if too_long is not None:
        raise ValidationError(f"envelope field {too_long}")
    if "hop" in data and not is_hop(data["hop"]):  # a forged or broken hop is never read as some other hop
        raise ValidationError(f"envelope field 'hop' is not an integer from 0 to {MAX_HOP}: {data['hop']!r}")
    if nests_deeper_than(data, MAX_WRITABLE_DEPTH):  # read fine, but no relay could write it on: resending is useless
        raise ValidationError(f"envelope nests JSON objects and arrays more than {MAX_WRITABLE_DEPTH} levels deep, "
                              "deeper than the relay can write it on")
    return {**data, "created_at": created}


def make_envelope(
    *,
    target: RemoteAgent,
    message: str,
    sender_profile: str,
    sender_handle: str,
    now: float,
    envelope_id: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Build an outbox envelope in the seed's format.

    Args:
        target: the resolved remote agent.
        message: the text to deliver.
        sender_profile: the sender's folder id.
        sender_handle: the sender's handle.
        now: the current time (``created_at`` is ``int(now)``).
        envelope_id: a fixed id (default: a fresh delivery id).
        extra: additional keys (e.g. ``hop``) that seed readers ignore.

    Returns:
        The envelope dict, validated by :func:`parse_envelope`.

    Raises:
        ValidationError: a field is invalid or ``extra`` overrides a core key.
    """
    envelope: dict[str, Any] = {
        "id": new_delivery_id() if envelope_id is None else envelope_id,
        "created_at": int(now),
        "from_profile": sender_profile,
        "from_handle": sender_handle,
        "target_connection": target.connection_id,
        "target_profile": target.profile,
        "target_handle": target.handle,
        "message": message,
    }
    clash = sorted(set(extra or {}) & set(envelope))
    if clash:
        raise ValidationError(f"extra envelope keys override core keys: {clash}")
    envelope.update(extra or {})
    return parse_envelope(envelope)

def malformed_reply(data: Any, *, file_id: str, why: str, now: float) -> dict[str, Any] | None:
    """Pure: the error reply for an envelope refused as malformed, when it may be answered at all.

    Its sender waits for ``replies/<id>.json``: without an answer it waits ``reply_wait_seconds`` and is
    then told the DM "may still be delivered", which is false. Only a JSON object whose ``id`` passes the
    same rules as ever (32 lowercase hex, equal to its file's name) is answered: an id that fails them never
    names a reply file.

    Args:
        data: the decoded document that failed :func:`parse_envelope`.
        file_id: the stem of the file it came from.
        why: the validation error, naming the bad field.
        now: the current time.

    Returns:
        The reply record (reason ``unknown``), or None.
    """
    if not isinstance(data, dict):
        return None
    try:
        envelope_id = validate_delivery_id(data.get("id"), what="envelope id", file_id=file_id)
    except ValidationError:
        return None
    text = (f"the relay refused the message: its envelope is malformed ({why}), so it was NOT delivered. "
            "Resending it unchanged fails the same way.")
    return make_reply(envelope_id, error=text, reason="unknown", now=now)


def unusable_reply(file_id: str, *, why: str, now: float) -> dict[str, Any] | None:
    """Pure: the error reply for a file claimed from a sender's ``outbox/`` that could not be read as an envelope.

    Another user's file put in its place, a symlink, a file that is not JSON...: nothing in it is read, so
    it is answered by the id its name carries (an outbox file's name is the id its sender waits on), as a
    malformed envelope is (:func:`malformed_reply`). Without an answer its sender waited ``reply_wait_seconds``
    and was then told the DM "may still be delivered", which is false: it was quarantined.

    Args:
        file_id: the stem of the claimed file.
        why: why it was refused (the read's error).
        now: the current time.

    Returns:
        The reply record (reason ``unknown``), or None when the name is no envelope id.
    """
    try:
        envelope_id = validate_delivery_id(file_id, what="envelope id")
    except ValidationError:
        return None
    text = (f"the relay refused the message: its envelope file could not be used ({why}), so it was NOT "
            "delivered.")
    return make_reply(envelope_id, error=text, reason="unknown", now=now)


# A reply file holds a model's answer: its text (and error) is bounded where every outcome's is
# (``outcomes.TEXT_MAX_BYTES``, cut with a note) and reply files are read up to REPLY_FILE_MAX_BYTES, room for
# both even if JSON escaped every byte of them (\u00XX: 6 bytes each). Other relay files stay at 1 MiB.
REPLY_FILE_MAX_BYTES = 64 << 20


def make_reply(
    envelope_id: str, *, reply: str = "", error: str = "", reason: str = "", now: float
) -> dict[str, Any]:
    """Build a reply record in the seed's format.

    Args:
        envelope_id: the envelope answered.
        reply: the reply text ("" on failure).
        error: the human failure text ("" on success).
        reason: the failure reason code ("" allowed; callers classify).
        now: the current time (``at`` is ``int(now)``).

    Returns:
        ``{"id", "at", "reply", "error", "reason"}`` (texts cut by :func:`~hermes_actors.core.outcomes.cut_text`).

    Raises:
        ValidationError: the id is invalid.
    """
    return {
        "id": validate_delivery_id(envelope_id, what="envelope id"),
        "at": int(now),
        "reply": cut_text(str(reply or "")),
        "error": cut_text(str(error or "")),
        "reason": str(reason or ""),
    }


def _reply_text(key: str, value: Any) -> str:
    """One reply text field as the seed's waiter shows it.

    The seed prints ``d.get('reply') or '(empty reply)'``, so a number reply
    (a Desktop that answers ``42``) reaches its sender as ``str()`` of it, and
    a falsy one (``0``) as an empty reply. ``error`` is concatenated to a str
    by the seed (a number there crashes its waiter) and ``reason`` is a code:
    both stay strings only, as does ``reply`` of any other type.

    Args:
        key: ``"reply"``, ``"error"`` or ``"reason"``.
        value: the decoded value (absent: None).

    Returns:
        The text ("" for a missing, null or falsy value).

    Raises:
        ValidationError: naming the field and its type.
    """
    if key == "reply" and is_number(value):
        return str(value) if value else ""
    if value is not None and not isinstance(value, str):
        raise ValidationError(f"reply field {key!r} is not a string: {type(value).__name__}")
    return value or ""


def parse_reply(data: Any, *, file_id: str | None = None) -> dict[str, Any]:
    """Validate a decoded reply record.

    Lenient where the seed's waiter is, which reads only ``error``,
    ``reason`` and ``reply``: a missing or null text is ""; a number
    ``reply`` is its ``str()`` (:func:`_reply_text`); an ``at`` that is not
    a finite number (missing, a string, a bool) is 0, since nothing
    delivers by it; a body without ``id`` (absent or null) read from a file
    takes the file's name, already a valid id. Strict about the rest: an id
    in the body must be valid and match the file's name, and ``error`` and
    ``reason`` must be strings.

    Args:
        data: the decoded JSON document.
        file_id: the stem of the file it came from, when it came from a file.

    Returns:
        The normalized ``{"id", "at", "reply", "error", "reason"}``.

    Raises:
        ValidationError: naming the first bad field.
    """
    if not isinstance(data, dict):
        raise ValidationError(f"reply is not a JSON object: {type(data).__name__}")
    body_id = data.get("id")
    if body_id is None and file_id is not None:
        body_id = file_id  # the seed's waiter never reads the body's id: the file name is the reply's id
    reply_id = validate_delivery_id(body_id, what="envelope id", file_id=file_id)
    at = data.get("at")
    out: dict[str, Any] = {"id": reply_id, "at": at if is_number(at) else 0}
    for key in _REPLY_TEXT_FIELDS:
        out[key] = _reply_text(key, data.get(key))
    return out


def seed_ttl(value: float) -> int:
    """The TTL as the seed applies it: ``int()`` of the configured number.

    ``bot_mode.envelope_ttl_seconds`` is shared with seed gateways on the same
    root, and the seed reads it as ``int(val)``: 900.7 is 900 s and 0.5 is 0,
    which disables expiry. We follow it so one config means one behaviour.

    Args:
        value: the configured ``envelope_ttl_seconds``.

    Returns:
        Whole seconds; ``<= 0`` disables expiry.
    """
    return int(value)


def expired_error_text(handle: str, conn: str, ttl: float, *, via: str = "") -> str:
    """The seed's ``queued_expired`` error text.

    Args:
        handle: the target's handle.
        conn: the target connection id.
        ttl: the TTL in seconds, shown as the seed shows its int config value:
            900 or 900.0 → "900s", 0.5 → "0.5s".
        via: ``"redis"`` when the envelope waited in Redis, where no Desktop drains it ("": the file
            relay, the seed's text).

    Returns:
        The human text for the expired-envelope reply.
    """
    shown = int(ttl) if float(ttl).is_integer() else ttl  # config numbers arrive as floats
    if via == "redis":
        return (f"queued message to @{handle} on {conn} expired after {shown}s waiting in Redis for that machine "
                "to take it — it was NOT delivered. Resend once its gateway is back.")
    return (
        f"queued message to @{handle} on {conn} expired after {shown}s waiting for the "
        "Desktop to drain it — it was NOT delivered. Resend once the Desktop reconnects."
    )


def expires_at(envelope: Mapping[str, Any], ttl: float, *, fallback_created: float | None = None) -> float | None:
    """When an envelope's wait passes ``ttl``: once the clock is past it, :func:`is_expired` says True.

    Args:
        envelope: the (decoded) envelope.
        ttl: the TTL in seconds; ``<= 0`` disables expiry.
        fallback_created: the time to use when ``created_at`` is unknown
            (:func:`created_time`: missing or zero; the seed falls back to the file's mtime).

    Returns:
        ``created_at + ttl``; None when expiry is disabled; ``-inf`` when no
        creation time is known at all (never deliver something of unknown age late).
    """
    if ttl <= 0:
        return None
    try:
        created = created_time(envelope.get("created_at"))
    except ValidationError:  # not a creation time at all (an envelope never parsed): aged like an unknown one
        created = None
    if created is None:
        created = fallback_created
    if created is None:
        return -math.inf
    return float(created) + ttl


def is_expired(
    envelope: Mapping[str, Any], ttl: float, now: float, *, fallback_created: float | None = None
) -> bool:
    """Whether an envelope waited longer than ``ttl``.

    Args:
        envelope: the (decoded) envelope.
        ttl: the TTL in seconds; ``<= 0`` disables expiry.
        now: the current time.
        fallback_created: the time to use when ``created_at`` is missing or
            zero (the seed falls back to the file's mtime).

    Returns:
        True when ``now`` is past :func:`expires_at` (``now - created_at > ttl``); also True when no
        creation time is known at all.
    """
    deadline = expires_at(envelope, ttl, fallback_created=fallback_created)
    return deadline is not None and now > deadline
