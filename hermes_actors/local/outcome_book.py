"""The Dispatcher's book of outcomes: which deliveries are pending, being journaled, settled.

:class:`OutcomeBook` is owned by the DispatcherActor and used on its thread
only; it is the one place that changes the pending, settled and waiter
tables. Each delivery id is in exactly one :class:`DeliveryState`.

Settled outcomes are the one table that grows with traffic (up to
:data:`SETTLED_KEEP`), so :class:`SettledOutcomes` keeps them compact: one
``marshal`` blob per outcome instead of an 8-key dict, rebuilt into an equal
dict on every read. A stopping gateway gets them as they are (:meth:`OutcomeBook.export`)
and rebuilds only the one it is asked for.
"""

from __future__ import annotations

import contextlib
import marshal
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Literal

import pykka
from loguru import logger

from hermes_actors.store.journal_state import KEEP_DELIVERED

__all__ = [
    "SETTLED_KEEP", "Answers", "DeliveryState", "KeptOutcomes", "OutcomeBook", "Packed", "Pending", "Route",
    "SettledOutcomes", "answer", "unknown_delivery", "unpack_outcome",
]

SETTLED_KEEP = 100_000  # settled outcomes remembered for wait_outcome (oldest dropped first; bounds memory)
#: The keys of an outcome dict, in order (``Outcome.as_dict``): such a dict is stored as its values only.
OUTCOME_KEYS = ("delivery_id", "status", "reply", "error", "reason", "retryable", "from", "text")
#: A blob longer than this (a long reply, kept twice: ``reply`` and ``text``) is stored zlib-compressed.
COMPRESS_OVER = 512
GENERATIONS = 8  # settled outcomes are kept in this many dicts, the oldest dropped whole (see SettledOutcomes)
_ZLIB = b"\x00"  # tags a compressed blob (a marshal dump never starts with a zero byte)

#: An outcome as the book keeps it (:func:`pack_outcome`): a blob, or a dict ``marshal`` cannot dump.
Packed = bytes | dict[str, Any]
#: Delivery id → its outcome as the book keeps it (a :data:`Packed`; :func:`unpack_outcome` reads one): what
#: :meth:`OutcomeBook.export` hands a stopping or failed gateway, unread on the way (``facade.shutdown``,
#: ``facade.failure``, ``system``) to ``facade.outcomes.OutcomeWaits``, which unpacks the one asked for.
KeptOutcomes = dict[str, Packed]

#: How a pending delivery travels: to a local profile, to another connection through the
#: relay (ours, awaiting a reply), drained from the relay and run here, to a bot_peers peer,
#: or a group room member's turn (its outcome goes back to the room).
Route = Literal["local", "relay", "relay-in", "peer", "room"]


#: ``wait_outcome`` futures and the outcome dict each is to be set with (see :meth:`OutcomeBook.settle`).
Answers = list[tuple[pykka.ThreadingFuture[dict[str, Any]], dict[str, Any]]]


def answer(answers: Answers) -> None:
    """Set each future of ``answers`` with its outcome dict."""
    for future, record in answers:
        _answer_one(future, record)


def _answer_one(future: pykka.ThreadingFuture[dict[str, Any]], record: dict[str, Any]) -> None:
    # A stopped Gateway answers its waiters' futures itself (Gateway._end_waits); a Dispatcher still
    # running after a stop that was not clean must not crash on one answered already.
    try:
        future.set(record)
    except Exception:
        logger.debug("an outcome waiter was answered already (its gateway stopped)")


def unknown_delivery(delivery_id: str, root: Path | None = None, unread: Sequence[str] = ()) -> str:
    """Pure: why a running gateway has no outcome for ``delivery_id`` (the text of ``wait_outcome``'s KeyError).

    Not knowing it does not mean it was never issued here: an outcome is kept only so long (the journal carries
    at least the last :data:`KEEP_DELIVERED` delivered across restarts, the book at least the last
    :data:`SETTLED_KEEP` while its gateway runs). A chaos review's restarted gateway said "this gateway did
    not issue it" of DMs its root had acked and settled long before. Nor, when a journal file of the root was
    not read (a symlink or another user's file, refused; a FIFO in place of one, moved into quarantine by the
    start), that it was never acked: a fuzz review's gateway said so of DMs journaled in a file swapped so.

    Args:
        delivery_id: the id asked for.
        root: the Hermes root whose journals were looked in (None: not named).
        unread: one line per journal file of the root that was not read (what it is, where it went).

    Returns:
        The message.
    """
    journals = f"no journal on {root}" if root is not None else "no journal of its root"
    text = (f"unknown delivery id {delivery_id!r}: this gateway holds no outcome for it and {journals} does: "
            f"it was never acked on this root, or its outcome is older than the ones kept (at least the last "
            f"{KEEP_DELIVERED:,} delivered, in the journal across restarts; at least the last {SETTLED_KEEP:,}, "
            "in this gateway's memory while it runs) and its subscribers were told when it settled")
    if unread:
        text += f"; or it is journaled in a journal file that was not read: {'; '.join(unread)}"
    return text


