"""The Hermes plugin: ``message_agent`` for bots, and the platform that hosts our actors in the gateway.

Installed as the entry point ``hermes-actors = hermes_actors.hermes.plugin`` in the
group ``hermes_agent.plugins``; hermes-agent 0.19 imports this module and calls
:func:`register` only for a profile whose ``config.yaml`` lists ``hermes-actors``
under ``plugins.enabled``.

- The tool handler runs inside a bot's own ``hermes`` process. It knows no agent
  object, so it finds the sender from the active profile home
  (``hermes_constants.get_hermes_home()``: the ``HERMES_HOME`` of a CLI turn, the
  per-turn profile override in a multiplexing gateway), checks the session is
  that profile's "Bot Chat" in its ``state.db``, and submits the DM to the host
  of the root (:mod:`hermes_actors.hermes.submit`), or straight to the Gateway
  when this very process hosts it.
- The platform ``hermes_actors`` starts one shared ``Gateway(root, serve_submit=True)``
  per root at gateway start and stops it at gateway stop — only where it is asked
  to: ``platforms: {hermes_actors: {enabled: true, extra: {host_actors: true}}}``
  (what ``hermes-actors enable --gateway`` writes). hermes 0.19 enables every
  registered plugin platform it finds "connected"; without the marker ours never
  is, so a ``hermes gateway run`` started for other reasons leaves the actors to
  ``hermes-actors serve``.

This module imports nothing heavy at import time and never lets an error escape
into hermes: a failing call returns a JSON error the model reads.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "HOP_ENV",
    "HOST_KEY",
    "PLATFORM_NAME",
    "TOOLSET",
    "dm_hop",
    "has_builtin_bot_mode",
    "hosting_configured",
    "is_bot_chat_lineage",
    "message_agent_handler",
    "reachable_profiles",
    "register",
    "root_and_profile",
    "teammates_middleware",
    "turn_hop",
    "turn_hop_scope",
]

TOOLSET = "bot_mode"
PLATFORM_NAME = "hermes_actors"
HOST_KEY = "host_actors"  # platforms.hermes_actors.extra.host_actors: true asks a hermes gateway to host the actors
HOP_ENV = "HERMES_ACTORS_HOP"  # set by our runners for the turns they start; a user's own turn has none (hop 0)
_MAX_LINEAGE = 64
_SUBMIT_TIMEOUT = 10.0

# session id → the hop of the warm turn this process started on it (the API runner's, in the host:
# `serve`, or the hermes gateway hosting the actors). hermes runs the turn, and so its tool calls, in
# the hermes gateway, where an environment variable cannot be per turn: the host resolves their hop.
_turn_hops: dict[str, int] = {}


# ── pure decisions ──────────────────────────────────────────────────────────


def root_and_profile(home: Path) -> tuple[Path, str]:
    """The Hermes root and the profile folder id of a profile home.

    ``<root>/profiles/<name>`` is profile ``name`` of ``<root>``; any other home is
    the root itself, profile ``default``.
    """
    if home.parent.name == "profiles" and home.name:
        return home.parent.parent, home.name
    return home, "default"


def is_bot_chat_lineage(titles: Sequence[str]) -> bool:
    """True when a session is a "Bot Chat": titled so, or a compression continuation of one.

    Args:
        titles: the session's title, then its compression ancestors' titles, oldest last.
    """
    from hermes_actors.records import BOT_CHAT_SESSION  # here, not at import: records loads the actors (pykka)

    clean = [str(t or "").strip() for t in titles]
    if not clean:
        return False
    if clean[0] == BOT_CHAT_SESSION:
        return True
    continuation = rf"^{re.escape(BOT_CHAT_SESSION)} #\d+$"  # hermes retitles a session continued after compression
    return clean[-1] == BOT_CHAT_SESSION and all(t == BOT_CHAT_SESSION or re.match(continuation, t) for t in clean)


def parse_hop(raw: str | None) -> int:
    """The hop of the running turn from ``HERMES_ACTORS_HOP`` (absent or malformed: 0, a user's turn)."""
    try:
        value = int(str(raw or "0").strip())
    except ValueError:
        return 0
    return value if 0 <= value <= 1000 else 0


# ── the turn's context ──────────────────────────────────────────────────────


def active_profile_home() -> Path:
    """The home of the profile this call runs for (hermes' own resolution, else ``HERMES_HOME``)."""
    try:
        from hermes_constants import get_hermes_home

        return Path(get_hermes_home())
    except ImportError:  # outside hermes (tests, embedding)
        return Path(os.environ.get("HERMES_HOME") or Path.home() / ".hermes")


def session_lineage_titles(db_path: Path, session_id: str) -> list[str]:
    """The titles of ``session_id`` and its compression ancestors, read from a profile's ``state.db``.

    Returns:
        Empty when the database or the session does not exist.
    """
    if not session_id or not db_path.is_file():
        return []
    from hermes_state import SessionDB

    db = SessionDB(db_path=db_path, read_only=True)  # the default path is the process's home, not this profile's
    try:
        titles: list[str] = []
        current: str | None = session_id
        seen: set[str] = set()
        while current and current not in seen and len(seen) < _MAX_LINEAGE:
            seen.add(current)
            row = db.get_session(current)
            if row is None:
                break
            titles.append(str(row.get("title") or ""))
            parent_id = row.get("parent_session_id")
            parent = db.get_session(parent_id) if parent_id else None
            current = parent_id if parent is not None and parent.get("end_reason") == "compression" else None
        return titles
    finally:
        db.close()


@contextlib.contextmanager
def turn_hop_scope(session_id: str, hop: int) -> Iterator[None]:
    """While this process runs a turn of hop ``hop`` on ``session_id``, DMs sent from it are hop ``hop + 1``.

    Whether the DM comes in a call in this process or over the submit socket (with its
    ``session``) from the hermes gateway that runs the turn: see :func:`dm_hop`.
    """
    _turn_hops[session_id] = hop
    try:
        yield
    finally:
        if _turn_hops.get(session_id) == hop:
            del _turn_hops[session_id]


def turn_hop(session_id: str) -> int | None:
    """The hop of the turn this process runs on ``session_id`` (inside :func:`turn_hop_scope`), else None."""
    return _turn_hops.get(session_id) if session_id else None


def dm_hop(hop: int, session_id: str) -> int:
    """The hop of a DM that reaches this process's host sent from ``session_id`` with ``hop``.

    The sender knows the hop of a CLI turn (``HERMES_ACTORS_HOP``) but not of a warm turn:
    hermes runs that turn in the gateway process, the host that started it knows its hop.

    Args:
        hop: the hop the sender gave (1 for a DM from a turn without ``HERMES_ACTORS_HOP``).
        session_id: the hermes session the DM was sent from ("" when unknown).

    Returns:
        One hop deeper than the turn this process runs on the session, else ``hop``; never
        less than ``hop`` (a session named wrongly can only make the guard stricter).
    """
    running = turn_hop(session_id)
    return hop if running is None else max(hop, running + 1)


# ── the tool ────────────────────────────────────────────────────────────────


def _handle(args: dict[str, Any], session_id: str) -> dict[str, Any]:
    from hermes_actors.core.targets import NOT_BOT_CHAT_TEXT, refuse

    home = active_profile_home()
    if not is_bot_chat_lineage(session_lineage_titles(home / "state.db", session_id)):
        return refuse(NOT_BOT_CHAT_TEXT).as_dict()
    root, sender = root_and_profile(home)
    target = args.get("target")
    message = args.get("message")
    target = "" if target is None else str(target)
    message = "" if message is None else str(message)
    hop = parse_hop(os.environ.get(HOP_ENV)) + 1  # a warm turn's hop is the host's to add (dm_hop)
    from hermes_actors.hermes.host import hosted_gateway

    gateway = hosted_gateway(root)
    if gateway is not None:  # this process hosts the actors (the hermes gateway with our platform)
        from hermes_actors.core.acks import unconfirmed_answer
        from hermes_actors.hermes.submit_protocol import offline_refusal
        from hermes_actors.tool import send_failure

        try:
            return gateway.message_agent(sender=sender, target=target, message=message,
                                         hop=dm_hop(hop, session_id))
        except RuntimeError:
            return offline_refusal(root)
        except Exception as exc:  # handed over (a Dispatcher that did not answer in time): never "NOT sent"
            return unconfirmed_answer(send_failure(exc))
    from hermes_actors.hermes.submit_client import submit_dm

    return submit_dm(root, sender, target, message, hop=hop, timeout=_SUBMIT_TIMEOUT, session=session_id)


def message_agent_handler(args: Any, **context: Any) -> str:
    """The ``message_agent`` tool as hermes calls it: ``handler(args, task_id=, session_id=, user_task=)``.

    Returns:
        The seed's ack JSON, or a JSON error (never raises).
    """
    from hermes_actors.tool import tool_result_text

    try:
        result = _handle(args if isinstance(args, dict) else {}, str(context.get("session_id") or ""))
    except Exception as exc:  # never break the bot's turn
        result = {
            "error": f"message_agent failed in the hermes-actors plugin ({type(exc).__name__}: {exc}); "
            "the message was NOT sent.",
            "reason": "unknown",
        }
    return tool_result_text(result)


# ── the teammate roster in the model's system message ───────────────────────


def reachable_profiles(root: Path) -> list[Any]:
    """The root's profiles a DM can reach on the real Hermes ([] when the install is not managed)."""
    from hermes_actors.hermes.install import hermes_cannot_run
    from hermes_actors.store.hermes_root import discover_profiles, install_is_managed

    profiles = discover_profiles(root)
    if not install_is_managed(profiles):
        return []
    return [p for p in profiles if hermes_cannot_run(p.profile) is None]


def has_builtin_bot_mode() -> bool:
    """Whether this hermes ships Bot Mode itself (``tools.bot_mode_dm``): its prompt has the roster already."""
    import importlib.util

    try:
        return importlib.util.find_spec("tools.bot_mode_dm") is not None
    except (ImportError, ValueError):  # no ``tools`` package at all
        return False


_teammates: Any = None  # the TeammateCache, made on first use (this module imports nothing heavy)


def teammates_middleware(*, request: Any = None, session_id: str = "", **context: Any) -> dict[str, Any] | None:
    """hermes' ``llm_request`` middleware: in a Bot Chat turn, the teammate roster joins the system message.

    hermes-agent 0.19 has no Bot Mode roster in its system prompt, while the tool's schema
    tells the model to pick recipients from it (:mod:`hermes_actors.hermes.teammates`).

    Returns:
        ``{"request": ...}`` with the roster added, or None (not a Bot Chat turn, no teammate,
        a request of another shape, or any error: the model request goes on unchanged).
    """
    global _teammates
    try:
        from hermes_actors.hermes.teammates import TeammateCache, with_teammates

        if not isinstance(request, dict):
            return None
        home = active_profile_home()
        if not is_bot_chat_lineage(session_lineage_titles(home / "state.db", str(session_id or ""))):
            return None
        root, me = root_and_profile(home)
        if _teammates is None:
            _teammates = TeammateCache(reachable_profiles)
        changed = with_teammates(request, _teammates.text(root, me))
        return None if changed is None else {"request": changed}
    except Exception:  # never break the bot's model call
        return None


# ── registration ────────────────────────────────────────────────────────────


def hosting_configured(platform_config: Any) -> bool:
    """Whether a hermes gateway's ``platforms.hermes_actors`` block asks it to host the actors.

    hermes calls this both on the platform's own config and on a bare enabled probe (to decide
    whether to enable an unconfigured plugin platform): only the explicit marker says yes.

    Args:
        platform_config: hermes' ``PlatformConfig`` (``enabled``, ``extra``).

    Returns:
        True for ``enabled: true`` with ``extra.host_actors: true``.
    """
    extra = getattr(platform_config, "extra", None)
    return bool(getattr(platform_config, "enabled", False)) and isinstance(extra, dict) and extra.get(HOST_KEY) is True


def _make_adapter(platform_config: Any) -> Any:
    from hermes_actors.hermes.plugin_platform import HostAdapter

    return HostAdapter(platform_config)


def register(ctx: Any) -> None:
    """Called by hermes' plugin loader with its ``PluginContext``."""
    from hermes_actors.tool import message_agent_tool_schema

    schema = message_agent_tool_schema()["function"]  # the registry wraps it in {"type": "function", ...}
    ctx.register_tool(
        name=schema["name"],
        toolset=TOOLSET,
        schema=schema,
        handler=message_agent_handler,
        description=schema["description"],
        emoji="🤖",
    )
    register_middleware = getattr(ctx, "register_middleware", None)
    if register_middleware is not None and not has_builtin_bot_mode():
        register_middleware("llm_request", teammates_middleware)  # the roster the schema mentions
    register_platform = getattr(ctx, "register_platform", None)
    if register_platform is None:  # a hermes without gateway platforms: the tool still works via serve
        return
    try:
        register_platform(
            name=PLATFORM_NAME,
            label="hermes-actors host",
            adapter_factory=_make_adapter,
            check_fn=lambda: True,
            validate_config=lambda _config: True,
            is_connected=hosting_configured,
            emoji="🤖",
        )
    except Exception as exc:  # the tool matters more than hosting
        from loguru import logger

        logger.warning("could not register the hermes-actors host platform: {}", exc)
