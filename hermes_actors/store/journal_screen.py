"""What a durable start does with each ``j-*.log`` entry of the journal directory: adopt, refuse or set aside.

A gateway only ever makes regular files of its own there (created locked under a hidden name, then
renamed in: :mod:`~hermes_actors.store.journal_file`). Anything else was put there by hand or by damage,
and what is done with it depends on whether it may hold acked DMs:

- a regular file of this user: adopted (:mod:`~hermes_actors.store.journal_adoption`);
- a symlink (a journal file moved elsewhere and linked back: what it points at holds the records), a
  regular file of another user, or one of ours this user may not read (mode 000): it may hold acked DMs
  that nothing else knows of, and it cannot be read safely (a symlink is never followed; another user's
  file is never read) or at all. The durable start is refused
  (:class:`~hermes_actors.errors.HostileFileError`, exit 2 under ``serve``), naming each such file and
  what to do, as a swapped ``journal/`` directory refuses it
  (:func:`hermes_actors.relay.strays.ensure_relay_directories`). Before, the start went on with one
  WARNING, and every DM journaled in the file was dropped: never run, no outcome, and ``wait_outcome``
  said it was never acked on the root;
- anything that cannot hold records (a FIFO, a directory, a socket, a device): moved into
  ``bot_relay/quarantine/`` as it is, never opened (a FIFO must not block the start), with one WARNING
  (:func:`~hermes_actors.store.relay_quarantine.quarantine_into`, which moves only the entry that was
  judged: one put at its name since is put back and judged afresh); the start goes on.

One rule (:func:`journal_verdict`), used by the start (:func:`screen_journal_files`, and
:func:`refuse_unreadable_journals` before anything of the relay is moved or made), by the adoption
(a file swapped in since the screen), by the look-ups of ``wait_outcome`` and ``hermes-actors outcome``
(:func:`~hermes_actors.ops.journal_index.open_journal` names a file it refuses as :func:`described` does)
and by ``doctor``'s ``journal`` check (:func:`journal_files_found`).
"""

from __future__ import annotations

import fnmatch
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from hermes_actors.core.shell import shell_command
from hermes_actors.errors import HostileFileError
from hermes_actors.store.journal_records import MAX_JOURNAL_BYTES
from hermes_actors.store.relay_dirfd import open_dir_below
from hermes_actors.store.relay_protocol import JOURNAL, QUARANTINE, RELAY_DIR

__all__ = [
    "ADOPT", "REFUSE", "SET_ASIDE", "JournalEntry", "described", "entry_at", "entry_kind", "fix_for", "journal_entries",
    "journal_files_found", "journal_verdict", "refusal", "refuse_unreadable_journals", "refused_open",
    "screen_journal_files",
]

# What a durable start does with a journal entry (:func:`journal_verdict`)
ADOPT, REFUSE, SET_ASIDE = "adopt", "refuse", "set aside"

_NAMES = "j-*.log"  # a journal file's name (as the adoption lists them)
_QUARANTINED = "j-*.log.*.quarantined"  # one moved into quarantine/ (relay_quarantine.quarantine_name)
_SCREENS = 3  # how many entries found one after another at one name the screen judges before leaving it to the adoption
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_KINDS = ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _readable(mode: int, me: int) -> bool:
    """Pure: whether the owner of a file of ``mode`` may read it, being ``me`` (root reads whatever the mode)."""
    return me == 0 or bool(mode & stat.S_IRUSR)


def _oversize(size: int) -> bool:
    """Pure: whether a journal file of ``size`` bytes is larger than any a gateway writes (MAX_JOURNAL_BYTES)."""
    return size > MAX_JOURNAL_BYTES


def journal_verdict(mode: int, uid: int, me: int, size: int = 0) -> str:
    """Pure: what a durable start does with a ``j-*.log`` entry of the journal directory, as ``lstat`` finds it.

    Args:
        mode: its ``st_mode`` (not followed: a symlink is a symlink).
        uid: its owner.
        me: this process's uid.
        size: its ``st_size``.

    Returns:
        :data:`ADOPT` (a regular file of ours that we may read), :data:`REFUSE` (a symlink, a regular file of
        another user, one of ours whose mode does not let us read it, or one larger than any journal a gateway
        writes (:data:`~hermes_actors.store.journal_records.MAX_JOURNAL_BYTES`: damage, or a file put there; read,
        it would cost minutes and gigabytes): it may hold acked DMs and cannot be read safely, or at all) or
        :data:`SET_ASIDE` (anything that cannot hold records: moved into quarantine, never opened).
    """
    if stat.S_ISLNK(mode):
        return REFUSE
    if stat.S_ISREG(mode):
        return ADOPT if uid == me and _readable(mode, me) and not _oversize(size) else REFUSE
    return SET_ASIDE


