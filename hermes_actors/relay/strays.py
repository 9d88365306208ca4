"""The rescan's clean-up: relay directories swapped for symlinks or files, and stray files, moved aside;
relay directories of ours that others may write in, set back to 0700."""

from __future__ import annotations

import os
from pathlib import Path

from loguru import logger

from hermes_actors.core.ids import id_of_file_name
from hermes_actors.errors import HostileFileError, StoreError, ValidationError
from hermes_actors.store.os_errors import resource_failure
from hermes_actors.store.private_dir import ensure_private_dir, loose_private_dir
from hermes_actors.store.relay_dirfd import open_dir_below, relay_dir, swapped_below
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.store.relay_quarantine import quarantine, quarantine_directory
from hermes_actors.store.relay_shelf import holding_places

__all__ = ["ensure_relay_directories", "kept_directories", "move_swapped_aside", "owned_directories",
           "private_directories", "put_back_swapped", "puts_back", "quarantine_misnamed", "quarantine_strays",
           "refused_at_start", "restore_private_modes", "shelf_parents", "start_directories", "start_refusal"]

# How a start finds a directory of bot_relay/ (_found): what refused_at_start judges
MISSING, OURS, SWAPPED, FOREIGN = "missing", "ours", "swapped", "foreign"


def kept_directories(paths: InboxPaths) -> tuple[Path, ...]:
    """Pure: the relay directories the rescan puts back when they are swapped for a symlink or a file, or removed.

    Every directory of :meth:`InboxPaths.directories` but two (those their users make are put back by a start
    only: :func:`start_directories`): not ``bot_relay/`` itself (a swapped one is refused by every use,
    and a root's relay directory is the user's to put back), and not ``hubclaims/``: the hub process owns it
    (a shelf put back under a running hub would have no lock, and its claims there would never be adopted);
    a swapped one refuses the hub's claims until it is fixed. ``quarantine/`` is first: the others move into it.

    Args:
        paths: the relay layout.

    Returns:
        The directories, ``quarantine/`` first.
    """
    relay = paths.relay
    return (relay.quarantine, paths.inbox, relay.replies, relay.outbox, relay.claimed, relay.locks, paths.delivered,
            paths.taken_parent, paths.started, paths.sent, paths.consumed, paths.heartbeat, paths.expiring, relay.tmp)


def start_directories(paths: InboxPaths) -> tuple[Path, ...]:
    """Pure: the directories of ``bot_relay/`` a start puts back too when they are swapped for a symlink or a file.

    Each is made by its user when it first needs it (the host's submit endpoint, the rooms' start, the Redis
    transport's first unconfirmed send): one that is missing is left to it, one swapped is moved into
    ``quarantine/`` as it is (never followed: what a symlink points at is never read, written or moved) and
    made again at once. Not by the rescan (:func:`kept_directories`): a user already running keeps its lock or
    its open file (``run/submit.lock``, ``rooms/.owner.lock``) in the directory swapped away; the host puts its
    own ``run/`` back at its rescan period, taking its lock in the new one
    (:class:`~hermes_actors.hermes.submit.SubmitServer`).

    Not ``journal/``: a journal moved to another disk and linked back holds acked DMs; moved aside, they would
    never run. A swapped one refuses a durable start (:func:`refused_at_start`; the text says how to put the
    journal files back in a real directory) and is left alone by a start in memory, which does not use it.

    Args:
        paths: the relay layout.

    Returns:
        ``run/``, ``rooms/``, ``unconfirmed/``.
    """
    return (paths.run, paths.rooms, paths.unconfirmed)


def refused_at_start(found: str, put_back: bool) -> bool:
    """Pure: whether a start refuses a directory of ``bot_relay/`` (or ``bot_relay/`` itself) as it finds it.

    Args:
        found: :data:`MISSING` (the start makes it), :data:`OURS`, :data:`SWAPPED` (a symlink or anything but a
            directory, or one below a ``bot_relay/`` that is) or :data:`FOREIGN` (another user's directory).
        put_back: the start puts this directory back when it is swapped (:func:`kept_directories`,
            :func:`start_directories`; never ``bot_relay/`` itself nor ``hubclaims/``).

    Returns:
        True for another user's directory (never ours to move), and for a swapped one the start does not put back.
    """
    return found == FOREIGN or (found == SWAPPED and not put_back)


