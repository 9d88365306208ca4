"""The actors and threads of one running gateway: how they are started and wired.

:class:`ActorSystem` is what ``Gateway.start`` builds and ``Gateway.stop`` ends:
the journal, the scheduler, the turn worker pool, the Notifier, RosterActor,
DispatcherActor, the relay (file RelayActor with its filesystem bridge and the
Desktop's relay RPC, or the Redis relay holding its connection lease), the
recovery of a previous run and the group rooms. What it is built from is in
:mod:`hermes_actors.facade.options`; the order it stops in, in
:mod:`hermes_actors.facade.shutdown`.
The Gateway keeps the lifecycle state and the public API.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pykka
from loguru import logger

from actors import ActorGone, AskTimeout, FsBridge, RestartPolicy, Scheduler, WorkerPool, ask
from hermes_actors.core import outcomes
from hermes_actors.core.config import BotModeConfig
from hermes_actors.core.names import profile_key
from hermes_actors.core.targets import PeerRoute
from hermes_actors.core.wake import wake_enabled
from hermes_actors.facade import shutdown as system_shutdown
from hermes_actors.facade.options import ASK_TIMEOUT, SystemOptions, is_real_hermes, runs_hermes
from hermes_actors.local.admission import CallerAdmission
from hermes_actors.local.dispatcher import DispatcherActor
from hermes_actors.local.dispatcher_failure import FailedCallback
from hermes_actors.local.notifier import Notifier, NotifierCounts
from hermes_actors.local.outcome_book import KeptOutcomes
from hermes_actors.local.profile_deps import ProfileDeps
from hermes_actors.local.queue_gauge import QueueGauge
from hermes_actors.local.roster import RosterActor, roster_rows
from hermes_actors.local.runners import TurnRunner
from hermes_actors.local.sending import send_dm
from hermes_actors.local.turns import TurnFactory, TurnGates
from hermes_actors.messages import (
    AdoptJournal,
    AttachOwner,
    AttachRelay,
    Delivery,
    DetachOwner,
    GetSnapshot,
    Housekeep,
    Outcome,
    Recover,
    RelayResumed,
    ResumeRelay,
    RosterChanged,
    RosterSnapshot,
    SendRequest,
    StatsRequest,
    Subscribe,
)
from hermes_actors.relay.desktop_rpc import DesktopRpc
from hermes_actors.relay.journal_takeover import JournalTakeover
from hermes_actors.relay.relay_actor import WATCHED_SUBDIRS, RelayActor
from hermes_actors.relay.strays import ensure_relay_directories
from hermes_actors.rooms import Rooms
from hermes_actors.rooms.store import RoomFiles
from hermes_actors.store.journal import Journal
from hermes_actors.store.journal_screen import refuse_unreadable_journals
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.store.relay_paths import RelayPaths
from hermes_actors.transports.peer_cli import PeerCliTransport

__all__ = ["ActorSystem"]

_RESUME_TIMEOUT = 30.0  # how long start() waits for the relay to resume its in-flight envelopes


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
    notifier: Notifier | None = None  # the subscribers' actors
    notifier_counts: NotifierCounts = field(default_factory=NotifierCounts)  # published by the subscribers' actors
    roster: pykka.ActorRef[Any] | None = None
    dispatcher: pykka.ActorRef[Any] | None = None
    relay: pykka.ActorRef[Any] | None = None
    # the file relay's takeover of the journals of gateways that stop or die beside us (durable mode)
    journals: JournalTakeover | None = None
    resumed_ids: frozenset[str] = frozenset()  # the envelopes the relay waits for again after this start
    bridge: FsBridge | None = None
    desktop: DesktopRpc | None = None  # the Desktop's relay RPC, served by the file RelayActor
    rooms: Rooms | None = None  # the group rooms (docs/rooms.md); None too when the gateway drives none
    caller_admission: CallerAdmission | None = None  # first-hop local DMs admitted on the sender's thread
    profile_count: int = 0
    recovered: dict[str, int] = field(default_factory=dict)
    failed_running: list[str] | None = None  # set when the Dispatcher failed: the turns that may still run
    # set by the stop before the Dispatcher stops accepting: the relay takes nothing more in (read by it only)
    relay_stopping: threading.Event = field(default_factory=threading.Event)

    def start(
        self,
        cfg: BotModeConfig,
        redis_settings: Any,
        *,
        subscribers: dict[int, tuple[Callable[[dict[str, Any]], Any], bool, bool]],
        owners: dict[str, Any],
        on_failing: Callable[[BaseException], None] | None = None,
        on_failure: Callable[[BaseException | None, KeptOutcomes], None] | None = None,
    ) -> None:
        """Start and wire every actor. After an error, call :meth:`teardown` to stop what was started.

        Args:
            cfg: the loaded ``bot_mode`` config.
            redis_settings: from :func:`redis_settings_for` (None: the file relay).
            subscribers: outcome callbacks subscribed before start (token → (callback, details, rooms)).
            owners: live owners attached before start (profile → owner); attached before recovery.
            on_failing: called the moment the Dispatcher fails (see ``DispatcherActor``).
            on_failure: called once it failed, with the error and its settled outcomes (packed:
                :data:`KeptOutcomes`); the turns that may still run are kept for :meth:`shut_down`, which ends them.

        Raises:
            KeyError: an owner names no local profile.
            TransportError: another live process serves the Redis connection id, or Redis refused us.
        """
        opts = self.options
        # The start's one walk of the relay tree (the RelayActor relies on it), on this thread before the watch
        # starts: no events for our own mkdirs (a directory created while watchdog walks the tree makes it warn on
        # stderr); a relay directory left swapped (a gateway killed after a failed reply write) is put back first,
        # so the reply kept for this start is written; run/, rooms/ and unconfirmed/ too (start_directories); a
        # swapped journal/ refuses a durable start (it may hold acked DMs: never moved aside), and so does a journal
        # file that may hold acked DMs and cannot be read safely (a symlink, another user's), first: nothing changed
        paths = InboxPaths.from_root(opts.root)
        if opts.durable:
            refuse_unreadable_journals(paths.journal, within=opts.root)
        ensure_relay_directories(paths, needs=(paths.journal,) if opts.durable else ())
        adopted = None
        if opts.durable:
            self.journal = Journal(paths.journal, fsync=opts.fsync, within=opts.root)
            adopted = self.journal.start()
        self.scheduler = scheduler = Scheduler().start()
        self.pool = pool = WorkerPool(opts.workers, name="turn")
        self.notifier = Notifier(max_backlog=cfg.max_notify_backlog, counts=self.notifier_counts)
        for token, (callback, details, rooms) in subscribers.items():
            self.notifier.add(token, callback, details, rooms)
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
        runner, guard, probe = self.runner, None, None
        if redis_settings is not None:  # claim each relayed-in turn in Redis before it runs (exactly once)
            from hermes_actors.transports.redis.actor import ClaimGuard
            from hermes_actors.transports.redis.io import StartProbe
            from hermes_actors.transports.redis.lease import claim_connection

            guard = ClaimGuard(redis_settings, ttl=cfg.envelope_ttl_seconds)
            assert opts.connection_id is not None
            probe = StartProbe()  # a Redis found unreachable here is not asked again by the transport's start
            claim_connection(redis_settings, opts.connection_id, guard.consumer, probe=probe)  # one process per id
            runner = guard.wrap(runner)
        journal = self.journal
        runner_is_hermes = is_real_hermes(self.runner)
        caller_admission = CallerAdmission(snapshot, max_hops=cfg.max_hops,
                                           wake=wake_enabled(cfg.wake_sender, runner_is_hermes),
                                           gauge=QueueGauge(cfg.max_queued),
                                           roster=self.roster, roster_file=RelayPaths.from_root(opts.root).roster)

        def deps_factory(dispatcher: pykka.ActorRef[Any], make_turn: TurnFactory) -> ProfileDeps:
            self.turn_factory = make_turn  # names this gateway's turns (Gateway.stop refuses to run in one)
            return ProfileDeps(root=opts.root, config=cfg, runner=runner, pool=pool, scheduler=scheduler,
                               dispatcher=dispatcher, make_turn=make_turn, cross_process_lock=opts.cross_process_lock,
                               journal=journal, gauge=caller_admission.gauge, gates=TurnGates(hold=opts.host_stopping))

        self.dispatcher = DispatcherActor.start(
            snapshot,
            deps_factory=deps_factory,
            notifier=self.notifier,
            peer_submit=_peer_submitter(opts.peer_transport or PeerCliTransport(), pool),
            policy=RestartPolicy(max_restarts=5, within_seconds=10.0),
            journal=journal,
            runner_is_hermes=runner_is_hermes,
            hermes_turns=runs_hermes(self.runner),
            caller_admission=caller_admission,
            on_failing=on_failing,
            on_failed=self._failed_with(on_failure),
        )
        current = ask(self.roster, Subscribe(self.dispatcher), timeout=ASK_TIMEOUT, expect=RosterSnapshot)
        self.dispatcher.tell(RosterChanged(current))
        self.caller_admission = caller_admission
        idempotent = bool(getattr(self.runner, "idempotent", False))
        relayed_in: dict[str, int] = {}
        if adopted is not None and adopted.states:
            # before any transport starts (the relay resumes what it settles from its files, drains inbox/, takes
            # Redis entries; the Desktop RPC): a relayed-in envelope offered again finds the journal's verdict
            relayed_in = ask(self.dispatcher, AdoptJournal(adopted.states, idempotent), timeout=ASK_TIMEOUT,
                             expect=dict)
        self._start_relay(cfg, redis_settings, guard, current, probe)
        for profile, owner in owners.items():
            ask(self.dispatcher, AttachOwner(profile, owner), timeout=ASK_TIMEOUT)
        if adopted is not None and adopted.states:
            waiting, reported = frozenset[str](), frozenset[str]()
            if self.journals is not None:  # relayed DMs another gateway's relay holds, or reported: not published here
                waiting, reported = self.journals.sort(adopted.states, InboxPaths.from_root(opts.root),
                                                       resumed=self.resumed_ids)
            recovered = ask(self.dispatcher, Recover(adopted.states, idempotent, relayed=waiting | reported,
                                                     relay_reported=reported), timeout=ASK_TIMEOUT, expect=dict)
            self.recovered = {name: count + relayed_in.get(name, 0) for name, count in recovered.items()}
            if self.journals is not None:  # settled in our journal once their taker reported them (its rescans)
                self.journals.watch(adopted.states, waiting)
        if opts.drive_rooms:
            self.rooms = Rooms(RoomFiles(opts.root, fsync=opts.fsync), dispatcher=self.dispatcher,
                               roster=self.roster, notifier=self.notifier, scheduler=scheduler,
                               retry_seconds=cfg.rescan_seconds)
            self.rooms.start()  # after recovery: a resumed round's member turns queue behind recovered DMs

    def _start_relay(self, cfg: BotModeConfig, redis_settings: Any, guard: Any, current: RosterSnapshot,
                     probe: Any = None) -> None:
        """Start the relay (Redis or file; both speak the same messages to the Dispatcher) and await its resume.

        ``probe`` is what the Redis lease claim found (a ``StartProbe``): the Redis transport's start asks a Redis
        found unreachable nothing more.
        """
        opts = self.options
        assert self.dispatcher is not None and self.scheduler is not None and self.roster is not None
        relay_args: dict[str, Any] = {
            "config": cfg,
            "dispatcher": self.dispatcher,
            "roster": self.roster,
            "scheduler": self.scheduler,
            "connection_id": opts.connection_id,
            "local_profiles": frozenset(p.profile for p in current.profiles),
            "stopping": self.relay_stopping,
        }
        if redis_settings is not None and guard is not None and opts.connection_id:
            from hermes_actors.transports.redis.actor import RedisRelayActor

            # a reply is kept in its start mark until it is in Redis, flushed as the mark is (start_recorder)
            self.relay = RedisRelayActor.start(redis_settings, guard=guard, root=opts.root,
                                               fsync=opts.durable and opts.fsync, start_probe=probe, **relay_args)
            # bot_peers on this Redis too; nothing on the root keeps its envelopes: their acks are journaled
            self.dispatcher.tell(AttachRelay(self.relay, reaches_peers=True, journals_sends=True))
        else:
            if self.journal is not None:  # the journals of gateways that stop or die beside us (at each rescan)
                self.journals = JournalTakeover(self.journal, self.dispatcher,
                                                idempotent_runner=bool(getattr(self.runner, "idempotent", False)))
            self.relay = RelayActor.start(opts.root, journals=self.journals, **relay_args)
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
            self.resumed_ids = frozenset(entry.envelope_id for entry in entries or ())
            # The relay read the remote roster before it answered; these two asks flush it through the
            # RosterActor into the Dispatcher, so a DM right after start() finds the other machines' agents.
            ask(self.roster, GetSnapshot(), timeout=_RESUME_TIMEOUT, expect=RosterSnapshot)
            ask(self.dispatcher, RelayResumed(tuple(entries or ()), complete=entries is not None),
                timeout=_RESUME_TIMEOUT)
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
        self, on_failure: Callable[[BaseException | None, KeptOutcomes], None] | None
    ) -> FailedCallback:
        """The Dispatcher's ``on_failed``: keep the turns that may still run, then tell ``on_failure``."""
        def failed(error: BaseException | None, final: KeptOutcomes, running: list[str]) -> None:
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
        on_cut_off: Callable[[], Any] | None = None,
    ) -> system_shutdown.Stopped:
        """Stop accepting, let running turns finish within ``timeout``, stop every actor: see
        :func:`hermes_actors.facade.shutdown.shut_down`.

        Returns:
            The settled outcomes the stopped Gateway keeps answering (empty when the stop was not clean), and a
            ``KeyboardInterrupt`` or ``SystemExit`` a stop callback raised, for the Gateway to raise at its end.
        """
        return system_shutdown.shut_down(self, timeout, abandon=abandon, on_wait=on_wait, on_cut_off=on_cut_off)

    # ── what the Gateway's API asks of the running actors ───────────────────

    def send(self, request: SendRequest) -> dict[str, Any]:
        """``Gateway.message_agent``: the tool's ack or refusal dict (:func:`hermes_actors.local.sending.send_dm`).

        Raises:
            ActorGone: the Dispatcher has stopped.
        """
        assert self.dispatcher is not None
        return send_dm(self.dispatcher, request, admission=self.caller_admission, journal=self.journal,
                       timeout=ASK_TIMEOUT)

    def roster_rows(self) -> list[dict[str, Any]]:
        """``Gateway.roster``: every agent the gateway can reach, as the RosterActor sees them now."""
        assert self.roster is not None
        return roster_rows(ask(self.roster, GetSnapshot(), timeout=ASK_TIMEOUT, expect=RosterSnapshot))

    def housekeep(self) -> int:
        """``Gateway.housekeep``: the relay sweeps stale artifacts now; returns the count removed."""
        assert self.relay is not None
        removed: int = ask(self.relay, Housekeep(), timeout=ASK_TIMEOUT, expect=int)
        return removed

    def attach_owner(self, profile: str, owner: Any) -> None:
        """``Gateway.attach_live_owner`` on the running Dispatcher. Raises KeyError: no such local profile."""
        assert self.dispatcher is not None
        ask(self.dispatcher, AttachOwner(profile, owner), timeout=ASK_TIMEOUT)

    def detach_owner(self, profile: str) -> None:
        """``Gateway.detach_live_owner`` on the running Dispatcher. Raises KeyError: no such local profile."""
        assert self.dispatcher is not None
        ask(self.dispatcher, DetachOwner(profile), timeout=ASK_TIMEOUT)

    def stats(self) -> dict[str, Any]:
        """The counters of ``Gateway.stats()``, each asked of the actor that owns it."""
        assert self.dispatcher is not None
        out: dict[str, Any] = ask(self.dispatcher, StatsRequest(), timeout=ASK_TIMEOUT, expect=dict)
        out.update(self.notifier_counts.as_dict())  # read, not asked: a callback may hold its subscriber's thread
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
        """Stop whatever was started (after a failed start): see :func:`hermes_actors.facade.shutdown.teardown`."""
        system_shutdown.teardown(self)


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
