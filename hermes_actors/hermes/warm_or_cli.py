"""Warm turns while the hermes gateway's API server answers, the CLI when it does not.

A root configured for warm turns (``enable --gateway``) is served by a ``hermes
gateway run`` that may stop, restart or drain at any time, independently of our
host. A turn the API server could not take (unreachable, draining, not serving
the profile: ``runtime_offline`` and certainly not delivered) runs through the
``hermes`` CLI instead, in the same Bot Chat session of the same ``state.db``; a
turn the server may have started is never run a second time.

A warm turn whose connection was lost mid-turn (the gateway is stopping) may
still be running there: until that gateway process has exited
(:mod:`hermes_actors.hermes.gateway_process`), the bot's next turns fail at once
``target_busy`` ("NOT delivered — resend shortly"), so two turns never run at once
in one Bot Chat session. Failing, not waiting: a wait would run on the turn's own
clock, and a turn reported timed out must not start afterwards.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from loguru import logger

from hermes_actors.core.reasons import RUNTIME_OFFLINE, TARGET_BUSY
from hermes_actors.core.recovery import running_at_stop_text
from hermes_actors.errors import TurnFailed
from hermes_actors.hermes.api_runner import ApiRunner, busy_in_gateway_text
from hermes_actors.hermes.cli_runner import HermesCliRunner, turn_home, turn_root
from hermes_actors.hermes.gateway_process import gateway_pid, own_gateway_stopping
from hermes_actors.hermes.retry import take_back_unanswered, unanswered_since
from hermes_actors.records import Turn
from hermes_actors.store.processes import ProcessWatch, process_started_at

__all__ = ["LIVE_TURN_SECONDS", "WarmOrCliRunner", "cut_by_own_stop", "falls_back"]

# How long a DM a turn left unanswered in a live gateway holds its bot (a turn a killed host started there):
# bot_mode.turn_timeout_seconds' default, the longest our side lets a turn run.
LIVE_TURN_SECONDS = 600.0


def falls_back(failure: TurnFailed) -> bool:
    """Pure: whether a warm turn's failure means it never reached the agent (so the CLI may run it)."""
    return failure.reason == RUNTIME_OFFLINE and not failure.ambiguous


