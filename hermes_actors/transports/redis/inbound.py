"""The drain of our Redis inbox (the RedisRelayActor's receiving half).

The reader thread hands the actor each entry of ``<p>:in:<me>``; the actor hands
it to :meth:`InboundDrain.on_entry`. An entry whose reply was written
(``<p>:done:<id>``) is only acked; an expired one gets the ``queued_expired``
reply; everything else goes to the Dispatcher (``RelayDeliver``), one whose turn a
dead consumer claimed with that consumer named (``dead_why``: :func:`dead_holder_text`):
it never runs a second turn, and is answered with the outcome the journal recorded of it (a turn that finished before
a restart whose reply was in no start mark yet), else ``ambiguous``. The
reply, the ``done`` mark and ``XACK`` + ``XDEL`` of the entry are one ``MULTI``:
the entry is acked exactly when its reply is in Redis, or, when its sender's
``<p>:replies:<sender>`` key holds another type than a stream (only the reply's
``XADD`` fails: a ``MULTI`` runs the rest), when it is owed: retried at each
tick and after a restart, and written once that key is a stream again.

Each reply is kept in the envelope's start mark on this root **before** that
``MULTI`` and the mark is cleared after it, so a kill -9 at any point leaves the
reply somewhere: in Redis, or in the mark, from which the next start writes it
(:meth:`InboundDrain.load_owed`). A kill between the ``MULTI`` and the clearing
writes it twice; its sender takes the first reply of an envelope and acks any
other (``Outbound.on_reply_entry``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pykka
from loguru import logger

from actors import tell
from hermes_actors.core.config import BotModeConfig
from hermes_actors.errors import StoreError, ValidationError
from hermes_actors.faults import crashpoint
from hermes_actors.local.relay_in import dead_holder_text
from hermes_actors.messages import Outcome, RelayDeliver
from hermes_actors.relay.relay_actor import reply_from_outcome
from hermes_actors.store.relay_files import list_ids
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.store.relay_marks import (
    FILE_RELAY,
    REDIS,
    clear_started,
    holds_reply,
    keep_reply,
    kept_reply_of_any,
    on_a_shelf,
    was_started,
)
from hermes_actors.store.relay_protocol import STALE_AFTER_SECONDS, expired_error_text, is_expired, make_reply
from hermes_actors.store.sweep import sweep_old_files
from hermes_actors.transports.redis import store as rs
from hermes_actors.transports.redis.io import ClaimGuard
from hermes_actors.transports.redis.link import RedisLink, as_text

__all__ = ["VIA", "Flight", "InboundDrain", "file_relay_replies_text", "owed_reply_text", "reply_written",
           "unawaited_replies_text"]

VIA = REDIS  # the ``via`` of the replies this transport keeps in start marks (the file relay's are left to it)


@dataclass
class Flight:
    """An envelope drained from our inbox whose reply is not in Redis yet."""

    reply_to: str
    entry_ids: set[str] = field(default_factory=set)
    record: dict[str, Any] | None = None  # the reply, once settled (kept until written)
    dead_holder: str = ""  # the dead consumer that had claimed its turn ("": none): it runs no turn here


def owed_reply_text(key: str, reply_to: str) -> str:
    """Pure: the WARNING logged once while a sender's replies key holds another type than a stream.

    Args:
        key: the sender's replies stream key.
        reply_to: the sender's connection id.

    Returns:
        What is kept where, when it is written, and what to do.
    """
    return (f"redis: {key} holds a value that is not a stream, so the replies to the DMs connection {reply_to!r} "
            "sent here cannot be written there. They are kept in their start marks (bot_relay/started/ on this "
            "root, so a restart keeps them too) and written once it is a stream again: delete it "
            f"(redis-cli DEL {key}) or give it back to hermes-actors; {reply_to!r}'s gateway makes the stream again")


def file_relay_replies_text(envelope_ids: list[str]) -> str:
    """Pure: the WARNING logged at start when start marks on this root keep replies of DMs the file relay carried.

    Args:
        envelope_ids: their envelopes (the first five are named).

    Returns:
        What they are, why Redis leaves them alone, and what delivers them.
    """
    named = _first_five(envelope_ids)
    return (f"redis: {len(envelope_ids)} start mark(s) in bot_relay/started/ keep the reply of a DM that came in "
            f"through the file relay before this root switched to Redis ({named}): a reply goes "
            "back only on the transport its DM came in on, so they are left as they are. A gateway of this root on "
            "the file relay (no bot_mode.transport) writes them to bot_relay/delivered/ at its start; their "
            "senders wait for them until then")


def _first_five(envelope_ids: list[str]) -> str:
    """Pure: the first five of ``envelope_ids``, comma-separated, with "…" when there are more."""
    return ", ".join(envelope_ids[:5]) + (", …" if len(envelope_ids) > 5 else "")


def unawaited_replies_text(envelope_ids: list[str]) -> str:
    """Pure: the INFO logged at start when start marks without ``via`` keep replies no sender waits for any more.

    Args:
        envelope_ids: their envelopes (the first five are named).

    Returns:
        What they are, why they are not written, and what becomes of them.
    """
    named = _first_five(envelope_ids)
    return (f"redis: {len(envelope_ids)} start mark(s) in bot_relay/started/ written before 'via' keep the reply "
            f"of a DM no sender waits for on Redis ({named}): the file relay's hub forwarded it, or the previous "
            "Redis transport wrote it and its sender has it (or gave up on it), so it is not written again. They "
            "are left as they are until removed once older than 6 h by the housekeeping (unless a file-relay shelf "
            "holds their envelope)")


def reply_written(answers: list[Any]) -> bool | BaseException:
    """Pure: what the ``MULTI`` of :meth:`InboundDrain._write` did, from its answers (errors in their place).

    Args:
        answers: ``execute(raise_on_error=False)``'s list; the reply's ``XADD`` first.

    Returns:
        True: the reply is in Redis (a later command's failure only leaves an entry unacked: it is offered
        again and the ``done`` mark makes it a no-op). False: the ``XADD`` answered ``WRONGTYPE`` (the
        sender's replies key holds another type); the other commands ran. An exception: the ``XADD``
        failed otherwise.
    """
    first = answers[0] if answers else None
    if not isinstance(first, BaseException):
        return True
    return False if rs.is_wrong_type(first) else first


class InboundDrain:
    """Envelopes addressed to us, from their stream entry to their reply in Redis.

    Args:
        link: the actor's Redis connection.
        guard: the turn claim shared with the runner wrapper.
        config: TTL and the in-flight bound (``max_queued``).
        dispatcher: told ``RelayDeliver`` for each envelope to run.
        counters: the actor's counters (``drained``, ``deduped``, ``ambiguous``, ``quarantined``, ``returned``).
        marks: the root's relay layout: a relayed-in turn marks its start in ``started/``
            before it runs, whatever carried it; its reply is kept there before it is written to
            Redis, and the mark cleared once it is in.
        fsync: flush a kept reply to stable storage, as the start mark itself is (with the journal's fsync).
        stopping: set by the gateway's stop before the Dispatcher stops accepting: from then on no inbox entry
            is taken; each is left pending, unacked, for a consumer of this connection to reclaim (the next start).
    """

    def __init__(self, link: RedisLink, *, guard: ClaimGuard, config: BotModeConfig,
                 dispatcher: pykka.ActorRef[Any], counters: dict[str, int], marks: InboxPaths,
                 fsync: bool = True, stopping: threading.Event | None = None) -> None:
        self.link = link
        self.stopping = stopping if stopping is not None else threading.Event()
        self.marks = marks
        self.fsync = fsync
        self.guard = guard
        self.config = config
        self.dispatcher = dispatcher
        self.counters = counters
        self.flights: dict[str, Flight] = {}
        # replies whose sender's replies key holds another type: envelope id → (reply, sender's connection);
        # their entries are acked and the replies kept in their start marks until written
        self.owed: dict[str, tuple[dict[str, Any], str]] = {}
        self.bad_reply_keys: set[str] = set()  # those senders' replies keys (each logged once while it lasts)
        # marks without via whose reply Redis answered at the start that no sender waits for (load_owed): the
        # housekeeping sweeps them by age like a mark without a reply (_mark_needed); at most the marks found then
        self.unawaited: set[str] = set()

    def held_entry_ids(self) -> list[str]:
        """The inbox entries we hold (their idle time is reset so no live consumer's work is reclaimed)."""
        return sorted({i for f in self.flights.values() for i in f.entry_ids})

    def on_entry(self, entry_id: str, fields: dict[Any, Any]) -> None:
        """One entry of our inbox (new, re-offered or reclaimed); once the stop began, left pending, unacked."""
        if self.stopping.is_set():  # the Dispatcher no longer accepts: reclaimed after the claim idle, run then
            return
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
        owed = self.owed.pop(envelope_id, None)
        if owed is not None:  # its reply is kept in its start mark (a run killed before its MULTI): write it now
            record, reply_to = owed
            self.flights[envelope_id] = Flight(reply_to, {entry_id}, record)
            self.settle(envelope_id, record)
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
        dead_holder = holder if holder and holder != consumer else ""
        flight = self.flights[envelope_id] = Flight(reply_to, {entry_id}, dead_holder=dead_holder)
        if dead_holder:  # it may have run there: the Dispatcher answers with its journaled outcome, else ambiguous
            self._hand_over(envelope, flight)
            return
        ttl = self.config.envelope_ttl_seconds
        if ttl > 0 and is_expired(envelope, ttl, time.time()):
            self._expire(envelope, ttl)
            return
        self.guard.admit(envelope_id, envelope["target_handle"], envelope["target_connection"])
        if self._hand_over(envelope, flight):
            self.counters["drained"] += 1
            logger.debug("redis: delivering {} (@{})", envelope_id, envelope["target_handle"])

    def _hand_over(self, envelope: dict[str, Any], flight: Flight) -> bool:
        """Tell the Dispatcher the envelope (``RelayDeliver``, naming the dead consumer that had claimed its turn).

        Returns:
            False when the Dispatcher is gone (a stop, or its failure): the entry is left unacked, for the next
            start, and never a crash of this actor, which would drop what is queued behind.
        """
        envelope_id = envelope["id"]
        dead_why = dead_holder_text(flight.dead_holder) if flight.dead_holder else ""
        if tell(self.dispatcher, RelayDeliver(envelope, flight.reply_to, dead_why=dead_why)):
            return True
        # never started, the entry is left unacked as a stop's cancelled one is (on_outcome)
        del self.flights[envelope_id]
        self.guard.forget(envelope_id)
        self.counters["returned"] += 1
        logger.info("redis: the Dispatcher is gone; {} left in our inbox for the next start", envelope_id)
        return False

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
        if verdict in ("lost", "expired"):
            # The claim refused the turn after its start mark was written (the mark comes first): it never ran
            # here, and the mark, read by every start, would stay for good
            del self.flights[envelope_id]
            self.guard.forget(envelope_id)
            clear_started(self.marks, envelope_id)
            if verdict == "expired":  # its sender already reported queued_expired
                self.link.ack(self.link.keys.inbox(self.link.me), sorted(flight.entry_ids))
            # lost: another consumer runs it; it replies and acks, nothing from us
            return
        if put_back and not was_started(self.marks, envelope_id):  # never started: offered again later
            del self.flights[envelope_id]
            self.guard.forget(envelope_id)
            self.counters["returned"] += 1
            logger.info("redis: {} never started before the stop; left in our inbox for the next start", envelope_id)
            return
        if outcome.status == "ambiguous":
            if flight.dead_holder:  # no outcome of it recorded here: the dead consumer may have run it
                self.counters["ambiguous"] += 1
            record = make_reply(envelope_id, error=outcome.error, reason="ambiguous", now=time.time())
        else:
            record = make_reply(envelope_id, now=time.time(), **reply_from_outcome(outcome))
        self.settle(envelope_id, record)

    def settle(self, envelope_id: str, record: dict[str, Any]) -> None:
        """Keep the reply in its start mark (the first time), then write it, mark done, XACK + XDEL the entries
        (one MULTI), then clear the mark. Retried at each tick on failure.

        When the sender's replies key holds another type the reply is owed instead (:meth:`_owe`).
        """
        link = self.link
        flight = self.flights[envelope_id]
        if flight.record is None:
            flight.record = record
            self._keep(envelope_id, record, flight.reply_to)
        if link.down:
            return  # written by the tick once Redis answers again (by the next start from the mark, if we stop)
        written = self._write(envelope_id, record, flight.reply_to, sorted(flight.entry_ids))
        if written is None:
            return
        crashpoint("redis-after-reply-write")
        del self.flights[envelope_id]
        self.guard.forget(envelope_id)
        if written:
            clear_started(self.marks, envelope_id)  # its reply is in Redis: the mark has served
        else:
            self._owe(envelope_id, record, flight.reply_to)

    def _keep(self, envelope_id: str, record: dict[str, Any], reply_to: str) -> None:
        """Keep a reply in the envelope's start mark before it is written to Redis (never raises).

        Whatever kills this gateway from here on, the next start finds the reply (:meth:`load_owed`)
        and writes it, instead of answering the reclaimed entry ``ambiguous`` or, its entry already
        acked, leaving the sender to time out.
        """
        self.unawaited.discard(envelope_id)  # the mark keeps a reply of ours now, owed until written
        try:
            keep_reply(self.marks, record, reply_to, now=time.time(), via=VIA, fsync=self.fsync)
        except (StoreError, OSError, ValidationError) as exc:  # HostileFileError included
            logger.error("redis: the reply to {} could not be kept in its start mark ({}): until it is in Redis it is "
                         "in memory only, and a stop or crash of this gateway before then loses it (its sender is "
                         "answered ambiguous, or times out)", envelope_id, exc)

    def _write(self, envelope_id: str, record: dict[str, Any], reply_to: str, entry_ids: list[str]) -> bool | None:
        """One MULTI: the reply into its sender's replies stream, the ``done`` mark, XACK + XDEL of ``entry_ids``.

        Args:
            envelope_id: the envelope.
            record: its reply.
            reply_to: the sender's connection.
            entry_ids: our inbox entries of the envelope (none for an owed reply: acked already).

        Returns:
            True: the reply is in Redis. False: the sender's replies key holds another type (logged by the
            caller); the rest of the MULTI ran, so the entries are acked: the reply is now this gateway's to
            keep. None: Redis is unreachable or the write failed otherwise (logged); retried later.
        """
        link = self.link
        inbox = link.keys.inbox(link.me)
        try:
            pipe = link.client.pipeline(transaction=True)
            # Never trimmed: a reply trimmed before its sender read it would turn a DM that ran into a
            # delivery_timeout. The stream holds only unread replies, one per envelope still in the
            # sender's sent hash, each of which a bounded inbox once held.
            pipe.xadd(link.keys.replies(reply_to), rs.encode_reply_entry(record))
            pipe.set(link.keys.done(envelope_id), b"1", ex=rs.DONE_KEEP_SECONDS)
            if entry_ids and inbox not in link.wrong_type:  # replaced by another type: its entries are gone
                pipe.xack(inbox, rs.GROUP, *entry_ids)
                pipe.xdel(inbox, *entry_ids)
            answers = pipe.execute(raise_on_error=False)
        except Exception as exc:
            link.unreachable(exc)
            return None
        written = reply_written(answers)
        if isinstance(written, BaseException):
            link.unreachable(written)
            return None
        failed = next((a for a in answers[1:] if isinstance(a, BaseException)), None)
        if failed is not None:  # the reply is in; an entry left unacked is offered again, a no-op then (done)
            link.unreachable(failed)
        return written

    def _owe(self, envelope_id: str, record: dict[str, Any], reply_to: str) -> None:
        """Owe a reply its sender's replies key could not take, for the ticks (:meth:`retry_owed`).

        Its inbox entry is acked (the MULTI ran on): the start mark on this root, which holds the
        reply since before the MULTI (:meth:`_keep`), is what a restart writes it from (:meth:`load_owed`).
        """
        self.owed[envelope_id] = (record, reply_to)
        self._bad_reply_key(reply_to)

    def _bad_reply_key(self, reply_to: str) -> str:
        """Note that ``reply_to``'s replies key holds another type; WARNING the first time (until it is fixed).

        Returns:
            The key.
        """
        key = self.link.keys.replies(reply_to)
        if key not in self.bad_reply_keys:
            self.bad_reply_keys.add(key)
            logger.warning(owed_reply_text(key, reply_to))
        return key

    def load_owed(self) -> int:
        """Take back the replies a previous run kept in their start marks and did not see into Redis (it was
        killed or stopped first, or their sender's replies key held another type); written from the next tick,
        or with their inbox entry if it is offered again first.

        Only the replies this transport kept (a mark without ``via``, as versions before it wrote them, is
        ours when its envelope is on no file-relay shelf: :func:`~hermes_actors.store.relay_marks.kept_reply`):
        one the file relay kept (the root ran it before) goes back through the file relay, never to Redis, and
        its mark is left for it (one WARNING). A mark without ``via`` that is ours by that rule is written only
        while its sender still waits for it (:meth:`_unawaited`); the others are left as they are (one INFO),
        for the housekeeping to remove once older than 6 h (:meth:`sweep_marks`).

        Returns:
            How many.
        """
        file_relay: list[str] = []
        unnamed: dict[str, tuple[dict[str, Any], str]] = {}  # ours by the older marks' rule: their senders decide
        for envelope_id in list_ids(self.marks.started):
            try:
                kept = kept_reply_of_any(self.marks, envelope_id)
            except (OSError, ValidationError) as exc:  # HostileFileError included
                logger.warning("redis: cannot read the start mark of {}: {}", envelope_id, exc)
                continue
            if kept is None:
                continue
            if kept.via == FILE_RELAY:
                file_relay.append(envelope_id)
            elif envelope_id not in self.flights:
                (self.owed if kept.named else unnamed)[envelope_id] = (kept.record, kept.reply_connection)
        unawaited = self._unawaited(unnamed)
        self.unawaited = unawaited
        self.owed.update((e, owed) for e, owed in unnamed.items() if e not in unawaited)
        if file_relay:
            logger.warning(file_relay_replies_text(sorted(file_relay)))
        if unawaited:
            logger.info(unawaited_replies_text(sorted(unawaited)))
        if self.owed:
            logger.info("redis: {} reply(ies) kept in their start marks before the restart are written now (or, while "
                        "their sender's replies key holds another type, once it is a stream again)", len(self.owed))
        return len(self.owed)

    def _unawaited(self, replies: dict[str, tuple[dict[str, Any], str]]) -> set[str]:
        """The envelopes among ``replies`` whose sender no longer waits for their reply on Redis.

        A sender keeps each envelope in its ``sent`` hash until it has the reply (or gave up on it), and
        acks any other reply to it; an envelope the file relay carried was never there. ``done:<id>`` would
        not do: the ``MULTI`` that met a sender's bad replies key set it too, and that is how the previous
        version came to keep a reply in a mark.

        Args:
            replies: envelope id → (its kept reply, its sender's connection).

        Returns:
            Those ids. None of them when Redis cannot be asked (down at the start, logged; not asked when the
            start found it down already): each reply is then taken as owed, as before, and a sender that has it
            already acks the copy (:meth:`~hermes_actors.transports.redis.outbound.Outbound.on_reply_entry`).
        """
        link = self.link
        if not replies or link.down:
            return set()
        ids = list(replies)
        try:
            pipe = link.client.pipeline(transaction=False)
            for envelope_id in ids:
                pipe.hexists(link.keys.sent(replies[envelope_id][1]), envelope_id)
            answers = pipe.execute(raise_on_error=False)
        except Exception as exc:
            link.unreachable(exc)
            return set()
        # an error in an answer (a sent key of another type) tells nothing: owed, as before
        return {e for e, waits in zip(ids, answers, strict=True) if not isinstance(waits, BaseException) and not waits}

    def sweep_marks(self, *, now: float) -> int:
        """Remove the start marks in ``started/`` older than the file relay's 6 h rule that nothing needs.

        A mark that keeps a reply stays whatever its age (owed to its sender, or the file relay's on a root
        that switched transports), and so does the mark of a turn this gateway still holds (it says the
        turn started: a stop answers it instead of putting it back) or of an envelope on a file-relay
        shelf (on a switched root, the file relay's next start answers it ``ambiguous`` instead of running
        it again). What goes is a mark no reply ever cleared: a turn whose claim was refused before its
        clearing, a gateway killed before its turn's reply was kept; and a mark without ``via`` whose reply
        Redis answered at the start that no sender waits for (:meth:`load_owed`): it is never written, and
        on a root that stays on Redis nothing else would ever remove it (each start would ask about it and
        log it again). One Redis could not be asked about stays: its reply is owed.

        Args:
            now: the current ``time.time()``.

        Returns:
            How many were removed.
        """
        removed = sweep_old_files(self.marks.started, now - STALE_AFTER_SECONDS, within=self.marks.relay.base,
                                  keep=self._mark_needed)
        if removed and self.unawaited:  # forget the ones swept
            self.unawaited.intersection_update(list_ids(self.marks.started))
        return removed

    def _mark_needed(self, mark_name: str) -> bool:
        """Whether the start mark ``<id>.json`` must stay, however old (see :meth:`sweep_marks`)."""
        envelope_id = mark_name.removesuffix(".json")
        if envelope_id in self.flights:
            return True
        if envelope_id in self.unawaited:  # its reply is nobody's any more: only a shelf holding its envelope counts
            return on_a_shelf(self.marks, mark_name)
        return holds_reply(self.marks, mark_name) or on_a_shelf(self.marks, mark_name)

    def retry_unwritten(self) -> None:
        """Write the replies an outage kept (stops at the first failure), then the owed ones."""
        for envelope_id in [e for e, f in self.flights.items() if f.record is not None]:
            record = self.flights[envelope_id].record
            assert record is not None
            self.settle(envelope_id, record)
            if self.link.down:
                return
        self.retry_owed()

    def retry_owed(self) -> None:
        """Write the owed replies: while a sender's replies key still holds another type, one try per tick for it."""
        stuck: set[str] = set()  # senders whose key is still bad this tick: their other replies wait
        for envelope_id, (record, reply_to) in list(self.owed.items()):
            if reply_to in stuck:
                continue
            written = self._write(envelope_id, record, reply_to, [])
            if written is None:
                return  # Redis is down (or refused it): the next tick
            if not written:
                stuck.add(reply_to)
                self._bad_reply_key(reply_to)  # named again after a restart
                continue
            del self.owed[envelope_id]
            clear_started(self.marks, envelope_id)
        for key in sorted(self.bad_reply_keys):
            if not any(self.link.keys.replies(reply_to) == key for _record, reply_to in self.owed.values()):
                self.bad_reply_keys.discard(key)
                logger.info("redis: {} is a stream again; the replies owed to it are written", key)
