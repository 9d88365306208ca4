"""Pure decisions of the sender wake-up: which outcome wakes whom, with what turn.

When a DM settles, its sender (a bot on this root) learns the outcome as a new
turn in its own "Bot Chat" whose user message is exactly the outcome's
``text`` (``Reply from @bob: …``). The wake is a local delivery of origin
``"wake"``: it queues behind the sender's other turns (one turn per bot), is
journaled like any delivery in durable mode, and never goes through
``message_agent``. Its id is derived from the DM's id, so whatever path reaches
the decision twice (a restart re-publishing an outcome, a relay reply read
again) names the same wake and it runs at most once.

Nobody resends a wake, so one whose turn provably never began (``target_busy``,
``runtime_offline``, the provider's rate limit or server error: :func:`wake_retryable`)
is tried again, each attempt a delivery of its own (:func:`wake_retry_delivery`: its id
derived from the attempt before), after a back-off (:func:`wake_retry_delay`) until
``bot_mode.reply_wait_seconds`` passed since the wake was created; then it is given up.

Config: ``bot_mode.wake_sender`` — ``auto`` (on when turns run on the real
Hermes, off for custom runners, callables and the demo runner), ``true`` or
``false``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Container
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hermes_actors.core.outcomes import AMBIGUOUS_TAIL, RESEND_BLINDLY_TAIL, as_sentence
from hermes_actors.core.reasons import CANCELLED, DELIVERY_TIMEOUT, TARGET_BUSY, is_retryable
from hermes_actors.core.shell import shell_command
from hermes_actors.messages import Delivery, Outcome
from hermes_actors.records import Origin

__all__ = [
    "WAKE_MODES",
    "WAKE_ORIGIN",
    "WAKE_RETRY_MOST",
    "WAKE_TEXT_MAX_BYTES",
    "WakeRequest",
    "exempt_from_queue_bounds",
    "is_wake",
    "parse_wake_mode",
    "shown_route",
    "wake_delivery",
    "wake_enabled",
    "wake_failure_text",
    "wake_for",
    "wake_id",
    "wake_lock_wait",
    "wake_result",
    "wake_retry_delay",
    "wake_retry_delivery",
    "wake_retry_id",
    "wake_retryable",
    "wake_text",
    "wake_text_problem",
    "wake_turn_time_left",
]

WAKE_ORIGIN: Origin = "wake"
WAKE_MODES = ("auto", "true", "false")
# Under what hermes 0.19 takes, note included: 100 KiB on the CLI's command line, and 65,536 characters
# of message text through its API server (gateway/platforms/api_server.py MAX_NORMALIZED_TEXT_LENGTH cuts the rest).
WAKE_TEXT_MAX_BYTES = 60 * 1024
# The most wake_text adds past WAKE_TEXT_MAX_BYTES: its note, naming the root (a path of at most 4,096 bytes, each
# byte at most 4 characters once quoted for a shell) and the DM's id.
WAKE_NOTE_MAX_BYTES = 20 * 1024
WAKE_RETRY_MOST = 60.0  # the longest back-off between two attempts of a wake (unless wake_retry_seconds is longer)
_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


@dataclass(frozen=True, slots=True)
class WakeRequest:
    """A wake turn to queue: ``text`` into ``profile``'s Bot Chat."""

    wake_id: str  # derived from source_id (see :func:`wake_id`)
    profile: str  # the DM's sender (folder id): who wakes
    handle: str  # its handle
    text: str  # the outcome's text, the wake turn's whole user message
    hop: int  # the DM's hop: a DM sent from the wake turn is hop + 1
    source_id: str  # the DM whose outcome this is
    source_target: str  # the DM's target folder id ("" when remote)
    source_label: str  # how the DM's target is shown ("@bob", "@dave on Mini")


def parse_wake_mode(value: Any) -> str | None:
    """The ``bot_mode.wake_sender`` mode of a raw config value.

    Args:
        value: a bool or a string (``auto``, ``true``/``yes``/``on``/``1``, ``false``/``no``/``off``/``0``).

    Returns:
        ``"auto"``, ``"true"`` or ``"false"``; None when the value is none of those.
    """
    if value is True:
        return "true"
    if value is False:
        return "false"
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    if text == "auto":
        return "auto"
    if text in _TRUE:
        return "true"
    if text in _FALSE:
        return "false"
    return None


def wake_enabled(mode: str, runner_is_hermes: bool) -> bool:
    """Whether senders are woken with their outcomes.

    Args:
        mode: the parsed ``bot_mode.wake_sender`` (``auto``, ``true``, ``false``).
        runner_is_hermes: turns run on the real Hermes (not a custom runner, callable or the demo).

    Returns:
        True for ``true``; for ``auto``, ``runner_is_hermes``; else False.
    """
    if mode == "true":
        return True
    if mode == "auto":
        return runner_is_hermes
    return False


