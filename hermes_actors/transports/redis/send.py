"""The RedisRelayActor's sender half: our envelopes, from the ack to their outcome.

One Lua call checks the target stream's backlog (``target_busy`` past
``redis_max_stream_len``), ``XADD``s the envelope (``MAXLEN ~``) and records it
in ``<p>:sent:<me>`` — all before the ack. The reply arrives on
``<p>:replies:<me>``; the reply budget gives ``delivery_timeout``; at the TTL
the sender expires its own envelope by winning ``SET <p>:claim:<id> expired NX``.
After a restart the envelopes still in ``<p>:sent:<me>`` are waited for again.
"""

from __future__ import annotations

import time
from typing import Any

from loguru import logger

from actors import handles
from hermes_actors.core import outcomes
from hermes_actors.core.acks import ack_payload
from hermes_actors.core.targets import Refusal, transport_unreachable_text
from hermes_actors.errors import ValidationError
from hermes_actors.messages import (
    Outcome,
    OutcomeReady,
    PeerSend,
    ProfileInfo,
    RelayResumed,
    RelaySend,
    RemoteAgent,
    ReplyDeadline,
    ResumeRelay,
    TtlDeadline,
)
from hermes_actors.store.relay_protocol import expired_error_text, make_envelope
from hermes_actors.store.relay_roster import offline_error_text
from hermes_actors.transports.redis import store as rs
from hermes_actors.transports.redis.base import RedisBase, Waiting, as_text

__all__ = ["REPORTED_KEEP", "SEND_LUA", "RedisSend"]

REPORTED_KEEP = 100_000

#: KEYS: target inbox, our sent hash; ARGV: stream bound, envelope, reply_to, envelope id, sent meta.
SEND_LUA = """
local n = redis.call('XLEN', KEYS[1])
if n >= tonumber(ARGV[1]) then return {0, n} end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'envelope', ARGV[2], 'reply_to', ARGV[3])
redis.call('HSET', KEYS[2], ARGV[4], ARGV[5])
return {1, id}
"""