def private_directories(paths: InboxPaths) -> tuple[Path, ...]:
    """Pure: the directories of ours with a fixed name that are kept 0700 (docs/protocol.md): ``bot_relay/``,
    :func:`kept_directories` (the temp directory beside ``bot_relay/`` included), :func:`start_directories`
    (``run/``, ``rooms/``, ``unconfirmed/``), ``journal/``, ``rooms/.started/``, ``hubclaims/`` and
    ``hubclaims/expiring/``. The shelves below :func:`shelf_parents`, named per process, are found on disk
    (:func:`owned_directories`).

    One rule for all, whichever process of ours uses one (a gateway holding the rooms owner lock, another's
    journal, the hub's ``hubclaims/``): each is ours (the same uid), and setting its mode back moves nothing.

    Args:
        paths: the relay layout.

    Returns:
        The directories, ``bot_relay/`` first.
    """
    return (paths.relay.base, *kept_directories(paths), *start_directories(paths), paths.journal, paths.room_starts,
            paths.hubclaims, paths.expiring_shelves)


def shelf_parents(paths: InboxPaths) -> tuple[Path, ...]:
    """Pure: the directories that hold the per-process shelves (``s-<token>/``).

    Args:
        paths: the relay layout.

    Returns:
        ``taken/``, ``hubclaims/``, ``hubclaims/expiring/``.
    """
    return (paths.taken_parent, paths.hubclaims, paths.expiring_shelves)


def owned_directories(paths: InboxPaths) -> list[Path]:
    """Every directory of ours kept 0700: :func:`private_directories`, then each shelf found now. Never raises.

    Args:
        paths: the relay layout.

    Returns:
        The directories (a shelf parent that is missing, swapped or unreadable adds none: every use refuses it).
    """
    found = list(private_directories(paths))
    for parent in shelf_parents(paths):
        try:
            found += holding_places(parent, base=paths.relay.base)[1:]
        except (OSError, ValueError):  # HostileFileError included (a ValidationError, so a ValueError)
            continue
    return found


def restore_private_modes(paths: InboxPaths) -> list[Path]:
    """Set back to 0700 each relay directory of ours that its group or other users may write in, with one
    WARNING naming it. Never raises.

    Every directory of :func:`owned_directories`. Not refused: a seed gateway makes ``bot_relay/``, ``outbox/``,
    ``claimed/``, ``replies/`` and ``locks/``
    with a plain ``mkdir`` (its umask decides: 0775 under umask 002), and the relay works on as before.
    A directory missing, swapped or another user's is left to the put-back and to the checks of every use.

    Args:
        paths: the relay layout.

    Returns:
        The directories set back to 0700.
    """
    restored: list[Path] = []
    for directory in owned_directories(paths):
        try:
            mode = loose_private_dir(directory, within=paths.relay.root, restore=True)
        except OSError as exc:
            logger.warning("relay: {} is writable by other users and could not be set back to 0700: {}; run "
                           "`chmod 700 {}`", directory, exc, directory)
            continue
        if mode is not None:
            restored.append(directory)
            logger.warning("relay: {} was writable by other users (mode {:04o}), who could plant, replace or remove "
                           "relay files in it; set back to 0700", directory, mode)
    return restored


def _swapped(paths: InboxPaths, directory: Path) -> bool:
    """Whether ``directory`` is there but is not a real directory (a symlink, a file...).

    Looked at from its parent, opened by the walk from the root (:func:`swapped_below`): neither the
    entry nor ``bot_relay/`` above it is ever followed.

    Returns:
        False too when its parent is missing (the put-back makes both).

    Raises:
        HostileFileError: ``bot_relay/`` is a symlink, not a directory, or another user's.
        OSError: ``bot_relay/`` cannot be opened (a permission).
    """
    try:
        return swapped_below(paths.relay.root, directory)
    except FileNotFoundError:
        return False


def puts_back(paths: InboxPaths, directory: Path) -> bool:
    """Whether :func:`quarantine_strays` puts ``directory``, as it is now, back: what a refusal may promise.

    Only a directory of :func:`kept_directories` swapped for a symlink or a file, in a usable ``bot_relay/``.
    Not another user's directory (a real directory: nothing is moved), nor anything below a ``bot_relay/``
    that is itself a symlink, a file or another user's: those are the user's to fix.

    Args:
        paths: the relay layout.
        directory: a relay directory found unusable.

    Returns:
        True when the next clean-up puts a real directory in its place.
    """
    if directory not in kept_directories(paths):
        return False
    try:
        return _swapped(paths, directory)
    except (OSError, HostileFileError):
        return False


