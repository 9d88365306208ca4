"""Executing one delivery's turn on a worker thread (never in an actor).

``execute_turn`` holds the profile's cross-process flock for the turn window,
runs the runner, applies the one policy-gated retry in the same session, and
returns a :class:`TurnFinished` for the ProfileActor. Exceptions never escape:
a runner's error is a failed turn, not a crash.

Failure paths and what the sender gets (docs/reliability.md):

- the runner raises an ``Exception``: ``failed``, reason classified from its text, the
  policy retry applies;
- the runner returns anything but a str (None, bytes, a number; whatever kind of runner
  it is, the error is ``runner ApiBot returned NoneType, expected str``, naming the runner
  by its type's or function's qualified name, never its repr:
  :func:`~hermes_actors.local.runners.checked_reply`): ``failed``, reason ``unknown``
  (never read from that text), so never retried;
- the runner raises ``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit`` (any
  other ``BaseException``): ``failed`` at once, reason classified from
  ``"<Type>: <text>"`` (usually ``unknown``, so not retryable: the turn started),
  never retried automatically (the runner asked to stop, not to be run again);
- the runner raises ``TurnFailed(..., ambiguous=True)`` (the message may have reached
  its target before the failure): ``ambiguous``, never retried (:func:`turn_failed`, the
  rule a live owner's ``TurnFailed`` follows too);
- anything failing before the runner is called (the turn lock, a relay or room start mark,
  building the turn): ``failed`` at once with ``runtime_offline`` (retryable), see :func:`never_ran`;
- the turn's ``started`` record the delivery journal cannot take (a full disk): no outcome,
  the turn never ran and its ProfileActor queues it again until the journal writes again,
  see :func:`not_recorded`;
- a runner with a ``prepare_retry(turn, began)`` hook decides whether the policy retry
  runs (:func:`retry_allowed`): the hermes runners take back a DM hermes-agent 0.19
  stored before its provider failed, so the retry does not put it in the session twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, Protocol

from loguru import logger

from hermes_actors.core.outcomes import busy_text
from hermes_actors.core.reasons import (
    CANCELLED,
    RETRY_NONE,
    RUNTIME_OFFLINE,
    classify_agent_error,
    normalize_reason,
    retry_action,
)
from hermes_actors.core.recovery import TurnPlace
from hermes_actors.core.wake import WAKE_ORIGIN
from hermes_actors.errors import StoreError, TurnFailed
from hermes_actors.faults import crashpoint
from hermes_actors.local.runners import ReplyTypeError, TurnRunner, checked_reply
from hermes_actors.messages import Delivery, Turn, TurnFinished
from hermes_actors.store.journal import Journal, StartRecorder
from hermes_actors.store.turnlock import TurnLock

__all__ = [
    "PLACE_HOOKS_SECONDS",
    "TurnFactory",
    "TurnGate",
    "TurnGates",
    "attempt_turn",
    "describe_error",
    "execute_turn",
    "forget_failed",
    "never_ran",
    "not_begun",
    "not_recorded",
    "retry_allowed",
    "running_turn_of",
    "turn_factory_here",
    "turn_failed",
    "turn_for",
    "turn_never_reached",
    "turn_places_at_stop",
    "turn_process_running",
    "turn_runs_apart",
    "via_recorder",
]


def describe_error(exc: BaseException) -> str:
    """Pure: ``exc`` as one line for the sender, e.g. ``"SystemExit: 3"`` or ``"KeyboardInterrupt"``.

    Args:
        exc: any exception, including a ``BaseException`` raised by user code.

    Returns:
        The type name, then the text when there is one.
    """
    text = _text_of(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _text_of(exc: BaseException) -> str:
    """``str(exc)``, or "" when its ``__str__`` (user code) raises, whatever it raises."""
    try:
        return str.__str__(str(exc))
    except BaseException:
        return ""


def never_ran(delivery_id: str, step: str, exc: BaseException | str) -> TurnFinished:
    """Pure: the result for a DM that failed before reaching its target.

    The runner (or live owner) was never called, so resending is safe: the reason is
    ``runtime_offline`` (retryable) whatever the error says; its text is kept in ``error``.

    Args:
        delivery_id: the delivery.
        step: what failed, as a phrase ("the turn lock", "building the turn").
        exc: the error (or its text).

    Returns:
        A failed, not-run :class:`TurnFinished`.
    """
    detail = exc if isinstance(exc, str) else describe_error(exc)
    text = f"{step} failed ({detail}); the DM was NOT delivered. Resend shortly."
    return TurnFinished(delivery_id, None, text[0].upper() + text[1:], RUNTIME_OFFLINE)


def not_recorded(delivery_id: str, exc: StoreError) -> TurnFinished:
    """Pure: the result of a turn whose ``started`` record the delivery journal could not take (a full disk).

    Not a failure: the runner was never called, and the journal already holds the DM (accepted), so its
    ProfileActor queues it again, at the head, and starts no turn until the journal writes again (the
    Dispatcher's ``ResumeTurns``). ``error`` still says what :func:`never_ran` would, should anything read it.

    Args:
        delivery_id: the delivery.
        exc: why the record failed.

    Returns:
        A not-run :class:`TurnFinished` whose ``unrecorded`` is ``exc``.
    """
    return replace(never_ran(delivery_id, "recording the turn durably", exc), unrecorded=exc)


_running = threading.local()  # .factory: the TurnFactory of the gateway whose turn the calling thread runs


def turn_factory_here() -> object | None:
    """The turn factory (one per gateway) of the turn the calling thread is running (None outside a turn).

    ``Gateway.stop`` asks it: called from inside one of its own turns, the stop would wait for
    that very turn. The factory, not the runner, names the gateway: gateways may share a runner.
    """
    return getattr(_running, "factory", None)


@contextmanager
def running_turn_of(make_turn: object) -> Iterator[None]:
    """Mark the calling thread as running a turn of the gateway whose turn factory is ``make_turn``.

    The one marker :func:`turn_factory_here` reads, set around a runner's turn (:func:`execute_turn`)
    and a live owner's (``live_handoff.hand_to_owner``) alike: a ``Gateway.stop()`` from inside either
    is refused. Before, only a runner's turn set it: an owner that stopped the gateway from its turn
    left the stop waiting for that very turn, then half-done (its pool joining the current thread).

    Args:
        make_turn: the gateway's turn factory.
    """
    outer, _running.factory = getattr(_running, "factory", None), make_turn
    try:
        yield
    finally:
        _running.factory = outer


def turn_failed(delivery_id: str, exc: TurnFailed) -> TurnFinished:
    """Pure: the result of a turn whose runner or live owner raised ``exc`` (one rule for both).

    Args:
        delivery_id: the delivery.
        exc: what the runner (or owner) raised.

    Returns:
        A failed :class:`TurnFinished` with ``exc``'s text ("turn failed" when it has none) and its
        reason normalized to the vocabulary (classified from the text when it gave none, or one outside
        it), so the retry decision and the outcome see the same reason; ``ambiguous`` when ``exc`` says
        the message may have reached its target ("do not resend", never retried).
    """
    reason = normalize_reason(exc.reason, exc.text)
    return TurnFinished(delivery_id, None, exc.text or "turn failed", reason, ambiguous=exc.ambiguous)


def attempt_turn(runner: TurnRunner, turn: Turn) -> tuple[TurnFinished, bool]:
    """Run one attempt of ``turn``.

    Args:
        runner: the turn runner.
        turn: the attempt's turn.

    Returns:
        The attempt's result (``reply`` the runner's str, None when it failed: a reply that is not
        a str fails it, :func:`~hermes_actors.local.runners.checked_reply`) and whether the policy
        retry may follow a failure (not after a ``BaseException``, nor an ambiguous one, nor a reply
        that is not a str: that failure is ``unknown``, decided from its type, never from its text).
    """
    key = turn.delivery_id
    try:
        # checked here for every runner (an object's run_turn, a callable, the hermes runners; inline or on a
        # worker): None, bytes or a number fails the turn naming the runner, never becomes the reply 'None'
        return TurnFinished(key, checked_reply(runner.run_turn(turn), runner)), True
    except TurnFailed as exc:
        result = turn_failed(key, exc)
        return result, not result.ambiguous
    except ReplyTypeError as exc:  # its reason is its type's, never read from its text (which names the runner)
        return TurnFinished(key, None, str(exc), exc.reason), False
    except Exception as exc:  # any runner error is a failed turn, classified from its text
        text = _text_of(exc) or type(exc).__name__
        return TurnFinished(key, None, text, classify_agent_error(text)), True
    except BaseException as exc:  # user code: SystemExit & co fail the DM, never the actors
        text = f"The turn's runner raised {describe_error(exc)}; the turn was abandoned."
        logger.warning("runner raised {} for {}; its DM fails", describe_error(exc), key)
        return TurnFinished(key, None, text, classify_agent_error(describe_error(exc))), False


def retry_allowed(runner: TurnRunner, retry: Turn, began: float) -> bool:
    """Ask the runner's optional ``prepare_retry(retry, began)`` hook whether the policy retry may run.

    A runner whose session kept the failed attempt's input (hermes-agent 0.19 stores the DM
    before the provider fails) takes it back there, or refuses when the model already worked
    on it. Without the hook the retry runs.

    Args:
        runner: the turn runner.
        retry: the second attempt's turn.
        began: ``time.time()`` when the first attempt began.

    Returns:
        Whether to run ``retry``; False when the hook refused or raised (runner code: the
        first failure then stands).
    """
    prepare = getattr(runner, "prepare_retry", None)
    if not callable(prepare):
        return True
    try:
        return bool(prepare(retry, began))
    except BaseException as exc:  # runner code: it must not replace the first failure
        # a TurnFailed is the runner saying why (hermes is gone, say): the outcome already tells the user that
        logger.log(_hook_level(exc), "not retrying {}: preparing the retry raised {}", retry.delivery_id,
                   describe_error(exc))
        return False


def forget_failed(runner: TurnRunner, turn: Turn, began: float) -> None:
    """A turn failed for good (its DM is reported NOT delivered): the runner's optional
    ``forget_failed(turn, began)`` takes back what the session kept of it, so the bot's next
    turn does not read the failed DM again (hermes 0.19 stores it before its provider fails).

    Args:
        runner: the turn runner.
        turn: the failed turn.
        began: ``time.time()`` when its first attempt began.
    """
    forget = getattr(runner, "forget_failed", None)
    if not callable(forget):
        return
    try:
        forget(turn, began)
    except BaseException as exc:  # runner code: the failure stands as it is
        logger.log(_hook_level(exc), "could not take back the failed DM {} from its session: {}", turn.delivery_id,
                   describe_error(exc))


def turn_never_reached(runner: TurnRunner, turn: Turn, since: float) -> bool:
    """At a start: the runner's optional ``never_reached(turn, since)`` hook, asked about a wake the previous
    run started and never finished: True only when its turn provably never reached the bot (it is offered
    again then, see :func:`~hermes_actors.core.recovery.plan_recovery`).

    Args:
        runner: the turn runner.
        turn: the wake's turn, as it would run now.
        since: when the wake was accepted (no turn of it began before).

    Returns:
        The hook's answer; False without the hook, or when it raised (runner code: the wake stays ambiguous).
    """
    hook = getattr(runner, "never_reached", None)
    if not callable(hook):
        return False
    try:
        return hook(turn, since) is True
    except BaseException as exc:  # runner code: "cannot tell" never runs a wake twice
        logger.log(_hook_level(exc), "cannot tell whether the wake {} reached its bot: {}", turn.delivery_id,
                   describe_error(exc))
        return False


def turn_runs_apart(runner: TurnRunner, turn: Turn) -> bool:
    """At a start: the runner's optional ``runs_apart(turn)`` hook, asked about a turn the previous run
    started and never finished: True when it ran warm in a hermes gateway apart from this host
    (``serve``, ``send``, a program embedding the ``Gateway``), so the host's stop did not end it
    (see :func:`~hermes_actors.core.recovery.stopped_mid_turn_text`).

    Returns:
        The hook's answer; False without the hook, or when it raised.
    """
    hook = getattr(runner, "runs_apart", None)
    if not callable(hook):
        return False
    try:
        return hook(turn) is True
    except BaseException as exc:  # runner code: only the wording of the outcome depends on it
        logger.log(_hook_level(exc), "cannot tell where the turn {} ran: {}", turn.delivery_id, describe_error(exc))
        return False


# The runner's place hooks get this long when asked (at a stop, both together; at a turn timeout, running_turns()):
# they list what is in memory (microseconds). One that does not answer in time costs only the wording of an outcome
# (and, at a timeout, the flock is kept as if it listed the turn); nothing ever waits on it for longer.
PLACE_HOOKS_SECONDS = 1.0
# Asked in this order, the second only about the turns the first did not list
_PLACE_HOOKS: tuple[tuple[str, TurnPlace], ...] = (("running_turns", "process"), ("warm_turns", "apart"))
# Why a place hook listed nothing: it raised, or it did not answer in time (then nothing more is asked of it)
_HookSilence = Literal["raised", "hung"]


def turn_places_at_stop(
    runner: TurnRunner | None, running: Sequence[str], *, within: float = PLACE_HOOKS_SECONDS
) -> dict[str, TurnPlace]:
    """At a clean stop, on the stopping thread: where each turn still running runs (it words the turn's
    ``ambiguous`` outcome, :func:`~hermes_actors.core.recovery.running_at_stop_text`).

    Asked once per stop, before the stop ends the turn processes: ``process`` for what the runner's optional
    ``running_turns()`` lists (its process is ended now), ``apart`` for what its optional ``warm_turns()`` lists
    (hermes runs it in a gateway process of its own, which goes on with it). The hooks are runner code: each
    runs on a daemon thread of its own and both get ``within`` seconds together, so a hook that hangs never
    holds the stop (nor an actor) and its thread is left behind; it is logged once, its turns stay ``here``
    and no further hook is asked. A hook that raises is logged and lists nothing.

    Args:
        runner: the turn runner (None: none, every turn is ``here``).
        running: the deliveries whose turns still run.
        within: seconds the hooks get, together.

    Returns:
        Each delivery of ``running`` with ``process``, ``apart`` or ``here`` (no hook lists it, there is none, or
        it raised or did not answer).
    """
    places: dict[str, TurnPlace] = dict.fromkeys(running, "here")
    deadline = time.monotonic() + within
    for hook_name, place in _PLACE_HOOKS:
        hook = getattr(runner, hook_name, None)
        left = [delivery_id for delivery_id, known in places.items() if known == "here"]
        if not left or not callable(hook):
            continue
        listed = _ask_place_hook(hook_name, hook, deadline, within, asker="stop", unknown="the turns still running "
                                 "are settled as only 'still running when the gateway stopped' (the stop does not "
                                 "wait for it)")
        if listed == "hung":  # the stop asks no more runner code
            break
        if not isinstance(listed, str):  # it answered (one that raised lists nothing, and the next is asked)
            places.update((delivery_id, place) for delivery_id in left if delivery_id in listed)
    return places


def turn_process_running(
    runner: TurnRunner, delivery_id: str, *, profile: str, within: float = PLACE_HOOKS_SECONDS
) -> bool | None:
    """At a turn's timeout, off the ProfileActor: whether a turn process of the runner runs the turn of
    ``delivery_id`` (its optional ``running_turns()`` lists it), asked as the stop asks it
    (:func:`turn_places_at_stop`): on a daemon thread, for ``within`` seconds at most.

    Args:
        runner: the turn runner.
        delivery_id: the timed-out turn's delivery.
        profile: its bot (named in the log).
        within: seconds the hook gets.

    Returns:
        True when it lists the turn, False when it does not or the runner has no such hook, None when the hook
        raised or did not answer in time (logged once): not known, so a process of ours may hold the flock.
    """
    hook = getattr(runner, "running_turns", None)
    if not callable(hook):
        return False
    unknown = (f"the timed-out turn {delivery_id} may still run in a turn process, so the bot's next turn waits "
               "until that turn returns (its flock is kept)")
    listed = _ask_place_hook("running_turns", hook, time.monotonic() + within, within,
                             asker=f"{profile}: turn timeout", unknown=unknown)
    return None if isinstance(listed, str) else delivery_id in listed


def _ask_place_hook(
    name: str, hook: Callable[[], Any], deadline: float, budget: float, *, asker: str, unknown: str
) -> frozenset[str] | _HookSilence:
    """Call a place hook of the runner on a daemon thread, waiting for it until ``deadline`` (monotonic).

    One rule for every caller: runner code never runs on an actor's (or the stop's) thread, and is waited for a
    bounded time; the thread of a hook that hangs is left behind.

    Args:
        name: the hook's name (logged).
        hook: the runner's hook.
        deadline: monotonic time to stop waiting at.
        budget: the seconds the caller gives its hooks (logged when this one does not answer).
        asker: who asks (the log's prefix).
        unknown: what follows from an unknown answer (logged with it).

    Returns:
        The deliveries it lists; ``raised`` when it raised, ``hung`` when it did not answer in time (each logged
        once, here).
    """
    answer: list[frozenset[str]] = []

    def call() -> None:
        try:
            answer.append(frozenset(hook()))
        except BaseException as exc:  # runner code: only the wording of the outcomes depends on it
            logger.log(_hook_level(exc), "{}: the runner's {}() raised {}: {}", asker, name, describe_error(exc),
                       unknown)

    thread = threading.Thread(target=call, name=f"ask-{name}", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if thread.is_alive():
        logger.warning("{}: the runner's {}() did not answer within {:.1f}s: {}", asker, name, budget, unknown)
        return "hung"
    return answer[0] if answer else "raised"


def _hook_level(exc: BaseException) -> str:
    """The log level of a runner hook's exception: INFO for a typed :class:`TurnFailed` (an expected failure the
    DM's outcome already reports, e.g. no hermes CLI), WARNING for anything else (a bug in runner code)."""
    return "INFO" if isinstance(exc, TurnFailed) else "WARNING"


class TurnGate:
    """Decides, once, between a worker turn that begins and the ProfileActor giving up on it (its timeout).

    Whichever comes first wins: a turn that began runs (and the timeout reports it may still
    complete), a turn given up on before it began never runs (and the timeout reports it NOT
    delivered). Thread-safe: the worker and the actor's thread ask it.

    Two ways to give up: :meth:`give_up` (the turn's outcome is reported now: its timeout, a crash
    of its ProfileActor, the stop's end) also stops a turn that began from starting its retry;
    :meth:`give_up_unbegun` (the stop, as it begins) only stops one that has not begun, and a turn
    that began keeps its retry and its cleanup while the stop waits for it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._began = False
        self._began_at: float | None = None  # monotonic: when the turn began (its flock taken, if any)
        self._given_up = False

    def begin(self) -> bool:
        """The worker, before the turn's first step: whether it may run (not given up on)."""
        with self._lock:
            if not self._given_up and not self._began:
                self._began, self._began_at = True, time.monotonic()
            return self._began

    def began_at(self) -> float | None:
        """When the turn began (monotonic), or None while it has not: a wake's turn timer counts from it."""
        with self._lock:
            return self._began_at

    def give_up(self) -> bool:
        """The ProfileActor, at the timeout: no retry may start from now on; whether the turn had begun."""
        with self._lock:
            self._given_up = True
            return self._began

    def give_up_unbegun(self) -> bool:
        """The stop, as it begins: a turn that has not begun never will; one that began is left as it is.

        It runs on, its retry (docs/protocol.md, "Reasons") and its ``forget_failed`` cleanup included: the stop
        waits for it within its timeout, and gives up on it (:meth:`give_up`) at its end.

        Returns:
            Whether the turn had begun.
        """
        with self._lock:
            if not self._began:
                self._given_up = True
            return self._began

    def given_up(self) -> bool:
        """Whether the turn was given up on (then no retry may start)."""
        with self._lock:
            return self._given_up


class TurnGates:
    """The gates of one gateway's turns under way, one per profile: once stopped, no turn starts.

    Thread-safe. A ProfileActor opens the gate of each turn it starts (inline or on a worker)
    here and closes it when the turn is over. The stop first :meth:`stop` s them: from then on no
    gate opens, so no turn starts, however busy its ProfileActor is, or stuck in a turn on its own
    thread (a non-blocking runner that blocks). The turn of a ProfileActor that cannot answer the
    stop is decided here (:meth:`give_up_unbegun`), without its thread, and once the stop has waited
    what it may, no turn still under way starts a retry (:meth:`give_up_all`).

    Args:
        hold: the host's stop sign (``Gateway(host_stopping=...)``), asked as each gate is about to open: once it
            says the host's stop has begun (the hermes gateway hosting the actors, whose stop closes its API
            server before it stops ours), the gates are stopped as by :meth:`stop`, for good. The queued DMs wait
            for the gateway's stop, which follows and settles them.
    """

    def __init__(self, hold: Callable[[], bool] | None = None) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, tuple[str, TurnGate]] = {}  # profile → (delivery id, gate) of its turn under way
        self._stopped = False
        self._hold = hold
        self._hold_raised = False  # the sign raised once (logged): said once only

    def open(self, profile: str, delivery_id: str) -> TurnGate | None:
        """The gate of the turn ``profile`` is about to start for ``delivery_id``.

        Returns:
            A new gate, or None once stopped, or once the host's stop began: the turn must not start (it stays
            queued for the stop).
        """
        if self._hold is not None and not self._stopped and self._host_stops(self._hold):
            self._held()
        with self._lock:
            if self._stopped:
                return None
            gate = TurnGate()
            self._open[profile] = (delivery_id, gate)
            return gate

    def close(self, profile: str, gate: TurnGate) -> None:
        """The turn of ``gate`` is over (finished, timed out, given up on)."""
        with self._lock:
            entry = self._open.get(profile)
            if entry is not None and entry[1] is gate:
                del self._open[profile]

    def stop(self) -> None:
        """No gate opens from now on (the gateway stops)."""
        with self._lock:
            self._stopped = True

    def _host_stops(self, hold: Callable[[], bool]) -> bool:
        """Whether the host's stop sign says its stop has begun: only a True does; one that raises (the host's
        code) says nothing, and is logged once."""
        try:
            return hold() is True
        except Exception:
            if not self._hold_raised:
                self._hold_raised = True
                logger.exception("the host's stop sign (host_stopping) raised: taken as not stopping")
            return False

    def _held(self) -> None:
        """The host's stop began: no gate opens from now on (said once)."""
        with self._lock:
            first, self._stopped = not self._stopped, True
        if first:
            logger.info("the process hosting the gateway began to stop: no turn starts from now on (the DMs queued "
                        "or arriving meanwhile wait for the gateway's stop, which keeps journaled ones for the next "
                        "start)")

    def give_up_unbegun(self, profile: str) -> str | None:
        """Give up on the turn under way for ``profile`` if it has not begun (see :meth:`TurnGate.give_up_unbegun`).

        Returns:
            Its delivery id when it began (it may still be running), else None (none, or it never runs).
        """
        with self._lock:
            entry = self._open.get(profile)
        if entry is None:
            return None
        delivery_id, gate = entry
        return delivery_id if gate.give_up_unbegun() else None

    def give_up_all(self) -> None:
        """The stop waited what it may: the turns still under way are reported ``ambiguous`` now, so none of
        them starts a retry (or takes its DM back from the session) from now on (see :meth:`TurnGate.give_up`)."""
        with self._lock:
            gates = [gate for _, gate in self._open.values()]
        for gate in gates:
            gate.give_up()


