"""Warm turns while the hermes gateway's API server answers, the CLI when it does not.

A root configured for warm turns (``enable --gateway``) is served by a ``hermes
gateway run`` that may stop, restart or drain at any time, independently of our
host. A turn the API server could not take (unreachable, draining, not serving
the profile: ``runtime_offline`` and certainly not delivered) runs through the
``hermes`` CLI instead, in the same Bot Chat session of the same ``state.db``; a
turn the server may have started is never run a second time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from loguru import logger

from hermes_actors.core.reasons import RUNTIME_OFFLINE
from hermes_actors.errors import TurnFailed
from hermes_actors.hermes.api_runner import ApiRunner
from hermes_actors.hermes.cli_runner import HermesCliRunner
from hermes_actors.records import Turn

__all__ = ["WarmOrCliRunner", "falls_back"]


def falls_back(failure: TurnFailed) -> bool:
    """Pure: whether a warm turn's failure means it never reached the agent (so the CLI may run it)."""
    return failure.reason == RUNTIME_OFFLINE and not failure.ambiguous


class WarmOrCliRunner:
    """Runs each turn through the API server, or through the CLI when the server cannot take it.

    After a turn fell back, the next ones go straight to the CLI for ``retry_seconds``
    (a server that is down costs each turn a refused connection, or a connect timeout
    when its address does not answer at all); then one turn tries the server again.

    Args:
        warm: the API server's runner.
        cli: the CLI runner.
        cold: start on the CLI (the server did not answer the start's probe).
        retry_seconds: how long the CLI runs every turn after a fallback.
        clock: monotonic clock (injectable for tests).
    """

    real_hermes = True  # turns run on the real Hermes: ``bot_mode.wake_sender: auto`` wakes senders

    def __init__(self, warm: ApiRunner, cli: HermesCliRunner, *, cold: bool = False, retry_seconds: float = 30.0,
                 clock: Any = time.monotonic) -> None:
        self.warm = warm
        self.cli = cli
        self.retry_seconds = float(retry_seconds)
        self.clock = clock
        self._lock = threading.Lock()
        self._cold = cold  # the last warm attempt fell back (the switch is logged once each way)
        self._warm_again_at = clock() + self.retry_seconds if cold else 0.0

    def __repr__(self) -> str:
        return f"WarmOrCliRunner({self.warm.server}, cli={self.cli.cli})"

    def run_turn(self, turn: Turn) -> str:
        """Run ``turn`` warm, else (never delivered there) with the CLI; the reply.

        Raises:
            TurnFailed: from the API server when the turn may have reached it, else from the CLI.
        """
        if self.clock() < self._warm_again_at:
            return self.cli.run_turn(turn)
        try:
            reply = self.warm.run_turn(turn)
        except TurnFailed as failure:
            if not falls_back(failure):
                raise
            self._switch(cold=True, why=failure.text)
            return self.cli.run_turn(turn)
        self._switch(cold=False, why="")
        return reply

    def _switch(self, *, cold: bool, why: str) -> None:
        with self._lock:
            if cold:
                self._warm_again_at = self.clock() + self.retry_seconds
            if self._cold == cold:
                return
            self._cold = cold
        if cold:
            logger.warning("warm turns stopped ({}); turns run with the hermes CLI until the API server "
                           "answers again", why)
        else:
            logger.info("the hermes API server {} answers again: turns run warm", self.warm.server)

    def prepare_retry(self, turn: Turn, began: float) -> bool:
        """Before the policy retry: the CLI runner's rule (both paths share the profile's ``state.db``)."""
        return self.cli.prepare_retry(turn, began)

    def release(self, delivery_id: str) -> None:
        """The CLI runner's query file kept for ``delivery_id`` may go (see ``CommandRunner.release``)."""
        self.cli.release(delivery_id)

    def stop_turns(self, delivery_ids: Iterable[str] | None = None, **kwargs: Any) -> int:
        """End the CLI processes of running turns (warm turns end with the hermes gateway)."""
        return self.cli.stop_turns(delivery_ids, **kwargs)
