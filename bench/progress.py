"""A dependency-free text progress bar on stderr.

On a terminal the bar redraws in place (``\\r``), at most ~10 times a second;
elsewhere (CI logs, pipes) it prints one line when each phase ends so logs stay
readable. Thread-safe: scenarios report from sender and callback threads.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

__all__ = ["NullProgress", "Progress"]


class Progress:
    """Shows ``[#####.....]  42%  local-roundtrip ours  840/2000``.

    Args:
        stream: where to draw (default stderr).
        width: bar width in characters.
        min_interval_s: redraw throttle on a terminal.
    """

    def __init__(self, stream: TextIO | None = None, width: int = 30, min_interval_s: float = 0.1) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.min_interval_s = min_interval_s
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._lock = threading.Lock()
        self._label = ""
        self._total = 0
        self._done = 0
        self._started = 0.0
        self._last_draw = 0.0

    def start(self, label: str, total: int) -> None:
        """Begin a phase of ``total`` steps."""
        with self._lock:
            self._label, self._total, self._done = label, max(0, total), 0
            self._started = time.perf_counter()
            self._last_draw = 0.0
            self._draw(force=True)

    def advance(self, steps: int = 1) -> None:
        """Count ``steps`` more steps done."""
        with self._lock:
            self._done = min(self._total, self._done + steps) if self._total else self._done + steps
            self._draw(force=False)

    def set(self, done: int) -> None:
        """Set the done count."""
        with self._lock:
            self._done = done
            self._draw(force=False)

    def finish(self) -> None:
        """End the phase: draw it complete and move to a new line."""
        with self._lock:
            self._done = self._total or self._done
            elapsed = time.perf_counter() - self._started
            line = self._line() + f"  {elapsed:6.1f}s"
            self.stream.write(("\r" + line + "\x1b[K\n") if self.tty else line + "\n")
            self.stream.flush()

    def note(self, text: str) -> None:
        """Print a message line without breaking the bar."""
        with self._lock:
            self.stream.write(("\r\x1b[K" if self.tty else "") + text + "\n")
            self.stream.flush()

    def _line(self) -> str:
        frac = (self._done / self._total) if self._total else 1.0
        filled = round(frac * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        return f"[{bar}] {frac * 100:3.0f}%  {self._label}  {self._done}/{self._total}"

    def _draw(self, *, force: bool) -> None:
        if not self.tty:
            return
        now = time.perf_counter()
        if not force and now - self._last_draw < self.min_interval_s:
            return
        self._last_draw = now
        self.stream.write("\r" + self._line() + "\x1b[K")
        self.stream.flush()


class NullProgress(Progress):
    """A progress bar that draws nothing (``progress=False``); every method is a no-op."""

    def start(self, label: str, total: int) -> None:
        return

    def advance(self, steps: int = 1) -> None:
        return

    def set(self, done: int) -> None:
        return

    def finish(self) -> None:
        return

    def note(self, text: str) -> None:
        return
