"""The per-profile cross-process turn lock: ``bot_relay/locks/<profile>.lock``.

Other programs on the same root (an old gateway, the ``hermes`` CLI) serialize
their Bot Chat turns on this ``flock``. There is no notification when a flock
is released, so waiting for one is the one place we poll — with a short,
growing backoff, bounded by the delivery's wait budget.
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from pathlib import Path

__all__ = ["TurnLock", "turn_lock_path"]

_SAFE = re.compile(r"[^a-zA-Z0-9_-]")


def turn_lock_path(root: Path, profile: str) -> Path:
    """The lock file of ``profile`` under ``root`` (name sanitized like the seed)."""
    safe = _SAFE.sub("_", str(profile or ""))[:64] or "_"
    return Path(root) / "bot_relay" / "locks" / f"{safe}.lock"


class TurnLock:
    """One profile's flock, held for exactly the turn window.

    Args:
        path: the lock file (created 0600; its directory 0700).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        return self._fd

    def acquire(self, deadline: float) -> float | None:
        """Take the lock, waiting until the monotonic ``deadline`` at most.

        Returns:
            Seconds waited when acquired, or None when the deadline passed.
        """
        fd = self._open()
        start = time.monotonic()
        delay = 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return time.monotonic() - start
            except BlockingIOError:
                now = time.monotonic()
                if now >= deadline:
                    return None
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, 0.05)

    def release(self) -> None:
        """Release the lock (the fd stays open for the next turn)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the fd (releases the lock if held)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
