"""The edits ``enable`` makes to YAML files, recorded so that ``disable`` undoes exactly those.

Each edit is recorded in ``<root>/bot_relay/hermes-actors-enable.json`` as "path,
value before, value after" (or "item added to a list"); undoing restores an edit
only while its value is still what enable wrote. YAML is rewritten with PyYAML
(comments are lost, so a commented file is copied aside first; keys and order are kept).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from hermes_actors.core.clipping import shown
from hermes_actors.core.shell import shell_command
from hermes_actors.errors import HostileFileError
from hermes_actors.store.atomic import atomic_write_bytes, atomic_write_json, read_json_file
from hermes_actors.store.private_dir import ensure_private_dir
from hermes_actors.store.relay_dirfd import open_dir_below, remove_below
from hermes_actors.store.temp_file import check_temp_dir
from hermes_actors.store.yaml_file import comment_lines, load_bounded

__all__ = [
    "RECORDED_FILES",
    "RECORD_NAME",
    "RecordedEditor",
    "SetupError",
    "SetupReport",
    "SetupStopped",
    "check_record_writable",
    "key_moved_after",
    "load_record",
    "read_yaml",
    "record_entry_problem",
    "record_file_problem",
    "record_path",
    "save_record",
    "still_as_written",
    "value_at",
    "write_yaml",
]

RECORD_NAME = "hermes-actors-enable.json"
_MAX_YAML = 4 * 1024 * 1024
_ABSENT = {"__absent__": True}
_MOVE = "move"  # a planned edit that only reorders keys: reported, never recorded


class SetupError(ValueError):
    """A file cannot be edited safely (malformed, a symlink, the wrong shape)."""


class SetupStopped(Exception):
    """A write failed part-way through ``enable`` or ``disable``: ``report`` says what was changed before it and
    what to do about it; ``cause`` is the error (a full disk, a directory swapped meanwhile)."""

    def __init__(self, report: SetupReport, cause: Exception) -> None:
        super().__init__(str(cause))
        self.report, self.cause = report, cause


@dataclass
class SetupReport:
    """What enable/disable changed and what the user must still do."""

    changed: list[str] = field(default_factory=list)
    todo: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The report as printable lines.

        Returns:
            "changed" lines (or "nothing to change"), then "to do" lines.
        """
        out = [f"  changed: {c}" for c in self.changed] or ["  nothing to change"]
        return out + [f"  to do: {t}" for t in self.todo]


# ── YAML files ──────────────────────────────────────────────────────────────


