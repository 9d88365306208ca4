"""What a failed file operation tells its caller: a :class:`StoreError` naming the file and the OS error.

One rendering for every store write and directory (:mod:`hermes_actors.store.atomic`,
:mod:`hermes_actors.store.private_dir`), so a full disk or a refused permission reads the
same wherever it happens: ``cannot write <file>: No space left on device (ENOSPC); free space on
its filesystem``: the absolute file, the OS error, and what the operator does about it
(:func:`what_to_do`).

One rule for the line a command prints for an OS error (:func:`os_error_message`): a refused
access (EACCES, EPERM) or a file where a directory belongs (ENOTDIR) is looked at along its path,
and the directory or file that keeps the user out is named, with what is wrong with it and the
``chmod``, ``chown`` or move that fixes it (:func:`blocked_at`, from the facts :func:`path_facts`
gathers); any other error gets the advice of its errno.

One rule for an error that says nothing about the path it came with (:func:`resource_failure`): the process
or the system ran out of descriptors or memory (EMFILE, ENFILE, ENOMEM, ENOBUFS), or a signal cut the call
short (EINTR). Such an error is transient, never evidence that a file or directory was swapped, moved or
removed: whoever finds one keeps what it knew and tries again later. EIO is not one of them: it is the
device under the path failing, and is taken as any other error of the path.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hermes_actors.core.shell import shell_command
from hermes_actors.errors import StoreError

__all__ = [
    "PathFacts", "access_problem", "advised", "blocked_at", "os_error_message", "os_error_text", "path_facts",
    "resource_failure", "store_error", "what_to_do",
]

# What an operator does about the errors a full, read-only or foreign disk gives (by errno).
_WHAT_TO_DO = {
    errno.ENOSPC: "free space on its filesystem",
    errno.EDQUOT: "free space or raise the disk quota of the user running hermes-actors",
    errno.EROFS: "its filesystem is mounted read-only: remount it read-write",
    errno.EACCES: "fix the permissions: the user running hermes-actors must be able to write there",
    errno.EPERM: "fix the permissions: the user running hermes-actors must be able to write there",
    errno.EMFILE: "raise the process's open-files limit (ulimit -n, systemd's LimitNOFILE=) or find what holds "
                  "so many open (idle HTTP connections, say)",
    errno.ENFILE: "raise the system's open-files limit (fs.file-max) or find what holds so many open",
}

# The errors that say nothing about the path (module docstring), with what ran out.
_RESOURCE_FAILURES = {
    errno.EMFILE: "out of file descriptors",
    errno.ENFILE: "out of file descriptors",
    errno.ENOMEM: "out of memory",
    errno.ENOBUFS: "out of buffer space",
    errno.EINTR: "interrupted by a signal",
}


def resource_failure(exc: BaseException) -> str | None:
    """Pure: what ran out when ``exc`` says nothing about its path (a transient failure), else None.

    The one rule (module docstring): a caller that checks whether a file or directory is still there takes
    such an error as "cannot tell now", never as "it is gone" or "it was swapped".

    Args:
        exc: the error (an ``OSError``, a :class:`StoreError` mirroring one; anything else is None).

    Returns:
        ``"out of file descriptors"`` for EMFILE and ENFILE, ``"out of memory"`` for ENOMEM, ``"out of buffer
        space"`` for ENOBUFS, ``"interrupted by a signal"`` for EINTR; None for every other error (ENOENT,
        EACCES, ELOOP, EIO...).
    """
    return _RESOURCE_FAILURES.get(exc.errno or 0) if isinstance(exc, OSError) else None


def os_error_text(exc: OSError) -> str:
    """Render an OS error as ``"No space left on device (ENOSPC)"``.

    Args:
        exc: the error raised by the operating system.

    Returns:
        The human text with the symbolic errno when one is known.
    """
    code = exc.errno
    if code is None:
        return str(exc)
    name = errno.errorcode.get(code, str(code))
    return f"{exc.strerror or os.strerror(code)} ({name})"


def what_to_do(exc: BaseException) -> str | None:
    """Pure: what the operator does about a failed file operation, or None when there is nothing to say.

    Args:
        exc: the error (an ``OSError`` with an errno; anything else has no advice).

    Returns:
        e.g. ``"free space on its filesystem"`` for ENOSPC, the remount for EROFS, the
        permissions for EACCES and EPERM.
    """
    return _WHAT_TO_DO.get(exc.errno or 0) if isinstance(exc, OSError) else None


def advised(exc: BaseException) -> str:
    """Pure: a failed file operation's error with what to do about it, the file left out.

    Args:
        exc: the error.

    Returns:
        e.g. ``"Too many open files (EMFILE); raise the process's open-files limit ..."``
        (:func:`os_error_text`, then :func:`what_to_do` when there is advice); ``"<Type>: <text>"`` for
        anything but an ``OSError``.
    """
    detail = os_error_text(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"
    advice = what_to_do(exc)
    return f"{detail}; {advice}" if advice else detail


def store_error(action: str, target: Path, exc: BaseException) -> StoreError:
    """Build the :class:`StoreError` for a failed write of ``target``.

    Args:
        action: what was being done ("write", "create").
        target: the file that could not be written.
        exc: the underlying error.

    Returns:
        A StoreError whose text names the target (absolute) and the OS error, and what to do about
        it (:func:`what_to_do`), and whose ``errno`` mirrors the underlying one (None for non-OS failures).
    """
    err = StoreError(f"cannot {action} {Path(target).absolute()}: {advised(exc)}")
    err.errno = exc.errno if isinstance(exc, OSError) else None
    err.path = Path(target).absolute()
    return err


# ── what keeps the user out of a path (the one rule for a refused access) ──

_ACCESS = ("read", "write", "enter")
_BITS = {"read": "r", "write": "w", "enter": "x"}
_VERBS = {"directory": {"read": "list", "write": "write in", "enter": "enter"}}
_FILE_VERBS = {"read": "read", "write": "write", "enter": "run"}
_BLOCKING = frozenset({errno.EACCES, errno.EPERM, errno.ENOTDIR})


@dataclass(frozen=True)
class PathFacts:
    """One step of a path as the user running hermes-actors finds it.

    ``kind`` is ``directory``, ``file``, ``missing`` or another file type (``socket``, ``fifo``, ``device``);
    ``may`` holds what the user may do with it, of ``read``, ``write`` and ``enter`` (as the kernel decides it:
    root may do everything).
    """

    path: str
    kind: str
    owner: int = -1
    mode: int = 0
    may: frozenset[str] = frozenset(_ACCESS)


def _said(words: list[str], conjunction: str) -> str:
    """Pure: ``a``, ``a or b``, ``a, b or c`` (or with ``and``)."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} {conjunction} {words[-1]}"