def _find_swapped(paths: InboxPaths, directories: tuple[Path, ...], failing: set[Path]) -> list[Path] | None:
    """The swapped ones of ``directories``; None when ``bot_relay/`` itself cannot be used (logged once).

    ``bot_relay/`` itself swapped for a symlink or a file, another user's or unreadable is never moved
    (it is the user's, see :func:`kept_directories`): nothing below it is looked at, moved or made, and
    the refusal is logged when it starts and when it ends (``paths.relay.base`` in ``failing``), not at
    every pass. A missing one is not refused: the put-back makes it.

    Raises:
        OSError: an error that says nothing about the path (out of file descriptors, say:
            :func:`~hermes_actors.store.os_errors.resource_failure`): no sign that anything was swapped, so
            nothing is said of ``bot_relay/``; the caller's pass fails and says what ran out, once while it lasts.
    """
    base = paths.relay.base
    try:
        swapped = [d for d in directories if _swapped(paths, d)]
    except (OSError, HostileFileError) as exc:
        if resource_failure(exc):
            raise
        if base not in failing:
            failing.add(base)
            logger.error("relay: {} cannot be used: {}. Nothing of the relay works on this root until it is a "
                         "real directory of this user again: move the file or symlink aside and put the relay "
                         "directory back (or remove it: a new one is made); it is never followed or moved",
                         base, exc)
        return None
    if base in failing:
        failing.discard(base)
        logger.info("relay: {} is a usable directory again", base)
    return swapped


def move_swapped_aside(paths: InboxPaths, directory: Path) -> None:
    """Quarantine a swapped relay directory (the entry itself: a symlink is never followed). Never raises.

    The rescan's rule, and the host's for its ``run/`` (:class:`~hermes_actors.hermes.submit.SubmitServer`):
    the caller then makes a real directory in its place. A swapped ``quarantine/`` cannot be moved into
    itself: it is renamed aside in ``bot_relay/`` first, a real ``quarantine/`` is made, and then it moves
    in like any other (:func:`quarantine_directory`).

    Args:
        paths: the relay layout.
        directory: the swapped entry (a directory of ``bot_relay/``).
    """
    why = "a relay directory was replaced by a symlink or a file"
    if directory != paths.relay.quarantine:
        quarantine(paths.relay, directory, why)
        return
    quarantine_directory(directory, paths.relay.quarantine, why, within=paths.relay.root)


def put_back_swapped(paths: InboxPaths, directory: Path) -> bool:
    """Put back one relay directory swapped for a symlink or a file, by the rescan's rule, now.

    For a user that meets it before the rescan does (a turn taking its lock in ``locks/``): the entry is
    moved into ``quarantine/`` as it is (:func:`move_swapped_aside`, never followed) and the directory made
    again (0700). Only what :func:`puts_back` promises: not another user's directory, nor anything below a
    ``bot_relay/`` that is itself swapped.

    Args:
        paths: the relay layout.
        directory: the relay directory found swapped.

    Returns:
        Whether a real directory of ours is there now (False: nothing was moved, or it could not be made: logged).
    """
    if not puts_back(paths, directory):
        return False
    move_swapped_aside(paths, directory)
    try:
        ensure_private_dir(directory, within=paths.relay.root)
    except (StoreError, ValidationError) as exc:  # swapped again meanwhile, a full disk
        logger.warning("relay: could not recreate the relay directory {}: {}", directory, exc)
        return False
    return True


def _put_back(paths: InboxPaths, directories: tuple[Path, ...], unfixable: set[Path]) -> None:
    """Make every directory that is missing, each on its own: one that cannot be made stops none of the others.

    Args:
        paths: the relay layout.
        directories: the directories to make.
        unfixable: the directories that could not be made at an earlier pass (updated here): a failure
            is logged when it starts and when it ends, not at every pass.
    """
    for directory in directories:
        try:
            ensure_private_dir(directory, within=paths.relay.root)
        except (StoreError, ValidationError) as exc:  # HostileFileError included (bot_relay/ itself swapped)
            if directory not in unfixable:
                unfixable.add(directory)
                logger.error("relay: could not recreate the relay directory {}: {}. Every use of it fails until "
                             "it is a directory of ours again (the rescan keeps trying)", directory, exc)
            continue
        if directory in unfixable:
            unfixable.discard(directory)
            logger.info("relay: the relay directory {} is back", directory)


