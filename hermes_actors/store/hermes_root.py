"""Profile discovery for a Hermes root, and the friendly-name forms resolution uses.

The root is the default profile's home; every other profile lives at
``<root>/profiles/<name>``. A profile is known by its folder id, its handle
(``hermes`` for the default profile), its ``display_name`` and its Bot Mode
title, and by the Desktop @-slugs of those friendly names (resolution itself is
:func:`hermes_actors.core.targets.resolve_local`, over the roster snapshot).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from loguru import logger

from hermes_actors.core.names import (
    DEFAULT_PROFILE,
    HANDLE_RE,
    handle_for,
    misnamed_profiles_problem,
    one_line_name,
    unreachable_profiles,
)
from hermes_actors.messages import ProfileInfo
from hermes_actors.store.os_errors import access_problem, resource_failure
from hermes_actors.store.yaml_file import load_yaml_file

__all__ = [
    "MANAGED_KEY",
    "PROFILE_TRUSTED_FILES",
    "alias_forms",
    "discover_profiles",
    "existing_root",
    "foreign_root_refusal",
    "install_is_managed",
    "is_managed",
    "read_profile_yaml",
    "root_path",
    "scan_profile_dirs",
    "slugify",
    "untrusted_entry",
    "untrusted_profile",
]

MANAGED_KEY = "hermes-bots"
# Any one of these in a directory: a Hermes root. Beside a profile's home (``<root>/profiles/<name>``) its root
# always has profiles/, so that one says nothing there; a fresh hermes-agent root has only profiles/ and logs/.
_ROOT_FILES = ("config.yaml", "state.db", ".env", "profile.yaml")
_ROOT_MARKS = (*_ROOT_FILES, "profiles")
_OUTER_ROOT_MARKS = (*_ROOT_FILES, "logs")


def root_path(root: str | Path) -> Path:
    """Pure but for the working directory: ``root`` as an absolute path, ``~`` expanded.

    ``.`` and ``..`` are folded lexically and symlinks are kept (a root the user reaches
    through one stays named so): every path under the root is then a plain extension of
    it, which the descriptor walks below the root rely on.

    Args:
        root: the root as given (``--root .``, ``~/.hermes``).

    Returns:
        The absolute path.
    """
    return Path(os.path.abspath(os.path.expanduser(os.fspath(root))))


def existing_root(root: Path | str) -> Path:
    """``root`` (``~`` expanded), checked to be a directory before anything reads or writes under it.

    Args:
        root: a Hermes root.

    Returns:
        The expanded path.

    Raises:
        FileNotFoundError: it does not exist or is not a directory.
        PermissionError: it belongs to another user (:func:`foreign_root_refusal`), a directory above it does not
            let you reach it, or its mode does not let you list or enter it (the text names the directory, what
            keeps you out and what to do: :func:`~hermes_actors.store.os_errors.access_problem`); no errno.
        ValueError: it is a profile's home inside a root (``<root>/profiles/<name>``), not a root; or it
            holds none of the files a Hermes root has (a mistyped ``--root ~`` would get ``bot_relay/``).
    """
    path = root_path(root)
    try:
        st = path.stat()
    except PermissionError:  # a directory above it does not let you look
        raise PermissionError(_unusable_root(path, "cannot be reached")) from None
    except OSError:
        st = None
    if st is None or not stat.S_ISDIR(st.st_mode):
        raise FileNotFoundError(f"Hermes root {str(path)!r} does not exist or is not a directory")
    refusal = foreign_root_refusal(path, st.st_uid, os.getuid())
    if refusal is not None:
        raise PermissionError(refusal)
    if not os.access(path, os.R_OK | os.X_OK):  # yours, but its mode keeps you out
        raise PermissionError(_unusable_root(path, "cannot be used"))
    if not any((path / name).exists() for name in _ROOT_MARKS):
        raise ValueError(
            f"{str(path)!r} does not look like a Hermes root (none of {', '.join(_ROOT_MARKS)} in it); pass the "
            "HERMES_HOME of your install (default ~/.hermes), once `hermes profile create <name>` made its profiles"
        )
    outer = path.parent.parent
    if path.parent.name == "profiles" and not (path / "profiles").is_dir() and any(
            (outer / name).exists() for name in _OUTER_ROOT_MARKS):
        raise ValueError(
            f"{str(path)!r} is the home of profile {path.name!r} of the Hermes root {str(outer)!r}, not a root; "
            f"pass --root {outer}"
        )
    return path


def _unusable_root(path: Path, what: str) -> str:
    """The refusal of a root you cannot use: what keeps you out of it and what to do, by the one rule for a refused
    access (:func:`~hermes_actors.store.os_errors.access_problem`)."""
    problem = access_problem(path, root=path) or f"{os.strerror(errno.EACCES)}: fix the permissions on the way to it"
    return f"Hermes root {str(path)!r} {what}: {problem}"


def foreign_root_refusal(path: Path, owner: int, uid: int) -> str | None:
    """Pure: why a root owned by ``owner`` is not ours (``uid``) to use, or None when it is.

    A root belongs to the user hermes runs as. Another user could not read it (a bare
    ``Permission denied`` on ``config.yaml``); root could, but the ``bot_relay/`` files it wrote
    there would be root's, which the owner's own gateway then refuses as another uid's.

    Args:
        path: the root (for the message).
        owner: the uid that owns it.
        uid: ours.

    Returns:
        The refusal naming both uids and what to do, or None when ``owner`` is ``uid``.
    """
    if owner == uid:
        return None
    return (f"Hermes root {str(path)!r} belongs to uid {owner}, not to you (uid {uid}): run hermes-actors as the "
            "user who owns it (the one hermes runs as), e.g. sudo -u <that user> hermes-actors ...")


_SLUG_RUN_RE = re.compile(r"[^a-z0-9]+")


def read_profile_yaml(home: Path) -> dict[str, Any]:
    """Read ``<home>/profile.yaml``.

    Args:
        home: the profile's home directory.

    Returns:
        Its top-level mapping, ``{}`` when missing or unusable (see
        :func:`hermes_actors.store.yaml_file.load_yaml_file`).

    Raises:
        OSError: out of file descriptors, say (:func:`hermes_actors.store.yaml_file.read_yaml_mapping`).
    """
    return load_yaml_file(Path(home) / "profile.yaml")


def _bot_meta(meta: dict[str, Any]) -> dict[str, Any] | None:
    """The Bot Mode block ``ui_meta["hermes-bots"]`` of a profile.yaml mapping.

    Args:
        meta: the profile.yaml mapping.

    Returns:
        The block when it is a dict, else None.
    """
    ui_meta = meta.get("ui_meta")
    if not isinstance(ui_meta, dict):
        return None
    block = ui_meta.get(MANAGED_KEY)
    return block if isinstance(block, dict) else None


def is_managed(home: Path) -> bool:
    """Whether a profile is managed by Bot Mode.

    Args:
        home: the profile's home directory.

    Returns:
        True when its profile.yaml has a dict at ``ui_meta["hermes-bots"]``.
    """
    return _bot_meta(read_profile_yaml(home)) is not None


def _text(value: Any, fallback: str) -> str:
    """Str-coerce and strip a profile.yaml value.

    Args:
        value: the raw value (None when absent).
        fallback: used when the value is absent or blank.

    Returns:
        The stripped text, or ``fallback``.
    """
    if value is None:
        return fallback
    text = str(value).strip()
    return text or fallback


def _display_name(value: Any, profile: str) -> str:
    """A profile.yaml ``display_name`` as the profile is shown and named by: on one line (``one_line_name``).

    Args:
        value: the raw value (None when absent).
        profile: the folder id, used when the value is absent or nothing is left of it.

    Returns:
        The display name.
    """
    return _text(None if value is None else one_line_name(str(value)), profile)


def _profile_info(profile: str, home: Path) -> ProfileInfo:
    """Build the roster record of one profile from its profile.yaml.

    Args:
        profile: the folder id.
        home: the profile's home directory.

    Returns:
        The record.
    """
    meta = read_profile_yaml(home)
    block = _bot_meta(meta)
    return ProfileInfo(
        profile=profile,
        handle=handle_for(profile),
        home=home,
        display_name=_display_name(meta.get("display_name"), profile),
        title=_text(block.get("title") if block is not None else None, ""),
        description=_text(meta.get("description"), ""),
        managed=block is not None,
    )


def _profiles_base_problem(base: Path) -> str | None:
    """What makes ``<root>/profiles`` as a whole unusable, or None (a real directory, or none at all).

    Args:
        base: ``<root>/profiles``.

    Returns:
        The problem, naming the path and what to do; None when it is a directory or absent (a root
        with only the default profile).
    """
    try:
        st = base.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        if resource_failure(exc):
            raise
        return f"cannot look at {base} ({exc}): only the default profile is used"
    if stat.S_ISLNK(st.st_mode):
        return (f"{base} is a symlink: profiles are read only from a real folder inside the root, so only the "
                f"default profile is used; put the real folder at {base}")
    if not stat.S_ISDIR(st.st_mode):
        return f"{base} is not a directory: only the default profile is used; move it aside and make {base} a folder"
    return None


# The files of a profile hermes reads as this user's at each of its turns, so trusted as its folder is: its
# roster entry (profile.yaml), its model, base_url and plugins (config.yaml), and its keys and variables (.env: the
# hermes CLI runs a turn with the profile as HERMES_HOME, and loads that folder's .env).
PROFILE_TRUSTED_FILES = ("profile.yaml", "config.yaml", ".env")


def untrusted_entry(what: str, st: os.stat_result, uid: int) -> str | None:
    """Pure: why a profile's folder or one of its files (:data:`PROFILE_TRUSTED_FILES`) is not this user's to run a
    bot with, or None when it is: the one rule of :func:`untrusted_profile`.

    It refuses another owner and the other-write bit, not the group-write bit, unlike
    :func:`~hermes_actors.store.safe_read.writable_by_others` (the rule of the relay's own files, which this
    package makes 0600/0700 itself): a profile is made by the user, with hermes or by hand, and a user's private
    group (umask 002, docs/operations.md) sets group-write on every folder and file they make; refusing it would
    take every such user's bots off the roster.

    Args:
        what: how the message names it (``it`` for the folder, ``its config.yaml``).
        st: its ``lstat``.
        uid: this process's uid (the root's owner).

    Returns:
        The reason (what is wrong, and what to run when it is this user's after all), or None.
    """
    if st.st_uid != uid:
        return (f"{what} is owned by uid {st.st_uid}, not by this user (uid {uid}), so another user could make it "
                "a bot of this root; if it is this user's, chown it (and what is in it) to this user")
    if st.st_mode & stat.S_IWOTH and not stat.S_ISLNK(st.st_mode):  # a link's mode means nothing (read refuses it)
        return (f"other users may write {what} (mode {stat.S_IMODE(st.st_mode):04o}), so another user could "
                "change what this bot is; take their write permission away (chmod o-w)")
    return None


def untrusted_profile(folder: os.stat_result, files: Mapping[str, os.stat_result | None], uid: int) -> str | None:
    """Pure: why a profile folder is not this user's to run as a bot, or None when it is.

    Every bot runs as this user, with this user's keys: a folder (or one of the files hermes reads from it at
    each turn, :data:`PROFILE_TRUSTED_FILES`) another user owns, or that other users may write (a world-writable
    ``profiles/`` lets anyone plant one, a world-writable ``config.yaml`` lets anyone point the bot's model at
    their server), would let another user add a bot to the roster or change what one says or where its turns
    go. Each is judged by :func:`untrusted_entry`.

    Args:
        folder: ``lstat`` of the profile folder.
        files: ``lstat`` of its files by name (``profile.yaml``, ``config.yaml``, ``.env``; None: missing).
        uid: this process's uid (the root's owner).

    Returns:
        The reason (what is wrong, and what to run when it is this user's after all), or None.
    """
    entries = [("it", folder), *((f"its {name}", st) for name, st in files.items() if st is not None)]
    for what, st in entries:
        if (problem := untrusted_entry(what, st, uid)) is not None:
            return problem
    return None


def _profile_trust_problem(entry: Path) -> str | None:
    """:func:`untrusted_profile` of the folder ``entry`` as it is now (its files looked at unfollowed).

    Raises:
        OSError: it could not be looked at for a reason that says nothing about it (out of file descriptors).
    """
    try:
        folder = entry.lstat()
        files = {name: _lstat_or_none(entry / name) for name in PROFILE_TRUSTED_FILES}
    except OSError as exc:
        if resource_failure(exc):
            raise
        return f"it cannot be looked at ({exc})"
    return untrusted_profile(folder, files, os.getuid())


def _lstat_or_none(path: Path) -> os.stat_result | None:
    """``lstat`` of ``path``, None when there is none.

    Raises:
        OSError: it could not be looked at (other than missing).
    """
    try:
        return path.lstat()
    except FileNotFoundError:
        return None


def scan_profile_dirs(root: Path) -> tuple[list[tuple[str, Path]], list[str]]:
    """The valid non-default profile folders under ``<root>/profiles``, and what hid the others.

    Args:
        root: the Hermes root.

    Returns:
        ``(folder id, home)`` pairs sorted by name, and the problems, each naming a path and what to do:
        a ``profiles/`` that is a symlink, a file or unreadable (then no pair at all), a profile folder
        that is a symlink, one (or one of its :data:`PROFILE_TRUSTED_FILES`) another user owns or other users may
        write (:func:`untrusted_profile`), folders whose names are not profile names (``my.bot``, ``sp ace``: one
        line naming them all, ``core.names.misnamed_profiles_problem``), and folders no DM could reach
        (``core.names.unreachable_profiles``: ``hermes``, ``Default``, a second ``Bob``/``bob``). Files, hidden
        ``.…`` folders and ``default`` (hermes' gateway creates ``profiles/default/`` for its own data) are
        skipped without a problem.

    Raises:
        OSError: ``profiles/`` could not be looked at for a reason that says nothing about it (out of file
            descriptors, say: :func:`~hermes_actors.store.os_errors.resource_failure`): no sign that only the
            default profile is left.
    """
    base = root / "profiles"
    problem = _profiles_base_problem(base)
    if problem is not None:
        return [], [problem]
    try:
        entries = sorted(base.iterdir(), key=lambda entry: entry.name)
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        if resource_failure(exc):
            raise
        return [], [f"cannot list profiles in {base} ({exc}): only the default profile is used"]
    found: list[tuple[str, Path]] = []
    problems: list[str] = []
    misnamed: list[str] = []
    for entry in entries:
        name = entry.name
        if entry.is_symlink():
            problems.append(f"skipping profile {entry}: it is a symlink (profiles are read only from real folders "
                            f"inside the root); put the real folder at {entry}")
        elif not entry.is_dir():
            logger.debug("skipping profile {}: not a directory", entry)
        elif not HANDLE_RE.match(name):
            if not name.startswith("."):
                misnamed.append(name)
            logger.debug("skipping profile {}: invalid name", entry)
        elif name == DEFAULT_PROFILE:  # hermes' own (its gateway keeps pairing data there): not a bot
            logger.debug("skipping profile {}: 'default' is the root profile", entry)
        elif (untrusted := _profile_trust_problem(entry)) is not None:
            problems.append(f"skipping profile {entry}: {untrusted}")
        else:
            found.append((name, entry))
    misnamed_problem = misnamed_profiles_problem(base, misnamed)
    if misnamed_problem is not None:
        problems.append(misnamed_problem)
    unreachable = unreachable_profiles([name for name, _ in found])
    problems += [f"skipping profile {base / name}: {why}" for name, why in unreachable.items()]
    return [(name, home) for name, home in found if name not in unreachable], problems


def _profile_dirs(root: Path) -> list[tuple[str, Path]]:
    """The valid non-default profile folders under ``<root>/profiles``, each problem warned once.

    Args:
        root: the Hermes root.

    Returns:
        ``(folder id, home)`` pairs, as :func:`scan_profile_dirs` finds them.
    """
    found, problems = scan_profile_dirs(root)
    for problem in problems:  # status polls every second: once per process, then at debug
        _warn_once(problem)
    return found


_warned: OrderedDict[str, None] = OrderedDict()  # lines already warned in this process (status polls every second)
_WARNED_KEEP = 1024


def _warn_once(line: str) -> None:
    """Log ``line`` as a warning the first time in this process, at debug after that."""
    if line in _warned:
        logger.debug("{}", line)
        return
    _warned[line] = None
    if len(_warned) > _WARNED_KEEP:
        _warned.popitem(last=False)
    logger.warning("{}", line)


def discover_profiles(root: Path) -> list[ProfileInfo]:
    """Discover every local profile of a Hermes root.

    Args:
        root: the Hermes root (the default profile's home).

    Returns:
        The default profile first (home = root), then the profiles under
        ``<root>/profiles/`` sorted by folder id.

    Raises:
        OSError: a file could not be read for a reason that says nothing about it (out of file descriptors,
            say): no sign that a profile is gone or unmanaged (:func:`scan_profile_dirs`, :func:`read_profile_yaml`).
    """
    root = Path(root)
    profiles = [_profile_info(DEFAULT_PROFILE, root)]
    profiles.extend(_profile_info(name, home) for name, home in _profile_dirs(root))
    return profiles


def install_is_managed(profiles: Iterable[ProfileInfo]) -> bool:
    """Whether the install runs Bot Mode (any profile is managed).

    Args:
        profiles: the discovered profiles.

    Returns:
        True when at least one profile is managed.
    """
    return any(info.managed for info in profiles)


def slugify(name: str) -> str:
    """The Desktop @-slug of a friendly name.

    Args:
        name: a friendly name (``"Dr. Foo"``).

    Returns:
        Lowercased, runs outside ``[a-z0-9]`` turned into ``-``, trimmed of
        leading/trailing ``-`` (``"dr-foo"``).
    """
    return _SLUG_RUN_RE.sub("-", str(name).lower()).strip("-")


def alias_forms(name: str) -> set[str]:
    """The forms a friendly name is known by.

    Args:
        name: a friendly name or a target as typed (``"@Scribe"``).

    Returns:
        The lowercased stripped text without a leading ``@``, and its slug;
        empty forms dropped.
    """
    text = str(name).strip().lower().removeprefix("@").strip()
    return {form for form in (text, slugify(text)) if form}
