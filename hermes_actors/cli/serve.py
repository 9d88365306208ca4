"""``hermes-actors serve``: run one gateway on a root until interrupted; the CLI's way to stop a gateway."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from loguru import logger

from actors import RestartPolicy
from hermes_actors.cli.render import not_managed_note
from hermes_actors.gateway import Gateway
from hermes_actors.ops.http_config import HttpSettings
from hermes_actors.ops.main_thread_wait import MainThreadWait
from hermes_actors.ops.stop_signals import STOP_SIGNALS, StopSignals
from hermes_actors.store.hermes_root import discover_profiles, install_is_managed
from hermes_actors.store.os_errors import advised, resource_failure

__all__ = [
    "ABANDONED_TEXT", "RESTART_POLICY", "cut_off_text", "missing_cli_warning", "serve", "stop_gateway", "stop_text",
    "waiting_text",
]

STOP_GRACE_SECONDS = 30.0
RESTART_POLICY = RestartPolicy(max_restarts=3, within_seconds=60.0)  # failed gateways restarted, then give up


def waiting_text(count: int, seconds: float, *, received: signal.Signals | None) -> str:
    """Pure: what a stopping CLI says while it waits for running turns, and what a second stop signal does.

    Any of the :data:`STOP_SIGNALS` abandons the turns meanwhile (:func:`stop_gateway`), whichever one
    asked the stop: the advice names the one received, so a service manager's SIGTERM is not told to
    press Ctrl-C "again".

    Args:
        count: how many turns are still running.
        seconds: how long they may still take.
        received: the signal that asked the stop; None: none did (a wait that ran out, a failed gateway).

    Returns:
        e.g. "waiting for 2 running turns, up to 30 s; Ctrl-C again to abandon them", or after a SIGTERM
        "waiting for 1 running turn, up to 30 s; a second SIGTERM (or SIGINT, SIGHUP) abandons it".
    """
    turns, them = (f"{count} running turn", "it") if count == 1 else (f"{count} running turns", "them")
    waiting = f"waiting for {turns}, up to {seconds:.0f} s"
    if received is None:
        return f"{waiting}; Ctrl-C to abandon {them}"
    if received == signal.SIGINT:
        return f"{waiting}; Ctrl-C again to abandon {them}"
    others = ", ".join(sig.name for sig in STOP_SIGNALS if sig != received)
    return f"{waiting}; a second {received.name} (or {others}) abandons {them}"


#: What a stopping CLI says once a second stop signal abandoned the running turns.
ABANDONED_TEXT = "abandoned the running turns: their outcome is ambiguous"


def cut_off_text(seconds: float) -> str:
    """Pure: what a stopping CLI says once its wait for running turns ran out (turns were still running).

    Args:
        seconds: the wait it gave them (the stop's grace).

    Returns:
        e.g. "gave up on the running turns after 30 s: their outcome is ambiguous".
    """
    return f"gave up on the running turns after {seconds:.0f} s: their outcome is ambiguous"


def missing_cli_warning(runner: Any) -> str | None:
    """What ``serve`` warns at its start when its real-Hermes runner found no ``hermes`` executable: doctor's
    verdict (:func:`~hermes_actors.ops.doctor_checks.check_cli`), and what it means for the turns.

    Args:
        runner: the started gateway's runner.

    Returns:
        The warning; None when the runner is not the real Hermes' or found its CLI.
    """
    from hermes_actors.hermes.cli_runner import HermesCliRunner
    from hermes_actors.hermes.warm_or_cli import WarmOrCliRunner
    from hermes_actors.ops.doctor_checks import check_cli

    cli_runner = runner.cli if isinstance(runner, WarmOrCliRunner) else runner
    if not isinstance(cli_runner, HermesCliRunner) or cli_runner.cli_found:
        return None
    check = check_cli(None, None, None)
    if isinstance(runner, WarmOrCliRunner) and not runner.cold:  # warm turns answer: only the fallback is gone
        from hermes_actors.hermes.install import NO_HERMES_CLI

        return (f"{check.name}: {NO_HERMES_CLI}: warm turns run, but the CLI fallback is unavailable (a turn the "
                f"hermes API server cannot take fails runtime_offline); fix: {check.fix}")
    return f"{check.name}: {check.detail} until hermes is installed or --cli is given; fix: {check.fix}"


def stop_text(received: signal.Signals | None) -> str:
    """Pure: the line ``serve`` prints as it begins to stop, naming the signal that asked it.

    Args:
        received: the stop signal received; None: the stop was asked otherwise (a failed gateway, ``stop``).

    Returns:
        e.g. "stopping the gateway (SIGTERM received)", "stopping the gateway (Ctrl-C)".
    """
    if received is None:
        return "stopping the gateway"
    return f"stopping the gateway ({'Ctrl-C' if received == signal.SIGINT else f'{received.name} received'})"


def stop_gateway(gw: Gateway, signals: StopSignals | None = None, *, out: TextIO | None = None,
                 timeout: float = STOP_GRACE_SECONDS) -> None:
    """Stop ``gw``, saying what it waits for; a stop signal (Ctrl-C, SIGTERM, SIGHUP) meanwhile abandons
    running turns.

    Abandoned turns (and those still running after ``timeout``) end with an
    ``ambiguous`` outcome and their processes are ended; either way it says so
    (:data:`ABANDONED_TEXT`, :func:`cut_off_text`).

    Args:
        gw: the running gateway.
        signals: the command's stop signals (routed meanwhile: any one abandons the turns): the one that asked
            this stop is named in the advice (:func:`waiting_text`). None: no signal asked it.
        out: where the messages go (stderr when None).
        timeout: seconds running turns get to finish.
    """
    stream = out or sys.stderr
    signals = signals if signals is not None else StopSignals()
    received = signals.received
    cut_off = threading.Event()

    def on_wait(count: int, seconds: float) -> None:
        print(waiting_text(count, seconds, received=received), file=stream, flush=True)

    with MainThreadWait() as waits, signals.stopping():
        if waits.on_signals:
            _stop_beside(gw, waits, timeout=timeout, abandon=signals.abandon, on_wait=on_wait,
                         on_cut_off=cut_off.set)
        else:  # not the main thread: no signal handler runs here
            gw.stop(timeout, abandon=signals.abandon, on_wait=on_wait, on_cut_off=cut_off.set)
    if signals.abandon.is_set():
        print(ABANDONED_TEXT, file=stream, flush=True)
    elif cut_off.is_set():  # the wait ran out: the turns were cut off all the same, and said so
        print(cut_off_text(timeout), file=stream, flush=True)


def _stop_beside(gw: Gateway, waits: MainThreadWait, *, timeout: float, abandon: threading.Event,
                 on_wait: Callable[[int, float], None], on_cut_off: Callable[[], None]) -> None:
    """``gw.stop`` on a thread of its own while this one waits in ``waits``, where a stop signal reaches it.

    The stop waits for running turns on locks no signal interrupts: run on the main thread, a second
    Ctrl-C handed to another thread set ``abandon`` only once the turns were done.

    Raises:
        Exception: whatever ``gw.stop`` raised.
    """
    done = threading.Event()
    failed: list[BaseException] = []

    def stop() -> None:
        try:
            gw.stop(timeout, abandon=abandon, on_wait=on_wait, on_cut_off=on_cut_off)
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)
        finally:
            done.set()

    stopper = threading.Thread(target=stop, name="gateway-stop")
    stopper.start()
    try:
        waits.until_set(done)
    except BaseException:  # an interrupt of this wait (a handler that raises): the stop goes on, abandoned
        abandon.set()
        raise
    finally:
        stopper.join()
    if failed:
        raise failed[0]


def serve(root: Path, *, connection_id: str | None, runner: Any, config: dict[str, Any] | None = None,
          stop: threading.Event | None = None, http: HttpSettings | None = None,
          on_ready: Callable[[Any], None] | None = None) -> int:
    """Start a gateway serving the root's submit endpoint, block until a stop signal (or ``stop``), then stop it.

    A gateway that fails (its Dispatcher stopped on an error: a bug) is stopped and a new one
    started on the root, which re-offers the journaled DMs; after :data:`RESTART_POLICY`'s
    restarts within its window, serve gives up with exit code 1 (a service manager may
    start it again).

    Args:
        root: the Hermes root.
        connection_id: this gateway's connection id on the relay.
        runner: how turns run.
        config: overrides deep-merged over ``config.yaml``.
        stop: set it (from any thread) to stop, besides the signals.
        http: also serve ``/metrics``, ``/status`` and the live page there (None: no HTTP endpoint).
        on_ready: called with the operator endpoint (or None) each time a gateway serves (for tests).

    Returns:
        The exit code: 0 once stopped, 1 when the gateway kept failing.

    Raises:
        RuntimeError: another process already hosts the root, or the HTTP address cannot be bound (the
            gateway is stopped again first).
    """
    # From before the first start to the end of the last stop (a signal during a start stops it once started)
    signals = StopSignals(stop=stop)
    restarts: deque[float] = deque(maxlen=RESTART_POLICY.max_restarts + 1)
    with signals.routed():
        while True:
            failure = _serve_once(root, connection_id=connection_id, runner=runner, config=config, signals=signals,
                                  http=http, on_ready=on_ready, first=not restarts)
            if failure is None:
                return 0
            now = time.monotonic()
            if not RESTART_POLICY.allows(restarts, now):
                recent = RESTART_POLICY.recent(restarts, now) + 1
                print(f"the gateway failed {recent} times within {RESTART_POLICY.within_seconds:.0f} s "
                      f"(last: {failure}); giving up", file=sys.stderr, flush=True)
                return 1
            restarts.append(now)
            print(f"restarting the gateway: {failure}", file=sys.stderr, flush=True)


def _unmanaged(root: Path) -> bool:
    """Whether the install on ``root`` is not managed by Bot Mode (the note ``serve`` prints once it serves).

    Args:
        root: the Hermes root.

    Returns:
        True when it is not; False when it is, or when it cannot be told now (out of file descriptors, say:
        said in one WARNING, and the gateway serves on).
    """
    try:
        return not install_is_managed(discover_profiles(root))
    except OSError as exc:
        short = resource_failure(exc)
        if short is None:
            raise
        logger.warning("could not tell whether the install on {} is managed by Bot Mode: {}: {}", root, short,
                       advised(exc))
        return False


def _serve_once(root: Path, *, connection_id: str | None, runner: Any, config: dict[str, Any] | None,
                signals: StopSignals, http: HttpSettings | None, on_ready: Callable[[Any], None] | None,
                first: bool) -> str | None:
    """Serve one gateway until ``signals.stop`` is set or it fails; None once stopped, else what failed."""
    failures: list[str] = []
    stop = signals.stop  # set by the first stop signal (routed by serve), by the caller, or by a failure

    def on_failure(error: BaseException | None) -> None:  # on the failed Dispatcher's thread
        failures.append(f"its dispatcher failed ({error!r})")
        stop.set()  # ends the wait for a stop below (MainThreadWait.until_set watches the event)

    gw = Gateway(root, runner=runner, config=config, connection_id=connection_id, serve_submit=True,
                 on_failure=on_failure)
    endpoint = None
    if http is not None:  # bound before the gateway starts: an address that cannot be bound starts nothing
        from hermes_actors.ops.http_server import OpsHttpServer

        try:
            endpoint = OpsHttpServer(gw, http).bind()
        except OSError as exc:  # in use, not an address of this machine, ...
            from hermes_actors.hermes.submit_client import lock_holder
            from hermes_actors.hermes.submit_lock import already_hosted

            holder = lock_holder(root)
            if holder is not None:  # the address is likely that host's own: the host is the conflict to name
                raise already_hosted(root, holder) from exc
            raise RuntimeError(f"cannot serve HTTP on {http.url}: {exc.strerror or exc}") from exc
    try:
        if endpoint is not None:  # before the start: the outcomes its recovery settles are counted and shown too
            endpoint.subscribe()
        gw.start()  # a stop signal meanwhile sets stop: the start completes, and the wait below ends at once
    except BaseException:
        if endpoint is not None:
            endpoint.close()
        raise
    try:
        if endpoint is not None:
            endpoint.start()
        with MainThreadWait() as waits:
            names = ", ".join(f"@{r['handle']}" for r in gw.roster() if r["connection_id"] is None)
            # what the gateway runs as: its absolute root, and the connection id it took (Redis may take
            # bot_mode.connection_id when none was given)
            print(f"gateway serving {gw.root} as {gw.connection_id or '(no connection id)'}: {names}", flush=True)
            if first and _unmanaged(root):  # served, yet every DM would be refused
                print(not_managed_note(root), file=sys.stderr, flush=True)
            no_cli = missing_cli_warning(gw.runner) if first else None
            if no_cli is not None:  # served, yet every turn (or every CLI turn) would fail runtime_offline
                logger.warning("{}", no_cli)
            if endpoint is not None:
                print(f"live page, /metrics and /status on {endpoint.url}", flush=True)
            if on_ready is not None:
                on_ready(endpoint)
            waits.until_set(stop)  # a signal handed to another thread than main ends this wait too
        if failures and signals.received is None:
            stop.clear()
        else:
            failures.clear()
        print(stop_text(signals.received), file=sys.stderr, flush=True)
    finally:
        # The gateway first: it takes no DM from the moment the stop is asked (the endpoint's clients, which
        # may be idle or slow, used to be waited for first, with the signals back to their defaults)
        try:
            stop_gateway(gw, signals)
        finally:
            if endpoint is not None:
                endpoint.close()
        print("gateway stopped", file=sys.stderr, flush=True)
    # a stop signal received after the wait (before the stop began) ends serve too: no restart then
    return failures[0] if failures and signals.received is None else None
