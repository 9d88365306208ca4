"""What the command's gateway options make: the turn runner of ``--runner``/``--cli`` and the config of ``--redis``.

Shared by every command that may start a gateway of its own (``roster``, ``send``, ``serve``, ``room``); ``doctor``
and ``enable`` refuse a bad ``--cli`` with :func:`check_cli` too.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from hermes_actors.core.clipping import shown

__all__ = ["check_cli", "runner_for", "transport_config"]


def check_cli(cli: str | None) -> None:
    """Refuse a ``--cli`` that names no executable: it would fail every turn (``--runner command``) or be passed
    over for another hermes found beside python or on PATH (the hermes runners), saying nothing.

    Args:
        cli: the ``--cli`` value (None: not given).

    Raises:
        ValueError: naming the value and what to do.
    """
    if cli is not None and shutil.which(cli) is None:
        raise ValueError(f"--cli {shown(cli, cli)}: no executable file by that path or name on PATH; give the "
                         "hermes executable's path, or leave --cli out (it is then found beside python, then on PATH)")


def runner_for(kind: str | None, cli: str | None, root: Path) -> Any:
    """The ``Gateway(runner=...)`` of ``--runner``: None (the real Hermes, chosen at start), ``"demo"`` or a runner.

    Args:
        kind: ``hermes``, ``command`` or ``demo``; None (no ``--runner``) is ``hermes``.
        cli: the ``--cli`` executable (None: found as the runners find it).
        root: the Hermes root (its ``config.yaml`` gives the turn timeout).

    Returns:
        What ``Gateway`` takes as its runner.

    Raises:
        ValueError: ``--cli`` names no executable (it would have been passed over for another hermes, or
            failed every turn).
    """
    if kind == "demo":
        return "demo"
    check_cli(cli)
    from hermes_actors.core.config import load_config

    timeout = load_config(root).turn_timeout_seconds
    if kind in (None, "hermes"):
        if cli is None:
            return None
        from hermes_actors.hermes.select import default_runner

        return default_runner(root, cli=cli, timeout=timeout)
    from hermes_actors.local.command_runner import CommandRunner

    return CommandRunner(cli=cli, timeout=timeout)


def transport_config(args: argparse.Namespace) -> dict[str, Any]:
    """The config overrides of ``--redis`` (empty without it: ``config.yaml`` decides), once ``--connection-id``
    and ``--redis`` are known to be usable: a command calls it before it prints or starts anything.

    Args:
        args: the parsed command line (its ``redis`` and ``connection_id``).

    Returns:
        The overrides to merge into the gateway's config.

    Raises:
        ValueError: ``--connection-id`` is not a connection id, or ``--redis`` selects no Redis server
            (the message names the option, not the config key it stands for).
    """
    if args.connection_id is not None:
        from hermes_actors.core.names import checked_connection_id

        checked_connection_id(args.connection_id)
    if not args.redis:
        return {}
    overrides = {"bot_mode": {"transport": args.redis}}
    _check_redis_option(args.redis, overrides)
    return overrides


def _check_redis_option(value: str, overrides: dict[str, Any]) -> None:
    """Refuse a ``--redis`` the transport would refuse at start, in words about ``--redis``.

    The rule stays the transport's (:func:`redis_url_from_config`, whose URL checks are
    :func:`redis_url_problem`); only its message, which names the ``bot_mode.transport`` key the user
    never typed here, is told again.

    Raises:
        ValueError: not a usable redis://, rediss:// or unix:// URL (scheme, host, port 1-65535, database
            index), or ``redis`` while ``REDIS_URL`` is unset or not usable.
    """
    import os

    from hermes_actors.core.clipping import shown
    from hermes_actors.transports.redis.store import mask_url, redis_url_from_config, redis_url_problem

    try:
        redis_url_from_config(overrides)
    except ValueError:
        text = value.strip()
        if text.lower() != "redis":
            problem = redis_url_problem(text) or "is not a redis://, rediss:// or unix:// URL"
            if problem.startswith("is not a redis://"):
                problem += " (e.g. redis://127.0.0.1:6379/0), nor 'redis' to read REDIS_URL"
            raise ValueError(f"--redis {shown(mask_url(text))} {problem}") from None
        env_url = os.environ.get("REDIS_URL", "").strip()
        if not env_url:
            raise ValueError("--redis redis reads the URL from REDIS_URL, which is not set") from None
        problem = redis_url_problem(env_url) or "is not a redis://, rediss:// or unix:// URL"
        raise ValueError(f"--redis redis reads REDIS_URL, and {shown(mask_url(env_url))} {problem}") from None
