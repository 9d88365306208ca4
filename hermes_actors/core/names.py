"""Profile names: the handle grammar, and the default profile's two names.

The root's profile has the folder id ``default`` and the handle ``hermes``;
every other profile's handle is its folder id. These rules exist once, here.
"""

from __future__ import annotations

import re
from pathlib import Path

from hermes_actors.core.clipping import shown

__all__ = [
    "DEFAULT_HANDLE",
    "DEFAULT_PROFILE",
    "HANDLE_PATTERN",
    "HANDLE_RE",
    "PEER_NAME_PATTERN",
    "PEER_NAME_RE",
    "checked_connection_id",
    "handle_for",
    "has_line_break",
    "misnamed_profiles_problem",
    "one_line_name",
    "profile_home",
    "profile_key",
    "remote_label",
    "unreachable_profiles",
]

# Handles, folder ids and connection ids. \Z: "$" would accept a trailing newline.
HANDLE_PATTERN = r"[a-zA-Z0-9][a-zA-Z0-9_-]{0,63}"
HANDLE_RE = re.compile(rf"^{HANDLE_PATTERN}\Z")


def checked_connection_id(connection_id: object) -> str:
    """A gateway's connection id, as every roster row and relay file name must have it.

    Args:
        connection_id: the id given (``--connection-id``, ``Gateway(connection_id=...)``,
            ``bot_mode.connection_id``).

    Returns:
        The id.

    Raises:
        ValueError: not 1-64 letters, digits, ``_`` or ``-`` starting with a letter or digit
            (it names relay files and Redis streams: ``../x`` must never reach a path).
    """
    if not isinstance(connection_id, str) or not HANDLE_RE.match(connection_id):
        raise ValueError(f"connection id {shown(connection_id)} must be 1-64 letters, digits, '_' or '-' "
                         "(starting with a letter or digit)")
    return connection_id


# ``bot_peers`` names: lowercase (``hermes peer`` normalizes them).
PEER_NAME_PATTERN = r"[a-z0-9][a-z0-9_-]{0,63}"
PEER_NAME_RE = re.compile(rf"^{PEER_NAME_PATTERN}\Z")
DEFAULT_PROFILE = "default"
DEFAULT_HANDLE = "hermes"


# The control characters (Unicode category Cc, which is exactly these 65: NUL, tab, LF, CR, ESC, DEL, NEL...) and
# the line and paragraph separators (Zl, Zp): everything str.splitlines() breaks a line at is among them.
_BREAK_RUN_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def one_line_name(name: str) -> str:
    """Pure: a profile's display name as every DM header, roster row and name lookup uses it: on one line.

    A ``profile.yaml`` ``display_name`` goes into the header of every DM its bot sends
    (``Message from 🤖 {display name} (@{handle}): …``): one holding a line break could fake a
    second header line. Each run of control characters and line breaks becomes a single space,
    and the ends are trimmed; everything else (unicode, emoji, other spaces) is kept as is.

    Args:
        name: the name as read.

    Returns:
        The name on one line ("" when nothing else was in it).
    """
    return _BREAK_RUN_RE.sub(" ", name).strip()


def has_line_break(name: str) -> bool:
    """Pure: whether ``name`` holds a control character or a line break (what :func:`one_line_name` replaces).

    No profile name has one (a folder id or handle is 1-64 letters, digits, ``_`` or ``-``), and a name read
    from a file or a command's output often ends with a newline: a sender given as ``"alice\\n"`` is refused
    rather than taken for ``alice``.

    Args:
        name: the name as given.

    Returns:
        True when it holds a control character (Unicode category Cc: NUL, tab, LF, CR, ESC, DEL, NEL...) or a
        line or paragraph separator (U+2028, U+2029).
    """
    return not name.isprintable() and _BREAK_RUN_RE.search(name) is not None


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


def remote_label(handle: str, connection: str) -> str:
    """Pure: how an agent on another connection is named to a sender: ``@dave on Mini``.

    Args:
        handle: the agent's handle.
        connection: the connection's label, else its id.
    """
    return f"@{handle} on {connection}"


def unreachable_profiles(names: list[str]) -> dict[str, str]:
    """Pure: the profile folders (under ``profiles/``) no DM could reach, each with why.

    A handle names one profile: lookups ignore case, and ``hermes`` is the default
    profile's. A folder whose handle another profile already answers to would be
    listed yet never receive a DM, so it is left out (the folder whose name is
    already lowercase keeps the handle; else the first one by name).

    Args:
        names: the folder ids under ``profiles/`` (valid handles).

    Returns:
        Folder id → the reason it is left out (empty when every folder is reachable).
    """
    out: dict[str, str] = {}
    by_key: dict[str, list[str]] = {}
    for name in sorted(names):
        key = name.lower()
        if key == DEFAULT_HANDLE:
            out[name] = f"its handle @{DEFAULT_HANDLE} is the default profile's; rename the folder"
        elif key == DEFAULT_PROFILE:
            out[name] = f"'{DEFAULT_PROFILE}' is the root profile; rename the folder"
        else:
            by_key.setdefault(key, []).append(name)
    for key, group in by_key.items():
        kept = key if key in group else group[0]
        for name in group:
            if name != kept:
                out[name] = f"'{kept}' has the same handle @{key} (handles ignore case); rename the folder"
    return out


_MISNAMED_SHOWN = 20  # folders named in the line; more are counted


def misnamed_profiles_problem(base: Path, names: list[str]) -> str | None:
    """Pure: the one warning line naming the folders under ``profiles/`` whose names are no profile names.

    Profile names, handles and connection ids share one shape (the seed's rule, ``HANDLE_PATTERN``): a folder
    such as ``my.bot``, ``ünï``, ``sp ace`` or one of 70 characters is no profile, left off the roster, and a DM
    to it is refused (``Invalid target``). Before, it was left out without a word.

    Args:
        base: ``<root>/profiles``.
        names: those folders' names, in the order to name them (hidden ``.…`` folders are not passed).

    Returns:
        The line (each folder as a refusal names a value, and the rule), or None when there is none.
    """
    if not names:
        return None
    listed = ", ".join(shown(name) for name in names[:_MISNAMED_SHOWN])
    more = f" and {len(names) - _MISNAMED_SHOWN} more" if len(names) > _MISNAMED_SHOWN else ""
    return (f"skipping {len(names)} folder(s) in {base} whose name is not a profile name: {listed}{more}; a profile "
            f"name is 1-64 letters, digits, '_' or '-', starting with a letter or digit (^{HANDLE_PATTERN}$, the "
            "seed's rule): no DM can reach them, rename the folder to use it as a profile")