def read_yaml(path: Path) -> dict[str, Any]:
    """The mapping a YAML file holds, refused when editing it would not be safe.

    Args:
        path: the file (a missing one reads as ``{}``).

    Returns:
        Its top-level mapping.

    Raises:
        SetupError: a symlink, not a regular file under 4 MiB, not YAML, too deep, an alias bomb, or not a mapping.
    """
    if path.is_symlink():
        raise SetupError(f"{path} is a symlink; refusing to edit it")
    if not path.exists():
        return {}
    if not path.is_file() or path.stat().st_size > _MAX_YAML:
        raise SetupError(f"{path} is not a regular file under 4 MiB; refusing to edit it")
    try:
        data, refusal = load_bounded(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SetupError(f"{path} is not valid YAML ({exc}); fix it, then run again") from None
    if refusal is not None:
        raise SetupError(f"{path} {refusal}; refusing to edit it")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SetupError(f"{path} does not hold a mapping at the top; fix it, then run again")
    return data


def write_yaml(path: Path, data: dict[str, Any], report: SetupReport) -> None:
    """Replace ``path`` with ``data`` as YAML; comments cannot survive, so a file that had some is kept first.

    Args:
        path: the file.
        data: its new content.
        report: where a kept copy is reported.

    The first time a file with comments is rewritten, its text is copied to
    ``<name>.before-hermes-actors`` (0600) and the report says so. The new file
    keeps the old one's permission bits (0600 for a new file); it is written to a
    fresh temp file beside it and renamed into place (:func:`atomic_write_bytes`),
    so nothing another program left beside it (a FIFO, a hard link to a file
    elsewhere) is ever opened or written through.

    Raises:
        HostileFileError: the file's directory is a symlink or not ours.
        StoreError: the file could not be written (disk full, permission denied).
    """
    _keep_commented(path, report)
    try:
        mode = os.lstat(path).st_mode & 0o777  # not setuid/setgid/sticky: never copied onto a config
    except FileNotFoundError:
        mode = 0o600
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
    atomic_write_bytes(path, text.encode("utf-8"), tmp_dir=path.parent, mode=mode)


def _keep_commented(path: Path, report: SetupReport) -> None:
    """Copy ``path`` aside once when it has a comment, whole-line or at a line's end (a YAML rewrite drops both:
    :func:`~hermes_actors.store.yaml_file.comment_lines`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return
    if not comment_lines(text):
        return
    kept = path.with_name(f"{path.name}.before-hermes-actors")
    try:
        fd = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return  # the text from before our first edit is kept already
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    report.changed.append(f"{path}: rewritten without its comments; its previous text is in {kept}")


def value_at(data: dict[str, Any], keys: list[str]) -> Any:
    """Pure: the value at the key path ``keys`` of ``data``, or the absent marker when there is none.

    Args:
        data: a YAML mapping.
        keys: the key path.

    Returns:
        The value; a private marker (never a YAML value) when a key is missing or a parent is no mapping.
    """
    node: Any = data
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return _ABSENT
        node = node[key]
    return node


def key_moved_after(mapping: dict[str, Any], key: str, after: str) -> dict[str, Any] | None:
    """Pure: ``mapping`` with ``key`` moved to just after ``after`` (the other keys keep their order).

    Args:
        mapping: a YAML mapping (not changed).
        key: the key to move.
        after: the key it must follow.

    Returns:
        The reordered mapping; None when there is nothing to move (either key is missing, or ``key`` follows
        ``after`` already).
    """
    keys = list(mapping)
    if key not in mapping or after not in mapping or keys.index(key) > keys.index(after):
        return None
    moved: dict[str, Any] = {}
    for name in keys:
        if name != key:
            moved[name] = mapping[name]
        if name == after:
            moved[key] = mapping[key]
    return moved


def _parent(data: dict[str, Any], keys: list[str], path: Path) -> tuple[dict[str, Any], int]:
    """The dict holding ``keys[-1]``, creating missing parents; returns it and how many were created."""
    node, created = data, 0
    for i, key in enumerate(keys[:-1]):
        if key not in node:
            node[key] = {}
            created += 1
        if not isinstance(node[key], dict):
            raise SetupError(f"{path}: {'.'.join(keys[: i + 1])} is not a mapping; fix it, then run again")
        node = node[key]
    return node, created


def _prune(data: dict[str, Any], keys: list[str], levels: int) -> None:
    """Remove up to ``levels`` empty parents of ``keys[-1]`` (those enable created)."""
    for depth in range(len(keys) - 1, len(keys) - 1 - levels, -1):
        if depth <= 0:
            break
        holder = value_at(data, keys[: depth - 1]) if depth > 1 else data
        if isinstance(holder, dict) and holder.get(keys[depth - 1]) == {}:
            del holder[keys[depth - 1]]


# ── edits (planned, then written and recorded) ───────────────────────────────


class RecordedEditor:
    """Edits YAML files under a root, recorded for ``disable``: planned first, then written.

    Every edit (and every undo of one) is made on the file's content in memory, each file read once, so every
    refusal (a malformed file, a symlink, the wrong shape, an unreadable one) comes before anything is written;
    :meth:`check_writable` then refuses a directory that could not be written in, and :meth:`write` writes
    each edited file once. A file's edits are reported (and, for ``enable``, recorded) as it is written: a
    write that fails part-way leaves :attr:`written` and the report saying exactly what was changed.
    """

    def __init__(self, root: Path, report: SetupReport) -> None:
        self.root, self.report = root, report
        self._files: dict[Path, dict[str, Any]] = {}
        self._missing: set[Path] = set()  # the files that did not exist when first read: enable creates them
        self._planned: dict[Path, list[tuple[dict[str, Any], str]]] = {}
        self.written: list[dict[str, Any]] = []  # the record entries of the files written so far, in order
        self.files_written: list[Path] = []  # the files written so far (a reorder alone too), in order

    def _rel(self, path: Path) -> str:
        return str(path.relative_to(self.root))

    def data(self, path: Path) -> dict[str, Any]:
        """The content of ``path`` with the edits planned so far (read once, by :func:`read_yaml`).

        Raises:
            SetupError: as :func:`read_yaml`.
            HostileFileError: a directory between the root and ``path`` is a symlink, not a directory, or another
                uid's: nothing is read through it.
            OSError: the file cannot be read (permission).
        """
        if path not in self._files:
            try:  # a directory on the way swapped for a symlink is refused, never read through (nor written)
                os.close(open_dir_below(self.root, path.parent))
            except FileNotFoundError:
                pass  # no such directory: the file reads as {} (an edit of it is refused when written)
            if not os.path.lexists(path):
                self._missing.add(path)
            self._files[path] = read_yaml(path)
        return self._files[path]

    def _plan(self, path: Path, entry: dict[str, Any], line: str) -> None:
        self._planned.setdefault(path, []).append((entry, line))

    def _entry(self, path: Path, fields: dict[str, Any]) -> dict[str, Any]:
        """The record entry of an edit of ``path``: ``fields``, with ``file``, and ``file_created`` when the edit
        creates the file (``disable`` then says it is enable's to remove, never of a file the user had)."""
        created = {"file_created": True} if path in self._missing else {}
        return {"file": self._rel(path), **fields, **created}

    def planned(self) -> list[dict[str, Any]]:
        """The record entries of the edits planned and not yet written, in the order planned.

        Returns:
            Those entries (not copies).
        """
        return [entry for edits in self._planned.values() for entry, _line in edits if entry.get("op") != _MOVE]

    def check_writable(self) -> None:
        """Refuse now a directory an edited file could not be written in (:func:`check_temp_dir`).

        Raises:
            HostileFileError: a directory is a symlink, not a directory, or another uid's.
            OSError: you may not write in one (permission), or it cannot be opened.
        """
        for directory in dict.fromkeys(path.parent for path in self._planned):
            check_temp_dir(directory)

    def write(self) -> None:
        """Write each edited file once, in the order first edited; it then joins :attr:`files_written`, and its
        edits :attr:`written` and the report's "changed" lines.

        Raises:
            HostileFileError: as :func:`write_yaml`.
            StoreError: a file could not be written; those before it were.
        """
        for path in list(self._planned):
            write_yaml(path, self._files[path], self.report)
            self.files_written.append(path)
            for entry, line in self._planned.pop(path):
                if entry.get("op") != _MOVE:
                    self.written.append(entry)
                self.report.changed.append(line)

    def set_default(self, path: Path, keys: list[str], value: Any, *, replace: Any = _ABSENT) -> None:
        """Set ``keys`` to ``value`` when absent (or equal to ``replace``)."""
        data = self.data(path)
        before = value_at(data, keys)
        if before is not _ABSENT and before != replace:
            return
        holder, created = _parent(data, keys, path)
        holder[keys[-1]] = copy.deepcopy(value)  # later edits of the file must not change what is recorded
        self._plan(path, self._entry(path, {
                       "op": "set", "keys": keys, "after": copy.deepcopy(value),
                       "before": None if before is _ABSENT else copy.deepcopy(before), "absent": before is _ABSENT,
                       "parents": created}),
                   f"{path}: {'.'.join(keys)} = {value!r}")

    def switch_on(self, path: Path, keys: list[str], reads_on: Callable[[Any], bool]) -> None:
        """Set the switch at ``keys`` to ``True`` unless it is there and ``reads_on`` says it is on (an absent
        one, and every value the reader takes as off, e.g. ``'no'`` or null, are set; ``disable`` puts it back).

        Args:
            path: the YAML file.
            keys: the key path of the switch.
            reads_on: how its reader (hermes) reads a value: True when on.
        """
        current = value_at(self.data(path), keys)
        if current is _ABSENT or not reads_on(current):
            self.set_default(path, keys, True, replace=current)

    def move_after(self, path: Path, keys: list[str], key: str, after: str, why: str) -> None:
        """Move ``key`` of the mapping at ``keys`` just after ``after`` when it comes first (:func:`key_moved_after`).

        Not recorded: only the order changes, which ``disable`` has no reason to put back.

        Args:
            path: the YAML file.
            keys: the key path of the mapping (at least one key).
            key: the key to move.
            after: the key it must follow.
            why: why, for the report.
        """
        holder = value_at(self.data(path), keys)
        moved = key_moved_after(holder, key, after) if isinstance(holder, dict) else None
        if moved is None:
            return
        holder.clear()
        holder.update(moved)
        where = ".".join(keys)
        self._plan(path, {"op": _MOVE}, f"{path}: moved {where}.{key} after {where}.{after} ({why})")

    def list_add(self, path: Path, keys: list[str], item: str) -> None:
        """Append ``item`` to the list at ``keys`` (created when absent)."""
        data = self.data(path)
        current = value_at(data, keys)
        if current is not _ABSENT and not isinstance(current, list):
            raise SetupError(f"{path}: {'.'.join(keys)} is not a list; fix it, then run again")
        if isinstance(current, list) and item in current:
            return
        holder, created = _parent(data, keys, path)
        if isinstance(current, list):
            current.append(item)
        else:
            holder[keys[-1]] = [item]
        self._plan(path, self._entry(path, {"op": "list_add", "keys": keys, "item": item,
                                            "list_created": current is _ABSENT, "parents": created}),
                   f"{path}: added {item!r} to {'.'.join(keys)}")

    def undo(self, entry: dict[str, Any]) -> None:
        """Plan the undo of one recorded edit, unless its value changed since (then the report says to look at
        it); a block whose ``enabled`` switch alone changed is undone (:func:`still_as_written`).

        Args:
            entry: one edit as this editor recorded it (it joins :attr:`written` once its file is written).

        Raises:
            SetupError: the edited file cannot be read or edited safely.
            OSError: it cannot be read (permission).
        """
        path = self.root / str(entry["file"])
        keys = [str(k) for k in entry["keys"]]
        data = self.data(path)
        current = value_at(data, keys)
        dotted = ".".join(keys)
        if entry["op"] == "set":
            if not still_as_written(current, entry["after"]):
                self.report.todo.append(f"{path}: {dotted} changed since enable; left as it is (edit or remove it "
                                        "there by hand if it was only for hermes-actors)")
                return
            holder, _ = _parent(data, keys, path)
            if entry["absent"]:
                del holder[keys[-1]]
                _prune(data, keys, int(entry.get("parents", 0)))
            else:
                holder[keys[-1]] = copy.deepcopy(entry["before"])
            self._plan(path, entry, f"{path}: {dotted} restored")
            return
        item = entry["item"]
        if not isinstance(current, list) or item not in current:
            return
        current.remove(item)
        if not current and entry.get("list_created"):
            holder, _ = _parent(data, keys, path)
            del holder[keys[-1]]
            _prune(data, keys, int(entry.get("parents", 0)))
        self._plan(path, entry, f"{path}: removed {item!r} from {dotted}")


# The on/off switch of a platform block (``platforms.<name>.enabled``): the user's as much as ours. ``enable
# --gateway`` switches a block turned off by hand on again, and docs/hermes.md has the user turn the block
# enable wrote off by hand (``serve`` hosting while the gateway serves warm turns only).
_SWITCH = "enabled"


def still_as_written(current: Any, written: Any) -> bool:
    """Pure: whether a value enable wrote is still what it wrote, so ``disable`` may undo it.

    A mapping that differs from it only in its ``enabled`` switch still is: turning it off (or on) is not
    making it the user's own, and left in place it would stay for nothing once the plugin is gone. Any other
    change (a key added, removed or set) makes it the user's: left alone.

    Args:
        current: the value in the file now (the absent marker of :func:`value_at` when there is none).
        written: the value enable wrote.

    Returns:
        True when the edit may be undone.
    """
    if current == written:
        return True
    if not isinstance(current, dict) or not isinstance(written, dict) or _SWITCH not in written:
        return False
    return {k: v for k, v in current.items() if k != _SWITCH} == {k: v for k, v in written.items() if k != _SWITCH}


# ── the record ──────────────────────────────────────────────────────────────


def record_path(root: Path) -> Path:
    """Where ``enable`` records its edits: ``<root>/bot_relay/hermes-actors-enable.json``."""
    return root / "bot_relay" / RECORD_NAME


# The files enable edits, relative to the root: the root's own and each profile's (``profiles/<folder>/``).
RECORDED_FILES = ("profile.yaml", "config.yaml")
_RECORDED_OPS = ("set", "list_add")


def record_file_problem(file: Any) -> str | None:
    """Pure: what is wrong with the ``file`` of a record entry, None when it names a file enable edits.

    Enable edits only ``profile.yaml`` and ``config.yaml`` of the root and of its profiles, and records
    them relative to the root (``config.yaml``, ``profiles/<folder>/profile.yaml``). Anything else (an
    absolute path, a ``..``, ``.env``) would have ``disable`` rewrite a file enable never wrote, maybe
    outside the root.

    Args:
        file: the entry's ``file`` value.

    Returns:
        The problem, said as what the entry "names" or "has", or None.
    """
    if not isinstance(file, str):
        return f"has no file name (file: {shown(file)})"
    parts = file.split("/")
    folder_ok = len(parts) == 1 or (len(parts) == 3 and parts[0] == "profiles"
                                    and parts[1] not in ("", ".", "..") and "\0" not in parts[1])
    if not folder_ok or parts[-1] not in RECORDED_FILES:
        return (f"names {shown(file)}, not a file enable edits (profile.yaml or config.yaml of the root, or of a "
                "profile: profiles/<folder>/…, relative to the root)")
    return None


def _keys_problem(keys: Any) -> str | None:
    """Pure: what is wrong with the ``keys`` of a record entry (a non-empty list of strings), None when nothing."""
    if not isinstance(keys, list) or not keys:
        return f"has no key path (keys: {shown(keys)}; a non-empty list of strings)"
    if not all(isinstance(key, str) for key in keys):
        return f"has a key that is not a string (keys: {shown(keys)})"
    return None


def _op_problem(entry: dict[str, Any]) -> str | None:
    """Pure: what is wrong with the fields of a record entry's op (those ``undo`` reads), None when nothing."""
    op = entry.get("op")
    if op not in _RECORDED_OPS:
        return f"has an unknown op {shown(op)} (enable records {' or '.join(_RECORDED_OPS)})"
    if not isinstance(entry.get("file_created", False), bool):
        return f"has file_created {shown(entry.get('file_created'))}, not true or false"
    parents = entry.get("parents", 0)
    if not isinstance(parents, int) or isinstance(parents, bool) or parents < 0:
        return f"has parents {shown(parents)}, not a count"
    if op == "set":
        if not isinstance(entry.get("absent"), bool):
            return f"has absent {shown(entry.get('absent'))}, not true or false"
        missing = [name for name in ("after", *(() if entry["absent"] else ("before",))) if name not in entry]
        return f"has no {' nor '.join(missing)} value" if missing else None
    if not isinstance(entry.get("item"), str):
        return f"has item {shown(entry.get('item'))}, not a string"
    if not isinstance(entry.get("list_created", False), bool):
        return f"has list_created {shown(entry.get('list_created'))}, not true or false"
    return None


def record_entry_problem(entry: dict[str, Any]) -> str | None:
    """Pure: what is wrong with one entry of the enable record, None when it is an edit enable records.

    ``disable`` undoes an entry by its fields alone: a file enable edits (:func:`record_file_problem`), a key
    path, a known op and the values that op's undo reads.

    Args:
        entry: one entry (a dict).

    Returns:
        The first problem found, said as what the entry "names" or "has", or None.
    """
    return record_file_problem(entry.get("file")) or _keys_problem(entry.get("keys")) or _op_problem(entry)


def load_record(root: Path) -> list[dict[str, Any]]:
    """The edits recorded so far (none when there is no record).

    Never read through a ``bot_relay/`` that is a symlink (it would give another root's record), and every
    entry checked (:func:`record_entry_problem`) before any is used.

    Args:
        root: the Hermes root.

    Returns:
        The recorded edits, oldest first.

    Raises:
        SetupError: the record is not valid JSON, not one this version wrote, or an entry is not an edit enable
            records (the text names the record, the entry and what is wrong, and says what to do: :func:`_by_hand`).
        HostileFileError: ``bot_relay/`` is a symlink, or the record is refused by
            :func:`~hermes_actors.store.safe_read.read_json_file` (a symlink, another uid's, writable by others).
        OSError: it cannot be read (``bot_relay/`` a file, a directory you may not enter).
    """
    path = record_path(root)
    if os.path.islink(path.parent):  # as check_record_writable and every relay use refuse it; never read through
        raise HostileFileError(f"{path.parent} is a symlink; refusing to read the enable record through it")
    try:
        data = read_json_file(path)
    except FileNotFoundError:
        return []
    except HostileFileError as exc:
        if not isinstance(exc.__cause__, orjson.JSONDecodeError):
            raise
        raise SetupError(f"{exc}. {_by_hand(path)}") from None
    entries = data.get("edits") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise SetupError(f"{path} is not a record this version wrote; refusing to guess. {_by_hand(path)}")
    for number, entry in enumerate(entries, 1):
        problem = record_entry_problem(entry)
        if problem is not None:
            raise SetupError(
                f"{path}: edit {number} of {len(entries)} {problem}; enable never records such an edit, so the "
                f"record is refused and nothing was changed: remove that edit from the record (the next disable "
                f"undoes the others). {_by_hand(path)}"
            )
    return entries


def _by_hand(path: Path) -> str:
    """Pure: what a user can do about an enable record that cannot be read: the sentence after its refusal."""
    return (f"Look at it (each edit names a YAML file under the root, the keys enable set and their earlier value): "
            f"put it right, or move it aside ({shell_command('mv', path, f'{path}.bad')}) and undo enable's edits by "
            "hand: 'hermes-actors' in plugins.enabled of the root's and each profile's config.yaml, the hermes-bots "
            "block under ui_meta in each profile.yaml, and after enable --gateway platforms.hermes_actors (and the "
            "platforms.api_server and multiplex_profiles settings it set) in the root's config.yaml; a YAML file "
            "enable rewrote without its comments has its earlier text beside it, in <name>.before-hermes-actors "
            "(docs/hermes.md, Uninstall)")


def check_record_writable(root: Path) -> None:
    """Refuse now a record :func:`save_record` could not write, before anything else is written.

    Args:
        root: the Hermes root.

    Raises:
        HostileFileError: ``bot_relay/`` is a symlink, not a directory, or another uid's.
        OSError: you may not write in it (or in the root, to make it).
    """
    relay = record_path(root).parent
    if not os.path.lexists(relay):
        check_temp_dir(root)  # where save_record makes it
        return
    os.close(open_dir_below(root, relay))  # a symlink, a file, another uid's: refused as save_record refuses it
    check_temp_dir(relay)


def save_record(root: Path, entries: list[dict[str, Any]]) -> None:
    """Write the record (0600, atomically); no entries removes it (through the checked ``bot_relay/``).

    Args:
        root: the Hermes root.
        entries: the edits still to be undone.

    Raises:
        HostileFileError: ``bot_relay/`` is a symlink, a file or not ours: nothing is written or removed.
        OSError: the write or the removal failed.
    """
    path = record_path(root)
    if not entries:
        remove_below(root, path)  # through the checked bot_relay/: a symlink there is refused, never followed
        return
    ensure_private_dir(path.parent, within=root)
    atomic_write_json(path, {"version": 1, "edits": entries}, tmp_dir=path.parent)
