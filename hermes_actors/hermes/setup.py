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
(the gateway then hosts the actors: :func:`hermes_actors.hermes.plugin.hosting_configured`),
listed after ``platforms.api_server`` (moved there when it came first: hermes connects
platforms in that order), and ``gateway.multiplex_profiles: true`` (the top-level
``multiplex_profiles``, which hermes reads first, when there is one). Each of these switches
that hermes reads as off (``false``, ``'no'``, ``'off'``, null, ...) is set to ``true``. hermes 0.19 reads
platform blocks under ``gateway.platforms`` too (before the top level's): a block there is
edited there, and ours goes beside it (:func:`platform_block_keys`, :func:`connect_order`); a
block that is no mapping (``api_server: null``) is skipped, as hermes skips it.

Every file is read, and every edit planned, before anything is written (a refusal, such as a malformed
``profile.yaml``, writes nothing); then each edited file is written once, the record, and the sessions. A
write that fails part-way (a full disk) is said with what was changed before it (:class:`SetupStopped`).
Every edit is recorded (:mod:`hermes_actors.hermes.recorded_edits`) in
``<root>/bot_relay/hermes-actors-enable.json`` as "path, value before, value
after" (or "item added to a list"); ``disable``
restores exactly those edits whose value is still what enable wrote, and
leaves anything changed since alone (and says so). Sessions are never
deleted: they hold conversations. YAML is rewritten with PyYAML (comments in
an edited file are lost; keys and order are kept).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from hermes_actors.core.clipping import shown
from hermes_actors.core.shell import shell_command
from hermes_actors.hermes.gateway_api import (
    DEFAULT_API_PORT,
    MIN_KEY_CHARS,
    hermes_true,
    read_gateway_api_server,
    read_root_dotenv,
)
from hermes_actors.hermes.gateway_process import gateway_pid
from hermes_actors.hermes.install import cli_profile_name, find_hermes_cli, profile_home
from hermes_actors.hermes.plugin import HOST_KEY, PLATFORM_NAME
from hermes_actors.hermes.recorded_edits import (
    RecordedEditor,
    SetupError,
    SetupReport,
    SetupStopped,
    check_record_writable,
    load_record,
    read_yaml,
    record_path,
    save_record,
    value_at,
)
from hermes_actors.hermes.sessions import BotChatError, ensure_bot_chat
from hermes_actors.hermes.submit_client import lock_holder, ping
from hermes_actors.hermes.warm_or_cli import API_SERVER_START_SECONDS
from hermes_actors.ops.http_config import MAX_PORT, check_port
from hermes_actors.store.hermes_root import MANAGED_KEY, discover_profiles, existing_root
from hermes_actors.store.processes import process_started_at

__all__ = [
    "PLUGIN_NAME", "api_server_port", "connect_order", "disable", "enable", "gateway_hosts_actors", "gateway_todo",
    "platform_block_keys",
]

PLUGIN_NAME = "hermes-actors"
_LISTED = 5  # profile names a report line lists before "and N more"


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


def api_server_port(port: int | None, *, gateway: bool) -> int | None:
    """Pure: the ``--port`` enable may write into ``platforms.api_server.extra.port``.

    Args:
        port: the port asked for (None: keep the configured one, or 8642 for a new block).
        gateway: whether ``--gateway`` was given (only it configures the API server).

    Returns:
        The port, or None.

    Raises:
        SetupError: a port without ``--gateway`` (it would be ignored), out of 1-65535, or 0.
    """
    if port is None:
        return None
    if not gateway:
        raise SetupError(f"--port {port} needs --gateway: the port is the hermes API server's, which only "
                         "`enable --gateway` configures (add --gateway, or leave --port out)")
    if port == 0:  # hermes would bind any free port; the config then names none a client could reach
        raise SetupError(f"--port 0 names no port: the API server would take any free one, while hermes-actors "
                         f"and the bots reach it at the port config.yaml names; pass one from 1 to {MAX_PORT} "
                         f"(default {DEFAULT_API_PORT})")
    try:
        return check_port(port, f"--port {port}", lowest=1)
    except ValueError as exc:
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


def _names(names: Iterable[str]) -> str:
    """Pure: the profile names a refusal lists, as given (a huge one cut, with its length: ``core.clipping``)."""
    return ", ".join(shown(name, name) for name in names)


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
        raise SetupError(f"no such profile on {root}: {_names(unknown)} (known: {', '.join(known)})")
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
        port: the API server's port (1-65535, with ``gateway`` only): the one a new API server block gets
            (default 8642), and when given, set in an existing one too (an earlier ``enable --gateway`` wrote 8642).
        cli: the hermes executable (creates a fresh ``state.db``); found when None.
        env: the environment to check for ``API_SERVER_KEY`` (``os.environ`` when None).

    Returns:
        The report.

    Raises:
        SetupError: a bad ``port`` (:func:`api_server_port`), the root or a named profile does not exist, or
            a file cannot be edited safely.
        HostileFileError, OSError: a file cannot be read, or a directory an edited file (or the record) is in
            cannot be written in. Like a SetupError, before anything is written.
        SetupStopped: a write failed part-way; its report says what was changed and how to undo it.
    """
    port = api_server_port(port, gateway=gateway)  # an argument error first: nothing is read or written
    root = _root(root)
    report = SetupReport()
    record = load_record(root)
    editor = RecordedEditor(root, report)
    hermes_cli = find_hermes_cli(cli)
    # every file is read and every edit planned before anything is written: a refusal writes nothing
    homes = [(profile, profile_home(root, profile)) for profile in _chosen(root, profiles, report)]
    for _profile, home in homes:
        editor.set_default(home / "profile.yaml", ["ui_meta", MANAGED_KEY], {})
        editor.list_add(home / "config.yaml", ["plugins", "enabled"], PLUGIN_NAME)
    if gateway:
        _configure_gateway(editor, root / "config.yaml", port, report)
    editor.check_writable()
    if editor.planned():
        check_record_writable(root)
    _write("enable", root, editor, lambda: record + editor.written if editor.written else None, report)
    for profile, home in homes:
        try:
            session, created = ensure_bot_chat(home, cli=hermes_cli)
        except BotChatError as exc:
            report.todo.append(f"{profile}: create its 'Bot Chat' session ({exc})")
        else:
            if created:
                report.changed.append(f"{home / 'state.db'}: created the 'Bot Chat' session {session}")
    # what enable writes that a running hermes gateway reads only at its start: the root's config.yaml (its
    # platforms, and the plugins it loads for every profile it multiplexes). Changed by this run, or by an earlier
    # one (or by hand) since that gateway started: a restart is due either way. A profile's own config.yaml (its
    # plugins.enabled, its model) is read per turn: no restart for it, which would end a warm turn `ambiguous`
    config = root / "config.yaml"
    config_changed = config in editor.files_written or written_since_start([config], gateway_pid(root))
    _add_todo(root, report, gateway=gateway, env=env, cli=hermes_cli, config_changed=config_changed)
    return report


def _write(command: str, root: Path, editor: RecordedEditor,
           record: Callable[[], list[dict[str, Any]] | None], report: SetupReport) -> None:
    """Write the planned edits, then the record as ``record()`` makes it from what was written (None: unchanged).

    Raises:
        SetupStopped: a write failed part-way (its cause is the error): the report says what was changed and how
            to undo it (``disable``, or by hand when the record could not be written).
        HostileFileError, OSError: the first write failed: nothing was changed.
    """
    saved = False
    try:
        try:
            editor.write()
        finally:
            entries = record()
            if entries is not None:
                save_record(root, entries)
            saved = True
    except (OSError, ValueError) as exc:
        if not report.changed:
            raise
        report.changed = _once(report.changed)
        again = shell_command("hermes-actors", command, "--root", root)
        if not saved:
            report.todo.append(f"{command} stopped part-way (the error below) and could not write its record "
                               f"{record_path(root)}: disable cannot undo the changes above; undo them by hand")
        elif command == "enable":
            report.todo.append(f"enable stopped part-way (the error below): fix it and run {again} again, or undo "
                               f"the changes above with {shell_command('hermes-actors', 'disable', '--root', root)}")
        else:
            report.todo.append(f"disable stopped part-way (the error below): fix it and run {again} again to undo "
                               "the rest")
        raise SetupStopped(report, exc) from exc


_API = "api_server"
_TOP = ["platforms"]
_NESTED = ["gateway", "platforms"]  # hermes 0.19 reads platform blocks here too (gateway/config.py)
_MULTIPLEX = ["multiplex_profiles"]


def _platform_maps(config: Mapping[str, Any]) -> list[tuple[list[str], Mapping[str, Any]]]:
    """Pure: the platform maps of a root's ``config.yaml`` that are mappings, as hermes 0.19 merges them: those
    under ``gateway.platforms`` first, then the top-level ``platforms`` (whose blocks win)."""
    maps: list[tuple[list[str], Mapping[str, Any]]] = []
    for keys in (_NESTED, _TOP):
        found = value_at(dict(config), keys)
        if isinstance(found, dict):
            maps.append((keys, found))
    return maps


def platform_block_keys(config: Mapping[str, Any], name: str, beside: str) -> list[str]:
    """Pure: where ``enable --gateway`` edits the platform block ``name`` in a root's ``config.yaml``.

    hermes 0.19 reads platform blocks from ``platforms`` and from ``gateway.platforms`` (a block in both is merged,
    the top level's keys winning): a block the user has is edited where it is, and a new one goes beside the
    other block of ours when that one is under ``gateway.platforms`` only, else under ``platforms``. A block that
    is no mapping (``api_server: null``) is skipped, as hermes skips it.

    Args:
        config: the root's ``config.yaml`` mapping.
        name: the block (``api_server`` or ``hermes_actors``).
        beside: the other block of ours.

    Returns:
        The key path of the block, e.g. ``["gateway", "platforms", "api_server"]``.
    """
    maps = _platform_maps(config)
    for keys, found in reversed(maps):  # the top level first: its keys win (a block that is no mapping: skipped)
        if isinstance(found.get(name), dict):
            return [*keys, name]
    holders = [keys for keys, found in maps if isinstance(found.get(beside), dict)]
    return [*(_NESTED if holders == [_NESTED] else _TOP), name]


def gateway_hosts_actors(config: Mapping[str, Any]) -> bool:
    """Pure: whether a root's ``config.yaml`` asks its hermes gateway to host the actors, as ``enable --gateway``
    writes it: the ``hermes_actors`` platform block (where :func:`platform_block_keys` finds it) switched on, with
    ``extra.host_actors: true`` (:func:`hermes_actors.hermes.plugin.hosting_configured`'s marker).

    Args:
        config: the root's ``config.yaml`` mapping.

    Returns:
        True when it does.
    """
    block = value_at(dict(config), platform_block_keys(config, PLATFORM_NAME, _API))
    if not isinstance(block, dict):
        return False
    extra = block.get("extra")
    return hermes_true(block.get("enabled")) and isinstance(extra, dict) and extra.get(HOST_KEY) is True


def connect_order(config: Mapping[str, Any]) -> list[str]:
    """Pure: the platform blocks of a root's ``config.yaml`` in the order ``hermes gateway run`` (0.19) connects
    them: its loader merges the blocks under ``gateway.platforms`` first, then adds the top level's new ones, and
    it skips a block that is no mapping. (A platform enabled only by the environment, such as the API server by
    ``API_SERVER_KEY`` or ``API_SERVER_ENABLED``, has no block: hermes connects it after all of these.)

    Args:
        config: the root's ``config.yaml`` mapping.

    Returns:
        The platform names, first connected first.
    """
    order: list[str] = []
    for _keys, found in _platform_maps(config):
        order += [name for name, block in found.items() if isinstance(block, dict) and name not in order]
    return order


def _configure_gateway(editor: RecordedEditor, config: Path, port: int | None, report: SetupReport) -> None:
    """``enable --gateway``'s edits of the root's ``config.yaml``: the API server, our platform, multiplexing,
    the API server's block before ours (or a "to do" line when only the user can put it there)."""
    data = editor.data(config)
    api = platform_block_keys(data, _API, PLATFORM_NAME)
    ours = platform_block_keys(data, PLATFORM_NAME, _API)
    # a null block is no block to hermes (it skips it): replaced like a missing one (`disable` puts the null back)
    editor.set_default(config, api, {"enabled": True, "extra": {"host": "127.0.0.1",
                                                                "port": DEFAULT_API_PORT if port is None else port}},
                       replace=None)
    where = [*api, "extra", "port"]
    current = value_at(editor.data(config), where)
    if port is not None and current != port:  # named: that port, whatever an earlier enable set
        editor.set_default(config, where, port, replace=current)
    # `enable --gateway` is the ask to serve and host: a switch hermes reads as off (false, 'no', 'off', null, ...)
    # is switched on (`disable` puts the user's value back), else the gateway it says to start would not serve
    editor.switch_on(config, [*api, "enabled"], hermes_true)
    editor.set_default(config, ours, {"enabled": True, "extra": {HOST_KEY: True}}, replace=None)
    editor.switch_on(config, [*ours, "enabled"], hermes_true)
    editor.set_default(config, [*ours, "extra", HOST_KEY], True)
    # hermes reads a top-level multiplex_profiles (even null) before gateway.multiplex_profiles: edited where read
    editor.switch_on(config, _MULTIPLEX if _MULTIPLEX[-1] in editor.data(config) else ["gateway", *_MULTIPLEX],
                     hermes_true)
    # hermes connects platforms in the order it reads them: the actors' runner, chosen as our platform connects,
    # then finds the API server up (a block of ours from before, e.g. left with enabled: false by disable, came
    # first and the new api_server block after it)
    if api[:-1] == ours[:-1]:
        editor.move_after(config, ours[:-1], PLATFORM_NAME, _API,
                          "hermes connects platforms in this order: the API server is up when the actors start")
    order = connect_order(editor.data(config))
    if PLATFORM_NAME in order and _API in order and order.index(PLATFORM_NAME) < order.index(_API):
        report.todo.append(
            f"{config}: hermes connects the {PLATFORM_NAME} platform before the {_API} one (it reads the blocks "
            "under gateway.platforms before those under platforms): list api_server first, both blocks under "
            "gateway.platforms or both under platforms, so the API server is up when the actors start (until then "
            f"a turn right after the gateway's start waits for it, up to {API_SERVER_START_SECONDS:g} s)")


def _add_todo(root: Path, report: SetupReport, *, gateway: bool, env: dict[str, str] | None, cli: str | None,
              config_changed: bool) -> None:
    if cli is None:
        report.todo.append("install hermes-agent (pip install 'hermes-actors[hermes]') — no hermes CLI was found")
    if gateway:
        # the API server hermes starts with the config just written, read as hermes reads it
        planned = read_gateway_api_server(root, read_yaml(root / "config.yaml"),
                                          env if env is not None else dict(os.environ))
        if planned.why:
            report.todo.append(f"{root / 'config.yaml'}: the hermes gateway starts no API server: {planned.why}")
        elif planned.enabled and not planned.key_usable:
            report.todo.append(
                f"set API_SERVER_KEY (at least {MIN_KEY_CHARS} characters, e.g. `openssl rand -hex 32`) in "
                f"{root / '.env'} — the hermes API server refuses to start without it"
            )
        if not planned.multiplex:  # config.yaml says multiplex_profiles: true now; something hermes reads first not
            report.todo.append(
                f"the hermes gateway does not multiplex profiles, which warm turns need (without it every turn would "
                f"run as the default profile): GATEWAY_MULTIPLEX_PROFILES in its environment or in {root / '.env'}, "
                f"or multiplex_profiles in {root / 'gateway.json'}, says it is off; remove it or set it to true"
            )
        start = gateway_todo(root, gateway_pid(root), config_changed=config_changed)
        if start is not None:
            report.todo.append(start)
    elif ping(root) is None:
        report.todo.append(f"start the actors: {shell_command('hermes-actors', 'serve', '--root', root)}")
    # else a host already serves the root: its roster takes the managed profiles within its rescan


def written_since_start(configs: Iterable[Path], running: int | None) -> bool:
    """Whether one of ``configs`` was written after the running hermes gateway ``running`` started: it still runs
    with the settings it read before, so its restart is due (whoever wrote them: an earlier ``enable`` whose
    advice was not followed yet, or an edit by hand).

    Args:
        configs: the files the gateway reads only at its start (the root's ``config.yaml``).
        running: its pid (None: no gateway runs).

    Returns:
        False when no gateway runs or each file is older than its start (or missing); True when one is newer, or
        when its start time cannot be read (the restart is then advised, as it always was).
    """
    if running is None:
        return False
    started = process_started_at(running)
    if started is None:
        return True
    for path in configs:
        try:
            if os.stat(path).st_mtime > started:
                return True
        except OSError:
            continue
    return False


def gateway_todo(root: Path, running: int | None, *, config_changed: bool = True) -> str | None:
    """Pure: the "to do" line of ``enable --gateway`` that starts the hermes gateway with the config it wrote.

    A gateway already running read its ``config.yaml`` at its start, and a second plain ``hermes gateway run``
    exits at once ("Another gateway instance is already running"): it is restarted with ``--replace``, but only
    when the root's ``config.yaml`` changed (this run, or since that gateway started): restarting it for nothing
    would end a warm turn in progress (``ambiguous``).

    Args:
        root: the Hermes root (the gateway's ``HERMES_HOME``).
        running: the pid of the root's running hermes gateway (``gateway.pid``), or None.
        config_changed: the root's ``config.yaml`` (what the gateway reads at its start; a profile's own is
            read per turn) was written by this run, or since the gateway started.

    Returns:
        The line, with the command to run as printed; None when the running gateway has nothing new to read.
    """
    if running is None:
        return f"start the gateway: {shell_command('hermes', 'gateway', 'run', env={'HERMES_HOME': root})}"
    if not config_changed:
        return None
    return (f"restart the hermes gateway that runs (pid {running}; it read config.yaml at its start, and a second "
            "`hermes gateway run` would exit: \"Another gateway instance is already running\"): "
            + shell_command("hermes", "gateway", "run", "--replace", env={"HERMES_HOME": root}))


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
        The report. The edits are made even while a host still serves the root. Its first "to do" says
        what stays served: with no profile managed any more, that host (its pid), to stop; with some
        still managed, the disabled profiles, which stay on the roster and receive DMs.

    Raises:
        SetupError: the record or an edited file cannot be read safely (before anything is written).
        HostileFileError, OSError: as for :func:`enable`, before anything is written.
        SetupStopped: a write failed part-way; its report says what was undone, and the record keeps the rest.
    """
    root = _root(root)
    report = SetupReport()
    record = load_record(root)
    host = lock_holder(root)  # as serve finds another host: the holder of submit.lock, answering or not
    if profiles is None:
        selected = list(record)
    else:
        chosen = _named(root, profiles)
        recorded = {str(Path(str(e["file"])).parent) for e in record}
        known = {info.profile for info in discover_profiles(root)}
        unknown = [p for p in chosen if p not in known and _home_key(root, p) not in recorded]
        if unknown:
            raise SetupError(
                f"no such profile on {root}, nor in what enable recorded: {_names(unknown)} "
                f"(known: {', '.join(sorted(known))})"
            )
        homes = {_home_key(root, p) for p in chosen}
        selected = [e for e in record if str(Path(str(e["file"])).parent) in homes
                    and not (e["file"] == "config.yaml" and e["keys"][0] in ("platforms", "gateway"))]
    kept = [e for e in record if e not in selected]
    editor = RecordedEditor(root, report)
    for entry in reversed(selected):  # every file read and every undo planned first: a refusal writes nothing
        editor.undo(entry)
    if selected:
        editor.check_writable()
        check_record_writable(root)
    undone = {id(e) for e in selected}

    def remaining() -> list[dict[str, Any]] | None:
        """The record once the written files' undos are done (an undo that was not needed goes too)."""
        if not selected:
            return None
        pending = {id(e) for e in editor.planned()}
        return [e for e in record if id(e) not in undone or id(e) in pending]

    _write("disable", root, editor, remaining, report)
    # Enable records each change of a key (`--port 9000`, later `--port 9001`): undone newest first,
    # each says the same "restored" (or "changed since enable") line; say it once.
    report.changed, report.todo = _once(report.changed), _once(report.todo)
    yamls = _profile_yamls(selected)
    gateway = any(e["file"] == "config.yaml" and e["keys"][0] in ("platforms", "gateway") for e in selected)
    # a running gateway read its platforms at start: it hosts (and refuses every DM) until restarted
    restart = shell_command("hermes", "gateway", "run", "--replace", env={"HERMES_HOME": root}) if gateway else None
    hosting = host is not None and host == gateway_pid(root)  # the host is that gateway: one instruction for both
    served = _still_served(root, yamls, host, restart=restart if hosting else None) if selected else None
    if served is not None:
        report.todo.insert(0, served)
    if selected:
        report.todo.append("the 'Bot Chat' sessions, and the rooms' 'Group: <name>' ones, were kept (they hold "
                           "conversations; delete them in hermes if you want them gone)")
        # the record is what makes bot_relay/ ours: say it once nothing is left of it, by --profiles naming them all too
        report.todo.extend(_left_to_remove(root, _undone_files(selected), _created_files(selected),
                                           everything=not kept, gateway=gateway))
    if restart is not None and not (served is not None and restart in served):  # not said by the host's line
        report.todo.append(f"restart the hermes gateway if one runs, so it stops hosting the actors: {restart}")
    return report


def _undone_files(undone: list[dict[str, object]]) -> list[str]:
    """Pure: the files (relative to the root) the undone record entries edited, each once, in record order."""
    return list(dict.fromkeys(str(e["file"]) for e in undone))


def _created_files(undone: list[dict[str, object]]) -> set[str]:
    """Pure: the files (relative to the root) the enable record says enable created (an entry's ``file_created``)."""
    return {str(e["file"]) for e in undone if e.get("file_created") is True}


def _profile_yamls(undone: list[dict[str, object]]) -> list[str]:
    """Pure: the ``profile.yaml`` files (relative to the root) the undone record entries edited, each once, in
    record order.

    Args:
        undone: the record entries just undone.

    Returns:
        Their paths as the record names them (``profiles/<id>/profile.yaml``, ``profile.yaml`` for the root's).
    """
    return [name for name in _undone_files(undone) if Path(name).name == "profile.yaml"]


def _still_served(root: Path, yamls: list[str], host: int | None, *, restart: str | None = None) -> str | None:
    """What a disable leaves served: the "to do" line that says so, or None (nothing worth saying).

    The gate is the install's, as in Bot Mode (docs/hermes.md): while any profile stays managed, every
    profile of the root is a teammate and receives DMs, the ones just disabled too (a running host
    sees the flags at its next rescan, as it sees any ``profile.yaml`` change); once none is, a host
    still serving the root refuses every DM until it stops.

    Args:
        root: the Hermes root, its files as the undo left them.
        yamls: the ``profile.yaml`` files the undone entries edited (:func:`_profile_yamls`).
        host: the pid of the host still serving the root (``submit.lock``'s holder), or None.
        restart: when the host is the hermes gateway and this disable undid its hosting settings, the command that
            restarts it: it is then restarted (it stops hosting the actors, and goes on serving what else it
            serves), not stopped, in one instruction.

    Returns:
        The line: stop (or restart) the host (none managed now, a host runs), or which undone profiles still
        receive DMs and why (some profile still managed); None when no host runs and none is managed.
    """
    profiles = discover_profiles(root)
    managed = [p.profile for p in profiles if p.managed]
    if not managed:
        if host is None:
            return None
        refuses = "it refuses every DM (\"This install is not Bot-Mode-managed\")"
        if restart is not None:
            return (f"restart the hermes gateway that hosts the actors of {root} (pid {host}), so it stops hosting "
                    f"them (until then {refuses}): {restart}")
        # uninstall step 1 stops it first: once no profile is managed, it refuses every DM it is handed
        return (f"stop the host that still serves {root} (pid {host}: `hermes-actors serve`, or `hermes gateway "
                f"run` hosting the actors): until it stops {refuses}")
    flagged = {str(Path(name).parent) for name in yamls}
    unmanaged = [p.profile for p in profiles if not p.managed and _home_key(root, p.profile) in flagged]
    if not unmanaged:  # no managed flag undone (one changed since enable stays: said already)
        return None
    served = (f"the host serving {root} (pid {host}) keeps serving {'it' if len(unmanaged) == 1 else 'them'}, "
              "no restart needed" if host is not None else "once a host serves the root")
    keep = "keeps" if len(managed) == 1 else "keep"
    return (f"{_some(unmanaged)}: no longer managed, so no message_agent tool (cannot send DMs), but still on the "
            f"roster and receiving DMs ({served}): {_some(managed)}, still managed, {keep} the root a Bot Mode "
            "install, where every profile is a teammate. To refuse every DM, disable the rest too: "
            + shell_command("hermes-actors", "disable", "--root", root))


def _some(names: list[str]) -> str:
    """Pure: profile names a report line lists, the first few only (a root may have thousands)."""
    listed = _names(names[:_LISTED])
    return listed if len(names) <= _LISTED else f"{listed} and {len(names) - _LISTED} more"


def _left_to_remove(root: Path, files: list[str], created: set[str], *, everything: bool, gateway: bool) -> list[str]:
    """What disable leaves that is the user's to remove by hand (uninstall step 3 in docs/hermes.md).

    Args:
        root: the Hermes root.
        files: the files the undone entries edited (:func:`_undone_files`).
        created: those of them enable created (:func:`_created_files`): a file the user had, even one holding
            only comments, is theirs, never said to be enable's.
        everything: the whole record is undone now (no ``--profiles``, or profiles naming every recorded
            edit): ``bot_relay/`` is no longer ours.
        gateway: the gateway's settings were undone (``enable --gateway``'s).

    Returns:
        The "to do" lines: each ``profile.yaml`` or ``config.yaml`` enable created that is now ``{}``, each
        ``.before-hermes-actors`` copy enable kept of them, ``API_SERVER_KEY`` in the root's ``.env``, and
        ``bot_relay/``.
    """
    emptied = []
    for name in files:
        if name not in created:
            continue
        try:
            if read_yaml(root / name) == {}:
                emptied.append(str(root / name))
        except SetupError:  # no longer readable (changed since the undo wrote it): nothing to say of it
            continue
    lines = [f"{path} is now {{}} (enable created it): remove it if you want" for path in emptied]
    for name in files:
        kept = root / f"{name}.before-hermes-actors"
        if kept.is_file() and not kept.is_symlink():
            lines.append(f"{kept} was kept (the copy enable made of {root / name} before rewriting it without its "
                         "comments): take back what you want from it, then remove it")
    if gateway:
        lines.extend(_api_key_left(root))
    if everything:
        lines.append(f"{root / 'bot_relay'} was kept (the journal, relay directories, turn locks, quarantine): "
                     "remove it if you want, once no host runs")
    return lines


def _api_key_left(root: Path) -> list[str]:
    """The "to do" line for an ``API_SERVER_KEY`` the root's ``.env`` still sets once the gateway settings are undone
    (the user set it for ``enable --gateway``'s warm turns): hermes enables its API server from that key alone."""
    env = root / ".env"
    dotenv = read_root_dotenv(env)
    if not (dotenv.scope.get("API_SERVER_KEY") or dotenv.loaded.get("API_SERVER_KEY")):
        return []
    try:
        planned = read_gateway_api_server(root, read_yaml(root / "config.yaml"), {})
    except SetupError:  # the root's config.yaml no longer reads: what hermes does with the key cannot be told
        starts = ""
    else:
        starts = (f": the hermes gateway still starts its API server ({planned.address()}) with it at its next "
                  "start" if planned.starts else "")
    return [f"API_SERVER_KEY is still set in {env}{starts}; remove it if you set it for warm turns only"]


def _once(lines: list[str]) -> list[str]:
    """Pure: ``lines`` without repeats, in the order first said."""
    return list(dict.fromkeys(lines))
