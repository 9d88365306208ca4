"""What the Dispatcher tells operators about its DMs: one log line per outcome, the ``deliveries`` view.

:class:`DeliveryStats` is owned by the DispatcherActor and used on its thread.
It counts the published DM outcomes by status and reason, logs each DM's one
INFO line (never its text), and builds the ``deliveries`` part of
``Gateway.stats()`` that ``hermes-actors status`` shows.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from loguru import logger

from hermes_actors.core.outcomes import shown_sender
from hermes_actors.core.wake import shown_route
from hermes_actors.local.outcome_book import Pending
from hermes_actors.messages import Delivery, Outcome
from hermes_actors.ops.delivery_log import delivery_line

__all__ = ["IN_FLIGHT_ROWS", "DeliveryStats", "in_flight_counts", "log_settled"]

IN_FLIGHT_ROWS = 200  # in-flight deliveries listed by stats() (the oldest; all are counted per profile)

# Built once: ``logger.opt`` makes a new Logger on every call, and loguru's options never change on
# the module's ``logger`` (sinks, levels and enable/disable live in the core both share).
_LAZY_LOGGER = logger.opt(lazy=True)


def log_settled(delivery: Delivery | None, outcome: Outcome) -> None:
    """Log a DM's one INFO line: who, to whom, how it ended, how long it took (never its text).

    Lazy: on the hot path of every DM, the line (and the clock it reads) is built only when a
    sink takes INFO (never while the library's logging is disabled, as it is for embedders by
    default); loguru builds it within this call, so the latency ends now.
    """
    _LAZY_LOGGER.info("{}", functools.partial(_settled_line, delivery, outcome))  # a partial: no cells per DM


def _settled_line(delivery: Delivery | None, outcome: Outcome) -> str:
    """:func:`log_settled`'s line, built when a sink takes it (the latency read then)."""
    latency = time.time() - delivery.accepted_at if delivery is not None and delivery.accepted_at else None
    sender = f"@{shown_sender(delivery.sender, delivery.sender_handle)}" if delivery is not None else ""
    return delivery_line(outcome.delivery_id, sender, outcome.from_, outcome.status, outcome.reason, latency)


def in_flight_counts(pending: Iterable[tuple[str, str]]) -> tuple[dict[str, int], int]:
    """Pure: the DMs in flight per local profile, and those handed to a ``bot_peers`` peer, apart.

    A DM no profile of this root runs (to a peer, or to another connection) has no target profile: it is never
    counted under one (before, ``status`` from the files counted a peer DM under the profile "").

    Args:
        pending: (target profile, route) of each DM in flight; the target is "" when no local profile runs it.

    Returns:
        ({profile: DMs in flight to it}, DMs in flight to peers).
    """
    per_profile: Counter[str] = Counter()
    to_peers = 0
    for target, route in pending:
        if route == "peer":
            to_peers += 1
        elif target:
            per_profile[target] += 1
    return dict(per_profile), to_peers


class DeliveryStats:
    """The published DM outcomes by (status, reason), and the in-flight view."""

    def __init__(self) -> None:
        self.by_outcome: Counter[tuple[str, str]] = Counter()  # what "settled" counts

    def published(self, delivery: Delivery | None, outcome: Outcome) -> None:
        """A DM outcome was published (``delivery``: None when the Dispatcher no longer knew it)."""
        self.by_outcome[(outcome.status, outcome.reason)] += 1
        log_settled(delivery, outcome)

    def view(self, pending: Iterable[tuple[str, Pending]], live_owners: Iterable[str]) -> dict[str, Any]:
        """The ``deliveries`` stats: the oldest in flight, counts per profile and to peers, live owners, outcomes.

        Args:
            pending: the pending entries, oldest first.
            live_owners: the profiles with an attached live owner.
        """
        rows = list(pending)
        per_profile, to_peers = in_flight_counts((p.delivery.target, p.route) for _, p in rows)
        by_outcome: dict[str, dict[str, int]] = {}
        for (status, reason), count in self.by_outcome.items():
            by_outcome.setdefault(status, {})[reason] = count
        return {
            "in_flight": [
                {"delivery_id": key, "sender": shown_sender(p.delivery.sender, p.delivery.sender_handle),
                 "target": p.delivery.label,
                 "profile": p.delivery.target, "route": shown_route(p.route, p.delivery.origin),
                 "accepted_at": p.delivery.accepted_at}
                for key, p in itertools.islice(rows, IN_FLIGHT_ROWS)
            ],
            "per_profile": per_profile,
            "peers_in_flight": to_peers,
            "live_owners": sorted(live_owners),
            "by_outcome": by_outcome,
        }
