"""Profile names: the handle grammar, and the default profile's two names.

The root's profile has the folder id ``default`` and the handle ``hermes``;
every other profile's handle is its folder id. These rules exist once, here.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = [
    "DEFAULT_HANDLE",
    "DEFAULT_PROFILE",
    "HANDLE_PATTERN",
    "HANDLE_RE",
    "PEER_NAME_PATTERN",
    "PEER_NAME_RE",
    "handle_for",
    "profile_home",
    "profile_key",
]

# Handles, folder ids and connection ids. \Z: "$" would accept a trailing newline.
HANDLE_PATTERN = r"[a-zA-Z0-9][a-zA-Z0-9_-]{0,63}"
HANDLE_RE = re.compile(rf"^{HANDLE_PATTERN}\Z")
# ``bot_peers`` names: lowercase (``hermes peer`` normalizes them).
PEER_NAME_PATTERN = r"[a-z0-9][a-z0-9_-]{0,63}"
PEER_NAME_RE = re.compile(rf"^{PEER_NAME_PATTERN}\Z")
DEFAULT_PROFILE = "default"
DEFAULT_HANDLE = "hermes"


def handle_for(profile: str) -> str:
    """The routing handle of a profile.

    Args:
        profile: the folder id.

    Returns:
        ``hermes`` for the default profile, else the folder id.
    """
    return DEFAULT_HANDLE if profile == DEFAULT_PROFILE else profile


def profile_key(name: str) -> str:
    """The roster-index key of a local profile named by folder id or handle.

    Args:
        name: as typed (``"@Bob"``, ``" hermes "``).

    Returns:
        Lowercased, without spaces or a leading ``@``; the default handle
        ``hermes`` becomes the folder id ``default``.
    """
    want = str(name or "").strip().lstrip("@").lower()
    return DEFAULT_PROFILE if want == DEFAULT_HANDLE else want


def profile_home(root: Path, profile: str) -> Path:
    """A profile's home directory.

    Args:
        root: the Hermes root (the default profile's home).
        profile: the folder id.

    Returns:
        ``root`` for ``default``, else ``root/profiles/<profile>``.
    """
    return Path(root) if profile == DEFAULT_PROFILE else Path(root) / "profiles" / profile
