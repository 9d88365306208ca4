"""The embedding facade: ``Gateway`` starts the actors and is the public API.

    with Gateway(root="/path/to/hermes-root") as gw:
        ack = gw.message_agent(sender="alice", target="bob", message="hi")
        out = gw.wait_outcome(ack["delivery_id"], timeout=30)
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import pykka
from loguru import logger

from actors import ActorGone, FsBridge, ask
from hermes_actors.core.config import BotModeConfig, load_config
from hermes_actors.core.names import checked_connection_id
from hermes_actors.local.notifier import in_subscriber_callback
from hermes_actors.local.roster import roster_rows
from hermes_actors.local.runners import TurnRunner, as_runner
from hermes_actors.local.sending import outcome_future, send_dm
from hermes_actors.local.turns import turn_factory_here
from hermes_actors.messages import (
    BOT_CHAT_SESSION,
    AddSubscriber,
    AttachOwner,
    CheckOutcome,
    DetachOwner,
    GetSnapshot,
    Housekeep,
    RemoveSubscriber,
    RosterSnapshot,
    SendRequest,
)
from hermes_actors.relay.desktop_rpc import DesktopRpc
from hermes_actors.rooms import Rooms
from hermes_actors.store.hermes_root import root_path
from hermes_actors.store.journal import Journal
from hermes_actors.system import ActorSystem
from hermes_actors.system_options import ASK_TIMEOUT as _ASK_TIMEOUT
from hermes_actors.system_options import SystemOptions, explicit_runner, redis_settings_for
from hermes_actors.transports.peer_cli import PeerCliTransport

__all__ = ["Gateway"]

# A failing Dispatcher waits at most this long for the message_agent calls already past their check
# (a first-hop DM's tell takes µs; a call asking the Dispatcher itself cannot finish and is not waited for longer).
_FAILING_SENDS_WAIT = 0.5
_MAX_WAIT = 10_000_000.0  # ~115 days: longer waits overflow the clocks underneath (threading.TIMEOUT_MAX and time_t)


class _Stopped(Exception):
    """Set on a ``wait_outcome`` future when the gateway stopped while it waited (never leaves the Gateway)."""


def _seconds(what: str, timeout: Any) -> float:
    """``timeout`` of ``what`` (``"stop"``, ``"wait_outcome"``…) as seconds to wait: 0 and below do not wait,
    ``inf`` waits as long as a clock can count.

    Raises:
        TypeError: not a number (a bool, None, a string...).
        ValueError: NaN.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"{what} timeout must be a number of seconds, not {type(timeout).__name__} "
                        f"({timeout!r}); 0 does not wait")
    if timeout != timeout:
        raise ValueError(f"{what} timeout is NaN; pass a number of seconds (0: do not wait)")
    return float(min(max(timeout, 0.0), _MAX_WAIT))