def _strays_in(paths: InboxPaths, directory: Path) -> list[Path]:
    """The entries of ``directory`` that are not ``<32 hex>.json`` regular files (hidden names left alone).

    Listed through a descriptor opened without following a symlink: a directory swapped meanwhile is not
    listed (the next pass puts it back).
    """
    try:
        with relay_dir(paths.relay.base, directory) as fd:
            entries = list(os.scandir(fd))
    except (OSError, HostileFileError):
        return []
    return [directory / entry.name for entry in entries
            if not entry.name.startswith(".") and (entry.is_symlink() or id_of_file_name(entry.name) is None)]


def quarantine_misnamed(paths: InboxPaths, directory: Path) -> int:
    """Move aside the entries of ``directory`` that are not ``<32 hex>.json`` regular files (hidden names left alone).

    Each reader of a relay directory of envelopes or replies does it to what it reads (the gateway to ``inbox/``
    and ``replies/``, the hub to each root's ``outbox/``): every listing skips such a name, so it would stay
    there unseen, with no log line. Hidden names are the seed's temp files (``.env-….tmp``) and are left alone.

    Args:
        paths: the relay layout (its quarantine).
        directory: the relay directory.

    Returns:
        How many entries were quarantined (each logged by the quarantine).
    """
    moved = 0
    for stray in _strays_in(paths, directory):
        moved += 1
        quarantine(paths.relay, stray, "not a <32 hex>.json regular file")
    return moved


def quarantine_strays(paths: InboxPaths, *, unfixable: set[Path] | None = None, also: tuple[Path, ...] = ()) -> int:
    """Quarantine relay directories (the temp directory too) replaced by symlinks or files, and stray files.

    Directories quarantined or removed are created again, each on its own (one that cannot be
    made, e.g. under a ``bot_relay/`` that is itself a symlink, stops none of the others), and a
    directory of ours that others may write in is set back to 0700 (:func:`restore_private_modes`).

    Every use of a relay directory already refuses a symlink (renames, reads and listings go through
    ``O_NOFOLLOW`` directory descriptors opened from ``bot_relay/`` down, writes too); this puts a real
    directory back. In ``inbox/`` and ``replies/``, files that are not ``<32 hex>.json``
    or are symlinks are moved aside too.

    ``bot_relay/`` itself swapped for a symlink or a file, another user's or unreadable is refused: nothing
    is done, and it is logged once while it lasts (it is then in ``unfixable``: the caller may skip what
    else it does in ``bot_relay/``). It never raises for what it finds in the tree; out of file descriptors (an
    error that says nothing about the tree) it raises, before anything is moved or made.

    Args:
        paths: the relay layout.
        unfixable: the caller's memory of the directories that could not be made again, ``bot_relay/``
            itself included (kept across its passes, so a lasting failure is logged once); None: every
            failure is logged.
        also: directories put back only when they are swapped, a missing one left missing (a start's
            :func:`start_directories`).

    Returns:
        How many entries were quarantined.

    Raises:
        OSError: out of file descriptors, say (:func:`~hermes_actors.store.os_errors.resource_failure`).
    """
    moved = 0
    directories = kept_directories(paths)
    failing = set() if unfixable is None else unfixable
    swapped = _find_swapped(paths, directories + also, failing)
    if swapped is None:
        return 0
    for directory in swapped:
        moved += 1
        move_swapped_aside(paths, directory)
    # also put back what was removed; and look again at what failed before, to say when it is back
    if swapped or failing or not all(os.path.isdir(d) for d in directories):
        _put_back(paths, directories + tuple(d for d in also if d in swapped or d in failing), failing)
    restore_private_modes(paths)
    for directory in (paths.inbox, paths.relay.replies):
        moved += quarantine_misnamed(paths, directory)
    return moved


def _found(paths: InboxPaths, directory: Path) -> tuple[str, HostileFileError | None]:
    """How ``directory`` (``bot_relay/`` or inside it) is now, walked from the root without following a symlink.

    Returns:
        :data:`MISSING` (it, or ``bot_relay/`` above it), :data:`OURS`, :data:`SWAPPED` or :data:`FOREIGN`
        (:data:`OURS` too when it cannot be looked at, a permission: the start's own use of it says why),
        and the refusal of the walk, naming what it found (None when it took the directory).
    """
    try:
        os.close(open_dir_below(paths.relay.root, directory))
    except FileNotFoundError:
        return MISSING, None
    except HostileFileError as exc:
        try:
            return (SWAPPED if _swapped(paths, directory) else FOREIGN), exc
        except (OSError, HostileFileError):
            return SWAPPED, exc  # below a bot_relay/ that is itself swapped (looked at first: refused there)
    except OSError:
        return OURS, None
    return OURS, None


