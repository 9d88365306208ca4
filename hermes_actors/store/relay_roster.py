"""The remote roster, pure: row normalization, target resolution, liveness.

Rows come from the Desktop (``bot_relay.roster.sync``) and are untrusted; the
rules are exactly the seed's. Nothing here touches the filesystem: the caller
passes the roster and its age (see ``relay_files.read_roster``).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any, Literal

from hermes_actors.core.names import HANDLE_RE, handle_for, remote_label
from hermes_actors.messages import RemoteAgent
from hermes_actors.store.relay_protocol import ROSTER_FRESH_SECONDS

Resolved = RemoteAgent | Literal["ambiguous"] | None
"""What ``resolve_remote_target`` returns."""


# ── roster rows ─────────────────────────────────────────────────────────────


def _text(value: Any) -> str:
    """The seed's lenient text coercion: falsy → "", else ``str`` stripped.

    Args:
        value: a raw field value.

    Returns:
        The stripped string.
    """
    return str(value or "").strip()


def _shown(value: Any) -> str:
    """A bounded ``repr`` of an untrusted value, for a log line (a hostile row may hold megabytes)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _names(row: dict[str, Any]) -> tuple[str, str, str]:
    """A row's ``(profile, handle, connection_id)`` as the seed coerces them (handle defaults from profile)."""
    profile = _text(row.get("profile"))
    return profile, _text(row.get("handle")).lstrip("@") or handle_for(profile), _text(row.get("connection_id"))


def roster_row_problem(row: Any) -> str | None:
    """Why one untrusted roster row is refused (seed rules, exactly), or None when it is kept.

    Args:
        row: one element of ``agents`` as pushed by the Desktop.

    Returns:
        The reason, naming the field: not an object, no profile or connection_id,
        or a name not matching ``HANDLE_RE`` (shown bounded).
    """
    if not isinstance(row, dict):
        return f"a {type(row).__name__}, not an object"
    profile, handle, connection_id = _names(row)
    if not profile or not connection_id:
        return "no profile" if not profile else "no connection_id"
    for field_name, name in (("profile", profile), ("handle", handle), ("connection_id", connection_id)):
        if not HANDLE_RE.match(name):
            return f"{field_name} {_shown(name)} is not a name (letters, digits, '_' and '-', 64 at most)"
    return None


def normalize_roster_row(row: Any) -> RemoteAgent | None:
    """Validate one untrusted roster row (seed rules, exactly: :func:`roster_row_problem`).

    Args:
        row: one element of ``agents`` as pushed by the Desktop.

    Returns:
        The normalized agent, or None when the row is refused (not a dict,
        missing profile/connection_id, or a name not matching ``HANDLE_RE``).
    """
    if roster_row_problem(row) is not None:
        return None
    profile, handle, connection_id = _names(row)
    online = row.get("online")
    return RemoteAgent(
        profile=profile,
        handle=handle,
        connection_id=connection_id,
        connection_label=_text(row.get("connection_label"))[:80],
        title=_text(row.get("title"))[:120],
        description=" ".join(str(row.get("description") or "").split())[:160],
        online=online if isinstance(online, bool) else None,
    )


def roster_row_dict(agent: RemoteAgent) -> dict[str, Any]:
    """The seed's on-disk row for ``agent``.

    Args:
        agent: a normalized agent.

    Returns:
        A dict with profile, handle, connection_id, connection_label, title,
        description, and ``online`` only when the flag is known.
    """
    row: dict[str, Any] = {
        "profile": agent.profile,
        "handle": agent.handle,
        "connection_id": agent.connection_id,
        "connection_label": agent.connection_label,
        "title": agent.title,
        "description": agent.description,
    }
    if agent.online is not None:
        row["online"] = agent.online
    return row


def normalize_roster(rows: Any, refused: list[str] | None = None) -> list[RemoteAgent]:
    """Normalize a whole roster: drop bad rows, dedupe, sort.

    Args:
        rows: the raw ``agents`` list (anything else yields an empty roster).
        refused: when given, gets one line per refused row (``row 2: no profile``, rows numbered from 1), for
            the caller to log: a dropped row is an agent no DM can reach.

    Returns:
        Agents deduplicated by ``(connection_id, profile)`` (first wins),
        sorted by that key.
    """
    by_key: dict[tuple[str, str], RemoteAgent] = {}
    for number, row in enumerate(rows if isinstance(rows, list) else [], start=1):  # as a person counts them
        agent = normalize_roster_row(row)
        if agent is not None:
            by_key.setdefault((agent.connection_id, agent.profile), agent)
        elif refused is not None:
            refused.append(f"row {number}: {roster_row_problem(row)}")
    return [by_key[key] for key in sorted(by_key)]


