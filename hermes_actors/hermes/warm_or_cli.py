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

Inside the hermes gateway that hosts the actors, no turn starts once hermes' stop has begun (its API server
drains, then closes, before hermes stops our platform): the Gateway's turn gates hold every turn from then on
(``Gateway(host_stopping=...)``), and a turn that got past them just before is ``cancelled`` here, never run
with the CLI (:func:`refused_at_own_stop`), so no turn runs behind a closed submit endpoint.

Inside the hermes gateway that hosts the actors, our platform may connect before
hermes' API server (hermes connects platforms in the order ``config.yaml`` lists
them): while that server is starting, a turn waits for it (a probe every half
second, until :data:`API_SERVER_START_SECONDS` after the host started there)
instead of running on the CLI; the decisions are :func:`turn_path` and
:func:`while_starting`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from loguru import logger

from hermes_actors.core.reasons import CANCELLED, RUNTIME_OFFLINE, TARGET_BUSY
from hermes_actors.core.recovery import running_at_stop_text
from hermes_actors.core.shell import shell_command
from hermes_actors.errors import TurnFailed
from hermes_actors.hermes.api_client import ApiServerProblem, api_server_problem
from hermes_actors.hermes.api_runner import ApiRunner, busy_in_gateway_text
from hermes_actors.hermes.cli_runner import HermesCliRunner, turn_home, turn_root
from hermes_actors.hermes.gateway_process import gateway_pid, own_gateway_stop_begun, own_gateway_stopping
from hermes_actors.hermes.retry import take_back_unanswered, unanswered_since
from hermes_actors.records import Turn
from hermes_actors.store.processes import ProcessWatch, process_started_at

__all__ = [
    "API_SERVER_START_SECONDS", "LIVE_TURN_SECONDS", "StartStep", "TurnPath", "WarmOrCliRunner", "cli_at_start_text",
    "cut_by_own_stop", "falls_back", "not_run_at_own_stop", "refused_at_own_stop", "turn_path", "turns_in_hermes",
    "turns_info", "while_starting",
]

# How long a DM a turn left unanswered in a live gateway holds its bot (a turn a killed host started there):
# bot_mode.turn_timeout_seconds' default, the longest our side lets a turn run.
LIVE_TURN_SECONDS = 600.0
# Inside the hermes gateway hosting the actors: how long after the host's start there turns wait for the gateway's
# own API server to answer (it connects after our platform when config.yaml lists ours first), then the CLI
API_SERVER_START_SECONDS = 30.0
_START_PROBE_SECONDS = 0.5  # between two probes of a turn waiting for it

TurnPath = Literal["warm", "cli", "starting"]
StartStep = Literal["warm", "wait", "cli"]
Probe = Callable[[float], "ApiServerProblem | None"]  # timeout in seconds → what the probe saw (None: it answers)


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


def not_run_at_own_stop(handle: str) -> TurnFailed:
    """Pure: the failure of a turn that did not run because the hermes gateway hosting the actors began to stop
    before it began.

    ``runtime_offline``, not ``cancelled``: the bot's runtime is going away, and the turn provably never reached
    it, so a wake failed so is tried again (:func:`~hermes_actors.core.wake.wake_retryable`; journaled, its retry
    is run by the next start), where a ``cancelled`` wake would be dropped (review diffrev28: a wake refused so was
    lost for good). A DM's sender reads the same "NOT delivered — resend".

    Args:
        handle: the bot's handle.

    Returns:
        A ``runtime_offline`` failure, not ambiguous (it never reached the bot: resending is safe).
    """
    return TurnFailed(f"@{handle}'s turn was ended because the gateway stopped before it began (the hermes gateway "
                      "hosting the actors is stopping); the message was NOT delivered — resend once the gateway is "
                      "back.", reason=RUNTIME_OFFLINE)


def refused_at_own_stop(failure: TurnFailed, handle: str, *, stopping: bool) -> TurnFailed | None:
    """Pure: a warm turn's failure that never reached hermes (:func:`falls_back`), when the hermes gateway hosting
    us has begun to stop (it refuses turns while it drains, and its API server is closed before our platform
    stops): the turn fails as :func:`not_run_at_own_stop` says, never run with the CLI (that would start a turn
    during the stop, behind a closed submit endpoint), and warm turns are not said to have stopped.

    Args:
        failure: the warm turn's failure.
        handle: the bot's handle.
        stopping: that gateway's stop had begun when the failure came (:func:`own_gateway_stopping`).

    Returns:
        The failure to raise (:func:`not_run_at_own_stop`), or None: the failure is handled as before (the CLI
        for one that falls back).
    """
    if not (stopping and falls_back(failure)):
        return None
    return not_run_at_own_stop(handle)


