"""A Gateway's Dispatcher failure: the hooks the failing Dispatcher calls, and the report, once.

Once the Dispatcher failed (a bug: an error escaped one of its handlers) the gateway
refuses every DM until it is stopped and started again; the DMs acked so far still reach
the failed Dispatcher, which settles them; its outcomes are kept; the failure is logged
and the embedder's ``on_failure`` is called once, from the failed actor or from ``start()``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger

from hermes_actors.facade.outcomes import OutcomeWaits
from hermes_actors.facade.sends import SendsInFlight
from hermes_actors.local.outcome_book import KeptOutcomes

__all__ = ["DispatcherFailure"]

# A failing Dispatcher waits at most this long for the message_agent calls already past their check
# (a first-hop DM's tell takes µs; a call asking the Dispatcher itself cannot finish and is not waited for longer).
_FAILING_SENDS_WAIT = 0.5


class DispatcherFailure:
    """Whether (and with what error) the Dispatcher failed, and whether that was reported.

    Set from the failed Dispatcher's thread, never under the Gateway's lifecycle lock, which
    ``start()`` holds while it waits for that very actor.

    Args:
        root: the gateway's Hermes root (named in the log).
        on_failure: the embedder's callback (None: only the log).
        sends: the gateway's ``message_agent`` calls in flight.
        outcomes: where the gateway keeps the outcomes the failed Dispatcher hands over.
        running: whether the gateway runs (not starting, not stopping).
    """

    def __init__(self, root: Path, on_failure: Callable[[BaseException | None], Any] | None,
                 sends: SendsInFlight, outcomes: OutcomeWaits, running: Callable[[], bool]) -> None:
        self.error: BaseException | None = None
        self.failed = False
        self._root = root
        self._on_failure = on_failure
        self._sends = sends
        self._outcomes = outcomes
        self._running = running
        self._lock = threading.Lock()
        self._reported = False

    def failing(self, error: BaseException) -> None:
        """The Dispatcher is failing (called on its thread): no more acks; the DMs acked so far reach it.

        A sender past its check still tells its DM; waiting for those calls here (µs each, bounded)
        puts their DMs in the mailbox the failed Dispatcher settles, instead of after its stop.
        """
        self.error = error
        self.failed = True
        self._sends.await_all(_FAILING_SENDS_WAIT)

    def failed_with(self, error: BaseException | None, final: KeptOutcomes) -> None:
        """The Dispatcher failed (called on its thread): refuse DMs from now on, keep its outcomes, say so."""
        self._outcomes.keep(final, replace=False)
        self.error = error
        self.failed = True  # already, unless the failing hook itself failed
        if self._running():  # else it failed while starting (start() reports it) or stopping
            self.report_once()

    def report_once(self) -> None:
        """Log the failure and call ``on_failure``, the first time only (an exception from it is logged)."""
        with self._lock:
            if self._reported:
                return
            self._reported = True
        error = self.error
        logger.error("the gateway on {} failed: its Dispatcher stopped ({!r}); it refuses every DM until it is "
                     "stopped and started again (journaled DMs are re-offered then)", self._root, error)
        if self._on_failure is not None:
            try:
                self._on_failure(error)
            except Exception:
                logger.exception("the gateway's on_failure callback failed")
