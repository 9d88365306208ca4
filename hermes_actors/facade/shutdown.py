"""How one gateway's actors and threads stop, in order: a clean stop, or the teardown of a failed start.

A clean stop (:func:`shut_down`) stops accepting, lets running turns finish within the
timeout, settles what is left, exports the outcomes the stopped Gateway keeps answering,
flushes the subscriber callbacks, then stops the actors, the worker pool, the journal and
the scheduler. :func:`teardown` stops whatever a failed start had started.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pykka
from loguru import logger

from actors import ActorGone, AskTimeout, ask
from hermes_actors.facade.options import ASK_TIMEOUT
from hermes_actors.local.notifier import Notifier, in_subscriber_callback
from hermes_actors.local.outcome_book import KeptOutcomes
from hermes_actors.local.shutdown import await_running_turns, end_running_turns, end_waiting_turns
from hermes_actors.local.turns import turn_places_at_stop
from hermes_actors.messages import (
    AwaitRestarts,
    ExportOutcomes,
    FinalizePending,
    ShutdownProfiles,
    StopAccepting,
)

if TYPE_CHECKING:
    from hermes_actors.system import ActorSystem

__all__ = ["Stopped", "flush_notifier", "shut_down", "teardown"]

_WIND_DOWN_SECONDS = 1.0  # the ProfileActors' time to answer the WindDown, at most (ProfileTable.wind_down)


def shut_down(
    system: ActorSystem,
    timeout: float,
    *,
    abandon: threading.Event | None = None,
    on_wait: Callable[[int, float], Any] | None = None,
    on_cut_off: Callable[[], Any] | None = None,
) -> Stopped:
    """Stop accepting, let running turns finish within ``timeout``, stop every actor (see ``Gateway.stop``).

    Args:
        system: a started system.
        timeout: seconds running turns get to finish.
        abandon: once set, stop waiting for running turns.
        on_wait: called once with (running turns, ``timeout``) before waiting for them.
        on_cut_off: called once when that wait ends with turns still running (``timeout`` ran out, or
            ``abandon`` was set): they are settled ``ambiguous``.
            Both callbacks are user code and never stop the stop half-done (:func:`_guarded`): their errors are
            logged, and a ``KeyboardInterrupt`` or ``SystemExit`` is handed back in :attr:`Stopped.interrupt`.

    Returns:
        What the stop leaves for the Gateway (:class:`Stopped`).
    """
    interrupts: list[BaseException] = []
    on_wait = _guarded("on_wait", on_wait, interrupts)
    on_cut_off = _guarded("on_cut_off", on_cut_off, interrupts)
    dispatcher, notifier, pool = system.dispatcher, system.notifier, system.pool
    assert dispatcher is not None and notifier is not None and pool is not None
    deadline = time.monotonic() + max(0.0, timeout)
    final: KeptOutcomes = {}
    notifier_busy = False  # a subscriber callback outlived the stop's timeout: its actor stops after it
    settled = False  # every turn has its outcome (FinalizePending): no worker holds one the stop waits for
    if system.bridge is not None:
        system.bridge.stop()
    # Before the Dispatcher stops accepting: the relay takes nothing more from inbox/ (its backlog of file events
    # and rescans included), rather than taking envelopes only to put them back, or handing them to a Dispatcher
    # already gone. A flag, not a message: a message would be handled behind that backlog.
    system.relay_stopping.set()
    try:
        if system.rooms is not None:
            system.rooms.halt()  # no new member turns; running ones still post or show as interrupted
        ask(dispatcher, StopAccepting(), timeout=ASK_TIMEOUT)
        # A ProfileActor answers at once unless its thread is stuck in a turn (a "non-blocking" runner that
        # blocks): the stop does not wait for one past its own deadline, nor more than a second for all of them
        answer_within = min(_WIND_DOWN_SECONDS, max(0.0, deadline - time.monotonic()))
        running = ask(dispatcher, ShutdownProfiles(answer_within), timeout=ASK_TIMEOUT, expect=list)
        try:  # a ProfileActor that crashed as the stop began: its restart settles what it held
            ask(dispatcher, AwaitRestarts(), timeout=ASK_TIMEOUT).get(timeout=ASK_TIMEOUT)
        except pykka.Timeout:
            logger.warning("stop: a crashed ProfileActor did not report within {}s; what it held is settled "
                           "as cancelled (its running turn was settled ambiguous at the crash)", ASK_TIMEOUT)
        end_waiting_turns(system.runner)  # a turn still waiting to begin never will: settled cancelled, at once
        finished = await_running_turns(dispatcher, running, deadline=deadline, abandon=abandon, on_wait=on_wait,
                                       grace=timeout)
        if not finished and on_cut_off is not None:
            on_cut_off()
        # Where each turn still running runs words its outcome. Asked of the runner here, on this thread and
        # bounded (runner code never runs in an actor: one that hangs cannot hold the stop or skip the
        # end_running_turns below), and before end_running_turns ends the turn processes it lists.
        places = {} if finished else turn_places_at_stop(system.runner, running)
        ask(dispatcher, FinalizePending(tuple(running), places), timeout=ASK_TIMEOUT)
        settled = True
        if system.journal is not None and not system.journal.drain(timeout=ASK_TIMEOUT):
            logger.warning("stop: the journal's last commits did not land in {}s; their outcomes are "
                           "re-delivered by the next start", ASK_TIMEOUT)
        end_running_turns(system.runner, running)
        final = ask(dispatcher, ExportOutcomes(), timeout=ASK_TIMEOUT, expect=dict)
        if system.rooms is not None:
            system.rooms.stop()  # after the last member-turn outcomes reached them, before the notifier flush
        if in_subscriber_callback():  # stop() from a callback: its subscriber's actor is this very thread
            logger.warning("gateway stopped from a subscriber callback: notifications still queued are dropped")
        else:
            notifier_busy = not flush_notifier(notifier, max(0.1, deadline - time.monotonic()))
    except (ActorGone, AskTimeout) as exc:
        if system.failed_running is not None:  # the Dispatcher failed earlier: end the turns it left running
            logger.info("stopping a failed gateway: ending the turns it left running")
            end_running_turns(system.runner, system.failed_running)
        else:
            logger.error("gateway stop was not clean: {}", exc)
    finally:
        if system.rooms is not None:
            system.rooms.stop()  # idempotent: already stopped above unless the stop was not clean
        _stop_actors(system, notifier_busy=notifier_busy)
        # Once every turn is settled nothing in the pool is worth waiting for: a worker still in a turn abandoned
        # earlier (its timeout reported it; a live owner's turn cannot be ended) or at this stop (ambiguous) is a
        # daemon thread the stop leaves behind, and a job queued behind it finds its turn given up on (WindDown,
        # the timeout) and returns without calling the runner or the owner: no turn starts after the stop. A stop
        # that was not clean waits for the workers until its own deadline.
        pool_wait = 0.0 if settled else max(0.0, deadline - time.monotonic())
        _each_step(("the worker pool", lambda: pool.shutdown(timeout=pool_wait)), *_last_steps(system))
    return Stopped(final, interrupts[0] if interrupts else None)


@dataclass(frozen=True, slots=True)
class Stopped:
    """What a stop leaves for the Gateway."""

    # the settled outcomes the stopped Gateway keeps answering, packed as the Dispatcher's book holds them
    # (empty when the stop was not clean)
    final: KeptOutcomes
    # a KeyboardInterrupt or SystemExit a stop callback raised: the Gateway raises it once its stop is done
    interrupt: BaseException | None = None


def _guarded(
    name: str, callback: Callable[..., Any] | None, interrupts: list[BaseException]
) -> Callable[..., None] | None:
    """A stop callback (user code) that never leaves the stop half-done.

    A ``KeyboardInterrupt`` or ``SystemExit`` it raises (a second Ctrl-C landing in it, a ``sys.exit``) used to
    escape the stop before the running turns were ended and the DMs settled. Now the stop goes on: the first
    such exception is kept in ``interrupts`` for the caller to raise at the end, and any other is logged.

    Args:
        name: the callback's keyword, for the log.
        callback: the callback, or None.
        interrupts: where a ``KeyboardInterrupt`` or ``SystemExit`` is kept (the first one).

    Returns:
        The guarded callback; None when ``callback`` is None.
    """
    if callback is None:
        return None

    def call(*args: Any) -> None:
        try:
            callback(*args)
        except (KeyboardInterrupt, SystemExit) as exc:
            logger.warning("stop: the {} callback raised {}: the stop finishes first (the running turns ended, "
                           "every DM settled), then raises it", name, type(exc).__name__)
            if not interrupts:
                interrupts.append(exc)
        except BaseException:  # user code: an error of its own never stops the stop
            logger.exception("stop: the {} callback failed", name)

    return call


def teardown(system: ActorSystem) -> None:
    """Stop whatever was started of ``system`` (after a failed start)."""
    if system.rooms is not None:
        system.rooms.stop()
    if system.bridge is not None:
        system.bridge.stop()
    _stop_actors(system)
    pool = system.pool
    pool_step: tuple[Step, ...] = () if pool is None else (("the worker pool", lambda: pool.shutdown(timeout=5)),)
    _each_step(*pool_step, *_last_steps(system))


Step = tuple[str, Callable[[], object]]  # (what it stops, for the log; the call)


def _last_steps(system: ActorSystem) -> tuple[Step, ...]:
    """The steps that end a system's own threads once its pool is down: the journal's writer (and its flock on
    the journal) and the scheduler's timer thread."""
    steps: list[Step] = []
    if system.journal is not None:
        steps.append(("the delivery journal", system.journal.stop))
    if system.scheduler is not None:
        steps.append(("the scheduler", system.scheduler.stop))
    return tuple(steps)


