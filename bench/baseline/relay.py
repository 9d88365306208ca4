"""A small model of the seed's cross-connection relay path, for the relay benchmark.

Modelled on ``seeds/bot_relay.py.txt``, only the parts that cost time, all
through files under ``<root>/bot_relay/`` like the seed:

* **send** (sender gateway) — ``message_agent`` resolves ``handle@connection``
  against ``roster.json`` (read twice: target resolution, then the liveness
  check), writes the envelope to ``outbox/<id>.json`` (temp file +
  ``os.replace``), and spawns the **reply waiter**; the ack returns. The seed's
  waiter is a background ``python -c`` process; the model runs
  :func:`~bench.baseline.model.wait_reply_file` on a thread (same 250 ms
  ``stat`` cadence, no interpreter start) — favouring the baseline.
* **Desktop drain** — the Desktop drains ``outbox/`` (sweep stale artifacts,
  ``glob``, claim each envelope by renaming it into ``claimed/``). The seed
  does not fix the Desktop's drain cadence; the model polls every
  :data:`DRAIN_POLL_S` (50 ms) on a thread, with no socket round trip — again
  favouring the baseline.
* **deliver** (target gateway) — the Desktop's ``bot_relay.deliver`` RPC runs the
  seed's local delivery on the target root: DM file, 100 ms-polled ``flock``,
  one subprocess turn (:meth:`BaselineGateway.deliver_now`).
* **reply** — the Desktop writes ``replies/<id>.json`` on the sender root
  (``bot_relay.reply``: temp file + ``os.replace``); the waiter's next poll finds
  it, and its exit is the completion notification (the outcome).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from bench.baseline.model import BaselineGateway, wait_recorded, wait_reply_file

__all__ = ["DRAIN_POLL_S", "BaselineRelay"]

DRAIN_POLL_S = 0.05  # the modelled Desktop's outbox drain cadence (the seed leaves it to the Desktop)
REPLY_WAIT_S = 900.0  # the seed's REPLY_WAIT_SECONDS
STALE_S = 6 * 3600


def _atomic_write_json(target: Path, payload: Any, prefix: str) -> None:
    """The seed's ``_atomic_write_json``: temp file in the same directory, then ``os.replace``."""
    fd, tmp = tempfile.mkstemp(dir=str(target.parent), prefix=prefix, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(payload, fh, ensure_ascii=False)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _sweep_stale(base: Path) -> None:
    cutoff = time.time() - STALE_S
    for sub in ("claimed", "replies", "outbox"):
        for path in (base / sub).glob("*.json"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()


class BaselineRelay:
    """Sender gateway, modelled Desktop and target gateway of the seed's relay, in one object.

    Args:
        sender_root: the sending gateway's Hermes root.
        target_root: the target connection's Hermes root.
        target_connection: the target's connection id (``dave@<this>``).
        turn_wait_seconds: the target's turn-lock budget.
    """

    def __init__(self, sender_root: Path, target_root: Path, *, target_connection: str,
                 turn_wait_seconds: float = 120.0) -> None:
        self.base = Path(sender_root) / "bot_relay"
        self.target_connection = target_connection
        self.target = BaselineGateway(target_root, turn_wait_seconds=turn_wait_seconds)
        self._lock = threading.Lock()
        self._outcomes: dict[str, dict[str, Any]] = {}
        self._events: dict[str, threading.Event] = {}
        self._threads: set[threading.Thread] = set()
        self._stop = threading.Event()
        self._desktop: threading.Thread | None = None

    # ── lifetime ────────────────────────────────────────────────────────────

    def start(self) -> BaselineRelay:
        """Create the relay dirs, push the roster (``roster.sync``), start the target and the Desktop."""
        for sub in ("outbox", "claimed", "replies"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        self.target.start()
        rows = [{"profile": p, "handle": p, "connection_id": self.target_connection,
                 "connection_label": self.target_connection, "online": True}
                for p in sorted(self.target._profiles)]
        _atomic_write_json(self.base / "roster.json", {"at": int(time.time()), "agents": rows}, ".roster-")
        self._desktop = threading.Thread(target=self._drain_loop, name="baseline-desktop", daemon=True)
        self._desktop.start()
        return self

    def stop(self, timeout: float = 30) -> None:
        """Stop the Desktop, wait for in-flight deliveries and waiters."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        if self._desktop is not None:
            self._desktop.join(timeout)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self.target.stop(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> BaselineRelay:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _spawn(self, fn: Callable[[], None], name: str) -> None:
        def run() -> None:
            try:
                fn()
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=run, name=name, daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    # ── the sender gateway ──────────────────────────────────────────────────

    def _roster(self) -> list[dict[str, Any]]:
        with open(self.base / "roster.json", encoding="utf-8") as fh:
            rows: list[dict[str, Any]] = json.load(fh).get("agents", [])
        return rows

    def message_agent(self, *, sender: str, target: str, message: str) -> dict[str, Any]:
        """Queue an envelope for ``handle@connection``, spawn its reply waiter, return the ack."""
        handle, _, connection = target.partition("@")
        row = next((r for r in self._roster() if r["handle"] == handle and r["connection_id"] == connection), None)
        if row is None:
            return {"error": f"Unknown target {target!r}.", "reason": "unknown"}
        live = next((r for r in self._roster() if r["handle"] == handle and r["connection_id"] == connection), None)
        if live is None or live.get("online") is False:
            return {"error": f"@{handle} on {connection} is offline.", "reason": "runtime_offline"}
        envelope = {
            "id": uuid.uuid4().hex, "created_at": int(time.time()), "from_profile": sender,
            "from_handle": sender, "target_connection": connection, "target_profile": row["profile"],
            "target_handle": handle, "message": f"Message from 🤖 {sender} (@{sender}): {message}",
        }
        envelope_id = str(envelope["id"])
        _atomic_write_json(self.base / "outbox" / f"{envelope_id}.json", envelope, ".env-")
        with self._lock:
            self._events[envelope_id] = threading.Event()
        self._spawn(lambda: self._wait_reply(envelope_id, handle), f"baseline-waiter-{envelope_id[:8]}")
        return {"status": "queued", "delivery_id": envelope_id, "to": f"@{target}",
                "reply_delivery": "notification", "queued_at": envelope["created_at"]}

    def _wait_reply(self, envelope_id: str, handle: str) -> None:
        record = wait_reply_file(self.base / "replies" / f"{envelope_id}.json", REPLY_WAIT_S)
        if record is None:
            outcome = {"delivery_id": envelope_id, "status": "failed", "reply": "", "error": "no reply",
                       "reason": "delivery_timeout"}
        elif record.get("error"):
            outcome = {"delivery_id": envelope_id, "status": "failed", "reply": "",
                       "error": record["error"], "reason": record.get("reason", "")}
        else:
            outcome = {"delivery_id": envelope_id, "status": "replied", "reply": record.get("reply", ""),
                       "error": "", "reason": "", "from": f"@{handle}"}
        with self._lock:
            self._outcomes[envelope_id] = outcome
            event = self._events[envelope_id]
        event.set()

    def wait_outcome(self, delivery_id: str, timeout: float = 30) -> dict[str, Any]:
        """Block until the waiter of ``delivery_id`` found its reply; the outcome dict."""
        return wait_recorded(self._lock, self._events, self._outcomes, delivery_id, timeout)

    def subscribe(self, callback: Callable[[dict[str, Any]], Any]) -> Callable[[], None]:
        """Not modelled (the relay scenario is sequential)."""
        raise NotImplementedError("the baseline relay model has no subscribe")

    # ── the Desktop ─────────────────────────────────────────────────────────

    def _drain_loop(self) -> None:
        while not self._stop.wait(DRAIN_POLL_S):
            for envelope in self._claim_pending():
                self._spawn(functools.partial(self._deliver, envelope), f"baseline-deliver-{envelope['id'][:8]}")

    def _claim_pending(self) -> list[dict[str, Any]]:
        """The seed's ``claim_pending_envelopes``: sweep, then claim by rename into ``claimed/``."""
        _sweep_stale(self.base)
        out: list[dict[str, Any]] = []
        for path in sorted((self.base / "outbox").glob("*.json")):
            claimed = self.base / "claimed" / path.name
            try:
                os.replace(path, claimed)
                with open(claimed, encoding="utf-8") as fh:
                    out.append(json.load(fh))
            except (OSError, ValueError):
                continue
        return out

    def _deliver(self, envelope: dict[str, Any]) -> None:
        outcome = self.target.deliver_now(sender=str(envelope["from_handle"]),
                                          target=str(envelope["target_profile"]),
                                          message=str(envelope["message"]))
        payload = {"id": envelope["id"], "at": int(time.time()), "reply": outcome.get("reply", ""),
                   "error": outcome.get("error", ""), "reason": outcome.get("reason", "")}
        _atomic_write_json(self.base / "replies" / f"{envelope['id']}.json", payload, ".rep-")
        with contextlib.suppress(OSError):
            os.unlink(self.base / "claimed" / f"{envelope['id']}.json")
