"""What a gateway's constructor arguments and config resolve to before any actor starts.

:class:`SystemOptions` (the Gateway's arguments, resolved), the runner an embedder named
(:func:`explicit_runner`), whether a runner is the real Hermes (:func:`is_real_hermes`) or runs hermes
turns at all (:func:`runs_hermes`), the
Redis transport's settings when the config selects it (:func:`redis_settings_for`), and
:data:`ASK_TIMEOUT`, how long the gateway waits for an actor it asks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes_actors.core.config import BotModeConfig
from hermes_actors.local.command_runner import CommandRunner
from hermes_actors.local.runners import TurnRunner, as_runner
from hermes_actors.transports.peer_cli import PeerCliTransport

__all__ = ["ASK_TIMEOUT", "SystemOptions", "explicit_runner", "is_real_hermes", "redis_settings_for", "runs_hermes"]

ASK_TIMEOUT = 30.0  # how long the gateway waits for an actor it asks


def explicit_runner(runner: Any) -> TurnRunner | None:
    """The runner given to ``Gateway(runner=...)``; None stays None (the real Hermes, chosen at start).

    Raises:
        ValueError: an unknown runner name.
        TypeError: neither a runner nor a callable.
    """
    if runner is None:
        return None
    if isinstance(runner, str):
        if runner == "demo":
            from hermes_actors.demo.bots import DemoRunner

            return DemoRunner()
        raise ValueError(f"unknown runner {runner!r}: pass None (the real Hermes), 'demo', a runner or a callable")
    return as_runner(runner)


def is_real_hermes(runner: Any) -> bool:
    """Whether ``runner`` runs turns on the real Hermes (``bot_mode.wake_sender: auto`` wakes senders then)."""
    return getattr(runner, "real_hermes", False) is True


def runs_hermes(runner: Any) -> bool:
    """Whether ``runner``'s turns run on a hermes: the real Hermes (:func:`is_real_hermes`), or the CLI of a
    release with Bot Mode built in (``--runner command``, :class:`~hermes_actors.local.command_runner.CommandRunner`).

    What a failing turn's advice is about (its model and provider, not the runner the gateway was given), and
    what a host's ``ping`` answers as ``runs_hermes`` (``doctor`` then checks the hermes CLI and the plugin).
    ``bot_mode.wake_sender: auto`` goes by :func:`is_real_hermes` alone.

    Args:
        runner: the gateway's runner (None: the real Hermes, chosen when the gateway starts).
    """
    return runner is None or is_real_hermes(runner) or isinstance(runner, CommandRunner)


def redis_settings_for(cfg: BotModeConfig, connection_id: str | None) -> tuple[Any, str | None]:
    """The Redis transport's settings when ``bot_mode.transport`` selects it, and the connection id.

    Args:
        cfg: the loaded config.
        connection_id: the one the Gateway was given (None: Redis takes ``bot_mode.connection_id``).

    Returns:
        (settings, connection id); settings None: the file relay (the connection id is unchanged).

    Raises:
        ValueError: a bad transport value, or Redis without a valid connection id.
        TransportError: the ``[redis]`` extra is not installed.
    """
    from hermes_actors.core.names import checked_connection_id
    from hermes_actors.transports.redis.io import require_redis
    from hermes_actors.transports.redis.store import redis_settings, redis_url_from_config

    url = redis_url_from_config(cfg.raw)
    if url is None:
        return None, connection_id
    require_redis()
    connection_id = connection_id or cfg.redis.connection_id or None
    if not connection_id:
        raise ValueError("the Redis transport (bot_mode.transport) needs this gateway's connection id, the name "
                         "of its stream on Redis: pass --connection-id NAME (CLI) or Gateway(..., "
                         "connection_id=NAME), or set bot_mode.connection_id in config.yaml")
    return redis_settings(cfg.raw, url), checked_connection_id(connection_id)


@dataclass(frozen=True)
class SystemOptions:
    """How a gateway's actors are built (the Gateway's constructor arguments, resolved)."""

    root: Path
    overrides: dict[str, Any]
    connection_id: str | None
    workers: int
    cross_process_lock: bool
    peer_transport: PeerCliTransport | None
    durable: bool
    fsync: bool
    drive_rooms: bool = True
    host_stopping: Callable[[], bool] | None = None  # the host's stop began: no turn starts (``TurnGates``)