class DeliveryState(Enum):
    """Where one delivery id stands in the Dispatcher."""

    UNKNOWN = "unknown"  # never issued here (or forgotten: older than SETTLED_KEEP)
    PENDING = "pending"  # accepted, no outcome yet
    JOURNALING = "journaling"  # the outcome is known and is being made durable before it is published
    SETTLED = "settled"  # the outcome is published: wait_outcome answers it


@dataclass
class Pending:
    """A delivery the Dispatcher accepted and that has no outcome yet.

    Attributes:
        delivery: the delivery.
        route: how it travels.
        reply_connection: for ``relay-in``, the connection that waits for the reply.
        journaled: the journal records its lifecycle (durable mode).
        room_reply: for ``room``, called with the outcome (it goes back to the RoomActor).
    """

    delivery: Any  # messages.Delivery
    route: Route
    reply_connection: str = ""
    journaled: bool = False
    room_reply: Callable[[Any], None] | None = None


def pack_outcome(key: str, record: dict[str, Any]) -> Packed:
    """Pure: the compact form of the outcome dict of ``key`` (:func:`unpack_outcome` rebuilds it).

    An ``Outcome.as_dict`` of ``key`` becomes the ``marshal`` dump of its values
    without the delivery id; any other dict (e.g. one remembered from the journal)
    the dump of the whole dict; a dump over :data:`COMPRESS_OVER` bytes is
    zlib-compressed. A dict ``marshal`` cannot dump is kept as it is.

    Args:
        key: the delivery id the record is stored under.
        record: the outcome dict.

    Returns:
        The blob, or ``record`` itself when it cannot be dumped.
    """
    values = tuple(record.values())
    shaped = values[:1] == (key,) and tuple(record) == OUTCOME_KEYS
    try:
        blob = marshal.dumps(values[1:] if shaped else record)
    except ValueError:  # a value marshal does not know (not JSON-like): keep the dict
        return record
    return _ZLIB + zlib.compress(blob, 1) if len(blob) > COMPRESS_OVER else blob


def unpack_outcome(key: str, packed: Packed) -> dict[str, Any]:
    """Pure: the outcome dict that :func:`pack_outcome` made ``packed`` from (a new, equal dict)."""
    if isinstance(packed, dict):
        return packed
    value = marshal.loads(zlib.decompress(packed[1:]) if packed[:1] == _ZLIB else packed)
    if isinstance(value, dict):
        return value
    status, reply, error, reason, retryable, from_, text = value
    return {"delivery_id": key, "status": status, "reply": reply, "error": error, "reason": reason,
            "retryable": retryable, "from": from_, "text": text}