def wake_id(source_id: str) -> str:
    """The id of the wake of DM ``source_id``: 32 lowercase hex chars, the same every time."""
    return hashlib.sha256(f"hermes-actors-wake:{source_id}".encode()).hexdigest()[:32]


def wake_retry_id(previous_id: str) -> str:
    """The id of the attempt that follows wake attempt ``previous_id``: 32 lowercase hex chars, the same every time.

    Derived (from a prefix no DM id or first wake id is hashed with), so whatever path decides the
    same retry twice (a restart re-publishing the failed attempt's outcome) names the same attempt,
    and an attempt the journal holds already is never created again.
    """
    return hashlib.sha256(f"hermes-actors-wake-retry:{previous_id}".encode()).hexdigest()[:32]


def is_wake(delivery: Delivery | None) -> bool:
    """Whether a delivery is a wake turn (its outcome is nobody's DM outcome)."""
    return delivery is not None and delivery.origin == WAKE_ORIGIN


def exempt_from_queue_bounds(delivery: Delivery) -> bool:
    """Whether a queued delivery escapes its profile's queue bounds (``max_queued``, ``turn_wait_seconds``): a wake.

    Those bounds push back on what others send a bot, and a DM refused or expired ``target_busy``
    can be sent again by its sender. Nobody resends a wake: its DM is answered already, so a wake
    refused for a full queue or expired in it loses the reply for good (the bot never learns it).
    And it needs no bound of its own: one wake per DM its sender sent, each of them admitted under
    its target's bound. So a wake is queued however full the sender's queue is, and waits for its
    turn however long that takes, behind the turns queued before it. Nor does it count toward the
    bound: ``max_queued`` and the "(N DMs waiting)" of a refusal count DMs, so a queued wake takes
    no place in the :class:`~hermes_actors.local.queue_gauge.QueueGauge` (else wakes queued past
    the bound would refuse the sender's next DMs below it). Its turn, once it runs, takes the one
    place kept for the turn, as a DM's does.

    Args:
        delivery: the queued delivery.

    Returns:
        True for a wake turn.
    """
    return is_wake(delivery)


def wake_lock_wait(turn_wait_seconds: float, turn_timeout_seconds: float) -> float:
    """Pure: how long a wake's turn waits for its bot's flock, timed from the moment it starts.

    Another process's turn (another host on the root, the seed, a CLI chat) holds the flock for as long
    as it runs, legitimately up to ``turn_timeout_seconds``. A DM that gives up sooner is refused
    ``target_busy`` and its sender may resend it; nobody resends a wake, so one that gave up would lose
    its reply to the bot for a moment's contention (with ``turn_wait_seconds`` 0, at the first busy
    try). So a wake waits at least that long, or ``turn_wait_seconds`` when it is longer; only a flock
    held past it (a turn that outlived its timeout, or a stuck process) still fails that attempt, which
    is then tried again (:func:`wake_retryable`) while its window is open.

    Args:
        turn_wait_seconds: ``bot_mode.turn_wait_seconds`` (≥ 0: a negative one reads as 0, as the seed reads it).
        turn_timeout_seconds: ``bot_mode.turn_timeout_seconds``, the longest a turn may hold the flock.

    Returns:
        The seconds a wake's turn may wait for the flock.
    """
    return max(turn_wait_seconds, turn_timeout_seconds)


def wake_turn_time_left(now: float, began_at: float | None, waits_until: float, turn_timeout_seconds: float) -> float:
    """Pure: how much longer a wake's turn timer runs, asked as it fires (all times monotonic).

    A wake's turn has the whole ``turn_timeout_seconds`` from the moment it begins (its flock taken), as
    any turn; before that it may wait for the flock until ``waits_until`` (:func:`wake_lock_wait` from its
    start). Its timer is armed for ``turn_timeout_seconds`` as any turn's and re-armed for what this says is
    left: so a hung wake that got the flock at once is timed out at ``turn_timeout_seconds`` (the turns
    queued behind it run), and one that got it late is not cut short by its wait.

    Args:
        now: the time the timer fired.
        began_at: when the wake's turn began (``TurnGate.began_at``); None while it waits for the flock.
        waits_until: when its wait for the flock ends.
        turn_timeout_seconds: ``bot_mode.turn_timeout_seconds`` (> 0: a turn timer is armed).

    Returns:
        The seconds left; ≤ 0: time it out now.
    """
    return (waits_until if began_at is None else began_at + turn_timeout_seconds) - now


