"""The actors and threads of one running gateway: how they are started, wired and stopped.

:class:`ActorSystem` is what ``Gateway.start`` builds and ``Gateway.stop`` ends:
the journal, the scheduler, the turn worker pool, the Notifier, RosterActor,
DispatcherActor, the relay (file RelayActor with its filesystem bridge and the
Desktop's relay RPC, or the Redis relay holding its connection lease), the
recovery of a previous run and the group rooms.
The Gateway keeps the lifecycle state and the public API.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pykka
from loguru import logger

from actors import ActorGone, AskTimeout, FsBridge, RestartPolicy, Scheduler, WorkerPool, ask
from hermes_actors.core import outcomes
from hermes_actors.core.config import BotModeConfig
from hermes_actors.core.names import profile_key
from hermes_actors.core.targets import PeerRoute
from hermes_actors.core.wake import wake_enabled
from hermes_actors.local.admission import CallerAdmission
from hermes_actors.local.dispatcher import DispatcherActor
from hermes_actors.local.notifier import NotifierActor, NotifierCounts, in_subscriber_callback
from hermes_actors.local.profile_deps import ProfileDeps
from hermes_actors.local.roster import RosterActor
from hermes_actors.local.runners import TurnRunner, as_runner
from hermes_actors.local.shutdown import await_running_turns, end_running_turns
from hermes_actors.local.turns import TurnFactory
from hermes_actors.messages import (
    AddSubscriber,
    AdoptJournal,
    AttachOwner,
    AttachRelay,
    AwaitRestarts,
    Delivery,
    ExportOutcomes,
    FinalizePending,
    Flush,
    GetSnapshot,
    Outcome,
    Recover,
    RelayResumed,
    ResumeRelay,
    RosterChanged,
    RosterSnapshot,
    ShutdownProfiles,
    StatsRequest,
    StopAccepting,
    Subscribe,
)
from hermes_actors.relay.desktop_rpc import DesktopRpc
from hermes_actors.relay.relay_actor import WATCHED_SUBDIRS, RelayActor
from hermes_actors.rooms import Rooms
from hermes_actors.rooms.store import RoomFiles
from hermes_actors.store.journal import Journal
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.transports.peer_cli import PeerCliTransport

__all__ = [
    "ASK_TIMEOUT", "ActorSystem", "SystemOptions", "explicit_runner", "is_real_hermes", "redis_settings_for"
]

ASK_TIMEOUT = 30.0
_RESUME_TIMEOUT = 30.0  # how long start() waits for the relay to resume its in-flight envelopes


def explicit_runner(runner: Any) -> TurnRunner | None:
    """The runner given to ``Gateway(runner=...)``; None stays None (the real Hermes, chosen at start).

    Raises:
        ValueError: an unknown runner name.
        TypeError: neither a runner nor a callable.
    """
    if runner is None:
        return None
    if isinstance(runner, str):
        if runner == "demo":
            from hermes_actors.demo.bots import DemoRunner

            return DemoRunner()
        raise ValueError(f"unknown runner {runner!r}: pass None (the real Hermes), 'demo', a runner or a callable")
    return as_runner(runner)


def is_real_hermes(runner: Any) -> bool:
    """Whether ``runner`` runs turns on the real Hermes (``bot_mode.wake_sender: auto`` wakes senders then)."""
    return getattr(runner, "real_hermes", False) is True


def redis_settings_for(cfg: BotModeConfig, connection_id: str | None) -> tuple[Any, str | None]:
    """The Redis transport's settings when ``bot_mode.transport`` selects it, and the connection id.

    Args:
        cfg: the loaded config.
        connection_id: the one the Gateway was given (None: Redis takes ``bot_mode.connection_id``).

    Returns:
        (settings, connection id); settings None: the file relay (the connection id is unchanged).

    Raises:
        ValueError: a bad transport value, or Redis without a valid connection id.
        TransportError: the ``[redis]`` extra is not installed.
    """
    from hermes_actors.core.names import checked_connection_id
    from hermes_actors.transports.redis.io import require_redis
    from hermes_actors.transports.redis.store import redis_settings, redis_url_from_config

    url = redis_url_from_config(cfg.raw)
    if url is None:
        return None, connection_id
    require_redis()
    connection_id = connection_id or cfg.redis.connection_id or None
    if not connection_id:
        raise ValueError("the Redis transport (bot_mode.transport) needs this gateway's connection id, the name "
                         "of its stream on Redis: pass --connection-id NAME (CLI) or Gateway(..., "
                         "connection_id=NAME), or set bot_mode.connection_id in config.yaml")
    return redis_settings(cfg.raw, url), checked_connection_id(connection_id)


@dataclass(frozen=True)
class SystemOptions:
    """How a gateway's actors are built (the Gateway's constructor arguments, resolved)."""

    root: Path
    overrides: dict[str, Any]
    connection_id: str | None
    workers: int
    cross_process_lock: bool
    peer_transport: PeerCliTransport | None
    durable: bool
    fsync: bool


@dataclass
class ActorSystem:
    """The started pieces of one gateway; each is None until started.

    Build it with :meth:`start`; end it with :meth:`shut_down` (a clean stop) or
    :meth:`teardown` (after a failed start).
    """

    options: SystemOptions
    runner: TurnRunner | None = None
    turn_factory: TurnFactory | None = None
    journal: Journal | None = None
    scheduler: Scheduler | None = None
    pool: WorkerPool | None = None
    notifier: pykka.ActorRef[Any] | None = None
    notifier_counts: NotifierCounts = field(default_factory=NotifierCounts)  # published by the Notifier
    roster: pykka.ActorRef[Any] | None = None
    dispatcher: pykka.ActorRef[Any] | None = None
    relay: pykka.ActorRef[Any] | None = None
    bridge: FsBridge | None = None
    desktop: DesktopRpc | None = None  # the Desktop's relay RPC, served by the file RelayActor
    rooms: Rooms | None = None  # the group rooms (docs/rooms.md)
    caller_admission: CallerAdmission | None = None  # first-hop local DMs admitted on the sender's thread
    profile_count: int = 0
    recovered: dict[str, int] = field(default_factory=dict)
    failed_running: list[str] | None = None  # set when the Dispatcher failed: the turns that may still run

    def start(
        self,
        cfg: BotModeConfig,
        redis_settings: Any,
        *,
        subscribers: dict[int, tuple[Callable[[dict[str, Any]], Any], bool, bool]],
        owners: dict[str, Any],
        on_failing: Callable[[BaseException], None] | None = None,
        on_failure: Callable[[BaseException | None, dict[str, dict[str, Any]]], None] | None = None,
    ) -> None:
        """Start and wire every actor. After an error, call :meth:`teardown` to stop what was started.

        Args:
            cfg: the loaded ``bot_mode`` config.
            redis_settings: from :func:`redis_settings_for` (None: the file relay).
            subscribers: outcome callbacks subscribed before start (token → (callback, details, rooms)).
            owners: live owners attached before start (profile → owner); attached before recovery.
            on_failing: called the moment the Dispatcher fails (see ``DispatcherActor``).
            on_failure: called once it failed, with the error and its settled outcomes; the turns
                that may still run are kept for :meth:`shut_down`, which ends them.

        Raises:
            KeyError: an owner names no local profile.
            TransportError: another live process serves the Redis connection id, or Redis refused us.
        """
        opts = self.options
        InboxPaths.from_root(opts.root).ensure()  # before the watch starts: no events for our own mkdirs
        adopted = None
        if opts.durable:
            self.journal = Journal(opts.root / "bot_relay" / "journal", fsync=opts.fsync, within=opts.root)
            adopted = self.journal.start()
        self.scheduler = scheduler = Scheduler().start()
        self.pool = pool = WorkerPool(opts.workers, name="turn")
        self.notifier = NotifierActor.start(max_backlog=cfg.max_notify_backlog, counts=self.notifier_counts)
        for token, (callback, details, rooms) in subscribers.items():
            self.notifier.tell(AddSubscriber(token, callback, details, rooms))
        if self.runner is None:  # before the roster: it leaves off the profiles the real Hermes cannot run
            from hermes_actors.hermes.select import default_runner

            self.runner = default_runner(opts.root, cfg.raw, timeout=cfg.turn_timeout_seconds)
        cannot_run: Callable[[str], str | None] | None = None
        if is_real_hermes(self.runner):
            from hermes_actors.hermes.install import hermes_cannot_run

            cannot_run = hermes_cannot_run
        self.roster = RosterActor.start(
            opts.root, overrides=opts.overrides, scheduler=scheduler, rescan_seconds=cfg.rescan_seconds,
            cannot_run=cannot_run,
        )
        snapshot = ask(self.roster, GetSnapshot(), timeout=ASK_TIMEOUT, expect=RosterSnapshot)
        self.profile_count = len(snapshot.profiles)
        for profile in owners:
            if profile_key(profile) not in snapshot.index:
                raise KeyError(f"attach_live_owner: no local profile named {profile!r} under {opts.root}")
        runner, guard = self.runner, None
        if redis_settings is not None:  # claim each relayed-in turn in Redis before it runs (exactly once)
            from hermes_actors.transports.redis.actor import ClaimGuard
            from hermes_actors.transports.redis.lease import claim_connection

            guard = ClaimGuard(redis_settings, ttl=cfg.envelope_ttl_seconds)
            assert opts.connection_id is not None
            claim_connection(redis_settings, opts.connection_id, guard.consumer)  # one process per connection id
            runner = guard.wrap(runner)
        journal = self.journal
        runner_is_hermes = is_real_hermes(self.runner)
        caller_admission = CallerAdmission(snapshot, max_hops=cfg.max_hops,
                                           wake=wake_enabled(cfg.wake_sender, runner_is_hermes))

        def deps_factory(dispatcher: pykka.ActorRef[Any], make_turn: TurnFactory) -> ProfileDeps:
            self.turn_factory = make_turn  # names this gateway's turns (Gateway.stop refuses to run in one)
            return ProfileDeps(root=opts.root, config=cfg, runner=runner, pool=pool, scheduler=scheduler,
                               dispatcher=dispatcher, make_turn=make_turn, cross_process_lock=opts.cross_process_lock,
                               journal=journal)

        self.dispatcher = DispatcherActor.start(
            snapshot,
            deps_factory=deps_factory,
            notifier=self.notifier,
            peer_submit=_peer_submitter(opts.peer_transport or PeerCliTransport(), pool),
            policy=RestartPolicy(max_restarts=5, within_seconds=10.0),
            journal=journal,
            runner_is_hermes=runner_is_hermes,
            caller_admission=caller_admission,
            on_failing=on_failing,
            on_failed=self._failed_with(on_failure),
        )
        current = ask(self.roster, Subscribe(self.dispatcher), timeout=ASK_TIMEOUT, expect=RosterSnapshot)
        self.dispatcher.tell(RosterChanged(current))
        self.caller_admission = caller_admission
        if adopted is not None and adopted.states:  # before the relay resumes what it settles from its files
            ask(self.dispatcher, AdoptJournal(adopted.states), timeout=ASK_TIMEOUT)
        self._start_relay(cfg, redis_settings, guard, current)
        for profile, owner in owners.items():
            ask(self.dispatcher, AttachOwner(profile, owner), timeout=ASK_TIMEOUT)
        if adopted is not None and adopted.states:
            idempotent = bool(getattr(self.runner, "idempotent", False))
            self.recovered = ask(self.dispatcher, Recover(adopted.states, idempotent), timeout=ASK_TIMEOUT, expect=dict)
        self.rooms = Rooms(RoomFiles(opts.root, fsync=opts.fsync), dispatcher=self.dispatcher,
                           roster=self.roster, notifier=self.notifier)
        self.rooms.start()  # after recovery: a resumed round's member turns queue behind recovered DMs

    def _start_relay(self, cfg: BotModeConfig, redis_settings: Any, guard: Any, current: RosterSnapshot) -> None:
        """Start the relay (Redis or file; both speak the same messages to the Dispatcher) and await its resume."""
        opts = self.options
        assert self.dispatcher is not None and self.scheduler is not None and self.roster is not None
        relay_args: dict[str, Any] = {
            "config": cfg,
            "dispatcher": self.dispatcher,
            "roster": self.roster,
            "scheduler": self.scheduler,
            "connection_id": opts.connection_id,
            "local_profiles": frozenset(p.profile for p in current.profiles),
        }
        if redis_settings is not None and guard is not None and opts.connection_id:
            from hermes_actors.transports.redis.actor import RedisRelayActor

            self.relay = RedisRelayActor.start(redis_settings, guard=guard, root=opts.root, **relay_args)
            self.dispatcher.tell(AttachRelay(self.relay, reaches_peers=True))  # bot_peers on this Redis too
        else:
            self.relay = RelayActor.start(opts.root, **relay_args)
            self.dispatcher.tell(AttachRelay(self.relay))
            self.desktop = DesktopRpc(self.relay, self.roster)
            self.bridge = FsBridge(
                opts.root / "bot_relay", self.relay, scheduler=self.scheduler, rescan_seconds=cfg.rescan_seconds,
                subdirs=WATCHED_SUBDIRS,  # the rest of bot_relay/ is the hub's business
            ).start()
        self._await_relay_resume()

    def _await_relay_resume(self) -> None:
        """Return once the Dispatcher knows every envelope the relay resumed (each id answerable).

        The relay resumes on its own thread; registering its entries by an ask (not a
        tell) is what keeps ``wait_outcome`` right after ``start()`` from a KeyError.

        Raises:
            RuntimeError: the relay did not finish resuming within ``_RESUME_TIMEOUT``, or died.
        """
        assert self.relay is not None and self.dispatcher is not None and self.roster is not None
        try:
            entries = ask(self.relay, ResumeRelay(), timeout=_RESUME_TIMEOUT)
            # The relay read the remote roster before it answered; these two asks flush it through the
            # RosterActor into the Dispatcher, so a DM right after start() finds the other machines' agents.
            ask(self.roster, GetSnapshot(), timeout=_RESUME_TIMEOUT, expect=RosterSnapshot)
            ask(self.dispatcher, RelayResumed(tuple(entries or ())), timeout=_RESUME_TIMEOUT)
            if entries is None:
                logger.warning("relay transport unreachable at start: the envelopes in flight before the restart "
                               "become answerable once it is reachable again")
        except AskTimeout as exc:
            raise RuntimeError(f"gateway start: the relay did not finish resuming its in-flight envelopes within "
                               f"{_RESUME_TIMEOUT:g}s ({exc}); nothing was accepted, start again") from exc
        except ActorGone as exc:
            raise RuntimeError(f"gateway start: the relay stopped while resuming its in-flight envelopes ({exc}); "
                               "nothing was accepted, see the log for its error") from exc

    def _failed_with(
        self, on_failure: Callable[[BaseException | None, dict[str, dict[str, Any]]], None] | None
    ) -> Callable[[BaseException | None, dict[str, dict[str, Any]], list[str]], None]:
        """The Dispatcher's ``on_failed``: keep the turns that may still run, then tell ``on_failure``."""
        def failed(error: BaseException | None, final: dict[str, dict[str, Any]], running: list[str]) -> None:
            self.failed_running = list(running)
            if on_failure is not None:
                on_failure(error, final)

        return failed

    def shut_down(
        self,
        timeout: float,
        *,
        abandon: threading.Event | None = None,
        on_wait: Callable[[int, float], Any] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """Stop accepting, let running turns finish within ``timeout``, stop every actor (see ``Gateway.stop``).

        Returns:
            The settled outcomes the stopped Gateway keeps answering (empty when the stop was not clean).
        """
        dispatcher, notifier, pool = self.dispatcher, self.notifier, self.pool
        assert dispatcher is not None and notifier is not None and pool is not None
        deadline = time.monotonic() + max(0.0, timeout)
        final: dict[str, dict[str, Any]] = {}
        notifier_busy = False  # a subscriber callback outlived the stop's timeout: the Notifier stops after it
        if self.bridge is not None:
            self.bridge.stop()
        try:
            if self.rooms is not None:
                self.rooms.halt()  # no new member turns; running ones still post or show as interrupted
            ask(dispatcher, StopAccepting(), timeout=ASK_TIMEOUT)
            running = ask(dispatcher, ShutdownProfiles(), timeout=ASK_TIMEOUT, expect=list)
            try:  # a ProfileActor that crashed as the stop began: its restart settles what it held
                ask(dispatcher, AwaitRestarts(), timeout=ASK_TIMEOUT).get(timeout=ASK_TIMEOUT)
            except pykka.Timeout:
                logger.warning("stop: a crashed ProfileActor did not report within {}s; what it held is settled "
                               "as ambiguous", ASK_TIMEOUT)
            await_running_turns(dispatcher, running, deadline=deadline, abandon=abandon, on_wait=on_wait, grace=timeout)
            why = "The turn was still running when the gateway stopped."
            ask(dispatcher, FinalizePending(why, tuple(running)), timeout=ASK_TIMEOUT)
            if self.journal is not None and not self.journal.drain(timeout=ASK_TIMEOUT):
                logger.warning("stop: the journal's last commits did not land in {}s; their outcomes are "
                               "re-delivered by the next start", ASK_TIMEOUT)
            end_running_turns(self.runner, running)
            final = ask(dispatcher, ExportOutcomes(), timeout=ASK_TIMEOUT, expect=dict)
            if self.rooms is not None:
                self.rooms.stop()  # after the last member-turn outcomes reached them, before the notifier flush
            if in_subscriber_callback():  # stop() from a callback: the Notifier is this very thread
                logger.warning("gateway stopped from a subscriber callback: notifications still queued are dropped")
            else:
                notifier_busy = not flush_notifier(notifier, max(0.1, deadline - time.monotonic()))
        except (ActorGone, AskTimeout) as exc:
            if self.failed_running is not None:  # the Dispatcher failed earlier: end the turns it left running
                logger.info("stopping a failed gateway: ending the turns it left running")
                end_running_turns(self.runner, self.failed_running)
            else:
                logger.error("gateway stop was not clean: {}", exc)
        finally:
            if self.rooms is not None:
                self.rooms.stop()  # idempotent: already stopped above unless the stop was not clean
            self._stop_actors(notifier_busy=notifier_busy)
            pool.shutdown(timeout=max(1.0, deadline - time.monotonic()))
            if self.journal is not None:
                self.journal.stop()
            if self.scheduler is not None:
                self.scheduler.stop()
        return final

    def stats(self) -> dict[str, Any]:
        """The counters of ``Gateway.stats()``, each asked of the actor that owns it."""
        assert self.dispatcher is not None
        out: dict[str, Any] = ask(self.dispatcher, StatsRequest(), timeout=ASK_TIMEOUT, expect=dict)
        out.update(self.notifier_counts.as_dict())  # read, not asked: a subscriber may hold the Notifier's thread
        out["worker_threads"] = self.pool.thread_count if self.pool else 0
        out["timers"] = self.scheduler.heap_size() if self.scheduler else 0
        if self.journal is not None:
            out["journal_fsyncs"] = self.journal.fsyncs
            out["journal_records"] = self.journal.records
        if self.relay is not None:
            out["relay_alive"] = False
            with contextlib.suppress(pykka.ActorDeadError):
                out["relay"] = dict(self.relay.proxy().stats().get(timeout=ASK_TIMEOUT))
                out["relay_alive"] = True
        return out

    def teardown(self) -> None:
        """Stop whatever was started (after a failed start)."""
        if self.rooms is not None:
            self.rooms.stop()
        if self.bridge is not None:
            self.bridge.stop()
        self._stop_actors()
        if self.pool is not None:
            self.pool.shutdown(timeout=5)
        if self.scheduler is not None:
            self.scheduler.stop()
        if self.journal is not None:
            self.journal.stop()

    def _stop_actors(self, *, notifier_busy: bool = False) -> None:
        for ref in (self.dispatcher, self.relay, self.roster, self.notifier):
            if ref is None:
                continue
            if ref is self.notifier and (notifier_busy or in_subscriber_callback()):
                ref.stop(block=False)  # its thread is in a callback (maybe this one): it stops once that returns
                continue
            try:
                ref.stop(block=True, timeout=10)
            except pykka.Timeout:
                logger.warning("{} did not stop within 10s", ref)


def flush_notifier(notifier: pykka.ActorRef[Any], timeout: float) -> bool:
    """Let subscriber callbacks catch up with the last outcomes, for at most ``timeout`` seconds.

    A callback still busy past the stop's own timeout does not hold the stop (a slow
    callback never blocks the gateway, its stop included): the stop returns with a
    warning, and the notifications queued behind that callback are still delivered,
    in order, once it returns; then the Notifier stops.

    Returns:
        True once flushed; False when a callback was still running at the deadline.
    """
    try:
        ask(notifier, Flush(), timeout=timeout)
    except AskTimeout:
        logger.warning("stop: a subscriber callback was still running after {:.1f}s; the stop does not wait "
                       "for it (the notifications queued behind it follow once it returns)", timeout)
        return False
    return True


def _peer_submitter(
    transport: PeerCliTransport, pool: WorkerPool
) -> Callable[[Delivery, PeerRoute, Callable[[Outcome], None]], None]:
    """How the Dispatcher hands a ``bot_peers`` DM to the peer transport: on a worker, never on its thread."""

    def peer_submit(delivery: Delivery, route: PeerRoute, report: Callable[[Outcome], None]) -> None:
        def job() -> None:
            try:
                outcome = transport.deliver(delivery, route)
            except BaseException as exc:  # a peer DM has no turn timer: without this it would wait forever
                logger.opt(exception=exc).error("peer transport raised for {}", delivery.delivery_id)
                why = f"The peer transport failed ({type(exc).__name__}: {exc})."
                outcome = outcomes.ambiguous(delivery.delivery_id, route.label, why)
            report(outcome)

        pool.submit(job)

    return peer_submit
