"""The journal's records: encoding them, reading a file's lines back, folding them into per-delivery state.

Pure, apart from reading a stream it is handed. Each line of a journal file is one
orjson record::

    {"t": "accepted",  "id", "d": {delivery fields}}   durable before the ack returns
    {"t": "started",   "id", "attempt"}                 durable before the turn runs
    {"t": "started",   "id", "attempt", "live": true}   a DM handed to a live owner: written once its
                                                        mailbox record is ``claimed``, before the owner is called
    {"t": "started",   "id", "attempt", "via": "warm"}  how the turn runs ("warm" or "cli"), durable before it
                                                        runs that way; written by a runner that picks per turn
                                                        (the last one counts; absent in older journals: unknown;
                                                        one for an id not folded so far is ignored, see
                                                        :func:`fold_records`)
    {"t": "finished",  "id", "o": {outcome dict}}       durable before the outcome is published
    {"t": "finished",  "id", "o": {...}, "origin": "wake"}  a settled delivery compaction or adoption rewrote
                                                        without its ``accepted`` record: the origin that record
                                                        gave (absent in older journals: unknown, see
                                                        :func:`delivery_origin`); a relayed-in DM's outcome is
                                                        written so, ``"origin": "relay"``, with its
                                                        ``delivered`` record (its ``accepted`` record, with its
                                                        ``started`` one, only once its turn started)
    {"t": "delivered", "id"}                            the outcome reached the sender (lazy)

Readers skip the zeros a killed gateway's file was allocated ahead with (see
:func:`parse_lines`) and a line torn by a crash. The writer is
:class:`hermes_actors.store.journal.Journal`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO, get_args

import orjson

from hermes_actors.core.ids import is_delivery_id
from hermes_actors.records import Origin

__all__ = [
    "COMPACT_AFTER_BYTES",
    "KEPT_OUTCOMES_BYTES",
    "MAX_JOURNAL_BYTES",
    "MAX_LINE_BYTES",
    "DeliveryState",
    "JournalFolded",
    "delivery_origin",
    "encode_record",
    "fold_lines",
    "fold_records",
    "parse_lines",
    "read_lines",
    "state_records",
]

# A finished record holds an outcome: its reply and its text, each up to outcomes.TEXT_MAX_BYTES, which JSON may
# escape to 6 bytes a byte (\u00XX). A line past this is damage, refused unread.
MAX_LINE_BYTES = 64 << 20
# How large a journal file of ours grows. Lines alone bound nothing (50,000 lines of up to 64 MiB each), so a file is
# also compacted once COMPACT_AFTER_BYTES were appended since it was last written whole (store.journal), and a file
# written whole carries, of each bin of delivered outcomes it keeps, only the newest whose records fit in
# KEPT_OUTCOMES_BYTES (store.journal_state). A file of ours is then at most the DMs in flight, 2 x KEPT_OUTCOMES_BYTES
# of kept outcomes, COMPACT_AFTER_BYTES appended and its last batch: far under MAX_JOURNAL_BYTES unless hundreds of
# MiB of DMs are in flight at once. A j-*.log larger than that is damage or was put there (`truncate -s 1G`): it is
# refused unread (store.journal_screen.journal_verdict), never read in full by a start, `outcome`, `status` or doctor.
COMPACT_AFTER_BYTES = 128 << 20
KEPT_OUTCOMES_BYTES = 64 << 20
MAX_JOURNAL_BYTES = 512 << 20


@dataclass
class DeliveryState:
    """What the journal knows of one delivery."""

    delivery: dict[str, Any] | None = None
    started: int = 0
    outcome: dict[str, Any] | None = None
    delivered: bool = False
    # An ``accepted`` record came without a delivery object (``"d": "hello"``, no ``d``): a sender may have
    # been acked for a DM nothing can rebuild, so recovery names it instead of taking it for a torn record.
    unreadable_acceptance: bool = False
    # A ``started`` record said ``"live": true``: the DM went to a live owner (claimed in its mailbox before the
    # owner was called), so recovery never re-offers it, whatever the mailbox file says by then.
    live: bool = False
    # The last ``via`` a ``started`` record gave ("warm" or "cli"): how the turn ran; None when unknown (an older
    # journal, a runner that does not say), then recovery words it by the runner's ``runs_apart``.
    via: str | None = None
    # The origin a ``finished`` record kept for a settled delivery rewritten without its ``accepted`` record
    # (compaction, adoption); None when it said none (an older journal). Read through :func:`delivery_origin`.
    origin: str | None = None


def delivery_origin(state: DeliveryState) -> str | None:
    """Pure: where a journaled delivery came from (``local``, ``wake``, ...: :data:`~hermes_actors.records.Origin`).

    The one rule for telling a journaled wake turn (or any origin) apart, whether its file still holds its
    ``accepted`` record or was rewritten (compaction, adoption) with only its outcome.

    Args:
        state: what a fold knows of the delivery.

    Returns:
        Its ``accepted`` record's origin (``local`` when that record names none), else the origin its
        rewritten ``finished`` record kept; None when neither is known (a journal rewritten by an older version).
    """
    if isinstance(state.delivery, dict):
        origin = state.delivery.get("origin", "local")
        return origin if isinstance(origin, str) else None
    return state.origin


@dataclass
class JournalFolded:
    """The folded state of one or more journal files."""

    states: dict[str, DeliveryState] = field(default_factory=dict)
    corrupt_lines: int = 0
    files: list[str] = field(default_factory=list)  # adoption: the names of the journal files folded into it

    def live(self) -> dict[str, DeliveryState]:
        """Deliveries whose outcome has not reached the sender yet."""
        return {k: s for k, s in self.states.items() if not s.delivered}


def encode_record(record: dict[str, Any]) -> bytes:
    """Pure: one journal line (orjson, newline-terminated) for ``record``."""
    return orjson.dumps(record) + b"\n"


def parse_lines(lines: Iterable[bytes | None]) -> Iterator[dict[str, Any] | None]:
    """Pure: decode journal lines one at a time; ``None`` for a torn or corrupt line (crash mid-write).

    Zero bytes separate lines too: a journal file ends in the zeros its writer allocated
    ahead (a gateway that was killed never trimmed them), and a power cut can leave such
    zeros where lazy records had not reached the disk yet. A record never holds a zero
    byte (JSON escapes it). ``None`` in ``lines`` stands for a line :func:`read_lines`
    refused as too long. A record of a kind we never write, or whose id is not a delivery
    id (the id names files and turns: ``../x`` must never reach them), is corrupt too.
    """
    for line in _pieces(lines):
        if line is None:
            yield None
            continue
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            yield None
            continue
        if isinstance(record, dict) and is_delivery_id(record.get("id")) and record.get("t") in _KINDS:
            yield record
        else:
            yield None


def fold_lines(lines: Iterable[bytes | None], into: JournalFolded) -> int:
    """Fold a journal file's lines into ``into`` as they are read; a line is never kept once folded.

    A journal of millions of records costs its folded state, not a list of every record too.

    Args:
        lines: the file's lines (:func:`read_lines`).
        into: the state to fold into; its ``corrupt_lines`` grows by the corrupt lines found.

    Returns:
        How many corrupt lines these lines had (an ``accepted`` record without a delivery object is one;
        its id is folded, marked ``unreadable_acceptance``, so recovery can name it).
    """
    bad = 0
    for record in parse_lines(lines):
        if record is None:
            bad += 1
            continue
        fold_records((record,), into)
        if _acceptance_unreadable(record):  # damage too: its file is kept (quarantined) for whoever looks
            bad += 1
    into.corrupt_lines += bad
    return bad


_KINDS = frozenset({"accepted", "started", "finished", "delivered"})
_VIAS = ("warm", "cli")
_ORIGINS = frozenset(get_args(Origin))


def _late_via(record: dict[str, Any], states: dict[str, DeliveryState]) -> bool:
    """Pure: ``record`` is a ``started`` record carrying ``via`` for an id ``states`` does not track (see
    :func:`fold_records`).

    :class:`~hermes_actors.ops.journal_index.JournalIndex` folds each file on its own, so a late one in a file
    whose id only an earlier file tracks is dropped there, where a fold of the whole root applies it. Left so
    on purpose (review diffrev15): no writer makes that layout with another answer. A ``via`` record is written
    (``local.turns.via_recorder``) by the gateway running the turn, into its own file, after that file's
    records of the delivery (its ``accepted``, or the copy adoption wrote before recovery ran it; compaction
    and a lost file's rewrite keep them, ``accepted`` first). Only a state without a readable delivery
    (damage: recovery never runs it) is copied by adoption or compaction as a lone ``started`` with ``via``;
    the damaged file it came from is quarantined, and while it is still in the directory (before the move,
    or the move failed) its fold of that id holds the same attempt and ``via``. A late record proper (a turn
    outliving its timeout and the last 10,000 outcomes) applied to such a leftover file's id would be the
    delivery of nothing this rule exists to avoid.
    """
    return record["t"] == "started" and "via" in record and record["id"] not in states


def _acceptance_unreadable(record: dict[str, Any]) -> bool:
    """Pure: ``record`` is an ``accepted`` record without a delivery object (damage, or a foreign line)."""
    return record["t"] == "accepted" and not isinstance(record.get("d"), dict)


_ZEROS = re.compile(b"\0+")


def _pieces(lines: Iterable[bytes | None]) -> Iterable[bytes | None]:
    """The lines split at runs of zero bytes as well (see :func:`parse_lines`)."""
    for line in lines:
        if line is not None and b"\0" in line:
            yield from _ZEROS.split(line)
        else:
            yield line


def read_lines(stream: BinaryIO) -> Iterator[bytes | None]:
    """The lines of a journal file, each read with a bounded buffer; ``None`` for a line over MAX_LINE_BYTES.

    A hostile or damaged file (one line of gigabytes) costs one bounded read at a time and
    is never held whole; :func:`parse_lines` counts the refused line as corrupt.
    """
    while True:
        line = stream.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):  # skip the rest of that line, a bounded chunk at a time
                line = stream.readline(MAX_LINE_BYTES + 1)
            yield None
            continue
        yield line


def fold_records(records: Iterable[dict[str, Any]], into: JournalFolded | None = None) -> JournalFolded:
    """Pure: fold records (in file order) into per-delivery state.

    A ``started`` record carrying ``via`` for an id not folded so far is ignored: it only says how a turn
    runs, and comes after that turn's own ``started`` record; one that finds no state is late (written after
    its DM was ``delivered`` and left the live state, by a turn that outlived its timeout), and folded it would
    be a delivery of nothing, kept and rewritten by every compaction and named at a stop as an acked DM
    without an outcome. Older journals may hold such a line (compaction wrote it back on its own).
    """
    folded = into or JournalFolded()
    for record in records:
        if _late_via(record, folded.states):
            continue
        state = folded.states.setdefault(record["id"], DeliveryState())
        kind = record["t"]
        if kind == "accepted":
            if _acceptance_unreadable(record):
                state.unreadable_acceptance = True
            else:
                state.delivery = record["d"]
        elif kind == "started":
            attempt = record.get("attempt")  # anything but a sane count (a corrupt line) counts as one start
            if not isinstance(attempt, int) or isinstance(attempt, bool) or not 1 <= attempt <= 1000:
                attempt = 1
            state.started = max(state.started, attempt)
            state.live = state.live or record.get("live") is True
            if record.get("via") in _VIAS:  # anything else (a foreign or damaged value) leaves it unknown
                state.via = record["via"]
        elif kind == "finished" and isinstance(record.get("o"), dict) and state.outcome is None:
            state.outcome = record["o"]  # the first outcome wins
            if record.get("origin") in _ORIGINS:  # anything else (a foreign or damaged value) leaves it unknown
                state.origin = record["origin"]
        elif kind == "delivered":
            state.delivered = True
    return folded


def state_records(key: str, state: DeliveryState) -> list[dict[str, Any]]:
    """Pure: records that fold back into ``state`` (:func:`fold_records`), in the order they must be written.

    What compaction and adoption write for a delivery, and how the states one id has in
    several files are combined as one fold of those files would: each file's records, in file
    order (``fold_records`` is the one rule; a second copy of it could not drift).

    Args:
        key: the delivery id.
        state: what a fold knows of it.

    Returns:
        ``accepted`` (with its delivery; one without, when an unreadable acceptance was seen),
        ``started`` (its highest attempt, ``live``, ``via``), ``finished`` (with the delivery's origin when
        no ``accepted`` record is written: :func:`delivery_origin` of the fold gives it back), ``delivered``:
        each only when ``state`` has it.
    """
    records: list[dict[str, Any]] = []
    if state.unreadable_acceptance:
        records.append({"t": "accepted", "id": key})
    if state.delivery is not None:
        records.append({"t": "accepted", "id": key, "d": state.delivery})
    if state.started:
        started: dict[str, Any] = {"t": "started", "id": key, "attempt": state.started}
        if state.live:
            started["live"] = True
        if state.via is not None:  # compaction keeps how the turn ran
            started["via"] = state.via
        records.append(started)
    if state.outcome is not None:
        finished: dict[str, Any] = {"t": "finished", "id": key, "o": state.outcome}
        origin = delivery_origin(state)
        if state.delivery is None and origin is not None:  # its accepted record is not rewritten: keep the origin
            finished["origin"] = origin
        records.append(finished)
    if state.delivered:
        records.append({"t": "delivered", "id": key})
    return records
