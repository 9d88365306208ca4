"""One-file marks per envelope under ``bot_relay/``, and the ``started/`` mark of a relayed-in turn.

``started/<id>.json`` (``{"id", "at"}``) is written before a relayed-in turn
runs, so a gateway that adopts the envelope after a crash knows the turn may
have run (:class:`TurnStartMarks`), and dropped once its reply is on disk. The
sender side's ``sent/`` records (:mod:`hermes_actors.store.relay_sent`) are
written and dropped the same way (:func:`write_mark`, :func:`drop_mark`).
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path
from typing import Any

from hermes_actors.core.ids import validate_delivery_id
from hermes_actors.errors import HostileFileError, StoreError
from hermes_actors.store.atomic import create_exclusive_json
from hermes_actors.store.private_dir import ensure_private_dir
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.store.relay_quarantine import quarantine

__all__ = ["TurnStartMarks", "clear_started", "drop_mark", "was_started", "write_mark"]


def write_mark(paths: InboxPaths, directory: Path, envelope_id: str, payload: dict[str, Any], *, fsync: bool) -> bool:
    """Write ``<directory>/<id>.json`` once (0600, through the relay's temp directory); the first write wins.

    Args:
        paths: the relay layout.
        directory: ``started/`` or ``sent/``.
        envelope_id: the envelope (validated before any path is built).
        payload: the mark's record.
        fsync: flush it to stable storage.

    Returns:
        True when this write made the mark; False when it was there already.

    Raises:
        ValidationError: the id is invalid.
        HostileFileError: a directory on the way is refused.
        StoreError: the write failed.
    """
    name = f"{validate_delivery_id(envelope_id, what='envelope id')}.json"
    return create_exclusive_json(directory / name, payload, tmp_dir=paths.relay.tmp, fsync=fsync,
                                 within=paths.relay.base)


def was_started(paths: InboxPaths, envelope_id: str) -> bool:
    """Whether a relayed-in turn for this envelope was about to run (it may have run)."""
    return os.path.lexists(paths.relay.id_file(paths.started, envelope_id))


def drop_mark(paths: InboxPaths, path: Path) -> None:
    """Remove a mark file; what cannot be removed (a directory in its place...) is moved aside, never raised.

    Args:
        paths: the relay layout (its quarantine).
        path: the mark file.
    """
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:  # a hostile tree: the relay's actors must keep running (the rescan repairs it)
        quarantine(paths.relay, path, f"could not remove it: {exc}")


def clear_started(paths: InboxPaths, envelope_id: str) -> None:
    """Drop the mark once the envelope's reply is on disk (never raises)."""
    drop_mark(paths, paths.relay.id_file(paths.started, envelope_id))


@functools.lru_cache(maxsize=64)
def _layout_of(root: str) -> InboxPaths:
    return InboxPaths.from_root(root)


class TurnStartMarks:
    """The journal-shaped recorder a ProfileActor hands to a relayed-in turn.

    ``execute_turn`` calls ``append_durably({"t": "started", "id": …})`` before the
    runner runs; here that writes ``started/<id>.json``, so a gateway that adopts
    the envelope after a crash knows the turn may have run. A ``started/`` that
    is gone is created again; one that is not our directory refuses the turn.

    The mark is in place before the turn runs whatever ``fsync`` says, which is
    what a kill -9 of the gateway needs (the kernel keeps the file); ``fsync``
    adds a flush to stable storage against a power loss, as the journal's
    ``started`` record has when the gateway runs with fsync.

    Args:
        root: the Hermes root.
        fsync: flush the mark to stable storage before the turn runs.
    """

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.paths = _layout_of(os.fspath(root))  # one per relayed-in turn: the layout is built once per root
        self.fsync = fsync

    def append_durably(self, record: dict[str, Any], timeout: float = 30.0) -> None:
        """Record a turn's start.

        Args:
            record: ``{"t": "started", "id": <envelope id>, ...}``; other kinds are ignored.
            timeout: unused (the write is synchronous).

        Raises:
            StoreError: the mark could not be written, or was refused (a hostile
                directory): the turn must then not run.
        """
        if record.get("t") != "started":
            return
        envelope_id = str(record.get("id"))
        try:
            # removed under us: without it the turn would run unmarked
            ensure_private_dir(self.paths.started, within=self.paths.relay.root)
            write_mark(self.paths, self.paths.started, envelope_id, {"id": envelope_id, "at": int(time.time())},
                        fsync=self.fsync)
        except HostileFileError as exc:  # a started/ or temp directory swapped for a symlink: the turn must not run
            raise StoreError(f"the start mark of {envelope_id} was refused: {exc}") from exc
        except StoreError:
            raise
        except OSError as exc:  # started/ swapped for a file meanwhile...: the turn never runs unmarked
            raise StoreError(f"the start mark of {envelope_id} could not be written: {exc}") from exc