class Gateway:
    """One gateway process's Bot Mode messaging.

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
        workers: the turn worker thread cap.
        cross_process_lock: hold ``bot_relay/locks/<profile>.lock`` for each turn.
        peer_transport: how ``bot_peers`` targets are reached (default: the CLI).
        durable: journal every local delivery before acking it (group commit) and
            recover on the next start; False trades that for speed.
        fsync: with ``durable``, fsync each group commit (False only for tests of speed).
        serve_submit: serve the root's local submit endpoint (``bot_relay/run/submit.sock``)
            while running, so bots' ``hermes`` processes and ``hermes-actors send`` reach
            this host (:mod:`hermes_actors.hermes.submit`).
        on_failure: called once with the error if the gateway's Dispatcher fails (a bug:
            an error escaped one of its handlers). From then on the gateway is not
            ``running``: ``message_agent`` raises ``RuntimeError`` (the tool refuses with
            ``runtime_offline``) and every DM acked from memory only has its outcome; call
            :meth:`stop`, then start a new Gateway on the root (a durable gateway's journaled
            DMs are re-offered). Runs on the failed actor's thread: hand the restart to
            another thread. ``hermes-actors serve`` and the hermes gateway's host restart
            on their own.

    Raises:
        TypeError: ``root`` is not a str or path, or ``config`` is not a dict.
        ValueError: ``root`` is empty (``Path("")`` is the current directory, where the
            relay and journal directories would be created by accident), or
            ``connection_id`` is not 1-64 letters, digits, ``_`` or ``-``.
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
        on_failure: Callable[[BaseException | None], Any] | None = None,
    ) -> None:
        if not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"Gateway root must be the Hermes root directory (a str or path), "
                            f"not {type(root).__name__} ({root!r})")
        if config is not None and not isinstance(config, Mapping):
            raise TypeError(f"Gateway config must be a dict shaped like config.yaml (e.g. "
                            f"{{'bot_mode': {{...}}}}), not {type(config).__name__}")
        if not str(root).strip():
            raise ValueError(
                f"Hermes root is empty ({str(root)!r}): pass the Hermes root directory "
                "(the default profile's home, e.g. ~/.hermes), not the current directory by accident"
            )
        self.root = root_path(root)
        self.runner: TurnRunner | None = explicit_runner(runner)  # None: the real Hermes, chosen at start()
        self.overrides = dict(config or {})
        # "" is "not given" (Redis then takes bot_mode.connection_id), as None
        self.connection_id = checked_connection_id(connection_id) if connection_id else None
        self.workers = workers
        self.cross_process_lock = cross_process_lock
        self.peer_transport = peer_transport
        self.durable = durable
        self.fsync = fsync
        self.serve_submit = serve_submit
        self._submit: Any = None  # the submit endpoint while serve_submit runs
        self.recovered: dict[str, int] = {}
        self.config: BotModeConfig | None = None
        self._state = "new"  # new → running → stopping → stopped
        self.started_at: float | None = None  # time.time() once start() finished (``status`` shows the uptime)
        self._state_lock = threading.Lock()  # guards the lifecycle only, never message traffic
        # message_agent calls in flight: stop() waits for them, so no DM is acked after the stop began and then
        # lost behind it. A set (add/discard are atomic) and no lock: the senders never contend on the hot path.
        self._sending: set[object] = set()
        self._tokens = itertools.count(1)
        # Subscribers and live owners given before start(), and whether a start is under way (then a
        # registration from another thread waits for it, rather than land in a dict start() already read).
        self._early = threading.Condition()
        self._early_subscribers: dict[int, tuple[Callable[[dict[str, Any]], Any], bool, bool]] = {}
        self._early_owners: dict[str, Any] = {}
        self._starting: int | None = None  # the thread id of a start() under way
        self._stopped = threading.Event()  # set once a stop() has finished (a second stop() waits for it)
        self._stopping_thread: int | None = None  # the thread id of the stop() under way
        self._final_outcomes: dict[str, dict[str, Any]] = {}
        # wait_outcome calls waiting on the Dispatcher (future → delivery id): answered at stop, so none sits
        # out its timeout on a Dispatcher that will never answer (a journaled DM is settled by the next start)
        self._waits: dict[pykka.ThreadingFuture[dict[str, Any]], str] = {}
        self._waits_lock = threading.Lock()
        self._system: ActorSystem | None = None  # the actors and threads while started
        self._on_failure = on_failure
        # Set (once) from the failed Dispatcher's thread; never under _state_lock, which start() holds
        # while it waits for that very actor.
        self._failure: BaseException | None = None
        self._failed = False
        self._failure_lock = threading.Lock()
        self._failure_reported = False

    # ── lifetime ────────────────────────────────────────────────────────────

    def start(self) -> Gateway:
        """Start every actor. Returns self.

        Raises:
            FileNotFoundError: the root is not a directory.
            RuntimeError: already started.
            ValueError: a bad ``bot_mode.transport``, or the Redis transport without a valid connection id.
            TransportError: the Redis transport cannot be used: credentials refused, another live
                process serves the connection id, or the ``[redis]`` extra is missing (nothing is left running).
        """
        with self._state_lock:
            if self._state != "new":
                raise RuntimeError(f"gateway already {self._state}; create a new Gateway to start again")
            if not self.root.is_dir():
                raise FileNotFoundError(f"Hermes root {str(self.root)!r} does not exist or is not a directory")
            with self._early:
                self._starting = threading.get_ident()
                subscribers, owners = dict(self._early_subscribers), dict(self._early_owners)
            try:
                self._start_locked(subscribers, owners)
            finally:
                with self._early:
                    self._starting = None
                    self._early.notify_all()
        assert self._system is not None
        logger.info("gateway started on {} ({} profiles)", self.root, self._system.profile_count)
        if self._failed:  # it failed while this start held the lifecycle lock
            self._report_failure()
        return self

    def _start_locked(self, subscribers: dict[int, tuple[Callable[[dict[str, Any]], Any], bool, bool]],
                      owners: dict[str, Any]) -> None:
        """The body of :meth:`start` (under the lifecycle lock), with the subscribers and owners given before it."""
        self.config = cfg = load_config(self.root, self.overrides)
        # ValueError/TransportError before anything started; Redis may take the id from the config
        redis_settings, self.connection_id = redis_settings_for(cfg, self.connection_id)
        options = SystemOptions(self.root, self.overrides, self.connection_id, self.workers,
                                self.cross_process_lock, self.peer_transport, self.durable, self.fsync)
        system = ActorSystem(options, runner=self.runner)
        try:
            system.start(cfg, redis_settings, subscribers=subscribers, owners=owners,
                         on_failing=self._dispatcher_failing, on_failure=self._dispatcher_failed)
        except BaseException:
            system.teardown()  # a half-started gateway leaves no actor or thread behind
            raise
        finally:
            self.runner = system.runner  # the real Hermes, when chosen now
        self._system = system
        self.recovered = system.recovered
        if self.serve_submit:  # last: a DM submitted from now on finds every actor up
            from hermes_actors.hermes.host import open_submit_endpoint

            try:
                self._submit = open_submit_endpoint(self)
            except BaseException:
                system.teardown()
                raise
        with self._early:  # taken by the system (kept for a later start() when this one failed)
            for token in subscribers:
                self._early_subscribers.pop(token, None)
            for profile in owners:
                self._early_owners.pop(profile, None)
        self._state = "running"
        self.started_at = time.time()

    def _before_start(self, register: Callable[[], None]) -> bool:
        """Run ``register`` (under the lock of the early registrations) if the gateway has not started.

        A start() under way on another thread has already read what was registered: wait for it
        to end first (then the gateway runs, or it failed and is still new).

        Returns:
            True when ``register`` ran; False when the gateway has started (or stopped).
        """
        with self._early:
            while self._starting is not None and self._starting != threading.get_ident():
                self._early.wait()
            if self._state == "new" and self._starting is None:
                register()
                return True
            return False

    def stop(
        self,
        timeout: float = 30,
        *,
        abandon: threading.Event | None = None,
        on_wait: Callable[[int, float], Any] | None = None,
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
            abandon: set it (a second Ctrl-C) to stop waiting for running turns at once.
            on_wait: called once with (running turns, ``timeout``) before waiting for them.

        Raises:
            RuntimeError: called from inside one of this gateway's turns (its runner): the stop
                would wait for that very turn. Stop it from another thread.
            TypeError: ``timeout`` is not a number of seconds (nothing is stopped).
            ValueError: ``timeout`` is NaN (nothing is stopped).
        """
        timeout = _seconds("stop", timeout)
        system = self._system
        if system is not None and system.turn_factory is not None and turn_factory_here() == system.turn_factory:
            raise RuntimeError(
                "Gateway.stop() was called from inside one of its own turns: it would wait for that very "
                "turn; stop it from another thread (e.g. threading.Thread(target=gateway.stop).start())"
            )
        with self._state_lock:
            if self._state == "new":
                self._state = "stopped"
                self._stopped.set()
            state = self._state
            if state == "running":
                self._state = "stopping"
                self._stopping_thread = threading.get_ident()
        if state == "stopping" and not in_subscriber_callback() and self._stopping_thread != threading.get_ident():
            # another thread stops it: return once that stop is done, as it will (neither a subscriber callback,
            # whose flush that stop waits for, nor that stop's own thread, from its on_wait, waits for it)
            self._stopped.wait()
        if state != "running":
            return
        assert self._system is not None
        if self._submit is not None:  # first: a DM submitted while stopping would only be cancelled
            self._submit.stop_accepting()
        self._await_sends(_ASK_TIMEOUT)
        try:
            final = self._system.shut_down(timeout, abandon=abandon, on_wait=on_wait)
            self._final_outcomes = {**self._final_outcomes, **final}  # a failed Dispatcher handed its own over
        finally:
            if self._submit is not None:  # the root's host until its turns are done (``send`` waits for that)
                self._submit.close()
            with self._state_lock:
                self._state = "stopped"
            self._end_waits()
            self._stopped.set()
        logger.info("gateway stopped")

    def _end_waits(self) -> None:
        """Wake every ``wait_outcome`` still waiting on the stopped Dispatcher: it answers from the final outcomes
        or the root's files instead (see :meth:`wait_outcome`)."""
        with self._waits_lock:
            waits, self._waits = self._waits, {}
        for future in waits:
            with contextlib.suppress(Exception):  # already answered by the Dispatcher: that answer stands
                future.set_exception(exc_info=(_Stopped, _Stopped(), None))

    def _dispatcher_failing(self, error: BaseException) -> None:
        """The Dispatcher is failing (called on its thread): no more acks; the DMs acked so far reach it.

        A sender past its check still tells its DM; waiting for those calls here (µs each, bounded)
        puts their DMs in the mailbox the failed Dispatcher settles, instead of after its stop.
        """
        self._failure = error
        self._failed = True
        self._await_sends(_FAILING_SENDS_WAIT)

    def _dispatcher_failed(self, error: BaseException | None, final: dict[str, dict[str, Any]]) -> None:
        """The Dispatcher failed (called on its thread): refuse DMs from now on, keep its outcomes, say so."""
        self._final_outcomes = {**final, **self._final_outcomes}
        self._failure = error
        self._failed = True  # already, unless the failing hook itself failed
        if self._state == "running":  # else it failed while starting (start() reports it) or stopping
            self._report_failure()

    def _report_failure(self) -> None:
        """Log the failure and call ``on_failure``, once (from the failed actor, or from ``start()``)."""
        with self._failure_lock:
            if self._failure_reported:
                return
            self._failure_reported = True
        error = self._failure
        logger.error("the gateway on {} failed: its Dispatcher stopped ({!r}); it refuses every DM until it is "
                     "stopped and started again (journaled DMs are re-offered then)", self.root, error)
        if self._on_failure is not None:
            try:
                self._on_failure(error)
            except Exception:
                logger.exception("the gateway's on_failure callback failed")

    def _await_sends(self, timeout: float) -> None:
        """Let the ``message_agent`` calls that began before the stop hand their DM over (a few µs each).

        Their DMs are then accepted before the Dispatcher stops accepting, so each one gets its
        outcome (``cancelled`` if it never ran) instead of an ack followed by nothing. Only a call
        that waits for a stalled journal commit takes longer; ``timeout`` bounds that wait.
        """
        deadline = time.monotonic() + timeout
        delay = 0.0001
        while self._sending:  # no event to wait on: the senders take no lock, by design (see __init__)
            if time.monotonic() >= deadline:
                logger.warning("{} message_agent call(s) still in flight after {:g}s", len(self._sending), timeout)
                return
            time.sleep(delay)
            delay = min(delay * 2, 0.02)

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True between start() and the beginning of stop(), unless the gateway failed (see ``on_failure``)."""
        return self._state == "running" and not self._failed

    def _live_dispatcher(self) -> pykka.ActorRef[Any]:
        dispatcher = self._live().dispatcher
        assert dispatcher is not None
        return dispatcher

    def _live(self) -> ActorSystem:
        if self._failed:
            raise RuntimeError(f"gateway is not running: its dispatcher failed ({self._failure!r}); "
                               "stop it and start it again")
        if self._state != "running" or self._system is None:
            raise RuntimeError("gateway is not running")
        return self._system

    def _notifier(self) -> pykka.ActorRef[Any] | None:
        return self._system.notifier if self._system is not None else None

    @property
    def _journal(self) -> Journal | None:
        return self._system.journal if self._system is not None else None

    @property
    def _bridge(self) -> FsBridge | None:
        return self._system.bridge if self._system is not None else None

    # ── the API ─────────────────────────────────────────────────────────────

    def message_agent(
        self, *, sender: str, target: str, message: str, session: str = BOT_CHAT_SESSION, hop: int = 0
    ) -> dict[str, Any]:
        """Send a DM as ``sender``; returns the tool's ack or refusal dict at once.

        ``hop`` is the DM's depth in its conversation for the guard (0 and 1: a first DM;
        a DM sent from inside the turn of a hop-N delivery is hop N+1).

        Raises:
            RuntimeError: the gateway is not running (before start, or once stop began).
            TypeError: ``hop`` is not a whole number.
            ValueError: ``hop`` is negative.
        """
        if isinstance(hop, bool) or not isinstance(hop, int):
            raise TypeError(f"message_agent hop must be a whole number (0 for a first DM), not {type(hop).__name__} "
                            f"({hop!r})")
        if hop < 0:
            raise ValueError(f"message_agent hop must be 0 or more, not {hop}")
        call = object()
        self._sending.add(call)  # before the state check: stop() sees this call, or this call sees the stop
        try:
            system = self._live()
            assert system.dispatcher is not None
            request = SendRequest(sender, target, message, hop=hop, session=session)
            return send_dm(system.dispatcher, request, admission=system.caller_admission,
                           journal=system.journal, timeout=_ASK_TIMEOUT)
        except ActorGone as exc:
            raise RuntimeError("gateway is not running") from exc
        finally:
            self._sending.discard(call)

    def wait_outcome(self, delivery_id: str, timeout: float = 30) -> dict[str, Any]:
        """The outcome dict of ``delivery_id``, waiting at most ``timeout`` seconds.

        The outcomes of at least the last 100,000 settled deliveries are kept in memory (and, in
        durable mode, the last 10,000 across restarts in the journal).

        Before ``start`` and after ``stop`` it answers from the root's journal and relay files.

        Raises:
            TimeoutError: no outcome arrived in time (or, while the gateway does not run, the
                root's files hold the DM without an outcome yet).
            KeyError: this gateway never issued the id (and no journal holds it).
            TypeError: ``timeout`` is not a number of seconds.
            ValueError: ``timeout`` is NaN.
        """
        timeout = _seconds("wait_outcome", timeout)  # 0: where the DM stands, without waiting
        final = self._final_outcomes.get(delivery_id)
        if final is not None:
            return dict(final)
        # While stopping, the Dispatcher still settles the turns the stop waits for: wait on it too.
        if self._state not in ("running", "stopping") or self._system is None or self._system.dispatcher is None:
            return self._outcome_on_file(delivery_id)
        dispatcher = self._system.dispatcher
        try:
            if timeout > 0:
                future = outcome_future(dispatcher, delivery_id)
                with self._waits_lock:
                    self._waits[future] = delivery_id
                if self._state == "stopped":  # stopped while registering: _end_waits may have run before
                    self._end_waits()
                try:
                    return dict(future.get(timeout=timeout))
                except pykka.Timeout:
                    pass
                finally:
                    with self._waits_lock:
                        self._waits.pop(future, None)
            # A poll, or the time ran out: ask where it stands. The told request may not have been
            # handled yet, and an id the Dispatcher never issued is a KeyError all the same.
            record = ask(dispatcher, CheckOutcome(delivery_id), timeout=_ASK_TIMEOUT)
        except (ActorGone, _Stopped):  # stopped since the check above: its outcomes were kept, if it had this one
            final = self._final_outcomes.get(delivery_id)
            if final is not None:
                return dict(final)
            return self._outcome_on_file(delivery_id)
        if record is None:
            raise TimeoutError(f"no outcome for delivery {delivery_id} within {timeout}s")
        return dict(record)

    def _outcome_on_file(self, delivery_id: str) -> dict[str, Any]:
        """``wait_outcome`` while this gateway does not run: what the root's journal and relay files know.

        Raises:
            TimeoutError: the DM is journaled (or on the relay) without an outcome yet: the next
                gateway on the root runs it (or reads its reply).
            KeyError: neither this gateway nor the root's files know the id.
        """
        from hermes_actors.core.ids import is_delivery_id
        from hermes_actors.ops.journal_view import find_outcome

        if not is_delivery_id(delivery_id):
            raise KeyError(f"unknown delivery id {delivery_id!r} (not a delivery id)")
        found = find_outcome(self.root, delivery_id)
        if found.get("status") == "pending":
            raise TimeoutError(f"no outcome for delivery {delivery_id} yet and the gateway is not running: "
                               f"{found.get('error')}; the next gateway on {self.root} settles it")
        if found.get("status") == "unknown":
            raise KeyError(f"unknown delivery id {delivery_id!r} (the gateway is not running; {found.get('error')})")
        return found

    def subscribe(
        self, callback: Callable[[dict[str, Any]], Any], *, details: bool = False, rooms: bool = True
    ) -> Callable[[], None]:
        """Call ``callback(outcome)`` for every later outcome, on the notifier thread.

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
        """
        if not callable(callback):
            raise TypeError(f"subscribe needs a callable, got {type(callback).__name__}")
        if self._state in ("stopping", "stopped"):
            raise RuntimeError("gateway is not running; subscribe before start() or while it runs")
        token = next(self._tokens)
        if not self._before_start(lambda: self._early_subscribers.__setitem__(token, (callback, details, rooms))):
            notifier = self._notifier()
            if notifier is None:  # stopped meanwhile
                raise RuntimeError("gateway is not running; subscribe before start() or while it runs")
            notifier.tell(AddSubscriber(token, callback, details, rooms))

        def unsubscribe() -> None:
            with self._early:
                self._early_subscribers.pop(token, None)
            current = self._notifier()
            if current is not None:
                with contextlib.suppress(pykka.ActorDeadError):
                    current.tell(RemoveSubscriber(token))

        return unsubscribe

    def roster(self) -> list[dict[str, Any]]:
        """Every agent this gateway can reach: local profiles, then relay agents."""
        roster = self._live().roster
        assert roster is not None
        return roster_rows(ask(roster, GetSnapshot(), timeout=_ASK_TIMEOUT, expect=RosterSnapshot))

    def housekeep(self) -> int:
        """Sweep stale relay artifacts (> 6 h) and orphaned DM files now; returns the count removed."""
        relay = self._live().relay
        assert relay is not None
        removed: int = ask(relay, Housekeep(), timeout=_ASK_TIMEOUT, expect=int)
        return removed

    def stats(self) -> dict[str, Any]:
        """Counters of the running gateway, each from the actor that owns it (an ask: it answers once
        every message that actor received before has been handled).

        Returns:
            accepted, refused, settled, pending, active_profiles, profile_starts (the Dispatcher);
            notified, notify_skipped (shed behind a slow subscriber) and subscriber_errors (callbacks
            that raised) (the notifier); worker_threads; timers (entries in the timer heap,
            cancelled ones not yet compacted included); journal_fsyncs and journal_records when
            durable; and with a relay (file or Redis): relay_alive, and while it is alive ``relay``,
            its counters (sent, replies, expired, timeouts, drained, quarantined, waiting, ...);
            ``deliveries``: the oldest 200 in flight, in-flight counts per profile, the profiles with a
            live owner and the settled DMs by status and reason (what ``hermes-actors status`` shows).

        Raises:
            RuntimeError: the gateway is not running.
        """
        return self._live().stats()

    def attach_live_owner(self, profile: str, owner: Any) -> None:
        """Hand this profile's DMs to a live Bot Chat owner instead of running turns (DESIGN 4.3).

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
        """
        as_runner(owner, "owner")
        if self._before_start(lambda: self._early_owners.__setitem__(profile, owner)):
            return  # attached before start(): recovered DMs already go to it
        ask(self._live_dispatcher(), AttachOwner(profile, owner), timeout=_ASK_TIMEOUT)

    def detach_live_owner(self, profile: str) -> None:
        """Return this profile's DMs (those not handed over yet) to the normal turn path.

        Raises:
            KeyError: no such local profile.
        """
        if self._before_start(lambda: self._early_owners.pop(profile, None)):
            return
        ask(self._live_dispatcher(), DetachOwner(profile), timeout=_ASK_TIMEOUT)

    # ── group rooms (docs/rooms.md): thin delegations to Rooms ──────────────

    def _live_rooms(self) -> Rooms:
        rooms = self._live().rooms
        assert rooms is not None
        return rooms

    def create_room(self, name: str, members: list[str]) -> dict[str, Any]:
        """Create a room of 2–6 local bots named ``name`` (unique, case-insensitive; members' turns run in
        ``Group: <name>``) of ``members`` (as ``message_agent`` targets); returns ``{room_id, name, members}``.

        Raises:
            ValueError: a bad name, a name taken, an unknown member, fewer than 2 or more than 6.
            RuntimeError: the gateway is not running.
        """
        return self._live_rooms().create(name, members)

    def room_send(self, room: str, sender: str, text: str) -> dict[str, Any]:
        """Post ``text`` to ``room`` as ``sender`` (``"user"`` or a member); it is on disk before the ack:
        ``{status: "queued", room_id, message_id}``, or a refusal ``{error, reason}`` like ``message_agent``'s."""
        return self._live_rooms().send(room, sender, text)

    def room_transcript(self, room: str) -> list[dict[str, Any]]:
        """The room's messages, oldest first: ``{message_id, author, text, at, round, status}``. KeyError: no room."""
        return self._live_rooms().transcript(room)

    def wait_room_idle(self, room: str, timeout: float = 60) -> str:
        """Wait until the room settled; returns its state, ``idle`` or ``needs_you``.

        Raises:
            TimeoutError: still busy after ``timeout`` seconds.
            KeyError: no such room.
            RuntimeError: the gateway is not running, or stopped while this waited.
            TypeError: ``timeout`` is not a number of seconds.
            ValueError: ``timeout`` is NaN.
        """
        return self._live_rooms().wait_idle(room, _seconds("wait_room_idle", timeout))

    def list_rooms(self) -> list[dict[str, Any]]:
        """Every room: ``{room_id, name, members, state, messages, last_activity}`` (docs/rooms.md)."""
        return self._live_rooms().list()

    def disband_room(self, room: str) -> dict[str, Any]:
        """Delete the room (its file too); its members' sessions stay. Raises KeyError: no such room."""
        return self._live_rooms().disband(room)

    # ── the Desktop's relay RPC (bot_relay.*): thin delegations to DesktopRpc ──

    def _desktop_rpc(self) -> DesktopRpc:
        desktop = self._live().desktop
        if desktop is None:
            raise RuntimeError("the relay RPC serves the file relay; this gateway runs the Redis transport")
        return desktop

    def relay_sync_roster(self, rows: Any) -> int:
        """``bot_relay.roster.sync``: see :meth:`DesktopRpc.sync_roster`. Raises RuntimeError when not running."""
        return self._desktop_rpc().sync_roster(rows)

    def relay_drain_outbox(self) -> list[dict[str, Any]]:
        """``bot_relay.outbox.drain``: see :meth:`DesktopRpc.drain_outbox`. Raises RuntimeError when not running."""
        return self._desktop_rpc().drain_outbox()

    def relay_deliver(self, envelope: dict[str, Any], *, timeout: float = 900) -> dict[str, str]:
        """``bot_relay.deliver``: see :meth:`DesktopRpc.deliver`. Raises RuntimeError when not running."""
        return self._desktop_rpc().deliver(envelope, timeout=timeout)

    def relay_reply(self, envelope_id: str, *, reply: str = "", error: str = "", reason: str = "") -> bool:
        """``bot_relay.reply``: see :meth:`DesktopRpc.reply`. Raises RuntimeError when not running."""
        return self._desktop_rpc().reply(envelope_id, reply=reply, error=error, reason=reason)
