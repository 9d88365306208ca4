"""Per-process shelves: where one process keeps the relay envelopes it holds, so a successor can adopt them.

A gateway takes envelopes from ``inbox/`` into ``taken/s-<token>/``; the hub claims
envelopes from an ``outbox/`` into ``hubclaims/s-<token>/``. Each shelf directory
holds a ``.lock`` file that its process keeps under an exclusive ``flock`` for its
whole life, so a shelf whose lock can be taken belongs to a dead process (killed
-9 included: the kernel drops the flock with the process;
:mod:`hermes_actors.store.owner_lock`) and its envelopes are
adopted by the next process that starts on the same root. A living process's
shelf is never touched.

A shelf is a directory named by :func:`is_shelf_name` (``s-`` + a uuid4's 32 lowercase hex, as every version
of ours names it); any other directory is no shelf: never adopted, searched or counted.

A shelf's lock file is created under another name and locked before it is
renamed to ``.lock``, and an adopter skips a shelf without ``.lock``, so no
process can adopt (and remove) a shelf being born. (The directory itself is not
renamed in: a directory moved into a watched tree makes watchdog re-register it.)
Flat ``<id>.json`` files directly in the parent (written by versions without
shelves) are adopted too, flagged ``legacy`` because nothing says whether their
turn started.

Whoever holds a dead shelf's lock is its one adopter (:func:`take_dead`): the envelopes on it,
and the relay's ``sent/`` records naming it as their writer
(:func:`~hermes_actors.store.relay_sent.adopt_sent`), are taken over under that lock only. A
shelf that is gone (its process stopped cleanly, or an adopter emptied it) is made again, locked
from birth, for as long as the records still naming it are taken over: its creation decides
between two adopters. A running gateway does this at each rescan for the shelves that died or
went away since the last one (:attr:`Adopted.alive` says which still live). A gateway that stops
cleanly keeps its shelf (empty, its lock released) while a ``sent/`` record still names it: one
born and removed between two rescans would otherwise never be seen by a running gateway.
"""

from __future__ import annotations

import os
import re
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from hermes_actors.core.ids import id_of_file_name
from hermes_actors.errors import HostileFileError, StoreError
from hermes_actors.store.owner_lock import hold, release, take_unowned
from hermes_actors.store.private_dir import ensure_private_dir
from hermes_actors.store.relay_dirfd import lexists_below, open_dir_below, relay_dir, remove_below

__all__ = ["Adopted", "Shelf", "count_on_shelves", "find_on_shelves", "holding_places", "is_shelf_name",
           "release_dead", "shelf_held", "take_dead"]

LOCK_NAME = ".lock"
SHELF_PREFIX = "s-"
_SHELF_NAME = re.compile(r"s-[0-9a-f]{32}")  # what :class:`Shelf` names its directory: ``s-`` + a uuid4's hex


def is_shelf_name(name: str) -> bool:
    """Pure: whether ``name`` is a shelf directory's name as :class:`Shelf` makes it (nothing else is looked up)."""
    return _SHELF_NAME.fullmatch(name) is not None


def take_dead(parent: Path, name: str, *, remake: bool = False) -> int | None:
    """Lock the shelf ``parent/name`` when its process is dead: the one who holds it adopts what it left.

    The lock is only tried, never waited for. A living process holds it for its whole life, and an adopter for
    as long as it adopts: a second adopter gets None, and finds the work taken over once it gets the lock later.

    Args:
        parent: the directory holding every process's shelf (``bot_relay/taken``).
        name: the shelf's name (:func:`is_shelf_name`).
        remake: a shelf that is gone is made again, locked from birth (:func:`release_dead` removes it): a
            stopped process's records still name it. Two adopters cannot both make it.

    Returns:
        The descriptor holding its lock (:func:`release_dead` lets go); None when a living process or another
        adopter holds it, it is being born or removed, or it is gone (without ``remake``, or made by another).

    Raises:
        HostileFileError: its lock file is not one a gateway made (a symlink, another uid's): nothing is locked.
    """
    shelf = parent / name
    try:
        mode = os.lstat(shelf).st_mode
    except FileNotFoundError:
        return _make_locked_or_none(shelf) if remake else None
    except OSError:
        return None
    if not stat.S_ISDIR(mode):
        return None
    try:
        return take_unowned(shelf / LOCK_NAME)
    except HostileFileError:
        raise
    except OSError:  # FileNotFoundError included: being born, or removed by its adopter just now
        return None


