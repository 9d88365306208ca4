"""The embedding facade: ``Gateway`` starts the actors and is the public API.

    with Gateway(root="/path/to/hermes-root") as gw:
        ack = gw.message_agent(sender="alice", target="bob", message="hi")
        out = gw.wait_outcome(ack["delivery_id"], timeout=30)
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import pykka
from loguru import logger

from actors import ActorGone, AskTimeout, FsBridge, RestartPolicy, Scheduler, WorkerPool, ask
from hermes_actors.core import outcomes
from hermes_actors.core.acks import resolve_ack
from hermes_actors.core.config import BotModeConfig, load_config
from hermes_actors.core.names import profile_key
from hermes_actors.core.targets import PeerRoute
from hermes_actors.local.dispatcher import DispatcherActor
from hermes_actors.local.notifier import NotifierActor
from hermes_actors.local.profile_actor import ProfileDeps
from hermes_actors.local.roster import RosterActor, roster_rows
from hermes_actors.local.runners import TurnRunner, as_runner
from hermes_actors.local.shutdown import await_running_turns, end_running_turns
from hermes_actors.messages import (
    BOT_CHAT_SESSION,
    AddSubscriber,
    AttachOwner,
    AttachRelay,
    AwaitOutcome,
    Delivery,
    DetachOwner,
    ExportOutcomes,
    FinalizePending,
    Flush,
    GetSnapshot,
    Housekeep,
    NotifierStats,
    Outcome,
    Recover,
    RelayResumed,
    RemoveSubscriber,
    ResumeRelay,
    RosterChanged,
    RosterSnapshot,
    SendRequest,
    ShutdownProfiles,
    StatsRequest,
    StopAccepting,
    Subscribe,
    Turn,
)
from hermes_actors.relay.desktop_rpc import DesktopRpc
from hermes_actors.relay.relay_actor import RelayActor
from hermes_actors.store.journal import Journal
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.transports.peer_cli import PeerCliTransport

__all__ = ["Gateway"]

_ASK_TIMEOUT = 30.0
_RESUME_TIMEOUT = 30.0  # how long start() waits for the relay to resume its in-flight envelopes


def _explicit_runner(runner: Any) -> TurnRunner | None:
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

    Raises:
        ValueError: ``root`` is empty (``Path("")`` is the current directory, where the
            relay and journal directories would be created by accident).
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
    ) -> None:
        if not str(root).strip():
            raise ValueError(
                f"Hermes root is empty ({str(root)!r}): pass the Hermes root directory "
                "(the default profile's home, e.g. ~/.hermes), not the current directory by accident"
            )
        self.root = Path(root).expanduser()
        self.runner: TurnRunner | None = _explicit_runner(runner)  # None: the real Hermes, chosen at start()
        self.overrides = dict(config or {})
        self.connection_id = connection_id
        self.workers = workers
        self.cross_process_lock = cross_process_lock
        self.peer_transport = peer_transport
        self.durable = durable
        self.fsync = fsync
        self.serve_submit = serve_submit
        self._submit: Any = None  # the submit endpoint while serve_submit runs
        self._journal: Journal | None = None
        self.recovered: dict[str, int] = {}
        self.config: BotModeConfig | None = None
        self._state = "new"  # new → running → stopping → stopped
        self._state_lock = threading.Lock()  # guards the lifecycle only, never message traffic
        self._tokens = itertools.count(1)
        self._early_subscribers: dict[int, Callable[[dict[str, Any]], Any]] = {}
        self._early_owners: dict[str, Any] = {}
        self._profile_count = 0
        self._final_outcomes: dict[str, dict[str, Any]] = {}
        self._scheduler: Scheduler | None = None
        self._pool: WorkerPool | None = None
        self._notifier: pykka.ActorRef[Any] | None = None
        self._roster: pykka.ActorRef[Any] | None = None
        self._dispatcher: pykka.ActorRef[Any] | None = None
        self._relay: pykka.ActorRef[Any] | None = None
        self._bridge: FsBridge | None = None
        self._desktop: DesktopRpc | None = None  # the Desktop's relay RPC, served by the file RelayActor

    # ── lifetime ────────────────────────────────────────────────────────────

    def start(self) -> Gateway:
        """Start every actor. Returns self.

        Raises:
            FileNotFoundError: the root is not a directory.
            RuntimeError: already started.
        """
        with self._state_lock:
            if self._state != "new":
                raise RuntimeError(f"gateway already {self._state}; create a new Gateway to start again")
            if not self.root.is_dir():
                raise FileNotFoundError(f"Hermes root {str(self.root)!r} does not exist or is not a directory")
            self.config = cfg = load_config(self.root, self.overrides)
            redis_settings = self._redis_settings(cfg)  # ValueError (nothing started) when misconfigured
            try:
                self._start_locked(cfg, redis_settings)
            except BaseException:
                self._teardown()  # a half-started gateway leaves no actor or thread behind
                raise
            self._state = "running"
        logger.info("gateway started on {} ({} profiles)", self.root, self._profile_count)
        return self

    def _teardown(self) -> None:
        if self._submit is not None:
            self._submit.close()
        if self._bridge is not None:
            self._bridge.stop()
        for ref in (self._dispatcher, self._relay, self._roster, self._notifier):
            if ref is not None:
                try:
                    ref.stop(block=True, timeout=10)
                except pykka.Timeout:
                    logger.warning("{} did not stop within 10s", ref)
        if self._pool is not None:
            self._pool.shutdown(timeout=5)
        if self._scheduler is not None:
            self._scheduler.stop()
        if self._journal is not None:
            self._journal.stop()

    def _start_locked(self, cfg: BotModeConfig, redis_settings: Any) -> None:
        InboxPaths.from_root(self.root).ensure()  # before the watch starts: no events for our own mkdirs
        adopted = None
        if self.durable:
            self._journal = Journal(self.root / "bot_relay" / "journal", fsync=self.fsync)
            adopted = self._journal.start()
        self._scheduler = Scheduler().start()
        self._pool = WorkerPool(self.workers, name="turn")
        self._notifier = NotifierActor.start(max_backlog=cfg.max_notify_backlog)
        for token, callback in self._early_subscribers.items():
            self._notifier.tell(AddSubscriber(token, callback))
        self._early_subscribers.clear()
        self._roster = RosterActor.start(
            self.root, overrides=self.overrides, scheduler=self._scheduler, rescan_seconds=cfg.rescan_seconds
        )
        snapshot = ask(self._roster, GetSnapshot(), timeout=_ASK_TIMEOUT, expect=RosterSnapshot)
        self._profile_count = len(snapshot.profiles)
        for profile in self._early_owners:
            if profile_key(profile) not in snapshot.index:
                raise KeyError(f"attach_live_owner: no local profile named {profile!r} under {self.root}")
        if self.runner is None:
            from hermes_actors.hermes.select import default_runner

            self.runner = default_runner(self.root, cfg.raw, timeout=cfg.turn_timeout_seconds)
        runner_is_hermes = is_real_hermes(self.runner)
        pool, scheduler, runner = self._pool, self._scheduler, self.runner
        guard = None
        if redis_settings is not None:  # claim each relayed-in turn in Redis before it runs (exactly once)
            from hermes_actors.transports.redis.actor import ClaimGuard

            guard = ClaimGuard(redis_settings, ttl=cfg.envelope_ttl_seconds)
            runner = guard.wrap(runner)
        transport = self.peer_transport or PeerCliTransport()

        def deps_factory(dispatcher: pykka.ActorRef[Any], make_turn: Callable[[Delivery], Turn]) -> ProfileDeps:
            return ProfileDeps(
                root=self.root,
                config=cfg,
                runner=runner,
                pool=pool,
                scheduler=scheduler,
                dispatcher=dispatcher,
                make_turn=make_turn,
                cross_process_lock=self.cross_process_lock,
                journal=self._journal,
            )

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

        self._dispatcher = DispatcherActor.start(
            snapshot,
            deps_factory=deps_factory,
            notifier=self._notifier,
            peer_submit=peer_submit,
            policy=RestartPolicy(max_restarts=5, within_seconds=10.0),
            journal=self._journal,
            runner_is_hermes=runner_is_hermes,
        )
        current = ask(self._roster, Subscribe(self._dispatcher), timeout=_ASK_TIMEOUT, expect=RosterSnapshot)
        self._dispatcher.tell(RosterChanged(current))
        # Both relays speak the same messages to the Dispatcher; they differ in what carries them.
        relay_args: dict[str, Any] = {
            "config": cfg,
            "dispatcher": self._dispatcher,
            "roster": self._roster,
            "scheduler": self._scheduler,
            "connection_id": self.connection_id,
            "local_profiles": frozenset(p.profile for p in current.profiles),
        }
        if redis_settings is not None and guard is not None and self.connection_id:
            from hermes_actors.transports.redis.actor import RedisRelayActor

            self._relay = RedisRelayActor.start(redis_settings, guard=guard, **relay_args)
            self._dispatcher.tell(AttachRelay(self._relay, reaches_peers=True))  # bot_peers on this Redis too
        else:
            self._relay = RelayActor.start(self.root, **relay_args)
            self._dispatcher.tell(AttachRelay(self._relay))
            self._desktop = DesktopRpc(self._relay, self._roster)
            self._bridge = FsBridge(
                self.root / "bot_relay", self._relay, scheduler=self._scheduler, rescan_seconds=cfg.rescan_seconds
            ).start()
        self._await_relay_resume()
        for profile, owner in self._early_owners.items():
            ask(self._dispatcher, AttachOwner(profile, owner), timeout=_ASK_TIMEOUT)
        self._early_owners.clear()
        if adopted is not None and adopted.states:
            idempotent = bool(getattr(self.runner, "idempotent", False))
            self.recovered = ask(
                self._dispatcher, Recover(adopted.states, idempotent), timeout=_ASK_TIMEOUT, expect=dict
            )
        if self.serve_submit:  # last: a DM submitted from now on finds every actor up
            from hermes_actors.hermes.host import open_submit_endpoint

            self._submit = open_submit_endpoint(self)

    def _await_relay_resume(self) -> None:
        """Return once the Dispatcher knows every envelope the relay resumed (each id answerable).

        The relay resumes on its own thread; registering its entries by an ask (not a
        tell) is what keeps ``wait_outcome`` right after ``start()`` from a KeyError.

        Raises:
            RuntimeError: the relay did not finish resuming within ``_RESUME_TIMEOUT``, or died.
        """
        assert self._relay is not None and self._dispatcher is not None
        try:
            entries = ask(self._relay, ResumeRelay(), timeout=_RESUME_TIMEOUT)
            if entries is None:
                logger.warning("relay transport unreachable at start: the envelopes in flight before the restart "
                               "become answerable once it is reachable again")
                return
            ask(self._dispatcher, RelayResumed(tuple(entries)), timeout=_RESUME_TIMEOUT)
        except AskTimeout as exc:
            raise RuntimeError(f"gateway start: the relay did not finish resuming its in-flight envelopes within "
                               f"{_RESUME_TIMEOUT:g}s ({exc}); nothing was accepted, start again") from exc
        except ActorGone as exc:
            raise RuntimeError(f"gateway start: the relay stopped while resuming its in-flight envelopes ({exc}); "
                               "nothing was accepted, see the log for its error") from exc

    def _redis_settings(self, cfg: BotModeConfig) -> Any:
        """The Redis transport's settings when ``bot_mode.transport`` selects it (None: the file relay).

        Raises:
            ValueError: a bad transport value, or Redis without a ``connection_id``.
        """
        from hermes_actors.transports.redis.store import redis_settings, redis_url_from_config

        url = redis_url_from_config(cfg.raw)
        if url is None:
            return None
        if not self.connection_id:
            raise ValueError("the Redis transport (bot_mode.transport) needs Gateway(..., connection_id=...): "
                             "the connection id names this gateway's stream on Redis")
        return redis_settings(cfg.raw, url)

    def stop(
        self,
        timeout: float = 30,
        *,
        abandon: threading.Event | None = None,
        on_wait: Callable[[int, float], Any] | None = None,
    ) -> None:
        """Stop accepting, let running turns finish within ``timeout``, stop every actor.

        Queued deliveries that never ran get a ``cancelled`` outcome; a turn still
        running after ``timeout`` (or once ``abandon`` is set) is ``ambiguous``
        (journaled), and the runner's ``stop_turns`` (if it has one) ends its
        process group. Subscriber callbacks are flushed before this returns. Idempotent.

        Args:
            timeout: seconds running turns get to finish; stop returns as soon as they have.
            abandon: set it (a second Ctrl-C) to stop waiting for running turns at once.
            on_wait: called once with (running turns, ``timeout``) before waiting for them.
        """
        with self._state_lock:
            if self._state != "running":
                self._state = "stopped" if self._state == "new" else self._state
                return
            self._state = "stopping"
        dispatcher = self._dispatcher
        assert dispatcher is not None and self._notifier is not None and self._pool is not None
        deadline = time.monotonic() + max(0.0, timeout)
        if self._submit is not None:  # first: a DM submitted while stopping would only be cancelled
            self._submit.close()
        if self._bridge is not None:
            self._bridge.stop()
        try:
            ask(dispatcher, StopAccepting(), timeout=_ASK_TIMEOUT)
            running = ask(dispatcher, ShutdownProfiles(), timeout=_ASK_TIMEOUT, expect=list)
            await_running_turns(dispatcher, running, deadline=deadline, abandon=abandon, on_wait=on_wait, grace=timeout)
            why = "The turn was still running when the gateway stopped."
            ask(dispatcher, FinalizePending(why, tuple(running)), timeout=_ASK_TIMEOUT)
            end_running_turns(self.runner, running)
            self._final_outcomes = ask(dispatcher, ExportOutcomes(), timeout=_ASK_TIMEOUT, expect=dict)
            ask(self._notifier, Flush(), timeout=max(_ASK_TIMEOUT, timeout))
        except (ActorGone, AskTimeout) as exc:
            logger.error("gateway stop was not clean: {}", exc)
        finally:
            for ref in (self._dispatcher, self._relay, self._roster, self._notifier):
                if ref is not None:
                    try:
                        ref.stop(block=True, timeout=10)
                    except pykka.Timeout:
                        logger.warning("{} did not stop within 10s", ref)
            self._pool.shutdown(timeout=max(1.0, deadline - time.monotonic()))
            if self._journal is not None:
                self._journal.stop()
            if self._scheduler is not None:
                self._scheduler.stop()
            with self._state_lock:
                self._state = "stopped"
        logger.info("gateway stopped")

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True between start() and the beginning of stop()."""
        return self._state == "running"

    def _live_dispatcher(self) -> pykka.ActorRef[Any]:
        if self._state != "running" or self._dispatcher is None:
            raise RuntimeError("gateway is not running")
        return self._dispatcher

    # ── the API ─────────────────────────────────────────────────────────────

    def message_agent(
        self, *, sender: str, target: str, message: str, session: str = BOT_CHAT_SESSION, hop: int = 0
    ) -> dict[str, Any]:
        """Send a DM as ``sender``; returns the tool's ack or refusal dict at once.

        ``hop`` is the DM's depth in its conversation for the guard (0 and 1: a first DM;
        a DM sent from inside the turn of a hop-N delivery is hop N+1).

        Raises:
            RuntimeError: the gateway is not running (before start, or once stop began).
        """
        dispatcher = self._live_dispatcher()
        try:
            request = SendRequest(sender, target, message, hop=hop, session=session)
            answer = ask(dispatcher, request, timeout=_ASK_TIMEOUT)
            return resolve_ack(answer, timeout=_ASK_TIMEOUT)
        except ActorGone as exc:
            raise RuntimeError("gateway is not running") from exc

    def wait_outcome(self, delivery_id: str, timeout: float = 30) -> dict[str, Any]:
        """The outcome dict of ``delivery_id``, waiting at most ``timeout`` seconds.

        The outcomes of the last 100,000 settled deliveries are kept in memory (and, in
        durable mode, the last 10,000 across restarts in the journal).

        Raises:
            TimeoutError: no outcome arrived in time.
            KeyError: this gateway never issued the id (and no journal holds it).
        """
        final = self._final_outcomes.get(delivery_id)
        if final is not None:
            return dict(final)
        if self._state != "running" or self._dispatcher is None:
            raise KeyError(f"unknown delivery id {delivery_id!r} (the gateway is not running)")
        future = ask(self._dispatcher, AwaitOutcome(delivery_id), timeout=_ASK_TIMEOUT)
        try:
            return dict(future.get(timeout=timeout))
        except pykka.Timeout:
            raise TimeoutError(f"no outcome for delivery {delivery_id} within {timeout}s") from None

    def subscribe(self, callback: Callable[[dict[str, Any]], Any]) -> Callable[[], None]:
        """Call ``callback(outcome)`` for every later outcome, on the notifier thread.

        A callback that raises (even ``SystemExit``) is logged and counted in
        ``stats()["subscriber_errors"]``; it stays subscribed and no actor stops.

        Returns:
            A function that unsubscribes.
        """
        if not callable(callback):
            raise TypeError(f"subscribe needs a callable, got {type(callback).__name__}")
        if self._state in ("stopping", "stopped"):
            raise RuntimeError("gateway is not running; subscribe before start() or while it runs")
        token = next(self._tokens)
        notifier = self._notifier
        if notifier is None:
            self._early_subscribers[token] = callback
        else:
            notifier.tell(AddSubscriber(token, callback))

        def unsubscribe() -> None:
            self._early_subscribers.pop(token, None)
            if self._notifier is not None:
                with contextlib.suppress(pykka.ActorDeadError):
                    self._notifier.tell(RemoveSubscriber(token))

        return unsubscribe

    def roster(self) -> list[dict[str, Any]]:
        """Every agent this gateway can reach: local profiles, then relay agents."""
        if self._roster is None or self._state != "running":
            raise RuntimeError("gateway is not running")
        return roster_rows(ask(self._roster, GetSnapshot(), timeout=_ASK_TIMEOUT, expect=RosterSnapshot))

    def housekeep(self) -> int:
        """Sweep stale relay artifacts (> 6 h) and orphaned DM files now; returns the count removed."""
        if self._relay is None or self._state != "running":
            raise RuntimeError("gateway is not running")
        removed: int = ask(self._relay, Housekeep(), timeout=_ASK_TIMEOUT, expect=int)
        return removed

    def stats(self) -> dict[str, Any]:
        """Counters of the running gateway, each from the actor that owns it (an ask: it answers once
        every message that actor received before has been handled).

        Returns:
            accepted, refused, settled, pending, active_profiles, profile_starts (the Dispatcher);
            notified, notify_skipped (shed behind a slow subscriber) and subscriber_errors (callbacks
            that raised) (the notifier); worker_threads; journal_fsyncs and journal_records when
            durable; and with a relay (file or Redis): relay_alive, and while it is alive ``relay``,
            its counters (sent, replies, expired, timeouts, drained, quarantined, waiting, ...).

        Raises:
            RuntimeError: the gateway is not running.
        """
        out: dict[str, Any] = ask(self._live_dispatcher(), StatsRequest(), timeout=_ASK_TIMEOUT, expect=dict)
        if self._notifier is not None:
            out.update(ask(self._notifier, NotifierStats(), timeout=_ASK_TIMEOUT, expect=dict))
        out["worker_threads"] = self._pool.thread_count if self._pool else 0
        if self._journal is not None:
            out["journal_fsyncs"] = self._journal.fsyncs
            out["journal_records"] = self._journal.records
        if self._relay is not None:
            out["relay_alive"] = False
            with contextlib.suppress(pykka.ActorDeadError):
                out["relay"] = dict(self._relay.proxy().stats().get(timeout=_ASK_TIMEOUT))
                out["relay_alive"] = True
        return out

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
        as_runner(owner)
        if self._state == "new":  # attached before start(): recovered DMs already go to it
            self._early_owners[profile] = owner
            return
        ask(self._live_dispatcher(), AttachOwner(profile, owner), timeout=_ASK_TIMEOUT)

    def detach_live_owner(self, profile: str) -> None:
        """Return this profile's DMs (those not handed over yet) to the normal turn path.

        Raises:
            KeyError: no such local profile.
        """
        if self._state == "new":
            self._early_owners.pop(profile, None)
            return
        ask(self._live_dispatcher(), DetachOwner(profile), timeout=_ASK_TIMEOUT)

    # ── the Desktop's relay RPC (bot_relay.*): thin delegations to DesktopRpc ──

    def _desktop_rpc(self) -> DesktopRpc:
        self._live_dispatcher()
        if self._desktop is None:
            raise RuntimeError("the relay RPC serves the file relay; this gateway runs the Redis transport")
        return self._desktop

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
