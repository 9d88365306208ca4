"""RedisRelayActor: the Redis Streams transport between gateways (DESIGN section 7).

A drop-in for the file relay's RelayActor: toward the Dispatcher it speaks the
same messages (``RelaySend`` → ack dict, ``OutcomeReady``, ``RelayDeliver``,
``RelayOutcome``, ``RelayResumed``) and the records are the relay's envelope
and reply records, orjson-serialized (key names: ``redis_store``).

The actor is split like the Dispatcher: :mod:`~hermes_actors.transports.redis.base`
declares the shared state, :mod:`~hermes_actors.transports.redis.send` is the
sender half (send, replies, TTL expiry, reply budget, resume after restart) and
this module the actor shell: lifecycle, roster/heartbeat, reclaim and the drain.

Drain side: the reader thread tells us each entry of ``<p>:in:<me>``. An
entry whose reply was written (``<p>:done:<id>``) is only acked; an expired one
gets the ``queued_expired`` reply; one whose turn a dead consumer claimed gets
an ``ambiguous`` reply (never a second turn); everything else goes to the
Dispatcher. The reply, the ``done`` mark and ``XACK`` + ``XDEL`` of the entry are
one ``MULTI``: the entry is acked exactly when its reply is in Redis. Entries
of a consumer that died are recovered by ``XAUTOCLAIM`` after
``redis_claim_idle_seconds``; live consumers keep theirs fresh with ``XCLAIM``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import pykka
from loguru import logger

from actors import ActorGone, AskTimeout, Scheduler, ask, handles
from hermes_actors.core.config import BotModeConfig
from hermes_actors.errors import ValidationError
from hermes_actors.messages import (
    Housekeep,
    ProfileInfo,
    RedisEntries,
    RedisTick,
    RelayDeliver,
    RelayOutcome,
    RemoteAgent,
    RemoteRows,
    RosterChanged,
    RosterSnapshot,
    Subscribe,
    TtlDeadline,
)
from hermes_actors.relay.relay_actor import reply_from_outcome
from hermes_actors.store.relay_protocol import expired_error_text, is_expired, make_reply
from hermes_actors.transports.redis import store as rs
from hermes_actors.transports.redis.base import Inbound, Waiting, as_text
from hermes_actors.transports.redis.heartbeat import Heartbeat
from hermes_actors.transports.redis.io import ClaimGuard, StreamReader, ensure_groups, make_client
from hermes_actors.transports.redis.send import SEND_LUA, RedisSend

__all__ = ["ClaimGuard", "RedisRelayActor"]

CONSUMER_GC_SECONDS = 3600.0  # drop group consumers idle this long with nothing pending


class RedisRelayActor(RedisSend):
    """Owns this connection's Redis streams, roster hash and heartbeat.

    Args:
        settings: URL, claim idle, stream bound, heartbeat.
        guard: the turn claim shared with the runner wrapper (its consumer name is ours).
        config: bot_mode settings (TTL, reply budget, queue bound).
        dispatcher: where outcomes and drained envelopes go.
        roster: the RosterActor (told RemoteRows; we subscribe for our local rows).
        scheduler: timers.
        connection_id: this gateway's connection.
        local_profiles: folder ids of this root (to resume only our own envelopes).
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
    ) -> None:
        super().__init__()
        self.settings = settings
        self.keys = rs.RedisKeys(settings.prefix)
        self.guard = guard
        self.consumer = guard.consumer
        self.config = config
        self.dispatcher = dispatcher
        self.roster = roster
        self.timers = self.own_timers(scheduler)
        self.me = connection_id
        self.local_profiles = local_profiles
        self.client: Any = make_client(settings.url)
        self.send_script = self.client.register_script(SEND_LUA)
        self.reader: StreamReader | None = None
        self.heartbeat: Heartbeat | None = None
        self.waiting: dict[str, Waiting] = {}
        self.expire_due: set[str] = set()
        self.inbound: dict[str, Inbound] = {}
        self.reported: OrderedDict[str, None] = OrderedDict()
        self.profiles: tuple[ProfileInfo, ...] = ()
        self.published: dict[str, bytes] | None = None
        self.remote: list[RemoteAgent] = []
        self.resumed = False
        self.resumed_entries = ()
        self.down = False
        self.groups_ok = False
        self.due = {"heartbeat": 0.0, "reclaim": 0.0, "gc": time.monotonic() + CONSUMER_GC_SECONDS}
        self.counters = {"sent": 0, "replies": 0, "expired": 0, "timeouts": 0, "drained": 0, "quarantined": 0,
                         "reclaimed": 0, "ambiguous": 0, "deduped": 0, "refused_full": 0}

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
        # Liveness from its own thread: it must not starve behind a burst in this mailbox.
        self.heartbeat = Heartbeat(self.settings, self.keys, self.me, self.consumer,
                                   owner_alive=self.actor_ref.is_alive).start()
        self._on_tick(RedisTick())
        self.reader = StreamReader(self.settings, self.keys, self.me, self.consumer, self.actor_ref,
                                   paused=self._paused).start()
        self.timers.every(self.settings.tick_seconds, RedisTick())

    def on_stop(self) -> None:
        if self.reader is not None:
            self.reader.stop()
        if self.heartbeat is not None:
            self.heartbeat.stop(delete=True)  # a clean stop is offline at once (no waiting for the expiry)
        self.guard.close()
        self.client.close()

    def _paused(self) -> bool:
        return len(self.inbound) >= self.config.max_queued

    # ── drain side ──────────────────────────────────────────────────────────

    @handles(RedisEntries)
    def _on_entries(self, msg: RedisEntries) -> None:
        for entry_id, fields in msg.entries:
            if msg.stream == "in":
                self._on_in_entry(entry_id, fields)
            else:
                self._on_reply_entry(entry_id, fields)

    def _on_in_entry(self, entry_id: str, fields: dict[Any, Any]) -> None:
        inbox = self.keys.inbox(self.me)
        try:
            envelope, reply_to = rs.decode_envelope_entry(fields)
        except ValidationError as exc:
            logger.warning("redis: dropping a malformed inbox entry {}: {}", entry_id, exc)
            self.counters["quarantined"] += 1
            self._ack(inbox, [entry_id])
            return
        envelope_id = envelope["id"]
        if envelope["target_connection"] != self.me:  # in our stream but not addressed to us: never run it
            logger.warning("redis: entry {} is addressed to {!r}, not {!r}; dropped",
                           entry_id, envelope["target_connection"], self.me)
            self.counters["quarantined"] += 1
            self._ack(inbox, [entry_id])
            return
        flight = self.inbound.get(envelope_id)
        if flight is not None:  # already ours (re-offered, or a duplicate XADD): acked with the first
            flight.entry_ids.add(entry_id)
            return
        try:
            done, holder = self.client.mget(self.keys.done(envelope_id), self.keys.claim(envelope_id))
            holder = as_text(holder) or ""
            holder_alive = holder not in ("", rs.EXPIRED_CLAIM, self.consumer) and \
                bool(self.client.exists(self.keys.consumer_alive(holder)))
        except Exception as exc:
            self._unreachable(exc)
            return  # stays in our pending list; re-offered by XAUTOCLAIM after the claim idle
        if done or holder == rs.EXPIRED_CLAIM:
            self.counters["deduped"] += 1
            self._ack(inbox, [entry_id])  # already answered (or expired by its sender): never a second turn
            return
        if holder_alive:
            return  # a live consumer runs it and will ack it; if it dies, a later reclaim decides
        label = f"@{envelope['target_handle']}"
        flight = self.inbound[envelope_id] = Inbound(reply_to, {entry_id})
        if holder and holder != self.consumer:
            self.counters["ambiguous"] += 1
            why = (f"The gateway process that was running this turn ({holder}) died before it replied. "
                   "The message may have been delivered — do not resend.")
            self._settle_inbound(envelope_id, make_reply(envelope_id, error=why, reason="ambiguous", now=time.time()))
            return
        ttl = self.config.envelope_ttl_seconds
        if ttl > 0 and is_expired(envelope, ttl, time.time()):
            text = expired_error_text(envelope["target_handle"], envelope["target_connection"], ttl)
            try:
                won = self.client.set(self.keys.claim(envelope_id), rs.EXPIRED_CLAIM, nx=True,
                                      ex=rs.DONE_KEEP_SECONDS)
            except Exception as exc:
                self._unreachable(exc)
                del self.inbound[envelope_id]
                return
            if won:
                self._settle_inbound(envelope_id, make_reply(envelope_id, error=text, reason="queued_expired",
                                                             now=time.time()))
            else:  # someone claimed it meanwhile: the next offer decides
                del self.inbound[envelope_id]
            return
        self.counters["drained"] += 1
        self.guard.admit(envelope_id, envelope["target_handle"], envelope["target_connection"])
        self.dispatcher.tell(RelayDeliver(envelope, flight.reply_to))
        logger.debug("redis: delivering {} ({})", envelope_id, label)

    @handles(RelayOutcome)
    def _on_relay_outcome(self, msg: RelayOutcome) -> None:
        envelope_id = msg.outcome.delivery_id
        flight = self.inbound.get(envelope_id)
        if flight is None:  # we write replies only for envelopes addressed to us that we took
            logger.debug("redis: outcome for {} which this consumer does not hold; not replying", envelope_id)
            return
        verdict = self.guard.verdict(envelope_id)
        if verdict == "lost":  # another consumer runs it: it replies and acks; nothing from us
            del self.inbound[envelope_id]
            self.guard.forget(envelope_id)
            return
        if verdict == "expired":  # its sender already reported queued_expired
            del self.inbound[envelope_id]
            self.guard.forget(envelope_id)
            self._ack(self.keys.inbox(self.me), sorted(flight.entry_ids))
            return
        outcome = msg.outcome
        if outcome.status == "ambiguous":
            record = make_reply(envelope_id, error=outcome.error, reason="ambiguous", now=time.time())
        else:
            record = make_reply(envelope_id, now=time.time(), **reply_from_outcome(outcome))
        self._settle_inbound(envelope_id, record)

    def _settle_inbound(self, envelope_id: str, record: dict[str, Any]) -> None:
        """Write the reply, mark done, XACK + XDEL the entries: one MULTI. Retried at each tick on failure."""
        flight = self.inbound[envelope_id]
        flight.record = record
        if self.down:
            return  # written by the tick once Redis answers again
        inbox = self.keys.inbox(self.me)
        ids = sorted(flight.entry_ids)
        try:
            pipe = self.client.pipeline(transaction=True)
            pipe.xadd(self.keys.replies(flight.reply_to), rs.encode_reply_entry(record),
                      maxlen=self.settings.max_stream_len, approximate=True)
            pipe.set(self.keys.done(envelope_id), b"1", ex=rs.DONE_KEEP_SECONDS)
            pipe.xack(inbox, rs.GROUP, *ids)
            pipe.xdel(inbox, *ids)
            pipe.execute()
        except Exception as exc:
            self._unreachable(exc)
            return
        del self.inbound[envelope_id]
        self.guard.forget(envelope_id)

    # ── periodic work ───────────────────────────────────────────────────────

    @handles(RosterChanged)
    def _on_roster_changed(self, msg: RosterChanged) -> None:
        if msg.snapshot.profiles != self.profiles:
            self.profiles = tuple(msg.snapshot.profiles)
            self.due["heartbeat"] = 0.0  # publish the new rows at the next tick

    @handles(RedisTick)
    def _on_tick(self, msg: RedisTick) -> None:
        now = time.monotonic()
        try:
            self.client.ping()
        except Exception as exc:
            self._unreachable(exc)
            return
        if self.down:
            self.down = False
            self.due["heartbeat"] = 0.0  # read the remote roster now: it also clears "unreachable" in the roster
            logger.info("redis: {} is reachable again", self.settings.address)
        try:
            if not self.groups_ok:
                ensure_groups(self.client, [self.keys.inbox(self.me), self.keys.replies(self.me)])
                self.groups_ok = True
            if not self.resumed:
                self._resume()
            for envelope_id in [e for e, f in self.inbound.items() if f.record is not None]:
                record = self.inbound[envelope_id].record
                assert record is not None
                self._settle_inbound(envelope_id, record)
                if self.down:
                    return
            self._touch()
            if now >= self.due["heartbeat"]:
                self._heartbeat()
                self.due["heartbeat"] = now + self.settings.heartbeat_seconds
            if now >= self.due["reclaim"]:
                self._reclaim()
                self.due["reclaim"] = now + self.settings.claim_idle_seconds / 2
            for envelope_id in list(self.expire_due):
                self._on_ttl(TtlDeadline(envelope_id))
            if now >= self.due["gc"]:
                self.due["gc"] = now + CONSUMER_GC_SECONDS
                self._gc_consumers()
        except Exception as exc:  # never crash the transport: the next tick retries
            self._unreachable(exc)
            if "NOGROUP" in str(exc):
                self.groups_ok = False

    def _heartbeat(self) -> None:
        """Publish our roster rows and read the peers' (liveness itself is the Heartbeat thread's)."""
        rows = rs.local_roster_rows(self.profiles, self.me, self.settings.connection_label)
        pipe = self.client.pipeline(transaction=True)
        roster_key = self.keys.roster(self.me)
        if rows != self.published:
            pipe.delete(roster_key)
            if rows:
                pipe.hset(roster_key, mapping=rows)
        pipe.expire(roster_key, rs.ROSTER_KEEP_SECONDS)
        pipe.execute()
        self.published = rows
        self._read_remote()

    def _read_remote(self) -> None:
        connections = []
        for raw in self.client.scan_iter(match=self.keys.roster_pattern, count=1000):
            conn = self.keys.roster_connection(as_text(raw) or "")
            if conn is not None and conn != self.me:
                connections.append(conn)
        pipe = self.client.pipeline(transaction=False)
        for conn in connections:
            pipe.hgetall(self.keys.roster(conn))
            pipe.exists(self.keys.alive(conn))
        answers = pipe.execute() if connections else []
        rows: list[RemoteAgent] = []
        for i, conn in enumerate(connections):
            rows += rs.parse_remote_rows(conn, answers[2 * i], bool(answers[2 * i + 1]))
        rows.sort(key=lambda r: (r.connection_id, r.profile))
        self.remote = rows
        if self.roster is not None:
            self.roster.tell(RemoteRows(tuple(rows), time.time()))

    def _touch(self) -> None:
        """Reset the idle time of the entries we hold, so no live consumer's work is reclaimed."""
        ids = sorted({i for f in self.inbound.values() for i in f.entry_ids})
        if ids:
            self.client.xclaim(self.keys.inbox(self.me), rs.GROUP, self.consumer, 0, ids, justid=True)

    def _reclaim(self) -> None:
        """XAUTOCLAIM what a dead (or stuck) consumer held longer than the claim idle; handle it as new."""
        idle_ms = max(1, int(self.settings.claim_idle_seconds * 1000))
        for kind, stream in (("in", self.keys.inbox(self.me)), ("replies", self.keys.replies(self.me))):
            start = "0-0"
            for _ in range(10):  # at most 1000 entries per tick
                answer = self.client.xautoclaim(stream, rs.GROUP, self.consumer, idle_ms, start_id=start, count=100)
                start = as_text(answer[0]) or "0-0"
                entries = [(as_text(i) or "", dict(f)) for i, f in answer[1] if f is not None]
                if len(answer) > 2 and answer[2]:
                    logger.warning("redis: {} pending entr(ies) of {} were trimmed before they were handled "
                                   "(the stream exceeded redis_max_stream_len); they are lost", len(answer[2]), stream)
                if entries:
                    self.counters["reclaimed"] += len(entries)
                    self._on_entries(RedisEntries(kind, tuple(entries)))
                if start == "0-0":
                    break

    def _gc_consumers(self) -> None:
        for stream in (self.keys.inbox(self.me), self.keys.replies(self.me)):
            for info in self.client.xinfo_consumers(stream, rs.GROUP):
                name = as_text(info.get("name")) or ""
                if name != self.consumer and not info.get("pending") and \
                        info.get("idle", 0) > CONSUMER_GC_SECONDS * 1000:
                    self.client.xgroup_delconsumer(stream, rs.GROUP, name)

    @handles(Housekeep)
    def _on_housekeep(self, msg: Housekeep) -> int:
        """Sweep orphaned DM files (Redis keys expire on their own); returns the count removed."""
        from hermes_actors.local.dm_files import cleanup_bot_dm_cache

        return cleanup_bot_dm_cache()

    def stats(self) -> dict[str, int]:
        beats = self.heartbeat.beats if self.heartbeat is not None else 0
        return {**self.counters, "waiting": len(self.waiting), "inbound": len(self.inbound), "heartbeats": beats}
