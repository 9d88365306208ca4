"""What one gateway's journal file must keep: its live deliveries and its recently delivered outcomes.

A composed state object of :class:`hermes_actors.store.journal.Journal`, owned by
whoever holds the journal's write turn. Pure (no I/O): it folds written batches,
takes over what adoption found in dead gateways' files, and gives the records that
rebuild it (what compaction and adoption write into our file).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from hermes_actors.store.journal_records import (
    DeliveryState,
    JournalFolded,
    encode_record,
    fold_records,
    state_records,
)

__all__ = ["KEEP_DELIVERED", "JournalState"]

# Delivered outcomes a journal keeps for ``wait_outcome`` across restarts: compaction and each start's adoption
# drop older ones (the start still knows, in memory, every outcome of the files it adopts, but carries only
# these into its own file).
KEEP_DELIVERED = 10_000


class JournalState:
    """The live deliveries of our file, and the delivered outcomes kept for ``wait_outcome`` after a restart."""

    def __init__(self) -> None:
        self.folded = JournalFolded()  # live state of OUR file
        self.recent: OrderedDict[str, dict[str, Any]] = OrderedDict()  # delivered outcomes kept across compaction

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
                self.recent[record["id"]] = state.outcome
                if len(self.recent) > keep:
                    self.recent.popitem(last=False)

    def take_over(self, adopted: JournalFolded, *, keep: int) -> None:
        """Take what still matters of dead gateways' journals: their live deliveries and delivered outcomes.

        Args:
            adopted: the folded state of the adopted files.
            keep: how many delivered outcomes are kept at most (the oldest go first).
        """
        for key, state in adopted.states.items():
            if state.delivered and state.outcome is not None:
                self.recent[key] = state.outcome
            elif not state.delivered:
                self.folded.states[key] = DeliveryState(state.delivery, state.started, state.outcome, live=state.live,
                                                        via=state.via)
        while len(self.recent) > keep:
            self.recent.popitem(last=False)

    def lines(self) -> list[bytes]:
        """The journal lines that rebuild this state: recent outcomes first, then each live delivery."""
        settled = [(key, DeliveryState(outcome=outcome, delivered=True)) for key, outcome in self.recent.items()]
        return [
            encode_record(record)
            for key, state in [*settled, *self.folded.states.items()]
            for record in state_records(key, state)
        ]
