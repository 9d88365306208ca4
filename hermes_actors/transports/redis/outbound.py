"""Our envelopes on Redis, from the ack to their outcome (the RedisRelayActor's sender half).

One Lua call checks the target stream's backlog (``target_busy`` past
``redis_max_stream_len``), ``XADD``s the envelope and records it in
``<p>:sent:<me>`` — all before the ack. The check is the bound: the script runs
atomically, so no concurrent sender overshoots it, and nothing is trimmed (a
trimmed entry would be an acked DM lost unread). The reply arrives on
``<p>:replies:<me>``; the reply budget gives ``delivery_timeout``; at the TTL
the sender expires its own envelope by winning ``SET <p>:claim:<id> expired NX``.
After a restart the envelopes still in ``<p>:sent:<me>`` are waited for again.

A send that Redis did not answer after the script was written (a read timeout, the connection
lost: a hung or stalled Redis) may have queued it, or may still queue it when Redis resumes: it is
acked, not refused, and kept *unconfirmed* (in memory and in ``bot_relay/unconfirmed/<id>.json``
on the root, before the ack) until Redis answers again; then the same script runs again, which
queues it only if neither its ``sent`` record nor its turn claim is in Redis (the script is
idempotent on the envelope id). Only a send that failed before the script was written whole
(connecting, writing), or while Redis is known to be down, is refused "NOT queued".

:class:`Outbound` is a plain object composed into the actor and called on its
thread; it reports each outcome to the Dispatcher (``RelayedOutcome``) and forgets the envelope
once told (``ForgetSent``).
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pykka
from loguru import logger

from actors import TimerHandle, TimerSet, tell
from hermes_actors.core import outcomes
from hermes_actors.core.acks import ack_payload
from hermes_actors.core.config import BotModeConfig
from hermes_actors.core.guard import check_relay_hop
from hermes_actors.core.ids import id_of_file_name, validate_delivery_id
from hermes_actors.core.names import HANDLE_RE
from hermes_actors.core.targets import PeerRoute, Refusal, transport_unreachable_text
from hermes_actors.errors import HostileFileError, StoreError, ValidationError
from hermes_actors.messages import (
    Outcome,
    ProfileInfo,
    RelayedOutcome,
    RemoteAgent,
    ReplyDeadline,
    ResumedSend,
    TtlDeadline,
)
from hermes_actors.store.atomic import read_json_file
from hermes_actors.store.private_dir import ensure_private_dir
from hermes_actors.store.relay_dirfd import relay_dir
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.store.relay_marks import drop_mark, write_mark
from hermes_actors.store.relay_protocol import expired_error_text, make_envelope, parse_envelope
from hermes_actors.store.relay_quarantine import quarantine
from hermes_actors.store.relay_roster import offline_error_text
from hermes_actors.store.relay_sent import recorded_sender
from hermes_actors.transports.redis import store as rs
from hermes_actors.transports.redis.link import RedisLink, Unanswered, as_text

__all__ = ["REPORTED_KEEP", "SEND_LUA", "UNCONFIRMED_DIR", "Outbound", "SendCall", "Waiting"]

UNCONFIRMED_DIR = rs.UNCONFIRMED_DIR
UNCONFIRMED_MAX_BYTES = 4 * 1024 * 1024

REPORTED_KEEP = 100_000
FORGET_DUE_MAX = 100_000  # outcomes kept whose drop waits for Redis: past it the oldest is left to the next start

#: KEYS: target inbox, our sent hash, the envelope's turn claim, its ``done:`` mark; ARGV: stream bound, envelope,
#: reply_to, envelope id, sent meta.
#: Redis does not undo a script's earlier writes when a later command fails, so a refusal must leave nothing
#: queued: both keys' types are checked before anything is written, and an envelope whose ``sent`` record could
#: not be written after all is deleted again (a queued envelope its sender was told "Nothing was sent" about
#: would run a turn nobody waits for). Idempotent on the envelope id: an envelope whose ``sent`` record, turn
#: claim or ``done:`` mark is there was queued already ({1, 'queued'}, nothing written), so a send whose answer
#: was lost may run again, and the first run, if Redis still runs it after the second, writes nothing (a target
#: that answered it without a turn claim, an envelope it refused, sets only ``done:``: once its sender has the
#: reply and dropped its ``sent`` record, that mark is all that says it was queued).
SEND_LUA = """
local inbox = redis.call('TYPE', KEYS[1])['ok']
if inbox ~= 'none' and inbox ~= 'stream' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a ' .. inbox .. ', not a stream')
end
local sent = redis.call('TYPE', KEYS[2])['ok']
if sent ~= 'none' and sent ~= 'hash' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[2] .. ' holds a ' .. sent .. ', not a hash')
end
if redis.call('HEXISTS', KEYS[2], ARGV[4]) == 1 or redis.call('EXISTS', KEYS[3], KEYS[4]) > 0 then
  return {1, 'queued'}
