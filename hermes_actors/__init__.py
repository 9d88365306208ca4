"""hermes-actors: Bot Mode agent-to-agent messaging as an actor system on pykka.

    from hermes_actors import Gateway

    with Gateway(root="/path/to/hermes-root") as gw:
        ack = gw.message_agent(sender="alice", target="bob", message="hi")
        out = gw.wait_outcome(ack["delivery_id"], timeout=30)
"""

from loguru import logger

from hermes_actors.errors import HostileFileError, StoreError, TurnFailed, ValidationError
from hermes_actors.gateway import Gateway
from hermes_actors.local.runners import CallableRunner, CommandRunner, TurnRunner
from hermes_actors.messages import BOT_CHAT_SESSION, Outcome, Turn
from hermes_actors.tool import message_agent_tool, message_agent_tool_schema

logger.disable("hermes_actors")
logger.disable("actors")

__version__ = "0.1.0"

__all__ = [
    "BOT_CHAT_SESSION",
    "CallableRunner",
    "CommandRunner",
    "Gateway",
    "HostileFileError",
    "Outcome",
    "StoreError",
    "Turn",
    "TurnFailed",
    "TurnRunner",
    "ValidationError",
    "__version__",
    "message_agent_tool",
    "message_agent_tool_schema",
]