class SettledOutcomes:
    """The last ``keep`` settled outcomes by delivery id, compact (oldest dropped first).

    Memory per entry, measured with tracemalloc on 100,000 ``replied`` outcomes
    (reply ``"ok"``, a fresh sender label each, Python 3.11): 568 bytes as the
    former ``OrderedDict`` of outcome dicts, 200 bytes here (the id string, one
    blob and a dict slot). The values are immutable bytes, so no reader can
    change what the next reader gets.

    The outcomes live in :data:`GENERATIONS` dicts filled in turn, and the oldest
    dict is dropped whole. One dict that loses its oldest entry on every insert
    fills with deleted slots and rebuilds its whole table (7.7 MB at 100,000
    entries) every ~250,000 inserts, the new table allocated while the old one is
    alive: measured, that left RSS a table higher at some rebuilds. A generation
    never deletes, so it never rebuilds once it is full.

    Args:
        keep: how many outcomes are remembered at least (once that many were
            stored); at most ``keep`` plus one generation (``keep / GENERATIONS``).
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._generation_size = max(1, keep // GENERATIONS)
        self._generations: deque[dict[str, Packed]] = deque([{}])  # oldest first
        self._count = 0

    def __contains__(self, key: object) -> bool:
        # newest first: the recent ids are the ones asked about
        return any(key in generation for generation in reversed(self._generations))

    def __len__(self) -> int:
        return self._count

    def get(self, key: str) -> dict[str, Any] | None:
        """The outcome dict of ``key`` (a new dict each call), or None."""
        for generation in reversed(self._generations):
            packed = generation.get(key)
            if packed is not None:
                return unpack_outcome(key, packed)
        return None

    def put(self, key: str, record: dict[str, Any]) -> None:
        """Store the outcome of ``key``; beyond ``keep`` the oldest go.

        Not checked here: whether ``key`` is stored already (a rewrite, rare, is
        stored again as the newest; every read finds the newest copy first).
        """
        current = self._generations[-1]
        if key in current:
            current[key] = pack_outcome(key, record)
            return
        if len(current) >= self._generation_size:
            current = {}
            self._generations.append(current)
        current[key] = pack_outcome(key, record)
        self._count += 1
        while len(self._generations) > 1 and self._count - len(self._generations[0]) >= self.keep:
            self._count -= len(self._generations.popleft())

    def packed(self) -> KeptOutcomes:
        """Every id → its outcome as stored (:func:`unpack_outcome` reads one), oldest first; a rewritten id
        once, with its newest copy. The blobs are shared, not copied: the dict costs a table slot per id."""
        kept: KeptOutcomes = {}
        for generation in self._generations:  # oldest first: a newer copy of an id overwrites an older one
            kept.update(generation)
        return kept

    def items(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every ``(id, outcome dict)``, oldest first (a rewritten id twice, its newest copy last)."""
        for generation in self._generations:
            for key, packed in generation.items():
                yield key, unpack_outcome(key, packed)


