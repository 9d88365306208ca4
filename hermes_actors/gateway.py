"""The embedding facade: ``Gateway`` starts the actors and is the public API.

    with Gateway(root="/path/to/hermes-root") as gw:
        ack = gw.message_agent(sender="alice", target="bob", message="hi")
        out = gw.wait_outcome(ack["delivery_id"], timeout=30)
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import pykka
from loguru import logger

from actors import ActorGone, FsBridge
from hermes_actors.core.config import BotModeConfig, load_config
from hermes_actors.core.names import checked_connection_id
from hermes_actors.facade.args import (
    checked_abandon,
    checked_callable,
    checked_config,
    checked_hop,
    checked_root,
    checked_roster_rows,
    checked_workers,
    wait_seconds,
)
from hermes_actors.facade.failure import DispatcherFailure
from hermes_actors.facade.lifecycle import Lifecycle, refuse_stop_in_own_turn
from hermes_actors.facade.off_main import OffMainThread
from hermes_actors.facade.options import ASK_TIMEOUT, SystemOptions, explicit_runner, redis_settings_for
from hermes_actors.facade.outcomes import OutcomeWaits
from hermes_actors.facade.process import OwnerProcess, forget_at_exit, stop_at_exit
from hermes_actors.facade.registrations import Registrations, SubscriberEntry
from hermes_actors.facade.sends import SendsInFlight
from hermes_actors.facade.starting import StartRun
from hermes_actors.local.notifier import Notifier
from hermes_actors.local.runners import TurnRunner, as_runner
from hermes_actors.messages import BOT_CHAT_SESSION, SendRequest
from hermes_actors.relay.desktop_rpc import DesktopRpc
from hermes_actors.rooms import Rooms
from hermes_actors.rooms.store import RoomsOnDisk
from hermes_actors.store.journal import Journal
from hermes_actors.system import ActorSystem
from hermes_actors.transports.peer_cli import PeerCliTransport

__all__ = ["Gateway"]



_Method = TypeVar("_Method", bound=Callable[..., Any])
_RUNNING = frozenset({"running", "stopping"})


def _off_main_thread(method: _Method) -> _Method:
    """While the gateway runs, a call made on the main thread runs on its call thread (facade/off_main.py)."""

    @functools.wraps(method)
    def call(self: Gateway, *args: Any, **kwargs: Any) -> Any:
        # Other threads (every sender under serve) go straight on: no handler runs there, and a DM pays no more
        # than these two checks. Not running: no actor whose mailbox an interrupt could wedge.
        if threading.get_ident() != threading.main_thread().ident or self._lifecycle.state not in _RUNNING:
            return method(self, *args, **kwargs)
        return _on_call_thread(self, method, args, kwargs)

    return call  # type: ignore[return-value]


def _on_call_thread(gateway: Gateway, method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run a main thread's call on the gateway's call thread. Apart from ``call`` above: the closure it builds
    would otherwise give every call, on any thread, cells for its arguments (every DM passes there)."""
    return gateway._off_main.run(lambda: method(gateway, *args, **kwargs))


def _off_main_thread_last(method: _Method) -> _Method:
    """The stop: on the call thread like the other calls, which then ends (it was the gateway's to end)."""

    @functools.wraps(method)
    def call(self: Gateway, *args: Any, **kwargs: Any) -> Any:
        return self._off_main.run(lambda: method(self, *args, **kwargs), last=True)

    return call  # type: ignore[return-value]


