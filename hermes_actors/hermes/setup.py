"""``hermes-actors enable`` / ``disable``: make a hermes-agent root Bot-Mode-managed, and undo it.

``enable`` (idempotent), for each chosen profile (all of the root's, default
included, when none are named):

- ``profile.yaml``: ``ui_meta["hermes-bots"]`` = ``{}`` unless a block is there
  (hermes' own ``write_profile_meta`` keeps unknown keys, so it survives
  ``hermes profile describe``);
- ``config.yaml``: ``hermes-actors`` in ``plugins.enabled`` (hermes loads an
  entry-point plugin of group ``hermes_agent.plugins`` only when its name is listed);
- the "Bot Chat" session in ``state.db``, created when missing.

With ``gateway=True`` the root's ``config.yaml`` also gets
``platforms.api_server`` (``enabled: true``, ``extra: {host, port}``) unless one
is configured, ``platforms.hermes_actors: {enabled: true, extra: {host_actors: true}}``
(the gateway then hosts the actors: :func:`hermes_actors.hermes.plugin.hosting_configured`) and
``gateway.multiplex_profiles: true``.

Every edit is recorded in ``<root>/bot_relay/hermes-actors-enable.json`` as
"path, value before, value after" (or "item added to a list"); ``disable``
restores exactly those edits whose value is still what enable wrote, and
leaves anything changed since alone (and says so). Sessions are never
deleted: they hold conversations. YAML is rewritten with PyYAML (comments in
an edited file are lost; keys and order are kept).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hermes_actors.hermes.install import cli_profile_name, find_hermes_cli, profile_home
from hermes_actors.hermes.plugin import HOST_KEY, PLATFORM_NAME
from hermes_actors.hermes.select import DEFAULT_API_PORT, MIN_KEY_CHARS, read_dotenv
from hermes_actors.hermes.sessions import BotChatError, ensure_bot_chat
from hermes_actors.hermes.submit_client import ping
from hermes_actors.store.atomic import atomic_write_bytes, atomic_write_json, read_json_file
from hermes_actors.store.hermes_root import MANAGED_KEY, discover_profiles, existing_root
from hermes_actors.store.private_dir import ensure_private_dir
from hermes_actors.store.yaml_file import MAX_EXPANDED_VALUES, load_bounded

__all__ = ["PLUGIN_NAME", "SetupError", "SetupReport", "disable", "enable"]

PLUGIN_NAME = "hermes-actors"
RECORD_NAME = "hermes-actors-enable.json"
_MAX_YAML = 4 * 1024 * 1024
_ABSENT = {"__absent__": True}


class SetupError(ValueError):
    """A file cannot be edited safely (malformed, a symlink, the wrong shape)."""


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


def _read_yaml(path: Path) -> dict[str, Any]:
    if path.is_symlink():
        raise SetupError(f"{path} is a symlink; refusing to edit it")
    if not path.exists():
        return {}
    if not path.is_file() or path.stat().st_size > _MAX_YAML:
        raise SetupError(f"{path} is not a regular file under 4 MiB; refusing to edit it")
    try:
        data, too_big = load_bounded(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SetupError(f"{path} is not valid YAML ({exc}); fix it, then run again") from None
    if too_big:
        raise SetupError(f"{path} holds more than {MAX_EXPANDED_VALUES} values once its YAML aliases are expanded "
                         "(or an alias that contains itself); refusing to edit it")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SetupError(f"{path} does not hold a mapping at the top; fix it, then run again")
    return data


def _write_yaml(path: Path, data: dict[str, Any], report: SetupReport) -> None:
    """Replace ``path`` with ``data`` as YAML; comments cannot survive, so a file that had some is kept first.

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
    """Copy ``path`` aside once when it has comment lines (a YAML rewrite drops them)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return
    if not any(line.lstrip().startswith("#") for line in text.splitlines()):
        return
    kept = path.with_name(f"{path.name}.before-hermes-actors")
    try:
        fd = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return  # the text from before our first edit is kept already
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    report.changed.append(f"{path}: rewritten without its comments; its previous text is in {kept}")


def _get(data: dict[str, Any], keys: list[str]) -> Any:
    node: Any = data
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return _ABSENT
        node = node[key]
    return node


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
        holder = _get(data, keys[: depth - 1]) if depth > 1 else data
        if isinstance(holder, dict) and holder.get(keys[depth - 1]) == {}:
            del holder[keys[depth - 1]]


# ── edits (applied and recorded) ────────────────────────────────────────────


class _Editor:
    """Applies edits to YAML files under a root and records them for ``disable``."""

    def __init__(self, root: Path, record: list[dict[str, Any]], report: SetupReport) -> None:
        self.root, self.record, self.report = root, record, report

    def _rel(self, path: Path) -> str:
        return str(path.relative_to(self.root))

    def set_default(self, path: Path, keys: list[str], value: Any, *, replace: Any = _ABSENT) -> None:
        """Set ``keys`` to ``value`` when absent (or equal to ``replace``)."""
        data = _read_yaml(path)
        before = _get(data, keys)
        if before is not _ABSENT and before != replace:
            return
        holder, created = _parent(data, keys, path)
        holder[keys[-1]] = value
        _write_yaml(path, data, self.report)
        self.record.append({"file": self._rel(path), "op": "set", "keys": keys, "after": value,
                            "before": None if before is _ABSENT else before, "absent": before is _ABSENT,
                            "parents": created})
        self.report.changed.append(f"{path}: {'.'.join(keys)} = {value!r}")

    def list_add(self, path: Path, keys: list[str], item: str) -> None:
        """Append ``item`` to the list at ``keys`` (created when absent)."""
        data = _read_yaml(path)
        current = _get(data, keys)
        if current is not _ABSENT and not isinstance(current, list):
            raise SetupError(f"{path}: {'.'.join(keys)} is not a list; fix it, then run again")
        if isinstance(current, list) and item in current:
            return
        holder, created = _parent(data, keys, path)
        if isinstance(current, list):
            current.append(item)
        else:
            holder[keys[-1]] = [item]
        _write_yaml(path, data, self.report)
        self.record.append({"file": self._rel(path), "op": "list_add", "keys": keys, "item": item,
                            "list_created": current is _ABSENT, "parents": created})
        self.report.changed.append(f"{path}: added {item!r} to {'.'.join(keys)}")


def _undo(root: Path, entry: dict[str, Any], report: SetupReport) -> None:
    path = root / str(entry["file"])
    keys = [str(k) for k in entry["keys"]]
    data = _read_yaml(path)
    current = _get(data, keys)
    dotted = ".".join(keys)
    if entry["op"] == "set":
        if current != entry["after"]:
            report.todo.append(f"{path}: {dotted} changed since enable; left as it is (edit or remove it there "
                               "by hand if it was only for hermes-actors)")
            return
        holder, _ = _parent(data, keys, path)
        if entry["absent"]:
            del holder[keys[-1]]
            _prune(data, keys, int(entry.get("parents", 0)))
        else:
            holder[keys[-1]] = entry["before"]
        report.changed.append(f"{path}: {dotted} restored")
    else:
        item = entry["item"]
        if not isinstance(current, list) or item not in current:
            return
        current.remove(item)
        if not current and entry.get("list_created"):
            holder, _ = _parent(data, keys, path)
            del holder[keys[-1]]
            _prune(data, keys, int(entry.get("parents", 0)))
        report.changed.append(f"{path}: removed {item!r} from {dotted}")
    _write_yaml(path, data, report)


# ── the record ──────────────────────────────────────────────────────────────


def _record_path(root: Path) -> Path:
    return root / "bot_relay" / RECORD_NAME


def _load_record(root: Path) -> list[dict[str, Any]]:
    try:
        data = read_json_file(_record_path(root))
    except FileNotFoundError:
        return []
    entries = data.get("edits") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise SetupError(f"{_record_path(root)} is not a record this version wrote; refusing to guess")
    return entries


def _save_record(root: Path, entries: list[dict[str, Any]]) -> None:
    path = _record_path(root)
    if not entries:
        path.unlink(missing_ok=True)
        return
    ensure_private_dir(path.parent, within=root)
    atomic_write_json(path, {"version": 1, "edits": entries}, tmp_dir=path.parent)


# ── enable / disable ────────────────────────────────────────────────────────


def _root(root: Path) -> Path:
    """The root to edit (:func:`existing_root`), its refusal as a :class:`SetupError`.

    A root the user reaches through a symlink (``~/.hermes -> /data/hermes``) is their choice: its
    real directory is edited, where a write never follows a symlink below it.
    """
    try:
        return Path(os.path.realpath(existing_root(root)))
    except FileNotFoundError as exc:
        raise SetupError(f"{exc}: pass the HERMES_HOME of your install (default ~/.hermes; hermes creates it with "
                         "its first profile: hermes profile create <name>)") from None
    except ValueError as exc:  # its text names what to pass instead
        raise SetupError(str(exc)) from None


def _named(root: Path, profiles: Iterable[str]) -> list[str]:
    """The profile names given (stripped, blanks dropped); at least one.

    Raises:
        SetupError: no name was given (an empty ``--profiles`` must not mean "every profile").
    """
    chosen = [p.strip() for p in profiles if p.strip()]
    if not chosen:
        raise SetupError(
            f"no profile named: give folder ids such as alice,bob (the root profile is 'default'), "
            f"or leave --profiles out for every profile of {root}"
        )
    return chosen


def _chosen(root: Path, profiles: Iterable[str] | None, report: SetupReport) -> list[str]:
    """The profiles to enable: the named ones, or every profile hermes can run (the others are reported)."""
    known = [info.profile for info in discover_profiles(root)]
    if profiles is None:
        runnable = []
        for profile in known:
            try:
                runnable.append(cli_profile_name(profile))
            except ValueError as exc:  # enabled, it would be on the roster and every DM to it would fail
                report.todo.append(f"{profile}: not enabled — {exc}; rename its folder to enable it")
        return runnable
    chosen = _named(root, profiles)
    unknown = [p for p in chosen if p not in known]
    if unknown:
        raise SetupError(f"no such profile on {root}: {', '.join(unknown)} (known: {', '.join(known)})")
    try:
        return [cli_profile_name(p) for p in chosen]
    except ValueError as exc:
        raise SetupError(f"{exc}; rename its folder to enable it") from None


def enable(
    root: Path,
    profiles: Iterable[str] | None = None,
    *,
    gateway: bool = False,
    port: int | None = None,
    cli: str | None = None,
    env: dict[str, str] | None = None,
) -> SetupReport:
    """Make profiles of a root Bot-Mode-managed (idempotent).

    Args:
        root: the Hermes root.
        profiles: folder ids (``default`` = the root profile); all when None.
        gateway: also configure the hermes gateway to host the actors and serve warm turns.
        port: the API server's port: the one a new API server block gets (default 8642), and when
            given, set in an existing one too (an earlier ``enable --gateway`` wrote 8642).
        cli: the hermes executable (creates a fresh ``state.db``); found when None.
        env: the environment to check for ``API_SERVER_KEY`` (``os.environ`` when None).

    Returns:
        The report.

    Raises:
        SetupError: the root or a named profile does not exist, or a file cannot be edited safely.
    """
    root = _root(root)
    report = SetupReport()
    record = _load_record(root)
    editor = _Editor(root, record, report)
    hermes_cli = find_hermes_cli(cli)
    try:
        for profile in _chosen(root, profiles, report):
            home = profile_home(root, profile)
            editor.set_default(home / "profile.yaml", ["ui_meta", MANAGED_KEY], {})
            editor.list_add(home / "config.yaml", ["plugins", "enabled"], PLUGIN_NAME)
            try:
                session, created = ensure_bot_chat(home, cli=hermes_cli)
            except BotChatError as exc:
                report.todo.append(f"{profile}: create its 'Bot Chat' session ({exc})")
            else:
                if created:
                    report.changed.append(f"{home / 'state.db'}: created the 'Bot Chat' session {session}")
        if gateway:
            config = root / "config.yaml"
            editor.set_default(config, ["platforms", "api_server"],
                               {"enabled": True, "extra": {"host": "127.0.0.1",
                                                           "port": int(port or DEFAULT_API_PORT)}})
            where = ["platforms", "api_server", "extra", "port"]
            current = _get(_read_yaml(config), where)
            if port is not None and current != int(port):  # named: that port, whatever an earlier enable set
                editor.set_default(config, where, int(port), replace=current)
            editor.set_default(config, ["platforms", "api_server", "enabled"], True, replace=False)
            editor.set_default(config, ["platforms", PLATFORM_NAME], {"enabled": True, "extra": {HOST_KEY: True}})
            # `enable --gateway` is the ask to host: a block switched off by hand is switched on again
            # (`disable` puts the user's false back), else the gateway it says to start would host nothing
            editor.set_default(config, ["platforms", PLATFORM_NAME, "enabled"], True, replace=False)
            editor.set_default(config, ["platforms", PLATFORM_NAME, "extra", HOST_KEY], True)
            editor.set_default(config, ["gateway", "multiplex_profiles"], True, replace=False)
    finally:
        _save_record(root, record)
    _add_todo(root, report, gateway=gateway, env=env, cli=hermes_cli)
    return report


def _add_todo(root: Path, report: SetupReport, *, gateway: bool, env: dict[str, str] | None, cli: str | None) -> None:
    if cli is None:
        report.todo.append("install hermes-agent (pip install 'hermes-actors[hermes]') — no hermes CLI was found")
    if gateway:
        seen = {**read_dotenv(root / ".env"), **(env if env is not None else dict(os.environ))}
        if len(str(seen.get("API_SERVER_KEY", "")).strip()) < MIN_KEY_CHARS:
            report.todo.append(
                f"set API_SERVER_KEY (at least {MIN_KEY_CHARS} characters, e.g. `openssl rand -hex 32`) in "
                f"{root / '.env'} — the hermes API server refuses to start without it"
            )
        report.todo.append(f"start the gateway: HERMES_HOME={root} hermes gateway run")
    elif ping(root) is None:
        report.todo.append(f"start the actors: hermes-actors serve --root {root}")
    # else a host already serves the root: its roster takes the managed profiles within its rescan


def _home_key(root: Path, profile: str) -> str:
    """How the enable record names ``profile``'s home: ``.`` for the root profile, else its relative path."""
    return "." if profile == "default" else str(profile_home(root, profile).relative_to(root))