def cut_by_own_stop(failure: TurnFailed, *, here: bool, stopping: bool) -> TurnFailed:
    """Pure: a warm turn's failure as its sender reads it, when the stop of the hermes gateway hosting us cut it.

    That gateway (``here``: the turn ran in this very process) closes its API server before it tears our
    platform down, so a turn it was still running loses its connection at its stop (``stopping``): that is a
    turn "still running when the gateway stopped" (the words a turn our own stop cuts gets), not a lost
    connection to a server the user never stopped.

    Args:
        failure: the warm turn's failure.
        here: the turn ran in the hermes gateway that is this process (its pid, read before the turn).
        stopping: that gateway's stop had begun when the failure came (:func:`own_gateway_stopping`).

    Returns:
        ``failure``, or for a lost connection (ambiguous ``runtime_offline``) in a stopping gateway of ours the
        ambiguous failure with :func:`~hermes_actors.core.recovery.running_at_stop_text`'s words.
    """
    if not (here and stopping and failure.ambiguous and failure.reason == RUNTIME_OFFLINE):
        return failure
    return TurnFailed(running_at_stop_text("here"), reason=RUNTIME_OFFLINE, ambiguous=True)


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
        self._lost_turns: dict[str, ProcessWatch] = {}  # profile → the stopping gateway that may still run its turn
        self._gateway: ProcessWatch | None = None  # the gateway process of the last warm turn
        self._paths: dict[str, ApiRunner | HermesCliRunner] = {}  # delivery id → the runner of its last attempt

    def __repr__(self) -> str:
        return f"WarmOrCliRunner({self.warm.server}, cli={self.cli.cli})"

    @property
    def cold(self) -> bool:
        """Turns run with the CLI now: the start's probe found the API server not answering, or a turn fell back."""
        with self._lock:
            return self._cold

    def run_turn(self, turn: Turn) -> str:
        """Run ``turn`` warm, else (never delivered there) with the CLI; the reply.

        Raises:
            TurnFailed: from the API server when the turn may have reached it, else from the CLI;
                ``target_busy`` while the bot's turn lost in a stopping gateway may still run there.
        """
        self._refuse_beside_a_lost_turn(turn)
        self._refuse_beside_a_turn_this_host_lost_track_of(turn)
        if self.clock() < self._warm_again_at:
            return self._cli_turn(turn)
        gateway = self._watch_gateway(turn)  # before the turn: the one that may be left running it
        self._paths[turn.delivery_id] = self.warm
        turn.note_via("warm")  # journaled: a host killed during it tells its sender hermes may have answered
        # No turn of this bot runs anywhere now (the refusal above): what the session ends with unanswered
        # was left by a turn that died (see hermes.retry). The CLI path does the same in its runner.
        take_back_unanswered(turn_home(turn), turn.session)
        try:
            reply = self.warm.run_turn(turn)
        except TurnFailed as failure:
            if failure.ambiguous and failure.reason == RUNTIME_OFFLINE:
                self._note_lost_turn(turn, gateway)
                here = gateway is not None and gateway.pid == os.getpid()
                told = cut_by_own_stop(failure, here=here, stopping=here and own_gateway_stopping())
                if told is not failure:
                    raise told from None
            if not falls_back(failure):
                raise
            self._switch(cold=True, why=failure.text)
            return self._cli_turn(turn)
        self._switch(cold=False, why="")
        return reply

    def _cli_turn(self, turn: Turn) -> str:
        self._paths[turn.delivery_id] = self.cli
        turn.note_via("cli")  # journaled: a host killed during it does not tell its sender the hermes gateway ran it
        return self.cli.run_turn(turn)

    def _watch_gateway(self, turn: Turn) -> ProcessWatch | None:
        """Before a warm turn: the watch of the gateway process serving it (``gateway.pid``).

        Read before the turn, not once it is lost: a stopping hermes 0.19 removes its pid file
        seconds before the process exits, while it still drains its turns, and a restarted
        gateway's file names the new process, not the one running the lost turn.
        """
        pid = gateway_pid(turn_root(turn))
        with self._lock:
            current = self._gateway
        if pid is None or (current is not None and current.pid == pid and not current.exited()):
            return current
        try:
            watch = ProcessWatch(pid)
        except OSError:  # it exited meanwhile
            return current
        with self._lock:
            if self._gateway is current:  # else another turn's thread installed one: use that (ours is dropped)
                self._gateway = watch
            return self._gateway

    def _note_lost_turn(self, turn: Turn, gateway: ProcessWatch | None) -> None:
        """The connection was lost mid-turn: remember the gateway process that may still run it."""
        if gateway is None or gateway.pid == os.getpid() or gateway.exited():
            return  # hosted in that gateway (the turn cannot outlive this process), or it is gone
        with self._lock:
            self._lost_turns[turn.profile] = gateway

    def _refuse_beside_a_lost_turn(self, turn: Turn) -> None:
        """Before a bot's turn: refuse it while hermes may still run an earlier one of that bot.

        Either our chat request for it is still open (its turn was reported timed out, hermes
        answers when it is done), or the connection was lost and the gateway process that ran
        it still lives (it drains before it exits).
        """
        running = self.warm.in_flight(turn.profile)
        if running is not None and running != turn.delivery_id:
            raise TurnFailed(busy_in_gateway_text(turn.handle or turn.profile), reason=TARGET_BUSY)
        with self._lock:
            watch = self._lost_turns.get(turn.profile)
            if watch is None:
                return
            if watch.exited():
                del self._lost_turns[turn.profile]
                return
        raise TurnFailed(
            f"@{turn.handle or turn.profile} is still finishing an earlier turn in the stopping hermes gateway "
            f"(pid {watch.pid}); the message was NOT delivered — resend shortly.",
            reason=TARGET_BUSY,
        )

    def _refuse_beside_a_turn_this_host_lost_track_of(self, turn: Turn) -> None:
        """Before a bot's turn: refuse it while the hermes gateway may still run a turn an earlier host started.

        A host killed mid warm turn (``kill -9`` of ``serve``; the gateway serving its warm turns lives on)
        leaves the turn running in the gateway, and the restarted host knows nothing of it: the bot's
        flock was this host's, the watch of its request died with it. What is left is the session: it
        ends with the DM unanswered. Stored after the live gateway process started, the turn may still
        run there (one that died with an earlier gateway, or a person's message, does not count); the
        bot's DMs are refused until it is answered, or for ``LIVE_TURN_SECONDS`` at most (a turn that
        failed in the gateway leaves it unanswered for good: it is taken back then).
        """
        pid = gateway_pid(turn_root(turn))
        if pid is None or pid == os.getpid():  # no gateway; or this is it, and its turns die with it
            return
        started = process_started_at(pid)
        stored = unanswered_since(turn_home(turn), turn.session)
        if started is None or stored is None:
            return
        # started: whole seconds of the boot time, so a second of slack (a gateway serves turns seconds after)
        if stored > started + 1.0 and time.time() - stored < LIVE_TURN_SECONDS:
            raise TurnFailed(
                f"@{turn.handle or turn.profile} is still answering an earlier message in the hermes gateway (pid "
                f"{pid}), a turn this host started before it restarted; the message was NOT delivered — resend "
                "shortly.",
                reason=TARGET_BUSY,
            )

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

    def runs_apart(self, turn: Turn) -> bool:
        """At a start: whether the bot's turns run warm in a hermes gateway that is not this process (this host is
        ``serve``, ``send`` or a program embedding the ``Gateway``), so a turn the previous host lost may still
        have been answered there."""
        return gateway_pid(turn_root(turn)) != os.getpid()

    def warm_turns(self) -> list[str]:
        """At a stop: the deliveries whose turns hermes runs now in a gateway that is not this process (this host
        is ``serve``, ``send`` or a program embedding the ``Gateway``): the stop cannot end them, and hermes may
        still answer them."""
        with self._lock:
            gateway = self._gateway
        if gateway is not None and gateway.pid == os.getpid():  # hosted in that gateway: its turns stop with it
            return []
        return self.warm.in_flight_turns()

    def never_reached(self, turn: Turn, since: float) -> bool:
        """At a start: whether a wake the previous host started never reached the bot, warm or by the CLI
        (:func:`~hermes_actors.hermes.cli_runner.never_reached`)."""
        return self.cli.never_reached(turn, since)

    def prepare_retry(self, turn: Turn, began: float) -> bool:
        """Before the policy retry: the rule of the path that ran the failed attempt."""
        path = self._paths.get(turn.delivery_id, self.cli)
        return path.prepare_retry(turn, began)

    def forget_failed(self, turn: Turn, began: float) -> None:
        """After a final failure: the same taking back as :meth:`prepare_retry` (its answer unneeded)."""
        self.prepare_retry(turn, began)

    def release(self, delivery_id: str) -> None:
        """The CLI runner's query file kept for ``delivery_id`` may go (see ``CommandRunner.release``)."""
        self._paths.pop(delivery_id, None)
        self.cli.release(delivery_id)

    def running_turns(self) -> list[str]:
        """The deliveries whose CLI turn process runs now (a warm turn runs in the hermes gateway)."""
        return self.cli.running_turns()

    def stop_turns(self, delivery_ids: Iterable[str] | None = None, **kwargs: Any) -> int:
        """End the CLI processes of running turns (warm turns end with the hermes gateway)."""
        return self.cli.stop_turns(delivery_ids, **kwargs)
