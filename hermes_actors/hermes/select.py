"""Choosing the runner for a root: warm turns when a gateway's API server serves it, else the CLI.

Discovery follows hermes-agent 0.19's own gateway config resolution
(``gateway/config.py``): ``platforms.api_server`` (top level, or under
``gateway.platforms``) in ``<root>/config.yaml`` with ``enabled: true`` and
``extra: {host, port, key}``; the variables ``API_SERVER_HOST``,
``API_SERVER_PORT`` and ``API_SERVER_KEY`` (our environment, then
``<root>/.env``, which hermes loads) win over ``extra``. Multiplexing
(``gateway.multiplex_profiles`` or ``GATEWAY_MULTIPLEX_PROFILES``) must be on:
without it the ``/p/<profile>/`` prefix is ignored and every turn would run as
the default profile. A quick ``GET /health`` and an authenticated session
listing confirm the server before it is used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loguru import logger

from hermes_actors.core.config import load_yaml_file
from hermes_actors.hermes.api_client import ApiServer, ApiServerProblem, api_server_problem
from hermes_actors.hermes.api_runner import ApiRunner
from hermes_actors.hermes.cli_runner import HermesCliRunner
from hermes_actors.hermes.gateway_process import gateway_pid
from hermes_actors.hermes.warm_or_cli import API_SERVER_START_SECONDS, WarmOrCliRunner, cli_at_start_text
from hermes_actors.local.runners import TurnRunner

__all__ = [
    "WARM_ANSWER_SECONDS", "ApiServerProblem", "api_server_needs_key", "api_server_of", "api_server_problem",
    "default_runner", "probe_api_server", "read_dotenv",
]

DEFAULT_API_HOST = "127.0.0.1"
DEFAULT_API_PORT = 8642
MIN_KEY_CHARS = 16
WARM_ANSWER_SECONDS = 24 * 3600.0  # how long a warm turn's chat request waits for hermes' answer
_TRUTHY = frozenset({"1", "true", "yes", "on"})
_DOTENV_MAX = 256 * 1024


def read_dotenv(path: Path) -> dict[str, str]:
    """The ``KEY=VALUE`` pairs of a ``.env`` file (quotes stripped; comments skipped).

    Args:
        path: the file.

    Returns:
        The pairs; ``{}`` when missing, unreadable, a symlink or over 256 KiB.
    """
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > _DOTENV_MAX:
            return {}
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    pairs: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.removeprefix("export ").split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        pairs[key.strip()] = value
    return pairs


def _truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() in _TRUTHY)


def api_server_of(config: Mapping[str, Any], env: Mapping[str, str]) -> ApiServer | None:
    """Where the gateway of a root serves its API, if its config enables one for us.

    Args:
        config: the root's config.yaml mapping.
        env: the variables hermes would see (our environment over the root's ``.env``).

    Returns:
        The server, or None: the platform is off, multiplexing is off, or
        there is no key of at least 16 characters.
    """
    enabled, key, extra = _api_server_settings(config, env)
    if not enabled or len(key) < MIN_KEY_CHARS:
        return None
    host = str(env.get("API_SERVER_HOST") or extra.get("host") or DEFAULT_API_HOST)
    try:
        port = int(env.get("API_SERVER_PORT") or extra.get("port") or DEFAULT_API_PORT)
    except (TypeError, ValueError):
        return None
    if host in ("0.0.0.0", "::", ""):  # a wildcard bind is reachable on loopback
        host = DEFAULT_API_HOST
    return ApiServer(host=host, port=port, key=key)


def api_server_needs_key(config: Mapping[str, Any], env: Mapping[str, str]) -> bool:
    """Whether the config enables the API server for us but no key of at least 16 characters is set.

    hermes then refuses to start the API server, and every turn runs with the CLI.
    """
    enabled, key, _extra = _api_server_settings(config, env)
    return enabled and len(key) < MIN_KEY_CHARS


def _api_server_settings(config: Mapping[str, Any], env: Mapping[str, str]) -> tuple[bool, str, dict[str, Any]]:
    """``(enabled with multiplexing on, the key, the platform's extra)`` as hermes would resolve them."""
    gateway = config.get("gateway") if isinstance(config.get("gateway"), dict) else {}
    assert isinstance(gateway, dict)
    block: dict[str, Any] = {}
    for platforms in (gateway.get("platforms"), config.get("platforms")):  # top level wins
        if isinstance(platforms, dict) and isinstance(platforms.get("api_server"), dict):
            block = {**block, **platforms["api_server"]}
    extra = block.get("extra") if isinstance(block.get("extra"), dict) else {}
    assert isinstance(extra, dict)
    enabled = _truthy(block.get("enabled")) or _truthy(env.get("API_SERVER_ENABLED", "")) or bool(
        env.get("API_SERVER_KEY")
    )
    multiplex_env = env.get("GATEWAY_MULTIPLEX_PROFILES", "").strip().lower()
    multiplex = _truthy(multiplex_env) if multiplex_env in _TRUTHY | {"0", "false", "no", "off"} else _truthy(
        config.get("multiplex_profiles", gateway.get("multiplex_profiles"))
    )
    key = str(env.get("API_SERVER_KEY") or extra.get("key") or "").strip()
    return enabled and multiplex, key, extra


def probe_api_server(server: ApiServer, timeout: float = 2.0) -> bool:
    """Whether the server answers ``/health`` and accepts the key (:func:`api_server_problem` finds nothing).

    Args:
        server: the server.
        timeout: seconds per request.

    Returns:
        True when ``GET /health`` says ok and ``GET /p/default/api/sessions?limit=1`` is 200.
    """
    return api_server_problem(server, timeout) is None


def default_runner(
    root: Path,
    config: Mapping[str, Any] | None = None,
    *,
    cli: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> TurnRunner:
    """The real Hermes runner for a root, chosen automatically.

    Args:
        root: the Hermes root.
        config: the root's config.yaml mapping (read from disk when None).
        cli: the hermes executable for CLI turns (found when None).
        env: the environment hermes sees (``os.environ`` when None); also
            passed to CLI turns.
        timeout: seconds one turn may take.

    Returns:
        A :class:`WarmOrCliRunner` when the root's config names a gateway's API server
        (warm turns while it answers, the CLI while it does not; inside that very gateway, turns
        wait up to ``API_SERVER_START_SECONDS`` for a server still starting), else a :class:`HermesCliRunner`.
    """
    root = Path(root)
    hermes_config = dict(config) if config is not None else load_yaml_file(root / "config.yaml")
    seen_env = {**read_dotenv(root / ".env"), **(dict(env) if env is not None else dict(os.environ))}
    server = api_server_of(hermes_config, seen_env)
    runner = HermesCliRunner(cli, timeout=timeout, env=dict(env) if env is not None else None)
    if server is None:
        logger.info("turns on {} run with the hermes CLI {}", root, runner.cli)
        return runner
    problem = api_server_problem(server)
    # The chat request stays open until hermes answers (a turn reported timed out still runs there).
    warm = ApiRunner(server, timeout=max(timeout, WARM_ANSWER_SECONDS))
    if problem is None:
        logger.info("turns on {} run warm through the hermes API server {} (with the hermes CLI {} while it "
                    "does not answer)", root, server, runner.cli)
    elif not problem.misconfigured and gateway_pid(root) == os.getpid():
        # Hosted in that very gateway, whose API server may connect after our platform (config.yaml lists ours
        # first): turns wait for it rather than run on the CLI; one that never answers is WarmOrCliRunner's warning
        logger.info("turns on {} wait up to {:g} s from now for the hermes API server {} this hermes gateway is "
                    "starting, then run warm (with the hermes CLI {} if it does not answer by then)", root,
                    API_SERVER_START_SECONDS, server, runner.cli)
        return WarmOrCliRunner(warm, runner, await_server=API_SERVER_START_SECONDS)
    else:
        # Said once, at the start: turns would otherwise run as CLI turns without a word (seen only with -v);
        # later changes each way are WarmOrCliRunner's "warm turns stopped" warning and its info line
        logger.warning(cli_at_start_text(server, problem, root, runner.cli, in_gateway=False))
    return WarmOrCliRunner(warm, runner, cold=problem is not None)
