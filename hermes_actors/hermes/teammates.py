"""The teammate roster a bot's model sees in its Bot Chat, on a hermes with no Bot Mode prompt.

The ``message_agent`` schema (the seed's words) tells the model to "use the teammate
roster in your system prompt (names + roles) to pick the right recipient". A Hermes
release with Bot Mode built in puts that roster there; hermes-agent 0.19 does not, so
our plugin adds it to the system message of each model request of a Bot Chat turn
(an ``llm_request`` middleware: at request time only, nothing stored in the session).

Pure pieces (:func:`teammates_text`, :func:`with_teammates`) and the cached read of
the root's profiles (:class:`TeammateCache`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hermes_actors.core.clipping import clip
from hermes_actors.records import ProfileInfo

__all__ = ["MAX_LISTED", "TeammateCache", "teammates_text", "with_teammates"]

MAX_LISTED = 100  # a roster of thousands would crowd the model's context: the rest are counted
_MAX_ROLE_CHARS = 160
HEADING = "## Bot Mode teammates"


def teammates_text(me: str, profiles: Sequence[ProfileInfo]) -> str:
    """The roster block for ``me``'s model: its teammates' handles, names and roles.

    Args:
        me: the folder id of the bot whose turn this is.
        profiles: the root's profiles a DM can reach, in roster order.

    Returns:
        The block ("" when ``me`` has no teammate).
    """
    others = [p for p in profiles if p.profile != me]
    if not others:
        return ""
    lines = [
        HEADING,
        "Other agents you can message with the message_agent tool (target: the name after '@'). "
        "Their replies reach you later, as new messages in this chat.",
    ]
    for info in others[:MAX_LISTED]:
        line = f"- @{info.handle}"
        if info.display_name and info.display_name.lower() not in (info.handle.lower(), info.profile.lower()):
            line += f" ({clip(info.display_name, 60)})"
        role = ": ".join(clip(part, _MAX_ROLE_CHARS) for part in (info.title, info.description) if part)
        lines.append(f"{line} — {role}" if role else line)
    if len(others) > MAX_LISTED:
        lines.append(f"- … and {len(others) - MAX_LISTED} more (a message_agent refusal lists every name)")
    return "\n".join(lines)


def with_teammates(request: dict[str, Any], text: str) -> dict[str, Any] | None:
    """``request`` with ``text`` appended to its system message, or None to leave it as it is.

    Only a chat-completions request whose first message is a plain-text system message is
    changed (a request already carrying the block too is left alone).

    Args:
        request: the provider request (``messages``, ...).
        text: the roster block.

    Returns:
        A new request dict, or None.
    """
    messages = request.get("messages")
    if not text or not isinstance(messages, list) or not messages:
        return None
    first = messages[0]
    if not isinstance(first, dict) or first.get("role") != "system" or not isinstance(first.get("content"), str):
        return None
    if HEADING in first["content"]:
        return None
    changed = [{**first, "content": f"{first['content']}\n\n{text}"}, *messages[1:]]
    return {**request, "messages": changed}


class TeammateCache:
    """The roster block per (root, bot), read from the root's profiles at most every ``ttl`` seconds.

    A model request must not read every ``profile.yaml`` of a large root; a profile added
    or renamed shows in the block within ``ttl``.

    Args:
        read: ``read(root) -> profiles`` (the root's reachable profiles).
        ttl: seconds a block is reused.
        clock: monotonic clock (injectable for tests).
    """

    def __init__(self, read: Callable[[Path], Sequence[ProfileInfo]], *, ttl: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self._ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._blocks: dict[tuple[Path, str], tuple[float, str]] = {}

    def text(self, root: Path, me: str) -> str:
        """The block for ``me`` on ``root`` (see :func:`teammates_text`)."""
        key = (Path(root), me)
        now = self._clock()
        with self._lock:
            cached = self._blocks.get(key)
        if cached is not None and now - cached[0] < self._ttl:
            return cached[1]
        block = teammates_text(me, self._read(Path(root)))
        with self._lock:
            self._blocks[key] = (now, block)
        return block