def execute_turn(
    delivery: Delivery,
    *,
    runner: TurnRunner,
    lock: TurnLock | None,
    lock_deadline: float,
    make_turn: TurnFactory,
    journal: StartRecorder | None = None,
    held: bool = False,
    gate: TurnGate | None = None,
) -> TurnFinished:
    """Run ``delivery``'s turn with at most one retry, under the profile's flock.

    Args:
        delivery: what to deliver.
        runner: the turn runner.
        lock: the profile's cross-process lock (None: no cross-process lock).
        lock_deadline: monotonic time after which waiting for the lock gives up
            with ``target_busy`` (the turn never runs).
        make_turn: builds the runner's ``Turn`` (attempt 1), given the flock's fd.
        journal: in durable mode, the turn's start is on disk before it runs,
            so a crash mid-turn is recovered as ``ambiguous``, never re-run. A start the
            delivery journal cannot take ends in :func:`not_recorded` (the turn is queued again).
        held: the caller holds ``lock`` (``TurnLock.try_acquire``) and releases it
            (a ProfileActor holds it across a burst of inline turns).
        gate: the ProfileActor gives up on the turn there when its time ran out: the DM already
            has its outcome and the profile serves its next DM, so a turn that had not begun never
            does, and no retry may start (it would run the message a second time, beside the next
            DM's turn). The stop gives up on a turn that had not begun as it begins, and on every
            turn still under way once it stopped waiting (:class:`TurnGates`).

    Returns:
        The result for the ProfileActor; ``reply`` is the raw runner value.
    """
    with running_turn_of(make_turn):
        return _execute_turn(delivery, runner=runner, lock=lock, lock_deadline=lock_deadline, make_turn=make_turn,
                             journal=journal, held=held, gate=gate)


