"""``hermes-actors doctor``: check what Bot Mode on a root needs, and say how to fix each problem.

The facts are gathered here (files, the ``hermes`` CLI, the submit endpoint,
Redis); each verdict is a pure function of them in
:mod:`hermes_actors.ops.doctor_checks`.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hermes_actors.core.config import parse_config
from hermes_actors.hermes.install import CLI_PROFILE_RE, find_hermes_cli, model_name, names_no_model, profile_home
from hermes_actors.hermes.setup import PLUGIN_NAME, gateway_hosts_actors
from hermes_actors.ops.doctor_checks import (
    BLOCK,
    Check,
    check_cli,
    check_config_keys,
    check_connection_ids,
    check_daemon,
    check_journal,
    check_managed,
    check_models,
    check_peers,
    check_plugin,
    check_profile_folders,
    check_redis,
    check_redis_extra,
    check_relay_dirs,
    check_warm_turns,
    for_the_hosts_runner,
)
from hermes_actors.ops.remote_roster import read_remote_roster
from hermes_actors.relay.strays import owned_directories, start_refusal
from hermes_actors.store.hermes_root import discover_profiles, existing_root, scan_profile_dirs
from hermes_actors.store.journal_screen import journal_files_found
from hermes_actors.store.private_dir import loose_private_dir
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.store.yaml_file import read_yaml_mapping
from hermes_actors.transports.peer_cli import peer_command_missing

__all__ = ["run_doctor"]

_VERSION_TIMEOUT = 20.0


def _cli_version(cli: str) -> tuple[str | None, str | None]:
    """(version, error) of ``cli --version``."""
    try:
        done = subprocess.run([cli, "--version"], capture_output=True, text=True, timeout=_VERSION_TIMEOUT,
                              check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    text = (done.stdout or done.stderr).strip().splitlines()
    if done.returncode != 0:
        return None, f"`{cli} --version` exited {done.returncode}: {text[0] if text else ''}".rstrip(": ")
    return (text[0] if text else None), None


def _profile_facts(home: Path) -> tuple[bool | None, str | None, str | None]:
    """Whether the profile's config.yaml lists the plugin, the model it names as hermes reads it
    (:func:`~hermes_actors.hermes.install.model_name`; ``"(completed by hermes)"`` for a section with only a
    provider or a base URL, ``""`` for none), and None; (None, None, why) when that file does not read (``why``:
    :func:`~hermes_actors.store.yaml_file.read_yaml_mapping`'s line, the one the ``config keys`` check shows)."""
    data, problem = read_yaml_mapping(home / "config.yaml")
    if problem:
        return None, None, problem
    plugins = data.get("plugins")
    enabled = plugins.get("enabled") if isinstance(plugins, dict) else None
    named = model_name(data) or ("" if names_no_model(data) else "(completed by hermes)")
    return isinstance(enabled, list) and PLUGIN_NAME in enabled, named, None


def _warm_facts(root: Path, raw: dict[str, Any]) -> tuple[str | None, bool, bool, str, bool, str, bool]:
    """The API server the root's hermes gateway starts for warm turns (as hermes 0.19 reads its settings:
    :mod:`hermes_actors.hermes.gateway_api`), whether it answers, whether only its key is missing, when it does not
    answer as expected what the probe saw and whether that is a misconfiguration, why hermes starts none though
    something asks for one, and whether it answers all the same (started with settings we cannot see: the
    environment ``hermes gateway run`` was started with, an ``API_SERVER_KEY`` there)."""
    from hermes_actors.hermes.gateway_api import read_gateway_api_server
    from hermes_actors.hermes.gateway_process import gateway_pid
    from hermes_actors.hermes.select import api_server_problem

    planned = read_gateway_api_server(root, raw, dict(os.environ))
    server = planned.server()
    if server is None:
        if planned.key_missing and planned.multiplex and gateway_pid(root) is not None:
            # what we read says hermes starts none for want of a key; the root's running hermes gateway, started
            # with API_SERVER_KEY in its own environment, runs one all the same (with an api_server block, a key
            # missing from it comes from the process environment): probed as a warm turn waiting for it probes it
            # (/health: no key needed). Only then: without that gateway, whatever answers there is not its server
            target = planned.address()
            if api_server_problem(target, key_known=False) is None:
                return str(target), True, planned.key_missing, "", False, planned.why, True
        return None, False, planned.key_missing, "", False, planned.why, False
    problem = api_server_problem(server)
    if problem is None:
        return str(server), True, False, "", False, "", False
    return str(server), False, False, problem.text, problem.misconfigured, "", False


def run_doctor(
    root: str | Path, *, cli: str | None = None, ping: Callable[[Path], dict[str, Any] | None] | None = None
) -> list[Check]:
    """Run every check on ``root``.

    Args:
        root: the Hermes root.
        cli: the hermes executable (default: found as the runner finds it).
        ping: how to reach the submit endpoint (default :func:`hermes_actors.hermes.submit.ping`).

    Returns:
        The checks, in a fixed order.

    Raises:
        FileNotFoundError: ``root`` is not a directory.
    """
    root = existing_root(root)
    if ping is None:
        from hermes_actors.hermes.submit import ping as submit_ping

        ping = submit_ping
    found = find_hermes_cli(cli)
    version, error = _cli_version(found) if found else (None, None)
    profiles = discover_profiles(root)
    # every profile on the roster receives DMs (managed or not); the plugin matters to the managed ones
    facts = {p.profile: _profile_facts(profile_home(root, p.profile)) for p in profiles
             if p.managed or CLI_PROFILE_RE.match(p.profile)}
    managed = {p.profile for p in profiles if p.managed}
    enabled = {name: plugin for name, (plugin, _model, _why) in facts.items() if name in managed}
    unread = {name: why for name, (_plugin, _model, why) in facts.items() if why is not None}
    path = root / "config.yaml"
    raw, problem = read_yaml_mapping(path)
    pong = ping(root)
    checks = [
        check_cli(found, version, error),
        check_managed(root, profiles),
        check_profile_folders(root, scan_profile_dirs(root)[1]),
        check_plugin(root, enabled, unread),
        check_models(root, {name: model for name, (_plugin, model, _why) in facts.items()}, unread),
        check_daemon(root, pong, gateway_hosts=gateway_hosts_actors(raw)),
        check_journal(*journal_files_found(root), os.getuid()),
        check_config_keys(path, raw, problem),
        check_warm_turns(root, *_warm_facts(root, raw), host=pong),
    ]
    # the roster where the configured transport keeps it; a running host names the connection id it runs as
    roster = read_remote_roster(root, raw, connection_id=(pong or {}).get("connection_id") or None)
    if roster.transport == "invalid":
        checks.append(Check("redis", BLOCK, roster.where, "set bot_mode.transport to file, redis://… or rediss://…"))
    else:
        installed = importlib.util.find_spec("redis") is not None
        checks.append(check_redis_extra(roster.transport == "redis", installed))
        if roster.transport == "redis" and installed:
            checks.append(check_redis(roster.where, roster.error))
    if roster.error is None:  # an unreachable Redis is the redis check's: no roster to compare
        checks.append(check_connection_ids(set(roster.own), set(roster.remote), set(roster.routed_as),
                                           on=roster.transport))
        checks.append(_peers_check(parse_config(raw)[0].peers, roster.remote if roster.transport == "redis"
                                   else frozenset(), found))
    paths = InboxPaths.from_root(root)
    refusal = start_refusal(paths, needs=(paths.journal,))  # serve runs durable: the start needs journal/ too
    checks.append(check_relay_dirs(_loose_relay_dirs(root), None if refusal is None else str(refusal)))
    return for_the_hosts_runner(checks, pong)


def _loose_relay_dirs(root: Path) -> dict[Path, int]:
    """The relay directories of ours that their group or other users may write in, and their modes (none changed)."""
    loose: dict[Path, int] = {}
    for directory in owned_directories(InboxPaths.from_root(root)):
        mode = loose_private_dir(directory, within=root, restore=False)
        if mode is not None:
            loose[directory] = mode
    return loose


def _peers_check(peers: tuple[str, ...], on_redis: frozenset[str], cli: str | None) -> Check:
    """The ``bot_peers`` check: the peers that are no connection on Redis go through ``hermes peer dm``, so the
    hermes CLI is asked whether it has that command (only then: it costs a hermes start)."""
    connections = {c.lower() for c in on_redis}  # as the Redis transport matches them
    via_cli = [p for p in peers if p.lower() not in connections]
    missing = peer_command_missing(cli) if via_cli and cli is not None else None
    return check_peers(via_cli, [p for p in peers if p.lower() in connections], cli, missing)
