"""Live-owner handoff (docs/architecture.md, "Live-owner handoff"): a DM goes to the open Bot Chat window.

While a live owner is attached, the ProfileActor does not run a turn; it hands
the DM to the owner as a normal user turn, through a durable mailbox:

    <profile_home>/runtime/bot_live_delivery/<delivery_id>.json
    {"delivery_id", "status", "state", "at", "reply", "error", "reason"}

``status`` is the key the seed's readers use (``record["status"]``); ``state``, the
same value, is the key earlier hermes-actors releases read and wrote (a root may go
back to one): a record holding either is read.
States: ``queued → claimed → settled | failed | cancelled | ambiguous``.
Admission is idempotent by delivery id: a replay of a settled delivery returns
its recorded result and never runs twice; one found ``claimed`` (the owner
died mid-turn) is ``ambiguous`` — "may have been delivered, do not resend" —
and is never retried; one found ``queued`` was never handed over and is. A DM given up on
before its handoff began (its time ran out while it waited for a worker, or the gateway
stopped) is recorded by its ProfileActor as what the sender was told (``failed`` or
``cancelled``: :func:`record_not_handed`), or stays ``queued`` when the stop leaves it in the
journal for the next start. A final state is never replaced (:meth:`LiveMailbox.advance`):
a DM the gateway itself reports ``ambiguous`` while the owner had it (a stop, a
restart's recovery) is recorded so (:func:`give_up_on`), and an answer the owner
gives after that is not written over it. A file written by another uid is moved
aside, never read. Every read, write and move here goes through directories opened by
the ``O_NOFOLLOW`` walk from the profile home: a ``runtime/`` or ``bot_live_delivery/``
swapped for a symlink is refused, and nothing outside the home is read or written. A
mailbox directory found swapped for a symlink or a file at an admission is quarantined and
made again (:meth:`LiveMailbox.ready`); one that cannot be is named in one WARNING while it lasts.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from loguru import logger

from hermes_actors.core.ids import validate_delivery_id
from hermes_actors.core.outcomes import AMBIGUOUS_TAIL
from hermes_actors.errors import HostileFileError, StoreError, TurnFailed, ValidationError
from hermes_actors.faults import crashpoint
from hermes_actors.local.runners import TurnRunner, checked_reply
from hermes_actors.local.turns import TurnGate, describe_error, never_ran, not_begun, running_turn_of, turn_failed
from hermes_actors.messages import Delivery, Outcome, Turn, TurnFinished
from hermes_actors.store.atomic import atomic_write_json, create_exclusive_json, read_json_file
from hermes_actors.store.journal import StartRecorder
from hermes_actors.store.private_dir import ensure_private_dir
from hermes_actors.store.relay_dirfd import open_dir_below, swapped_below
from hermes_actors.store.relay_quarantine import quarantine_directory, quarantine_into

__all__ = ["LIVE_STATES", "LiveMailbox", "give_up_on", "hand_to_owner", "record_not_handed"]

LIVE_STATES = ("queued", "claimed", "settled", "failed", "cancelled", "ambiguous")
TERMINAL = frozenset({"settled", "failed", "cancelled", "ambiguous"})
# A record's next state is decided by one thread at a time: the worker (the owner's result) and the gateway
# giving up on the turn (the stop, a turn timeout) may both try; the first to write a final state wins.
_DECIDING = threading.Lock()


_SWAPPED = "a live mailbox directory was replaced by a symlink or a file; it is made again"
# The mailbox directories found unusable (and not put back), each named in one WARNING while it lasts.
_UNUSABLE: set[Path] = set()
_UNUSABLE_LOCK = threading.Lock()


def _unusable(directory: Path, exc: BaseException) -> None:
    """Name ``directory`` in a WARNING, once while it stays unusable (every DM handed over meanwhile fails)."""
    with _UNUSABLE_LOCK:
        first = directory not in _UNUSABLE
        _UNUSABLE.add(directory)
    if first:
        logger.warning("live mailbox: {} cannot be used ({}); every DM for this profile's live Bot Chat owner fails "
                       "runtime_offline (NOT delivered) until it is a directory of ours again", directory, exc)


def _usable(directory: Path) -> None:
    """Say once that ``directory``, named unusable before, is usable again."""
    with _UNUSABLE_LOCK:
        if directory not in _UNUSABLE:
            return
        _UNUSABLE.discard(directory)
    logger.info("live mailbox: {} is usable again", directory)


def _record(delivery_id: str, state: str, **fields: str) -> dict[str, Any]:
    """Pure but for the clock: a mailbox record in ``state`` (under both keys, see the module's docstring)."""
    return {"delivery_id": delivery_id, "status": state, "state": state, "at": int(time.time()), "reply": "",
            "error": "", "reason": "", **fields}


class LiveMailbox:
    """One profile's durable live-delivery mailbox.

    Args:
        home: the profile's home directory.
    """

    def __init__(self, home: Path) -> None:
        self.home = home  # the anchor: a runtime/ swapped for a symlink is refused, nothing is written through it
        self.directory = home / "runtime" / "bot_live_delivery"
        self.tmp = self.directory / ".tmp"
        self.quarantine = self.directory / ".quarantine"

    def path(self, delivery_id: str) -> Path:
        return self.directory / f"{validate_delivery_id(delivery_id)}.json"

    def read(self, delivery_id: str) -> dict[str, Any] | None:
        """The record, or None. A foreign or corrupt file is moved aside and reads as None.

        Read through the mailbox directory opened by the ``O_NOFOLLOW`` walk from the profile
        home: a ``runtime/`` or ``bot_live_delivery/`` swapped for a symlink is refused, and
        nothing outside the home is opened.

        Raises:
            HostileFileError: a directory from the home down to the mailbox is a symlink, not a
                directory, or another uid's.
            OSError: the mailbox directory could not be opened (not: it is missing; that reads as None).
        """
        path = self.path(delivery_id)
        try:
            dir_fd = open_dir_below(self.home, self.directory)
        except FileNotFoundError:  # no mailbox (or no home) yet: nothing was handed over
            return None
        try:
            record = read_json_file(path, max_bytes=1 << 20, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except HostileFileError as exc:
            self._move_aside(path, str(exc))
            return None
        finally:
            os.close(dir_fd)
        state = record.get("status", record.get("state")) if isinstance(record, dict) else None
        if state not in LIVE_STATES:
            self._move_aside(path, "not a live-delivery record")
            return None
        return {**record, "status": state}

    def ready(self) -> None:
        """Make sure the mailbox's directories are directories of ours (made 0700 by the walk from the home).

        One swapped for a symlink or a file (``bot_live_delivery/`` itself, its ``.tmp/`` or
        ``.quarantine/``) is quarantined, as is, and made again: the rule the relay's rescan puts
        its directories back by (:func:`~hermes_actors.store.relay_quarantine.quarantine_directory`;
        the move is logged as a WARNING naming it). One that stays unusable (``runtime/`` swapped,
        which is the home's to put back; a directory of another uid; one that cannot be made) is
        named in one WARNING while it lasts, and in an INFO line when it is usable again.

        Raises:
            HostileFileError: a directory on the way is refused (and could not be put back).
            StoreError: a directory could not be made.
        """
        try:
            self._ensure()
        except (HostileFileError, StoreError) as exc:
            if not (isinstance(exc, HostileFileError) and self._put_back()):
                _unusable(self.directory, exc)
                raise
            try:
                self._ensure()
            except (HostileFileError, StoreError) as again:
                _unusable(self.directory, again)
                raise
        _usable(self.directory)

    def _ensure(self) -> None:
        for directory in (self.directory, self.tmp):
            ensure_private_dir(directory, within=self.home)

    def _put_back(self) -> bool:
        """Quarantine each mailbox directory found swapped for a symlink or a file; whether one was moved."""
        moved = False
        for directory in (self.directory, self.quarantine, self.tmp):  # the mailbox first: the others are in it
            try:
                swapped = swapped_below(self.home, directory)
            except (OSError, HostileFileError):  # a directory above it is refused (runtime/): not ours to put back
                return moved
            if swapped and quarantine_directory(directory, self.quarantine, _SWAPPED, within=self.home) is not None:
                moved = True
        return moved

    def admit(self, delivery_id: str) -> dict[str, Any]:
        """Create the record in state ``queued``, or return the one already there (:meth:`ready` first)."""
        self.ready()
        existing = self.read(delivery_id)
        if existing is not None:
            return existing
        record = _record(delivery_id, "queued")
        if create_exclusive_json(self.path(delivery_id), record, tmp_dir=self.tmp, fsync=True, within=self.home):
            return record
        return self.read(delivery_id) or record

    def transition(self, delivery_id: str, state: str, **fields: str) -> dict[str, Any]:
        """Write the record in ``state`` (durably), through the walk from the profile home.

        Raises:
            HostileFileError: a directory from the home down to the mailbox (or its ``.tmp/``) is a
                symlink, not a directory, or another uid's: nothing is written.
            StoreError: the write failed.
        """
        if state not in LIVE_STATES:
            raise ValueError(f"unknown live-delivery state {state!r}")
        record = _record(delivery_id, state, **fields)
        atomic_write_json(self.path(delivery_id), record, tmp_dir=self.tmp, fsync=True, within=self.home)
        return record

    def advance(self, delivery_id: str, state: str, **fields: str) -> dict[str, Any] | None:
        """Write the record in ``state`` unless it is already final (or gone): a final state is never replaced.

        Returns:
            The record written, or None when nothing was written (the record is final or absent).
        """
        with _DECIDING:
            current = self.read(delivery_id)
            if current is None or current["status"] in TERMINAL:
                return None
            return self.transition(delivery_id, state, **fields)

    def close_unbegun(self, delivery_id: str, state: str, **fields: str) -> dict[str, Any] | None:
        """Write the final ``state`` of a DM whose handoff never began, creating the record when there is none.

        Returns:
            The record written, or None when the record was ``claimed`` (an earlier run handed it over: it may
            have been shown) or final already: it is left as it is.
        """
        self.ready()
        with _DECIDING:
            current = self.read(delivery_id)
            if current is None:
                record = _record(delivery_id, state, **fields)
                if create_exclusive_json(self.path(delivery_id), record, tmp_dir=self.tmp, fsync=True,
                                         within=self.home):
                    return record
                current = self.read(delivery_id)  # admitted just now by its worker: queued, taken over here
            if current is None or current["status"] != "queued":
                return None
            return self.transition(delivery_id, state, **fields)

    def _move_aside(self, path: Path, why: str) -> None:
        """Quarantine a refused record into ``.quarantine/`` (the relay's rule: renamed by the walk from the
        home, a symlink moved as is); one that cannot be moved stays, unread (both logged)."""
        quarantine_into(self.quarantine, path, f"live mailbox: {why}", within=self.home)


def _from_record(delivery_id: str, record: dict[str, Any]) -> TurnFinished:
    """A replayed delivery: report what the mailbox recorded; never run it again."""
    state = record["status"]
    if state == "settled":
        return TurnFinished(delivery_id, str(record.get("reply") or ""))
    if state == "failed":
        return TurnFinished(delivery_id, None, str(record.get("error") or "the live owner failed the turn"),
                            str(record.get("reason") or ""))
    if state == "cancelled":
        why = str(record.get("error") or "The live Bot Chat owner cancelled this DM; it was NOT delivered.")
        return TurnFinished(delivery_id, None, why, "cancelled")
    why = str(record.get("error") or "The live Bot Chat owner took this DM and never settled it.")
    return TurnFinished(delivery_id, None, why, str(record.get("reason") or "unknown"), ambiguous=True)


_HANDING = "handing the DM to the live Bot Chat owner"
_JOURNALING = "recording the turn durably"


def hand_to_owner(
    delivery: Delivery, *, owner: TurnRunner, home: Path, make_turn: Any, journal: StartRecorder | None,
    gate: TurnGate | None = None,
) -> TurnFinished:
    """Run ``delivery`` as a user turn of the attached live owner (worker thread).

    ``gate`` (the ProfileActor's, as a runner's turn has) decides once between the handoff
    beginning and the turn's timeout or the gateway's stop. Given up on first, the owner never
    sees the DM and nothing more is written here: the ProfileActor settled it and records what
    it decided (:func:`record_not_handed`: ``failed`` when its time ran out, ``cancelled`` by
    the stop), or the stop left it in the journal, its record (if any) still ``queued``, and the
    next start hands it over. Begun, the timeout reports it ``ambiguous`` and records it so
    (:func:`give_up_on`), and the owner is not handed it after that.

    Every path returns a result at once (docs/reliability.md): a failure before the
    owner is called (admission, the move to ``claimed``, the journal, building the
    turn) is ``failed`` with ``runtime_offline`` (retryable: it was NOT delivered);
    the owner raising ``TurnFailed`` is what a runner raising it is
    (:func:`~hermes_actors.local.turns.turn_failed`): ``failed`` with its reason, or
    ``ambiguous`` when it says ``ambiguous=True``, and its mailbox record says which; the
    owner raising anything else, ``SystemExit`` and ``KeyboardInterrupt`` included, or
    returning anything but a str (:func:`~hermes_actors.local.runners.checked_reply`, as
    for a runner), is ``ambiguous`` (it may have shown the DM). A mailbox write failing
    after the owner answered does not change the answer (it is logged).

    The turn's ``started`` record (``"live": true``) is journaled after the record is
    ``claimed`` and before the owner is called: the next start then knows the owner may
    have had the DM without trusting the file (``core.recovery.owner_outcome``); a crash
    before it leaves the DM unstarted, re-offered, and its record (``queued``, or
    ``claimed``: ``ambiguous``) decides.

    Returns:
        The result for the ProfileActor; ``ambiguous`` when the owner died mid-turn.
    """
    box = LiveMailbox(home)
    key = delivery.delivery_id
    if gate is not None and gate.given_up():  # given up on before its worker came to it (e.g. a stop): no record
        return not_begun(key)
    try:
        record = box.admit(key)
    except (StoreError, OSError, ValidationError) as exc:
        return never_ran(key, "live delivery admission", exc)
    if record["status"] != "queued":
        return _from_record(key, record)
    if gate is not None and not gate.begin():  # given up on just now: settled (and recorded) by its ProfileActor
        return not_begun(key)  # the record stays "queued" unless that wrote it: a re-offer hands it over
    step = _HANDING
    try:
        claimed = box.advance(key, "claimed")
        if claimed is not None and journal is not None:
            # Journaled once the record is claimed and before the owner is called: a started record saying
            # "live" tells the next start that the owner may have the DM, whatever the file says by then
            # (another writer of our uid may have set it back to queued), so recovery never offers it again.
            step = _JOURNALING
            journal.append_durably({"t": "started", "id": key, "attempt": 1, "live": True})
            step = _HANDING
        crashpoint("mid-turn")
        turn: Turn | None = make_turn(delivery) if claimed is not None else None
    except Exception as exc:  # the owner never saw it: fail it now, and on disk so a replay never runs it
        if step is _HANDING:  # a journal refusal is the journal's to report
            logger.exception("live handoff of {} failed before the owner was called", key)
        result = never_ran(key, step, exc)
        _record_quietly(box, key, "failed", error=result.error, reason=result.reason)
        return result
    if turn is None:  # its timeout gave it up (recorded ambiguous) after the gate: the owner never sees it
        return _from_record(key, box.read(key) or record)
    try:
        # the check every runner's reply goes through: None (or any non-str) is the owner failing, never 'None'
        with running_turn_of(make_turn):  # a Gateway.stop() from the owner's turn is refused, as from a runner's
            reply = checked_reply(owner.run_turn(turn), owner, "live owner")
    except TurnFailed as exc:  # the rule a runner's TurnFailed follows: ambiguous=True is "do not resend"
        result = turn_failed(key, exc)
        _record_quietly(box, key, "ambiguous" if result.ambiguous else "failed", error=result.error,
                        reason=result.reason)
        return result
    except BaseException as exc:  # the owner died mid-turn: it may have delivered, never re-run
        why = f"The live Bot Chat owner failed mid-turn ({describe_error(exc)})."
        _record_quietly(box, key, "ambiguous", error=why, reason="unknown")
        return TurnFinished(key, None, why, "unknown", ambiguous=True)
    _record_quietly(box, key, "settled", reply=reply)
    return TurnFinished(key, reply)


def _record_quietly(box: LiveMailbox, key: str, state: str, **fields: str) -> None:
    """Write the mailbox record unless it is final already (the gateway gave the DM up as ``ambiguous`` first:
    that stays); a store error is logged: the sender's result must not depend on it."""
    try:
        if box.advance(key, state, **fields) is None:
            logger.info("live mailbox: {} was settled already (or its record is gone); not recorded as {}",
                        key, state)
    except Exception:
        logger.exception("live mailbox: could not record {} as {}", key, state)


def record_not_handed(home: Path, outcome: Outcome) -> None:
    """Record, in the live mailbox of ``home``, a DM its ProfileActor gave up on before the handoff began.

    The record says what the sender was told: ``cancelled`` by the stop, else ``failed`` (its
    time ran out while it waited for a worker), with the outcome's text and reason; the owner
    never sees it. A record ``claimed`` or final already is left as it is; a store error is
    logged (the sender's outcome does not depend on it).

    Args:
        home: the profile's home.
        outcome: the DM's outcome (``failed``: NOT delivered).
    """
    state = "cancelled" if outcome.reason == "cancelled" else "failed"
    try:
        LiveMailbox(home).close_unbegun(outcome.delivery_id, state, error=outcome.error, reason=outcome.reason)
    except Exception:
        logger.exception("live mailbox: could not record {} as {}", outcome.delivery_id, state)


def give_up_on(home: Path, delivery_id: str, error: str) -> bool:
    """Record, in the live mailbox of ``home``, a DM the gateway reports ``ambiguous`` while its owner turn may
    still run (the gateway stopped or died mid-turn, or the turn timed out). Idempotent: a record already final,
    or none (the DM never went to a live owner), is left as it is.

    Args:
        home: the profile's home.
        delivery_id: the DM.
        error: the ambiguous outcome's error (its "do not resend" tail is not stored: a replay adds it).

    Returns:
        False when the record was final already (the owner's turn ended first: its result stands); True
        otherwise (also when there is no record, or writing it failed: that is logged).
    """
    box = LiveMailbox(home)
    try:
        if box.advance(delivery_id, "ambiguous", error=error.removesuffix(AMBIGUOUS_TAIL), reason="unknown"):
            return True
        return box.read(delivery_id) is None  # a final record never changes back: read outside the lock is safe
    except Exception:  # a store error: the DM's outcome stands; a replay reads "claimed" as ambiguous too
        logger.exception("live mailbox: could not record {} as ambiguous", delivery_id)
        return True
