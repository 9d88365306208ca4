"""Gateway stop, the part about turns still running: wait for them (abandonable), then end them.

A stopping gateway gives its running turns until a deadline to finish, returns
as soon as they have, and can be told to stop waiting (a second Ctrl-C). Turns
still running then get an ``ambiguous`` outcome from the Dispatcher, and their
processes are ended here (the runner's ``stop_turns``), so no turn of this
gateway outlives it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pykka
from loguru import logger

from hermes_actors.local.sending import outcome_future

__all__ = ["await_running_turns", "end_running_turns", "end_waiting_turns"]

_SLICE_SECONDS = 0.1  # how soon a set ``abandon`` is noticed while waiting


def await_running_turns(
    dispatcher: pykka.ActorRef[Any],
    running: list[str],
    *,
    deadline: float,
    abandon: threading.Event | None = None,
    on_wait: Callable[[int, float], Any] | None = None,
    grace: float | None = None,
) -> bool:
    """Wait until every delivery in ``running`` has an outcome, ``deadline`` passes or ``abandon`` is set.

    Args:
        dispatcher: the Dispatcher (told ``AwaitOutcome``).
        running: delivery ids of the turns still running.
        deadline: monotonic time to give up at.
        abandon: when set, stop waiting at once.
        on_wait: called once, before waiting, with (turns to wait for, ``grace``); what it raises is raised
            (``facade.shutdown.shut_down`` hands in a guarded one: a user callback never leaves the stop half-done).
        grace: the seconds to report to ``on_wait`` (default: the seconds left until ``deadline``).

    Returns:
        True when every one of them finished in time.
    """
    futures = [outcome_future(dispatcher, delivery_id) for delivery_id in running]
    if futures and on_wait is not None:
        on_wait(len(futures), max(0.0, deadline - time.monotonic()) if grace is None else grace)
    for future in futures:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (abandon is not None and abandon.is_set()):
                return False
            try:  # pykka futures have no done-callback: wait in slices so ``abandon`` is seen promptly
                future.get(timeout=min(remaining, _SLICE_SECONDS))
                break
            except KeyError:  # already settled and forgotten: nothing to wait for
                break
            except pykka.Timeout:
                continue
    return True


def end_waiting_turns(runner: Any) -> None:
    """At the beginning of a stop: turns that wait to begin inside the runner (the real Hermes' runner waiting for
    its gateway's API server to start) stop waiting and never run, through the runner's ``stop_waiting`` when it
    has one.

    Args:
        runner: the gateway's runner (user code: what it raises is logged, never raised, see :func:`_runner_hook`).
    """
    stop_waiting = getattr(runner, "stop_waiting", None)
    if callable(stop_waiting):
        _runner_hook(stop_waiting, "stop: the runner could not end the turns waiting to begin")


def end_running_turns(runner: Any, running: list[str]) -> None:
    """End the processes of turns still running, through the runner's ``stop_turns`` when it has one.

    Args:
        runner: the gateway's runner (user code: what it raises is logged, never raised, see :func:`_runner_hook`).
        running: delivery ids of the turns that were running when the stop began.
    """
    stop_turns = getattr(runner, "stop_turns", None)
    if running and callable(stop_turns):
        _runner_hook(lambda: stop_turns(running), "stop: the runner could not end its running turns")


def _runner_hook(call: Callable[[], Any], failed: str) -> None:
    """Call a runner's stop hook; whatever it raises is logged with ``failed`` and never raised.

    Even a ``SystemExit`` or ``KeyboardInterrupt``, as from every other runner hook (``turns.py``): one that
    escaped here left the stop half-done, and the stopped gateway forgot every outcome, those settled before
    included. It is the runner's own, not a Ctrl-C of the user (a ``Gateway.stop`` made on the main thread, where
    Ctrl-C lands, runs on the gateway's call thread), so it is not raised again once the stop is done either.

    Args:
        call: the hook, with its arguments bound.
        failed: the log line's text.
    """
    try:
        call()
    except BaseException:  # runner code: the stop goes on, every outcome settled and kept
        logger.exception(failed)
