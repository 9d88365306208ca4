"""RedisRelayActor: the Redis Streams transport between gateways (docs/operations.md, "Multi-machine with Redis").

A drop-in for the file relay's RelayActor: toward the Dispatcher it speaks the
same messages (``RelaySend``/``PeerSend``, answered later with ``RelayAccepted``
through :func:`actors.ask_reply_to`, so the Dispatcher never waits on Redis;
``RelayedOutcome``/``ForgetSent``, ``RelayDeliver``, ``RelayOutcome``, ``RelayResumed``) and the
records are the relay's envelope and reply records, orjson-serialized (key
names: ``transports.redis.store``). It is attached with
``AttachRelay(reaches_peers=True)``: ``bot_peers`` peers on this Redis are its to carry.

One actor, one module of handlers; its state lives in composed objects:

- :class:`~hermes_actors.transports.redis.link.RedisLink`: the client and the outage state;
- :class:`~hermes_actors.transports.redis.outbound.Outbound`: our envelopes (send, replies,
  TTL expiry, reply budget, resume after a restart);
- :class:`~hermes_actors.transports.redis.inbound.InboundDrain`: the drain of our inbox;
- :class:`~hermes_actors.transports.redis.heartbeat.Heartbeat` (its own thread) and the
  :class:`~hermes_actors.transports.redis.io.StreamReader` (its own thread).

This module keeps the lifecycle and the periodic work: roster publication, the
remote roster, ``XCLAIM`` of held entries, ``XAUTOCLAIM`` of a dead consumer's
entries after ``redis_claim_idle_seconds``, the consumer GC and housekeeping (on
the file relay's schedule: :func:`~hermes_actors.relay.relay_actor.housekeeping_due`).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pykka
from loguru import logger

from actors import ActorGone, AskTimeout, Scheduler, TypedActor, ask, handles, tell
from hermes_actors.core.config import BotModeConfig
from hermes_actors.messages import (
    ForgetSent,
    Housekeep,
    PeerSend,
    ProfileInfo,
    RedisEntries,
    RedisTick,
    RelayOutcome,
    RelayResumed,
    RelaySend,
    RemoteAgent,
    RemoteRows,
    ReplyDeadline,
    ResumedSend,
    ResumeRelay,
    RosterChanged,
    RosterSnapshot,
    Subscribe,
    TtlDeadline,
)
from hermes_actors.relay.relay_actor import housekeeping_due
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.transports.redis import store as rs
from hermes_actors.transports.redis.heartbeat import Heartbeat
from hermes_actors.transports.redis.inbound import InboundDrain
from hermes_actors.transports.redis.io import (
    ClaimGuard,
    InboxRoom,
    StartProbe,
    StreamReader,
    ensure_groups,
    stop_threads,
    stop_wait_seconds,
)
from hermes_actors.transports.redis.link import RedisLink, as_text
from hermes_actors.transports.redis.outbound import Outbound

__all__ = ["ClaimGuard", "RedisRelayActor"]

CONSUMER_GC_SECONDS = 3600.0  # drop group consumers idle this long with nothing pending


class RedisRelayActor(TypedActor):
    """Owns this connection's Redis streams, roster hash and heartbeat.

    Args:
        settings: URL, claim idle, stream bound, heartbeat.
        guard: the turn claim shared with the runner wrapper (its consumer name is ours).
        config: bot_mode settings (TTL, reply budget, queue bound).
        dispatcher: where outcomes and drained envelopes go.
        roster: the RosterActor (told RemoteRows; we subscribe for our local rows).
        scheduler: timers.
        connection_id: this gateway's connection.
        local_profiles: folder ids of this root (a resumed envelope of another profile is named in the log: its
            profile was removed; every envelope in our sent hash is resumed).
        root: the Hermes root (where relayed-in turns mark their start, and their replies are kept until written).
        fsync: flush a kept reply to stable storage (as the start marks are: with the journal's fsync).
        stopping: set by the gateway's stop before the Dispatcher stops accepting (read here only): from then on
            no inbox entry is read or taken (each stays pending for the next start), as the file relay's ``inbox/``.
        start_probe: what the gateway's lease claim found: a Redis it found unreachable is not asked again by
            this start (default: nothing found yet).
    """

    def __init__(
        self,
        settings: rs.RedisSettings,
        *,
        guard: ClaimGuard,
        config: BotModeConfig,
        dispatcher: pykka.ActorRef[Any],
        roster: pykka.ActorRef[Any] | None,
        scheduler: Scheduler,
        connection_id: str,
        local_profiles: frozenset[str] = frozenset(),
        root: Path,
        fsync: bool = True,
        stopping: threading.Event | None = None,
        start_probe: StartProbe | None = None,
    ) -> None:
        super().__init__()
        self.start_probe = start_probe if start_probe is not None else StartProbe()
        self.stopping = stopping if stopping is not None else threading.Event()
        self.settings = settings
        self.guard = guard
        self.consumer = guard.consumer
        self.config = config
        self.roster = roster
        self.me = connection_id
        self.timers = self.own_timers(scheduler)
        self.counters = {"sent": 0, "replies": 0, "expired": 0, "timeouts": 0, "drained": 0, "quarantined": 0,
                         "reclaimed": 0, "ambiguous": 0, "deduped": 0, "refused_full": 0, "returned": 0}
        self.redis_link = RedisLink(settings, connection_id, on_down=self._report_unreachable)
        self.keys = self.redis_link.keys
        marks = InboxPaths.from_root(root)
        self.outbound = Outbound(self.redis_link, config=config, timers=self.timers, dispatcher=dispatcher,
                                 local_profiles=local_profiles, counters=self.counters, paths=marks, fsync=fsync)
        self.inbound = InboundDrain(self.redis_link, guard=guard, config=config, dispatcher=dispatcher,
                                    counters=self.counters, marks=marks, fsync=fsync,
                                    stopping=self.stopping)
        self.dispatcher = dispatcher
        self.reader: StreamReader | None = None
        self.inbox_room: InboxRoom | None = None
        self.heartbeat: Heartbeat | None = None
        self.profiles: tuple[ProfileInfo, ...] = ()
        self.published: dict[str, bytes] | None = None
        self.remote: list[RemoteAgent] = []
        self.known: dict[str, rs.KnownRoster] = {}  # each other connection's roster as last shown
        self.bad_keys: set[str] = set()  # keys of the wrong type the remote roster skips (logged once each)
        self.due = {"heartbeat": 0.0, "reclaim": 0.0, "gc": time.monotonic() + CONSUMER_GC_SECONDS, "probe": 0.0}
        # None: not yet since the start. The first timer tick sweeps, not on_start: the start never waits for it
        self.last_housekeep: float | None = None

    # ── lifetime ────────────────────────────────────────────────────────────

    def on_start(self) -> None:
        logger.info("redis transport: {} as connection {} (consumer {})",
                    self.settings.masked_url, self.me, self.consumer)
        if self.roster is not None:
            try:
                snapshot = ask(self.roster, Subscribe(self.actor_ref), timeout=10, expect=RosterSnapshot)
                self.profiles = tuple(snapshot.profiles)
            except (ActorGone, AskTimeout) as exc:
                logger.warning("redis: could not subscribe to the roster: {}", exc)
        # The start's Redis calls stop at the first that finds Redis unreachable (the lease claim's, or one of the
        # three below): against a Redis that never answers each waited its answer timeout, one after the other.
        link, probe = self.redis_link, self.start_probe
        if probe.error is not None:
            link.unreachable(probe.error)
        self.inbound.load_owed()  # replies a previous run owed: written by the ticks once their key is a stream
        # Liveness from its own thread: it must not starve behind a burst in this mailbox.
        self.heartbeat = Heartbeat(self.settings, self.keys, self.me, self.consumer,
                                   owner_alive=self.actor_ref.is_alive).start(beat_now=not link.down)
        if self.heartbeat.start_error is not None:
            link.unreachable(self.heartbeat.start_error)
        if link.down:  # the ticks probe it, the first one a tick from now
            self.due["probe"] = time.monotonic() + self.settings.tick_seconds
        else:
            self._periodic()
        heartbeat, stopping = self.heartbeat, self.stopping
        # closed: no beat has found our id's lease ours yet (a start that found Redis unreachable made none), a
        # second process holds it, or we stop
        room = InboxRoom(self.config.max_queued, lambda: len(self.inbound.flights),
                         closed=lambda: not heartbeat.lease_ours or stopping.is_set(), stopping=stopping.is_set)
        self.inbox_room = room
        self.reader = StreamReader(self.settings, self.keys, self.me, self.consumer, self.actor_ref,
                                   room=room).start()
        self.timers.every(self.settings.tick_seconds, RedisTick())

    def on_stop(self) -> None:
        if self.counters["returned"]:  # a warning: their senders wait until a consumer of this connection runs
            logger.warning("redis: {} relayed-in entr(ies) never started and stay pending in our inbox for the next "
                           "start", self.counters["returned"])
        # Both threads are told first and waited for together, so a Redis that does not answer costs one wait,
        # not one per thread. The heartbeat first: its key removal (a clean stop is offline at once, not at the
        # expiry) gets the most of the wait; a reader still reading then leaves what it reads pending in Redis.
        threads = [thread for thread in (self.heartbeat, self.reader) if thread is not None]
        stop_threads(threads, stop_wait_seconds(self.settings.block_ms))
        self.guard.close()
        self.redis_link.close()

    # ── our envelopes ───────────────────────────────────────────────────────

    @handles(RelaySend)
    def _on_send(self, msg: RelaySend) -> dict[str, Any]:
        """Publish the envelope; the ack or refusal goes back to the Dispatcher as ``RelayAccepted``."""
        route = msg.route
        return self.outbound.send(route.target, route.sender, route.content, msg.delivery.hop, route.label,
                                  wake=msg.delivery.wake)

    @handles(PeerSend)
    def _on_peer_send(self, msg: PeerSend) -> dict[str, Any] | None:
        """A ``bot_peers`` DM: the ack or refusal, or None when the peer is not on this Redis (the CLI carries it)."""
        return self.outbound.send_to_peer(msg.route, self.remote, msg.delivery.hop)

    def _resume(self) -> None:
        """Wait again for the replies of our envelopes in flight before a restart (Redis errors propagate).

        A reply that reached our stream before the restart, unacked (its outcome was not journaled yet),
        is pending for the dead process's consumer: it is taken now, not a claim idle (60 s) later, when
        a resumed reply deadline may already have reported a DM that was answered as timed out.
        """
        entries = self.outbound.resume()
        # Told even when empty: the full list settles the journaled Redis DMs Redis no longer holds (a Dispatcher
        # gone, a stop: the next start resumes them again)
        tell(self.dispatcher, RelayResumed(entries))
        # Only this process reads our stream (the lease): every entry pending on it is a dead run's.
        self._reclaim(kinds=("replies",), idle_ms=0)

    @handles(ResumeRelay)
    def _on_resume_relay(self, msg: ResumeRelay) -> tuple[ResumedSend, ...] | None:
        """Resume now if ``on_start`` could not (Redis was down); the resumed entries, None while unreachable.

        Not tried while the last probe found Redis down (a moment ago, in ``on_start``): against a Redis that
        does not answer it would hold the start one more command timeout; the tick resumes once Redis answers.
        """
        if self.redis_link.down:
            return None
        if not self.outbound.resumed:
            try:
                self._resume()
            except Exception as exc:
                self.redis_link.unreachable(exc)
                return None
        return self.outbound.take_resumed()

    @handles(TtlDeadline)
    def _on_ttl(self, msg: TtlDeadline) -> None:
        self.outbound.expire(msg.envelope_id)

    @handles(ReplyDeadline)
    def _on_reply_deadline(self, msg: ReplyDeadline) -> None:
        self.outbound.reply_deadline(msg.envelope_id)

    # ── the streams ─────────────────────────────────────────────────────────

    @handles(RedisEntries)
    def _on_entries(self, msg: RedisEntries) -> None:
        try:
            for entry_id, fields in msg.entries:
                if msg.stream == "in":
                    self.inbound.on_entry(entry_id, fields)
                else:
                    self.outbound.on_reply_entry(entry_id, fields)
        finally:
            if msg.read and msg.stream == "in" and self.inbox_room is not None:
                self.inbox_room.handled(len(msg.entries))

    @handles(ForgetSent)
    def _on_forget_sent(self, msg: ForgetSent) -> None:
        self.outbound.forget(msg.envelope_id)

    @handles(RelayOutcome)
    def _on_relay_outcome(self, msg: RelayOutcome) -> None:
        self.inbound.on_outcome(msg.outcome, put_back=msg.put_back)

    # ── roster and periodic work ────────────────────────────────────────────

    def _report_unreachable(self) -> None:
        """Redis just went down: DMs to other machines are refused "unreachable", not "no teammate"."""
        if self.roster is not None:
            tell(self.roster, RemoteRows(tuple(self.remote), time.time(), unreachable=self.settings.address))

    @handles(RosterChanged)
    def _on_roster_changed(self, msg: RosterChanged) -> None:
        if msg.snapshot.profiles != self.profiles:
            self.profiles = tuple(msg.snapshot.profiles)
            self.due["heartbeat"] = 0.0  # publish the new rows at the next tick

    @handles(RedisTick)
    def _on_tick(self, msg: RedisTick) -> None:
        self._housekeep_if_due()  # first: it needs no Redis, so an outage does not put it off
        self._periodic()

    def _housekeep_if_due(self) -> None:
        """Housekeeping on the tick, as the file relay's: at the first tick after the start, then hourly.

        A failure is logged and the next try waits its hour: it never stops the transport.
        """
        if not housekeeping_due(self.last_housekeep, time.monotonic()):
            return
        try:
            self._sweep()
        except Exception:  # a sweep's own bug must not stop the transport (nor be retried at every tick)
            self.last_housekeep = time.monotonic()
            logger.exception("redis: housekeeping failed; the transport goes on")

    def _periodic(self) -> None:
        """The Redis work of one tick (roster, touch, reclaim, retries, consumer GC); Redis errors end it early.

        While Redis is down it is probed at most once a tick after the last probe ended: a Redis that does
        not answer holds each probe for the command timeout, and the ticks queued meanwhile must not each
        wait again (they piled up, and a stats ask behind them hung).
        """
        now = time.monotonic()
        link = self.redis_link
        if link.down and now < self.due["probe"]:
            return
        try:
            link.client.ping()
        except Exception as exc:
            link.unreachable(exc)
            self.due["probe"] = time.monotonic() + self.settings.tick_seconds
            return
        if link.back_up():
            self.due["heartbeat"] = 0.0  # read the remote roster now: it also clears "unreachable" in the roster
        try:
            if not link.groups_ok:  # checked again at each tick while a key holds another type
                link.wrong_type = set(ensure_groups(link.client, [self.keys.inbox(self.me),
                                                                  self.keys.replies(self.me)]))
                link.groups_ok = not link.wrong_type
            if not self.outbound.resumed:
                self._resume()
            self.outbound.confirm_unconfirmed()  # sends Redis did not answer: queued now unless they are
            self.inbound.retry_unwritten()
            if link.down:
                return
            self._touch()
            if now >= self.due["heartbeat"]:
                self._publish_roster()
                self.due["heartbeat"] = now + self.settings.heartbeat_seconds
            if now >= self.due["reclaim"]:
                # until a beat found our connection id's lease ours the inbox may be another process's: replies
                self._reclaim(kinds=("in", "replies") if self.heartbeat is not None and self.heartbeat.lease_ours
                              else ("replies",))
                self.due["reclaim"] = now + self.settings.claim_idle_seconds / 2
            self.outbound.retry_expiries()
            self.outbound.retry_forgets()
            if now >= self.due["gc"]:
                self.due["gc"] = now + CONSUMER_GC_SECONDS
                self._gc_consumers()
        except Exception as exc:  # never crash the transport: the next tick retries
            link.unreachable(exc)

    def _publish_roster(self) -> None:
        """Publish our roster rows and read the peers' (liveness itself is the Heartbeat thread's)."""
        rows = rs.local_roster_rows(self.profiles, self.me, self.settings.connection_label)
        client, roster_key = self.redis_link.client, self.keys.roster(self.me)
        changed = rows != self.published
        # Unchanged rows are only kept alive; EXPIRE answers 0 for a key that is gone (a Redis restarted empty,
        # flushed or failed over): then they are written again, on the one write path below. Asked whenever we
        # had published rows, changed or not: it also tells the remote read that Redis lost its data.
        lost = bool(self.published) and not client.expire(roster_key, rs.ROSTER_KEEP_SECONDS)
        if lost:
            logger.warning("redis: the roster of {} was gone from Redis (restarted empty, flushed?); published it "
                           "again", self.me)
            changed = True
        if changed:
            pipe = client.pipeline(transaction=True)
            pipe.delete(roster_key)
            if rows:
                pipe.hset(roster_key, mapping=rows)
                pipe.expire(roster_key, rs.ROSTER_KEEP_SECONDS)
            pipe.execute()
        self.published = rows
        self._read_remote(lost=lost)

    def _read_remote(self, *, lost: bool = False) -> None:
        """Read every other connection's roster and liveness; tell the roster.

        Args:
            lost: our own roster key was gone (Redis lost its data): the rosters that vanished with it are
                kept, offline, until their gateways publish them again (:func:`rs.remembered_rosters`).
        """
        client = self.redis_link.client
        connections = []
        for raw in client.scan_iter(match=self.keys.roster_pattern, count=1000):
            conn = self.keys.roster_connection(as_text(raw) or "")
            if conn is not None and conn != self.me:
                connections.append(conn)
        pipe = client.pipeline(transaction=False)
        for conn in connections:
            pipe.hgetall(self.keys.roster(conn))
            pipe.type(self.keys.alive(conn))
            pipe.pttl(self.keys.roster(conn))
        # A command's error comes back in its place (a key of the wrong type fails only its own read):
        # an unreachable Redis still raises.
        answers = pipe.execute(raise_on_error=False) if connections else []
        now = time.time()
        present, problems = rs.read_remote_answers(self.keys, connections, answers, now)
        self._warn_bad_keys(problems)
        remembered = rs.remembered_rosters(self.known, present.keys(), lost=lost, now=now)
        newly = sorted(conn for conn in remembered if not self.known[conn].remembered)
        if newly:
            logger.warning("redis: the roster of {} vanished with ours (Redis lost its data): its agents stay listed, "
                           "offline (DMs to them are refused, NOT queued), until its gateway publishes it again",
                           ", ".join(newly))
        self.known = {**present, **remembered}
        rows = sorted((row for known in self.known.values() for row in known.rows),
                      key=lambda r: (r.connection_id, r.profile))
        self.remote = rows
        if self.roster is not None:
            tell(self.roster, RemoteRows(tuple(rows), time.time()))

    def _warn_bad_keys(self, problems: dict[str, str]) -> None:
        """Log each key of the wrong type once while it lasts (the roster is read every heartbeat), and its fix."""
        for key in sorted(problems.keys() - self.bad_keys):
            logger.warning("redis: {}", problems[key])
        for key in sorted(self.bad_keys - problems.keys()):
            logger.info("redis: {} is readable again", key)
        self.bad_keys = set(problems)

    def _touch(self) -> None:
        """Reset the idle time of the entries we hold, so no live consumer's work is reclaimed."""
        ids = self.inbound.held_entry_ids()
        if ids and self.keys.inbox(self.me) not in self.redis_link.wrong_type:
            self.redis_link.client.xclaim(self.keys.inbox(self.me), rs.GROUP, self.consumer, 0, ids, justid=True)

    def _reclaim(self, kinds: tuple[str, ...] = ("in", "replies"), idle_ms: int | None = None) -> None:
        """XAUTOCLAIM what a dead (or stuck) consumer held longer than ``idle_ms`` (default: the claim idle);
        handle it as new."""
        if idle_ms is None:
            idle_ms = max(1, int(self.settings.claim_idle_seconds * 1000))
        streams = {"in": self.keys.inbox(self.me), "replies": self.keys.replies(self.me)}
        for kind, stream in ((kind, streams[kind]) for kind in kinds
                             if streams[kind] not in self.redis_link.wrong_type):
            start = "0-0"
            for _ in range(10):  # at most 1000 entries per tick
                answer = self.redis_link.client.xautoclaim(stream, rs.GROUP, self.consumer, idle_ms, start_id=start,
                                                     count=100)
                start = as_text(answer[0]) or "0-0"
                entries = [(as_text(i) or "", dict(f)) for i, f in answer[1] if f is not None]
                if len(answer) > 2 and answer[2]:
                    # hermes-actors never trims or deletes an unhandled entry: something else did (an XTRIM or
                    # XDEL by hand, or an older hermes-actors that capped streams with MAXLEN).
                    logger.warning("redis: {} pending entr(ies) of {} were deleted from the stream before they were "
                                   "handled (not by hermes-actors: an XTRIM/XDEL from elsewhere); they are lost",
                                   len(answer[2]), stream)
                if entries:
                    self.counters["reclaimed"] += len(entries)
                    self._on_entries(RedisEntries(kind, tuple(entries)))
                if start == "0-0":
                    break

    def _gc_consumers(self) -> None:
        client = self.redis_link.client
        for stream in (self.keys.inbox(self.me), self.keys.replies(self.me)):
            if stream in self.redis_link.wrong_type:
                continue
            for info in client.xinfo_consumers(stream, rs.GROUP):
                name = as_text(info.get("name")) or ""
                if name != self.consumer and not info.get("pending") and \
                        info.get("idle", 0) > CONSUMER_GC_SECONDS * 1000:
                    client.xgroup_delconsumer(stream, rs.GROUP, name)

    @handles(Housekeep)
    def _on_housekeep(self, msg: Housekeep) -> int:
        """``Gateway.housekeep()``: sweep now; returns the count removed (the next scheduled sweep is an hour on)."""
        return self._sweep()

    def _sweep(self) -> int:
        """Sweep orphaned DM files and the start marks nothing needs (:meth:`InboundDrain.sweep_marks`; Redis
        keys expire on their own); returns the count removed.

        Raises:
            Exception: whatever the sweep raised (the tick logs it; ``Gateway.housekeep()`` gets it).
        """
        from hermes_actors.local.dm_files import cleanup_bot_dm_cache

        self.last_housekeep = time.monotonic()
        removed = self.inbound.sweep_marks(now=time.time())
        removed += cleanup_bot_dm_cache()
        if removed:
            logger.info("redis: housekeeping removed {} stale file(s)", removed)
        return removed

    def stats(self) -> dict[str, int]:
        """The counters, the gauges and ``reachable``: whether the last tick reached Redis (a bool: the
        ``hermes_actors_redis_up`` gauge and the status's ``relay.reachable``, not an event count)."""
        beats = self.heartbeat.beats if self.heartbeat is not None else 0
        return {**self.counters, "waiting": len(self.outbound.waiting), "inbound": len(self.inbound.flights),
                "unconfirmed": len(self.outbound.unconfirmed),
                "heartbeats": beats, "reachable": not self.redis_link.down}
