"""RelayActor: the file relay under ``<root>/bot_relay/``, driven by filesystem events.

Sender side: enqueue seed-format envelopes in ``outbox/``; when
``replies/<id>.json`` appears (a watchdog event; the periodic rescan is only
the fallback) report the outcome; expire our own undrained envelopes at the
TTL (claim by rename first, then write the ``queued_expired`` reply); give up
after the reply budget with ``delivery_timeout``.

Drain side (``inbox/`` files posted by the hub): claim, refuse expired envelopes
(:mod:`hermes_actors.relay.drain`), run the turn through the Dispatcher, write
``delivered/<id>.json``. The Desktop RPC (``Gateway.relay_*``) works on the same
files here, on this thread; a ``deliver`` call is answered once its turn settled.

Hostile files are quarantined, never followed; the actor keeps running.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykka
from loguru import logger

from actors import FileAppeared, FileRemoved, Rescan, Scheduler, TimerHandle, TypedActor, handles
from hermes_actors.core import outcomes
from hermes_actors.core.acks import ack_payload
from hermes_actors.core.config import BotModeConfig
from hermes_actors.core.ids import id_of_file_name
from hermes_actors.errors import StoreError, ValidationError
from hermes_actors.faults import crashpoint
from hermes_actors.messages import (
    AttachRelay,
    DesktopDeliver,
    DesktopDrainOutbox,
    DesktopReply,
    DesktopSyncRoster,
    ForgetSent,
    Housekeep,
    Outcome,
    PeerSend,
    PendingReply,
    RelayDeliver,
    RelayedOutcome,
    RelayOutcome,
    RelayResumed,
    RelaySend,
    RelayTick,
    RemoteRosterHint,
    ReplyDeadline,
    ResumedSend,
    ResumeRelay,
    TtlDeadline,
)
from hermes_actors.relay.desktop_rpc import DESKTOP_CALLER
from hermes_actors.relay.drain import Expired, Quarantined, ToDeliver, drain_envelope, drain_outbox
from hermes_actors.relay.restart import recover_taken, scan_sent
from hermes_actors.relay.strays import quarantine_strays
from hermes_actors.store import relay_files as rf
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.relay_heartbeat import remove_heartbeat, write_heartbeat
from hermes_actors.store.relay_inbox import InboxPaths, mark_consumed, return_to_inbox, write_delivered
from hermes_actors.store.relay_marks import clear_started, was_started
from hermes_actors.store.relay_quarantine import quarantine
from hermes_actors.store.relay_sent import claim_for_expiry, clear_sent, finish_expiry, record_sent
from hermes_actors.store.relay_shelf import Shelf

__all__ = ["WATCHED_SUBDIRS", "RelayActor", "reply_from_outcome"]

HOUSEKEEP_EVERY_SECONDS = 3600.0
# The subdirectories of bot_relay/ whose new files _on_file acts on (roster.json is in bot_relay/ itself, which
# an FsBridge always watches): FsBridge(..., subdirs=WATCHED_SUBDIRS) spares this actor every other event.
WATCHED_SUBDIRS = ("replies", "inbox")
HEARTBEAT_SECONDS = 2.0
MAX_ROUTED_AS = 8  # names kept for the heartbeat: a hub uses one; more means a misconfiguration, shown as is


@dataclass
class _Waiting:
    label: str
    timers: list[TimerHandle]
    expires_at: float | None = None  # monotonic time its TTL runs out (None: no TTL)
    resumed: bool = False  # waited for again after a restart: it may sit in expiring/ already


def reply_from_outcome(outcome: Any) -> dict[str, str]:
    """Pure: the reply-record fields for a settled outcome (seed reply format)."""
    if outcome.status == "replied":
        return {"reply": outcome.reply, "error": "", "reason": ""}
    if outcome.status == "silent":
        return {"reply": "", "error": "", "reason": ""}
    return {"reply": "", "error": outcome.error, "reason": outcome.reason}


class RelayActor(TypedActor):
    """Owns this root's relay files.

    Args:
        root: the Hermes root.
        config: bot_mode settings (TTL, reply budget).
        dispatcher: where outcomes and drained envelopes go.
        roster: the RosterActor (hinted when ``roster.json`` changes).
        scheduler: timers.
        connection_id: this gateway's id for the heartbeat (None: unknown).
        local_profiles: folder ids of this root (unused: which envelopes are ours is
            recorded in ``sent/``, not guessed from ``from_profile``; kept for callers).
    """

    def __init__(
        self,
        root: Path,
        *,
        config: BotModeConfig,
        dispatcher: pykka.ActorRef[Any],
        roster: pykka.ActorRef[Any] | None,
        scheduler: Scheduler,
        connection_id: str | None = None,
        local_profiles: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__()
        self.paths = InboxPaths.from_root(root)
        self.shelf = Shelf(self.paths.taken_parent, within=self.paths.relay.root)
        # Here, on the starting thread, not in on_start: the directories exist before the Gateway starts its
        # recursive watch (a directory created while watchdog walks the tree makes it warn on stderr).
        self.paths.ensure()
        self.paths = self.paths.on_shelf(self.shelf.open())
        self.config = config
        self.dispatcher = dispatcher
        self.roster = roster
        self.timers = self.own_timers(scheduler)
        self.connection_id = connection_id
        self.local_profiles = local_profiles
        self.waiting: dict[str, _Waiting] = {}
        self.resumed: tuple[ResumedSend, ...] = ()  # kept until the Gateway's ResumeRelay takes them
        self.desktop_calls: dict[str, list[pykka.ThreadingFuture[dict[str, str]]]] = {}  # deliver RPCs by id
        self.counters = {"sent": 0, "replies": 0, "expired": 0, "timeouts": 0, "drained": 0, "quarantined": 0,
                         "returned": 0}
        self.last_housekeep = time.monotonic()
        # the names the hub used for this root in the envelopes it handed us (heartbeat, for doctor); bounded
        self.routed_as: frozenset[str] = frozenset()

    def on_start(self) -> None:
        self._recover_taken()
        self._resume()
        self.timers.every(HEARTBEAT_SECONDS, RelayTick())
        self._heartbeat()

    def on_stop(self) -> None:
        if self.counters["returned"]:  # a warning: their senders wait until a gateway starts on this root again
            logger.warning("relay: {} relayed-in envelope(s) never started and went back into inbox/ for the next "
                           "start", self.counters["returned"])
        remove_heartbeat(self.paths)
        self.shelf.close()

    def _recover_taken(self) -> None:
        """Envelopes a dead gateway on this root had taken: finish, answer ambiguous, or run them once."""
        adopted = self.shelf.adopt()
        if not (adopted.ids or adopted.legacy):
            return
        recovery = recover_taken(self.paths, adopted, ttl=self.config.envelope_ttl_seconds)
        if recovery.rerun:  # the replies come back to us: make sure the Dispatcher knows where before it runs them
            self.dispatcher.tell(AttachRelay(self.actor_ref))
        # oldest first, as the rescan takes inbox/ (the moves onto our shelf kept each file's mtime)
        rank = {envelope_id: n for n, envelope_id in enumerate(rf.list_ids(self.shelf.path, oldest_first=True))}
        for envelope, reply_connection in sorted(recovery.rerun, key=lambda item: rank.get(item[0]["id"], len(rank))):
            self.counters["drained"] += 1
            self.dispatcher.tell(RelayDeliver(envelope, reply_connection))
        self.counters["quarantined"] += recovery.quarantined
        logger.info("relay: adopted {} envelope(s) a stopped gateway had taken: {rerun} run now (never started), "
                    "{ambiguous} answered ambiguous (may have run), {finished} already replied, "
                    "{expired} expired (waited past the TTL, never run), {quarantined} quarantined",
                    len(adopted.ids) + len(adopted.legacy), **recovery.counts())

    # ── sender side ─────────────────────────────────────────────────────────

    @handles(RelaySend)
    def _on_send(self, msg: RelaySend) -> dict[str, Any]:
        route, delivery = msg.route, msg.delivery
        envelope = rp.make_envelope(
            target=route.target,
            message=route.content,
            sender_profile=route.sender.profile,
            sender_handle=route.sender.handle,
            now=time.time(),
            extra={"hop": delivery.hop},
        )
        try:  # recorded as ours before it is queued: a restart resumes exactly what we sent
            record_sent(self.paths, envelope["id"], route.label, now=envelope["created_at"],
                        sender=route.sender.profile, sender_handle=route.sender.handle, hop=delivery.hop,
                        wake=delivery.wake)
            rf.enqueue_envelope(self.paths.relay, envelope)
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

    @handles(PeerSend)
    def _on_peer_send(self, msg: PeerSend) -> None:
        return None  # the file relay does not reach bot_peers: the Dispatcher uses the CLI transport

    def _wait_for(self, envelope_id: str, label: str, *, age: float, resumed: bool) -> None:
        ttl = rp.seed_ttl(self.config.envelope_ttl_seconds)
        timers = []
        expires_at = None
        if ttl > 0:  # first: when both are due at once (a restart), the expiry decides before the reply budget
            timers.append(self.timers.after(ttl - age, TtlDeadline(envelope_id)))
            expires_at = time.monotonic() + ttl - age
        timers.append(self.timers.after(self.config.reply_wait_seconds - age, ReplyDeadline(envelope_id)))
        self.waiting[envelope_id] = _Waiting(label, timers, expires_at, resumed)

    def _resume(self) -> None:
        """After a restart: wait again for replies to the envelopes ``sent/`` records as ours (and only those)."""
        scan = scan_sent(self.paths)
        now = time.time()
        resumed: list[ResumedSend] = []
        for record in scan.ours:
            if record.envelope_id not in self.waiting:
                resumed.append(ResumedSend(record.envelope_id, record.label, record.sender, record.sender_handle,
                                           record.hop, record.wake))
                self._wait_for(record.envelope_id, record.label, age=max(0.0, now - record.at), resumed=True)
        self.counters["quarantined"] += scan.quarantined
        self.resumed = tuple(resumed)
        if resumed or scan.not_ours or scan.quarantined:
            logger.info("relay: resumed waiting for {} envelope(s) of ours after restart; left {} in outbox/ that "
                        "this root did not record as sent by this gateway (a seed gateway's or forged: the Desktop "
                        "or the hub deals with them); quarantined {} bad sent record(s)",
                        len(resumed), scan.not_ours, scan.quarantined)
        if resumed:
            self.dispatcher.tell(RelayResumed(self.resumed))
        for entry in resumed:  # after RelayResumed: the Dispatcher knows whom a reply already here wakes
            self._check_reply(entry.envelope_id)

    @handles(ResumeRelay)
    def _on_resume_relay(self, msg: ResumeRelay) -> tuple[ResumedSend, ...]:
        """The envelopes ``on_start`` resumed (it ran before any message, so the resume is complete)."""
        resumed, self.resumed = self.resumed, ()
        return resumed

    def _check_reply(self, envelope_id: str) -> None:
        entry = self.waiting.get(envelope_id)
        if entry is None:
            return  # not ours (a seed gateway on the same root), or already reported
        try:
            reply = rf.read_reply(self.paths.relay, envelope_id)
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
        self._report(envelope_id, outcome)
        self.counters["replies"] += 1

    def _report(self, envelope_id: str, outcome: Outcome) -> None:
        """Hand the outcome of our envelope to the Dispatcher; its ``sent/`` record stays until ``ForgetSent``."""
        entry = self.waiting.pop(envelope_id)
        for timer in entry.timers:
            timer.cancel()
        self.dispatcher.tell(RelayedOutcome(outcome))

    @handles(ForgetSent)
    def _on_forget_sent(self, msg: ForgetSent) -> None:
        """The outcome is journaled (or published): the envelope is no longer ours to resume."""
        try:
            mark_consumed(self.paths, msg.envelope_id, now=time.time())
        except (StoreError, OSError, ValidationError) as exc:
            logger.warning("relay: could not mark {} consumed: {}", msg.envelope_id, exc)
        clear_sent(self.paths, msg.envelope_id)

    @handles(TtlDeadline)
    def _on_ttl(self, msg: TtlDeadline) -> None:
        entry = self.waiting.get(msg.envelope_id)
        if entry is not None:
            self._expire(msg.envelope_id, entry)

    def _expire(self, envelope_id: str, entry: _Waiting) -> None:
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
        self._check_reply(envelope_id)

    def _finish_expiry(self, envelope_id: str) -> None:
        try:
            finish_expiry(self.paths, envelope_id)
        except (OSError, ValidationError) as exc:  # it stays in expiring/: never delivered all the same
            logger.warning("relay: could not move the expired envelope {} to claimed/: {}", envelope_id, exc)

    @handles(ReplyDeadline)
    def _on_reply_deadline(self, msg: ReplyDeadline) -> None:
        entry = self.waiting.get(msg.envelope_id)
        if entry is None:
            return
        if entry.expires_at is not None and time.monotonic() >= entry.expires_at:
            # Its TTL ran out too (equal budgets, or a restart after both): never drained means NOT delivered,
            # which the expiry says; only a drained envelope is a delivery_timeout.
            self._expire(msg.envelope_id, entry)
            if msg.envelope_id not in self.waiting:
                return
        budget = self.config.reply_wait_seconds
        text = (f"No reply from {entry.label} within {budget:g}s. The message may still be delivered when the "
                "Desktop reconnects; do not resend blindly.")
        self._report(msg.envelope_id, outcomes.failed(msg.envelope_id, entry.label, text, "delivery_timeout"))
        self.counters["timeouts"] += 1

    # ── drain side (the deliver RPC, through inbox/) ─────────────────────────

    def _take(self, envelope_id: str) -> None:
        result = drain_envelope(self.paths, "inbox", envelope_id, ttl=self.config.envelope_ttl_seconds,
                                now=time.time())
        if isinstance(result, ToDeliver | Expired):
            self._note_routed_as(result.envelope["target_connection"])
        if isinstance(result, ToDeliver):
            self.counters["drained"] += 1
            self.dispatcher.tell(RelayDeliver(result.envelope, result.reply_connection))
        elif isinstance(result, Expired):
            self._write_delivered(result.reply, result.reply_connection)
        elif isinstance(result, Quarantined):
            self.counters["quarantined"] += 1

    @handles(RelayOutcome)
    def _on_relay_outcome(self, msg: RelayOutcome) -> None:
        fields = reply_from_outcome(msg.outcome)
        if msg.reply_connection == DESKTOP_CALLER:  # delivered by the Desktop RPC: the call gets the reply
            clear_started(self.paths, msg.outcome.delivery_id)
            for future in self.desktop_calls.pop(msg.outcome.delivery_id, []):
                future.set(fields)
            return
        if msg.put_back and self._put_back(msg.outcome.delivery_id):
            return
        record = rp.make_reply(msg.outcome.delivery_id, now=time.time(), **fields)
        self._write_delivered(record, msg.reply_connection)

    def _put_back(self, envelope_id: str) -> bool:
        """An envelope the stop cancelled goes back to ``inbox/`` unanswered, unless its turn started.

        The next taker on this root (this gateway's next start, or another gateway running on
        it) runs it once, or answers ``queued_expired`` past its TTL: its sender waits for the
        real reply instead of being told to resend. A turn the stop ended after it started
        (its start mark is on disk: it may have reached its target) is answered ``cancelled``
        as usual, and so is an envelope that cannot be put back.

        Returns:
            True when the envelope is back in ``inbox/`` (no reply is written).
        """
        if was_started(self.paths, envelope_id):
            return False
        try:
            returned = return_to_inbox(self.paths, envelope_id)
        except (OSError, ValidationError) as exc:  # HostileFileError included
            logger.warning("relay: could not put {} back into inbox/ ({}); answering it cancelled", envelope_id, exc)
            return False
        if returned:
            self.counters["returned"] += 1
            logger.info("relay: {} never started before the stop; back in inbox/ for the next start", envelope_id)
        return returned

    def _write_delivered(self, record: dict[str, Any], reply_connection: str) -> None:
        try:
            write_delivered(self.paths, record, reply_connection)
        except (StoreError, OSError, ValidationError) as exc:
            logger.error("relay: could not write the reply of {}: {}", record["id"], exc)
            return
        # The reply is on disk. Off our shelf first, its start mark last: a kill in between leaves a mark
        # and no envelope (swept later). The other order could leave the envelope unmarked on the shelf
        # after the hub already forwarded the reply, and the next gateway would run the turn again.
        try:
            os.unlink(self.paths.taken / f"{record['id']}.json")
        except FileNotFoundError:
            pass
        except OSError as exc:  # our shelf was tampered with: the reply stands, the relay goes on
            logger.warning("relay: could not take {} off our shelf: {}", record["id"], exc)
            return  # keep the start mark: an adopter must not run the envelope again
        clear_started(self.paths, record["id"])

    # ── the Desktop's RPC (asked by DesktopRpc on the caller's behalf) ───────

    @handles(DesktopSyncRoster)
    def _on_desktop_roster(self, msg: DesktopSyncRoster) -> int:
        return rf.write_roster(self.paths.relay, msg.rows, now=time.time())

    @handles(DesktopDrainOutbox)
    def _on_desktop_drain(self, msg: DesktopDrainOutbox) -> list[dict[str, Any]]:
        return drain_outbox(self.paths, ttl=self.config.envelope_ttl_seconds)

    @handles(DesktopDeliver)
    def _on_desktop_deliver(self, msg: DesktopDeliver) -> PendingReply:
        future: pykka.ThreadingFuture[dict[str, str]] = pykka.ThreadingFuture()
        self.desktop_calls.setdefault(msg.envelope["id"], []).append(future)
        self.dispatcher.tell(RelayDeliver(msg.envelope, DESKTOP_CALLER))
        return PendingReply(future)

    @handles(DesktopReply)
    def _on_desktop_reply(self, msg: DesktopReply) -> bool:
        written = rf.write_reply(self.paths.relay, msg.record)
        self._check_reply(msg.record["id"])  # one of ours: report it now rather than at the file event
        return written

    # ── events and rescans ──────────────────────────────────────────────────

    @handles(FileAppeared)
    def _on_file(self, msg: FileAppeared) -> None:
        path = msg.path
        where = path.parent
        if path == self.paths.relay.roster:
            if self.roster is not None:
                self.roster.tell(RemoteRosterHint())
            return
        envelope_id = id_of_file_name(path.name)
        if envelope_id is None:
            return  # a stray name: the rescan quarantines it
        if where == self.paths.relay.replies:
            self._check_reply(envelope_id)
        elif where == self.paths.inbox:
            self._take(envelope_id)

    @handles(FileRemoved)
    def _on_removed(self, msg: FileRemoved) -> None:
        return None  # removals need no action: the listing decides at the next rescan

    @handles(Rescan)
    def _on_rescan(self, msg: Rescan) -> None:
        self.counters["quarantined"] += quarantine_strays(self.paths)  # first: the listings below need the tree
        self._keep_shelf()
        replies = set(rf.list_ids(self.paths.relay.replies))
        for envelope_id in [e for e in self.waiting if e in replies]:
            self._check_reply(envelope_id)
        for envelope_id in rf.list_ids(self.paths.inbox, oldest_first=True):
            self._take(envelope_id)
        if self.roster is not None:
            self.roster.tell(RemoteRosterHint())

    def _keep_shelf(self) -> None:
        """Take a new shelf when ours was removed or swapped: without one, nothing is taken from ``inbox/``."""
        try:
            if stat.S_ISDIR(os.lstat(self.paths.taken).st_mode):
                return
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("relay: cannot check our shelf {}: {}", self.paths.taken, exc)
            return
        shelf = Shelf(self.paths.taken_parent, within=self.paths.relay.root)
        try:
            path = shelf.open()
        except (StoreError, ValidationError) as exc:  # HostileFileError included: the next rescan tries again
            logger.error("relay: our shelf {} is gone and a new one could not be made: {}", self.paths.taken, exc)
            return
        logger.warning("relay: our shelf {} was removed or replaced; envelopes are now taken onto {}",
                       self.paths.taken, path)
        self.shelf.close()
        self.shelf, self.paths = shelf, self.paths.on_shelf(path)

    def _quarantine(self, path: Path, why: str) -> None:
        self.counters["quarantined"] += 1
        quarantine(self.paths.relay, path, why)

    # ── heartbeat and housekeeping ──────────────────────────────────────────

    def _note_routed_as(self, name: str) -> None:
        """Remember a name the hub routed to this root under; a new one goes into the heartbeat at once."""
        if name in self.routed_as or len(self.routed_as) >= MAX_ROUTED_AS:
            return
        self.routed_as |= {name}
        if self.connection_id and name != self.connection_id:
            logger.warning("relay: the hub routes DMs to this root as {!r}, but this gateway runs as {!r}: use the "
                           "same name in serve --connection-id and the hub's --name", name, self.connection_id)
        self._heartbeat()

    def _heartbeat(self) -> None:
        try:
            write_heartbeat(self.paths, self.connection_id, now=time.time(), routed_as=self.routed_as)
        except (StoreError, OSError, ValidationError) as exc:  # a hostile (symlinked) directory included
            logger.warning("relay: heartbeat write failed: {}", exc)

    @handles(RelayTick)
    def _on_tick(self, msg: RelayTick) -> None:
        self._heartbeat()
        if time.monotonic() - self.last_housekeep >= HOUSEKEEP_EVERY_SECONDS:
            self._on_housekeep(Housekeep())

    @handles(Housekeep)
    def _on_housekeep(self, msg: Housekeep) -> int:
        """Sweep stale relay artifacts (> 6 h) and orphaned DM files; returns the count removed."""
        from hermes_actors.local.dm_files import cleanup_bot_dm_cache

        self.last_housekeep = time.monotonic()
        removed = rf.sweep_stale(self.paths.relay, now=time.time())
        # expiring/: an expired envelope no restart filed in claimed/ (e.g. its sent/ record was lost)
        for directory in (self.paths.consumed, self.paths.delivered, self.paths.taken, self.paths.started,
                          self.paths.expiring):
            removed += rf.sweep_directory(directory, time.time() - rp.STALE_AFTER_SECONDS)
        removed += cleanup_bot_dm_cache()
        if removed:
            logger.info("housekeeping removed {} stale file(s)", removed)
        return removed

    def stats(self) -> dict[str, int]:
        return {**self.counters, "waiting": len(self.waiting)}