def shelf_held(parent: Path, name: str) -> bool:
    """Whether a living process holds the shelf ``parent/name`` (its ``.lock`` is there and locked); never raises.

    Its lock is only tried (and let go at once when it was free). A shelf that is gone, whose lock is free,
    or that cannot be told (its lock file hostile, an OS error) is not held.

    Args:
        parent: the directory holding every process's shelf (``bot_relay/taken``).
        name: the shelf's name (:func:`is_shelf_name`).
    """
    lock = parent / name / LOCK_NAME
    try:
        fd = take_unowned(lock)
    except (OSError, StoreError):  # HostileFileError included: nobody we know holds it
        return False
    if fd is not None:
        release(fd)
        return False
    return os.path.lexists(lock)  # None: held by a living process, or removed just now (its work is done)


def release_dead(shelf: Path, fd: int, *, within: Path | None = None) -> None:
    """Remove an adopted shelf once nothing but its ``.lock`` is left in it, then let go of its lock; never raises.

    Args:
        shelf: the shelf :func:`take_dead` locked.
        fd: the descriptor holding its lock.
        within: the Hermes root the shelf is under: it is listed and removed through the checked walk from it
            (:func:`_remove_if_bare`).
    """
    try:
        _remove_if_bare(shelf, within)
    except (OSError, HostileFileError) as exc:
        logger.warning("could not remove the adopted shelf {}: {}", shelf, exc)
    finally:
        release(fd)


def _remove_if_bare(shelf: Path, within: Path | None) -> list[str]:
    """Remove the shelf when only its ``.lock`` is in it (the lock first); the other entries when there are any.

    Listed and removed through the checked walk from ``within`` (:func:`remove_below`; without it, from the
    shelf's parent as named): a ``taken/`` swapped for a symlink is refused, nothing outside the root is removed.

    Args:
        shelf: the shelf directory.
        within: the Hermes root it is under (None: its parent is trusted as named).

    Returns:
        The entries other than ``.lock`` (the shelf is removed only when there are none).

    Raises:
        HostileFileError: a directory on the way is a symlink, not a directory, or not ours: nothing is removed.
        OSError: it could not be listed or removed.
    """
    anchor = within or shelf.parent
    fd = open_dir_below(anchor, shelf)
    try:
        others = [name for name in os.listdir(fd) if name != LOCK_NAME]
    finally:
        os.close(fd)
    if not others:
        remove_below(anchor, shelf / LOCK_NAME)
        remove_below(anchor, shelf, directory=True)
    return others


def _make_locked(shelf: Path) -> int:
    """Make the shelf directory ``shelf`` with its ``.lock``, locked from birth; the descriptor holding it.

    The lock file is made under another name and locked before it is renamed to ``.lock``: adopters open only
    ``.lock``, so none can take a shelf being born.

    Raises:
        FileExistsError: ``shelf`` exists already.
        OSError: it could not be made or locked.
    """
    os.mkdir(shelf, 0o700)
    fresh = shelf / f"{LOCK_NAME}.new"
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        hold(fd)
        os.rename(fresh, shelf / LOCK_NAME)
    except OSError:
        os.close(fd)
        raise
    return fd


def _move_regular(source: int, target: int, name: str) -> bool:
    """Rename the regular file ``name`` from the directory ``source`` to ``target`` (descriptors); whether it moved.

    Anything but a regular file is left where it is (the reader's quarantine deals with it), and so is a file
    that cannot be moved (gone meanwhile, say).
    """
    try:
        if not stat.S_ISREG(os.lstat(name, dir_fd=source).st_mode):
            return False
        os.rename(name, name, src_dir_fd=source, dst_dir_fd=target)
    except OSError:
        return False
    return True


def _make_locked_or_none(shelf: Path) -> int | None:
    """:func:`_make_locked`, or None when another adopter made it first or it cannot be made (logged)."""
    try:
        return _make_locked(shelf)
    except FileExistsError:
        return None
    except OSError as exc:
        logger.warning("could not make the shelf {} again to adopt what still names it: {}", shelf, exc)
        return None


