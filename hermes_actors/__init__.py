"""hermes-actors: Bot Mode agent-to-agent messaging as an actor system on pykka.

    from hermes_actors import Gateway

    with Gateway(root="/path/to/hermes-root") as gw:
        ack = gw.message_agent(sender="alice", target="bob", message="hi")
        out = gw.wait_outcome(ack["delivery_id"], timeout=30)

The public names load on first use: the hermes plugin imports this package inside
every ``hermes`` process that enables it, and needs none of the actors.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from loguru import logger

logger.disable("hermes_actors")
logger.disable("actors")

if TYPE_CHECKING:
    from hermes_actors.errors import HostileFileError, StoreError, TransportError, TurnFailed, ValidationError
    from hermes_actors.gateway import Gateway
    from hermes_actors.local.command_runner import CommandRunner
    from hermes_actors.local.runners import CallableRunner, TurnRunner
    from hermes_actors.messages import BOT_CHAT_SESSION, Outcome, Turn
    from hermes_actors.tool import message_agent_tool, message_agent_tool_schema

__version__ = "0.1.0"

_LAZY = {
    "BOT_CHAT_SESSION": "hermes_actors.messages",
    "CallableRunner": "hermes_actors.local.runners",
    "CommandRunner": "hermes_actors.local.command_runner",
    "Gateway": "hermes_actors.gateway",
    "HostileFileError": "hermes_actors.errors",
    "Outcome": "hermes_actors.messages",
    "StoreError": "hermes_actors.errors",
    "TransportError": "hermes_actors.errors",
    "Turn": "hermes_actors.messages",
    "TurnFailed": "hermes_actors.errors",
    "TurnRunner": "hermes_actors.local.runners",
    "ValidationError": "hermes_actors.errors",
    "message_agent_tool": "hermes_actors.tool",
    "message_agent_tool_schema": "hermes_actors.tool",
}

__all__ = [
    "BOT_CHAT_SESSION",
    "CallableRunner",
    "CommandRunner",
    "Gateway",
    "HostileFileError",
    "Outcome",
    "StoreError",
    "TransportError",
    "Turn",
    "TurnFailed",
    "TurnRunner",
    "ValidationError",
    "__version__",
    "message_agent_tool",
    "message_agent_tool_schema",
]


def __dir__() -> list[str]:
    """What ``dir(hermes_actors)`` (and an editor's completion) lists: the module's names and every public one,
    loaded or not yet (listing them loads nothing)."""
    return sorted(set(globals()) | set(__all__))


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hermes_actors' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value
