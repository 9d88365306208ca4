"""Typed dispatch: an actor whose handlers are chosen by the message's type.

A handler is a method decorated with ``@handles(SomeMessage)`` (see
:mod:`actors.handler_table`). The message's class (and its bases, most specific
first) selects the handler. A message no handler accepts is an error: the asker
gets :class:`UnknownMessageError`; for a tell it is logged and dropped, and the
actor keeps running.

Ask a TypedActor with :func:`actors.ask` (it sends a :class:`Request`, our own
envelope, so an ask is told apart from a tell without pykka internals). An error
from an asked handler goes back to the asker and the actor keeps running. An
error from a *told* handler (or from ``on_start``) is a crash: a supervised actor
tells its supervisor at once (``ChildCrashed``) and collects every message it gets
until the supervisor answers ``Retire`` (an unsupervised one, until the end of its
mailbox); then it stops and hands what it collected to :meth:`TypedActor.on_crash`
(by default to the supervisor, which passes it to the restarted actor). What reached
its inbox behind its stop is collected too, as it stops (pykka's teardown would drop
it). A ``BaseException`` that is not an ``Exception`` (``SystemExit``...) is handled the
same way and never reaches pykka, which would stop every actor in the process; nor
does one from a crash hook (``on_crashing``, ``salvage``, ``answer_after_crash``,
``on_crash``) or an ``ask_reply_to`` reply builder: it is logged and the crash (or the
reply) goes on without it (:func:`actors.hooks.call_hook`).

Only pykka's public API is used, with one exception, on purpose: collecting what is behind a crashed actor's
stop reads its ``actor_inbox`` (public) and each envelope's ``message`` and ``reply_to``, which pykka calls an
internal type. Without it every tell behind the stop is dropped by pykka's teardown; the supervision tests
(``tests/test_actors_supervision.py``) fail if a pykka release changes that shape.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, ClassVar

import pykka
import pykka.messages
from loguru import logger

from actors.crash_records import CrashRecord, EndOfMailbox, Link, fail_pending
from actors.errors import HandlerAborted, UnknownMessageError
from actors.handler_table import handler_name, handler_table, unknown_message
from actors.hooks import call_hook
from actors.messages import ChildCrashed, ChildFailed, Relayed, Request, Retire
from actors.timers import Scheduler, TimerSet

__all__ = ["TypedActor"]

_ON_CRASH_FAILED: Any = object()  # what call_hook returns for an on_crash that raised


def _wrap_on_stop(on_stop: Callable[[Any], None]) -> Callable[[Any], None]:
    @functools.wraps(on_stop)
    def on_stop_then_release(self: TypedActor) -> None:
        try:
            on_stop(self)
        finally:
            self._on_stopped()

    return on_stop_then_release


def _wrap_on_start(on_start: Callable[[Any], None]) -> Callable[[Any], None]:
    @functools.wraps(on_start)
    def on_start_or_crash(self: TypedActor) -> None:
        if self._starting:  # a subclass's on_start calling super(): the outermost one decides
            on_start(self)
            return
        self._starting = True
        try:
            on_start(self)
        except BaseException as error:  # pykka would stop the actor unreported: make it a crash like a handler's
            self._begin_crash(error)
        finally:
            self._starting = False

    return on_start_or_crash


class TypedActor(pykka.ThreadingActor):
    """A pykka actor with handlers selected by message type.

    Timers made with :meth:`own_timers` are cancelled when the actor stops or
    crashes, whatever a subclass's ``on_stop`` does.

    Args:
        link: set by a supervisor; the child reports crashes through it.
    """

    _handler_table: ClassVar[dict[type, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._handler_table = handler_table(cls)
        if "on_stop" in vars(cls):  # the base's release runs even when an override forgets super()
            cls.on_stop = _wrap_on_stop(vars(cls)["on_stop"])  # type: ignore[method-assign,assignment]
        if "on_start" in vars(cls):  # a failed start reports to the supervisor, as a handler's crash does
            cls.on_start = _wrap_on_start(vars(cls)["on_start"])  # type: ignore[method-assign,assignment]

    def __init__(self, *, link: Link | None = None) -> None:
        super().__init__()
        self.link = link
        self._dispatch_cache: dict[type, Callable[[Any], Any] | None] = {}
        self._timer_sets: list[TimerSet] = []
        self._crash: CrashRecord | None = None
        self._starting = False
        self._crash_reported = False  # the default on_crash ran (an override that fails before it is covered)

    # ── timers ──────────────────────────────────────────────────────────────

    def own_timers(self, scheduler: Scheduler) -> TimerSet:
        """A set of timers telling this actor, cancelled automatically when it stops or crashes.

        Args:
            scheduler: the system's scheduler.

        Returns:
            The :class:`TimerSet` (keep it, e.g. as ``self.timers``).
        """
        timers = TimerSet(scheduler, self.actor_ref)
        self._timer_sets.append(timers)
        return timers

    def cancel_timers(self) -> None:
        """Cancel every timer of every set made by :meth:`own_timers` (idempotent)."""
        for timers in self._timer_sets:
            timers.cancel_all()

    def on_stop(self) -> None:
        """Cancel the owned timers; a crashed actor reports its mailbox (see :meth:`on_crash`).

        Subclasses may override without calling super(): this still runs after them.
        """
        self._on_stopped()

    def _on_stopped(self) -> None:
        """What every stop does after ``on_stop`` (idempotent); the toolkit's supervisors extend it."""
        self.cancel_timers()
        if self._crash is not None:
            self._collect_behind_stop()
        crash, self._crash = self._crash, None
        if crash is not None:
            self._report_crash(crash)

    # ── dispatch ────────────────────────────────────────────────────────────

    def _handler_for(self, message_type: type) -> Callable[[Any], Any] | None:
        try:
            return self._dispatch_cache[message_type]
        except KeyError:
            pass
        name = handler_name(self._handler_table, message_type)
        handler = getattr(self, name) if name is not None else None
        self._dispatch_cache[message_type] = handler
        return handler

    def _unknown(self, message: Any) -> UnknownMessageError:
        return unknown_message(type(self).__name__, message, self._handler_table)

    def on_receive(self, message: Any) -> Any:
        """Route ``message`` to the handler registered for its type (pykka calls this).

        Args:
            message: a told message, or a :class:`Request` (an ask).

        Returns:
            The handler's answer (pykka hands it to a ``ref.ask`` asker). A plain
            ``ref.ask`` whose handler raises crashes the actor like a tell and gets
            None: ask through :func:`actors.ask` to get errors back.

        Raises:
            Exception: only to a pykka asker of a :class:`Request`: the handler's error
                (a ``HandlerAborted`` for a BaseException). Told messages never raise.
        """
        if self._crash is not None:
            return self._collect(message)
        answer = self._answer(message) if isinstance(message, Request) else self._tell(message)
        if self._crash is None:
            try:
                self.after_message(asked=isinstance(message, Request))
            except BaseException as error:  # as a handler's error: this actor crashes, nothing else
                self._begin_crash(error)
        return answer

    def after_message(self, *, asked: bool) -> None:
        """Called after each message's handler (not once the actor crashed); a no-op here.

        Override it to act on what the handlers gathered, e.g. hand on a batch once
        :meth:`mailbox_size` is 0. An error raised here crashes this actor like a handler's.

        Args:
            asked: the message was an ask (its asker may rely on everything before the answer).
        """

    def _tell(self, message: Any) -> Any:
        handler = self._handler_for(type(message))
        if handler is None:
            logger.warning("{} dropped a told message: {}", self, self._unknown(message))
            return None
        try:
            return handler(message)  # answers a plain pykka ref.ask; ignored for a tell
        except BaseException as error:  # a crash of this actor only, never of the system
            self._begin_crash(error)
        return None

    def _answer(self, request: Request) -> Any:
        handler = self._handler_for(type(request.message))
        try:
            if handler is None:
                raise self._unknown(request.message)
            value = handler(request.message)
        except Exception as error:
            if request.reply(None, error):
                return None  # the asker gets it as a told reply
            if request.relay is None:
                raise  # pykka hands it to the asker
            request.relay.set_exception(exc_info=sys.exc_info())
            logger.debug("{} answered a relayed ask with {!r}", self, error)
            return None
        except BaseException as error:
            aborted = HandlerAborted(str(self), error)
            if request.reply(None, aborted):
                return None
            if request.relay is None:
                raise aborted from error
            request.relay.set_exception(exc_info=(HandlerAborted, aborted, None))
            return None
        request.reply(value, None)
        if request.relay is not None:
            request.relay.set(value)
        return value

    # ── crash handling ──────────────────────────────────────────────────────

    def _begin_crash(self, error: BaseException) -> None:
        logger.opt(exception=error).error("{} crashed", self)
        self.cancel_timers()
        call_hook(self, "on_crashing", lambda: self.on_crashing(error), None)
        self._crash = CrashRecord(error, call_hook(self, "salvage", self.salvage, None))
        if not self._notify_supervisor():
            self.actor_ref.tell(EndOfMailbox())

    def _notify_supervisor(self) -> bool:
        """Tell the supervisor of the crash at once; True when it will answer ``Retire``.

        Until then the child keeps collecting what it is sent: whatever the supervisor
        sent before it knew reaches the report, and it sends nothing after. (Stopping at
        once would leave a window where a tell is accepted and then dropped by pykka.)
        """
        if self.link is None:
            return False
        try:
            self.link.supervisor.tell(ChildCrashed(self.link.name, self.link.generation, self.actor_ref))
        except pykka.ActorDeadError:
            return False
        return True

    def _collect(self, message: Any) -> Any:
        if isinstance(message, EndOfMailbox | Retire):
            self.stop()  # what is queued before the stop is collected too; on_stop reports it all
            return None
        return self._hold(message)

    def _collect_behind_stop(self) -> None:
        """Collect what is still in the inbox as the crashed actor stops (in ``on_stop``), in order.

        pykka's teardown would drop the tells queued behind the stop and fail the asks
        (``ActorDeadError``, though a successor may answer them). pykka marks the actor
        stopped before ``on_stop``: from then on a tell or ask raises ``ActorDeadError``
        at its sender, so what is here is all that was accepted. pykka's own messages
        (another stop, proxy calls) are put back for its teardown to answer. What remains
        is pykka's own check-then-put in ``ref.tell``/``ref.ask``: a sender that found the
        actor alive just before it was marked stopped may put its message after this
        drain, and the teardown drops it (a tell) or fails it (an ask).
        """
        for_pykka = []
        while not self.actor_inbox.empty():
            envelope = self.actor_inbox.get()
            message = envelope.message
            if type(message).__module__ == pykka.messages.__name__:
                for_pykka.append(envelope)
                continue
            answer = None if isinstance(message, EndOfMailbox | Retire) else self._hold(message)
            if envelope.reply_to is not None:
                envelope.reply_to.set(answer)
        for envelope in for_pykka:
            self.actor_inbox.put(envelope)

    def _hold(self, message: Any) -> Any:
        """Keep ``message`` for the crash report; an ask's asker is told to wait on its relay.

        Returns:
            What the asker gets now: ``answer_after_crash``'s answer, or :class:`Relayed`.
        """
        assert self._crash is not None
        if isinstance(message, Request):
            answered, value = call_hook(
                self, "answer_after_crash", lambda: self.answer_after_crash(message.message), (False, None)
            )
            if answered:  # e.g. the supervisor's own ask, which would wait for the restart it has to make
                message.reply(value, None)
                if message.relay is not None:  # handed on by an earlier crash: its asker waits there
                    message.relay.set(value)
                return value
        self._crash.held.append(message)
        if not isinstance(message, Request):
            return None
        if message.relay is None:
            message.relay = pykka.ThreadingFuture()
        return Relayed(message.relay)  # the asker now waits on the relay

    def _report_crash(self, crash: CrashRecord) -> None:
        reported = call_hook(
            self, "on_crash", lambda: self.on_crash(crash.error, crash.held, crash.salvage), _ON_CRASH_FAILED
        )
        if reported is _ON_CRASH_FAILED and not self._crash_reported:
            # the override failed before the default ran: the supervisor still hears
            TypedActor.on_crash(self, crash.error, crash.held, crash.salvage)

    def mailbox_size(self) -> int:
        """How many messages wait in this actor's mailbox (approximate, like any queue size)."""
        qsize = getattr(self.actor_inbox, "qsize", None)
        return int(qsize()) if qsize is not None else 0

    def on_crash(self, error: BaseException | None, pending: list[Any], salvage: Any) -> None:
        """Called in the actor's thread once a crashed actor has collected its mailbox, as it stops.

        The default reports to the supervisor (when linked), passing the mailbox
        and salvage along; unsupervised, pending asks fail with ``ActorDeadError``.

        Args:
            error: the exception that crashed the actor.
            pending: the told messages and :class:`Request` objects queued behind the crash.
            salvage: what :meth:`salvage` returned at the crash.
        """
        self._crash_reported = True
        if self.link is not None:
            try:
                self.link.supervisor.tell(
                    ChildFailed(self.link.name, self.link.generation, error, tuple(pending), salvage, self.actor_ref)
                )
                return
            except pykka.ActorDeadError:
                logger.error("{} crashed and its supervisor is gone", self)
        logger.error("{} crashed unsupervised: {!r}", self, error)
        fail_pending(str(self), pending)

    def answer_after_crash(self, message: Any) -> tuple[bool, Any]:
        """Hook: answer an ask that reaches this actor after it crashed, instead of handing it on.

        By default an ask queued behind a crash is answered by the restarted instance. An
        ask its supervisor makes synchronously cannot wait for that: the supervisor makes
        the restart. Override to answer such asks here (on the crashed instance's thread).

        Args:
            message: the asked message.

        Returns:
            ``(True, answer)`` to answer now; ``(False, None)`` to hand it to the restarted instance.
        """
        return False, None

    def salvage(self) -> Any:
        """State worth handing to the restarted instance (override); taken at the crash. Default None."""
        return None

    def on_crashing(self, error: BaseException) -> None:
        """Hook: called on the actor's thread the moment ``error`` crashes it; a no-op here.

        It runs before what is queued behind the crash is collected (see :meth:`on_crash`),
        so an actor that is fed by other threads can stop them here: whatever they
        told it before this returns is still collected and reported, never dropped.

        Args:
            error: the exception that crashed the actor.
        """