class RedisSend(RedisBase):
    """Handlers of the sender side (mixed into the RedisRelayActor)."""

    @handles(RelaySend)
    def _on_send(self, msg: RelaySend) -> dict[str, Any]:
        route = msg.route
        return self._send(route.target, route.sender, route.content, msg.delivery.hop, route.label)

    @handles(PeerSend)
    def _on_peer_send(self, msg: PeerSend) -> dict[str, Any] | None:
        """A ``bot_peers`` peer that is a connection on this Redis: ``peer`` → its ``default`` agent."""
        route = msg.route
        rows = [r for r in self.remote if r.connection_id.lower() == route.peer.lower()]
        if not rows:
            return None
        want = (route.agent or "default").lower()
        match = [r for r in rows if want in (r.profile.lower(), r.handle.lower())]
        if not match:
            names = ", ".join(sorted(r.handle for r in rows))
            return Refusal(f"No agent '{route.agent or 'default'}' on peer '{route.peer}'; its agents: {names}. "
                           "The message was NOT sent.", "unknown").as_dict()
        target = match[0]
        if target.online is False:
            return Refusal(offline_error_text(target), "runtime_offline").as_dict()
        return self._send(target, route.sender, route.content, msg.delivery.hop, route.label)

    def _send(self, target: RemoteAgent, sender: ProfileInfo, content: str, hop: int, label: str) -> dict[str, Any]:
        envelope = make_envelope(target=target, message=content, sender_profile=sender.profile,
                                 sender_handle=sender.handle, now=time.time(), extra={"hop": hop})
        fields = rs.encode_envelope_entry(envelope, self.me)
        try:
            ok, detail = self.send_script(
                keys=[self.keys.inbox(target.connection_id), self.keys.sent(self.me)],
                args=[self.settings.max_stream_len, fields["envelope"], self.me, envelope["id"],
                      rs.sent_meta(envelope, label)],
            )
        except Exception as exc:
            if self._unreachable(exc):
                return Refusal(transport_unreachable_text(label, self.settings.address), "runtime_offline").as_dict()
            return {"error": f"Could not queue the message for {label}: {exc}. Nothing was sent.", "reason": "unknown"}
        if not ok:
            self.counters["refused_full"] += 1
            return {"error": f"target_busy: the queue for {label} is full ({detail} DMs waiting in Redis). "
                             "The message was NOT delivered; retry shortly.", "reason": "target_busy"}
        self.counters["sent"] += 1
        self._wait_for(envelope["id"], label, target.handle, target.connection_id, age=0.0)
        return ack_payload(envelope["id"], label, now=envelope["created_at"])

    def _wait_for(self, envelope_id: str, label: str, handle: str, conn: str, *, age: float) -> None:
        timers = [self.timers.after(max(0.0, self.config.reply_wait_seconds - age), ReplyDeadline(envelope_id))]
        if self.config.envelope_ttl_seconds > 0:
            timers.append(self.timers.after(max(0.0, self.config.envelope_ttl_seconds - age),
                                            TtlDeadline(envelope_id)))
        self.waiting[envelope_id] = Waiting(label, handle, conn, timers)

    def _resume(self) -> None:
        """After a restart: wait again for the replies of our envelopes still in flight."""
        stored = self.client.hgetall(self.keys.sent(self.me))
        resumed: list[tuple[str, str]] = []
        now = time.time()
        for raw_id, value in stored.items():
            envelope_id = as_text(raw_id) or ""
            meta = rs.parse_sent_meta(value)
            if meta is None or envelope_id in self.waiting:
                continue
            if self.local_profiles and meta.get("from_profile") not in self.local_profiles:
                continue
            resumed.append((envelope_id, meta["label"]))
            self._wait_for(envelope_id, meta["label"], str(meta.get("target_handle", "")),
                           str(meta.get("target_connection", "")), age=max(0.0, now - float(meta["created_at"])))
        self.resumed = True
        self.resumed_entries = tuple(resumed)
        if resumed:
            logger.info("redis: resumed waiting for {} envelope(s) after restart", len(resumed))
            self.dispatcher.tell(RelayResumed(self.resumed_entries))

    @handles(ResumeRelay)
    def _on_resume_relay(self, msg: ResumeRelay) -> tuple[tuple[str, str], ...] | None:
        """Resume now if ``on_start`` could not (Redis was down); the resumed entries, None while unreachable."""
        if not self.resumed:
            try:
                self._resume()
            except Exception as exc:
                self._unreachable(exc)
                return None
        entries, self.resumed_entries = self.resumed_entries, ()
        return entries

    def _on_reply_entry(self, entry_id: str, fields: dict[Any, Any]) -> None:
        replies = self.keys.replies(self.me)
        try:
            record = rs.decode_reply_entry(fields)
        except ValidationError as exc:
            logger.warning("redis: dropping a malformed reply entry {}: {}", entry_id, exc)
            self.counters["quarantined"] += 1
            self._ack(replies, [entry_id])
            return
        envelope_id = record["id"]
        entry = self.waiting.get(envelope_id)
        if entry is None:
            if envelope_id not in self.reported:
                try:
                    if self.client.hexists(self.keys.sent(self.me), envelope_id):
                        return  # another process of our connection waits for it: left pending, it reclaims it
                except Exception as exc:
                    self._unreachable(exc)
                    return
            self._ack(replies, [entry_id], forget=envelope_id)  # late or second reply: the first one won
            return
        outcome = self._outcome_of(envelope_id, entry.label, record)
        self.counters["replies"] += 1
        self._report(envelope_id, outcome, [entry_id])

    @staticmethod
    def _outcome_of(envelope_id: str, label: str, record: dict[str, Any]) -> Outcome:
        if record["reason"] == "ambiguous":
            return Outcome(envelope_id, "ambiguous", error=record["error"], reason="unknown", retryable=False,
                           from_=label, text=f"Delivery to {label} is ambiguous: {record['error']}")
        if record["error"]:
            return outcomes.failed(envelope_id, label, record["error"], record["reason"])
        return outcomes.from_reply(envelope_id, label, record["reply"])

    def _report(self, envelope_id: str, outcome: Outcome, reply_entries: tuple[str, ...] | list[str] = ()) -> None:
        entry = self.waiting.pop(envelope_id, None)
        if entry is None:
            return
        for timer in entry.timers:
            timer.cancel()
        self.expire_due.discard(envelope_id)
        self.dispatcher.tell(OutcomeReady(outcome))
        self.reported[envelope_id] = None
        if len(self.reported) > REPORTED_KEEP:
            self.reported.popitem(last=False)
        self._ack(self.keys.replies(self.me), list(reply_entries), forget=envelope_id)

    @handles(TtlDeadline)
    def _on_ttl(self, msg: TtlDeadline) -> None:
        entry = self.waiting.get(msg.envelope_id)
        if entry is None:
            return
        key = self.keys.claim(msg.envelope_id)
        try:
            won = self.client.set(key, rs.EXPIRED_CLAIM, nx=True, ex=rs.DONE_KEEP_SECONDS)
            holder = None if won else as_text(self.client.get(key))
        except Exception as exc:
            self._unreachable(exc)
            self.expire_due.add(msg.envelope_id)  # retried at the next tick
            return
        self.expire_due.discard(msg.envelope_id)
        if not won and holder != rs.EXPIRED_CLAIM:
            return  # the target took it: its reply will come
        text = expired_error_text(entry.handle, entry.connection, self.config.envelope_ttl_seconds)
        self.counters["expired"] += 1
        self._report(msg.envelope_id, outcomes.failed(msg.envelope_id, entry.label, text, "queued_expired"))

    @handles(ReplyDeadline)
    def _on_reply_deadline(self, msg: ReplyDeadline) -> None:
        entry = self.waiting.get(msg.envelope_id)
        if entry is None:
            return
        budget = self.config.reply_wait_seconds
        text = (f"No reply from {entry.label} within {budget:g}s. The message may still be delivered when that "
                "gateway comes back; do not resend blindly.")
        self.counters["timeouts"] += 1
        self._report(msg.envelope_id, outcomes.failed(msg.envelope_id, entry.label, text, "delivery_timeout"))
