"""What one gateway's journal file must keep: its live deliveries and its recently delivered outcomes.

A composed state object of :class:`hermes_actors.store.journal.Journal`, owned by
whoever holds the journal's write turn. Pure (no I/O): it folds written batches,
takes over what adoption found in dead gateways' files, and gives the records that
rebuild it (what compaction and adoption write into our file).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from hermes_actors.records import RELAY_ORIGIN
from hermes_actors.store.journal_records import (
    KEPT_OUTCOMES_BYTES,
    DeliveryState,
    JournalFolded,
    delivery_origin,
    encode_record,
    fold_records,
    state_records,
)

__all__ = ["KEEP_DELIVERED", "JournalState", "Saved", "settled_state"]

# Delivered outcomes a journal keeps for ``wait_outcome`` across restarts: compaction and each start's adoption
# drop older ones (the start still knows, in memory, every outcome of the files it adopts, but carries only
# these into its own file). Relayed-in DMs' outcomes (kept for a retry of their envelope) have a bound of their
# own, of the same size: neither kind pushes the other out.
KEEP_DELIVERED = 10_000


#: What :meth:`JournalState.snapshot` saves: the live states, the kept outcomes, the kept relayed-in outcomes.
Saved = tuple[dict[str, DeliveryState], OrderedDict[str, DeliveryState], OrderedDict[str, DeliveryState]]


def settled_state(state: DeliveryState) -> DeliveryState:
    """Pure: what a journal keeps of a delivered outcome: the outcome and its delivery's origin, not the delivery.

    Rewritten (:func:`~hermes_actors.store.journal_records.state_records`), it is a ``finished`` record that
    keeps the origin (a wake turn's outcome stays a wake's: ``status`` never counts it as a DM's) and a
    ``delivered`` one.

    Args:
        state: a delivered state with an outcome.

    Returns:
        A new state: its outcome, ``delivered``, and :func:`~hermes_actors.store.journal_records.delivery_origin`.
    """
    return DeliveryState(outcome=state.outcome, delivered=True, origin=delivery_origin(state))


class JournalState:
    """The live deliveries of our file, and the delivered outcomes kept for ``wait_outcome`` after a restart.

    The delivered outcomes are kept in two bins of ``keep`` each (the oldest go first): the relayed-in DMs'
    (origin ``relay``: kept for a retry of their envelope) and all others (the DMs of this host's senders, their
    wakes, peer and relayed-out DMs), so that a host that mostly receives relayed DMs keeps its own senders'
    outcomes as long as one that receives none.
    """

    def __init__(self) -> None:
        self.folded = JournalFolded()  # live state of OUR file
        # delivered outcomes kept across compaction, each with its delivery's origin (:func:`settled_state`)
        self.recent: OrderedDict[str, DeliveryState] = OrderedDict()
        self.recent_relayed_in: OrderedDict[str, DeliveryState] = OrderedDict()  # origin relay: a bin of its own

    def _keep(self, key: str, state: DeliveryState) -> OrderedDict[str, DeliveryState]:
        """Put the delivered outcome ``state`` of ``key`` into its bin (:func:`settled_state`); the bin."""
        settled = settled_state(state)
        relayed_in = delivery_origin(settled) == RELAY_ORIGIN
        kept, other = (self.recent_relayed_in, self.recent) if relayed_in else (self.recent, self.recent_relayed_in)
        other.pop(key, None)  # one bin per id (an adopted copy of another origin: the newest says)
        kept[key] = settled
        return kept

    def track(self, records: list[dict[str, Any]], *, keep: int) -> None:
        """Fold one written batch into the live state; a delivered DM leaves it for the recent outcomes.

        Only the batch's own ``delivered`` records are looked up: the cost follows the batch,
        not the number of DMs in flight.

        Args:
            records: the batch's records, in file order.
            keep: how many delivered outcomes are kept at most (the oldest go first).
        """
        fold_records(records, self.folded)
        states = self.folded.states
        for record in records:
            if record["t"] != "delivered":
                continue
            state = states.pop(record["id"], None)
            if state is not None and state.outcome is not None:
                kept = self._keep(record["id"], state)
                if len(kept) > keep:
                    kept.popitem(last=False)

    def take_over(self, adopted: JournalFolded, *, keep: int) -> list[bytes]:
        """Take what still matters of dead gateways' journals: their live deliveries and delivered outcomes.

        A delivery this state tracks already (a running gateway's own record of an id the dead one had too)
        becomes what a fold of our file followed by the adopted records gives (:func:`fold_records`).
        Only new state objects are stored: :meth:`snapshot` / :meth:`restore` undo this.

        Args:
            adopted: the folded state of the adopted files.
            keep: how many delivered outcomes are kept at most (the oldest go first).

        Returns:
            The journal lines that carry what was taken into our file (at a start, with nothing of our own
            yet: :meth:`lines`): the delivered outcomes still kept, then the live deliveries.
        """
        settled: list[str] = []
        live: list[tuple[str, DeliveryState]] = []
        states = self.folded.states
        for key, state in adopted.states.items():
            if state.delivered and state.outcome is not None:
                self._keep(key, state)
                settled.append(key)
            elif not state.delivered:
                taken = DeliveryState(state.delivery, state.started, state.outcome, live=state.live, via=state.via)
                live.append((key, taken))
                mine = states.get(key)
                if mine is not None:
                    records = state_records(key, mine) + state_records(key, taken)
                    taken = fold_records(records).states[key]
                states[key] = taken
        for recent in (self.recent, self.recent_relayed_in):
            while len(recent) > keep:
                recent.popitem(last=False)
        kept = [_newest_within([(key, recent[key]) for key in settled if key in recent])
                for recent in (self.recent_relayed_in, self.recent)]
        return [*kept[0], *kept[1], *_lines_of(live)]

    def snapshot(self) -> Saved:
        """What :meth:`restore` puts back (the state objects are never changed in place by :meth:`take_over`)."""
        return dict(self.folded.states), OrderedDict(self.recent), OrderedDict(self.recent_relayed_in)

    def restore(self, saved: Saved) -> None:
        """Undo a :meth:`take_over` whose lines could not be written (``saved``: :meth:`snapshot` before it)."""
        self.folded.states = dict(saved[0])
        self.recent, self.recent_relayed_in = OrderedDict(saved[1]), OrderedDict(saved[2])

    def lines(self) -> list[bytes]:
        """The journal lines that rebuild this state: recent outcomes first (relayed-in ones, then the others: of
        each bin the newest whose lines fit in :data:`KEPT_OUTCOMES_BYTES`), then each live delivery."""
        return [
            *_newest_within(list(self.recent_relayed_in.items())),
            *_newest_within(list(self.recent.items())),
            *_lines_of(list(self.folded.states.items())),
        ]


def _lines_of(states: list[tuple[str, DeliveryState]]) -> list[bytes]:
    """Pure: the journal lines that rebuild ``states`` (id, state), in their order."""
    return [encode_record(record) for key, state in states for record in state_records(key, state)]


def _newest_within(kept: list[tuple[str, DeliveryState]], budget: int = KEPT_OUTCOMES_BYTES) -> list[bytes]:
    """Pure: the lines of the newest of ``kept`` (oldest first) whose lines fit in ``budget`` bytes, oldest first.

    A file written whole carries delivered outcomes only for ``wait_outcome`` after a restart, and a journal file
    must stay under :data:`~hermes_actors.store.journal_records.MAX_JOURNAL_BYTES` (larger, a start refuses it):
    outcomes of 4 MiB replies would carry a bin of 10,000 past it. Older ones stay known to this run.

    Args:
        kept: delivered outcomes (id, settled state), oldest first.
        budget: the most bytes their lines take.

    Returns:
        Their lines, the oldest that do not fit left out.
    """
    chunks = [[encode_record(record) for record in state_records(key, state)] for key, state in kept]
    total, first = 0, len(chunks)
    while first > 0:
        size = sum(len(line) for line in chunks[first - 1])
        if total + size > budget:
            break
        total += size
        first -= 1
    return [line for chunk in chunks[first:] for line in chunk]
