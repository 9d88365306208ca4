"""Executing one delivery's turn on a worker thread (never in an actor).

``execute_turn`` holds the profile's cross-process flock for the turn window,
runs the runner, applies the one policy-gated retry in the same session, and
returns a :class:`TurnFinished` for the ProfileActor. Exceptions never escape:
a runner's error is a failed turn, not a crash.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from loguru import logger

from hermes_actors.core.outcomes import busy_text
from hermes_actors.core.reasons import RETRY_NONE, classify_agent_error, normalize_reason, retry_action
from hermes_actors.core.wake import WAKE_ORIGIN
from hermes_actors.errors import StoreError, TurnFailed
from hermes_actors.faults import crashpoint
from hermes_actors.local.runners import TurnRunner
from hermes_actors.messages import Delivery, Turn, TurnFinished
from hermes_actors.store.journal import Journal
from hermes_actors.store.turnlock import TurnLock

__all__ = ["attempt_turn", "execute_turn"]


def attempt_turn(runner: TurnRunner, turn: Turn) -> tuple[Any, str, str]:
    """Run one attempt; returns (raw reply or None, error text, reason)."""
    try:
        return runner.run_turn(turn), "", ""
    except TurnFailed as exc:
        # Normalized here, not only in the outcome: the retry decision must see the same reason.
        return None, exc.text or "turn failed", normalize_reason(exc.reason, exc.text)
    except Exception as exc:  # any runner error is a failed turn, classified from its text
        text = str(exc) or type(exc).__name__
        return None, text, classify_agent_error(text)


def execute_turn(
    delivery: Delivery,
    *,
    runner: TurnRunner,
    lock: TurnLock | None,
    lock_deadline: float,
    make_turn: Callable[[Delivery], Turn],
    journal: Journal | None = None,
) -> TurnFinished:
    """Run ``delivery``'s turn with at most one retry, under the profile's flock.

    Args:
        delivery: what to deliver.
        runner: the turn runner.
        lock: the profile's cross-process lock (None: no cross-process lock).
        lock_deadline: monotonic time after which waiting for the lock gives up
            with ``target_busy`` (the turn never runs).
        make_turn: builds the runner's ``Turn`` (attempt 1).
        journal: in durable mode, the turn's start is on disk before it runs,
            so a crash mid-turn is recovered as ``ambiguous``, never re-run.

    Returns:
        The result for the ProfileActor; ``reply`` is the raw runner value.
    """
    if lock is not None:
        try:
            waited = lock.acquire(lock_deadline)
        except OSError as exc:
            return TurnFinished(delivery.delivery_id, None, f"turn lock unavailable: {exc}", "unknown", 0, ran=False)
        if waited is None:
            return TurnFinished(
                delivery.delivery_id,
                None,
                busy_text(delivery.target, time.time() - delivery.accepted_at),
                "target_busy",
                0,
                ran=False,
            )
    try:
        if journal is not None:
            try:
                journal.append_durably({"t": "started", "id": delivery.delivery_id, "attempt": 1})
            except StoreError as exc:
                text = f"The turn could not be recorded durably ({exc}); it did NOT run. Resend shortly."
                return TurnFinished(delivery.delivery_id, None, text, "unknown", 0, ran=False)
        crashpoint("mid-wake" if delivery.origin == WAKE_ORIGIN else "mid-turn")
        turn = make_turn(delivery)
        reply, error, reason = attempt_turn(runner, turn)
        attempts = 1
        if reply is None:
            action = retry_action(reason)
            if action != RETRY_NONE:
                logger.info("retrying {} once in the same session ({})", delivery.delivery_id, action)
                reply, error, reason = attempt_turn(runner, replace(turn, attempt=2, retry_action=action))
                attempts = 2
        return TurnFinished(delivery.delivery_id, reply, error, reason, attempts)
    finally:
        if lock is not None:
            lock.release()
        release = getattr(runner, "release", None)
        if callable(release):  # the delivery is settled: its DM file (if any) may go
            try:
                release(delivery.delivery_id)
            except Exception:
                logger.exception("runner release failed for {}", delivery.delivery_id)
