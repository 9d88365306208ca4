"""The ``hermes gateway run`` process of a root: its pid, and waiting for it to exit.

A warm turn whose connection was lost mid-turn may still be running in a gateway
that is stopping: hermes drains its API server runs before it exits. Until that
process is gone, another turn of the same bot would run beside it in the same
Bot Chat session (:class:`~hermes_actors.hermes.warm_or_cli.WarmOrCliRunner`
refuses it, ``target_busy``).

hermes-agent 0.19 writes ``<HERMES_HOME>/gateway.pid`` (JSON ``{"pid": N, ...}``,
or a bare number from older releases) when it starts and removes it when it exits.
"""

from __future__ import annotations

import errno
import json
import os
import select
import threading
from pathlib import Path

from hermes_actors.store.processes import pid_alive

__all__ = ["ProcessWatch", "gateway_pid"]

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


class ProcessWatch:
    """Knows, without polling and immune to pid reuse, whether one process has exited (a pidfd).

    Thread-safe: several turns' threads may ask the same watch. The pidfd is released once the
    process is seen gone, on :meth:`close`, or when the watch is collected.

    Args:
        pid: the process, alive now.

    Raises:
        ProcessLookupError: it has exited already.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._lock = threading.Lock()
        self._gone = False
        self._fd: int | None = None
        try:
            self._fd = os.pidfd_open(pid)
        except OSError as exc:  # no pidfd here (not Linux 5.3+): fall back to the pid, which may be reused
            if isinstance(exc, ProcessLookupError):
                raise
            if exc.errno not in (errno.ENOSYS, errno.EINVAL, errno.EPERM):
                raise

    def exited(self) -> bool:
        """Whether the process has exited (once it has, the pidfd is released and the answer stays True)."""
        with self._lock:
            if self._gone:
                return True
            if self._fd is None:
                self._gone = not pid_alive(self.pid)
                return self._gone
            poller = select.poll()
            poller.register(self._fd, select.POLLIN)
            if not poller.poll(0):
                return False
            self._release()
            return True

    def close(self) -> None:
        """Release the pidfd (idempotent); the watch then says the process has exited."""
        with self._lock:
            self._release()

    def _release(self) -> None:
        self._gone = True
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:  # a watch dropped unasked (replaced by a newer gateway's) keeps no fd open
        fd = getattr(self, "_fd", None)
        if fd is not None:
            self._fd = None
            os.close(fd)
