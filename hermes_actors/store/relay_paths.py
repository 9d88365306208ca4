"""The layout of ``<root>/bot_relay/``: every path of the seed's relay directory (:class:`RelayPaths`).

Layout (every file 0600, every directory 0700, byte-compatible with the seed)::

    bot_relay/roster.json        {"updated_at": int, "agents": [row...]}
    bot_relay/outbox/<id>.json   queued envelopes (the Desktop drains them)
    bot_relay/claimed/<id>.json  envelopes a drain won (rename decides)
    bot_relay/replies/<id>.json  {id, at, reply, error, reason}; first wins
    bot_relay/quarantine/        refused (hostile) files, moved aside
    bot_relay/locks/             per-profile turn locks
    .bot_relay_tmp/              temp files of atomic writes, beside bot_relay/

The temp directory is ours, not the seed's (the seed writes its temps beside
the target): it sits beside ``bot_relay/`` so that the half-written temps and
their renames never wake the processes watching ``bot_relay/`` (the gateway's
and the hub's recursive watches), and on the same filesystem (checked by
:meth:`RelayPaths.ensure`) so the rename stays atomic.

Our extension's directories beside these are :class:`hermes_actors.store.relay_inbox.InboxPaths`;
the file I/O on them is :mod:`hermes_actors.store.relay_files`.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

from hermes_actors.core.ids import validate_delivery_id
from hermes_actors.errors import StoreError
from hermes_actors.store.private_dir import ensure_private_dir
from hermes_actors.store.relay_protocol import CLAIMED, LOCKS, OUTBOX, QUARANTINE, RELAY_DIR, REPLIES, ROSTER_FILE, TMP

__all__ = ["RelayPaths"]


@dataclass(frozen=True)
class RelayPaths:
    """Every path of one ``bot_relay`` directory."""

    base: Path
    outbox: Path
    claimed: Path
    replies: Path
    locks: Path
    tmp: Path
    quarantine: Path
    roster: Path

    @classmethod
    def from_root(cls, root: Path | str) -> RelayPaths:
        """The relay paths under a Hermes root.

        Args:
            root: the Hermes root (the default profile's home).

        Returns:
            The paths (nothing is created).
        """
        base = Path(root) / RELAY_DIR
        return cls(
            base=base,
            outbox=base / OUTBOX,
            claimed=base / CLAIMED,
            replies=base / REPLIES,
            locks=base / LOCKS,
            tmp=Path(root) / TMP,
            quarantine=base / QUARANTINE,
            roster=base / ROSTER_FILE,
        )

    @property
    def root(self) -> Path:
        """The Hermes root holding ``bot_relay/``: the trusted anchor of every directory ensured here."""
        return self.base.parent

    def directories(self) -> tuple[Path, ...]:
        """The directories of the layout, base first.

        Returns:
            base, outbox, claimed, replies, locks, tmp, quarantine.
        """
        return (self.base, self.outbox, self.claimed, self.replies, self.locks, self.tmp, self.quarantine)

    def ensure(self) -> RelayPaths:
        """Create every directory (0700), refusing hostile ones.

        Returns:
            self.

        Raises:
            HostileFileError: a directory is a symlink, a file, or not ours.
            StoreError: a directory could not be created, or the temp directory
                is on another filesystem than ``bot_relay/`` (a rename from it
                would not be atomic).
        """
        for directory in self.directories():
            ensure_private_dir(directory, within=self.root)
        if os.lstat(self.tmp).st_dev != os.lstat(self.base).st_dev:
            raise StoreError(errno.EXDEV, f"the relay temp directory {self.tmp} is on another filesystem than "
                                          f"{self.base}: atomic renames between them are impossible")
        return self

    def id_file(self, directory: Path, envelope_id: str) -> Path:
        """``<directory>/<id>.json`` for a validated id.

        Args:
            directory: one of the relay directories.
            envelope_id: the envelope id.

        Returns:
            The file path.

        Raises:
            ValidationError: the id is not 32 lowercase hex chars.
        """
        return directory / f"{validate_delivery_id(envelope_id, what='envelope id')}.json"
