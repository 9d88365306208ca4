"""What a starting RelayActor does with what the previous process left on this root.

Drain side: the envelopes a dead gateway had taken (adopted from its shelf,
:mod:`hermes_actors.store.relay_shelf`) are as durable as local deliveries:

- a reply already in ``delivered/`` → the turn finished; the hub forwards that record;
- a reply kept in its ``started/`` mark (its ``delivered/`` write had failed) → the turn
  finished: that reply is written to ``delivered/`` now (kept for the rescans if it fails again);
- a ``started/`` mark (or a legacy flat file, whose state nobody recorded) and no reply → the turn
  may have run: it never runs again. It stays on our shelf, with its start mark (one is written for a
  legacy file), and goes to the Dispatcher as an envelope whose turn may have run in a gateway that died
  (``RelayDeliver.dead_why``): by the rule every relayed-in retry follows
  (:func:`~hermes_actors.local.relay_in.relay_in_step`) it is answered with the outcome the journal recorded
  of it (durable mode: the dead gateway may have journaled its ``finished`` outcome, the reply text, before
  it was killed, before its relay wrote the reply to ``delivered/``; the start adopts that journal before the
  relay starts), else ``ambiguous`` (:data:`AMBIGUOUS_WHY`: no journal, or nothing of its outcome in it). A
  legacy file whose start cannot be marked is answered ``ambiguous`` at once, as before;
- otherwise → the turn never started: it is run now, once — unless it waited past
  the TTL meanwhile: then it is answered ``queued_expired``, as a drain would.

Sender side: only the envelopes ``sent/`` records as ours are waited for again;
anything else in ``outbox/`` or ``claimed/`` (a seed gateway's DM on the same
root, or a forged file) is left for the Desktop or the hub and only counted. A
recorded envelope whose staged file shows it never reached ``outbox/`` (its
gateway died between the ``sent/`` record and the rename) is not waited for: it
was never sent (:func:`~hermes_actors.store.relay_sent.withdraw_unqueued`). One
whose staged file a living gateway on the root still holds (in the middle of that
send) is left to it: its send answers for it. So is one whose record names the shelf
of a gateway still running on the root (its ``.lock`` held): that gateway waits for it.
A dead (or stopped) writer's records are adopted under its shelf's lock
(:func:`~hermes_actors.store.relay_shelf.take_dead`,
:func:`~hermes_actors.store.relay_sent.adopt_sent`): rewritten to name our shelf, so two
gateways starting at once never both wait for one; a gateway already running takes over
those of a writer that dies after its start at its next rescan (:func:`take_over_sent`).
A record that names no shelf (an older version's) is resumed as before.

A ``sent/`` record that cannot be used (truncated, a FIFO, another user's file...) names its DM by its file name
only, and that name is no proof of whose DM it was. While another gateway of ours is alive on the root (its shelf
lock held, or its fresh heartbeat claiming a shelf: the take-over's rule, :func:`_living_others`), the record is
left where it is, unread: that gateway may have sent the DM and still waits for it (it reports it all the same),
and a start taking it over made it drop its own DM unreported. Otherwise the record is quarantined, never followed,
and its DM is settled only with evidence that it is ours (:func:`damaged_fate`): its envelope (in ``outbox/``,
``expiring/``, ``claimed/`` or on a hub's shelf, validated as any envelope is) provably one of ours
(:func:`envelope_is_ours`: it carries our ``hop`` and its sender is a profile of this root) → the record is rebuilt
from it (:func:`rebuilt_record`) and the DM waited for as any of ours; an envelope that is not ours (a seed
gateway's) is left alone, no outcome here; no envelope readable but some other trace of the id on the relay (its
reply, a file of that name where an envelope goes, its staged file) → ``blind``: answered ``ambiguous`` unless its
reply is there; no trace at all → nothing is invented (a WARNING names the id and the quarantined file). A rebuilt
record is written again (naming our shelf), so a later start finds it.

A running gateway does not adopt the dead writer's journal (a start does, before it resumes), so
it reads the root's journals for each record it took over: one whose outcome a journal holds as
``finished`` and ``delivered`` was published, and its sender woken, by the dead writer, killed
before it forgot the record; it is forgotten, never reported again (:attr:`SentScan.settled`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from loguru import logger

from hermes_actors.core import outcomes
from hermes_actors.core.ids import id_of_file_name
from hermes_actors.core.names import remote_label
from hermes_actors.errors import HostileFileError, StoreError, ValidationError
from hermes_actors.ops.journal_index import JournalIndex
from hermes_actors.relay.drain import expiry_of
from hermes_actors.store import relay_files as rf
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.journal_records import DeliveryState
from hermes_actors.store.owner_lock import release
from hermes_actors.store.relay_dirfd import lexists_below, open_relay_dir, relay_dir, remove_below
from hermes_actors.store.relay_heartbeat import claimed_shelves
from hermes_actors.store.relay_inbox import InboxPaths, inbox_ttl, is_consumed, read_inbox_envelope, write_delivered
from hermes_actors.store.relay_marks import TurnStartMarks, clear_started, kept_reply, was_started
from hermes_actors.store.relay_quarantine import quarantine
from hermes_actors.store.relay_sent import (
    UNKNOWN_TARGET_LABEL,
    SentRecord,
    Withdrawn,
    adopt_sent,
    clear_sent,
    list_sent,
    queueing_name,
    recorded_sender,
    restore_sent,
    withdraw_unqueued,
    withdrawn_name,
)
from hermes_actors.store.relay_shelf import Adopted, holding_places, is_shelf_name, release_dead, shelf_held, take_dead

__all__ = ["DamagedFate", "EnvelopeFound", "SentScan", "TakenAction", "TakenRecovery", "ambiguous_reply",
           "damaged_fate", "envelope_is_ours", "journal_settled", "rebuilt_record", "recover_taken", "reown_sent",
           "scan_sent", "take_over_sent", "taken_action"]

TakenAction = Literal["finished", "may_have_run", "rerun"]
# What a start found of the envelope of a DM whose sent/ record was damaged: one of ours, someone else's, or none
EnvelopeFound = Literal["ours", "foreign", "none"]
# What a start does with such a DM (:func:`damaged_fate`)
DamagedFate = Literal["rebuild", "foreign", "blind", "untraced"]

AMBIGUOUS_WHY = "The receiving gateway stopped or crashed during the turn."


def taken_action(*, replied: bool, started: bool, legacy: bool) -> TakenAction:
    """Pure: the fate of one adopted envelope.

    Args:
        replied: its reply record is already in ``delivered/``.
        started: a ``started/`` mark says its turn was about to run.
        legacy: it came from a flat ``taken/`` file (no marks were kept then).

    Returns:
        ``"finished"`` (nothing to run, the reply is on its way), ``"may_have_run"`` (never run it again:
        answered with the outcome the journal recorded of it, else ``ambiguous``) or ``"rerun"`` (never started).
    """
    if replied:
        return "finished"
    if started or legacy:
        return "may_have_run"
    return "rerun"


@dataclass
class TakenRecovery:
    """The adopted envelopes, sorted by fate."""

    rerun: list[tuple[dict[str, Any], str]] = field(default_factory=list)  # (envelope, reply_connection)
    # (envelope, reply_connection): their turn may have run, no reply kept: for the Dispatcher to answer with the
    # outcome the journal recorded, else ambiguous; on our shelf with their start mark until that answer is written
    may_have_run: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    # (reply record, reply_connection): replies kept in start marks that could not be written yet either
    unwritten: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    kept: int = 0  # replies kept in start marks, written now
    ambiguous: int = 0  # answered ambiguous at once: legacy files whose start could not be marked
    finished: int = 0
    expired: int = 0
    quarantined: int = 0

    def counts(self) -> dict[str, int]:
        return {"rerun": len(self.rerun), "may_have_run": len(self.may_have_run), "ambiguous": self.ambiguous,
                "finished": self.finished,
                "kept": self.kept, "unwritten": len(self.unwritten), "expired": self.expired,
                "quarantined": self.quarantined}


def recover_taken(paths: InboxPaths, adopted: Adopted, *, ttl: float, now: float | None = None) -> TakenRecovery:
    """Act on the envelopes adopted onto our shelf (``paths.taken``).

    Expiry replies (and the ``ambiguous`` ones of legacy files whose start cannot be marked) are written to
    ``delivered/`` here; the never-started envelopes are returned for the caller to run, and those whose turn
    may have run for the caller to have answered (:attr:`TakenRecovery.may_have_run`); both stay on our shelf.

    Args:
        paths: the relay layout, ``taken`` being our shelf.
        adopted: what :meth:`Shelf.adopt` moved onto it.
        ttl: the configured ``envelope_ttl_seconds``: a never-started envelope older than its sender root's TTL
            (:func:`~hermes_actors.store.relay_inbox.inbox_ttl`; this one for a record without it) is not run.
        now: the current time.

    Returns:
        The recovery, with the envelopes to run again and those to answer.
    """
    result = TakenRecovery()
    now = time.time() if now is None else now
    legacy = set(adopted.legacy)
    try:  # read through our shelf as the walk finds it now: one swapped for a symlink is never read through
        shelf = open_relay_dir(paths.relay.base, paths.taken)
    except (OSError, ValidationError) as exc:  # HostileFileError included
        logger.warning("relay: our shelf {} cannot be read ({}): the {} envelope(s) adopted onto it are left "
                       "unread and unanswered (the next rescan takes a new shelf)", paths.taken, exc,
                       len(adopted.ids) + len(adopted.legacy))
        return result
    try:
        for envelope_id in (*adopted.ids, *adopted.legacy):
            _recover_one(paths, envelope_id, shelf, result, legacy=envelope_id in legacy, ttl=ttl, now=now)
    finally:
        os.close(shelf)
    return result


def _recover_one(paths: InboxPaths, envelope_id: str, shelf: int, result: TakenRecovery, *, legacy: bool,
                 ttl: float, now: float) -> None:
    """Act on one envelope adopted onto our shelf (:func:`recover_taken`), read through the shelf's descriptor.

    Args:
        paths: the relay layout, ``taken`` being our shelf.
        envelope_id: the envelope.
        shelf: our shelf, opened by the checked walk.
        result: the recovery, updated here.
        legacy: it came from a flat ``taken/`` file.
        ttl: the configured ``envelope_ttl_seconds``.
        now: the current time.
    """
    path = paths.taken / f"{envelope_id}.json"
    try:
        envelope, reply_connection = read_inbox_envelope(path, dir_fd=shelf)
    except FileNotFoundError:
        return
    except (OSError, ValidationError) as exc:
        quarantine(paths.relay, path, str(exc))
        result.quarantined += 1
        return
    replied = _replied(paths, path.name)
    started = was_started(paths, envelope_id)
    if not replied and started and _write_kept(paths, envelope_id, reply_connection, result):
        return
    action = taken_action(replied=replied, started=started, legacy=legacy)
    if action == "may_have_run" and (started or _mark_started(paths, envelope_id)):
        result.may_have_run.append((envelope, reply_connection))
        return
    expired = expiry_of(envelope, path, ttl=inbox_ttl(envelope, ttl), now=now) if action == "rerun" else None
    if action == "rerun" and expired is None:
        result.rerun.append((envelope, reply_connection))
        return
    if action != "finished":
        record = ambiguous_reply(envelope, AMBIGUOUS_WHY, now=now) if expired is None else expired
        try:
            write_delivered(paths, record, reply_connection)
        except (StoreError, OSError, ValidationError) as exc:
            logger.error("relay: could not write the {} reply of {}: {}", "ambiguous" if expired is None else
                         "expiry", envelope_id, exc)
            return  # it stays on our shelf: the next start tries again
        if expired is None:
            result.ambiguous += 1
        else:
            result.expired += 1
    else:
        result.finished += 1
    clear_started(paths, envelope_id)
    try:  # through our checked shelf: one swapped for a symlink is refused, never followed
        remove_below(paths.relay.root, path)
    except (OSError, ValidationError) as exc:  # HostileFileError included: answered all the same
        logger.warning("relay: could not take {} off our shelf: {}", envelope_id, exc)


def _replied(paths: InboxPaths, name: str) -> bool:
    """Whether the adopted envelope ``name``'s reply is in ``delivered/``, looked up through the checked walk.

    A ``delivered/`` swapped for a symlink is never followed (a file of that name outside the root would
    take the envelope for finished, and its sender would never get a reply): it is not replied then. Its
    start mark still decides (``ambiguous`` when the turn may have run), and the reply written for it waits
    for the rescan to put ``delivered/`` back.

    Args:
        paths: the relay layout.
        name: ``<id>.json``.

    Returns:
        True when a reply of that name is in ``delivered/``.
    """
    try:
        return lexists_below(paths.relay.base, paths.delivered / name)
    except (OSError, ValidationError):  # HostileFileError included: nothing there proves it replied
        return False


def ambiguous_reply(envelope: dict[str, Any], why: str, *, now: float) -> dict[str, Any]:
    """Pure: the ``delivered/`` record answering a relayed-in envelope whose turn may have run: ``ambiguous``.

    Args:
        envelope: the envelope (its ``id`` and ``target_handle`` name the DM).
        why: what happened to its turn (:data:`AMBIGUOUS_WHY`).
        now: the reply's time.

    Returns:
        The reply record.
    """
    fields = outcomes.ambiguous(envelope["id"], f"@{envelope['target_handle']}", why)
    return rp.make_reply(envelope["id"], error=fields.error, reason=fields.reason, now=now)


def _mark_started(paths: InboxPaths, envelope_id: str) -> bool:
    """Write the start mark of a legacy flat file's envelope, now on our shelf: the mark its turn would have had.

    Until its answer is written it stays on our shelf, and a start that adopts it after a kill meanwhile finds an
    envelope like any other there: the mark is what keeps that start from running it.

    Returns:
        True once the mark is there; False when it cannot be written (logged): the envelope is answered
        ``ambiguous`` at once then, as before.
    """
    try:
        TurnStartMarks(paths.relay.root).append_durably({"t": "started", "id": envelope_id})
    except (StoreError, ValidationError) as exc:
        logger.warning("relay: could not mark the start of {}, taken by an older version: {}; it is answered "
                       "ambiguous without looking for its outcome in the journal", envelope_id, exc)
        return False
    return True


def _write_kept(paths: InboxPaths, envelope_id: str, reply_connection: str, result: TakenRecovery) -> bool:
    """Write the reply kept in the envelope's start mark, if there is one (:func:`keep_reply`).

    Returns:
        True when the mark held a reply: it is written (the envelope leaves our shelf), or it could not
        be and is in ``result.unwritten`` (the envelope stays on our shelf with its mark). False when
        there is none to write (or the mark cannot be read): the envelope's fate is decided as before.
    """
    try:
        kept = kept_reply(paths, envelope_id)
    except (OSError, ValidationError) as exc:  # HostileFileError included: answered ambiguous as before
        logger.warning("relay: cannot read the start mark of {}: {}", envelope_id, exc)
        return False
    if kept is None:
        return False
    record = kept[0]
    try:
        write_delivered(paths, record, reply_connection)
    except (StoreError, OSError, ValidationError) as exc:
        logger.error("relay: could not write the kept reply of {}: {}; the rescans try again", envelope_id, exc)
        result.unwritten.append((record, reply_connection))
        return True
    result.kept += 1
    try:  # off the shelf first, its mark last (see RelayActor)
        remove_below(paths.relay.root, paths.relay.id_file(paths.taken, envelope_id))
    except (OSError, ValidationError) as exc:  # HostileFileError included: keep the mark
        logger.warning("relay: could not take {} off our shelf: {}", envelope_id, exc)
        return True
    clear_started(paths, envelope_id)
    return True


@dataclass
class SentScan:
    """The sender side at start."""

    ours: list[SentRecord] = field(default_factory=list)  # still waiting for a reply
    never_queued: list[SentRecord] = field(default_factory=list)  # recorded, provably never reached outbox/
    # never_queued's id → the descriptor holding its withdrawn file's lock (the caller's now)
    withdrawn: dict[str, int] = field(default_factory=dict)
    live: int = 0  # recorded, staged by a living gateway on this root in the middle of its send: left to it
    others: int = 0  # recorded by another gateway still running on this root (its shelf locked): left to it
    not_ours: int = 0  # envelopes waiting in outbox/ that sent/ does not record
    quarantined: int = 0
    # taken over while running (:func:`take_over_sent`), their outcome journaled and delivered by their dead
    # writer: to forget (never to report again); a never-queued one's withdrawn lock is in ``withdrawn``
    settled: list[SentRecord] = field(default_factory=list)
    # their sent/ record quarantined, no envelope of it readable, but some other trace of it on the relay: to answer
    # ambiguous unless their reply is there (:func:`damaged_fate`); those rebuilt from their envelope are in ``ours``
    # (or ``never_queued``)
    blind: list[SentRecord] = field(default_factory=list)
    # damaged sent/ records left in place, unread, because another gateway of ours runs on the root (it may own them)
    left: int = 0


def scan_sent(paths: InboxPaths, *, profiles: Collection[str] = frozenset()) -> SentScan:
    """The envelopes to wait for again, from ``sent/`` only; count what is not ours.

    An envelope whose reply was already reported (``consumed/``) is forgotten.
    One its killed gateway never queued (its staged file is still in the temp
    directory, its lock free: :func:`~hermes_actors.store.relay_sent.withdraw_unqueued`,
    which takes it back) is in ``never_queued``, for the caller to settle as not sent
    (its lock in ``withdrawn``); when that cannot be told (the temp directory unusable)
    it is waited for as before. One a living gateway on the root is still queueing
    (its staged file locked) is only counted (``live``): that gateway answers for it.
    One whose record names another living gateway's shelf is only counted (``others``),
    never read further: that gateway waits for it and reports it; so is one another
    start adopts at this moment. A dead writer's records are adopted first
    (:func:`_adopt_dead_writers`). Invalid ``sent/`` records are left in place while another gateway of ours lives
    on the root (``left``: it may have sent their DMs), else quarantined; the DM one named by its ``<id>.json`` is
    then settled only with evidence that it is ours (:func:`damaged_fate`): its record rebuilt from its envelope
    (:func:`rebuilt_record`), written again and sorted as any (``ours``, ``never_queued``, ``live``), or, with only a
    trace of it left, in ``blind``. ``outbox/`` is only listed (names, nothing read, nothing kept; the envelopes
    of our damaged records are read): a flood of forged files costs no memory.

    Args:
        paths: the relay layout, ``taken`` being our shelf.
        profiles: the folder ids of this root's profiles: a damaged record's envelope is ours only when its sender
            is one of them (:func:`envelope_is_ours`).

    Returns:
        The scan.
    """
    records, bad = list_sent(paths)
    scan = SentScan()
    living = _living_others(paths) if bad else []
    lost: dict[str, Path] = {}  # the ids of the bad records we moved aside → where they went
    left: set[str] = set()
    for path in bad:
        envelope_id = id_of_file_name(path.name)
        if living and envelope_id is not None:
            left.add(envelope_id)
            logger.warning("relay: the sent/ record {} cannot be read, and another gateway of ours runs on this root "
                           "({}): left in place, unread; the gateway that sent that DM keeps it (it waits for it and "
                           "reports it); the next start with no other gateway running settles it if nobody did",
                           path, ", ".join(living))
            continue
        moved = quarantine(paths.relay, path, "not a valid sent record")
        scan.quarantined += 1
        if moved is not None and envelope_id is not None:  # (one another start moved first is that start's)
            lost[envelope_id] = moved
    scan.left = len(left)
    mine, scan.others = _adopt_dead_writers(paths, records)
    waiting = [record for record in mine if not _forgotten(paths, record)]
    rebuilt, blind = _rebuild_lost(paths, lost, profiles)
    _sort_waiting(paths, waiting + list(rebuilt.values()), scan)
    _restore_rebuilt(paths, rebuilt, blind, scan)
    forgotten = {record.envelope_id for record in mine} - {record.envelope_id for record in waiting}
    recorded = ({record.envelope_id for record in records} - forgotten) | set(rebuilt) | left
    scan.not_ours = sum(1 for envelope_id in rf.list_ids(paths.relay.outbox) if envelope_id not in recorded)
    return scan


def envelope_is_ours(envelope: Mapping[str, Any], profiles: Collection[str]) -> bool:
    """Pure: whether an envelope is provably one a gateway of ours on this root queued.

    Our gateways write ``hop`` into every envelope they queue (``Outbound.send``); a seed gateway's envelope has
    none (``docs/protocol.md``, ``outbox/``), and its sender is a profile of the root alike. Both are required: a
    forged file can carry ``hop`` too, but then names a sender of this root, whom its outcome may wake.

    Args:
        envelope: the envelope, validated (``parse_envelope``).
        profiles: the folder ids of this root's profiles.

    Returns:
        True when it carries ``hop`` and its ``from_profile`` is one of ``profiles``.
    """
    return "hop" in envelope and envelope.get("from_profile") in profiles


def damaged_fate(found: EnvelopeFound, *, traced: bool) -> DamagedFate:
    """Pure: what a start does with the DM of a ``sent/`` record it quarantined (no other gateway of ours alive).

    The record's file name is no evidence whose DM it was (anyone can write a file there):

    Args:
        found: its envelope (``outbox/``, ``expiring/``, ``claimed/`` or a hub's shelf): one of ours
            (:func:`envelope_is_ours`), someone else's (a seed gateway's, a forged one), or none readable.
        traced: something else on the relay names the id: its reply, a file of that name where an envelope goes
            (unreadable), its staged or withdrawn envelope in the temp directory.

    Returns:
        ``"rebuild"`` (its record rebuilt from our envelope, the DM waited for), ``"foreign"`` (not ours: left to
        the Desktop or the hub, no outcome here), ``"blind"`` (where it is cannot be told: ``ambiguous`` unless its
        reply is there) or ``"untraced"`` (nothing says it was ever sent: no outcome is invented).
    """
    if found == "ours":
        return "rebuild"
    if found == "foreign":
        return "foreign"
    return "blind" if traced else "untraced"


def rebuilt_record(envelope_id: str, envelope: dict[str, Any] | None, *, now: float, owner: str) -> SentRecord:
    """Pure: the ``sent/`` record of one of our envelopes whose record was damaged, rebuilt from the envelope.

    The envelope names the DM's target, its sender and hop, and when it was queued: the DM is waited for as its
    own record would have had it (its TTL from ``created_at``: one still in ``outbox/`` at the TTL is taken back and
    answered ``queued_expired``). Whether its outcome wakes the sender was in the record only: the envelope's
    ``wake`` when it says it, else False: a wake nobody asked for runs a turn (the DM may have been sent with wake
    off, as ``hermes-actors send`` sends). The label is the envelope's ``@handle on connection`` (the ack may have
    shown the connection's label instead).

    Args:
        envelope_id: the envelope's id (its quarantined record's name).
        envelope: the envelope, validated (``parse_envelope``); None when none is left to read.
        now: the current time: the record's ``at`` when the envelope does not say when it was queued.
        owner: our shelf's name: the record is ours now.

    Returns:
        The record; with no envelope, one naming nobody as sender and :data:`UNKNOWN_TARGET_LABEL` as target.
    """
    if envelope is None:
        return SentRecord(envelope_id, now, UNKNOWN_TARGET_LABEL, wake=False, owner=owner)
    sender, handle, hop, wake = recorded_sender(envelope, profile_key="from_profile")
    created = rp.created_time(envelope.get("created_at"))
    return SentRecord(envelope_id, now if created is None else created,
                      remote_label(envelope["target_handle"], envelope["target_connection"]), sender, handle, hop,
                      bool(wake), owner)


def _living_others(paths: InboxPaths) -> list[str]:
    """The shelves of the other gateways of ours alive on the root, by the take-over's rule: a shelf in ``taken/``
    whose ``.lock`` a living process holds (:func:`~hermes_actors.store.relay_shelf.shelf_held`), or one a fresh
    heartbeat of a running gateway claims (:func:`~hermes_actors.store.relay_heartbeat.claimed_shelves`). Never
    raises (``taken/`` that cannot be listed: only the heartbeats say)."""
    try:
        names = [name for name in os.listdir(paths.taken_parent)
                 if is_shelf_name(name) and name != paths.taken.name]
    except OSError:
        names = []
    alive = {name for name in names if shelf_held(paths.taken_parent, name)}
    return sorted(alive | (claimed_shelves(paths) - {paths.taken.name}))


def _rebuild_lost(paths: InboxPaths, lost: dict[str, Path], profiles: Collection[str]
                  ) -> tuple[dict[str, SentRecord], set[str]]:
    """The records of the DMs whose ``sent/`` record was quarantined, rebuilt (not written yet) where
    :func:`damaged_fate` says so; the others are logged.

    One whose outcome was reported already (``consumed/``) is left out: nothing is left to do for it.

    Args:
        paths: the relay layout.
        lost: the ids of the quarantined records → where they went.
        profiles: the folder ids of this root's profiles.

    Returns:
        (id → the rebuilt record (:func:`rebuilt_record`), the ids among them with no envelope to rebuild from).
    """
    now = time.time()
    rebuilt: dict[str, SentRecord] = {}
    blind: set[str] = set()
    for envelope_id, moved in lost.items():
        if is_consumed(paths, envelope_id):
            continue
        envelope, traced = _traces_of(paths, envelope_id)
        found: EnvelopeFound = ("none" if envelope is None else
                                "ours" if envelope_is_ours(envelope, profiles) else "foreign")
        fate = damaged_fate(found, traced=traced)
        if fate == "rebuild":
            rebuilt[envelope_id] = rebuilt_record(envelope_id, envelope, now=now, owner=paths.taken.name)
        elif fate == "blind":
            blind.add(envelope_id)
            rebuilt[envelope_id] = rebuilt_record(envelope_id, None, now=now, owner=paths.taken.name)
        elif fate == "foreign":
            logger.warning("relay: the sent/ record of {} was damaged (quarantined as {}) and its envelope is not one "
                           "of ours (no hop, or its sender is no profile of this root: a seed gateway's, or forged): "
                           "left to the Desktop or the hub, no outcome is reported for it here", envelope_id, moved)
        else:
            logger.warning("relay: the sent/ record of {} was damaged (quarantined as {}) and nothing else on this "
                           "root names that DM (no envelope, reply or claim of it): no outcome is reported for it",
                           envelope_id, moved)
    return rebuilt, blind


def _traces_of(paths: InboxPaths, envelope_id: str) -> tuple[dict[str, Any] | None, bool]:
    """What the relay holds of ``envelope_id``: its envelope where the relay keeps one (``outbox/``, ``expiring/``,
    ``claimed/``, a hub's shelf in ``hubclaims/``), validated as any envelope is (a symlink, another user's file, a
    damaged one is not read: logged), and whether anything names the id at all. Never raises.

    Returns:
        (the envelope, or None when none can be read; True when an envelope was found, or a file of that name is
        in one of those places, in ``replies/`` or ``delivered/``, or its staged or withdrawn file in the temp
        directory).
    """
    name = f"{envelope_id}.json"
    base = paths.relay.base
    places = [paths.relay.outbox, paths.expiring, paths.relay.claimed]
    try:
        places += holding_places(paths.hubclaims, base=base)
    except (OSError, ValidationError) as exc:  # HostileFileError included: no hub's claim there is believed
        logger.warning("relay: cannot look for {} on the hub's shelves: {}", envelope_id, exc)
    traced = False
    for directory in places:
        path = directory / name
        try:
            with relay_dir(base, directory) as fd:
                return rf.read_envelope(path, dir_fd=fd), True
        except FileNotFoundError:
            continue
        except (OSError, ValidationError) as exc:  # HostileFileError included
            traced = traced or _names(base, path)
            logger.warning("relay: the envelope {} cannot be read to rebuild its sent/ record from: {}", path, exc)
    others = [(base, paths.relay.replies / name), (base, paths.delivered / name)]
    try:  # the temp directory is beside bot_relay/, in the root
        others += [(paths.relay.root, paths.relay.tmp / queueing_name(envelope_id)),
                   (paths.relay.root, paths.relay.tmp / withdrawn_name(envelope_id))]
    except ValidationError:
        pass
    return None, traced or any(_names(anchor, path) for anchor, path in others)


def _names(anchor: Path, path: Path) -> bool:
    """Whether an entry ``path`` is there (never followed), its directory below ``anchor``; False when it cannot be
    looked at."""
    try:
        return lexists_below(anchor, path)
    except (OSError, ValueError, ValidationError):  # HostileFileError included
        return False


def _restore_rebuilt(paths: InboxPaths, rebuilt: dict[str, SentRecord], blind: set[str], scan: SentScan) -> None:
    """Write again the rebuilt records the scan took as ours (to wait for, or never queued); set the blind ones aside.

    One a living sender on the root is still queueing (``live``) is left to it, unwritten: a record naming our shelf
    would make it drop the DM unreported. One whose record another gateway wrote meanwhile is that gateway's: left to
    it. One whose record cannot be written is still ours in this run (logged). A blind one to wait for goes from
    ``ours`` to ``blind``.
    """
    taken = {record.envelope_id for record in scan.ours + scan.never_queued}
    for envelope_id, record in rebuilt.items():
        if envelope_id not in taken:
            continue
        try:
            made = restore_sent(paths, record)
        except (OSError, ValidationError) as exc:  # StoreError, HostileFileError included
            logger.warning("relay: could not write again the sent/ record of {}: {}; its DM is settled by this run "
                           "all the same (a restart before that finds no record of it)", envelope_id, exc)
            made = True
        if not made:
            logger.info("relay: the sent/ record of {} was written again by another gateway meanwhile: left to it",
                        envelope_id)
            _drop_from(scan, envelope_id)
            scan.others += 1
        elif envelope_id in blind and record in scan.ours:
            scan.ours.remove(record)
            scan.blind.append(record)
            logger.warning("relay: the sent/ record of {} was damaged (quarantined) and no envelope of it is left in "
                           "outbox/, expiring/, claimed/ or on a hub's shelf to rebuild it from, though the relay "
                           "still names it: answered ambiguous unless its reply is here", envelope_id)
        elif envelope_id not in blind:
            logger.warning("relay: the sent/ record of {} was damaged (quarantined): rebuilt from its envelope ({}), "
                           "its DM is waited for as before (its sender woken only if the envelope says so)",
                           envelope_id, record.label)


def _drop_from(scan: SentScan, envelope_id: str) -> None:
    """Take ``envelope_id`` out of the scan's ``ours`` and ``never_queued`` (releasing a withdrawn file's lock)."""
    scan.ours = [record for record in scan.ours if record.envelope_id != envelope_id]
    scan.never_queued = [record for record in scan.never_queued if record.envelope_id != envelope_id]
    lock = scan.withdrawn.pop(envelope_id, None)
    if lock is not None:
        release(lock)


def take_over_sent(paths: InboxPaths, owners: set[str]) -> SentScan:
    """A running gateway: adopt the ``sent/`` records of these writers, which died or stopped after our start.

    The same rules as :func:`scan_sent` for what is adopted (a bad record is left for the next start's
    quarantine); nothing of ``outbox/`` is counted.

    Args:
        paths: the relay layout, ``taken`` being our shelf.
        owners: the shelf names of the gateways on the root that died or went away since the last look.

    A start adopts the dead writer's journal before it resumes, so the outcome that writer already
    journaled drops the relay's report as a second one; a running gateway does not, so it reads the
    root's journals instead (:func:`_set_aside_settled`): a record whose outcome a journal holds
    as delivered is in ``settled``, to forget, never in ``ours``.

    Returns:
        The scan of the records adopted (``ours``, ``never_queued``, ``settled``...); ``others`` counts those
        another gateway holds (still alive after all, or adopting them at this moment).
    """
    records, _bad = list_sent(paths)
    scan = SentScan()
    mine, scan.others = _adopt_dead_writers(paths, [record for record in records if record.owner in owners])
    _sort_waiting(paths, [record for record in mine if not _forgotten(paths, record)], scan)
    _set_aside_settled(paths, scan)
    return scan


def reown_sent(paths: InboxPaths, former: str) -> tuple[int, int]:
    """A running gateway whose shelf was removed under it: make its records that name the former shelf name the
    new one (``paths.taken``), as an adopter would, under the former shelf's lock (made again for the moment).

    Until then its heartbeat claims the former shelf, so no other gateway takes the records for a dead
    gateway's; once they name the new shelf, whose lock it holds, they are its own by the lock alone, and
    are taken over by the usual rule when it stops or dies.

    Args:
        paths: the relay layout, ``taken`` being the new shelf.
        former: the former shelf's name.

    Returns:
        (records now naming the new shelf, records left naming the former one: not rewritten, logged).
    """
    records, _bad = list_sent(paths)
    theirs = [record for record in records if record.owner == former]
    mine, left = _adopt_dead_writers(paths, theirs, claimed=frozenset())  # the claim is ours: not a bar here
    return len(mine), left


def journal_settled(state: DeliveryState | None) -> bool:
    """Pure: whether a journal's state of one of our envelopes says its outcome was published and delivered.

    Its ``finished`` record is written before the outcome is published, its ``delivered`` record with
    the wake that outcome starts (in one batch), or lazily after it when none: the gateway that wrote
    both had nothing left to do but forget the ``sent/`` record. A ``finished`` one without
    ``delivered`` is not settled: its wake may never have been written (a start publishes such an
    outcome again, and wakes the sender from the ``sent/`` record, since a relayed DM's journal holds
    no ``accepted`` record to wake it from).

    Args:
        state: what the root's journals know of the envelope's id (None: nothing).

    Returns:
        True when its outcome is journaled ``finished`` and ``delivered``.
    """
    return state is not None and state.outcome is not None and state.delivered


def _set_aside_settled(paths: InboxPaths, scan: SentScan) -> None:
    """Move out of ``ours`` and ``never_queued`` into ``settled`` the records whose outcome a journal of the
    root holds as delivered (:func:`journal_settled`); the journals are read only when something was taken.

    A journal that cannot be read is logged; its records are reported as before (nothing proves them settled).
    """
    taken = scan.ours + scan.never_queued
    if not taken:
        return
    index = JournalIndex()  # one fold of the root's journals, then each look-up reads only what was appended
    settled: set[str] = set()
    problems: list[str] = []
    for record in taken:
        state, problems = index.state(paths.relay.root, record.envelope_id)
        if journal_settled(state):
            settled.add(record.envelope_id)
    if problems:
        logger.warning("relay: while looking for the outcomes a stopped gateway already reported: {}; the "
                       "envelopes not found are waited for and reported here", "; ".join(problems))
    scan.settled = [record for record in taken if record.envelope_id in settled]
    scan.ours = [record for record in scan.ours if record.envelope_id not in settled]
    scan.never_queued = [record for record in scan.never_queued if record.envelope_id not in settled]


def _sort_waiting(paths: InboxPaths, waiting: list[SentRecord], scan: SentScan) -> None:
    """Sort our records into ``ours`` (to wait for), ``never_queued`` (with their locks) and ``live``."""
    try:
        found = withdraw_unqueued(paths, [record.envelope_id for record in waiting])
    except (OSError, ValidationError) as exc:  # HostileFileError included: unknown, so waited for as before
        logger.warning("relay: could not look for envelopes a killed gateway never queued in {}: {}; waiting for "
                       "every recorded one as before", paths.relay.tmp, exc)
        found = Withdrawn()
    scan.withdrawn = found.never
    for record in waiting:
        if record.envelope_id in found.live:
            scan.live += 1
        else:
            (scan.never_queued if record.envelope_id in found.never else scan.ours).append(record)


def _adopt_dead_writers(paths: InboxPaths, records: list[SentRecord], *, claimed: frozenset[str] | None = None
                        ) -> tuple[list[SentRecord], int]:
    """Ours of the ``sent/`` records: those naming our shelf or none, and those of dead writers, adopted now.

    Each other owner's shelf lock is tried once (:func:`~hermes_actors.store.relay_shelf.take_dead`; a shelf
    that is gone is made again for the adoption, unless a living gateway's heartbeat claims it:
    :func:`~hermes_actors.store.relay_heartbeat.claimed_shelves`, its directory was removed under it, and it
    still waits for them): whoever holds it adopts that writer's records
    (:func:`~hermes_actors.store.relay_sent.adopt_sent`), so no record is waited for by two gateways. A lock
    file that is not one a gateway made proves no owner alive: its records are resumed without adoption, as
    before (logged).

    Args:
        paths: the relay layout, ``taken`` being our shelf.
        records: the ``sent/`` records.
        claimed: the shelves living gateways claim (None: read from the root's heartbeats, when needed).

    Returns:
        (ours, how many records another living gateway, or another adopter, holds; a record we could not
        rewrite is among them: it is left for the next adopter).
    """
    mine: list[SentRecord] = []
    by_owner: dict[str, list[SentRecord]] = {}
    for record in records:
        if not record.owner or record.owner == paths.taken.name:
            mine.append(record)
        else:
            by_owner.setdefault(record.owner, []).append(record)
    others = 0
    if claimed is None:
        claimed = claimed_shelves(paths) if by_owner else frozenset()
    for owner, theirs in by_owner.items():
        try:  # a shelf that is gone is made again to adopt its records, unless a living gateway claims it
            lock = take_dead(paths.taken_parent, owner, remake=owner not in claimed)
        except HostileFileError as exc:
            logger.warning("relay: {}; the {} envelope(s) it recorded are waited for here, as nothing proves their "
                           "gateway alive", exc, len(theirs))
            mine += theirs
            continue
        if lock is None:
            others += len(theirs)
            continue
        try:
            adopted = adopt_sent(paths, owner, [record.envelope_id for record in theirs])
        finally:
            release_dead(paths.taken_parent / owner, lock, within=paths.relay.root)
        mine += adopted
        others += len(theirs) - len(adopted)  # another adopter's since we listed them (or left: logged)
    return mine, others


def _forgotten(paths: InboxPaths, record: SentRecord) -> bool:
    """Whether the envelope's outcome was reported already (``consumed/``): its ``sent/`` record is cleared."""
    if not is_consumed(paths, record.envelope_id):
        return False
    clear_sent(paths, record.envelope_id)
    return True
