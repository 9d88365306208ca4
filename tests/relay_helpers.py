"""Helpers for the relay tests: seed-style writers, roster files, a hub thread.

Not a test module. The "seed-style" writers run in a separate ``python -c``
process and use only json/os/tempfile, exactly like the seed's
``_atomic_write_json`` (temp file in the same directory, hidden ``.tmp`` name,
then ``os.replace``): they are not our code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hermes_actors.relay.hub import run_hub

__all__ = [
    "hub_thread",
    "seed_envelope",
    "seed_write_json",
    "write_roster_file",
]

_SEED_WRITER = r"""
import json, os, sys, tempfile
target, payload = sys.argv[1], json.loads(sys.argv[2])
fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=sys.argv[3], suffix=".tmp")
with os.fdopen(fd, "w", encoding=sys.argv[4]) as f:
    json.dump(payload, f, ensure_ascii=False)
os.replace(tmp, target)
"""


def seed_write_json(target: Path, payload: Any, *, prefix: str = ".rep-", encoding: str = "utf-8") -> None:
    """Write ``payload`` to ``target`` from another process, the seed's way (mkstemp + os.replace).

    ``encoding="utf-8-sig"`` starts the file with a byte order mark, as a peer on Windows may.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-c", _SEED_WRITER, str(target), json.dumps(payload), prefix, encoding],
        check=True,
        timeout=30,
    )


def seed_envelope(
    *, target_connection: str, target_profile: str, target_handle: str | None = None,
    from_profile: str = "alice", from_handle: str = "alice", message: str = "hello",
    created_at: float | None = None, envelope_id: str | None = None,
) -> dict[str, Any]:
    """An envelope in the seed's exact format (the seed's ``enqueue_envelope`` keys)."""
    return {
        "id": envelope_id or uuid.uuid4().hex,
        "created_at": int(time.time() if created_at is None else created_at),
        "from_profile": from_profile,
        "from_handle": from_handle,
        "target_connection": target_connection,
        "target_profile": target_profile,
        "target_handle": target_handle or target_profile,
        "message": message,
    }


def write_roster_file(root: Path, agents: list[Any] | None, *, age_seconds: float = 0.0, raw: Any = None) -> Path:
    """Write ``<root>/bot_relay/roster.json`` as the Desktop would (rows as given, unnormalized).

    ``agents=None`` with ``raw=None`` removes the file. ``age_seconds`` moves the mtime back.
    """
    base = root / "bot_relay"
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = base / "roster.json"
    if agents is None and raw is None:
        path.unlink(missing_ok=True)
        return path
    payload = raw if raw is not None else {"updated_at": int(time.time()), "agents": agents}
    tmp = base / f".roster-{uuid.uuid4().hex}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(payload, f)
    os.replace(tmp, path)
    if age_seconds:
        then = time.time() - age_seconds
        os.utime(path, (then, then))
    return path


def remote_row(profile: str, conn: str, *, handle: str | None = None, label: str = "", **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"profile": profile, "handle": handle or profile, "connection_id": conn,
                           "connection_label": label, "title": "", "description": ""}
    row.update(extra)
    return row


@contextmanager
def hub_thread(
    roots: Mapping[str, Path], *, rescan_seconds: float = 2.0
) -> Iterator[threading.Thread]:
    """Run ``run_hub`` for ``{name: root}`` in a thread of this process; stop it on exit."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            run_hub(list(roots.values()), names=list(roots), rescan_seconds=rescan_seconds, stop=stop)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="hub", daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(timeout=15)
        if errors:
            raise errors[0]
        assert not thread.is_alive(), "the hub thread did not stop"