def _execute_turn(
    delivery: Delivery,
    *,
    runner: TurnRunner,
    lock: TurnLock | None,
    lock_deadline: float,
    make_turn: TurnFactory,
    journal: StartRecorder | None,
    held: bool,
    gate: TurnGate | None,
) -> TurnFinished:
    if gate is not None and gate.given_up():  # given up on before its worker came to it: never runs
        return not_begun(delivery.delivery_id)
    if lock is not None and not held:
        try:
            # a wait given up on (the gateway stops, or the turn's time ran out) ends at once: the turn
            # never runs, so the flock is neither waited for nor taken any longer
            waited = lock.acquire(lock_deadline, given_up=gate.given_up if gate is not None else None)
        except OSError as exc:
            return never_ran(delivery.delivery_id, "taking the turn lock", exc)
        if waited is None and gate is not None and gate.given_up():
            return not_begun(delivery.delivery_id)
        if waited is None:
            return TurnFinished(
                delivery.delivery_id,
                None,
                busy_text(delivery.target, time.time() - delivery.accepted_at),
                "target_busy",
            )
    # True once this turn returns: its outcome may be journaled from then on. A list, not a threading.Event: one
    # thread writes it, the via recorder only reads it, and an Event per turn cost ~4 µs of every DM's CPU
    ended = [False]
    try:
        if gate is not None and not gate.begin():  # reported NOT delivered while it waited: never runs
            return not_begun(delivery.delivery_id)
        if journal is not None:
            try:
                journal.append_durably({"t": "started", "id": delivery.delivery_id, "attempt": 1})
            except StoreError as exc:
                if isinstance(journal, Journal):  # the delivery journal: it holds the DM, queued again
                    return not_recorded(delivery.delivery_id, exc)
                return never_ran(delivery.delivery_id, "recording the turn durably", exc)
        crashpoint("mid-wake" if delivery.origin == WAKE_ORIGIN else "mid-turn")
        try:
            # the turn's process (if any) inherits the flock's fd: it holds the flock as long as it lives
            turn = make_turn(delivery, lock.fd if lock is not None else None)
        except TurnFailed as exc:  # e.g. the profile is gone: said as it is, never retried
            return TurnFinished(delivery.delivery_id, None, exc.text, normalize_reason(exc.reason, exc.text))
        except Exception as exc:  # our own code, but the DM must still get its outcome now
            logger.exception("building the turn of {} failed", delivery.delivery_id)
            return never_ran(delivery.delivery_id, "building the turn", exc)
        if isinstance(journal, Journal):  # a relay's start mark keeps the start alone
            over = _turn_over(ended, gate)
            # The turn was built just now and has not left this thread: its recorder is set in place, not by
            # dataclasses.replace (~5 µs of every durable DM's CPU for a copy of the whole Turn)
            object.__setattr__(turn, "_note_via", via_recorder(journal, delivery.delivery_id, over=over))
        began = time.time()
        result, may_retry = attempt_turn(runner, turn)
        if result.reply is None and may_retry:
            action = retry_action(result.reason)
            if action != RETRY_NONE and gate is not None and gate.given_up():
                logger.info("not retrying {}: its outcome was reported already (its turn timed out, or the "
                            "gateway's stop gave up on it)", delivery.delivery_id)
            elif action != RETRY_NONE:
                retry = replace(turn, attempt=2, retry_action=action)
                if retry_allowed(runner, retry, began):
                    logger.info("retrying {} once in the same session ({})", delivery.delivery_id, action)
                    result, _ = attempt_turn(runner, retry)
        # Taken back only when the DM is reported NOT delivered: not when it timed out (reported "may have
        # been done") nor when the gateway's stop ended it or gave up waiting for it (reported ambiguous: it
        # may have been read). A turn the stop only waits for is not given up on: its failure is its outcome.
        if (result.reply is None and not result.ambiguous and result.reason != CANCELLED
                and not (gate is not None and gate.given_up())):
            forget_failed(runner, turn, began)
        return result
    finally:
        ended[0] = True
        if lock is not None and not held:
            try:
                lock.release()
            except Exception:  # the turn's result stands over an unlock error
                logger.exception("releasing the turn lock of {} failed", delivery.delivery_id)
        release = getattr(runner, "release", None)
        if callable(release):  # the delivery is settled: its DM file (if any) may go
            try:
                release(delivery.delivery_id)
            except BaseException:  # runner code: it must not replace the turn's result
                logger.exception("runner release failed for {}", delivery.delivery_id)