class OutcomeBook:
    """Pending deliveries, settled outcomes and the futures waiting for them.

    Args:
        keep: how many settled outcomes are remembered (oldest dropped first; default :data:`SETTLED_KEEP`).
    """

    def __init__(self, keep: int | None = None) -> None:
        keep = SETTLED_KEEP if keep is None else keep
        self.keep = keep
        self._pending: dict[str, Pending] = {}
        self._journaling: dict[str, tuple[dict[str, Any], Any]] = {}  # id → (outcome dict, Delivery | None)
        self._settled = SettledOutcomes(keep)
        self._waiters: dict[str, list[pykka.ThreadingFuture[dict[str, Any]]]] = {}

    # ── reading ─────────────────────────────────────────────────────────────

    def state(self, key: str) -> DeliveryState:
        """The state of delivery ``key``."""
        if key in self._pending:
            return DeliveryState.PENDING
        if key in self._journaling:
            return DeliveryState.JOURNALING
        if key in self._settled:
            return DeliveryState.SETTLED
        return DeliveryState.UNKNOWN

    def has_outcome(self, key: str) -> bool:
        """True once an outcome for ``key`` arrived (a second one is dropped)."""
        return self.state(key) in (DeliveryState.JOURNALING, DeliveryState.SETTLED)

    def record(self, key: str) -> dict[str, Any] | None:
        """The outcome dict of ``key`` (journaling or settled), or None."""
        journaling = self._journaling.get(key)
        return journaling[0] if journaling is not None else self._settled.get(key)

    def entry(self, key: str) -> Pending | None:
        """The pending entry of ``key`` (None unless it is pending)."""
        return self._pending.get(key)

    def delivery(self, key: str) -> Any:
        """The ``Delivery`` of ``key`` while it is pending or journaling (None otherwise)."""
        entry = self._pending.get(key)
        if entry is not None:
            return entry.delivery
        journaling = self._journaling.get(key)
        return journaling[1] if journaling is not None else None

    def pending(self) -> list[tuple[str, Pending]]:
        """A copy of the pending entries, oldest first."""
        return list(self._pending.items())

    def pending_count(self) -> int:
        """How many deliveries wait for an outcome."""
        return len(self._pending)

    def export(self) -> KeptOutcomes:
        """The published outcomes a stopped (or failed) Gateway keeps answering, as the book holds them.

        A journaling outcome is left out: its record is not known to be on disk (held back by a
        full disk, or its commit still running), so handing it over would publish it, and the next
        start, settling the DM as its journal says (re-offered, or ``ambiguous``), would give it a
        second outcome. The stopped gateway answers such an id from the root's journal instead.

        The settled ones stay packed (:func:`unpack_outcome` rebuilds the one asked for): rebuilt all
        at once, they held every reply in full, twice (``reply`` and ``text``), in the stopped Gateway
        (soak review: 61 MB of RSS with 2,000 200 KB replies settled, 832 MB after ``stop()``).

        Returns:
            Delivery id → its :data:`Packed` outcome, at most what the book holds (``keep`` bounds it).
        """
        return self._settled.packed()

    # ── changing ────────────────────────────────────────────────────────────

    def add(self, key: str, entry: Pending) -> None:
        """``key`` is pending (accepted, or re-offered after a restart)."""
        self._pending[key] = entry

    def journaling(self, key: str, record: dict[str, Any], delivery: Any = None) -> None:
        """The outcome of ``key`` is being journaled: held back until :meth:`settle`.

        Args:
            key: the delivery id.
            record: its outcome dict.
            delivery: its ``Delivery`` (kept for the subscribers' details until it is published).
        """
        self._pending.pop(key, None)
        self._journaling[key] = (record, delivery)

    def settle(self, key: str, record: dict[str, Any], answers: Answers | None = None) -> Pending | None:
        """Publish the outcome of ``key``: its waiters get it.

        Args:
            key: the delivery id.
            record: its outcome dict.
            answers: where to put the waiters' answers for the caller to give (:func:`answer`)
                once it has finished handling the outcome; None: answered now.

        Returns:
            The pending entry still held for ``key`` (None when it had none, or it was journaling).
        """
        entry = self._pending.pop(key, None)
        self._journaling.pop(key, None)
        self._settled.put(key, record)
        waiters = self._waiters.pop(key, ())
        if answers is None:
            for future in waiters:
                _answer_one(future, record)
        else:
            for future in waiters:  # a loop: a generator here cost every outcome a cell for ``record``
                answers.append((future, record))
        return entry

    def withhold(self, key: str) -> None:
        """A stop could not write the outcome of ``key`` to the journal: it is never published by this run.

        The id leaves the book (pending or journaling): the stopped gateway does not export it, so
        ``wait_outcome`` and ``hermes-actors outcome`` read the journal, which holds the DM without
        an outcome (pending), and the next start settles it from there. Its waiters stay until the
        stop ends them.
        """
        self._pending.pop(key, None)
        self._journaling.pop(key, None)

    def remember(self, records: dict[str, dict[str, Any]]) -> None:
        """Outcomes a previous run settled (from the journal): ``wait_outcome`` answers them.

        They count towards ``keep`` like the outcomes settled here (the oldest are dropped first).
        """
        for key, record in records.items():
            if self.state(key) in (DeliveryState.UNKNOWN, DeliveryState.SETTLED):
                self._settled.put(key, record)

    def published(self, key: str) -> dict[str, Any] | None:
        """The published outcome dict of ``key``; None while it has none (pending or journaling).

        Raises:
            KeyError: ``key`` is unknown here.
        """
        state = self.state(key)
        if state is DeliveryState.UNKNOWN:
            raise KeyError(unknown_delivery(key))
        return self._settled.get(key) if state is DeliveryState.SETTLED else None

    def fail_waiters(self, error_for: Callable[[str], BaseException]) -> int:
        """Answer every waiter still waiting with ``error_for(delivery id)`` (the owner can settle nothing more).

        Returns:
            How many waiters were answered.
        """
        waiters, self._waiters = self._waiters, {}
        count = 0
        for key, futures in waiters.items():
            error = error_for(key)
            for future in futures:
                with contextlib.suppress(Exception):  # answered already by its stopped Gateway (see _answer_one)
                    future.set_exception(exc_info=(type(error), error, None))
                count += 1
        return count

    def wait(self, key: str, future: pykka.ThreadingFuture[dict[str, Any]]) -> None:
        """Set ``future`` with the outcome dict of ``key`` now, or once it is published.

        Raises:
            KeyError: ``key`` is unknown here (``future`` is left alone).
        """
        record = self.published(key)
        if record is not None:
            _answer_one(future, record)
        else:
            self._waiters.setdefault(key, []).append(future)
