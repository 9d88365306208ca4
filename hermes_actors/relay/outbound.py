"""Our envelopes in the file relay, from the ack to their outcome (the RelayActor's sender half).

Each envelope is recorded in ``sent/`` before it is queued in ``outbox/`` (staged complete first, so a
restart tells one its killed gateway never queued, and settles it as not sent at once); when
``replies/<id>.json`` appears (a watchdog event; the periodic rescan is only the
fallback) its outcome is reported; at the TTL the sender expires its own undrained
envelope (claim by rename into ``expiring/`` first, then the ``queued_expired``
reply); past the reply budget it gives up with ``delivery_timeout`` (one past its TTL that
was taken from ``outbox/`` only after a short grace for its taker's ``queued_expired``). After a
restart the envelopes ``sent/`` records as ours (and only those) are waited for again; so are, while
it runs, those of another gateway on the root that stopped or was killed (:meth:`Outbound.take_over`).

:class:`Outbound` is a plain object composed into the actor and called on its
thread; it reports each outcome to the Dispatcher (``RelayedOutcome``) and forgets
the envelope once told (``ForgetSent``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykka
from loguru import logger

from actors import TimerHandle, TimerSet, tell
from hermes_actors.core import outcomes
from hermes_actors.core.acks import ack_payload
from hermes_actors.core.config import BotModeConfig
from hermes_actors.core.guard import check_relay_hop
from hermes_actors.errors import StoreError, UnfinishedFileError, ValidationError
from hermes_actors.faults import crashpoint
from hermes_actors.messages import (
    Outcome,
    RelayedOutcome,
    RelayResumed,
    RelaySend,
    ReplyDeadline,
    ResumedSend,
    TtlDeadline,
)
from hermes_actors.relay.restart import SentScan, scan_sent, take_over_sent
from hermes_actors.store import relay_files as rf
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.owner_lock import release
from hermes_actors.store.relay_inbox import InboxPaths, is_consumed, mark_consumed
from hermes_actors.store.relay_quarantine import quarantine
from hermes_actors.store.relay_sent import (
    SentRecord,
    claim_for_expiry,
    clear_sent,
    drop_withdrawn,
    finish_expiry,
    queueing_name,
    read_sent,
    record_sent,
)
from hermes_actors.store.relay_shelf import shelf_held

__all__ = ["EXPIRY_ANSWER_GRACE_SECONDS", "Outbound", "Waiting", "lost_record_text", "never_queued_text",
           "no_reply_text"]

# How long past our reply budget we still wait for the queued_expired answer of an envelope whose TTL ran out after
# someone took it from our outbox/ (the hub, which moved it into the inbox/ of a root where no gateway of ours reads
# it): the hub answers at the same TTL (from the envelope's created_at) plus its DEADLINE_SLACK_SECONDS, then a reply
# write and our file event, so often a moment after our own deadline (equal budgets, the defaults). A few seconds
# covers that on a loaded machine; one re-arm, never polling, then delivery_timeout as without a TTL.
EXPIRY_ANSWER_GRACE_SECONDS = 5.0


def _resumed(record: SentRecord) -> ResumedSend:
    """Pure: what the Dispatcher is told of a ``sent/`` record resumed after a restart."""
    return ResumedSend(record.envelope_id, record.label, record.sender, record.sender_handle, record.hop, record.wake)


def never_queued_text(label: str) -> str:
    """Pure: why a DM its gateway was killed while queueing is reported NOT sent after the restart."""
    return (f"The gateway stopped while queueing the message for {label}: it never reached the relay, so it was "
            "NOT sent. Resend it.")


def lost_record_text(label: str) -> str:
    """Pure: why a DM whose ``sent/`` record a restart found damaged, with no envelope of it left, is ``ambiguous``."""
    return (f"This gateway's record of the message for {label} was damaged (its sent/ file, quarantined at the "
            "restart) and its envelope is no longer in the relay's outbox/, so whether it was delivered cannot be "
            "told: it may still be delivered; do not resend blindly.")


def no_reply_text(label: str, budget: float, *, ttl: float = 0.0, grace: float = 0.0) -> str:
    """Pure: the ``delivery_timeout`` text of one of our envelopes whose reply budget ran out unanswered.

    Args:
        label: the target's label.
        budget: ``bot_mode.reply_wait_seconds``.
        ttl: the envelope's TTL when it too had run out and the envelope was no longer in our ``outbox/`` (someone
            took it), so the sender waited ``grace`` more for its taker's ``queued_expired``; 0 when the reply
            budget alone ended it.
        grace: those extra seconds (:data:`EXPIRY_ANSWER_GRACE_SECONDS`).

    Returns:
        A text that says how long the sender waited and, past the TTL, why it is still no expiry: the plain
        "within the budget" would hide the grace and that the envelope had left our ``outbox/``.
    """
    if not ttl:
        return (f"No reply from {label} within {budget:g}s. The message may still be delivered when the Desktop "
                "reconnects; do not resend blindly.")
    return (f"No reply from {label} within {budget + grace:g}s: its {ttl:g}s TTL ran out after the Desktop or the hub "
            f"had taken it from the relay's outbox/, and no queued_expired answer came in the {grace:g}s after. "
            "The message may still be delivered; do not resend blindly.")


@dataclass
class Waiting:
    """One of our envelopes awaiting its reply (with its TTL and reply-budget timers)."""

    label: str
    timers: list[TimerHandle]
    expires_at: float | None = None  # monotonic time its TTL runs out (None: no TTL)
    resumed: bool = False  # waited for again after a restart: it may sit in expiring/ already
    graced: bool = False  # its reply deadline was re-armed once for the expiry answer of whoever took it


class Outbound:
    """Our envelopes in flight in ``bot_relay/``.

    Args:
        paths: the root's relay layout (the sender half never uses the drain side's shelf,
            so a shelf the actor takes anew leaves it valid).
        config: TTL and reply budget.
        timers: the actor's timers (deadlines come back to the actor as messages).
        dispatcher: told ``RelayedOutcome`` for each envelope's outcome.
        counters: the actor's counters (``sent``, ``replies``, ``expired``, ``timeouts``, ``quarantined``).
        profiles: the folder ids of this root's profiles: the sender an envelope must name to be taken for ours
            when its ``sent/`` record was damaged (:func:`~hermes_actors.relay.restart.envelope_is_ours`).
    """

    def __init__(self, paths: InboxPaths, *, config: BotModeConfig, timers: TimerSet,
                 dispatcher: pykka.ActorRef[Any], counters: dict[str, int],
                 profiles: frozenset[str] = frozenset()) -> None:
        self.paths = paths
        self.profiles = profiles
        self.config = config
        self.timers = timers
        self.dispatcher = dispatcher
        self.counters = counters
        self.waiting: dict[str, Waiting] = {}
        self.resumed: tuple[ResumedSend, ...] = ()  # kept until the Gateway's ResumeRelay takes them
        # never queued before a restart: id → the lock of its withdrawn file, which goes once forgotten
        self.withdrawn: dict[str, int] = {}
        # our former shelves (removed under us) that a sent/ record still names: ours as much as ``paths.taken``
        self.former: set[str] = set()

    def send(self, msg: RelaySend) -> dict[str, Any]:
        """Record and queue one envelope; the ack dict, or a refusal dict (nothing queued)."""
        route, delivery = msg.route, msg.delivery
        refused = check_relay_hop(delivery.hop, route.label)  # the target would quarantine the envelope unanswered
        if refused is not None:
            return refused.as_dict()
        envelope = rp.make_envelope(
            target=route.target,
            message=route.content,
            sender_profile=route.sender.profile,
            sender_handle=route.sender.handle,
            now=time.time(),
            extra={"hop": delivery.hop},
        )
        def record() -> None:
            record_sent(self.paths, envelope["id"], route.label, now=envelope["created_at"],
                        sender=route.sender.profile, sender_handle=route.sender.handle, hop=delivery.hop,
                        wake=delivery.wake, owner=self.paths.taken.name)
            crashpoint("relay-after-sent-record")

        # Recorded as ours before it is queued (a restart resumes exactly what we sent), and staged complete
        # before it is recorded: a restart that finds the staged file knows it never reached outbox/.
        try:
            rf.enqueue_envelope(self.paths.relay, envelope, staged_as=queueing_name(envelope["id"]),
                                before_queued=record)
        except (StoreError, ValidationError, OSError) as exc:
            clear_sent(self.paths, envelope["id"])
            return {"error": f"Could not queue the message for {route.label}: {exc}. Nothing was sent.",
                    "reason": "unknown"}
        # No look for a reply here: one that already landed (the relay beat this thread) is reported by its file
        # event or the rescan, after this handler's ack was told: an outcome before its ack would settle an id
        # the Dispatcher has not booked yet, and the ack would then book it as pending for ever.
        self._wait_for(envelope["id"], route.label, age=0.0, resumed=False)
        self.counters["sent"] += 1
        return ack_payload(envelope["id"], route.label, now=envelope["created_at"])

    def _wait_for(self, envelope_id: str, label: str, *, age: float, resumed: bool) -> None:
        ttl = rp.seed_ttl(self.config.envelope_ttl_seconds)
        timers = []
        expires_at = None
        if ttl > 0:  # first: when both are due at once (a restart), the expiry decides before the reply budget
            timers.append(self.timers.after(ttl - age, TtlDeadline(envelope_id)))
            expires_at = time.monotonic() + ttl - age
        timers.append(self.timers.after(self.config.reply_wait_seconds - age, ReplyDeadline(envelope_id)))
        self.waiting[envelope_id] = Waiting(label, timers, expires_at, resumed)

    def resume(self) -> None:
        """After a restart: wait again for replies to the envelopes ``sent/`` records as ours (and only those).

        One its killed gateway never queued (:func:`~hermes_actors.relay.restart.scan_sent`'s ``never_queued``)
        is settled at once as not sent (``cancelled``), never waited for: no reply can come; we hold its withdrawn
        file's lock until it is forgotten (:meth:`forget`) or we stop (:meth:`close`). One another gateway alive
        on the root is still queueing (``live``), or recorded as its own (``others``), is its own: neither
        reported nor waited for here. A dead writer's records are adopted (rewritten to name our shelf). One whose
        record was damaged is waited for from its envelope when that is provably ours; with none left but a trace
        (``blind``), it is answered ``ambiguous`` at once unless its reply is here; with another gateway of ours
        running, or no evidence it is ours, it is not taken (:func:`~hermes_actors.relay.restart.scan_sent`).
        """
        scan = scan_sent(self.paths, profiles=self.profiles)
        resumed, never, blind = self._wait_again(scan)
        self.resumed = tuple(resumed)
        if resumed or scan.not_ours or scan.quarantined:
            logger.info("relay: resumed waiting for {} envelope(s) of ours after restart; left {} in outbox/ that "
                        "this root did not record as sent by this gateway (a seed gateway's or forged: the Desktop "
                        "or the hub deals with them); quarantined {} bad sent record(s)",
                        len(resumed) - len(never) - len(blind), scan.not_ours, scan.quarantined)
        self._log_left(scan, len(never))
        self._tell_resumed(resumed, never, blind)

    def take_over(self, owners: set[str]) -> None:
        """While running: wait for the envelopes of gateways on this root that died or stopped since our start.

        Their ``sent/`` records are adopted as a start would (:func:`~hermes_actors.relay.restart.take_over_sent`:
        under each writer's shelf lock, so exactly one gateway takes each over), then handled as :meth:`resume`
        handles its own: the Dispatcher learns whom each outcome wakes, a reply already here is reported now.

        Args:
            owners: the shelf names of those gateways.
        """
        scan = take_over_sent(self.paths, owners)
        self._forget_settled(scan)
        resumed, never, _blind = self._wait_again(scan)  # (no blind ones: a bad record is the next start's)
        if resumed:
            logger.warning("relay: took over {} envelope(s) sent by a gateway on this root that stopped or was "
                           "killed: their replies are waited for and reported here", len(resumed) - len(never))
        self._log_left(scan, len(never))
        self._tell_resumed(resumed, never, [])

    def _forget_settled(self, scan: SentScan) -> None:
        """Forget the envelopes taken over whose outcome their dead writer journaled as delivered (``settled``).

        That gateway published the outcome and wrote the sender's wake, then was killed before it forgot the
        ``sent/`` record: reported here again, the DM got a second outcome and its sender a second wake. The
        next start that adopts its journal finds the outcome known and the wake there (run once if it never
        began), and nothing to resume.
        """
        for record in scan.settled:
            lock = scan.withdrawn.pop(record.envelope_id, None)
            if lock is not None:  # never queued, answered cancelled by a start that died: its file goes too
                self.withdrawn[record.envelope_id] = lock
            self.forget(record.envelope_id)
        if scan.settled:
            logger.info("relay: {} envelope(s) of a gateway on this root that stopped or was killed had their outcome "
                        "journaled and delivered by it already: forgotten, not reported again", len(scan.settled))

    def _wait_again(self, scan: SentScan) -> tuple[list[ResumedSend], list[ResumedSend], list[ResumedSend]]:
        """Wait for the scan's envelopes of ours; take the locks of those never queued.

        Returns:
            (every envelope taken, those among them never queued: reported ``cancelled`` by :meth:`_tell_resumed`,
            and those ``blind``: reported ``ambiguous`` by it unless their reply is here).
        """
        now = time.time()
        resumed: list[ResumedSend] = []
        never: list[ResumedSend] = []
        for record in scan.ours:
            if record.envelope_id not in self.waiting:
                resumed.append(_resumed(record))
                self._wait_for(record.envelope_id, record.label, age=max(0.0, now - record.at), resumed=True)
        for record in scan.never_queued:
            if record.envelope_id not in self.waiting:  # ours to report now: its lock says so to any other start
                self.withdrawn[record.envelope_id] = scan.withdrawn.pop(record.envelope_id)
                resumed.append(_resumed(record))
                never.append(resumed[-1])
                self.waiting[record.envelope_id] = Waiting(record.label, [], None, resumed=True)
        blind: list[ResumedSend] = []
        for record in scan.blind:  # no timers: reported at once (its reply, or ambiguous)
            if record.envelope_id not in self.waiting:
                resumed.append(_resumed(record))
                blind.append(resumed[-1])
                self.waiting[record.envelope_id] = Waiting(record.label, [], None, resumed=True)
        for lock in scan.withdrawn.values():  # not ours to report after all (already waited for here)
            release(lock)
        self.counters["quarantined"] += scan.quarantined
        return resumed, never, blind

    def _log_left(self, scan: SentScan, never: int) -> None:
        """Log the envelopes never queued (``never`` of them) and what the scan left to others."""
        if never:
            logger.warning("relay: {} envelope(s) of ours never reached outbox/ (the gateway was killed while "
                           "queueing them): answered cancelled, NOT sent", never)
        if scan.others:
            logger.info("relay: {} recorded envelope(s) were sent by another gateway still running on this root: left "
                        "to it (it waits for their replies; once it stops, a gateway of the root takes them over)",
                        scan.others)
        if scan.live:
            logger.info("relay: {} recorded envelope(s) are being queued by another gateway still running on this "
                        "root: left to it (it answers their senders)", scan.live)

    def _tell_resumed(self, resumed: list[ResumedSend], never: list[ResumedSend], blind: list[ResumedSend]) -> None:
        """Tell the Dispatcher whom the outcomes wake, then report the never queued, the replies already here, and
        the blind ones still without one (``ambiguous``: :func:`lost_record_text`)."""
        if resumed:  # a Dispatcher gone (stopped, failed): their reports below are left to the next start too
            tell(self.dispatcher, RelayResumed(tuple(resumed)))
        for entry in never:  # after RelayResumed, as a reply: the Dispatcher knows whom the outcome wakes
            self._report(entry.envelope_id, outcomes.failed(entry.envelope_id, entry.label,
                                                            never_queued_text(entry.label), "cancelled"))
        for entry in resumed:  # after RelayResumed: the Dispatcher knows whom a reply already here wakes
            self.check_reply(entry.envelope_id)
        for entry in blind:
            if entry.envelope_id in self.waiting:  # no reply: where the DM is cannot be known
                self._report(entry.envelope_id, outcomes.ambiguous(entry.envelope_id, entry.label,
                                                                   lost_record_text(entry.label)))

    def take_resumed(self) -> tuple[ResumedSend, ...]:
        """The envelopes :meth:`resume` waits for again, once (the Gateway's ``ResumeRelay``)."""
        resumed, self.resumed = self.resumed, ()
        return resumed

    def check_reply(self, envelope_id: str) -> None:
        """Report the outcome of one of our envelopes if its reply is in ``replies/``.

        A reply file still empty or not JSON yet that changed within the write grace (a writer that creates it,
        then writes it) is left alone and read again at its close-write event or the next rescan
        (:func:`~hermes_actors.store.safe_read.may_be_unfinished`); quarantined once still bad past the grace.
        """
        entry = self.waiting.get(envelope_id)
        if entry is None:
            return  # not ours (a seed gateway on the same root), or already reported
        try:
            reply = rf.read_reply(self.paths.relay, envelope_id, unfinished_at=time.time())
        except UnfinishedFileError as exc:
            logger.debug("relay: {}; read again once it is written", exc)
            return
        except ValidationError as exc:
            self._quarantine(self.paths.relay.replies / f"{envelope_id}.json", str(exc))
            return
        except OSError as exc:  # transient (EMFILE, EIO...): the next rescan retries; never crash the relay
            logger.warning("relay: could not read the reply of {}: {}", envelope_id, exc)
            return
        if reply is None:
            return
        if entry.resumed and reply["reason"] == "queued_expired" and os.path.lexists(
                self.paths.relay.id_file(self.paths.expiring, envelope_id)):
            self._finish_expiry(envelope_id)  # our expiry, killed after its reply: file it where the seed's goes
        outcome = outcomes.from_relay_reply(envelope_id, entry.label, reply["reply"], reply["error"], reply["reason"])
        if self._report(envelope_id, outcome):
            self.counters["replies"] += 1

    def _report(self, envelope_id: str, outcome: Outcome) -> bool:
        """Hand the outcome of our envelope to the Dispatcher; its ``sent/`` record stays until ``ForgetSent``.

        Returns:
            True when told; False when another gateway took the envelope over (:meth:`_taken_over`): it is
            dropped unreported, that gateway reports it (two reports were two outcomes and two wakes); False
            too when the Dispatcher is gone (the gateway stops, or failed): never a crash of the relay, which
            would drop what is queued behind; its ``sent/`` record stays, and the next start reports it.
        """
        if self._taken_over(envelope_id):
            self._drop(envelope_id)
            return False
        entry = self.waiting.pop(envelope_id)
        for timer in entry.timers:
            timer.cancel()
        if not tell(self.dispatcher, RelayedOutcome(outcome)):
            logger.info("relay: the Dispatcher is gone: the outcome of {} is left to the next start (its sent/ "
                        "record stays)", envelope_id)
            return False
        return True

    def _taken_over(self, envelope_id: str) -> bool:
        """Whether another gateway on the root took over this envelope we wait for; one small read.

        That happens when this gateway was paused (SIGSTOP) past its heartbeat's freshness while its shelf was
        removed: the shelf then looked like a stopped gateway's, and a running gateway adopted the ``sent/``
        records naming it. Its record names that gateway's shelf as ``owner`` then (or is gone, with the
        ``consumed/`` mark of the outcome that gateway reported already).

        Returns:
            True when the record names a shelf that is not ours (``paths.taken``, or a former one in ``former``)
            and that a living gateway holds (:func:`~hermes_actors.store.relay_shelf.shelf_held`: it waits for
            the envelope), or is gone and the envelope consumed; False otherwise: ours, or unknown (a record that
            cannot be read, one without ``owner``, an older version's, or one naming a shelf nobody holds, which
            no gateway would report: reported here as before).
        """
        try:
            record = read_sent(self.paths, envelope_id)
        except (OSError, ValidationError):  # HostileFileError included: cannot tell, reported as before
            return False
        if record is None:
            return is_consumed(self.paths, envelope_id)
        owner = record.owner
        return (bool(owner) and owner != self.paths.taken.name and owner not in self.former
                and shelf_held(self.paths.taken_parent, owner))

    def _drop(self, envelope_id: str) -> None:
        """Stop waiting for an envelope another gateway took over (its timers too); it is never reported here."""
        entry = self.waiting.pop(envelope_id)
        for timer in entry.timers:
            timer.cancel()
        logger.warning("relay: {} (to {}) was taken over by another gateway on this root while this one was paused "
                       "or its shelf was removed: its outcome is reported there, not here", envelope_id, entry.label)

    def drop_taken_over(self) -> None:
        """Stop waiting for the envelopes another gateway took over (our shelf was removed: :meth:`_taken_over`).

        One small read per envelope waited for; called only when our shelf was found gone.
        """
        for envelope_id in [e for e in self.waiting if self._taken_over(e)]:
            self._drop(envelope_id)

    def forget(self, envelope_id: str) -> None:
        """The outcome is journaled (or published): the envelope is no longer ours to resume."""
        crashpoint("relay-before-forget")
        try:
            mark_consumed(self.paths, envelope_id, now=time.time())
        except (StoreError, OSError, ValidationError) as exc:
            logger.warning("relay: could not mark {} consumed: {}", envelope_id, exc)
        clear_sent(self.paths, envelope_id)
        lock = self.withdrawn.pop(envelope_id, None)
        if lock is not None:  # last: while its sent/ record is there, this file proves it never left
            drop_withdrawn(self.paths, envelope_id, lock)

    def close(self) -> None:
        """At stop: let go of the withdrawn envelopes not yet forgotten (the next start reports them)."""
        for lock in self.withdrawn.values():
            release(lock)
        self.withdrawn.clear()

    def ttl_deadline(self, envelope_id: str) -> None:
        """The TTL of one of our envelopes ran out: expire it unless it was reported meanwhile."""
        entry = self.waiting.get(envelope_id)
        if entry is not None:
            self._expire(envelope_id, entry)

    def _expire(self, envelope_id: str, entry: Waiting) -> None:
        """Our envelope's TTL ran out: take it back from ``outbox/`` and answer it ``queued_expired``."""
        try:  # into expiring/ first: a restart that finds it there knows it was ours, and finishes it
            claimed = claim_for_expiry(self.paths, envelope_id, adopt=entry.resumed)
        except (OSError, ValidationError) as exc:
            logger.warning("relay: could not expire {}: {}", envelope_id, exc)
            return
        if claimed is None:
            return  # a drain won the rename: it will deliver, we keep waiting for its reply
        crashpoint("relay-after-expiry-claim")
        try:  # the seed's text names the envelope's target_connection (the label may be a display name)
            envelope = rf.read_envelope(claimed)
            handle, conn = envelope["target_handle"], envelope["target_connection"]
        except (OSError, ValidationError):
            handle, _, conn = entry.label.removeprefix("@").partition(" on ")
        ttl = rp.seed_ttl(self.config.envelope_ttl_seconds)
        text = rp.expired_error_text(handle, conn, ttl)
        self.counters["expired"] += 1
        try:
            rf.write_reply(self.paths.relay, rp.make_reply(envelope_id, error=text, reason="queued_expired",
                                                           now=time.time()))
        except (OSError, ValidationError) as exc:
            # We hold the claim, so it was certainly NOT delivered: report that rather than crash the relay.
            logger.error("relay: could not write the expiry reply of {}: {}", envelope_id, exc)
            self._finish_expiry(envelope_id)
            self._report(envelope_id, outcomes.failed(envelope_id, entry.label, text, "queued_expired"))
            return
        crashpoint("relay-after-expiry-reply")
        self._finish_expiry(envelope_id)
        self.check_reply(envelope_id)

    def _finish_expiry(self, envelope_id: str) -> None:
        try:
            finish_expiry(self.paths, envelope_id)
        except (OSError, ValidationError) as exc:  # it stays in expiring/: never delivered all the same
            logger.warning("relay: could not move the expired envelope {} to claimed/: {}", envelope_id, exc)

    def reply_deadline(self, envelope_id: str) -> None:
        """The reply budget of one of our envelopes ran out: report ``delivery_timeout`` (or its expiry).

        Past its TTL too, one still in our ``outbox/`` is expired here; one taken from it (by the hub or a drain)
        gets :data:`EXPIRY_ANSWER_GRACE_SECONDS` more, once, for its taker's ``queued_expired`` answer.
        """
        entry = self.waiting.get(envelope_id)
        if entry is None:
            return
        if entry.expires_at is not None and time.monotonic() >= entry.expires_at:
            # Its TTL ran out too (equal budgets, or a restart after both): never drained means NOT delivered,
            # which the expiry says; only a drained envelope is a delivery_timeout.
            self._expire(envelope_id, entry)
            if envelope_id not in self.waiting:
                return
            if not entry.graced:  # taken from outbox/: its taker answers queued_expired at this TTL a moment later
                entry.graced = True
                entry.timers.append(self.timers.after(EXPIRY_ANSWER_GRACE_SECONDS, ReplyDeadline(envelope_id)))
                return
            self.check_reply(envelope_id)  # written, but its file event still queued behind this timer
            if envelope_id not in self.waiting:
                return
        budget = self.config.reply_wait_seconds
        if entry.graced:  # past its TTL, taken from outbox/, and its taker's expiry answer did not come either
            text = no_reply_text(entry.label, budget, ttl=rp.seed_ttl(self.config.envelope_ttl_seconds),
                                 grace=EXPIRY_ANSWER_GRACE_SECONDS)
        else:
            text = no_reply_text(entry.label, budget)
        if self._report(envelope_id, outcomes.failed(envelope_id, entry.label, text, "delivery_timeout")):
            self.counters["timeouts"] += 1

    def _quarantine(self, path: Path, why: str) -> None:
        self.counters["quarantined"] += 1
        quarantine(self.paths.relay, path, why)