def _each_step(*steps: Step) -> None:
    """Run every step of a stop, in order: one that raises never skips the next ones.

    Before, the worker pool's shutdown raising (``cannot join current thread``) skipped the journal's and the
    scheduler's stops: their threads stayed alive, the journal's flock held, and no new Gateway on the root
    could adopt its journal. An error is logged with what failed; a ``KeyboardInterrupt`` or ``SystemExit`` is
    raised once every step ran.

    Args:
        steps: ``(what it stops, the call)`` pairs.

    Raises:
        KeyboardInterrupt: raised by a step (after every step ran); ``SystemExit`` likewise.
    """
    interrupt: BaseException | None = None
    for name, step in steps:
        try:
            step()
        except (KeyboardInterrupt, SystemExit) as exc:
            interrupt = interrupt or exc
        except BaseException:
            logger.exception("stop: stopping {} failed; the stop goes on with the rest", name)
    if interrupt is not None:
        raise interrupt


def _stop_actors(system: ActorSystem, *, notifier_busy: bool = False) -> None:
    """Stop the actors, the Dispatcher first; the subscribers' without waiting when a callback holds a thread.

    The relay stops once the Dispatcher has: its stop is queued behind every ``RelayOutcome`` the Dispatcher
    told it (the replies of the turns that finished, the envelopes the stop cancelled unrun), so it writes or
    puts back each of them before it stops.
    """
    for ref in (system.dispatcher, system.relay, system.roster):
        if ref is None:
            continue
        try:
            ref.stop(block=True, timeout=10)
        except pykka.Timeout:
            logger.warning("{} did not stop within 10s", ref)
    if system.notifier is not None:  # a thread in a callback (maybe this one) stops once that returns
        system.notifier.stop(wait=not (notifier_busy or in_subscriber_callback()))


def flush_notifier(notifier: Notifier, timeout: float) -> bool:
    """Let subscriber callbacks catch up with the last outcomes, for at most ``timeout`` seconds.

    A callback still busy past the stop's own timeout does not hold the stop (a slow
    callback never blocks the gateway, its stop included): the stop returns with a
    warning, and the notifications queued behind that callback are still delivered,
    in order, once it returns, while the process lives (its thread is a daemon: a
    callback that never returns does not keep the process from exiting); then its
    actor stops. The other subscribers are not held up by it: each caught up on its own.

    Returns:
        True once flushed; False when a callback was still running at the deadline.
    """
    busy = notifier.flush(timeout)
    if busy:
        logger.warning("stop: a subscriber callback was still running after {:.1f}s ({} subscriber(s)); the stop "
                       "does not wait for it (the notifications queued behind it follow once it returns)",
                       timeout, busy)
    return busy == 0
