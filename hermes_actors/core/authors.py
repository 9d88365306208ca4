"""Who wrote a DM: the author newer Hermes reads from ``HERMES_TURN_AUTHOR`` for its memory hooks.

The id is whatever the transport knows the sender by: ``bot:<profile>`` inside one
install, ``bot:<connection>/<profile>`` when a relay brought it from another machine,
``bot:<hostname>/<profile>`` on a peer dm. Qualified ids keep another install's
``alice`` distinct from the recipient's own ``alice``.
"""

from __future__ import annotations

import socket
import unicodedata
from typing import Any

__all__ = ["bot_author", "bot_author_id", "local_origin"]

_MAX_FIELD_LEN = 200
_DROPPED_CATEGORIES = frozenset({"Cc", "Cs", "Cn", "Co"})  # control, surrogate, unassigned, private use


def bot_author_id(profile: str, origin: str = "") -> str:
    """Pure: ``bot:<profile>``, or ``bot:<origin>/<profile>`` for a bot on another install.

    Args:
        profile: the sending profile.
        origin: the sender's install as the recipient knows it ("" for the recipient's own).

    Returns:
        The author id.
    """
    origin = origin.strip()
    return f"bot:{origin}/{profile}" if origin else f"bot:{profile}"


def bot_author(profile: str, handle: str, origin: str = "") -> dict[str, Any]:
    """Pure: the author record of a DM a bot sent (``{"id", "name", "is_bot"}``).

    Args:
        profile: the sending profile.
        handle: its routing handle (the author's name).
        origin: see :func:`bot_author_id`.

    Returns:
        A new dict.
    """
    return {"id": bot_author_id(profile, origin), "name": handle, "is_bot": True}


def local_origin() -> str:
    """This machine's hostname as an author-id origin; "" when unknown.

    Control and unassigned characters are dropped and the length capped, as for any author
    field; a slash is dropped too: it would split the id into another origin and profile.
    """
    try:
        host = socket.gethostname()
    except OSError:
        return ""
    text = "".join(ch for ch in host if unicodedata.category(ch) not in _DROPPED_CATEGORIES).strip()
    return text[:_MAX_FIELD_LEN].replace("/", "")
