"""Choosing the runner for a root: warm turns when a gateway's API server serves it, else the CLI.

Which API server the root's ``hermes gateway run`` starts is read as hermes-agent 0.19
reads it (:mod:`hermes_actors.hermes.gateway_api`: ``gateway.json``, ``config.yaml``'s
platform blocks and top-level ``api_server:``, the variables, from the root's ``.env``
only when it multiplexes profiles). Multiplexing must be on: without it the
``/p/<profile>/`` prefix is ignored and every turn would run as the default profile.
Where hermes starts none, turns run with the CLI from the start (none waits for it).
A quick ``GET /health`` and an authenticated session listing confirm the server
before it is used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loguru import logger

from hermes_actors.core.config import load_yaml_file
from hermes_actors.core.shell import shell_command
from hermes_actors.hermes.api_client import ApiServer, ApiServerProblem, api_server_problem
from hermes_actors.hermes.api_runner import ApiRunner
from hermes_actors.hermes.cli_runner import HermesCliRunner
from hermes_actors.hermes.gateway_api import read_gateway_api_server
from hermes_actors.hermes.gateway_process import gateway_pid
from hermes_actors.hermes.warm_or_cli import API_SERVER_START_SECONDS, WarmOrCliRunner, cli_at_start_text
from hermes_actors.local.runners import TurnRunner

__all__ = ["WARM_ANSWER_SECONDS", "ApiServerProblem", "api_server_problem", "default_runner", "probe_api_server"]

WARM_ANSWER_SECONDS = 24 * 3600.0  # how long a warm turn's chat request waits for hermes' answer


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
    planned = read_gateway_api_server(root, hermes_config, dict(env) if env is not None else dict(os.environ))
    server = planned.server()
    runner = HermesCliRunner(cli, timeout=timeout, env=dict(env) if env is not None else None)
    if server is None:  # hermes starts no API server for us: no turn waits for one
        if planned.why:
            logger.warning("the hermes gateway of {} starts no API server: {}; turns run with the hermes CLI {} ({} "
                           "says how to fix it)", root, planned.why, runner.cli,
                           shell_command("hermes-actors", "doctor", "--root", root))
        else:
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
