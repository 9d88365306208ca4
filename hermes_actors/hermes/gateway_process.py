"""The ``hermes gateway run`` process of a root: its pid (waiting for it: ``store.processes.ProcessWatch``), and
whether the one this process is (hosting the actors) has begun to stop.

A warm turn whose connection was lost mid-turn may still be running in a gateway
that is stopping: hermes drains its API server runs before it exits. Until that
process is gone, another turn of the same bot would run beside it in the same
Bot Chat session (:class:`~hermes_actors.hermes.warm_or_cli.WarmOrCliRunner`
refuses it, ``target_busy``).

hermes-agent 0.19 writes ``<HERMES_HOME>/gateway.pid`` (JSON ``{"pid": N, ...}``,
or a bare number from older releases) when it starts and removes it when it exits.

A warm turn runs in the hermes gateway's own process when that gateway hosts the actors. Its stop
(Ctrl-C, SIGTERM) closes the API server before it tears our platform down, so for seconds the actors
run while hermes no longer takes turns: our platform registers its stop signs (:func:`watch_own_stop`).
:func:`own_gateway_stop_begun` (hermes' stop has begun: for good) holds every turn from then on (the
``Gateway``'s ``host_stopping``: no turn starts, as once our own stop has begun); :func:`own_gateway_stopping`
(that, or our platform's disconnect runs) is what the runner asks when a warm turn is refused or cut: a
refused turn is ``cancelled`` rather than run with the CLI, and a cut one is told "The turn was still
running when the gateway stopped." rather than a lost connection.
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

from hermes_actors.store.processes import pid_alive

__all__ = ["gateway_pid", "own_gateway_stop_begun", "own_gateway_stopping", "watch_own_stop"]

Sign = Callable[[], bool]
# the platforms of this process, weakly (not kept alive): (stopping, stop begun) of each
_stop_signs: list[tuple[weakref.WeakMethod[Sign], weakref.WeakMethod[Sign] | None]] = []
_stop_signs_lock = threading.Lock()


def watch_own_stop(sign: Sign, *, begun: Sign | None = None) -> None:
    """Register the bound methods saying whether the hermes gateway this process is has begun to stop.

    Held weakly: they go with their object (a platform hermes dropped).

    Args:
        sign: a bound method (``HostAdapter.stopping``); True once that gateway's stop, or our platform's
            disconnect, has begun.
        begun: a bound method (``HostAdapter.stop_begun``); True once hermes' own stop has begun, for good
            (never our disconnect alone: a multiplexing gateway may drop one profile's platform and go on).
    """
    with _stop_signs_lock:
        _stop_signs[:] = [refs for refs in _stop_signs if refs[0]() is not None]
        _stop_signs.append((weakref.WeakMethod(sign), weakref.WeakMethod(begun) if begun is not None else None))


def _any_says(which: int) -> bool:
    """Whether a registered sign (0: stopping, 1: stop begun) says so; one that raises does not."""
    with _stop_signs_lock:
        signs = [ref() for ref in (refs[which] for refs in _stop_signs) if ref is not None]
    for sign in signs:
        try:
            if sign is not None and sign():
                return True
        except Exception:  # hermes' internals changed: not known to stop
            continue
    return False


def own_gateway_stopping() -> bool:
    """Whether the hermes gateway this process is has begun to stop, or our platform's disconnect runs (a sign
    of :func:`watch_own_stop` says so).

    Returns:
        False in any process no hermes gateway platform of ours runs in (``serve``, ``send``, a program).
    """
    return _any_says(0)


def own_gateway_stop_begun() -> bool:
    """Whether hermes' own stop of the hermes gateway this process is has begun: for good, so from then on no
    turn of the actors it hosts starts (the ``Gateway``'s ``host_stopping``). Quick: attribute reads, no I/O.

    Returns:
        False in any process no hermes gateway platform of ours runs in, and before hermes' stop.
    """
    return _any_says(1)


_PID_FILE = "gateway.pid"
_PID_FILE_MAX_BYTES = 64 * 1024


def gateway_pid(root: Path) -> int | None:
    """The pid the root's hermes gateway recorded, when that process is alive.

    Args:
        root: the Hermes root (the gateway's ``HERMES_HOME``).

    Returns:
        The pid, or None (no pid file, unreadable or hostile content, or no such process).
    """
    path = Path(root) / _PID_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        raw = os.read(fd, _PID_FILE_MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(raw) > _PID_FILE_MAX_BYTES:
        return None
    try:
        payload = json.loads(raw)
    except ValueError:
        return None
    pid = payload.get("pid") if isinstance(payload, dict) else payload
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
        return None
    return pid if pid_alive(pid) else None