def disable(root: Path, profiles: Iterable[str] | None = None) -> SetupReport:
    """Undo what :func:`enable` recorded (for the named profiles, or everything).

    Args:
        root: the Hermes root.
        profiles: folder ids whose edits to undo; None undoes every recorded
            edit, the gateway's included.

    Returns:
        The report.

    Raises:
        SetupError: the record or an edited file cannot be read safely.
    """
    root = _root(root)
    report = SetupReport()
    record = _load_record(root)
    if profiles is None:
        selected = list(record)
    else:
        chosen = _named(root, profiles)
        recorded = {str(Path(str(e["file"])).parent) for e in record}
        known = {info.profile for info in discover_profiles(root)}
        unknown = [p for p in chosen if p not in known and _home_key(root, p) not in recorded]
        if unknown:
            raise SetupError(
                f"no such profile on {root}, nor in what enable recorded: {', '.join(unknown)} "
                f"(known: {', '.join(sorted(known))})"
            )
        homes = {_home_key(root, p) for p in chosen}
        selected = [e for e in record if str(Path(str(e["file"])).parent) in homes
                    and not (e["file"] == "config.yaml" and e["keys"][0] in ("platforms", "gateway"))]
    kept = [e for e in record if e not in selected]
    try:
        for entry in reversed(selected):
            _undo(root, entry, report)
    finally:
        _save_record(root, kept)
    if selected:
        report.todo.append("the 'Bot Chat' sessions were kept (they hold conversations)")
    if any(e["file"] == "config.yaml" and e["keys"][0] in ("platforms", "gateway") for e in selected):
        # a running gateway read its platforms at start: it hosts (and refuses every DM) until restarted
        report.todo.append(f"restart the hermes gateway if one runs, so it stops hosting the actors: "
                           f"HERMES_HOME={root} hermes gateway run --replace")
    return report