@dataclass(frozen=True)
class Adopted:
    """Envelope ids moved onto our shelf by one :meth:`Shelf.adopt`: at a start, or at a running gateway's rescan."""

    ids: tuple[str, ...] = ()
    legacy: tuple[str, ...] = ()  # from flat files of an older version: their turn state is unknown
    shelves: int = 0  # dead shelves emptied
    dead: tuple[str, ...] = ()  # the names of those dead shelves
    # the names of the other shelves not adopted: their process still runs (its lock held), or they were refused
    alive: tuple[str, ...] = ()


class Shelf:
    """One process's shelf under ``parent`` (``bot_relay/taken`` or ``bot_relay/hubclaims``).

    Args:
        parent: the directory holding every process's shelf.
        within: the Hermes root ``parent`` must stay under: ``bot_relay/`` or ``parent``
            swapped for a symlink is then refused, nothing is created through it.
    """

    def __init__(self, parent: Path, *, within: Path | None = None) -> None:
        self.parent = parent
        self.within = within
        self.path = parent / f"{SHELF_PREFIX}{uuid.uuid4().hex}"
        self._fd: int | None = None

    def open(self) -> Path:
        """Create and lock our shelf.

        Returns:
            The shelf directory.

        Raises:
            HostileFileError: ``parent`` (or, with ``within``, a directory above it) is a symlink or not ours.
            StoreError: the shelf could not be created or locked.
        """
        ensure_private_dir(self.parent, within=self.within)
        try:
            self._fd = _make_locked(self.path)
        except OSError as exc:
            raise StoreError(exc.errno, f"cannot create the shelf {self.path}: {exc.strerror}") from exc
        return self.path

    def adopt(self, *, legacy: bool = True) -> Adopted:
        """Move the envelopes of dead processes' shelves (and legacy flat files) onto ours.

        Only a directory named by :func:`is_shelf_name` is a shelf: another ``s-*`` entry is left alone.

        Args:
            legacy: adopt the flat files of older versions too (at a start only: a running older
                gateway's are its own).

        Returns:
            What was adopted, and which other shelves still live. A shelf whose process still runs is left alone.
        """
        ids: list[str] = []
        flat: list[str] = []
        dead: list[str] = []
        alive: list[str] = []
        try:
            names = sorted(os.listdir(self.parent))
        except OSError as exc:
            logger.warning("cannot list {}: {}", self.parent, exc)
            return Adopted()
        for name in names:
            entry = self.parent / name
            if is_shelf_name(name) and entry != self.path:
                moved = self._adopt_shelf(entry)
                if moved is None:
                    alive.append(name)
                else:
                    ids += moved
                    dead.append(name)
        if legacy and any(id_of_file_name(name) is not None for name in names):
            try:
                flat = self._move_all(self.parent)
            except (OSError, HostileFileError) as exc:
                logger.warning("could not adopt the flat envelopes in {}: {}", self.parent, exc)
        return Adopted(tuple(ids), tuple(flat), len(dead), tuple(dead), tuple(alive))

    def _adopt_shelf(self, shelf: Path) -> list[str] | None:
        """Move a dead shelf's envelopes onto ours, under its lock (:func:`take_dead`).

        Returns:
            The ids moved; None when it was not adopted: its process lives (or another start adopts it right
            now), or it could not be (refused, or an error: logged; it is tried again at the next adoption).
        """
        try:
            fd = take_dead(self.parent, shelf.name)
        except HostileFileError as exc:
            logger.warning("the shelf {} has no regular lock file of ours ({}); left in place", shelf, exc)
            return None
        if fd is None:
            return None  # its process lives, or another start adopted it meanwhile
        try:
            moved = self._move_all(shelf)
            for leftover in _remove_if_bare(shelf, self.within):
                logger.warning("dead shelf {} holds a stray entry {!r}; left in place", shelf, leftover)
            return moved
        except (OSError, HostileFileError) as exc:
            logger.warning("could not adopt the shelf {}: {}", shelf, exc)
            return None
        finally:
            release(fd)

    def _move_all(self, shelf: Path) -> list[str]:
        """Move the envelopes (regular ``<id>.json`` files) of the dead ``shelf`` (or, flat, of ``parent``) onto
        ours; the ids moved.

        Both directories are opened by the checked walk from ``within`` (:func:`open_dir_below`; without it, from
        their parent as named), then listed and renamed relative to those descriptors: a shelf swapped for a
        symlink after its lock was taken is refused, and nothing outside the root is moved onto ours.

        Raises:
            HostileFileError: a directory on the way is a symlink, not a directory, or not ours: nothing was moved.
            OSError: a shelf could not be opened or listed.
        """
        anchor = self.within or self.parent
        source = open_dir_below(anchor, shelf)
        try:
            target = open_dir_below(anchor, self.path)
            try:
                return [name[:-5] for name in sorted(os.listdir(source))
                        if id_of_file_name(name) is not None and _move_regular(source, target, name)]
            finally:
                os.close(target)
        finally:
            os.close(source)

    def close(self, *, keep: bool = False) -> None:
        """Release the lock; remove the shelf when it is empty (otherwise the next start adopts it).

        Args:
            keep: leave it in place even when empty (a gateway's ``sent/`` records still name it): a shelf
                born and removed between two rescans of a running gateway was never seen by it, so the DMs
                those records name waited for nobody; kept, its lock free, the next adoption finds it dead
                (:meth:`adopt`), takes those records over, and removes it.
        """
        if self._fd is None:
            return
        try:
            if not keep:
                _remove_if_bare(self.path, self.within)
        except (OSError, HostileFileError) as exc:
            logger.warning("could not remove the shelf {}: {}", self.path, exc)
        finally:
            os.close(self._fd)
            self._fd = None


