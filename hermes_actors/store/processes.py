"""Whether a process named in a file (a heartbeat, a pid file, a lease) still runs, and waiting for it to exit.

Files name processes by pid; a pid read from a file is untrusted input, so anything
that is not a plausible ``pid_t`` is "not running" rather than an error.
"""

from __future__ import annotations

import errno
import os
import select
import threading

__all__ = ["PID_MAX", "ProcessWatch", "pid_alive", "process_start_ticks", "process_started_at"]

PID_MAX = 2**31 - 1  # a pid_t; a larger "pid" read from a file is refused before os.kill sees it


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (signal 0; another user's process counts; a zombie does not).

    A process killed -9 stays a zombie until its parent reaps it (a container's init may take a
    second or more): it holds nothing any more, and a lease or lock it held must be taken over now.

    Args:
        pid: the pid.

    Returns:
        True when it runs; False when it does not, is a zombie, or ``pid`` is not in ``1..PID_MAX``.
    """
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid <= PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        return not _zombie(pid)  # another user's process with that pid: it exists
    except OSError:  # ProcessLookupError: gone
        return False
    return not _zombie(pid)


def process_start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (Linux ``/proc``; elsewhere or unreadable: None).

    With the pid, it names one process for the life of the boot: a pid reused by another process
    has another start; unlike a wall-clock time it does not move when the clock is set.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            fields = stat_file.read().rsplit(b")", 1)[1].split()
        return int(fields[19])  # starttime, the 22nd field of stat: the 20th after the name
    except (OSError, IndexError, ValueError):
        return None


def process_started_at(pid: int) -> float | None:
    """When process ``pid`` started, as a wall-clock time (Linux ``/proc``; elsewhere or unreadable: None).

    Accurate to a clock tick (10 ms): ``starttime`` counts ticks since boot, ``btime`` is the boot time.
    """
    ticks = process_start_ticks(pid)
    if ticks is None:
        return None
    try:
        with open("/proc/stat", "rb") as stat_file:
            boot = next(int(line.split()[1]) for line in stat_file if line.startswith(b"btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, StopIteration):
        return None


def _zombie(pid: int) -> bool:
    """Whether ``pid`` is a zombie (Linux ``/proc``; elsewhere, or unreadable: not known to be one).

    The state is the thread-group leader's: a process whose main thread ended while others run shows
    ``Z`` too, so it counts as a zombie only with no thread left but that one (``num_threads``).
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            fields = stat_file.read().rsplit(b")", 1)[1].split()  # the name, in parentheses, may hold spaces
        return fields[0] == b"Z" and int(fields[17]) <= 1  # fields from "state": num_threads is the 18th
    except (OSError, IndexError, ValueError):
        return False


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
        return self.wait(0)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the process to exit; whether it has.

        Without a pidfd (not Linux 5.3+) this only looks once: there is nothing to wait on.
        """
        with self._lock:
            if self._gone:
                return True
            fd = self._fd
            if fd is None:
                self._gone = not pid_alive(self.pid)
                return self._gone
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            # Under the lock: ``close`` from another thread cannot close the fd being polled.
            if not poller.poll(max(0, int(timeout * 1000))):
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
