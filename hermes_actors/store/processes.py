"""Whether a process named in a file (a heartbeat, a pid file, a lease) still runs.

Files name processes by pid; a pid read from a file is untrusted input, so anything
that is not a plausible ``pid_t`` is "not running" rather than an error.
"""

from __future__ import annotations

import os

__all__ = ["PID_MAX", "pid_alive"]

PID_MAX = 2**31 - 1  # a pid_t; a larger "pid" read from a file is refused before os.kill sees it


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (signal 0; another user's process counts as existing).

    Args:
        pid: the pid.

    Returns:
        True when it exists; False when it does not, or ``pid`` is not in ``1..PID_MAX``.
    """
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid <= PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # another user's process with that pid: it exists
    except OSError:  # ProcessLookupError: gone
        return False
    return True