def parse_roster_payload(data: Any, refused: list[str] | None = None) -> list[RemoteAgent]:
    """The agents of a parsed ``roster.json``.

    Args:
        data: the decoded JSON document.
        refused: when given, gets one line per refused row (see :func:`normalize_roster`).

    Returns:
        The normalized roster; empty when the document is not
        ``{"agents": [...]}``.
    """
    agents = data.get("agents") if isinstance(data, dict) else None
    return normalize_roster(agents, refused)


# ── targets ─────────────────────────────────────────────────────────────────


def resolve_remote_target(raw: str, roster: list[RemoteAgent]) -> Resolved:
    """Resolve a ``message_agent`` target against the remote roster.

    Accepted: ``name`` (a handle or profile, unique across connections) and
    ``name@connection`` (exact connection); a leading ``@`` is ignored and all
    comparisons are case-insensitive.

    Args:
        raw: the target as the sender typed it.
        roster: the normalized remote roster.

    Returns:
        The matching agent, ``"ambiguous"`` when several match, None for none.
    """
    want = str(raw or "").strip().lstrip("@")
    if not want:
        return None
    conn = ""
    if "@" in want:
        name, _, conn = want.partition("@")
        want, conn = name.strip(), conn.strip()
        if not want or not conn:
            return None
    want_l, conn_l = want.lower(), conn.lower()
    matches = [
        agent
        for agent in roster
        if want_l in target_aliases(agent) and (not conn_l or agent.connection_id.lower() == conn_l)
    ]
    if not matches:
        return None
    return matches[0] if len(matches) == 1 else "ambiguous"


def target_aliases(agent: RemoteAgent) -> set[str]:
    """The lowercase bare names ``agent`` answers to.

    Args:
        agent: a remote agent.

    Returns:
        Its lowercased handle and profile.
    """
    return {agent.handle.lower(), agent.profile.lower()}


def remote_target_forms(roster: list[RemoteAgent], taken: AbstractSet[str] = frozenset()) -> list[str]:
    """How each remote agent should be addressed, in roster order.

    Args:
        roster: the normalized remote roster.
        taken: lowercase names a local profile already answers to.

    Returns:
        The bare handle when it resolves to exactly that agent and no local
        profile claims it, else ``handle@connection_id``.
    """
    local = {name.lower() for name in taken}
    forms: list[str] = []
    for agent in roster:
        bare = agent.handle
        unique = resolve_remote_target(bare, roster) is agent
        forms.append(bare if unique and bare.lower() not in local else f"{bare}@{agent.connection_id}")
    return forms


def liveness(
    agent: RemoteAgent, roster: list[RemoteAgent], roster_age_seconds: float | None
) -> bool | None:
    """Tri-state liveness of ``agent`` (seed semantics).

    Args:
        agent: the resolved target.
        roster: the current normalized roster.
        roster_age_seconds: age of ``roster.json`` by mtime; None when missing.

    Returns:
        None (unknown, fail open) for a missing, stale or empty roster or a
        row without a flag; False when the row says offline or a fresh roster
        no longer lists the agent; True when the row says online.
    """
    if roster_age_seconds is None or roster_age_seconds > ROSTER_FRESH_SECONDS or not roster:
        return None
    key = (agent.connection_id, agent.profile)
    for row in roster:
        if (row.connection_id, row.profile) == key:
            return row.online
    return False


def offline_error_text(agent: RemoteAgent, *, via: str = "", label: str = "") -> str:
    """The seed's ``runtime_offline`` refusal text for ``agent``.

    Args:
        agent: the offline target.
        via: ``"redis"`` when the machines meet on Redis, where there is no Desktop to reconnect to
            ("": the file relay, the seed's text).
        label: how the DM named its target, when not ``@handle on <machine>``: a ``bot_peers`` DM's label
            (``@mini on peer 'mini'``, the seed's), so its refusal names it as its ack would.

    Returns:
        The human text; nothing was queued.
    """
    label = label or remote_label(agent.handle, agent.connection_label or agent.connection_id)
    again = ("Try again once that machine's gateway is back on Redis." if via == "redis"
             else "Try again once that machine reconnects to the Desktop.")
    return f"{label} is offline right now — the message was NOT queued. {again}"