def _inside(path: str, root: str | None) -> bool:
    """Pure: whether ``path`` is ``root`` or below it (no root known: taken as inside)."""
    return root is None or path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _blame(facts: PathFacts, lacks: list[str], *, uid: int, user: str, root: str | None) -> str:
    """Pure: the text naming ``facts.path``, what it does not let the user do, and the command that fixes it."""
    verbs = _VERBS.get(facts.kind, _FILE_VERBS)
    denied = f"its mode {facts.mode:04o} does not let you {_said([verbs[a] for a in lacks], 'or')} it"
    if facts.owner == uid:
        bits = "".join(_BITS[a] for a in _ACCESS if a in lacks)
        return f"{facts.path} is yours but {denied}: {shell_command('chmod', f'u+{bits}', facts.path)}"
    foreign = f"{facts.path} belongs to uid {facts.owner}, not to you (uid {uid}), and {denied}"
    if _inside(facts.path, root):  # the root's own files and directories are its owner's: yours
        recursive = ["-R"] if facts.kind == "directory" else []
        return f"{foreign}: make it yours again ({shell_command('chown', *recursive, user, facts.path)}, as root)"
    return (f"{foreign}: have its owner let you {_said([verbs[a] for a in lacks], 'and')} it, or run hermes-actors "
            "as the user hermes runs as")


def blocked_at(target: str, chain: Sequence[PathFacts], *, uid: int, user: str, root: str | None = None) -> str | None:
    """Pure: what keeps the user from using ``target``, named with what to do about it; the one rule.

    Every directory on the way must be one the user may enter; the target, a directory the user may list, write
    in and enter, or a file the user may read, in a directory the user may write in (a file is replaced by a
    rename), and then write; a missing target, a directory above it the user may write in (to make it).

    Args:
        target: the path that could not be used (absolute).
        chain: its steps from ``/`` down (:func:`path_facts`), as far as they could be looked at.
        uid: the user's uid.
        user: the user's name (or uid), for the ``chown`` command.
        root: the Hermes root the path is in, when known: what is inside it is the user's to ``chown``; a
            directory above it is someone else's to open.

    Returns:
        e.g. ``/r/bot_relay belongs to uid 0, not to you (uid 1001), and its mode 0700 does not let you enter it:
        make it yours again (chown -R me /r/bot_relay, as root)``; None when the facts show nothing wrong.
    """
    for i, facts in enumerate(chain):
        parent = chain[i - 1] if i else None
        if facts.kind == "missing":  # to make it, the directory above it must let the user write in it
            if parent is not None and "write" not in parent.may:
                return _blame(parent, ["write"], uid=uid, user=user, root=root)
            return None
        if facts.path != target:
            if facts.kind != "directory":
                return f"{facts.path} is a {facts.kind}, not a directory: move it aside, so that a directory can be " \
                       "made there"
            if "enter" not in facts.may:  # on the way: entering it is all it takes
                return _blame(facts, ["enter"], uid=uid, user=user, root=root)
            continue
        wanted = _ACCESS if facts.kind == "directory" else ("read", "write")
        lacks = [a for a in wanted if a not in facts.may]
        if facts.kind != "directory" and "read" not in lacks and parent is not None and "write" not in parent.may:
            return _blame(parent, ["write"], uid=uid, user=user, root=root)
        return _blame(facts, lacks, uid=uid, user=user, root=root) if lacks else None
    return None


