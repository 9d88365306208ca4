"""The ``hermes gateway run`` process of a root: its pid (waiting for it: ``store.processes.ProcessWatch``).

A warm turn whose connection was lost mid-turn may still be running in a gateway
that is stopping: hermes drains its API server runs before it exits. Until that
process is gone, another turn of the same bot would run beside it in the same
Bot Chat session (:class:`~hermes_actors.hermes.warm_or_cli.WarmOrCliRunner`
refuses it, ``target_busy``).

hermes-agent 0.19 writes ``<HERMES_HOME>/gateway.pid`` (JSON ``{"pid": N, ...}``,
or a bare number from older releases) when it starts and removes it when it exits.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hermes_actors.store.processes import pid_alive

__all__ = ["gateway_pid"]

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