def entry_kind(mode: int, uid: int, me: int, size: int = 0) -> str:
    """Pure: what a journal entry is, in words (``a symlink``, ``a FIFO``, ``a file of another user (uid 65534)``,
    ``a journal file of this user that it may not read (mode 0000)``, ``a journal file of this user of 1.0 GiB,
    larger than any journal a gateway writes (at most 512 MiB)``).

    Args:
        mode: its ``st_mode`` (not followed).
        uid: its owner.
        me: this process's uid.
        size: its ``st_size``.

    Returns:
        The words, starting with an article.
    """
    for test, kind in _KINDS:
        if test(mode):
            return kind
    if stat.S_ISREG(mode) and uid != me:
        return f"a file of another user (uid {uid})"
    if stat.S_ISREG(mode):
        if not _readable(mode, me):
            return f"a journal file of this user that it may not read (mode {stat.S_IMODE(mode):04o})"
        if _oversize(size):
            return (f"a journal file of this user of {size / (1 << 30):.1f} GiB, larger than any journal a gateway "
                    f"writes (at most {MAX_JOURNAL_BYTES >> 20} MiB)")
        return "a journal file of this user"
    return "not a regular file"


@dataclass(frozen=True)
class JournalEntry:
    """One ``j-*.log`` entry of the journal directory (or one moved into quarantine) as ``lstat`` found it.

    Attributes:
        path: where it is.
        kind: :func:`entry_kind`.
        verdict: :func:`journal_verdict`.
        target: a symlink's target as it reads (never followed), else None.
        ours: a regular file of this user (refused: it may not be read; :func:`fix_for` says ``chmod``).
        oversize: a regular file of this user larger than any journal a gateway writes (refused unread:
            :func:`fix_for` says how to cut it back, or give it up).
        identity: its device, inode and file type as it was judged (None: not known); the screen moves only that
            entry into quarantine (the type tells apart a new file given the inode of a FIFO removed meanwhile).
    """

    path: Path
    kind: str
    verdict: str
    target: str | None = None
    ours: bool = False
    identity: tuple[int, int, int] | None = None
    oversize: bool = False


def _entry(path: Path, info: os.stat_result, target: str | None, me: int) -> JournalEntry:
    """Pure: the entry ``lstat`` found at ``path`` (``info``), judged by :func:`journal_verdict`."""
    mode, uid, size = info.st_mode, info.st_uid, info.st_size
    ours = stat.S_ISREG(mode) and uid == me
    return JournalEntry(path, entry_kind(mode, uid, me, size), journal_verdict(mode, uid, me, size), target, ours,
                        (info.st_dev, info.st_ino, stat.S_IFMT(mode)),
                        ours and _readable(mode, me) and _oversize(size))


def refused_open(path: Path, exc: OSError) -> JournalEntry:
    """Pure: a journal file of this user judged adoptable whose open was refused (``EACCES``: an ACL, a root
    without ``CAP_DAC_OVERRIDE``): it is refused as one its mode does not let us read.

    Args:
        path: the file.
        exc: the error of its open.

    Returns:
        The entry (:data:`REFUSE`).
    """
    return JournalEntry(path, f"a journal file of this user that it may not open ({exc.strerror or exc})", REFUSE,
                        ours=True)


def described(entry: JournalEntry) -> str:
    """Pure: ``journal file X is …`` and what that means for its records, for a log line, a refusal or a look-up.

    Args:
        entry: the entry.

    Returns:
        The phrase (no trailing period).
    """
    if entry.target is not None:
        return f"journal file {entry.path} is a symlink (to {entry.target}), never followed"
    if entry.verdict == REFUSE:
        return f"journal file {entry.path} is {entry.kind}, never read"
    if entry.verdict == SET_ASIDE:
        return f"journal file {entry.path} is {entry.kind}, which holds no journal records"
    return f"journal file {entry.path} is {entry.kind}"


