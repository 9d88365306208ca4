"""Our envelopes on Redis, from the ack to their outcome (the RedisRelayActor's sender half).

One Lua call checks the target stream's backlog (``target_busy`` past
``redis_max_stream_len``), ``XADD``s the envelope and records it in
``<p>:sent:<me>`` — all before the ack. The check is the bound: the script runs
atomically, so no concurrent sender overshoots it, and nothing is trimmed (a
trimmed entry would be an acked DM lost unread). The reply arrives on
``<p>:replies:<me>``; the reply budget gives ``delivery_timeout``; at the TTL
the sender expires its own envelope by winning ``SET <p>:claim:<id> expired NX``.
After a restart the envelopes still in ``<p>:sent:<me>`` are waited for again.

:class:`Outbound` is a plain object composed into the actor and called on its
thread; it reports each outcome to the Dispatcher (``RelayedOutcome``) and forgets the envelope
once told (``ForgetSent``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import pykka
from loguru import logger

from actors import TimerHandle, TimerSet, tell
from hermes_actors.core import outcomes
from hermes_actors.core.acks import ack_payload
from hermes_actors.core.config import BotModeConfig
from hermes_actors.core.guard import check_relay_hop
from hermes_actors.core.targets import PeerRoute, Refusal, transport_unreachable_text
from hermes_actors.errors import ValidationError
from hermes_actors.messages import (
    Outcome,
    ProfileInfo,
    RelayedOutcome,
    RemoteAgent,
    ReplyDeadline,
    ResumedSend,
    TtlDeadline,
)
from hermes_actors.store.relay_protocol import expired_error_text, make_envelope
from hermes_actors.store.relay_roster import offline_error_text
from hermes_actors.store.relay_sent import recorded_sender
from hermes_actors.transports.redis import store as rs
from hermes_actors.transports.redis.link import RedisLink, as_text

__all__ = ["REPORTED_KEEP", "SEND_LUA", "Outbound", "Waiting"]

REPORTED_KEEP = 100_000

#: KEYS: target inbox, our sent hash; ARGV: stream bound, envelope, reply_to, envelope id, sent meta.
#: Redis does not undo a script's earlier writes when a later command fails, so a refusal must leave nothing
#: queued: both keys' types are checked before anything is written, and an envelope whose ``sent`` record could
#: not be written after all is deleted again (a queued envelope its sender was told "Nothing was sent" about
#: would run a turn nobody waits for).
SEND_LUA = """
local inbox = redis.call('TYPE', KEYS[1])['ok']
if inbox ~= 'none' and inbox ~= 'stream' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a ' .. inbox .. ', not a stream')
end
local sent = redis.call('TYPE', KEYS[2])['ok']
if sent ~= 'none' and sent ~= 'hash' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[2] .. ' holds a ' .. sent .. ', not a hash')
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
        local_profiles: folder ids of this root (a restart resumes only their envelopes).
        counters: the actor's counters (``sent``, ``replies``, ``expired``, ``timeouts``, ...).
    """

    def __init__(self, link: RedisLink, *, config: BotModeConfig, timers: TimerSet,
                 dispatcher: pykka.ActorRef[Any], local_profiles: frozenset[str], counters: dict[str, int]) -> None:
        self.link = link
        self.config = config
        self.timers = timers
        self.dispatcher = dispatcher
        self.local_profiles = local_profiles
        self.counters = counters
        self.send_script = link.client.register_script(SEND_LUA)
        self.waiting: dict[str, Waiting] = {}
        self.expire_due: set[str] = set()  # TTL expiries that could not reach Redis: retried each tick
        self.reported: OrderedDict[str, None] = OrderedDict()
        self.unforgotten: dict[str, list[str]] = {}  # reported, not yet kept by the Dispatcher: their reply entries
        self.resumed = False
        self.resumed_entries: tuple[ResumedSend, ...] = ()  # kept until the Gateway's ResumeRelay takes them

    # ── sending ─────────────────────────────────────────────────────────────

    def send(self, target: RemoteAgent, sender: ProfileInfo, content: str, hop: int, label: str, *,
             wake: bool | None = None) -> dict[str, Any]:
        """Queue one envelope; the ack dict, or a refusal dict (nothing queued). ``wake``: see ``Delivery.wake``."""
        refused = check_relay_hop(hop, label)  # the target drops an envelope whose hop it cannot accept
        if refused is not None:
            return refused.as_dict()
        envelope = make_envelope(target=target, message=content, sender_profile=sender.profile,
                                 sender_handle=sender.handle, now=time.time(), extra={"hop": hop})
        fields = rs.encode_envelope_entry(envelope, self.link.me)
        keys = self.link.keys
        try:
            ok, detail = self.send_script(
                keys=[keys.inbox(target.connection_id), keys.sent(self.link.me)],
                args=[self.link.settings.max_stream_len, fields["envelope"], self.link.me, envelope["id"],
                      rs.sent_meta(envelope, label, wake)],
            )
        except Exception as exc:
            if self.link.unreachable(exc):
                return Refusal(transport_unreachable_text(label, self.link.settings.address),
                               "runtime_offline").as_dict()
            fix = (" A key under the Redis prefix holds the wrong kind of value: delete it (it is no key of a running"
                   " gateway) and resend." if "WRONGTYPE" in str(exc) else "")
            return {"error": f"Could not queue the message for {label}: {exc}. Nothing was sent.{fix}",
                    "reason": "unknown"}
        if not ok:
            self.counters["refused_full"] += 1
            return {"error": f"target_busy: the queue for {label} is full ({detail} DMs waiting in Redis). "
                             "The message was NOT delivered; retry shortly.", "reason": "target_busy"}
        self.counters["sent"] += 1
        self._wait_for(envelope["id"], label, target.handle, target.connection_id, age=0.0)
        return ack_payload(envelope["id"], label, now=envelope["created_at"])

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

        Raises:
            Exception: from redis-py when Redis cannot be read (the caller retries).
        """
        stored = self.link.client.hgetall(self.link.keys.sent(self.link.me))
        resumed: list[ResumedSend] = []
        now = time.time()
        for raw_id, value in stored.items():
            envelope_id = as_text(raw_id) or ""
            meta = rs.parse_sent_meta(value)
            if meta is None or envelope_id in self.waiting:
                continue
            if self.local_profiles and meta.get("from_profile") not in self.local_profiles:
                continue
            resumed.append(ResumedSend(envelope_id, meta["label"], *recorded_sender(meta, profile_key="from_profile")))
            self._wait_for(envelope_id, meta["label"], str(meta.get("target_handle", "")),
                           str(meta.get("target_connection", "")), age=max(0.0, now - float(meta["created_at"])))
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
        """The Dispatcher keeps the outcome of ``envelope_id`` now: ack its reply entry, drop its sent record."""
        entries = self.unforgotten.pop(envelope_id, [])
        self.link.ack(self.link.keys.replies(self.link.me), entries, forget=envelope_id)

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


def _outcome_of(envelope_id: str, label: str, record: dict[str, Any]) -> Outcome:
    return outcomes.from_relay_reply(envelope_id, label, record["reply"], record["error"], record["reason"])
