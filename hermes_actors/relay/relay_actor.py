"""RelayActor: the file relay under ``<root>/bot_relay/``, driven by filesystem events.

Sender side (:class:`hermes_actors.relay.outbound.Outbound`, composed here):
enqueue seed-format envelopes in ``outbox/``, report the outcome when their
reply appears, expire our own undrained envelopes at the TTL, give up after the
reply budget with ``delivery_timeout``; the handlers here hand it their messages.

Drain side (``inbox/`` files posted by the hub): claim, refuse expired envelopes
(:mod:`hermes_actors.relay.drain`), run the turn through the Dispatcher, write
``delivered/<id>.json``. The Desktop RPC (``Gateway.relay_*``) works on the same
files here, on this thread; a ``deliver`` call is answered once its turn settled.

A gateway on the same root that stops or is killed while this one runs is taken over at the
next rescan: its shelf's envelopes, its ``sent/`` records and, in durable mode, its journal when
something in it is unfinished (see :meth:`RelayActor._take_over`).

Hostile files are quarantined, never followed; the actor keeps running.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pykka
from loguru import logger

from actors import FileAppeared, FileRemoved, Rescan, Scheduler, TypedActor, handles, tell
from hermes_actors.core.config import BotModeConfig
from hermes_actors.core.ids import id_of_file_name
from hermes_actors.errors import StoreError, ValidationError
from hermes_actors.messages import (
    AttachRelay,
    DesktopDeliver,
    DesktopDrainOutbox,
    DesktopReply,
    DesktopSyncRoster,
    ForgetSent,
    Housekeep,
    PeerSend,
    PendingReply,
    RelayDeliver,
    RelayOutcome,
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
from hermes_actors.relay.journal_takeover import JournalTakeover
from hermes_actors.relay.outbound import Outbound
from hermes_actors.relay.restart import AMBIGUOUS_WHY, ambiguous_reply, recover_taken, reown_sent
from hermes_actors.relay.strays import quarantine_strays
from hermes_actors.store import relay_files as rf
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.relay_dirfd import lexists_below, relay_dir, remove_below
from hermes_actors.store.relay_heartbeat import (
    hold_shelf,
    release_shelf,
    remove_heartbeat,
    sweep_dead_heartbeats,
    write_heartbeat,
)
from hermes_actors.store.relay_inbox import InboxPaths, return_to_inbox, write_delivered
from hermes_actors.store.relay_marks import clear_started, keep_reply, on_a_shelf, was_started
from hermes_actors.store.relay_sent import names_owner
from hermes_actors.store.relay_shelf import Adopted, Shelf
from hermes_actors.store.sweep import sweep_old_files
from hermes_actors.store.yaml_file import warned_while_failing

__all__ = ["WATCHED_SUBDIRS", "RelayActor", "housekeeping_due", "reply_from_outcome"]

HOUSEKEEP_EVERY_SECONDS = 3600.0
# The subdirectories of bot_relay/ whose new files _on_file acts on (roster.json is in bot_relay/ itself, which
# an FsBridge always watches): FsBridge(..., subdirs=WATCHED_SUBDIRS) spares this actor every other event.
WATCHED_SUBDIRS = ("replies", "inbox")
HEARTBEAT_SECONDS = 2.0
MAX_ROUTED_AS = 8  # names kept for the heartbeat: a hub uses one; more means a misconfiguration, shown as is
# A name the hub used is kept this long after its last envelope: once the hub's --name is fixed, doctor stops
# reporting the old one without a restart of the gateway.
ROUTED_AS_KEEP_SECONDS = 600.0


def housekeeping_due(last: float | None, now: float) -> bool:
    """Pure: whether the relay's housekeeping runs at this tick.

    Args:
        last: when it last ran (``time.monotonic()``), None when not yet since this gateway started.
        now: the current ``time.monotonic()``.

    Returns:
        True at the first tick after the start, then once every ``HOUSEKEEP_EVERY_SECONDS``: a gateway
        restarted more often than hourly (or run for minutes) still sweeps what the 6 h rule lets go.
    """
    return last is None or now - last >= HOUSEKEEP_EVERY_SECONDS


def reply_from_outcome(outcome: Any) -> dict[str, str]:
    """Pure: the reply-record fields for a settled outcome (seed reply format)."""
    if outcome.status == "replied":
        return {"reply": outcome.reply, "error": "", "reason": ""}
    if outcome.status == "silent":
        return {"reply": "", "error": "", "reason": ""}
    return {"reply": "", "error": outcome.error, "reason": outcome.reason}


class RelayActor(TypedActor):
    """Owns this root's relay files.

    Its starter has made the relay directories (:func:`~hermes_actors.relay.strays.ensure_relay_directories`:
    ``ActorSystem.start`` does, first thing, before anything watches the tree); the rescans keep them.

    Args:
        root: the Hermes root.
        config: bot_mode settings (TTL, reply budget).
        dispatcher: where outcomes and drained envelopes go.
        roster: the RosterActor (hinted when ``roster.json`` changes).
        scheduler: timers.
        connection_id: this gateway's id for the heartbeat (None: unknown).
        local_profiles: folder ids of this root: which envelopes are ours is recorded in ``sent/``, not guessed
            from ``from_profile``; only an envelope whose ``sent/`` record was damaged must name one of them (and
            carry our ``hop``) to be taken for ours (:func:`~hermes_actors.relay.restart.envelope_is_ours`).
        journals: takes over the journals of gateways on the root that stopped or died (durable mode;
            None: no journal).
        stopping: set by the gateway's stop before the Dispatcher stops accepting (read here only): from then on
            nothing more is taken from ``inbox/`` nor adopted from a dead gateway's shelf; what is there is left
            for the next taker. An Event, not a message: a message would wait behind the backlog it must stop.
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
        journals: JournalTakeover | None = None,
        stopping: threading.Event | None = None,
    ) -> None:
        super().__init__()
        self.stopping = stopping if stopping is not None else threading.Event()
        self.paths = InboxPaths.from_root(root)
        self.shelf = Shelf(self.paths.taken_parent, within=self.paths.relay.root)
        self.unfixable: set[Path] = set()  # relay directories the rescan could not put back (each logged once)
        self.paths = self.paths.on_shelf(self.shelf.open())
        hold_shelf(self.paths, self.shelf.path.name)  # our heartbeats claim it: see _keep_shelf
        self.config = config
        self.dispatcher = dispatcher
        self.roster = roster
        self.timers = self.own_timers(scheduler)
        self.connection_id = connection_id
        self.local_profiles = local_profiles
        self.journals = journals
        self.desktop_calls: dict[str, list[pykka.ThreadingFuture[dict[str, str]]]] = {}  # deliver RPCs by id
        self.counters = {"sent": 0, "replies": 0, "expired": 0, "timeouts": 0, "drained": 0,
                         "quarantined": 0, "returned": 0}
        self.outbound = Outbound(self.paths, config=config, timers=self.timers, dispatcher=dispatcher,
                                 counters=self.counters, profiles=local_profiles)
        # None: not yet since the start. The first tick sweeps (not on_start: a tree of many thousand files
        # left by an earlier run must not delay the start); timing it from the start instead meant a gateway
        # that ran less than an hour, or was restarted more often, never swept at all.
        self.last_housekeep: float | None = None
        # the names the hub used for this root in the envelopes it handed us lately → when last (monotonic);
        # written in the heartbeat for doctor; bounded
        self.routed_as: dict[str, float] = {}
        # envelope id → (reply record, reply_connection): replies whose delivered/ write failed, written again
        # at each rescan (after the clean-up put delivered/ back) until they are on disk
        self.unwritten: dict[str, tuple[dict[str, Any], str]] = {}
        # the other gateways' shelves on this root alive at the last look: one gone since stopped or was adopted,
        # and the sent/ records still naming it are taken over (_take_over)
        self.living: frozenset[str] = frozenset()

    def on_start(self) -> None:
        self._recover_taken(self.shelf.adopt())
        self._resume()
        self.timers.every(HEARTBEAT_SECONDS, RelayTick())
        self._heartbeat()

    def on_stop(self) -> None:
        if self.counters["returned"]:  # a warning: their senders wait until a gateway starts on this root again
            logger.warning("relay: {} relayed-in envelope(s) never started and went back into inbox/ for the next "
                           "start", self.counters["returned"])
        for name in (self.shelf.path.name, *self.outbound.former):  # first: our records are a stopped gateway's now
            release_shelf(self.paths, name)
        remove_heartbeat(self.paths)
        self.outbound.close()
        # kept while a sent/ record names it: a gateway running on the root finds it dead at its next rescan and
        # takes those DMs over (removed, a shelf born after its last rescan was never seen: they waited for nobody)
        self.shelf.close(keep=names_owner(self.paths, self.shelf.path.name))

    def _recover_taken(self, adopted: Adopted) -> None:
        """Envelopes a dead gateway on this root had taken: finish, have answered, or run them once.

        Those whose turn may have run go to the Dispatcher first, to be answered with the outcome the journal
        recorded of them, else ``ambiguous``, never run (:func:`~hermes_actors.relay.restart.recover_taken`): the
        journals of the gateways that died are adopted before (at a start, before the relay starts; at a rescan,
        by :meth:`_take_over` before it adopts their shelves), so the Dispatcher has their outcomes.

        Args:
            adopted: what :meth:`Shelf.adopt` moved onto our shelf; the other shelves still alive are kept
                in ``living`` (a later rescan takes over the work of those that die).
        """
        self.living = frozenset(adopted.alive)
        if not (adopted.ids or adopted.legacy):
            return
        recovery = recover_taken(self.paths, adopted, ttl=self.config.envelope_ttl_seconds)
        if recovery.rerun or recovery.may_have_run:  # the answers come back to us: the Dispatcher must know where
            tell(self.dispatcher, AttachRelay(self.actor_ref))  # a Dispatcher gone: _deliver puts them back
        for envelope, reply_connection in recovery.may_have_run:  # answered without a turn
            self._deliver(envelope, reply_connection, dead_why=AMBIGUOUS_WHY)
        # oldest first, as the rescan takes inbox/ (the moves onto our shelf kept each file's mtime)
        rank = {envelope_id: n for n, envelope_id in enumerate(rf.list_ids(self.shelf.path, oldest_first=True))}
        for envelope, reply_connection in sorted(recovery.rerun, key=lambda item: rank.get(item[0]["id"], len(rank))):
            self._deliver(envelope, reply_connection)
        self.unwritten.update((record["id"], (record, connection)) for record, connection in recovery.unwritten)
        self.counters["quarantined"] += recovery.quarantined
        logger.info("relay: adopted {} envelope(s) a stopped gateway had taken: {rerun} run now (never started), "
                    "{may_have_run} answered with the outcome the journal recorded of their turn, else ambiguous "
                    "(may have run), {ambiguous} answered ambiguous (may have run), {finished} already replied, "
                    "{kept} replied with the reply kept in their start mark ({unwritten} still unwritten), "
                    "{expired} expired (waited past the TTL, never run), {quarantined} quarantined",
                    len(adopted.ids) + len(adopted.legacy), **recovery.counts())

    # ── sender side ─────────────────────────────────────────────────────────

    @handles(RelaySend)
    def _on_send(self, msg: RelaySend) -> dict[str, Any]:
        return self.outbound.send(msg)

    @handles(PeerSend)
    def _on_peer_send(self, msg: PeerSend) -> None:
        return None  # the file relay does not reach bot_peers: the Dispatcher uses the CLI transport

    def _resume(self) -> None:
        """After a restart: wait again for replies to the envelopes ``sent/`` records as ours (and only those)."""
        self.outbound.resume()

    @handles(ResumeRelay)
    def _on_resume_relay(self, msg: ResumeRelay) -> tuple[ResumedSend, ...]:
        """The envelopes ``on_start`` resumed (it ran before any message, so the resume is complete)."""
        return self.outbound.take_resumed()

    @handles(ForgetSent)
    def _on_forget_sent(self, msg: ForgetSent) -> None:
        """The outcome is journaled (or published): the envelope is no longer ours to resume."""
        self.outbound.forget(msg.envelope_id)

    @handles(TtlDeadline)
    def _on_ttl(self, msg: TtlDeadline) -> None:
        self.outbound.ttl_deadline(msg.envelope_id)

    @handles(ReplyDeadline)
    def _on_reply_deadline(self, msg: ReplyDeadline) -> None:
        self.outbound.reply_deadline(msg.envelope_id)

    # ── drain side (the deliver RPC, through inbox/) ─────────────────────────

    def _take(self, envelope_id: str) -> None:
        if self.stopping.is_set():  # left in inbox/ for the next taker: the Dispatcher no longer accepts
            return
        result = drain_envelope(self.paths, "inbox", envelope_id, ttl=self.config.envelope_ttl_seconds,
                                now=time.time())
        if isinstance(result, ToDeliver | Expired):
            self._note_routed_as(result.envelope["target_connection"])
        if isinstance(result, ToDeliver):
            self._deliver(result.envelope, result.reply_connection)
        elif isinstance(result, Expired):
            self._write_delivered(result.reply, result.reply_connection)
        elif isinstance(result, Quarantined):
            self.counters["quarantined"] += 1
            if result.reply is not None:  # its sender is told it was NOT delivered, not left to wait
                self._write_delivered(result.reply, result.reply_connection)

    def _deliver(self, envelope: dict[str, Any], reply_connection: str, *, dead_why: str = "") -> None:
        """Hand an envelope on our shelf, never started, to the Dispatcher to run.

        With ``dead_why``, one whose turn may have run in a gateway that died (its start mark is on disk): the
        Dispatcher answers it, never runs it (``RelayDeliver.dead_why``).

        A Dispatcher already gone (a stop, or its failure) never crashes the relay, which would drop every
        message queued behind: the envelope goes back to ``inbox/`` unstarted, as a stop's cancelled one does
        (:meth:`_put_back`), and the next taker runs it once. One that cannot be put back stays on our shelf,
        kept at the stop, and the next start adopts it (never started: run once). One that may have run is
        answered ``ambiguous`` at once (no Dispatcher is left to look for its recorded outcome): its sender is not
        left waiting for a start that may never come.
        """
        envelope_id = envelope["id"]
        if tell(self.dispatcher, RelayDeliver(envelope, reply_connection, dead_why=dead_why)):
            if not dead_why:
                self.counters["drained"] += 1
            return
        if dead_why:
            self._write_delivered(ambiguous_reply(envelope, dead_why, now=time.time()), reply_connection)
            return
        if not self._put_back(envelope_id):
            logger.warning("relay: the Dispatcher is gone and {} could not go back into inbox/; it stays on our "
                           "shelf {} for the next start", envelope_id, self.shelf.path)

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
        """Write the reply of a relayed-in envelope to ``delivered/``, then take the envelope off our shelf.

        A write that fails (``delivered/`` swapped for a symlink, a full disk) loses nothing: the reply is
        kept for the next rescans (after their clean-up put ``delivered/`` back) and in the envelope's
        start mark, where a gateway adopting the envelope after a restart finds it.
        """
        envelope_id = record["id"]
        try:
            write_delivered(self.paths, record, reply_connection)
        except (StoreError, OSError, ValidationError) as exc:
            if envelope_id not in self.unwritten:  # logged once, not at every retry
                self.unwritten[envelope_id] = (record, reply_connection)
                logger.error("relay: could not write the reply of {}: {}. It is kept and written again at the "
                             "next rescans{}", envelope_id, exc, self._keep_in_mark(record, reply_connection))
            return
        if self.unwritten.pop(envelope_id, None) is not None:
            logger.info("relay: the reply of {} is written now", envelope_id)
        self._off_shelf(envelope_id)

    def _off_shelf(self, envelope_id: str) -> bool:
        """Take an envelope whose reply is on disk off our shelf, then clear its start mark; whether it was there.

        Off our shelf first, its start mark last: a kill in between leaves a mark and no envelope (swept
        later). The other order could leave the envelope unmarked on the shelf after the hub already
        forwarded the reply, and the next gateway would run the turn again.
        """
        try:  # through our checked shelf: a shelf swapped for a symlink is refused, never followed
            removed = remove_below(self.paths.relay.root, self.paths.relay.id_file(self.paths.taken, envelope_id))
        except (OSError, ValidationError) as exc:  # our shelf was tampered with: the reply stands, the relay goes on
            logger.warning("relay: could not take {} off our shelf: {}", envelope_id, exc)
            return False  # keep the start mark: an adopter must not run the envelope again
        clear_started(self.paths, envelope_id)
        return removed

    def _keep_in_mark(self, record: dict[str, Any], reply_connection: str) -> str:
        """Keep an unwritten reply in its start mark for a restart; returns what the error line adds about it."""
        try:
            keep_reply(self.paths, record, reply_connection, now=time.time())
        except (StoreError, OSError, ValidationError) as exc:  # HostileFileError included
            return f" (only in memory: it could not be kept in its start mark either ({exc}), a restart " \
                   "answers it with the outcome the journal recorded of it, else ambiguous)"
        return " (and kept in its start mark, for a restart)"

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
        self.outbound.check_reply(msg.record["id"])  # one of ours: report it now rather than at the file event
        return written

    # ── events and rescans ──────────────────────────────────────────────────

    @handles(FileAppeared)
    def _on_file(self, msg: FileAppeared) -> None:
        path = msg.path
        where = path.parent
        if path == self.paths.relay.roster:
            if self.roster is not None:
                tell(self.roster, RemoteRosterHint())
            return
        envelope_id = id_of_file_name(path.name)
        if envelope_id is None:
            return  # a stray name: the rescan quarantines it
        if where == self.paths.relay.replies:
            self.outbound.check_reply(envelope_id)
        elif where == self.paths.inbox:
            self._take(envelope_id)

    @handles(FileRemoved)
    def _on_removed(self, msg: FileRemoved) -> None:
        return None  # removals need no action: the listing decides at the next rescan

    @handles(Rescan)
    def _on_rescan(self, msg: Rescan) -> None:
        base = self.paths.relay.base  # StoreError, HostileFileError too: never the end of the actor
        with warned_while_failing(f"relay rescan of {base}", (OSError, ValidationError),
                                  f"relay: the rescan of {base} failed",
                                  "The relay goes on and tries again at the next rescan; if this lasts, check that "
                                  "the directory and everything in it belong to the user running the gateway"):
            self._rescan()

    def _rescan(self) -> None:
        """Clean the tree up, keep our shelf, write the kept replies, then take what the events missed."""
        # first: the listings below need the tree
        self.counters["quarantined"] += quarantine_strays(self.paths, unfixable=self.unfixable)
        if self.paths.relay.base in self.unfixable:
            return  # bot_relay/ itself unusable (logged once by the clean-up): nothing below it can be used
        self._keep_shelf()
        if not self.stopping.is_set():  # stopping: a dead gateway's work is left to the next taker
            self._take_over()
        for record, reply_connection in list(self.unwritten.values()):  # delivered/ may be back
            self._write_delivered(record, reply_connection)
        replies = set(rf.list_ids(self.paths.relay.replies))
        for envelope_id in [e for e in self.outbound.waiting if e in replies]:
            self.outbound.check_reply(envelope_id)
        if not self.stopping.is_set():  # (_take checks it again: it may be set meanwhile)
            for envelope_id in rf.list_ids(self.paths.inbox, oldest_first=True):
                self._take(envelope_id)
        if self.roster is not None:
            tell(self.roster, RemoteRosterHint())

    def _take_over(self) -> None:
        """Take over the work of the gateways on this root that died or stopped since the last rescan.

        The drain side adopts their shelves (by the start's rule: under each dead shelf's lock, the envelopes
        never started run once, the started ones are answered with the outcome an adopted journal recorded of
        them, else ``ambiguous``: a journal with nothing unfinished in it is not adopted while running, so a turn
        whose outcome only such a journal holds is ``ambiguous`` here); the sender side adopts the
        ``sent/`` records naming a shelf that died or went away (:meth:`Outbound.take_over`). Without this, only
        the next start did, and until then their DMs waited for nobody. One look at ``taken/`` and one lock try
        per other shelf: no more polling than the rescan itself.

        Their journals are adopted first and acted on last, in the order a start keeps around its relay
        (:mod:`hermes_actors.relay.journal_takeover`): the Dispatcher knows their settled outcomes and wakes
        before the relay reports what it takes over, and re-publishes only what the relay did not report. Before
        all that, the relayed DMs adopted journals left to the relay whose ``sent/`` record went since (reported,
        maybe by another gateway) are settled in our journal (:meth:`JournalTakeover.follow`); a failure there
        (an ``OSError`` looking at their records) is said once while it lasts and skips nothing else.
        """
        if self.journals is not None:
            base = self.paths.relay.base
            with warned_while_failing(f"relay follow of relayed DMs in {base}", (OSError, ValidationError),
                                      f"relay: the look at the sent/ records of the relayed DMs adopted journals left "
                                      f"to the relay failed in {base}",
                                      "They stay undelivered in this gateway's journal and are looked at again at "
                                      "the next rescan; the rest of the rescan goes on"):
                self.journals.follow(self.paths)
        journal = self.journals.adopt() if self.journals is not None else None
        try:
            before = self.living
            adopted = self.shelf.adopt(legacy=False)  # flat files are a running older gateway's own
            self._recover_taken(adopted)
            gone = (before - self.living) | frozenset(adopted.dead)
            if gone:
                self.outbound.take_over(set(gone))
        finally:  # the adopted journal's files are gone: its DMs are acted on even when the takeover failed
            if journal is not None and self.journals is not None:
                self.journals.recover(journal, self.paths)

    def _keep_shelf(self) -> None:
        """Take a new shelf when ours was removed or swapped: without one, nothing is taken from ``inbox/``.

        Our ``sent/`` records still name the former shelf. A shelf that is gone is a stopped gateway's to
        the other gateways on the root, and whoever makes it again adopts what names it: they would wait for
        our DMs while we still do (two outcomes, two wakes). Our heartbeat claims it meanwhile (held from our
        start, :func:`~hermes_actors.store.relay_heartbeat.claimed_shelves`), so none does; here the records
        are made to name the new shelf (:func:`~hermes_actors.relay.restart.reown_sent`), whose lock says so
        by itself, and the former one is no longer claimed unless a record could not be rewritten. Paused
        (SIGSTOP) past our heartbeat's freshness while the shelf was gone, another gateway may have taken some
        over meanwhile: those are dropped, never reported here (:meth:`Outbound.drop_taken_over`).
        """
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
        hold_shelf(self.paths, path.name)
        former = self.shelf
        former.close()
        self.shelf, self.paths = shelf, self.paths.on_shelf(path)
        self.outbound.paths = self.paths  # what we send from now on names the new shelf, and so does an adoption
        moved, left = reown_sent(self.paths, former.path.name)
        if left:
            self.outbound.former.add(former.path.name)  # claimed (heartbeat) until we stop; still ours
            logger.warning("relay: {} sent/ record(s) of ours still name our former shelf {} (they could not be "
                           "rewritten); our heartbeat claims it for as long as we run", left, former.path)
        else:
            release_shelf(self.paths, former.path.name)
        if moved:
            logger.info("relay: {} sent/ record(s) of ours now name our new shelf {}", moved, path)
        # paused past our heartbeat's freshness while the shelf was gone, another gateway may have taken some over
        self.outbound.drop_taken_over()

    # ── heartbeat and housekeeping ──────────────────────────────────────────

    def _note_routed_as(self, name: str) -> None:
        """Remember a name the hub routed to this root under; a new one goes into the heartbeat at once."""
        now = time.monotonic()
        if name in self.routed_as:
            self.routed_as[name] = now
            return
        if len(self.routed_as) >= MAX_ROUTED_AS:
            return
        self.routed_as[name] = now
        if self.connection_id and name != self.connection_id:
            logger.warning("relay: the hub routes DMs to this root as {!r}, but this gateway runs as {!r}: use the "
                           "same name in serve --connection-id and the hub's --name", name, self.connection_id)
        self._heartbeat()

    def _heartbeat(self) -> None:
        now = time.monotonic()
        for name in [n for n, seen in self.routed_as.items() if now - seen > ROUTED_AS_KEEP_SECONDS]:
            del self.routed_as[name]
        # once while it lasts, not every 2 s; a hostile (symlinked) directory included
        with warned_while_failing(f"relay heartbeat in {self.paths.relay.base}", (StoreError, OSError, ValidationError),
                                  "relay: heartbeat write failed"):
            write_heartbeat(self.paths, self.connection_id, now=time.time(), routed_as=frozenset(self.routed_as))

    @handles(RelayTick)
    def _on_tick(self, msg: RelayTick) -> None:
        self._heartbeat()
        if housekeeping_due(self.last_housekeep, time.monotonic()):
            try:
                self._on_housekeep(Housekeep())
            except Exception:  # a sweep's own bug must not stop the relay: its next hour tries again
                self.last_housekeep = time.monotonic()
                logger.exception("relay housekeeping failed; the relay goes on")

    @handles(Housekeep)
    def _on_housekeep(self, msg: Housekeep) -> int:
        """Sweep stale relay artifacts (> 6 h), dead gateways' heartbeats and orphaned DM files; returns the count.

        Our shelf and the start marks are never swept by age: an envelope on a shelf is owed its turn or
        its outcome however old its file is (adopted after a long outage, copied from another machine, a
        turn queued for hours with expiry off). Only what is settled goes (:meth:`_sweep_settled`), and a
        start mark once no shelf holds its envelope.
        """
        from hermes_actors.local.dm_files import cleanup_bot_dm_cache

        self.last_housekeep = time.monotonic()
        cutoff = time.time() - rp.STALE_AFTER_SECONDS
        removed = rf.sweep_stale(self.paths.relay, now=time.time())
        removed += self._sweep_settled()  # first: the 6 h sweep of delivered/ below may remove what proves it
        # expiring/: an expired envelope no restart filed in claimed/ (e.g. its sent/ record was lost)
        for directory in (self.paths.consumed, self.paths.delivered, self.paths.expiring):
            removed += sweep_old_files(directory, cutoff, within=self.paths.relay.base)
        # a mark whose envelope is on a shelf says its turn may have run: without it a restart would run it again
        removed += sweep_old_files(self.paths.started, cutoff, within=self.paths.relay.base, keep=self._on_a_shelf)
        # a gateway killed -9 never withdrew its heartbeat: the hub, status and doctor would read it forever
        removed += sweep_dead_heartbeats(self.paths, now=time.time())
        removed += cleanup_bot_dm_cache()
        if removed:
            logger.info("housekeeping removed {} stale file(s)", removed)
        return removed

    def _sweep_settled(self) -> int:
        """Take off our shelf the envelopes whose reply is in ``delivered/`` (first write wins: settled for good).

        Only a removal that had failed leaves one there; everything else on our shelf is still owed a turn or
        an outcome and leaves when its reply is written (or is adopted by the next start).

        Returns:
            How many were taken off.
        """
        removed = 0
        try:
            with relay_dir(self.paths.relay.base, self.paths.taken) as shelf:
                envelope_ids = rf.list_ids(self.paths.taken, dir_fd=shelf)
        except (OSError, ValidationError):  # gone or swapped (HostileFileError): the rescan takes a new one
            return 0
        for envelope_id in envelope_ids:
            try:
                settled = lexists_below(self.paths.relay.base, self.paths.delivered / f"{envelope_id}.json")
            except (OSError, ValidationError):  # delivered/ swapped (HostileFileError): nothing proves it settled
                return removed
            if settled and self._off_shelf(envelope_id):
                removed += 1
        return removed

    def _on_a_shelf(self, mark_name: str) -> bool:
        """Whether the envelope of the start mark ``<id>.json`` is on a gateway's shelf (unknown: as if it were)."""
        return on_a_shelf(self.paths, mark_name)

    def stats(self) -> dict[str, int]:
        return {**self.counters, "waiting": len(self.outbound.waiting)}
