"""The drain of our Redis inbox (the RedisRelayActor's receiving half).

The reader thread hands the actor each entry of ``<p>:in:<me>``; the actor hands
it to :meth:`InboundDrain.on_entry`. An entry whose reply was written
(``<p>:done:<id>``) is only acked; an expired one gets the ``queued_expired``
reply; one whose turn a dead consumer claimed gets an ``ambiguous`` reply (never
a second turn); everything else goes to the Dispatcher (``RelayDeliver``). The
reply, the ``done`` mark and ``XACK`` + ``XDEL`` of the entry are one ``MULTI``:
the entry is acked exactly when its reply is in Redis.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pykka
from loguru import logger

from hermes_actors.core.config import BotModeConfig
from hermes_actors.errors import ValidationError
from hermes_actors.messages import Outcome, RelayDeliver
from hermes_actors.relay.relay_actor import reply_from_outcome
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.store.relay_marks import clear_started, was_started
from hermes_actors.store.relay_protocol import expired_error_text, is_expired, make_reply
from hermes_actors.transports.redis import store as rs
from hermes_actors.transports.redis.io import ClaimGuard
from hermes_actors.transports.redis.link import RedisLink, as_text

__all__ = ["Flight", "InboundDrain"]


@dataclass
class Flight:
    """An envelope drained from our inbox whose reply is not in Redis yet."""

    reply_to: str
    entry_ids: set[str] = field(default_factory=set)
    record: dict[str, Any] | None = None  # the reply, once settled (kept until written)


class InboundDrain:
    """Envelopes addressed to us, from their stream entry to their reply in Redis.

    Args:
        link: the actor's Redis connection.
        guard: the turn claim shared with the runner wrapper.
        config: TTL and the in-flight bound (``max_queued``).
        dispatcher: told ``RelayDeliver`` for each envelope to run.
        counters: the actor's counters (``drained``, ``deduped``, ``ambiguous``, ``quarantined``, ``returned``).
        marks: the root's relay layout: a relayed-in turn marks its start in ``started/``
            before it runs, whatever carried it (cleared here once its reply is in Redis).
    """

    def __init__(self, link: RedisLink, *, guard: ClaimGuard, config: BotModeConfig,
                 dispatcher: pykka.ActorRef[Any], counters: dict[str, int], marks: InboxPaths) -> None:
        self.link = link
        self.marks = marks
        self.guard = guard
        self.config = config
        self.dispatcher = dispatcher
        self.counters = counters
        self.flights: dict[str, Flight] = {}

    def held_entry_ids(self) -> list[str]:
        """The inbox entries we hold (their idle time is reset so no live consumer's work is reclaimed)."""
        return sorted({i for f in self.flights.values() for i in f.entry_ids})

    def on_entry(self, entry_id: str, fields: dict[Any, Any]) -> None:
        """One entry of our inbox (new, re-offered or reclaimed)."""
        link = self.link
        inbox = link.keys.inbox(link.me)
        try:
            envelope, reply_to = rs.decode_envelope_entry(fields)
        except ValidationError as exc:
            logger.warning("redis: dropping a malformed inbox entry {}: {}", entry_id, exc)
            self.counters["quarantined"] += 1
            link.ack(inbox, [entry_id])
            return
        envelope_id = envelope["id"]
        if envelope["target_connection"] != link.me:  # in our stream but not addressed to us: never run it
            logger.warning("redis: entry {} is addressed to {!r}, not {!r}; dropped",
                           entry_id, envelope["target_connection"], link.me)
            self.counters["quarantined"] += 1
            link.ack(inbox, [entry_id])
            return
        flight = self.flights.get(envelope_id)
        if flight is not None:  # already ours (re-offered, or a duplicate XADD): acked with the first
            flight.entry_ids.add(entry_id)
            return
        consumer = self.guard.consumer
        try:
            done, holder = link.client.mget(link.keys.done(envelope_id), link.keys.claim(envelope_id))
            holder = as_text(holder) or ""
            holder_alive = holder not in ("", rs.EXPIRED_CLAIM, consumer) and \
                bool(link.client.exists(link.keys.consumer_alive(holder)))
        except Exception as exc:
            link.unreachable(exc)
            return  # stays in our pending list; re-offered by XAUTOCLAIM after the claim idle
        if done or holder == rs.EXPIRED_CLAIM:
            self.counters["deduped"] += 1
            link.ack(inbox, [entry_id])  # already answered (or expired by its sender): never a second turn
            return
        if holder_alive:
            return  # a live consumer runs it and will ack it; if it dies, a later reclaim decides
        flight = self.flights[envelope_id] = Flight(reply_to, {entry_id})
        if holder and holder != consumer:
            self.counters["ambiguous"] += 1
            why = (f"The gateway process that was running this turn ({holder}) died before it replied. "
                   "The message may have been delivered — do not resend.")
            self.settle(envelope_id, make_reply(envelope_id, error=why, reason="ambiguous", now=time.time()))
            return
        ttl = self.config.envelope_ttl_seconds
        if ttl > 0 and is_expired(envelope, ttl, time.time()):
            self._expire(envelope, ttl)
            return
        self.counters["drained"] += 1
        self.guard.admit(envelope_id, envelope["target_handle"], envelope["target_connection"])
        self.dispatcher.tell(RelayDeliver(envelope, flight.reply_to))
        logger.debug("redis: delivering {} (@{})", envelope_id, envelope["target_handle"])

    def _expire(self, envelope: dict[str, Any], ttl: float) -> None:
        envelope_id = envelope["id"]
        text = expired_error_text(envelope["target_handle"], envelope["target_connection"], ttl, via="redis")
        try:
            won = self.link.client.set(self.link.keys.claim(envelope_id), rs.EXPIRED_CLAIM, nx=True,
                                       ex=rs.DONE_KEEP_SECONDS)
        except Exception as exc:
            self.link.unreachable(exc)
            del self.flights[envelope_id]
            return
        if won:
            self.settle(envelope_id, make_reply(envelope_id, error=text, reason="queued_expired", now=time.time()))
        else:  # someone claimed it meanwhile: the next offer decides
            del self.flights[envelope_id]

    def on_outcome(self, outcome: Outcome, *, put_back: bool = False) -> None:
        """The Dispatcher's outcome of an envelope we drained: write its reply.

        Args:
            outcome: its outcome.
            put_back: the stop cancelled it: unless its turn started (its start mark, written
                before any turn runs, before the turn claim too), its entry is left unacked
                instead, and runs once when a consumer of this connection reclaims it after
                the claim idle time.
        """
        envelope_id = outcome.delivery_id
        flight = self.flights.get(envelope_id)
        if flight is None:  # we write replies only for envelopes addressed to us that we took
            logger.debug("redis: outcome for {} which this consumer does not hold; not replying", envelope_id)
            return
        verdict = self.guard.verdict(envelope_id)
        if verdict == "lost":  # another consumer runs it: it replies and acks; nothing from us
            del self.flights[envelope_id]
            self.guard.forget(envelope_id)
            return
        if verdict == "expired":  # its sender already reported queued_expired
            del self.flights[envelope_id]
            self.guard.forget(envelope_id)
            self.link.ack(self.link.keys.inbox(self.link.me), sorted(flight.entry_ids))
            return
        if put_back and not was_started(self.marks, envelope_id):  # never started: offered again later
            del self.flights[envelope_id]
            self.guard.forget(envelope_id)
            self.counters["returned"] += 1
            logger.info("redis: {} never started before the stop; left in our inbox for the next start", envelope_id)
            return
        if outcome.status == "ambiguous":
            record = make_reply(envelope_id, error=outcome.error, reason="ambiguous", now=time.time())
        else:
            record = make_reply(envelope_id, now=time.time(), **reply_from_outcome(outcome))
        self.settle(envelope_id, record)

    def settle(self, envelope_id: str, record: dict[str, Any]) -> None:
        """Write the reply, mark done, XACK + XDEL the entries: one MULTI. Retried at each tick on failure."""
        link = self.link
        flight = self.flights[envelope_id]
        flight.record = record
        if link.down:
            return  # written by the tick once Redis answers again
        inbox = link.keys.inbox(link.me)
        ids = sorted(flight.entry_ids)
        try:
            pipe = link.client.pipeline(transaction=True)
            # Never trimmed: a reply trimmed before its sender read it would turn a DM that ran into a
            # delivery_timeout. The stream holds only unread replies, one per envelope still in the
            # sender's sent hash, each of which a bounded inbox once held.
            pipe.xadd(link.keys.replies(flight.reply_to), rs.encode_reply_entry(record))
            pipe.set(link.keys.done(envelope_id), b"1", ex=rs.DONE_KEEP_SECONDS)
            if inbox not in link.wrong_type:  # replaced by another type: its entries are gone (acking them fails)
                pipe.xack(inbox, rs.GROUP, *ids)
                pipe.xdel(inbox, *ids)
            pipe.execute()
        except Exception as exc:
            link.unreachable(exc)
            return
        del self.flights[envelope_id]
        self.guard.forget(envelope_id)
        clear_started(self.marks, envelope_id)  # its reply is in Redis: the mark has served

    def retry_unwritten(self) -> None:
        """Write the replies an outage kept (stops at the first failure)."""
        for envelope_id in [e for e, f in self.flights.items() if f.record is not None]:
            record = self.flights[envelope_id].record
            assert record is not None
            self.settle(envelope_id, record)
            if self.link.down:
                return
