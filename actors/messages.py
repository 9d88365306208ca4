"""Every message type the toolkit itself sends, in one place."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pykka

__all__ = ["ChildFailed", "FileAppeared", "FileRemoved", "Relayed", "Request", "Rescan"]


class Request:
    """An asked message (our own envelope, so no pykka internals are needed).

    ``actors.ask`` sends it with pykka's public ``ref.ask``; the TypedActor answers
    through pykka's reply. When the asked actor crashes before handling it, the
    request is handed to the restarted instance with ``relay`` set: the asker then
    waits on ``relay`` instead (see :class:`actors.asking.Reply`).
    """

    __slots__ = ("message", "relay")

    def __init__(self, message: Any, relay: pykka.ThreadingFuture[Any] | None = None) -> None:
        self.message = message
        self.relay = relay

    def fail(self, error: Exception) -> None:
        """Answer a relayed request with ``error`` (no-op for one that was never relayed)."""
        if self.relay is not None:
            self.relay.set_exception(exc_info=(type(error), error, None))

    def __repr__(self) -> str:
        return f"Request({self.message!r})"


@dataclass(frozen=True, slots=True)
class Relayed:
    """The first answer to an ask the actor could not handle itself: wait on ``future`` instead."""

    future: pykka.ThreadingFuture[Any]


@dataclass(frozen=True, slots=True)
class ChildFailed:
    """Told by a crashed child to its supervisor, with its unhandled mailbox.

    ``pending`` holds the told messages and :class:`Request` objects that were
    queued behind the crash, in arrival order.
    """

    name: str
    generation: int
    error: BaseException | None
    pending: tuple[Any, ...]
    salvage: Any = None


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