def turn_path(now: float, cli_until: float, starting: bool) -> TurnPath:
    """Pure: how the next turn runs.

    Args:
        now: the runner's clock.
        cli_until: until when turns run with the CLI after a fallback (the server is tried again then).
        starting: the hermes gateway hosting the actors is starting its API server, and no turn has seen it
            answer or given up on it yet.

    Returns:
        ``starting``: the turn probes the API server first and waits for it (:func:`while_starting`);
        ``cli``: the hermes CLI; ``warm``: through the API server.
    """
    if starting:
        return "starting"
    return "cli" if now < cli_until else "warm"


def while_starting(now: float, until: float, problem: ApiServerProblem | None) -> StartStep:
    """Pure: what a turn does while the hermes gateway hosting the actors starts its API server, given a probe
    made just now.

    Args:
        now: the runner's clock.
        until: when turns stop waiting for the server (:data:`API_SERVER_START_SECONDS` after the host's start).
        problem: what the probe saw (None: the server answers as hermes' API server does).

    Returns:
        ``warm``: it answers (turns run warm from now on); ``cli``: something answers on its port but not as our
        config expects (waiting will not cure it), or ``until`` has come: turns run with the CLI as after any
        fallback; ``wait``: probe again shortly.
    """
    if problem is None:
        return "warm"
    if problem.misconfigured or now >= until:
        return "cli"
    return "wait"


def cli_at_start_text(server: object, problem: ApiServerProblem, root: Path, cli: str, *, in_gateway: bool,
                      waited: float = 0.0) -> str:
    """Pure: the WARNING a host logs when its turns run with the CLI from its start though warm turns are configured.

    Args:
        server: the API server (shown as ``host:port``).
        problem: what the probe saw.
        root: the Hermes root.
        cli: the hermes executable CLI turns run.
        in_gateway: the host is the hermes gateway whose own API server this is (it waited ``waited`` seconds).
        waited: seconds turns waited for the server since the host's start (``in_gateway`` only).

    Returns:
        The line: what was seen, what turns run with and until when, and how to fix or find out more.
    """
    if problem.misconfigured:  # waiting will not cure it
        return (f"the hermes API server {server} {problem.text}; turns on {root} run with the hermes CLI {cli} (2–4 s "
                f"of CPU each) until it is fixed ({shell_command('hermes-actors', 'doctor', '--root', root)} says how)")
    if in_gateway:
        return (f"warm turns are off at the start: the hermes API server {server} {problem.text} {waited:.0f} s after "
                f"this hermes gateway began hosting the actors; turns on {root} run with the hermes CLI {cli} (2–4 s "
                f"of CPU each) until it answers (hermes says in {root / 'logs' / 'gateway.log'} why its API server "
                "did not start)")
    return (f"warm turns are off at the start: the hermes API server {server} {problem.text}; turns on {root} run "
            f"with the hermes CLI {cli} (2–4 s of CPU each) until it answers (start it: "
            f"{shell_command('hermes', 'gateway', 'run', env={'HERMES_HOME': root})})")


def turns_in_hermes(runner: object) -> dict[str, str]:
    """The bots a host's runner knows hermes still runs a turn of: their next DMs fail ``target_busy`` until it ends.

    Args:
        runner: the host's runner.

    Returns:
        profile → the delivery of that turn (``""`` for a turn lost in a stopping gateway, see
        :meth:`WarmOrCliRunner.turns_in_hermes`); ``{}`` for a runner that runs no turn in a hermes gateway.
    """
    if isinstance(runner, WarmOrCliRunner | ApiRunner):
        return runner.turns_in_hermes()
    return {}


def turns_info(runner: object) -> dict[str, Any]:
    """How a host's turns run now, for its ``ping`` answer (``doctor`` reads it).

    Args:
        runner: the host's runner.

    Returns:
        ``{"turns_via": "warm" | "cli" | "starting", "cli_seconds": …}`` (:func:`turn_path`; ``cli_seconds``: how
        long the CLI still runs every turn, None for good: a CLI runner has no API server) for the real Hermes'
        runners; ``{}`` for any other runner.
    """
    if isinstance(runner, WarmOrCliRunner):
        return runner.turns_now()
    if isinstance(runner, HermesCliRunner):
        return {"turns_via": "cli", "cli_seconds": None}
    return {}