def wake_retryable(status: str, reason: str) -> bool:
    """Pure: whether a wake attempt that ended so is tried again (after :func:`wake_retry_delay`).

    Only a ``failed`` one whose reason :func:`~hermes_actors.core.reasons.is_retryable` calls
    retryable: its turn provably never began (``target_busy``: another process held the bot's
    flock for the whole wait; ``runtime_offline``; the provider's rate limit or server error, the
    bot's session got no reply). Never an ``ambiguous`` one or a ``delivery_timeout`` (it may have
    run), nor a ``cancelled`` one: a stop gives that, and its own rule applies (a journaled wake
    stays for the next start, which runs it; without a journal a stop loses it).

    Args:
        status: the attempt's outcome status.
        reason: its reason code.

    Returns:
        True when it is tried again (while its window is open).
    """
    return status == "failed" and reason != CANCELLED and is_retryable(reason, status)


# What a wake that may have run (ambiguous, delivery_timeout) comes to, in place of a DM's "do not resend".
_MAY_HAVE_RUN = ("It is not run again: a wake that may have run never runs twice, so the bot may or may not have "
                 "this outcome in its Bot Chat.")


def wake_failure_text(reason: str, error: str, status: str = "failed") -> str:
    """Pure: what a failed wake attempt's log line says went wrong.

    A wake's outcome carries the text its turn would give a DM's sender; for ``target_busy`` that is the
    seed's "another delivery turn is already running … queued behind it for ~Ns … retry shortly", which,
    of a wake, names the wrong holder (often another process's turn lock), counts from the wake's creation
    (every attempt keeps it: its window) and asks a resend nobody makes. A wake that may have run
    (``ambiguous``, or ``delivery_timeout``) keeps the why of its text without the advice to the DM's
    sender ("The message may have been delivered — do not resend.", "so do not resend blindly"), and says
    what becomes of the wake. Any other reason's text stands.

    Args:
        reason: the attempt's reason code.
        error: its outcome's error text.
        status: its outcome's status (``failed`` or ``ambiguous``).

    Returns:
        The text for the log line.
    """
    if reason == TARGET_BUSY:
        return ("its turn never began: the bot's turn lock stayed held for the whole wait (a turn of this "
                "gateway, one hermes still runs for the bot, or another process's)")
    if status == "ambiguous" or reason == DELIVERY_TIMEOUT:
        why = error.removesuffix(AMBIGUOUS_TAIL)
        if why.endswith(RESEND_BLINDLY_TAIL):
            why = why[: -len(RESEND_BLINDLY_TAIL)]
        why = as_sentence(why)
        return f"{why} {_MAY_HAVE_RUN}" if why else _MAY_HAVE_RUN
    return error


def wake_result(status: str, reason: str) -> str:
    """Pure: how a wake attempt's log line names how it ended, beside its id: ``ambiguous`` for one that may have
    run (its reason is mostly ``unknown``), else its reason (its status when it has none)."""
    return status if status == "ambiguous" else reason or status


def wake_retry_delay(now: float, created_at: float, window: float, first: float) -> float | None:
    """Pure: how long after a retryable failure at ``now`` the wake's next attempt runs; None: give it up.

    The wait is the time since the wake was created, at least ``first`` and at most
    :data:`WAKE_RETRY_MOST` (or ``first`` when that is longer): attempts that fail at once run
    5, 10, 20, 40, 80, 140 s… after the wake was created (``first`` 5), so it doubles without
    counting attempts. Within a run no attempt starts after the window closed: the last one
    waits at most until then. The wait itself is not journaled: an attempt a stop or a crash
    left journaled during its back-off is re-offered by the next start at once, like any
    accepted DM (even when the window closed meanwhile); should it fail again, the next wait is
    timed from the wake's creation as before.

    Args:
        now: ``time.time()`` when the attempt failed.
        created_at: when the wake was created (every attempt's ``accepted_at``, see :func:`wake_retry_delivery`).
        window: ``bot_mode.reply_wait_seconds``: the wake is given up that long after it was created.
        first: ``bot_mode.wake_retry_seconds``, the shortest wait.

    Returns:
        The seconds to wait (> 0), or None once ``now`` is at or past ``created_at + window``.
    """
    give_up_at = created_at + window
    if now >= give_up_at:
        return None
    backoff = min(max(first, WAKE_RETRY_MOST), max(first, now - created_at))
    return min(backoff, give_up_at - now)


def wake_retry_delivery(previous: Delivery) -> Delivery:
    """Pure: the next attempt of a wake whose attempt ``previous`` failed retryable: a delivery of its own.

    The same wake turn (sender, text, hop, origin ``"wake"``) under :func:`wake_retry_id`. It keeps
    ``accepted_at``, the time the wake was created: its window (:func:`wake_retry_delay`) is timed from
    it, in this run and after a restart, and no turn of it can have begun before.

    Args:
        previous: the failed attempt's delivery.

    Returns:
        The next attempt's delivery.
    """
    return replace(previous, delivery_id=wake_retry_id(previous.delivery_id))


