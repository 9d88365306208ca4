"""The rescan's clean-up: relay directories swapped for symlinks or files, and stray files, moved aside."""

from __future__ import annotations

import os
from pathlib import Path

from loguru import logger

from hermes_actors.core.ids import id_of_file_name
from hermes_actors.errors import StoreError, ValidationError
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.store.relay_quarantine import quarantine

__all__ = ["quarantine_strays"]


def quarantine_strays(paths: InboxPaths) -> int:
    """Quarantine relay directories (the temp directory too) replaced by symlinks or files, and stray files.

    Directories quarantined or removed are created again.

    Every use of a relay directory already refuses a symlink (renames go through
    ``O_NOFOLLOW`` directory descriptors opened from ``bot_relay/`` down, writes too); this puts a real
    directory back. In ``inbox/`` and ``replies/``, files that are not ``<32 hex>.json``
    or are symlinks are moved aside too.

    Args:
        paths: the relay layout.

    Returns:
        How many entries were quarantined.
    """
    moved = 0
    # Not hubclaims/: the hub process owns it (a shelf put back under a running hub would have no lock, and
    # its claims there would never be adopted); a swapped one refuses the hub's claims until it is fixed.
    directories = (paths.inbox, paths.relay.replies, paths.relay.outbox, paths.relay.claimed, paths.delivered,
                   paths.taken_parent, paths.started, paths.sent, paths.consumed, paths.heartbeat, paths.expiring,
                   paths.relay.tmp)
    swapped = [d for d in directories if os.path.islink(d) or (os.path.lexists(d) and not os.path.isdir(d))]
    for directory in swapped:
        moved += 1
        quarantine(paths.relay, directory, "a relay directory was replaced by a symlink or a file")
    if swapped or not all(os.path.isdir(d) for d in directories):  # also put back what was removed
        try:
            paths.ensure()
        except (StoreError, ValidationError) as exc:
            logger.error("relay: could not recreate the relay directories: {}", exc)
    for directory in (paths.inbox, paths.relay.replies):
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_symlink() or id_of_file_name(entry.name) is None:
                moved += 1
                quarantine(paths.relay, Path(entry.path), "not a <32 hex>.json regular file")
    return moved