class WarmOrCliRunner:
    """Runs each turn through the API server, or through the CLI when the server cannot take it.

    After a turn fell back, the next ones go straight to the CLI for ``retry_seconds``
    (a server that is down costs each turn a refused connection, or a connect timeout
    when its address does not answer at all); then one turn tries the server again.

    Inside the hermes gateway hosting the actors, whose API server may still be starting
    (``await_server``), a turn waits for it instead: it probes the server every half second
    until it answers (warm from then on) or ``await_server`` seconds have passed since this
    runner was made (then the CLI, as after a fallback, with one WARNING). The wait runs on
    the turn's worker thread, counts in the turn's own time, and ends at once when
    :meth:`stop_turns` ends the turn.

    Args:
        warm: the API server's runner.
        cli: the CLI runner.
        cold: start on the CLI (the server did not answer the start's probe).
        await_server: seconds from now during which turns wait for a server that is starting (0: none).
        probe: how a waiting turn probes the server (``timeout -> problem``; default
            :func:`~hermes_actors.hermes.api_client.api_server_problem` of ``warm.server``).
        retry_seconds: how long the CLI runs every turn after a fallback.
        clock: monotonic clock (injectable for tests).
    """

    real_hermes = True  # turns run on the real Hermes: ``bot_mode.wake_sender: auto`` wakes senders

    def __init__(self, warm: ApiRunner, cli: HermesCliRunner, *, cold: bool = False, await_server: float = 0.0,
                 probe: Probe | None = None, retry_seconds: float = 30.0, clock: Any = time.monotonic) -> None:
        self.warm = warm
        self.cli = cli
        self.retry_seconds = float(retry_seconds)
        self.clock = clock
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a waiting turn's pause: woken when the turn is ended
        self._cold = cold  # the last warm attempt fell back (the switch is logged once each way)
        self._warm_again_at = clock() + self.retry_seconds if cold else 0.0
        self._await_until = clock() + await_server if await_server > 0 and not cold else None
        self._awaited_from = clock()
        self.probe_every = _START_PROBE_SECONDS  # the pause between two probes of a waiting turn
        self._probe: Probe = probe if probe is not None else (lambda timeout: api_server_problem(warm.server, timeout))
        self._waiting: set[str] = set()  # deliveries whose turns wait for the API server to start
        self._ended: set[str] = set()  # deliveries stop_turns ended (until released): a waiting one never runs
        self._stopping = False  # the gateway's stop began (stop_waiting): a turn that comes to the wait now never waits
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

    def turns_now(self) -> dict[str, Any]:
        """How the next turn runs (:func:`turn_path`): ``{"turns_via", "cli_seconds"}`` (see :func:`turns_info`).

        Once the wait for a starting server is over, a turn still probes it first, as a ``warm`` one tries it.
        """
        with self._lock:
            now = self.clock()
            path = turn_path(now, self._warm_again_at, self._await_until is not None and now < self._await_until)
            return {"turns_via": path, "cli_seconds": round(self._warm_again_at - now, 1) if path == "cli" else 0.0}

    def run_turn(self, turn: Turn) -> str:
        """Run ``turn`` warm, else (never delivered there) with the CLI; the reply.

        Raises:
            TurnFailed: from the API server when the turn may have reached it, else from the CLI;
                ``target_busy`` while the bot's turn lost in a stopping gateway may still run there;
                ``runtime_offline`` (not ambiguous) once hermes' stop of the gateway hosting the actors has
                begun (before the turn, or as its API server refused it): it runs nowhere.
        """
        self._refuse_once_own_gateway_stops(turn)  # on any path (the turn gates hold the turns not begun yet)
        self._refuse_beside_a_lost_turn(turn)
        self._refuse_beside_a_turn_this_host_lost_track_of(turn)
        with self._lock:
            path = turn_path(self.clock(), self._warm_again_at, self._await_until is not None)
        if path == "starting" and not self._await_server(turn):
            return self._cli_turn(turn)
        if path == "cli":
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
            cancelled = refused_at_own_stop(failure, turn.handle or turn.profile, stopping=own_gateway_stopping())
            if cancelled is not None:
                raise cancelled from None
            self._switch(cold=True, why=failure.text)
            return self._cli_turn(turn)
        self._switch(cold=False, why="")
        return reply

    def _await_server(self, turn: Turn) -> bool:
        """While the API server of the hermes gateway hosting us starts: probe it until it answers (True: run
        warm) or the wait is over (False: the CLI, as after a fallback; logged once). Every step is bounded: one
        probe takes at most the time left, the pause between two is :data:`_START_PROBE_SECONDS`.

        Raises:
            TurnFailed: ``cancelled`` when :meth:`stop_turns` ended the turn while it waited (it never ran).
        """
        with self._lock:
            self._waiting.add(turn.delivery_id)
        try:
            return self._probe_until_decided(turn)
        finally:
            with self._lock:
                self._waiting.discard(turn.delivery_id)
                self._ended.discard(turn.delivery_id)  # it ended: the set holds only turns that wait

    def _probe_until_decided(self, turn: Turn) -> bool:
        """:meth:`_await_server`'s loop."""
        while True:
            with self._lock:
                self._raise_if_ended(turn)
                until = self._await_until
                if until is None:  # another turn saw it answer, or gave up on it
                    return turn_path(self.clock(), self._warm_again_at, False) == "warm"
            problem = self._probe(max(0.1, min(2.0, until - self.clock())))
            now = self.clock()
            step = while_starting(now, until, problem)
            with self._lock:
                self._raise_if_ended(turn)
                if step == "wait":
                    self._changed.wait(max(0.0, min(self.probe_every, until - now)))
                    continue
                if self._await_until is None:  # another turn decided meanwhile: its decision stands
                    continue
                self._await_until = None
                if step == "cli":
                    self._cold = True
                    self._warm_again_at = now + self.retry_seconds
            if problem is None:
                logger.info("the hermes API server {} answers: turns run warm", self.warm.server)
                return True
            logger.warning(cli_at_start_text(self.warm.server, problem, turn_root(turn), self.cli.cli, in_gateway=True,
                                             waited=now - self._awaited_from))
            return False

    def _raise_if_ended(self, turn: Turn) -> None:
        """(Holding the lock) a turn :meth:`stop_turns` ended while it waited for the API server never runs, nor one
        whose wait sees the hermes gateway hosting the actors begin to stop."""
        if self._stopping or turn.delivery_id in self._ended:
            raise TurnFailed(f"@{turn.handle or turn.profile}'s turn was ended because the gateway stopped before it "
                             "began (it was waiting for the hermes API server)", reason=CANCELLED)
        self._refuse_once_own_gateway_stops(turn)

    def _refuse_once_own_gateway_stops(self, turn: Turn) -> None:
        """No turn starts once hermes' own stop of the gateway hosting the actors has begun
        (:func:`not_run_at_own_stop`). Not at our platform's disconnect alone: a multiplexing gateway may drop one
        profile's platform and go on (our own stop holds the turns not begun at its gates).

        Raises:
            TurnFailed: ``runtime_offline`` then.
        """
        if own_gateway_stop_begun():
            raise not_run_at_own_stop(turn.handle or turn.profile)

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
        it still lives (it drains before it exits). :meth:`turns_in_hermes` says the same of every bot.
        """
        running = self.warm.in_flight(turn.profile)
        if running is not None and running != turn.delivery_id:
            raise TurnFailed(busy_in_gateway_text(turn.handle or turn.profile), reason=TARGET_BUSY)
        watch = self._lost_turn(turn.profile)
        if watch is None:
            return
        raise TurnFailed(
            f"@{turn.handle or turn.profile} is still finishing an earlier turn in the stopping hermes gateway "
            f"(pid {watch.pid}); the message was NOT delivered — resend shortly.",
            reason=TARGET_BUSY,
        )

    def _lost_turn(self, profile: str) -> ProcessWatch | None:
        """The stopping gateway process that may still run the bot's lost turn; None once it exited (forgotten)."""
        with self._lock:
            watch = self._lost_turns.get(profile)
            if watch is not None and watch.exited():
                del self._lost_turns[profile]
                return None
            return watch

    def turns_in_hermes(self) -> dict[str, str]:
        """The bots whose earlier turn hermes may still run, as :meth:`_refuse_beside_a_lost_turn` refuses them.

        Returns:
            profile → the delivery whose chat request is still open (a turn reported timed out: hermes
            answers it when done), or ``""`` for a turn lost in a stopping gateway process that still lives.
        """
        with self._lock:
            lost = list(self._lost_turns)
        found = {profile: "" for profile in lost if self._lost_turn(profile) is not None}
        found.update(self.warm.turns_in_hermes())
        return found

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
        with self._lock:
            self._ended.discard(delivery_id)
        self.cli.release(delivery_id)

    def running_turns(self) -> list[str]:
        """The deliveries whose CLI turn process runs now (a warm turn runs in the hermes gateway)."""
        return self.cli.running_turns()

    def stop_turns(self, delivery_ids: Iterable[str] | None = None, **kwargs: Any) -> int:
        """End the CLI processes of running turns (warm turns end with the hermes gateway); a turn still waiting
        for the API server to start stops waiting and never runs (``cancelled``)."""
        wanted = None if delivery_ids is None else list(delivery_ids)
        with self._lock:
            self._ended.update(self._waiting if wanted is None else self._waiting.intersection(wanted))
            self._changed.notify_all()
        return self.cli.stop_turns(wanted, **kwargs)

    def stop_waiting(self) -> int:
        """At the beginning of a stop: the turns still waiting for the API server to start stop waiting and never
        run (``cancelled``), at once, instead of holding the stop until their wait ends (then to start a CLI turn
        during the stop) or its timeout (then told ``ambiguous`` of a turn that never ran).

        Returns:
            How many turns were waiting.
        """
        with self._lock:
            self._stopping = True  # for good: a runner serves one gateway's run, and a turn may reach the wait late
            self._ended.update(self._waiting)
            self._changed.notify_all()
            return len(self._waiting)
