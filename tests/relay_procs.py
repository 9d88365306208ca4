"""Child processes for the multi-process relay tests: start, read stdout lines, stop (not a test module)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["Child", "children", "hub_argv", "peer_argv"]

TESTS = Path(__file__).resolve().parent


def hub_argv(roots: dict[str, Path], rescan: float | None = None) -> list[str]:
    argv = [sys.executable, "-m", "hermes_actors.cli.main", "relay"]
    for name, root in roots.items():
        argv += ["--root", str(root), "--name", name]
    return argv


def peer_argv(root: Path, connection_id: str, target: str, count: int, *extra: str) -> list[str]:
    return [sys.executable, str(TESTS / "relay_peer.py"), "--root", str(root), "--connection-id", connection_id,
            "--target", target, "--count", str(count), *extra]


class Child:
    """One child process; its stdout lines are collected by a reader thread."""

    def __init__(self, name: str, argv: list[str], log_dir: Path) -> None:
        self.name = name
        self.stderr_path = log_dir / f"{name}.stderr"
        self._stderr = self.stderr_path.open("wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     text=True, bufsize=1)
        self._cond = threading.Condition()
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self._lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_line(self, predicate: Callable[[str], bool], timeout: float) -> str:
        """The first stdout line matching ``predicate``; TimeoutError (with stderr) if none in time."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self._lines:
                    if predicate(line):
                        return line
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise TimeoutError(f"{self.name}: no matching line within {timeout}s; exit={self.proc.poll()} "
                                       f"stdout={self._lines[-5:]} stderr={self.stderr_tail()}")
                self._cond.wait(min(remaining, 0.5))

    def wait_json(self, key: str, timeout: float) -> dict[str, Any]:
        def has_key(line: str) -> bool:
            try:
                return key in json.loads(line)
            except ValueError:
                return False

        return dict(json.loads(self.wait_line(has_key, timeout)))

    def json_lines(self, key: str) -> list[dict[str, Any]]:
        """The stdout lines read so far that are JSON objects holding ``key`` (all of them once the child ended)."""
        found: list[dict[str, Any]] = []
        if self.proc.poll() is not None:  # ended: every line it wrote is read once the reader sees the end
            self._reader.join(timeout=10)
        with self._cond:
            lines = list(self._lines)
        for line in lines:
            try:
                fields = json.loads(line)
            except ValueError:
                continue
            if isinstance(fields, dict) and key in fields:
                found.append(fields)
        return found

    def stderr_tail(self, limit: int = 2000) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def stop(self, timeout: float = 10) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        self._stderr.close()
        return self.proc.returncode


@contextmanager
def children(log_dir: Path) -> Iterator[Callable[[str, list[str]], Child]]:
    """Start children through the yielded function; every one is stopped on exit, even on failure."""
    started: list[Child] = []

    def spawn(name: str, argv: list[str]) -> Child:
        child = Child(name, argv, log_dir)
        started.append(child)
        return child

    try:
        yield spawn
    finally:
        for child in reversed(started):
            child.stop()