def _cannot_start(paths: InboxPaths, directory: Path, exc: HostileFileError, *, untouched: bool) -> HostileFileError:
    """The start's refusal of a directory it cannot put back: names it (``exc``) and says what to do."""
    tail = "; nothing was changed" if untouched else ""
    if directory == paths.journal:  # it may hold acked DMs: never moved aside, the user puts it right
        return HostileFileError(
            f"{exc}. The gateway cannot start on {paths.relay.root} in durable mode: make the delivery journal a "
            f"real directory of this user again (another user's: chown it; moved elsewhere and linked back: replace "
            f"the link with a real directory holding its j-*.log files, e.g. rm {directory} && mv <where it points> "
            f"{directory}; a stray file: move it aside). It is never followed nor moved aside, since it may hold "
            f"acked DMs; the next start re-offers the DMs journaled in it{tail}")
    return HostileFileError(
        f"{exc}. The relay cannot start on {paths.relay.root}: make it a real directory of this user again (move the "
        "symlink or file aside, or chown the directory); a relay directory inside bot_relay/ swapped for a symlink "
        f"or a file is put back by the start itself (but hubclaims/, the hub's, and journal/){tail}")


def start_refusal(paths: InboxPaths, needs: tuple[Path, ...] = ()) -> HostileFileError | None:
    """Why a start would refuse the root as it is now, looking only (nothing is moved or made).

    The start's own rule (:func:`ensure_relay_directories` refuses with this very error) and ``doctor``'s, so the
    two never disagree about a root.

    Args:
        paths: the relay layout.
        needs: the directories the caller uses besides the relay's (the journal's in durable mode).

    Returns:
        None when a start may go on, else the refusal: ``bot_relay/`` itself a symlink, a file or another user's,
        another user's directory, a swapped ``hubclaims/`` or ``journal/`` (in ``needs``); its text names the
        directory and says what to do.
    """
    put_back = {*kept_directories(paths), *start_directories(paths)}
    for directory in dict.fromkeys((*paths.directories(), *needs)):  # bot_relay/ first
        found, exc = _found(paths, directory)
        if exc is not None and refused_at_start(found, directory in put_back):
            refusal = _cannot_start(paths, directory, exc, untouched=True)
            refusal.__cause__ = exc
            return refusal
    return None


def _refuse_unusable(paths: InboxPaths, needs: tuple[Path, ...]) -> None:
    """Refuse the start, before anything is moved or made, for a directory it needs and cannot put back.

    Raises:
        HostileFileError: :func:`start_refusal`'s refusal.
    """
    refusal = start_refusal(paths, needs)
    if refusal is not None:
        raise refusal


def ensure_relay_directories(paths: InboxPaths, *, unfixable: set[Path] | None = None,
                             needs: tuple[Path, ...] = ()) -> int:
    """At the start: put back the relay directories swapped for a symlink or a file, then make every directory.

    By the rescan's rule (:func:`quarantine_strays`: the symlink is moved into ``quarantine/``, never followed,
    what it points at untouched), so a ``delivered/`` left swapped by a gateway killed meanwhile does not
    refuse the start that must write the reply kept in its start mark; and so are the directories their
    users make (:func:`start_directories`: ``run/``, ``rooms/``, ``unconfirmed/``), each with the same
    WARNING. What it cannot put back (a swapped ``journal/`` in ``needs`` too) refuses it first, with
    nothing moved or made.

    Args:
        paths: the relay layout.
        unfixable: the rescans' memory of what could not be put back (a failure logged here is not again);
            None: a fresh one.
        needs: the directories the caller uses besides the relay's (the journal's in durable mode): another
            user's one refuses the start here, before anything is made.

    Returns:
        How many entries were quarantined.

    Raises:
        HostileFileError: a directory the start cannot put back (``bot_relay/`` itself a symlink or a file,
            another user's directory, a swapped ``hubclaims/``, a swapped ``journal/`` in ``needs``); the text
            names it and says what to do.
        StoreError: a directory could not be made.
    """
    _refuse_unusable(paths, needs)
    moved = quarantine_strays(paths, unfixable=unfixable, also=start_directories(paths))
    try:
        paths.ensure()
    except HostileFileError as exc:  # swapped again meanwhile, or it could not be moved aside (logged)
        raise _cannot_start(paths, paths.relay.base, exc, untouched=False) from exc
    return moved
