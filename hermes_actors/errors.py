"""Exceptions of the hermes_actors public API."""

from __future__ import annotations

from os import PathLike

__all__ = [
    "HostileFileError", "RoomStopped", "StoreError", "TransportError", "TurnFailed", "UnfinishedFileError",
    "ValidationError",
]


class TurnFailed(Exception):
    """Raised by a runner to fail a turn with a typed reason.

    Args:
        text: the human-readable failure text the sender will read.
        reason: a reason code from the vocabulary (``hermes_actors.core.reasons``).
            When empty, the text is classified.
        ambiguous: the message may have reached its target before the failure (a
            connection lost after the request was sent): the outcome is ``ambiguous``
            ("do not resend") and the turn is never retried automatically.
    """

    def __init__(self, text: str, reason: str = "", *, ambiguous: bool = False) -> None:
        super().__init__(text)
        self.text = str(text)
        self.reason = str(reason or "")
        self.ambiguous = bool(ambiguous)


class ValidationError(ValueError):
    """Input (an id, a name, a record) is not of the accepted shape."""


class StoreError(OSError):
    """A durable write could not be completed (disk full, permissions, ...).

    ``path`` is the file or directory it was for (absolute), when known.
    """

    path: PathLike[str] | None = None


class HostileFileError(ValidationError):
    """A file on disk is refused: symlink, wrong owner, too big, corrupt."""


class UnfinishedFileError(HostileFileError):
    """A file that is empty or not valid JSON yet, changed so lately that its writer may still be writing it.

    Raised only by a read that asks for it (``read_json_file(..., unfinished_at=now)``): the caller
    leaves the file where it is and reads it again later (at its close-write event or the next
    rescan); past :data:`~hermes_actors.store.safe_read.WRITE_GRACE_SECONDS` the same file is
    refused as a :class:`HostileFileError`. A caller that does not handle it refuses it as before.
    """


class TransportError(RuntimeError):
    """A transport between gateways cannot be used as configured; the text says what to fix.

    Raised by :meth:`hermes_actors.Gateway.start` (nothing is left running) for, e.g.,
    a Redis password the server refuses, a connection id another live process
    already serves, or the ``[redis]`` extra not installed.
    """


class RoomStopped(RuntimeError):
    """A wait for a room to settle was cut short: the room's actor stopped (its gateway stopped, or it failed
    and restarts). The room's rounds go on from its file, so the message that started them is not lost.

    Raised by :meth:`hermes_actors.Gateway.wait_room_idle` (and by the host's rooms, through its endpoint).
    """