def find_on_shelves(parent: Path, file_name: str, *, base: Path | None = None) -> bool:
    """Whether ``file_name`` is on any shelf under ``parent`` (:func:`is_shelf_name`), or flat in it.

    Args:
        parent: ``bot_relay/taken`` or ``bot_relay/hubclaims``.
        file_name: ``<id>.json``.
        base: the ``bot_relay`` directory holding ``parent``: every directory is then opened from it without
            following a symlink (a shelf swapped for one is skipped: nothing there is ours).

    Returns:
        True when some process holds that envelope.

    Raises:
        HostileFileError: with ``base``, ``bot_relay/`` or ``parent`` is a symlink or not ours.
    """
    if base is None:
        if os.path.lexists(parent / file_name):
            return True
        try:
            shelves = [n for n in os.listdir(parent) if is_shelf_name(n)]
        except OSError:
            return False
        return any(os.path.lexists(parent / shelf / file_name) for shelf in shelves)
    places = holding_places(parent, base=base)
    if places and lexists_below(base, places[0] / file_name):
        return True
    for shelf in places[1:]:
        try:
            if lexists_below(base, shelf / file_name):
                return True
        except HostileFileError:
            continue
    return False


def holding_places(parent: Path, *, base: Path) -> list[Path]:
    """Where a process may hold an envelope under ``parent``: ``parent`` itself (flat, as older versions left
    them), then each shelf, by name (:func:`is_shelf_name`; none is looked into: a shelf may still be refused
    when it is opened).

    Args:
        parent: ``bot_relay/taken`` or ``bot_relay/hubclaims``.
        base: the ``bot_relay`` directory holding ``parent`` (opened from it without following a symlink).

    Returns:
        Those directories; none when ``parent`` does not exist.

    Raises:
        HostileFileError: ``bot_relay/`` or ``parent`` is a symlink or not ours.
        OSError: ``parent`` could not be listed.
    """
    try:
        with relay_dir(base, parent) as fd:
            names = sorted(os.listdir(fd))
    except FileNotFoundError:
        return []
    return [parent, *(parent / name for name in names if is_shelf_name(name))]


def count_on_shelves(parent: Path) -> int:
    """How many envelopes are held under ``parent``: on every process's shelf (:func:`is_shelf_name`), and flat in it.

    Args:
        parent: ``bot_relay/taken`` or ``bot_relay/hubclaims``.

    Returns:
        The count (0 when ``parent`` cannot be listed); a shelf that is not a directory is not followed.
    """
    try:
        names = os.listdir(parent)
    except OSError:
        return 0
    held = 0
    for name in names:
        if id_of_file_name(name) is not None:
            held += 1
            continue
        shelf = parent / name
        try:
            if not is_shelf_name(name) or not stat.S_ISDIR(os.lstat(shelf).st_mode):
                continue
            held += sum(1 for entry in os.listdir(shelf) if id_of_file_name(entry) is not None)
        except OSError:
            continue
    return held
