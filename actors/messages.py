"""Every message type the toolkit itself sends, in one place."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykka
from pykka._envelope import Envelope

__all__ = ["ChildFailed", "ChildRestarted", "FileAppeared", "FileRemoved", "Rescan"]


@dataclass(frozen=True, slots=True)
class ChildFailed:
    """Told by a crashing child to its supervisor, with its unhandled mailbox."""

    name: str
    generation: int
    error: BaseException | None
    pending: tuple[Envelope[Any], ...]
    salvage: Any = None


@dataclass(frozen=True, slots=True)
class ChildRestarted:
    """A supervised child got a new ref."""

    name: str
    ref: pykka.ActorRef[Any]


@dataclass(frozen=True, slots=True)
class FileAppeared:
    """A file was created in, or moved into, a watched directory (a hint, not the truth)."""

    path: Path

    @property
    def directory(self) -> Path:
        return self.path.parent


@dataclass(frozen=True, slots=True)
class FileRemoved:
    """A file was deleted from, or moved out of, a watched directory."""

    path: Path


@dataclass(frozen=True, slots=True)
class Rescan:
    """Reconcile with the directory listing: the listing is the truth, events are hints.

    ``reason`` is "start", "periodic", "observer-restarted" or "manual".
    """

    reason: str = "periodic"