def _kind(mode: int) -> str:
    """Pure: the file type of a ``st_mode``, as :class:`PathFacts` names it."""
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISREG(mode):
        return "file"
    return "socket" if stat.S_ISSOCK(mode) else "fifo" if stat.S_ISFIFO(mode) else "device"


def _may(path: str) -> frozenset[str]:
    """What the user may do with ``path`` (the effective ids, as an open would be judged)."""
    effective = os.access in os.supports_effective_ids
    checks = {"read": os.R_OK, "write": os.W_OK, "enter": os.X_OK}
    return frozenset(a for a, bit in checks.items() if os.access(path, bit, effective_ids=effective))


def path_facts(target: Path | str) -> list[PathFacts]:
    """Each step of ``target`` from ``/`` down, as far as it can be looked at (symlinks followed, as an open
    follows them): the walk stops at a missing step, after a file, or where a directory does not let it look.

    Args:
        target: an absolute path.

    Returns:
        The steps, for :func:`blocked_at`.
    """
    parts = Path(target).parts
    chain: list[PathFacts] = []
    for depth in range(1, len(parts) + 1):
        step = os.path.join(*parts[:depth])
        try:
            st = os.stat(step)
        except FileNotFoundError:
            chain.append(PathFacts(step, "missing"))
            break
        except OSError:  # the directory above does not let us look (it is in the chain already), or a loop
            break
        chain.append(PathFacts(step, _kind(st.st_mode), st.st_uid, stat.S_IMODE(st.st_mode), _may(step)))
        if not stat.S_ISDIR(st.st_mode):
            break
    return chain


def _user(uid: int) -> str:
    """The user's name, for a command line (the uid when it has none)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def access_problem(path: Path | str, *, root: Path | str | None = None) -> str | None:
    """What keeps the user running hermes-actors from using ``path``, with what to do (:func:`blocked_at`).

    Args:
        path: the file or directory that could not be used.
        root: the Hermes root it is in, when known.

    Returns:
        The text, or None when nothing on the way shows what is wrong.
    """
    target = os.path.realpath(os.path.expanduser(os.fspath(path)))
    real_root = None if root is None else os.path.realpath(os.path.expanduser(os.fspath(root)))
    uid = os.geteuid()
    return blocked_at(target, path_facts(target), uid=uid, user=_user(uid), root=real_root)


def _failed_path(exc: OSError) -> str | None:
    """The absolute path an OS error was for: its file name, or the path a :class:`StoreError` names."""
    name = exc.filename
    if isinstance(name, (str, bytes)) and os.path.isabs(os.fsdecode(name)):
        return os.fsdecode(name)
    stored = getattr(exc, "path", None)
    return None if stored is None else os.fspath(stored)


def os_error_message(exc: OSError, *, root: Path | str | None = None) -> str:
    """The one line a command prints for an OS error, with what to do about it.

    A refused access (EACCES, EPERM) or a file where a directory belongs (ENOTDIR) names the path, the
    error and what keeps the user out (:func:`access_problem`): ``/r/bot_relay/run: Permission denied
    (EACCES); /r/bot_relay belongs to uid 0, not to you (uid 1001), and its mode 0700 does not let you enter
    it: make it yours again (chown -R me /r/bot_relay, as root)``; a :class:`StoreError` (which names its file
    already) gets that in place of its errno's advice. Otherwise the error with its errno's advice
    (:func:`what_to_do`): ``[Errno 28] No space left on device: '<file>'; free space on its filesystem``.

    Args:
        exc: the error.
        root: the Hermes root the command works on, when it has one.

    Returns:
        The line, without the ``error:`` prefix.
    """
    advice = what_to_do(exc)
    path = _failed_path(exc) if exc.errno in _BLOCKING else None
    problem = None if path is None else access_problem(path, root=root)
    text = str(exc)
    if problem is None:
        return text if advice is None or advice in text else f"{text}; {advice}"
    if isinstance(exc, StoreError):
        return text.replace(advice, problem) if advice and text.endswith(f"; {advice}") else f"{text}; {problem}"
    return f"{path}: {os_error_text(exc)}; {problem}"