def fix_for(entry: JournalEntry, me: int) -> str:
    """Pure: what to do with a refused entry (:data:`REFUSE`) so the durable start takes its DMs, or gives them up.

    Args:
        entry: a refused entry.
        me: this process's uid (the owner the file must have).

    Returns:
        The fix, as commands to run as printed.
    """
    give_up = "or move it out of journal/ to give its DMs up (they never run)"
    if entry.oversize:
        return ("look at it: a journal is one JSON record a line, and zeros or junk after its last record (a file "
                "extended by damage or by hand) can be cut off (truncate -s <its size up to that line> "
                f"{shell_command(entry.path)}), {give_up}")
    if entry.ours:
        return f"let this user read and write it ({shell_command('chmod', '600', entry.path)}), {give_up}"
    if entry.target is not None:  # relative to the link's directory, as the link reads it
        real = os.path.join(entry.path.parent, entry.target)
        return (f"replace the link with the real file ({shell_command('rm', entry.path)} && "
                f"{shell_command('mv', real, entry.path)}), {give_up}")
    return f"chown it to this user (as root: {shell_command('chown', me, entry.path)}), {give_up}"


def refusal(refused: list[JournalEntry], where: Path, me: int, *, unchanged: bool) -> str:
    """Pure: the text of a durable start refused for journal files that may hold acked DMs and cannot be read safely.

    Args:
        refused: the refused entries (at least one).
        where: the Hermes root (or the journal directory, for a journal used without one).
        me: this process's uid.
        unchanged: the start has changed nothing yet (said: ``nothing was changed``); False once it may have made
            directories or moved entries into quarantine (a file found by the screen or the adoption).

    Returns:
        The text: each file, what it is and what to do; then why nothing else is done.
    """
    found = "; ".join(f"{described(entry)}: {fix_for(entry, me)}" for entry in refused)
    return (f"{found}. The gateway cannot start on {where} in durable mode while a journal file that may hold acked "
            "DMs cannot be read safely; it is never followed, read nor moved aside; once it is put right, the next "
            "start re-offers the DMs journaled in it" + ("; nothing was changed" if unchanged else ""))


def entry_at(path: Path) -> JournalEntry | None:
    """How ``path`` is now, looked at with ``lstat`` (never followed, never opened); None when it is gone.

    Args:
        path: a ``j-*.log`` path.

    Returns:
        The entry.

    Raises:
        OSError: it could not be looked at (a permission on its directory).
    """
    try:
        info = os.lstat(path)
        target = os.readlink(path) if stat.S_ISLNK(info.st_mode) else None
    except FileNotFoundError:
        return None
    return _entry(path, info, target, os.getuid())


def _open_directory(directory: Path, within: Path | None) -> int:
    """The journal directory's descriptor, opened without following a symlink (from ``within`` down, when given).

    Raises:
        HostileFileError: with ``within``, a step below it is a symlink, not a directory, or another user's.
        OSError: it is missing (FileNotFoundError), a symlink (without ``within``), or cannot be opened.
    """
    if within is not None:
        return open_dir_below(within, directory)
    return os.open(directory, _DIR_FLAGS)


def _listed(directory: Path, pattern: str, *, within: Path | None) -> list[JournalEntry]:
    """The entries of ``directory`` whose names match ``pattern``, in name order, each looked at with ``lstat``
    through the directory's descriptor: never followed, never opened.

    Raises:
        HostileFileError, OSError: as :func:`_open_directory`.
    """
    me = os.getuid()
    fd = _open_directory(directory, within)
    try:
        entries: list[JournalEntry] = []
        for name in sorted(n for n in os.listdir(fd) if fnmatch.fnmatchcase(n, pattern)):
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                target = os.readlink(name, dir_fd=fd) if stat.S_ISLNK(info.st_mode) else None
            except FileNotFoundError:  # gone since the listing (adopted by another gateway)
                continue
            entries.append(_entry(directory / name, info, target, me))
        return entries
    finally:
        os.close(fd)


def journal_entries(directory: Path, *, within: Path | None) -> list[JournalEntry]:
    """The ``j-*.log`` entries of the journal directory, in name order (never followed, never opened).

    Args:
        directory: ``<root>/bot_relay/journal``.
        within: the Hermes root the directory is walked from without following a symlink (None: only the
            directory itself is opened so).

    Returns:
        The entries.

    Raises:
        HostileFileError: with ``within``, the directory (or a step above it) is a symlink, not a directory, or
            another user's.
        OSError: it is missing (FileNotFoundError) or cannot be opened.
    """
    return _listed(directory, _NAMES, within=within)


def refuse_unreadable_journals(directory: Path, *, within: Path | None) -> None:
    """Refuse a durable start for journal files that may hold acked DMs and cannot be read safely; nothing changed.

    What :func:`screen_journal_files` refuses, checked before anything else of the start is moved or made
    (the relay's directories put back: :func:`hermes_actors.relay.strays.ensure_relay_directories`). A journal
    directory that cannot be listed is left to the checks of its use (a swapped one refuses the start there).

    Args:
        directory: ``<root>/bot_relay/journal``.
        within: the Hermes root.

    Raises:
        HostileFileError: a symlink, a regular file of another user, or one of ours we may not read; the text
            names each and what to do (:func:`refusal`), and says nothing was changed.
    """
    try:
        entries = journal_entries(directory, within=within)
    except (OSError, HostileFileError):
        return
    _refuse(entries, within or directory, unchanged=True)