def _turn_over(ended: list[bool], gate: TurnGate | None) -> Callable[[], bool]:
    """The ``over`` of :func:`via_recorder`: the turn's ``execute_turn`` returned, or its gate was given up on.

    Built here, not in ``_execute_turn``: a closure there gave every turn, journaled or not, cells for
    what it uses.
    """
    if gate is None:
        return lambda: ended[0]
    return lambda: ended[0] or gate.given_up()


def via_recorder(journal: StartRecorder, delivery_id: str, *, over: Callable[[], bool]) -> Callable[[str], None]:
    """The ``Turn.note_via`` of a journaled turn: a ``started`` record carrying ``via`` ("warm" or "cli"), durable
    before the runner goes on, each time the turn's path changes (a warm turn that fell back to the CLI).

    The next start words a turn a killed host left by it (:func:`~hermes_actors.core.recovery.plan_recovery`):
    a CLI turn is never told "the hermes gateway ran it", whatever the root's warm-turn setup says. Once the
    turn is over for its gateway nothing is written: its outcome is reported (its time ran out, the stop gave
    up on it) or about to be, and a ``started`` record after its ``finished`` and ``delivered`` ones (a warm
    attempt that outlived ``turn_timeout_seconds``, then fell back to the CLI) would make a DM of nothing.

    Args:
        journal: the gateway's journal.
        delivery_id: the turn's delivery.
        over: whether the turn is over for its gateway (its gate given up on, or its ``execute_turn`` returned).

    Returns:
        The callable; a record it could not write is logged (WARNING) and the turn runs all the same: its
        start is on disk, and without ``via`` the next start words it as before (by the runner's ``runs_apart``).
    """
    noted: list[str] = []

    def note(via: str) -> None:
        if noted and noted[-1] == via:  # a retry on the same path: already on disk
            return
        if over():  # nobody will ever recover this turn from the journal: its outcome is (being) settled
            logger.info("not journaling that the turn {} runs {}: its outcome was reported already", delivery_id,
                        via)
            return
        try:
            journal.append_durably({"t": "started", "id": delivery_id, "attempt": 1, "via": via})
        except StoreError as exc:
            logger.warning("could not journal that the turn {} runs {} ({}): were this host killed during it, the "
                           "next start would word its outcome by the root's warm-turn setup", delivery_id, via, exc)
            return
        noted.append(via)

    return note