end
local n = redis.call('XLEN', KEYS[1])
if n >= tonumber(ARGV[1]) then return {0, n} end
local id = redis.call('XADD', KEYS[1], '*', 'envelope', ARGV[2], 'reply_to', ARGV[3])
local recorded = redis.pcall('HSET', KEYS[2], ARGV[4], ARGV[5])
if type(recorded) == 'table' and recorded['err'] then
  redis.call('XDEL', KEYS[1], id)
  return redis.error_reply(recorded['err'])
end
return {1, id}
"""


@dataclass(frozen=True)
class SendCall:
    """One run of :data:`SEND_LUA`: what queues one envelope (kept to run it again while unconfirmed)."""

    envelope_id: str
    target_connection: str
    envelope: bytes  # the orjson envelope (the stream entry's field)
    meta: bytes  # the sent record's meta (:func:`rs.sent_meta`)

    def record(self) -> dict[str, Any]:
        """The ``bot_relay/unconfirmed/<id>.json`` record."""
        return {"id": self.envelope_id, "target_connection": self.target_connection,
                "envelope": self.envelope.decode(), "meta": self.meta.decode()}

    @classmethod
    def from_record(cls, data: Any, *, file_id: str) -> SendCall:
        """Pure: the call back from its record, checked as :meth:`record` writes it.

        Args:
            data: the decoded ``bot_relay/unconfirmed/<id>.json``.
            file_id: its file name's stem.

        Returns:
            The call.

        Raises:
            ValidationError: not a record of a send of ours: the id not 32 lowercase hex or not its file's
                name, the target connection not a connection id, the envelope unparseable or of another id
                or target connection, the meta unreadable (a record only a hand or a bug could write, which
                would be queued again at every start and never settled).
        """
        if not isinstance(data, dict):
            raise ValidationError(f"not a JSON object: {type(data).__name__}")
        envelope_id = validate_delivery_id(data.get("id"), what="envelope id", file_id=file_id)
        conn, envelope, meta = (data.get(k) for k in ("target_connection", "envelope", "meta"))
        if not isinstance(conn, str) or not HANDLE_RE.match(conn):
            raise ValidationError(f"invalid target connection {conn!r}")
        if not isinstance(envelope, str) or not isinstance(meta, str):
            raise ValidationError("its envelope or meta is not a string")
        try:
            parsed = parse_envelope(orjson.loads(envelope))
        except orjson.JSONDecodeError as exc:
            raise ValidationError(f"its envelope is not JSON: {exc}") from exc
        if parsed["id"] != envelope_id or parsed.get("target_connection") != conn:
            raise ValidationError(f"its envelope ({parsed['id']!r} to {parsed.get('target_connection')!r}) is not "
                                  f"the record's ({envelope_id!r} to {conn!r})")
        if rs.parse_sent_meta(meta.encode()) is None:
            raise ValidationError("its sent meta is unreadable")
        return cls(envelope_id, conn, envelope.encode(), meta.encode())


@dataclass
class Waiting:
    """One of our envelopes awaiting its reply (with its reply-budget and TTL timers)."""

    label: str
    handle: str
    connection: str
    timers: list[TimerHandle]


class Outbound:
    """Our envelopes in flight on Redis.

    Args:
        link: the actor's Redis connection.
        config: TTL and reply budget.
        timers: the actor's timers (deadlines come back to the actor as messages).
        dispatcher: told ``RelayedOutcome`` for each envelope's outcome.
        local_profiles: folder ids of this root (a restart resumes every envelope of ours, and names those of
            a profile no longer on it).
        counters: the actor's counters (``sent``, ``replies``, ``expired``, ``timeouts``, ...).
        paths: the root's relay layout (``bot_relay/unconfirmed/`` keeps the sends Redis did not answer).
        fsync: flush those records to stable storage before the ack.
    """

    def __init__(self, link: RedisLink, *, config: BotModeConfig, timers: TimerSet,
                 dispatcher: pykka.ActorRef[Any], local_profiles: frozenset[str], counters: dict[str, int],
                 paths: InboxPaths, fsync: bool = True) -> None:
        self.link = link
        self.config = config
        self.timers = timers
        self.dispatcher = dispatcher
        self.local_profiles = local_profiles
        self.counters = counters
        self.send_script = link.client.register_script(SEND_LUA)
        self.paths = paths
        self.fsync = fsync
        self.unconfirmed: dict[str, SendCall] = {}  # acked, not answered by Redis: run again once it answers
        self.unconfirmed_kept: set[str] = set()  # those with a record on the root (dropped at forget)
        self.unconfirmed_told: set[str] = set()  # those whose "cannot queue it yet" was logged
        self.waiting: dict[str, Waiting] = {}
        self.expire_due: set[str] = set()  # TTL expiries that could not reach Redis: retried each tick
        self.forget_due: dict[str, list[str]] = {}  # outcomes kept whose sent record and reply entries Redis still has
        self.forget_refused = False  # a drop Redis refused (a command error) was logged: until one succeeds again
        self.forget_overflowed = False  # FORGET_DUE_MAX was reached and logged: until forget_due empties
        self.reported: OrderedDict[str, None] = OrderedDict()
        self.unforgotten: dict[str, list[str]] = {}  # reported, not yet kept by the Dispatcher: their reply entries
        self.resumed = False
        self.resumed_entries: tuple[ResumedSend, ...] = ()  # kept until the Gateway's ResumeRelay takes them

    # ── sending ─────────────────────────────────────────────────────────────

    def send(self, target: RemoteAgent, sender: ProfileInfo, content: str, hop: int, label: str, *,
             wake: bool | None = None) -> dict[str, Any]:
        """Queue one envelope; the ack dict, or a refusal dict (nothing queued). ``wake``: see ``Delivery.wake``.

        Refused "NOT queued" only when nothing reached Redis: Redis known down (a moment ago: the tick
        probes it again), or the send failed before its script was written. Acked, unconfirmed, when the
        script was written and no answer came (:meth:`confirm_unconfirmed` settles it once Redis answers).
        """
        refused = check_relay_hop(hop, label)  # the target drops an envelope whose hop it cannot accept
        if refused is not None:
            return refused.as_dict()
        unreachable = Refusal(transport_unreachable_text(label, self.link.settings.address), "runtime_offline")
        if self.link.down:  # not tried: each try would wait the answer timeout, and none was sent
            return unreachable.as_dict()
        envelope = make_envelope(target=target, message=content, sender_profile=sender.profile,
                                 sender_handle=sender.handle, now=time.time(), extra={"hop": hop})
        fields = rs.encode_envelope_entry(envelope, self.link.me)
        call = SendCall(envelope["id"], target.connection_id, fields["envelope"], rs.sent_meta(envelope, label, wake))
        try:
            ok, detail = self._run(call)
        except Unanswered as exc:
            if not self.link.unreachable(exc.cause) and not exc.written:
                return _not_queued(label, exc.cause)
            if not exc.written:
                return unreachable.as_dict()
            self._keep_unconfirmed(call, label, exc.cause)
        except Exception as exc:
            self.link.unreachable(exc)
            return _not_queued(label, exc)
        else:
            if not ok:
                self.counters["refused_full"] += 1
                return _busy(label, detail)
        self.counters["sent"] += 1
        self._wait_for(envelope["id"], label, target.handle, target.connection_id, age=0.0)
        return ack_payload(envelope["id"], label, now=envelope["created_at"])

    def _run(self, call: SendCall) -> tuple[int, Any]:
        """Run :data:`SEND_LUA` for ``call`` once (never retried): its answer ``(queued, detail)``.

        Raises:
            Unanswered: no answer (see :meth:`RedisLink.call_once`).
            redis.exceptions.ResponseError: the script refused (a key of the wrong type) or failed.
        """
        from redis.exceptions import NoScriptError

        keys = self.link.keys
        argv = (4, keys.inbox(call.target_connection), keys.sent(self.link.me), keys.claim(call.envelope_id),
                keys.done(call.envelope_id), self.link.settings.max_stream_len, call.envelope, self.link.me,
                call.envelope_id, call.meta)
        try:
            answer = self.link.call_once("EVALSHA", self.send_script.sha, *argv)
        except NoScriptError:  # not run: Redis does not have the script (yet, or any more)
            answer = self.link.call_once("EVAL", SEND_LUA, *argv)
        return int(answer[0]), answer[1]

    def _keep_unconfirmed(self, call: SendCall, label: str, cause: BaseException) -> None:
        """Remember a send whose script reached Redis unanswered, on the root too (a restart settles it)."""
        logger.warning("redis: no answer to the send of {} to {} ({}): Redis may have queued it, or may when it "
                       "resumes; acked, and checked once Redis answers (queued then if it was not)",
                       call.envelope_id, label, cause)
        self.unconfirmed[call.envelope_id] = call
        try:
            directory = self._unconfirmed_dir()
            write_mark(self.paths, directory, call.envelope_id, call.record(), fsync=self.fsync)
            self.unconfirmed_kept.add(call.envelope_id)
        except (OSError, StoreError, HostileFileError, ValidationError) as exc:
            logger.error("redis: the unconfirmed send of {} could not be kept in bot_relay/{}/ ({}): it is in memory "
                         "only, and a stop or crash of this gateway before Redis answers again may lose it",
                         call.envelope_id, UNCONFIRMED_DIR, exc)

    def _unconfirmed_dir(self) -> Path:
        directory = self.paths.relay.base / UNCONFIRMED_DIR
        self.paths.relay.ensure()
        ensure_private_dir(directory, within=self.paths.relay.root)
        return directory

    def confirm_unconfirmed(self) -> None:
        """Redis answers: settle each unconfirmed send by running its (idempotent) script again.

        Queued already or now: it is an envelope like any other (its reply awaited as before). A full
        target queue or a key of the wrong type: tried again at the next tick, until its reply budget or
        TTL ends it (``delivery_timeout``, ``queued_expired``). No answer again: the next tick.
        """
        for envelope_id, call in list(self.unconfirmed.items()):
            entry = self.waiting.get(envelope_id)
            if entry is None:  # settled meanwhile (its deadline): nothing more to queue
                self.unconfirmed.pop(envelope_id, None)
                continue
            try:
                ok, detail = self._run(call)
            except Unanswered as exc:
                self.link.unreachable(exc.cause)
                return
            except Exception as exc:
                self.link.unreachable(exc)
                self._cannot_queue_yet(envelope_id, entry.label, str(exc))
                continue
            if not ok:
                self._cannot_queue_yet(envelope_id, entry.label, f"its queue is full ({detail} DMs waiting)")
                continue
            logger.info("redis: the unconfirmed send of {} to {} is queued in Redis", envelope_id, entry.label)
            self.unconfirmed.pop(envelope_id, None)
            self.unconfirmed_told.discard(envelope_id)
            self._drop_unconfirmed(envelope_id)

    def _cannot_queue_yet(self, envelope_id: str, label: str, why: str) -> None:
        if envelope_id not in self.unconfirmed_told:
            self.unconfirmed_told.add(envelope_id)
            logger.warning("redis: the unconfirmed send of {} to {} is not in Redis and cannot be queued yet ({}); "
                           "tried again each tick until its reply budget ends it", envelope_id, label, why)

    def _drop_unconfirmed(self, envelope_id: str) -> None:
        if envelope_id in self.unconfirmed_kept:
            self.unconfirmed_kept.discard(envelope_id)
            try:
                path = self.paths.relay.id_file(self.paths.relay.base / UNCONFIRMED_DIR, envelope_id)
            except ValidationError as exc:  # never kept so (ids are checked first): never raised out of a handler
                logger.error("redis: the unconfirmed send {!r} has no record name ({})", envelope_id, exc)
                return
            drop_mark(self.paths, path)

    def _load_unconfirmed(self) -> list[SendCall]:
        """The unconfirmed sends a previous run kept on the root.

        A record that is not one (:meth:`SendCall.from_record`: a bad id, not JSON, another uid's...) or an
        entry not named ``<id>.json`` is moved into the relay's ``quarantine/`` (one WARNING), as every other
        bad relay file: left there, it was read, logged and queued again at every start. One that cannot be
        read for another reason (an I/O error) is named and left for the next start.
        """
        directory = self.paths.relay.base / UNCONFIRMED_DIR
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            return []
        except OSError as exc:
            logger.error("redis: bot_relay/{}/ cannot be read ({}): the sends it keeps are not checked",
                         UNCONFIRMED_DIR, exc)
            return []
        calls = []
        for name in names:
            if name.startswith("."):
                continue
            file_id = id_of_file_name(name)
            if file_id is None:
                quarantine(self.paths.relay, directory / name, "not a <32 hex>.json regular file")
                continue
            try:
                with relay_dir(self.paths.relay.base, directory) as fd:
                    data = read_json_file(directory / name, max_bytes=UNCONFIRMED_MAX_BYTES, dir_fd=fd)
                calls.append(SendCall.from_record(data, file_id=file_id))
            except FileNotFoundError:
                continue
            except (StoreError, HostileFileError, ValidationError) as exc:
                quarantine(self.paths.relay, directory / name,
                           f"not an unconfirmed send of this gateway ({exc}); it is not checked")
            except OSError as exc:
                logger.error("redis: the unconfirmed send {} cannot be read ({}); it is left for the next start",
                             name, exc)
        return calls

    def send_to_peer(self, route: PeerRoute, remote: list[RemoteAgent], hop: int) -> dict[str, Any] | None:
        """A ``bot_peers`` peer that is a connection on this Redis: ``peer`` → its ``default`` agent.

        Returns:
            The ack or refusal dict; None when ``route.peer`` is no connection here.
        """
        rows = [r for r in remote if r.connection_id.lower() == route.peer.lower()]
        if not rows:
            return None
        want = (route.agent or "default").lower()
        match = [r for r in rows if want in (r.profile.lower(), r.handle.lower())]
        if not match:
            names = ", ".join(sorted(r.handle for r in rows))
            return Refusal(f"No agent '{route.agent or 'default'}' on peer '{route.peer}'; its agents: {names}. "
                           "The message was NOT sent.", "unknown").as_dict()
        target = match[0]
        if target.online is False:  # named as the ack names it (the seed's peer label), not as a relay target
            return Refusal(offline_error_text(target, via="redis", label=route.label), "runtime_offline").as_dict()
        return self.send(target, route.sender, route.content, hop, route.label)

    def _resume_one(self, envelope_id: str, meta: dict[str, Any], conn: str, now: float) -> ResumedSend:
        """Wait again for the reply of one envelope a previous run sent (its ``sent`` meta), aged from its
        ``created_at``; the DM it names, for its sender's wake."""
        self._wait_for(envelope_id, meta["label"], str(meta.get("target_handle", "")), conn,
                       age=max(0.0, now - float(meta["created_at"])))
        return ResumedSend(envelope_id, meta["label"], *recorded_sender(meta, profile_key="from_profile"))

    def _wait_for(self, envelope_id: str, label: str, handle: str, conn: str, *, age: float) -> None:
        timers = [self.timers.after(max(0.0, self.config.reply_wait_seconds - age), ReplyDeadline(envelope_id))]
        if self.config.envelope_ttl_seconds > 0:
            timers.append(self.timers.after(max(0.0, self.config.envelope_ttl_seconds - age),
                                            TtlDeadline(envelope_id)))
        self.waiting[envelope_id] = Waiting(label, handle, conn, timers)

    # ── after a restart ─────────────────────────────────────────────────────

    def resume(self) -> tuple[ResumedSend, ...]:
        """Wait again for the replies of our envelopes still in flight; those resumed.

        Each names the DM that sent it (profile, handle, hop), so its outcome wakes that sender as
        it would have before the restart; a meta of an older version names none (no wake).

        Every record in ``<p>:sent:<me>`` is ours, whatever profile it names: the hash and the replies stream
        are keyed by our connection id alone, which only the lease holder uses, so no other gateway could
        settle them while we hold it (a reused connection id hands its DMs in flight to the root that takes
        it over, whose stream their replies reach anyway). A profile removed from the root between the
        restarts still gets its DM's outcome published (INFO, nobody woken), as its unconfirmed send does:
        skipped, the record stayed forever, ``wait_outcome`` of the acked id raised KeyError, and its reply
        was left pending and reclaimed at every claim interval.

        Raises:
            Exception: from redis-py when Redis cannot be read (the caller retries).
        """
        stored = self.link.client.hgetall(self.link.keys.sent(self.link.me))
        resumed: list[ResumedSend] = []
        removed: dict[str, int] = {}  # profile no longer on this root -> its sends resumed
        now = time.time()
        for raw_id, value in stored.items():
            envelope_id = as_text(raw_id) or ""
            meta = rs.parse_sent_meta(value)
            if meta is None or envelope_id in self.waiting:
                continue
            if self.local_profiles and meta.get("from_profile") not in self.local_profiles:
                profile = str(meta.get("from_profile", ""))
                removed[profile] = removed.get(profile, 0) + 1
            resumed.append(self._resume_one(envelope_id, meta, str(meta.get("target_connection", "")), now))
        for profile, count in sorted(removed.items()):
            logger.info("redis: {} send(s) in flight are of profile {!r}, no profile on this root any more: their "
                        "replies are still awaited and their outcomes published (nobody is woken by them)",
                        count, profile)
        for call in self._load_unconfirmed():  # a previous run's sends Redis did not answer: the ticks settle them
            self.unconfirmed_kept.add(call.envelope_id)
            if call.envelope_id in self.waiting:  # in our sent hash, so queued: nothing more to check
                if call.envelope_id not in self.unconfirmed:
                    self._drop_unconfirmed(call.envelope_id)
                continue
            meta = rs.parse_sent_meta(call.meta) or {}  # checked by from_record
            if self.local_profiles and meta.get("from_profile") not in self.local_profiles:
                # its record on this root says it is ours: its outcome is published as any DM's (no sender woken)
                logger.info("redis: the unconfirmed send {} to {} is of profile {!r}, no profile on this root any "
                            "more: it is still checked and its outcome published (nobody is woken by it)",
                            call.envelope_id, meta["label"], meta.get("from_profile"))
            resumed.append(self._resume_one(call.envelope_id, meta, call.target_connection, now))
            self.unconfirmed[call.envelope_id] = call
        self.resumed = True
        self.resumed_entries = tuple(resumed)
        if resumed:
            logger.info("redis: resumed waiting for {} envelope(s) after restart", len(resumed))
        return self.resumed_entries

    def take_resumed(self) -> tuple[ResumedSend, ...]:
        """The resumed entries, once (the Gateway registers them with the Dispatcher)."""
        entries, self.resumed_entries = self.resumed_entries, ()
        return entries

    # ── replies and deadlines ───────────────────────────────────────────────

    def on_reply_entry(self, entry_id: str, fields: dict[Any, Any]) -> None:
        """One entry of ``<p>:replies:<me>``: report its envelope's outcome (once)."""
        link = self.link
        replies = link.keys.replies(link.me)
        try:
            record = rs.decode_reply_entry(fields)
        except ValidationError as exc:
            logger.warning("redis: dropping a malformed reply entry {}: {}", entry_id, exc)
            self.counters["quarantined"] += 1
            link.ack(replies, [entry_id])
            return
        envelope_id = record["id"]
        entry = self.waiting.get(envelope_id)
        if entry is None:
            if envelope_id not in self.reported:
                try:
                    if link.client.hexists(link.keys.sent(link.me), envelope_id):
                        return  # resumed later (start() still resuming): left pending, reclaimed then
                except Exception as exc:
                    link.unreachable(exc)
                    return
            kept = self.unforgotten.get(envelope_id)
            if kept is not None:  # reported, not yet journaled: acked with the first reply at ForgetSent
                if entry_id not in kept:
                    kept.append(entry_id)
                return
            link.ack(replies, [entry_id], forget=envelope_id)  # late or second reply: the first one won
            return
        outcome = _outcome_of(envelope_id, entry.label, record)
        self.counters["replies"] += 1
        self._report(envelope_id, outcome, [entry_id])

    def _report(self, envelope_id: str, outcome: Outcome, reply_entries: list[str] | tuple[str, ...] = ()) -> None:
        entry = self.waiting.pop(envelope_id, None)
        if entry is None:
            return
        for timer in entry.timers:
            timer.cancel()
        self.expire_due.discard(envelope_id)
        self.unconfirmed.pop(envelope_id, None)  # its record on the root goes at forget, as its sent record
        self.unconfirmed_told.discard(envelope_id)
        if not tell(self.dispatcher, RelayedOutcome(outcome)):  # gone (a stop): never a crash of this actor
            logger.info("redis: the Dispatcher is gone: the outcome of {} is left to the next start (its sent record "
                        "and reply entry stay)", envelope_id)
            return
        self.reported[envelope_id] = None
        if len(self.reported) > REPORTED_KEEP:
            self.reported.popitem(last=False)
        # Its reply entry stays un-acked and its sent record kept until the Dispatcher has the outcome journaled
        # (ForgetSent): a crash before that leaves both, and the next start settles the DM from them again.
        self.unforgotten[envelope_id] = list(reply_entries)

    def forget(self, envelope_id: str) -> None:
        """The Dispatcher keeps the outcome of ``envelope_id`` now: ack its reply entry, drop its sent record.

        While Redis is known down that is left to the ticks (:meth:`retry_forgets`), as is one Redis did not
        answer: tried now, it held the actor an answer timeout per outcome, and a failed one left the sent
        record of a DM with no reply entry (a reply budget's or TTL's outcome) to be resumed again by the next
        start. One Redis refused (a command error: ``sent:<me>`` holding the wrong kind of value) is not retried
        (:meth:`_drop_in_redis`).
        """
        entries = self.unforgotten.pop(envelope_id, [])
        self._drop_unconfirmed(envelope_id)
        if self.link.down or not self._drop_in_redis(envelope_id, entries):
            self._forget_later(envelope_id, entries)

    def _drop_in_redis(self, envelope_id: str, entries: list[str]) -> bool:
        """Ack ``entries`` and drop the sent record of ``envelope_id``: False when Redis is unreachable (retry).

        A command error is given up (True): retried, it failed the same way at every tick (an ERROR each
        time, forever) and held up every drop behind it. It is logged once until a drop succeeds again,
        naming the fix for a key of the wrong kind.
        """
        link = self.link
        exc = link.try_ack(link.keys.replies(link.me), entries, forget=envelope_id)
        if exc is None:
            self.forget_refused = False
            return True
        if rs.is_redis_unreachable(exc):
            return False
        if not self.forget_refused:
            self.forget_refused = True
            logger.error("redis: Redis refused to drop the sent record of settled DM {} ({}): {}its record (and reply "
                         "entry) is left in Redis and not retried; this is logged once until a drop succeeds again",
                         envelope_id, exc, _forget_fix(str(exc), (link.keys.sent(link.me), link.keys.replies(link.me))))
        return True

    def _forget_later(self, envelope_id: str, entries: list[str]) -> None:
        """Keep a drop for :meth:`retry_forgets`, at most :data:`FORGET_DUE_MAX` (the oldest is then let go)."""
        self.forget_due[envelope_id] = entries
        if len(self.forget_due) <= FORGET_DUE_MAX:
            return
        oldest = next(iter(self.forget_due))
        del self.forget_due[oldest]
        if not self.forget_overflowed:
            self.forget_overflowed = True
            logger.warning("redis: {} settled DMs wait for Redis to drop their sent records: the oldest ({} first) are "
                           "left in Redis for the next start", FORGET_DUE_MAX, oldest)

    def retry_forgets(self) -> None:
        """Forget, now that Redis answers, the outcomes :meth:`forget` could not (stops once Redis is unreachable;
        one Redis refuses is given up, never holding up the others)."""
        for envelope_id, entries in list(self.forget_due.items()):
            if not self._drop_in_redis(envelope_id, entries):
                return
            self.forget_due.pop(envelope_id, None)
        self.forget_overflowed = False

    def expire(self, envelope_id: str) -> None:
        """At the TTL: expire our envelope unless its target already took it (then its reply will come)."""
        entry = self.waiting.get(envelope_id)
        if entry is None:
            return
        key = self.link.keys.claim(envelope_id)
        try:
            won = self.link.client.set(key, rs.EXPIRED_CLAIM, nx=True, ex=rs.DONE_KEEP_SECONDS)
            holder = None if won else as_text(self.link.client.get(key))
        except Exception as exc:
            self.link.unreachable(exc)
            self.expire_due.add(envelope_id)  # retried at the next tick
            return
        self.expire_due.discard(envelope_id)
        if not won and holder != rs.EXPIRED_CLAIM:
            return  # the target took it: its reply will come
        text = expired_error_text(entry.handle, entry.connection, self.config.envelope_ttl_seconds,
                                  via="redis")
        self.counters["expired"] += 1
        self._report(envelope_id, outcomes.failed(envelope_id, entry.label, text, "queued_expired"))

    def retry_expiries(self) -> None:
        for envelope_id in list(self.expire_due):
            self.expire(envelope_id)

    def reply_deadline(self, envelope_id: str) -> None:
        """The reply budget ran out: ``delivery_timeout`` (it may still be delivered)."""
        entry = self.waiting.get(envelope_id)
        if entry is None:
            return
        budget = self.config.reply_wait_seconds
        text = (f"No reply from {entry.label} within {budget:g}s. The message may still be delivered when that "
                "gateway comes back; do not resend blindly.")
        self.counters["timeouts"] += 1
        self._report(envelope_id, outcomes.failed(envelope_id, entry.label, text, "delivery_timeout"))


def _forget_fix(error: str, keys: tuple[str, ...]) -> str:
    """Pure: the fix to name for a drop Redis refused with ``error``: deleting the key of the wrong kind.

    Args:
        error: the command error's text (redis-py names the failed command and its key).
        keys: the keys the drop uses, the likeliest first.

    Returns:
        ``"<key> holds the wrong kind of value (no gateway's): delete it, redis-cli DEL <key>; "``, the first of
        ``keys`` the error names (else the first), or ``""`` when it is no WRONGTYPE error.
    """
    if "WRONGTYPE" not in error:
        return ""
    key = next((k for k in keys if k in error), keys[0])
    return f"{key} holds the wrong kind of value (no gateway's): delete it, redis-cli DEL {key}; "


def _not_queued(label: str, exc: BaseException) -> dict[str, Any]:
    """The refusal of a send Redis refused (nothing queued): a key of the wrong type, a denied command."""
    fix = (" A key under the Redis prefix holds the wrong kind of value: delete it (it is no key of a running"
           " gateway) and resend." if "WRONGTYPE" in str(exc) else "")
    return {"error": f"Could not queue the message for {label}: {exc}. Nothing was sent.{fix}", "reason": "unknown"}


def _busy(label: str, detail: Any) -> dict[str, Any]:
    """The refusal of a send to a target whose queue is full (``detail``: its backlog)."""
    return {"error": f"target_busy: the queue for {label} is full ({as_text(detail)} DMs waiting in Redis). "
                     "The message was NOT delivered; retry shortly.", "reason": "target_busy"}


def _outcome_of(envelope_id: str, label: str, record: dict[str, Any]) -> Outcome:
    return outcomes.from_relay_reply(envelope_id, label, record["reply"], record["error"], record["reason"])