def _refuse(entries: list[JournalEntry], where: Path, *, unchanged: bool) -> None:
    refused = [entry for entry in entries if entry.verdict == REFUSE]
    if refused:
        raise HostileFileError(refusal(refused, where, os.getuid(), unchanged=unchanged))


def screen_journal_files(directory: Path, *, within: Path | None) -> list[str]:
    """At a durable start, before our own file is made: refuse it, or move aside what cannot hold records.

    A symlink, a regular file of another user or one of ours we may not read refuses the start (nothing is
    moved); then each entry that cannot hold records (a FIFO, a directory, a socket) is moved into
    ``bot_relay/quarantine/`` as it is, never opened, with one WARNING naming it. Only the entry judged is moved
    (:func:`~hermes_actors.store.relay_quarantine.quarantine_into`): one put at its name since (the real journal
    file put back) is put back and judged afresh, as if found now.

    Args:
        directory: ``<root>/bot_relay/journal`` (it exists).
        within: the Hermes root (None: a journal used without one; the quarantine is then beside
            ``directory``'s parent all the same).

    Returns:
        One line per entry moved aside (or that could not be: it stays, and the adoption skips it),
        saying what it was and where it went: ``wait_outcome``'s ``KeyError`` names them.

    Raises:
        HostileFileError: a symlink, a regular file of another user or one of ours we may not read
            (:func:`refusal`), found by the screen or put in place of an entry it was moving aside.
        OSError: the directory could not be listed.
    """
    entries = journal_entries(directory, within=within)
    _refuse(entries, within or directory, unchanged=False)  # the start may have made the relay's directories
    notes: list[str] = []
    for entry in entries:
        if entry.verdict == SET_ASIDE:
            notes += _set_aside(entry, directory, within=within)
    return notes


def _set_aside(entry: JournalEntry, directory: Path, *, within: Path | None) -> list[str]:
    """Move ``entry`` (:data:`SET_ASIDE`) into quarantine; an entry put at its name since is judged afresh.

    Returns:
        The note of what was moved aside (or could not be), none when what is there now is adopted.

    Raises:
        HostileFileError: what is there now is refused.
    """
    from hermes_actors.store.relay_quarantine import quarantine_into

    for _ in range(_SCREENS):
        moved = quarantine_into(directory.parent / QUARANTINE, entry.path,
                                f"{entry.kind} in place of a journal file holds no journal records (never opened); "
                                "DMs journaled in a file it took the place of cannot be re-offered", within=within,
                                identity=entry.identity)
        now = None if moved else entry_at(entry.path)
        if now is None or entry.identity is None or now.identity == entry.identity:
            where = f"moved to {moved}" if moved else "it could not be moved aside"
            return [f"{entry.path} was {entry.kind} at this gateway's start, which holds no journal records "
                    f"({where}): DMs journaled in a file it took the place of cannot be re-offered"]
        if now.verdict == REFUSE:
            _refuse([now], within or directory, unchanged=False)
        if now.verdict == ADOPT:
            return []  # the real journal file put back: the adoption takes it
        entry = now
    return []  # still swapped: the adoption skips what is no journal file of ours, with a WARNING


def journal_files_found(root: Path) -> tuple[list[JournalEntry], list[JournalEntry]]:
    """``doctor``'s facts: the root's journal entries, and those a start moved into quarantine. Never raises.

    Args:
        root: the Hermes root.

    Returns:
        ``(entries, quarantined)``: every ``j-*.log`` entry of ``bot_relay/journal`` (none when the directory
        is missing or cannot be used: the relay directories' checks say why), and every entry of
        ``bot_relay/quarantine`` a start moved there from it: what took a journal file's place (a FIFO, a
        directory...) and a journal file itself (adopted with unreadable lines, or moved there in a race).
    """
    base = root / RELAY_DIR
    found: list[list[JournalEntry]] = []
    for directory, pattern in ((base / JOURNAL, _NAMES), (base / QUARANTINE, _QUARANTINED)):
        try:
            found.append(_listed(directory, pattern, within=root))
        except (OSError, HostileFileError):
            found.append([])
    entries, quarantined = found
    return entries, quarantined