def not_begun(delivery_id: str) -> TurnFinished:
    """Pure: the result of a worker turn its ProfileActor gave up on before it began (it never runs).

    Args:
        delivery_id: the delivery.

    Returns:
        A failed :class:`TurnFinished`; the ProfileActor already settled the DM (its turn timed out,
        or the gateway stopped) and drops it.
    """
    return TurnFinished(delivery_id, None, "the turn was given up on before it began", "target_busy")


class TurnFactory(Protocol):
    """Builds the first-attempt :class:`Turn` of a delivery (the Dispatcher's ``_make_turn``)."""

    def __call__(self, delivery: Delivery, lock_fd: int | None = None) -> Turn:
        """The turn of ``delivery``; ``lock_fd`` is the profile's flock fd, when held.

        Raises:
            TurnFailed: the turn cannot be built (its profile was removed): the DM fails with it, never retried.
        """
        ...


def turn_for(
    delivery: Delivery, *, home: Path | None, root: Path | None, send: Callable[[str, str], dict[str, Any]],
    lock_fd: int | None = None,
) -> Turn:
    """Pure: the first-attempt :class:`Turn` of ``delivery``.

    Args:
        delivery: the delivery to run.
        home: the target profile's home (None: it is gone).
        root: the Hermes root.
        send: sends a DM as the target, one hop deeper (``Turn.message_agent``).
        lock_fd: the profile's flock fd while the turn holds it (a turn's process inherits it).
    """
    return Turn(
        profile=delivery.target,
        content=delivery.content,
        delivery_id=delivery.delivery_id,
        session=delivery.session,
        handle=delivery.target_handle,
        home=home,
        root=root,
        sender=delivery.sender,
        sender_handle=delivery.sender_handle,
        hop=delivery.hop,
        author=dict(delivery.author),
        lock_fd=lock_fd,
        _send=send,
    )