def shown_route(route: str, origin: str) -> str:
    """Pure: how ``status`` names a pending delivery's route: ``wake`` for a wake turn (never a DM)."""
    return "wake" if origin == WAKE_ORIGIN else route


def wake_for(
    outcome: Outcome,
    delivery: Delivery | None,
    *,
    mode: str,
    runner_is_hermes: bool,
    local_profiles: Container[str],
    root: Path,
) -> WakeRequest | None:
    """The wake an outcome calls for, if any.

    Args:
        outcome: the DM's final outcome.
        delivery: the DM it settles (None: unknown, e.g. a relay envelope resumed after a restart).
        mode: ``bot_mode.wake_sender``.
        runner_is_hermes: see :func:`wake_enabled`.
        local_profiles: folder ids of this root's profiles.
        root: the Hermes root (named in the note of a cut text, see :func:`wake_text`).

    Returns:
        The wake, or None: waking is off for this DM (``delivery.wake``, decided by the gateway
        that accepted it; ``mode`` for a DM journaled without it), the DM is unknown or is itself a wake
        (no echo loops), it was relayed in (its sender is on another
        connection and learns the outcome there), its sender is not a local
        profile, or the outcome has no text.
    """
    if delivery is None:
        return None
    if not (delivery.wake if delivery.wake is not None else wake_enabled(mode, runner_is_hermes)):
        return None
    if delivery.origin in (WAKE_ORIGIN, "relay") or not delivery.sender or delivery.sender not in local_profiles:
        return None
    if not outcome.text.strip():
        return None
    return WakeRequest(  # keyed by the outcome's id: a relay DM's id is its envelope's
        wake_id=wake_id(outcome.delivery_id),
        profile=delivery.sender,
        handle=delivery.sender_handle or delivery.sender,
        text=wake_text(outcome.text, outcome.delivery_id, root),
        hop=max(0, delivery.hop),
        source_id=outcome.delivery_id,
        source_target=delivery.target,
        source_label=outcome.from_ or delivery.label,
    )


def wake_text(text: str, delivery_id: str, root: Path, limit: int = WAKE_TEXT_MAX_BYTES) -> str:
    """The wake turn's user message: the outcome text, cut with a note past ``limit`` bytes of UTF-8.

    hermes-agent 0.19's CLI takes a turn's text on its command line (at most 100 KiB), its API
    server cuts a message at 65,536 characters without a word, and a reply that long fills a
    model's context anyway; the whole text stays in the outcome.

    Args:
        text: the outcome's text.
        delivery_id: the DM's id (the note names the command that prints the whole text).
        root: the Hermes root whose host knows the outcome (a bot's ``$HERMES_HOME`` is its
            profile's folder, not the root).
        limit: the most bytes kept.

    Returns:
        ``text`` itself when it fits, else its first part and the note.
    """
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    kept = data[:limit].decode("utf-8", "ignore")  # never half a character
    return (f"{kept}\n\n[cut here: the whole text is {len(text):,} characters; "
            f"`{shell_command('hermes-actors', 'outcome', '--root', root, delivery_id)}` prints it]")


def wake_text_problem(text: str) -> str | None:
    """Pure: why ``text`` is longer than any :func:`wake_text` returns (its limit and its note), or None.

    The journal's rule for a wake it re-offers (:func:`hermes_actors.core.acks.delivery_problem`).

    Args:
        text: a wake's text (valid UTF-8: no lone surrogate).

    Returns:
        ``wake text too long (N bytes > M)``, or None.
    """
    size = len(text.encode("utf-8"))
    most = WAKE_TEXT_MAX_BYTES + WAKE_NOTE_MAX_BYTES
    return f"wake text too long ({size} bytes > {most})" if size > most else None


def wake_delivery(request: WakeRequest, *, now: float) -> Delivery:
    """The local delivery that runs a wake turn.

    Args:
        request: the wake.
        now: ``time.time()`` at creation.

    Returns:
        A delivery of origin ``"wake"`` to the sender, its content exactly the outcome text.
    """
    shown = request.source_label.lstrip("@")
    return Delivery(
        delivery_id=request.wake_id,
        sender=request.source_target,
        sender_handle=shown,
        target=request.profile,
        target_handle=request.handle,
        content=request.text,
        author={},
        hop=request.hop,
        accepted_at=now,
        origin=WAKE_ORIGIN,
        label=f"@{request.handle}",
    )
