"""Driving ``tests/crash_gateway.py`` child processes from the crash tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from roots import logged_turns

HELPER = Path(__file__).with_name("crash_gateway.py")
REPO = Path(__file__).resolve().parent.parent

__all__ = ["HELPER", "SIGNAL_ANOTHER_THREAD", "Child", "child_env", "journal_ids", "run_child", "turns_logged"]

#: Code for a child script: ``signal_another_thread(sig, ready)`` hands ``sig`` to a thread that is not main, once
#: ``ready()`` holds and the main thread waits (in a ``wait`` or ``until`` frame), as the kernel may hand a
#: process's signal to any thread that does not block it. A signal handled while the main thread still ran would
#: prove nothing about its wait.
SIGNAL_ANOTHER_THREAD = r"""
import signal, sys, threading
from actors.testkit import await_condition

def signal_another_thread(sig, ready=lambda: True):
    def main_waits():
        frame = sys._current_frames().get(threading.main_thread().ident)
        return frame is not None and frame.f_code.co_name in ("wait", "until")

    def kick():
        me, main = threading.current_thread(), threading.main_thread()
        await_condition(lambda: ready() and main_waits(), timeout=30, message="the main thread waiting")
        other = next(t for t in threading.enumerate() if t not in (me, main) and t.ident)
        print("signalled", other.name, flush=True)
        signal.pthread_kill(other.ident, sig)

    threading.Thread(target=kick, daemon=True).start()
"""


def child_env(crash_at: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "HERMES_ACTORS_CRASH_AT"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    if crash_at:
        env["HERMES_ACTORS_CRASH_AT"] = crash_at
    return env


@dataclass
class Child:
    """A finished child: its exit code and the JSON events it printed."""

    returncode: int
    events: list[dict[str, Any]] = field(default_factory=list)
    stderr: str = ""

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL


def parse_events(text: str) -> list[dict[str, Any]]:
    events = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # the last line may be cut by a kill
    return events


def run_child(root: Path, *args: str, crash_at: str | None = None, timeout: float = 60) -> Child:
    proc = subprocess.run(
        [sys.executable, str(HELPER), str(root), *args],
        env=child_env(crash_at),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Child(proc.returncode, parse_events(proc.stdout), proc.stderr)


def journal_ids(root: Path, kind: str = "accepted") -> list[str]:
    """Delivery ids of every ``kind`` record in the root's journal files (in file order)."""
    ids: list[str] = []
    for path in sorted((root / "bot_relay" / "journal").glob("j-*.log")):
        for line in path.read_bytes().splitlines():
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if record.get("t") == kind and record["id"] not in ids:
                ids.append(record["id"])
    return ids


def turns_logged(root: Path) -> list[str]:
    """The delivery ids the child's runner (a ``TurnLog`` on ``ROOT/turns.log``) was entered with, in order."""
    return logged_turns(root / "turns.log")
