"""The ``message_agent`` tool: its OpenAI-format schema, the gate and the call."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from loguru import logger

from hermes_actors.core.acks import unconfirmed_answer
from hermes_actors.core.clipping import shown
from hermes_actors.core.targets import MESSAGE_MAX_CHARS
from hermes_actors.messages import BOT_CHAT_SESSION

if TYPE_CHECKING:
    from hermes_actors.gateway import Gateway

__all__ = [
    "MESSAGE_AGENT_TOOL_NAME",
    "message_agent_authorized",
    "message_agent_tool",
    "message_agent_tool_schema",
    "send_failure",
    "tool_result_text",
]

MESSAGE_AGENT_TOOL_NAME = "message_agent"


def message_agent_tool_schema() -> dict[str, Any]:
    """The schema injected into a managed install's Bot Chat session (never registered globally).

    The seed's schema word for word (DESIGN 8): a Hermes release with Bot Mode built in shows
    the model this text, so a bot reads the same tool on either.

    Returns:
        A new dict in the OpenAI function format: ``{"type": "function", "function": {"name": "message_agent",
        "description", "parameters"}}``, ``target`` and ``message`` both required strings.
    """
    return {
        "type": "function",
        "function": {
            "name": MESSAGE_AGENT_TOOL_NAME,
            "description": (
                "Send a message to ANOTHER agent (teammate) on this install, or to an "
                "agent on a registered peer gateway. This is FIRE-AND-FORGET and "
                "asynchronous, like texting: it validates the target against the live "
                "roster, delivers your message into that agent's own Bot Chat with your "
                "attribution automatically prefixed, and returns immediately with a "
                "dispatch acknowledgement — status queued plus a delivery_id (the hand-off to a background "
                "delivery process, not a delivery receipt). It does NOT return their reply and you must "
                "not wait or poll for one — send it, finish your turn, and that process's "
                "completion notification wakes you with the outcome: their reply, or the "
                "delivery failure — unless the ack returns reply_delivery=\"poll\", in which case "
                "follow its process(action=\"wait\") instruction before ending the turn. COMPOSE the message "
                "yourself: write what YOU want to say to "
                "that agent (lead with the point; include the concrete ask or result). "
                "Never paste the user's words verbatim — paraphrase the actionable "
                "substance, and keep private 1:1 chat content private. Message one "
                "clearly relevant teammate when it genuinely helps the user's goal; "
                "don't fan out to several agents unless the user explicitly asked. "
                "Use the teammate roster in your system prompt (names + roles) to pick "
                "the right recipient; targets: a teammate name (e.g. 'researcher'), "
                "'<peer>/<agent>' for an agent on a registered peer gateway "
                "(e.g. 'spark/researcher', or just '<peer>' for the peer's main agent), "
                "or an agent on another connected machine from your roster (use "
                "'<handle>@<connection>' if the same handle exists on several)."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "target": {
                        "type": "string",
                        "description": (
                            "Who to message: a teammate profile name from your roster ('researcher', "
                            "'hermes' for the default agent), or '<peer>' / '<peer>/<agent>' for a "
                            "registered peer gateway."
                        ),
                    },
                    "message": {
                        "type": "string",
                        "description": (
                            f"The message YOU composed for that agent (max {MESSAGE_MAX_CHARS} chars). Do not "
                            "include the 'Message from …' prefix — it is added automatically."
                        ),
                    },
                },
                "required": ["target", "message"],
            },
        },
    }


def message_agent_authorized(session_title: str, install_managed: bool) -> bool:
    """The gate: a managed install's canonical "Bot Chat" session. Pure, never raises."""
    return str(session_title or "").strip() == BOT_CHAT_SESSION and bool(install_managed)


def message_agent_tool(
    gateway: Gateway, *, sender: str, target: str = "", message: str = "", session: str = BOT_CHAT_SESSION
) -> str:
    """Dispatch one tool call through ``gateway``; returns the JSON text the model reads (ack or error).

    Args:
        gateway: the Gateway that sends it.
        sender: the calling bot's profile (folder id or handle), as ``Gateway.message_agent`` takes it.
        target: the tool call's ``target``.
        message: the tool call's ``message``.
        session: the title of the session the call comes from (only ``"Bot Chat"`` may send).

    Returns:
        :func:`tool_result_text` of the ack or refusal dict ``Gateway.message_agent`` returns (a bad argument is
        such a refusal). Every failure of the send is an error result too, never an exception in the calling bot's
        tool loop: a gateway that is not running (its ``RuntimeError``) is the refusal ``{"error": "<the error's
        text>; message_agent is unavailable right now. Try again later.", "reason": "runtime_offline"}``; any other
        (the Dispatcher did not answer within 30 s, ``TimeoutError``, or the gateway's machinery failed) is
        :func:`~hermes_actors.core.acks.unconfirmed_answer`: the request may have been taken, so the DM may still
        run, and the text says not to resend it.
    """
    try:
        result = gateway.message_agent(sender=sender, target=target, message=message, session=session)
    except RuntimeError as exc:
        text = f"{exc}; message_agent is unavailable right now. Try again later."
        result = {"error": text, "reason": "runtime_offline"}
    except Exception as exc:  # after the request was handed over: its fate is unknown, never "NOT queued"
        why = send_failure(exc)
        logger.warning("message_agent from {} to {}: {}; answered that its fate is unknown", shown(sender),
                       shown(target), why)
        result = unconfirmed_answer(why)
    return tool_result_text(result)


def send_failure(exc: Exception) -> str:
    """Pure: the clause naming why a send that was handed over got no answer (for :func:`unconfirmed_answer`).

    Args:
        exc: what ``Gateway.message_agent`` raised (not its ``RuntimeError``).

    Returns:
        ``"The gateway did not answer in time (AskTimeout: …)"`` for a ``TimeoutError``, else ``"message_agent
        failed in the gateway (<type>: …)"`` (a text whose ``__str__`` raises: the type alone).
    """
    from hermes_actors.local.turns import describe_error  # here: the plugin imports this module in every turn

    if isinstance(exc, TimeoutError):
        return f"The gateway did not answer in time ({describe_error(exc)})"
    return f"message_agent failed in the gateway ({describe_error(exc)})"


def tool_result_text(result: dict[str, Any]) -> str:
    """The JSON text the model reads for a tool call: ``json.dumps`` with its defaults, as the seed writes it.

    Byte for byte the seed's (``", "`` separators, non-ASCII escaped), so a model, a transcript
    or a test sees the very text the original tool gave.

    Args:
        result: the ack or error dict.

    Returns:
        The text.
    """
    return json.dumps(result)
