"""A small model of the seed's delivery mechanism, for side-by-side comparison.

This is **not** product code and not a port of the seed: it models only the
parts of ``seeds/bot_mode_dm.py.txt`` / ``seeds/bot_relay.py.txt`` that cost
time, with the same "instant turn" semantics our benchmarks give hermes-actors:

* **ack** — ``message_agent`` validates sender and target against the profile
  folders, writes the DM to a temp file (the seed never passes message text
  on a command line) after sweeping the DM cache directory for stale files,
  and hands the delivery to a background runner; the ack carries a fresh
  delivery id. The seed launches the runner as a *separate Python process*
  (``terminal_tool(background=True)`` running ``bot_mode_dm.py
  --run-delivery``); the model uses a thread, which is cheaper — the model
  favours the baseline.
* **turn lock** — the runner takes ``bot_relay/locks/<profile>.lock`` with
  ``flock(LOCK_EX | LOCK_NB)`` attempts, sleeping 100 ms between attempts, up
  to ``turn_wait_seconds`` (then ``target_busy``), exactly the polling shape
  of the seed's ``acquire_turn_lock``. flock locks belong to open file
  descriptions, so two runner threads of this process contend like two
  processes would.
* **turn** — one subprocess per delivery: ``python -c`` standing in for
  ``hermes -p <profile> chat … --query-file <file>`` (stdin /dev/null, output
  captured). It reads the query file and prints an instant reply, ``ok``.
  The real CLI start is far heavier than a bare interpreter; again the model
  favours the baseline.
* **completion** — the runner's exit is the completion notification: the
  outcome goes to ``wait_outcome`` waiters and ``subscribe`` callbacks.
* **relay reply waiter** — :func:`wait_reply_file` polls a reply file every
  250 ms like the seed's ``--wait-reply`` process (for relay scenarios).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["LOCK_POLL_S", "REPLY_POLL_S", "TURN_CODE", "BaselineGateway", "wait_recorded", "wait_reply_file"]

LOCK_POLL_S = 0.1  # acquire_turn_lock: sleep between non-blocking flock attempts
REPLY_POLL_S = 0.25  # the relay reply waiter's stat cadence
DM_STALE_S = 6 * 3600  # the DM cache sweep's age limit

#: The CLI stand-in: read ``--query-file`` and answer at once.
TURN_CODE = (
    "import sys\n"
    "path = sys.argv[sys.argv.index('--query-file') + 1]\n"
    "with open(path, encoding='utf-8') as fh:\n"
    "    fh.read()\n"
    "sys.stdout.write('ok')\n"
)


def _outcome(delivery_id: str, target: str, *, reply: str = "", error: str = "", reason: str = "") -> dict[str, Any]:
    """An outcome dict with the same keys as ours (DESIGN 3)."""
    status = "failed" if error else ("replied" if reply else "silent")
    text = f"Reply from @{target}: {reply}" if reply else f"Delivery to @{target} failed [reason: {reason}]: {error}"
    return {
        "delivery_id": delivery_id,
        "status": status,
        "reply": reply,
        "error": error,
        "reason": reason,
        "retryable": reason == "target_busy",
        "from": f"@{target}",
        "text": text,
    }


def wait_recorded(lock: threading.Lock, events: dict[str, threading.Event],
                  outcomes: dict[str, dict[str, Any]], delivery_id: str, timeout: float) -> dict[str, Any]:
    """Wait for the outcome a baseline model records under ``lock``; a copy of it.

    Raises:
        KeyError: ``delivery_id`` was never sent.
        TimeoutError: no outcome within ``timeout`` seconds.
    """
    with lock:
        event = events.get(delivery_id)
    if event is None:
        raise KeyError(f"unknown delivery id {delivery_id!r}")
    if not event.wait(timeout):
        raise TimeoutError(f"no outcome for delivery {delivery_id} within {timeout}s")
    with lock:
        return dict(outcomes[delivery_id])


class BaselineGateway:
    """The seed's mechanism behind the same calls our ``Gateway`` offers.

    Args:
        root: a Hermes root (profiles under ``<root>/profiles``).
        turn_wait_seconds: the turn lock budget before ``target_busy``.
        python: the interpreter the CLI stand-in runs on.
    """

    def __init__(self, root: str | Path, *, turn_wait_seconds: float = 120.0, python: str | None = None) -> None:
        self.root = Path(root)
        self.turn_wait_seconds = turn_wait_seconds
        self.python = python or sys.executable
        self.dm_dir = self.root / "cache" / "bot_dm"
        self.lock_dir = self.root / "bot_relay" / "locks"
        self._lock = threading.Lock()
        self._outcomes: dict[str, dict[str, Any]] = {}
        self._events: dict[str, threading.Event] = {}
        self._subscribers: dict[int, Callable[[dict[str, Any]], Any]] = {}
        self._next_token = 0
        self._runners: set[threading.Thread] = set()
        self._profiles: set[str] = set()
        self.running = False

    # ── lifetime ────────────────────────────────────────────────────────────

    def start(self) -> BaselineGateway:
        """Scan the profile folders and get ready."""
        base = self.root / "profiles"
        self._profiles = {"default", "hermes"} | ({p.name for p in base.iterdir()} if base.is_dir() else set())
        self.dm_dir.mkdir(parents=True, exist_ok=True)
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        self.running = True
        return self

    def stop(self, timeout: float = 30) -> None:
        """Wait for the background runners (they are never killed)."""
        self.running = False
        deadline = time.monotonic() + timeout
        with self._lock:
            runners = list(self._runners)
        for thread in runners:
            thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> BaselineGateway:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ── the calls ───────────────────────────────────────────────────────────

    def message_agent(self, *, sender: str, target: str, message: str) -> dict[str, Any]:
        """Write the DM file, launch its background runner, return the ack."""
        if not self.running:
            raise RuntimeError("gateway is not running")
        if sender not in self._profiles:
            return {"error": f"Unknown sender {sender!r}.", "reason": "unknown"}
        if target not in self._profiles:
            return {"error": f"Unknown target {target!r}.", "reason": "unknown"}
        profile = "default" if target == "hermes" else target
        self._sweep_dm_cache()
        fd, dm_file = tempfile.mkstemp(prefix="dm-", suffix=".txt", dir=self.dm_dir, text=True)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(f"Message from 🤖 {sender} (@{sender}): {message}")
        delivery_id = uuid.uuid4().hex
        with self._lock:
            self._events[delivery_id] = threading.Event()
        runner = threading.Thread(
            target=self._run_delivery, args=(delivery_id, profile, dm_file), name=f"baseline-{delivery_id[:8]}"
        )
        with self._lock:
            self._runners.add(runner)
        runner.start()
        return {
            "status": "queued",
            "delivery_id": delivery_id,
            "to": f"@{target}",
            "reply_delivery": "notification",
            "detail": "Message queued: hand-off to a background delivery process, not a delivery receipt.",
            "queued_at": int(time.time()),
        }

    def wait_outcome(self, delivery_id: str, timeout: float = 30) -> dict[str, Any]:
        """Block until the runner of ``delivery_id`` exits; its outcome dict."""
        return wait_recorded(self._lock, self._events, self._outcomes, delivery_id, timeout)

    def subscribe(self, callback: Callable[[dict[str, Any]], Any]) -> Callable[[], None]:
        """Call ``callback(outcome)`` for every later outcome (on the runner thread)."""
        with self._lock:
            token = self._next_token = self._next_token + 1
            self._subscribers[token] = callback

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers.pop(token, None)

        return unsubscribe

    def deliver_now(self, *, sender: str, target: str, message: str) -> dict[str, Any]:
        """Run one delivery on the calling thread; its outcome (the relay's ``deliver`` RPC).

        The seed's ``bot_relay.deliver`` handler on the target gateway writes the
        DM file and runs the same locked CLI turn as a local delivery, then
        answers the Desktop with the reply.
        """
        profile = "default" if target == "hermes" else target
        if profile != "default" and profile not in self._profiles:
            return _outcome("", profile, error=f"Unknown target {target!r}.", reason="unknown")
        self._sweep_dm_cache()
        fd, dm_file = tempfile.mkstemp(prefix="relay-dm-", suffix=".txt", dir=self.dm_dir, text=True)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(f"Message from 🤖 {sender}: {message}")
        delivery_id = uuid.uuid4().hex
        try:
            return self._locked_turn(delivery_id, profile, dm_file)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(dm_file)

    # ── the background runner ───────────────────────────────────────────────

    def _sweep_dm_cache(self) -> None:
        """The seed sweeps stale DM files on every write: list + stat the cache dir."""
        cutoff = time.time() - DM_STALE_S
        with contextlib.suppress(OSError), os.scandir(self.dm_dir) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.stat().st_mtime < cutoff:
                        os.unlink(entry.path)

    def _run_delivery(self, delivery_id: str, profile: str, dm_file: str) -> None:
        try:
            outcome = self._locked_turn(delivery_id, profile, dm_file)
        except Exception as exc:  # the runner reports every failure as an outcome
            outcome = _outcome(delivery_id, profile, error=str(exc), reason="unknown")
        finally:
            with contextlib.suppress(OSError):
                os.unlink(dm_file)
        with self._lock:
            self._outcomes[delivery_id] = outcome
            event = self._events[delivery_id]
            subscribers = list(self._subscribers.values())
            self._runners.discard(threading.current_thread())
        event.set()
        for callback in subscribers:
            with contextlib.suppress(Exception):
                callback(dict(outcome))

    def _locked_turn(self, delivery_id: str, profile: str, dm_file: str) -> dict[str, Any]:
        fd = os.open(self.lock_dir / f"{profile}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            start = time.monotonic()
            deadline = start + self.turn_wait_seconds
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError:
                    now = time.monotonic()
                    if now >= deadline:
                        return _outcome(
                            delivery_id,
                            profile,
                            error=f"@{profile} is busy (waited {now - start:.0f}s). NOT delivered; retry shortly.",
                            reason="target_busy",
                        )
                    time.sleep(min(LOCK_POLL_S, max(0.005, deadline - now)))
            try:
                proc = subprocess.run(
                    [self.python, "-c", TURN_CODE, "-p", profile, "--query-file", dm_file],
                    check=False,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                    encoding="utf-8",
                    errors="replace",
                )
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        if proc.returncode != 0:
            return _outcome(delivery_id, profile, error=proc.stderr.strip() or "turn failed", reason="unknown")
        return _outcome(delivery_id, profile, reply=proc.stdout.strip())


def wait_reply_file(path: Path, budget_s: float) -> dict[str, Any] | None:
    """The seed's relay reply waiter: stat ``path`` every 250 ms until it exists.

    Args:
        path: the sender-side ``replies/<id>.json``.
        budget_s: give up after this long.

    Returns:
        The reply record, or None when the budget ran out.
    """
    deadline = time.time() + budget_s
    while time.time() < deadline:
        if os.path.exists(path):
            with open(path, encoding="utf-8-sig") as fh:
                record: dict[str, Any] = json.load(fh)
            return record
        time.sleep(REPLY_POLL_S)
    return None