class Gateway:
    """One gateway process's Bot Mode messaging.

    Stop it with :meth:`stop` or a ``with`` block. One never stopped is stopped as the interpreter exits
    (within ``stop()``'s timeout, with a warning naming its root): its actors' threads would keep the
    process from exiting. A started gateway belongs to its process: in a ``fork()`` of it every call
    raises ``RuntimeError`` naming both processes (start a new Gateway in the child), and its exit leaves
    the parent's gateway alone.

    Args:
        root: the Hermes root (the default profile's home).
        runner: how turns run. None (the default): the real Hermes, chosen at
            :meth:`start` by :func:`hermes_actors.hermes.select.default_runner` — warm
            turns through the hermes gateway's API server when one serves the root,
            else the ``hermes`` CLI (no CLI installed: every turn fails
            ``runtime_offline`` saying how to install it). ``"demo"``: the built-in
            offline demo bots. Else an object with ``run_turn(turn) -> str`` or a
            callable ``fn(turn) -> str``.
        config: a dict shaped like ``config.yaml``, deep-merged over
            ``<root>/config.yaml``.
        connection_id: this gateway's connection id on a relay (None: local only).
        workers: the turn worker thread cap: a whole number, 1 or more (an int, ``numpy.int64``, ``8.0``; never a
            bool), threads starting as turns need them, up to it.
        cross_process_lock: hold ``bot_relay/locks/<profile>.lock`` for each turn.
        peer_transport: how ``bot_peers`` targets are reached (default: the CLI).
        durable: journal every local delivery before acking it (group commit) and
            recover on the next start; False trades that for speed.
        fsync: with ``durable``, fsync each group commit (False only for tests of speed).
        serve_submit: serve the root's local submit endpoint (``bot_relay/run/submit.sock``)
            while running, so bots' ``hermes`` processes and ``hermes-actors send`` reach
            this host (:mod:`hermes_actors.hermes.submit`).
        drive_rooms: drive the root's group rooms (docs/rooms.md): hold ``bot_relay/rooms/.owner.lock``, resume
            their rounds at the start, run their member turns. False for a gateway that runs no room turn
            (``hermes-actors send`` without a host): it leaves the lock and the rounds to the gateway that drives
            them; its ``list_rooms`` and ``room_transcript`` read the room files, its other room calls raise
            ``RuntimeError``.
        on_failure: called once with the error if the gateway's Dispatcher fails (a bug:
            an error escaped one of its handlers). From then on the gateway is not
            ``running``: ``message_agent`` raises ``RuntimeError`` (the tool refuses with
            ``runtime_offline``) and every DM acked from memory only has its outcome; call
            :meth:`stop`, then start a new Gateway on the root (a durable gateway's journaled
            DMs are re-offered). Runs on the failed actor's thread: hand the restart to
            another thread. ``hermes-actors serve`` and the hermes gateway's host restart
            on their own.
        host_stopping: for a gateway hosted in a process with a stop of its own that begins
            before it stops this gateway (the hermes gateway, whose stop closes its API server
            first): called as each turn is about to start, it says whether that stop has begun.
            Once it says True, for good, no turn starts, as once :meth:`stop` has begun: DMs are
            still accepted (and journaled), the turns already running go on, and the stop that
            must follow settles what is queued (a durable gateway keeps it for the next start).
            It must be quick (no I/O: it runs in the actors); one that raises says False.

    Raises:
        TypeError: ``root`` is not a str or path, ``config`` is not a dict, ``workers`` is not a whole number, or
            ``on_failure`` or ``host_stopping`` is not callable.
        ValueError: ``root`` is empty (``Path("")`` is the current directory, where the
            relay and journal directories would be created by accident),
            ``connection_id`` is not 1-64 letters, digits, ``_`` or ``-``, or ``workers`` is less than 1.
        FileNotFoundError: from :meth:`start` when ``root`` is not a directory.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        runner: Any = None,
        config: dict[str, Any] | None = None,
        connection_id: str | None = None,
        workers: int = 64,
        cross_process_lock: bool = True,
        peer_transport: PeerCliTransport | None = None,
        durable: bool = True,
        fsync: bool = True,
        serve_submit: bool = False,
        drive_rooms: bool = True,
        on_failure: Callable[[BaseException | None], Any] | None = None,
        host_stopping: Callable[[], bool] | None = None,
    ) -> None:
        self.root = checked_root(root)
        self.overrides = checked_config(config)
        self.runner: TurnRunner | None = explicit_runner(runner)  # None: the real Hermes, chosen at start()
        # "" is "not given" (Redis then takes bot_mode.connection_id), as None
        self.connection_id = checked_connection_id(connection_id) if connection_id else None
        self.workers = checked_workers(workers)
        self.cross_process_lock = cross_process_lock
        self.peer_transport = peer_transport
        self.durable = durable
        self.fsync = fsync
        self.serve_submit = serve_submit
        self.drive_rooms = drive_rooms
        self.host_stopping = checked_callable("host_stopping", host_stopping, "a callable returning a bool")
        on_failure = checked_callable("on_failure", on_failure,
                                      "a callable (called with the Dispatcher's error) or None")
        self._submit: Any = None  # the submit endpoint while serve_submit runs
        self.recovered: dict[str, int] = {}
        self.config: BotModeConfig | None = None
        self._lifecycle = Lifecycle()  # new → running → stopping → stopped
        self.started_at: float | None = None  # time.time() once start() finished (``status`` shows the uptime)
        # message_agent calls in flight: stop() waits for them, so no DM is acked after the stop began and then
        # lost behind it
        self._sends = SendsInFlight()
        self._off_main = OffMainThread("gateway-calls")  # the main thread's calls, safe from its interrupts
        self._registrations = Registrations()  # subscribers and live owners given before start()
        self._outcomes = OutcomeWaits()  # the stopped Dispatcher's outcomes, and the waits a stop wakes
        self._system: ActorSystem | None = None  # the actors and threads while started
        self._process = OwnerProcess(self.root)  # the process that started it: a fork of it refuses every call
        self._start_run = StartRun()  # the last start() (one abandoned by a Ctrl-C may still be undoing itself)
        self._failure = DispatcherFailure(self.root, on_failure, self._sends, self._outcomes,
                                          running=lambda: self._lifecycle.state == "running")

    # ── lifetime ────────────────────────────────────────────────────────────

    def start(self) -> Gateway:
        """Start every actor. Returns self.

        A ``KeyboardInterrupt`` (or any exception a signal handler raises) while it starts leaves nothing
        running: the start runs on a thread of its own, which undoes what it built before this re-raises.

        Raises:
            FileNotFoundError: the root is not a directory.
            KeyError: a live owner attached before the start (:meth:`attach_live_owner`) names no local profile of
                the root (``attach_live_owner: no local profile named 'bobb' under …``): nothing is left running,
                and the gateway can be started again once that owner is detached (:meth:`detach_live_owner`).
            RuntimeError: already started; or called in a fork of the process that started it.
            ValueError: a bad ``bot_mode.transport``, or the Redis transport without a valid connection id.
            HostileFileError: a relay directory the start cannot put back (``bot_relay/`` itself a symlink or a
                file, another user's directory, a swapped ``hubclaims/``), or, in durable mode, a swapped
                ``journal/`` or a journal file in it that may hold acked DMs and cannot be read safely (a symlink,
                another user's file); the text names it and says what to do, and nothing was changed.
            TransportError: the Redis transport cannot be used: credentials refused, another live
                process serves the connection id, or the ``[redis]`` extra is missing (nothing is left running).
        """
        self._process.refuse_in_fork()
        self._start_run.wait_done()  # a start abandoned by a second Ctrl-C may still be undoing what it built
        run = self._start_run = StartRun()
        try:
            with self._lifecycle.lock:
                self._lifecycle.check_startable(self.root)
                subscribers, owners = self._registrations.begin_start()
                try:
                    run.run(lambda started: self._start_locked(started, subscribers, owners), name="gateway-start")
                finally:
                    self._registrations.end_start()
            assert self._system is not None
            logger.info("gateway started on {} ({} profiles)", self.root, self._system.profile_count)
            if self._failure.failed:  # it failed while this start held the lifecycle lock
                self._failure.report_once()
        except BaseException:
            if run.committed:  # interrupted once started (as start() returned): it leaves nothing running either
                self.stop()
            raise
        return self

    def _start_locked(self, run: StartRun, subscribers: dict[int, SubscriberEntry], owners: dict[str, Any]) -> None:
        """The body of :meth:`start` on the start's own thread (the caller holds the lifecycle lock), with the
        subscribers and owners given before it; what it built is undone when it fails or the caller gave up."""
        self.config = cfg = load_config(self.root, self.overrides)
        # ValueError/TransportError before anything started; Redis may take the id from the config
        redis_settings, self.connection_id = redis_settings_for(cfg, self.connection_id)
        options = SystemOptions(self.root, self.overrides, self.connection_id, self.workers,
                                self.cross_process_lock, self.peer_transport, self.durable, self.fsync,
                                self.drive_rooms, self.host_stopping)
        system = ActorSystem(options, runner=self.runner)
        try:
            system.start(cfg, redis_settings, subscribers=subscribers, owners=owners,
                         on_failing=self._failure.failing, on_failure=self._failure.failed_with)
            self._system = system
            self.recovered = system.recovered
            # what the start moved into quarantine instead of adopting (a FIFO in place of a journal file)
            self._outcomes.set_aside = list(system.journal.set_aside) if system.journal is not None else []
            if self.serve_submit:  # last: a DM submitted from now on finds every actor up
                from hermes_actors.hermes.host import open_submit_endpoint

                self._submit = open_submit_endpoint(self)  # it refuses DMs until the commit below
        except BaseException:
            self._undo_start(system)  # a half-started gateway leaves no actor or thread behind
            raise
        finally:
            self.runner = system.runner  # the real Hermes, when chosen now
        if not run.commit(lambda: self._commit_start(subscribers, owners)):
            self._undo_start(system)  # the caller was interrupted (Ctrl-C): it re-raises once this is done

    def _commit_start(self, subscribers: dict[int, SubscriberEntry], owners: dict[str, Any]) -> None:
        """The start's last step: the gateway runs (nothing here can fail)."""
        self._registrations.taken(subscribers, owners)  # by the system (kept for a later start() that failed)
        self._process.claim()
        self._lifecycle.state = "running"
        self.started_at = time.time()
        stop_at_exit(self)  # a script that ends without stop() still exits (a warning says so)

    def _undo_start(self, system: ActorSystem) -> None:
        """Stop what a start that failed (or was abandoned) built; the gateway stays new."""
        if self._submit is not None:
            self._submit.close()
            self._submit = None
        system.teardown()
        self._system = None

    def _is_new(self) -> bool:
        """Whether the gateway never started nor stopped (what is registered now waits for the start)."""
        return self._lifecycle.state == "new"

    @_off_main_thread_last
    def stop(
        self,
        timeout: float = 30,
        *,
        abandon: threading.Event | None = None,
        on_wait: Callable[[int, float], Any] | None = None,
        on_cut_off: Callable[[], Any] | None = None,
    ) -> None:
        """Stop accepting, let running turns finish within ``timeout``, stop every actor.

        Queued deliveries that never ran get a ``cancelled`` outcome (except those kept for
        the next start: a durable gateway's journaled DMs, and relayed-in DMs, whose envelope
        goes back to the relay unanswered); a turn still
        running after ``timeout`` (or once ``abandon`` is set) is ``ambiguous``
        (journaled), and the runner's ``stop_turns`` (if it has one) ends its
        process group. Subscriber callbacks are flushed before this returns (within ``timeout``:
        a callback still running then does not hold the stop; the notifications queued behind
        it follow once it returns). Idempotent.

        Args:
            timeout: seconds running turns get to finish; stop returns as soon as they have.
            abandon: set it (a second Ctrl-C) to stop waiting for running turns at once: a ``threading.Event``,
                or any object with an ``is_set()`` method (the stop only asks it that); None: never abandoned.
            on_wait: called once with (running turns, ``timeout``) before waiting for them.
            on_cut_off: called once when that wait ends with turns still running (``timeout`` ran out, or
                ``abandon`` was set): they are reported ``ambiguous``.

        ``on_wait`` and ``on_cut_off`` never leave the stop half-done: their errors are logged, and a
        ``KeyboardInterrupt`` or ``SystemExit`` one raises is raised once the stop is done (the running turns
        ended, every DM settled). Nor do the runner's ``stop_waiting`` and ``stop_turns``: runner code, as its
        other hooks, so whatever they raise, ``KeyboardInterrupt`` and ``SystemExit`` included, is logged and
        never raised.

        Raises:
            RuntimeError: called from inside one of this gateway's turns (its runner's or a live owner's): the stop
                would wait for that very turn. Stop it from another thread. Or called in a fork of the
                process that started it (nothing is stopped: the gateway runs in the parent).
            TypeError: ``timeout`` is not a number of seconds, ``abandon`` is neither None nor an object with
                ``is_set()`` (a bool: pass an Event and set it), or ``on_wait`` or ``on_cut_off`` is neither None nor
                callable (nothing is stopped).
            ValueError: ``timeout`` is NaN (nothing is stopped).
            KeyboardInterrupt: raised by ``on_wait`` or ``on_cut_off`` (after the stop); ``SystemExit`` likewise.
        """
        self._process.refuse_in_fork()
        timeout = wait_seconds("stop", timeout)
        abandon = checked_abandon(abandon)
        on_wait = checked_callable("stop on_wait", on_wait, "a callable taking (running turns, timeout), or None")
        on_cut_off = checked_callable("stop on_cut_off", on_cut_off, "a callable taking no arguments, or None")
        refuse_stop_in_own_turn(self._system)
        if not self._lifecycle.begin_stop():  # not running, or another thread stopped it
            return
        forget_at_exit(self)
        assert self._system is not None
        if self._submit is not None:  # first: a DM submitted while stopping would only be cancelled
            self._submit.stop_accepting()
        self._sends.await_all(ASK_TIMEOUT)
        try:
            stopped = self._system.shut_down(timeout, abandon=abandon, on_wait=on_wait, on_cut_off=on_cut_off)
            self._outcomes.keep(stopped.final, replace=True)  # a failed Dispatcher handed its own over
        finally:
            if self._submit is not None:  # the root's host until its turns are done (``send`` waits for that)
                self._submit.close()
            self._lifecycle.stopped()
            self._outcomes.end()  # the waits on the stopped Dispatcher answer from its outcomes or the files
            self._lifecycle.stop_done()
        logger.info("gateway stopped")
        if stopped.interrupt is not None:  # a callback's Ctrl-C or sys.exit: raised now the stop is done
            raise stopped.interrupt

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True between start() and the beginning of stop(), unless the gateway failed (see ``on_failure``);
        False in a fork of the process that started it (its actors run in the parent only)."""
        return self._lifecycle.state == "running" and not self._failure.failed and self._process.here()

    def _live(self) -> ActorSystem:
        self._process.refuse_in_fork()
        if self._failure.failed:
            raise RuntimeError(f"gateway is not running: its dispatcher failed ({self._failure.error!r}); "
                               "stop it and start it again")
        if self._lifecycle.state != "running" or self._system is None:
            raise RuntimeError("gateway is not running")
        return self._system

    def _notifier(self) -> Notifier | None:
        return self._system.notifier if self._system is not None else None

    @property
    def _journal(self) -> Journal | None:
        return self._system.journal if self._system is not None else None

    @property
    def _bridge(self) -> FsBridge | None:
        return self._system.bridge if self._system is not None else None

    # ── the API ─────────────────────────────────────────────────────────────

    @_off_main_thread
    def message_agent(
        self, *, sender: str, target: str, message: str, session: str = BOT_CHAT_SESSION, hop: int = 0
    ) -> dict[str, Any]:
        """Send a DM as ``sender``; returns the tool's ack or refusal dict at once (it never waits for the turn).

        Args:
            sender: the sending local profile: its folder id or handle (``hermes`` is ``default``; any case, spaces
                around it and a leading ``@`` are ignored). One that is not a string, or holds a control
                character or line break, is refused.
            target: who receives it, as the tool takes it (docs/protocol.md): a local profile's folder id, handle
                or friendly name, ``peer`` or ``peer/agent``, ``handle@connection``. One that is not a string is
                refused, never ``str()``-ed.
            message: the text, at most 16,000 characters once stripped (one that is not a string is refused).
            session: the title of the session it is sent from: only ``"Bot Chat"`` may send (the tool's gate).
            hop: the DM's depth in its conversation for the guard (0 and 1: a first DM; a DM sent from inside
                the turn of a hop-N delivery is hop N+1).

        Returns:
            The ack, ``{"status": "queued", "delivery_id", "to", "reply_delivery": "notification", "detail",
            "queued_at"}`` (in durable mode the DM is journaled before it returns; its outcome comes through
            :meth:`wait_outcome` and :meth:`subscribe`), or a refusal, ``{"error", "reason"}`` with ``teammates``
            and ``peers`` where the roster helps: nothing was queued (docs/protocol.md lists them).

        Raises:
            RuntimeError: the gateway is not running (before start, or once stop began), or this is a
                fork of the process that started it, or this thread is inside ``message_agent`` already
                (a finalizer, ``__del__``, that ran during it calls again: nothing is sent; a signal handler's
                call, on the main thread, queues behind the call it interrupted instead).
            TimeoutError: the Dispatcher did not answer within 30 s (``actors.AskTimeout``): the DM may still be
                queued (the request waits in the Dispatcher's mailbox), so it is not to be resent.
            TypeError: ``hop`` is not a whole number (an int, ``numpy.int64``, a whole float such as ``0.0``; never
                a bool).
            ValueError: ``hop`` is negative.
        """
        hop = checked_hop(hop)
        call = self._sends.begin()  # before the state check: stop() sees this call, or this call sees the stop
        try:
            return self._live().send(SendRequest(sender, target, message, hop=hop, session=session))
        except ActorGone as exc:
            raise RuntimeError("gateway is not running") from exc
        finally:
            self._sends.end(call)

    @_off_main_thread
    def wait_outcome(self, delivery_id: str, timeout: float = 30) -> dict[str, Any]:
        """The outcome dict of ``delivery_id``, waiting at most ``timeout`` seconds (plus at most
        ``CHECK_GRACE``, 2 s, for a Dispatcher too busy to say at once where the DM stands).

        The outcomes of at least the last 100,000 settled deliveries are kept in memory, for this
        gateway's life; across restarts (durable mode), at least the last 10,000 delivered ones, which
        the root's journal carries from one start to the next (relayed-in DMs' outcomes, kept for a retry
        of their envelope, have a bound of their own and push none of these out).

        Before ``start`` and after ``stop`` it answers from the root's journal and relay files.

        Args:
            delivery_id: the ``delivery_id`` of an ack.
            timeout: seconds to wait at most (0: say where the DM stands without waiting).

        Returns:
            The outcome dict: ``delivery_id``, ``status`` (``replied``, ``failed``, ``silent`` or ``ambiguous``),
            ``reply``, ``error``, ``reason``, ``retryable``, ``from`` and ``text``, every key always present
            (``""`` when it does not apply).

        Raises:
            TimeoutError: no outcome arrived in time (or, while the gateway does not run, the
                root's files hold the DM without an outcome yet).
            KeyError: the id is unknown: never acked on this root, or its outcome is older than the ones
                kept (above); a journal file of the root that was not read (refused, or moved into quarantine
                by the start) is named. Or it is not a delivery id (32 lowercase hex characters), whatever its
                type (``None``, ``["x"]``...): "... (not a delivery id)".
            RuntimeError: called in a fork of the process that started the gateway.
            TypeError: ``timeout`` is not a number of seconds.
            ValueError: ``timeout`` is NaN.
        """
        self._process.refuse_in_fork()
        timeout = wait_seconds("wait_outcome", timeout)  # 0: where the DM stands, without waiting
        return self._outcomes.answer(delivery_id, timeout, self._settling_dispatcher, root=self.root,
                                     stopped=lambda: self._lifecycle.state == "stopped")

    def _settling_dispatcher(self) -> pykka.ActorRef[Any] | None:
        """The Dispatcher while it settles DMs: running, or stopping (it settles the turns the stop waits for)."""
        if self._lifecycle.state not in ("running", "stopping") or self._system is None:
            return None
        return self._system.dispatcher

    @_off_main_thread
    def subscribe(
        self, callback: Callable[[dict[str, Any]], Any], *, details: bool = False, rooms: bool = True
    ) -> Callable[[], None]:
        """Call ``callback(outcome)`` for every later outcome, in order, on this subscription's own thread.

        That thread (its NotifierActor's) is a daemon thread: a callback that never returns holds up
        neither the other subscribers nor, after ``stop()``, the process's exit.

        A callback that raises (even ``SystemExit``) is logged and counted in
        ``stats()["subscriber_errors"]``; it stays subscribed and no actor stops.

        Args:
            callback: called with a copy of each outcome dict.
            details: also put ``sender`` and ``target`` (handles) and ``latency_seconds`` (acceptance
                to outcome, None when unknown) in the dicts this callback receives (for metrics and logs).
            rooms: also call it with the group rooms' events (``kind: "room"``, docs/rooms.md; no
                ``delivery_id``/``status``): the default, as the rooms' issue asks. ``rooms=False`` gives
                a callback DM outcomes only. Each outcome dict carries ``kind: "dm"`` besides the
                outcome's keys, so a callback tells the two apart by ``kind``.

        Returns:
            A function that unsubscribes.

        Raises:
            TypeError: ``callback`` is not callable.
            RuntimeError: the gateway is stopping or stopped, or this is a fork of the process that started it.
        """
        self._process.refuse_in_fork()
        if not callable(callback):
            raise TypeError(f"subscribe needs a callable, got {type(callback).__name__}")
        if self._lifecycle.state in ("stopping", "stopped"):
            raise RuntimeError("gateway is not running; subscribe before start() or while it runs")
        return self._registrations.subscribe((callback, details, rooms), self._is_new, self._notifier)

    @_off_main_thread
    def roster(self) -> list[dict[str, Any]]:
        """Every agent this gateway can reach: local profiles, then relay agents.

        Returns:
            One dict per agent: ``profile``, ``handle``, ``display_name``, ``title``, ``description``,
            ``connection_id`` (None when local) and ``online`` (True / False / None = unknown; local rows are
            True; a remote agent's ``display_name`` is its title, else its handle).

        Raises:
            RuntimeError: the gateway is not running (``gateway is not running``: before ``start()``, from
                ``stop()`` on, or once its dispatcher failed), or this is a fork of the process that started it.
        """
        return self._live().roster_rows()

    @_off_main_thread
    def housekeep(self) -> int:
        """Sweep stale relay artifacts (> 6 h) and orphaned DM files now, as the relay's hourly housekeeping does.

        Returns:
            How many were removed.

        Raises:
            RuntimeError: the gateway is not running (``gateway is not running``: before ``start()``, from
                ``stop()`` on, or once its dispatcher failed), or this is a fork of the process that started it.
        """
        return self._live().housekeep()

    @_off_main_thread
    def stats(self) -> dict[str, Any]:
        """Counters of the running gateway, each from the actor that owns it (an ask: it answers once
        every message that actor received before has been handled).

        Returns:
            accepted, refused (every refusal answered to a sender, counted once; ``refused_by_reason``:
            ``{reason: count}``), settled, pending, active_profiles, profile_starts, and the sender wake-ups:
            wakes_sent (created, one per DM), wakes_retried (attempts made again after one whose turn never
            began) and wakes_failed (given up) (the Dispatcher);
            notified, notify_skipped (shed behind a slow subscriber) and subscriber_errors (callbacks
            that raised) (summed over the subscribers); worker_threads; timers (entries in the timer heap,
            cancelled ones not yet compacted included); journal_fsyncs and journal_records when
            durable; and with a relay (file or Redis): relay_alive, and while it is alive ``relay``,
            its counters (sent, replies, expired, timeouts, drained, quarantined, waiting, ...);
            ``deliveries``: the oldest 200 in flight, in-flight counts per profile, the profiles with a
            live owner and the settled DMs by status and reason (what ``hermes-actors status`` shows).

        Raises:
            RuntimeError: the gateway is not running (or this is a fork of the process that started it).
        """
        return self._live().stats()

    @_off_main_thread
    def attach_live_owner(self, profile: str, owner: Any) -> None:
        """Hand this profile's DMs to a live Bot Chat owner instead of running turns (docs/architecture.md,
        "Live-owner handoff").

        Args:
            profile: the local profile (folder id or handle).
            owner: the open Bot Chat session: an object with ``run_turn(turn) -> str``
                or a callable; it receives each DM as a normal user turn and must
                serialize it with its own turns. Raising ``TurnFailed`` fails the DM;
                any other exception means it died mid-turn (``ambiguous``).

        May be called before ``start()``: the owner is then attached before the journal
        of a previous run is recovered, so recovered DMs go to it too.

        Raises:
            KeyError: no such local profile (from ``start()`` for an owner attached before it).
            TypeError: ``owner`` is neither a runner nor a callable.
            RuntimeError: the gateway stopped, or this is a fork of the process that started it.
        """
        self._process.refuse_in_fork()
        as_runner(owner, "owner")
        if self._registrations.attach_owner(profile, owner, self._is_new):
            return  # attached before start(): recovered DMs already go to it
        self._live().attach_owner(profile, owner)

    @_off_main_thread
    def detach_live_owner(self, profile: str) -> None:
        """Return this profile's DMs (those not handed over yet) to the normal turn path.

        Args:
            profile: the local profile (folder id or handle, any case, as ``attach_live_owner`` takes it).

        Before ``start()`` it forgets the owner attached before the start under that profile, however its name
        was spelt. The name is not checked then (the start reads the root's profiles): one no owner was attached
        under does nothing, and raises nothing.

        Raises:
            KeyError: no such local profile (while the gateway runs).
            RuntimeError: the gateway stopped, or this is a fork of the process that started it.
        """
        self._process.refuse_in_fork()
        if self._registrations.detach_owner(profile, self._is_new):
            return
        self._live().detach_owner(profile)

    # ── group rooms (docs/rooms.md): thin delegations to Rooms ──────────────

    def _live_rooms(self) -> Rooms:
        rooms = self._live().rooms
        if rooms is None:
            raise RuntimeError(f"rooms are unavailable: this gateway drives no rooms (drive_rooms=False); the "
                               f"gateway driving the rooms of {self.root} takes room calls")
        return rooms

    def _rooms_on_disk(self) -> RoomsOnDisk | None:
        """The root's room files while the gateway does not run (before start, from the stop on) or drives no
        rooms (``drive_rooms=False``), else None.

        What ``hermes-actors room show|list`` read without a host: nothing starts and no file changes, so
        the reads answer as the running gateway would have as of the files' last write, as ``wait_outcome``
        answers from the journal. A running gateway (one whose dispatcher failed too) answers itself.

        Raises:
            RuntimeError: called in a fork of the process that started the gateway.
        """
        self._process.refuse_in_fork()
        return None if self._lifecycle.state == "running" and self.drive_rooms else RoomsOnDisk(self.root)

    @_off_main_thread
    def create_room(self, name: str, members: list[str]) -> dict[str, Any]:
        """Create a room of 2–6 local bots named ``name`` (unique, case-insensitive; members' turns run in
        ``Group: <name>``) of ``members`` (as ``message_agent`` targets); returns ``{room_id, name, members}``.

        Raises:
            ValueError: a bad name (one shaped like a room id included), a name taken, an unknown member, fewer
                than 2 or more than 6.
            RuntimeError: the gateway is not running (before ``start()``, from ``stop()`` on), another
                gateway drives the root's rooms (another process, or another Gateway of this one: the text says
                which), this one drives none (``drive_rooms=False``), or the room's file could not be written (a
                full disk: the room was not created, nothing of it is kept).
        """
        return self._live_rooms().create(name, members)

    @_off_main_thread
    def room_send(self, room: str, sender: str, text: str) -> dict[str, Any]:
        """Post ``text`` to ``room`` as ``sender`` (``"user"`` or a member); it is on disk before the ack:
        ``{status: "queued", room_id, message_id}``, or a refusal ``{error, reason}`` like ``message_agent``'s.

        Raises:
            RuntimeError: the gateway is not running (before ``start()``, from ``stop()`` on), another gateway
                drives the root's rooms (another process, or another Gateway of this one: the text says which),
                this one drives none (``drive_rooms=False``), or the room's file could not be written (nothing
                was sent).
        """
        return self._live_rooms().send(room, sender, text)

    @_off_main_thread
    def room_transcript(self, room: str) -> list[dict[str, Any]]:
        """The room's messages, oldest first: ``{message_id, author, text, at, round, status}``.

        Before ``start()``, after ``stop()`` and with ``drive_rooms=False`` it reads the root's room files (as
        ``room show`` does).

        Raises:
            KeyError: no such room, or a reference that is one room's id and another's name.
            RuntimeError: another gateway drives the root's rooms while this one runs (another process, or
                another Gateway of this one: the text says which), the room directory is refused, or this is a
                fork of the process that started the gateway.
        """
        on_disk = self._rooms_on_disk()
        if on_disk is not None:
            return on_disk.room_transcript(room)
        return self._live_rooms().transcript(room)

    @_off_main_thread
    def wait_room_idle(self, room: str, timeout: float = 60) -> str:
        """Wait until the room settled (it is no longer ``busy``).

        Args:
            room: the room's id or name.
            timeout: seconds to wait at most.

        Returns:
            The room's state then: ``idle``, ``needs_you`` (a reply asked ``@user``), or ``disbanded`` when it was
            disbanded while this waited (docs/rooms.md).

        Raises:
            TimeoutError: still busy after ``timeout`` seconds.
            KeyError: no such room, or a reference that is one room's id and another's name.
            RoomStopped: the room stopped while this waited (the gateway stopped, or the room's actor
                failed and restarts); a RuntimeError.
            RuntimeError: the gateway is not running (or this is a fork of the process that started it), another
                gateway drives the root's rooms (another process, or another Gateway of this one: the text says
                which), or this one drives none (``drive_rooms=False``).
            TypeError: ``timeout`` is not a number of seconds.
            ValueError: ``timeout`` is NaN.
        """
        return self._live_rooms().wait_idle(room, wait_seconds("wait_room_idle", timeout))

    @_off_main_thread
    def list_rooms(self) -> list[dict[str, Any]]:
        """Every room: ``{room_id, name, members, state, messages, last_activity}`` (docs/rooms.md).

        Before ``start()``, after ``stop()`` and with ``drive_rooms=False`` it reads the root's room files (as
        ``room list`` does).

        Raises:
            RuntimeError: another gateway drives the root's rooms while this one runs (another process, or
                another Gateway of this one: the text says which), the room directory is refused, or this is a
                fork of the process that started the gateway.
        """
        on_disk = self._rooms_on_disk()
        if on_disk is not None:
            return on_disk.list_rooms()
        return self._live_rooms().list()

    @_off_main_thread
    def disband_room(self, room: str) -> dict[str, Any]:
        """Delete the room (its file too); its members' sessions stay.

        Raises:
            KeyError: no such room, or a reference that is one room's id and another's name.
            RuntimeError: the gateway is not running (before ``start()``, from ``stop()`` on: ``hermes-actors
                room disband`` deletes a room without one), another gateway drives the root's rooms (another
                process, or another Gateway of this one: the text says which), or this one drives none
                (``drive_rooms=False``).
        """
        return self._live_rooms().disband(room)

    # ── the Desktop's relay RPC (bot_relay.*): thin delegations to DesktopRpc ──

    def _desktop_rpc(self) -> DesktopRpc:
        desktop = self._live().desktop
        if desktop is None:
            raise RuntimeError("the relay RPC serves the file relay; this gateway runs the Redis transport")
        return desktop

    @_off_main_thread
    def relay_sync_roster(self, rows: Any) -> int:
        """``bot_relay.roster.sync``: store the Desktop's roster of remote agents in ``bot_relay/roster.json``
        (:meth:`DesktopRpc.sync_roster`); the next ``message_agent`` routes by it.

        Args:
            rows: the raw, untrusted ``agents`` list, normalized as the seed does: a row that is not a dict, has
                no profile or connection id, or a name outside the handle grammar is left out (``[]`` empties the
                roster).

        Returns:
            How many rows were kept.

        Raises:
            TypeError: ``rows`` is not a list (None included): nothing is written, the roster stays as it was.
            RuntimeError: the gateway is not running, it runs the Redis transport (the relay RPC serves the file
                relay), or this is a fork of the process that started it.
            HostileFileError: a relay directory is refused (a symlink, another user's).
            StoreError: the file could not be written.
        """
        rows = checked_roster_rows(rows)  # before the gateway is asked: a wrong type is refused in any state
        return self._desktop_rpc().sync_roster(rows)

    @_off_main_thread
    def relay_drain_outbox(self) -> list[dict[str, Any]]:
        """``bot_relay.outbox.drain``: claim (by rename) and return the envelopes waiting in ``bot_relay/outbox/``
        (:meth:`DesktopRpc.drain_outbox`).

        Returns:
            The fresh envelopes (dicts, as on disk); one older than ``bot_mode.envelope_ttl_seconds`` got a
            ``queued_expired`` reply instead.

        Raises:
            RuntimeError: the gateway is not running, it runs the Redis transport (the relay RPC serves the file
                relay), or this is a fork of the process that started it.
        """
        return self._desktop_rpc().drain_outbox()

    @_off_main_thread
    def relay_deliver(self, envelope: dict[str, Any], *, timeout: float = 900) -> dict[str, str]:
        """``bot_relay.deliver``: run a drained envelope on its target profile here and wait for its outcome
        (:meth:`DesktopRpc.deliver`; idempotent by envelope id).

        Args:
            envelope: the envelope as another gateway's drain returned it.
            timeout: seconds to wait for its turn to settle, checked as ``wait_outcome``'s is, before the envelope
                is taken (0 and below do not wait, ``inf`` waits as long as a clock can count).

        Returns:
            The seed's reply fields, ``{"reply", "error", "reason"}``.

        Raises:
            TypeError: ``timeout`` is not a number of seconds (nothing taken).
            ValueError: ``timeout`` is NaN (nothing taken).
            ValidationError: the envelope is malformed (the text names the first bad field).
            TimeoutError: it did not settle within ``timeout``.
            RuntimeError: the gateway is not running, it runs the Redis transport (the relay RPC serves the file
                relay), or this is a fork of the process that started it.
        """
        timeout = wait_seconds("relay_deliver", timeout)
        return self._desktop_rpc().deliver(envelope, timeout=timeout)

    @_off_main_thread
    def relay_reply(self, envelope_id: str, *, reply: str = "", error: str = "", reason: str = "") -> bool:
        """``bot_relay.reply``: write ``bot_relay/replies/<envelope_id>.json`` (:meth:`DesktopRpc.reply`; the first
        reply written wins).

        Args:
            envelope_id: the id of the envelope answered (32 lowercase hex characters).
            reply: the reply text.
            error: the failure text.
            reason: the reason code (empty with an ``error``: classified from it, as the seed does).

        Returns:
            True when this reply was stored; False when one was there already.

        Raises:
            ValidationError: ``envelope_id`` is not 32 lowercase hex characters.
            RuntimeError: the gateway is not running, it runs the Redis transport (the relay RPC serves the file
                relay), or this is a fork of the process that started it.
        """
        return self._desktop_rpc().reply(envelope_id, reply=reply, error=error, reason=reason)
