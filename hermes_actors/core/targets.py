"""Pure validation and routing of one ``message_agent`` call.

``plan_send`` turns (roster snapshot, sender, target, message) into either a
:class:`Refusal` (the seed's exact texts and reasons) or a route. No I/O, no
clock, no actor: table-tested in ``tests/test_targets.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from actors import fast_init
from hermes_actors.core.authors import bot_author
from hermes_actors.core.clipping import clip, shown
from hermes_actors.core.names import (
    HANDLE_PATTERN,
    HANDLE_RE,
    PEER_NAME_PATTERN,
    has_line_break,
    profile_key,
    remote_label,
)
from hermes_actors.core.reasons import classify_agent_error
from hermes_actors.messages import BOT_CHAT_SESSION, ProfileInfo, RemoteAgent, RosterSnapshot
from hermes_actors.store.hermes_root import alias_forms
from hermes_actors.store.relay_roster import (
    liveness,
    offline_error_text,
    remote_target_forms,
    resolve_remote_target,
    target_aliases,
)

__all__ = [
    "DM_SIGNATURE_START",
    "HEADER_NAME_MAX_CHARS",
    "MESSAGE_MAX_CHARS",
    "NOT_BOT_CHAT_TEXT",
    "PEER_TARGET_RE",
    "LocalRoute",
    "PeerRoute",
    "Refusal",
    "RelayRoute",
    "Route",
    "consults_remote_roster",
    "dm_body",
    "header_name",
    "local_taken_forms",
    "message_length_problem",
    "plan_send",
    "prefixed_content",
    "refuse",
    "resolve_local",
    "text_problem",
    "transport_unreachable_text",
]

NOT_BOT_CHAT_TEXT = (
    "message_agent is only available in a Bot Mode 'Bot Chat' session. This session is not one; do not retry."
)
MESSAGE_MAX_CHARS = 16000
# '<peer>/<agent>': peer names are lowercase (``hermes peer`` normalizes them).
PEER_TARGET_RE = re.compile(rf"^({PEER_NAME_PATTERN})/({HANDLE_PATTERN})\Z")


@dataclass(frozen=True, slots=True)
class Refusal:
    """A refused call: the tool's ``{"error", "reason", ...}`` payload.

    ``remote_roster``: the remote roster decided it (another connection's agent offline or
    ambiguous, or a name neither this install nor the remote roster knows): a fresher roster
    may decide otherwise. Not part of the payload.
    """

    error: str
    reason: str
    teammates: tuple[str, ...] | None = None
    peers: tuple[str, ...] | None = None
    remote_roster: bool = False

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.error, "reason": self.reason}
        if self.teammates is not None:
            out["teammates"] = list(self.teammates)
        if self.peers is not None:
            out["peers"] = list(self.peers)
        return out


@fast_init
@dataclass(frozen=True, slots=True)
class LocalRoute:
    """Deliver to a profile of this install."""

    sender: ProfileInfo
    target: ProfileInfo
    content: str
    author: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"@{self.target.handle}"


@dataclass(frozen=True, slots=True)
class RelayRoute:
    """Deliver through the file relay to an agent on another connection."""

    sender: ProfileInfo
    target: RemoteAgent
    content: str
    author: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return remote_label(self.target.handle, self.target.connection_label or self.target.connection_id)


@dataclass(frozen=True, slots=True)
class PeerRoute:
    """Deliver to a registered peer gateway (``bot_peers``)."""

    sender: ProfileInfo
    peer: str
    agent: str | None
    content: str
    author: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"@{self.agent or self.peer} on peer '{self.peer}'"


Route = LocalRoute | RelayRoute | PeerRoute


def transport_unreachable_text(label: str, address: str) -> str:
    """The refusal of a DM to another machine while Redis (at ``address``) is unreachable."""
    return (f"Could not queue the message for {label}: Redis at {address} is unreachable, so it was NOT queued. "
            "Retry once Redis is back.")


def refuse(text: str, *, teammates: tuple[str, ...] | None = None, peers: tuple[str, ...] | None = None,
           remote_roster: bool = False) -> Refusal:
    """A refusal whose reason is the classification of its text (as the seed does); ``remote_roster``: see
    :class:`Refusal`."""
    return Refusal(text, classify_agent_error(text), teammates, peers, remote_roster)


def consults_remote_roster(planned: Route | Refusal) -> bool:
    """Pure: whether the remote roster decided ``planned`` (:func:`plan_send`'s answer).

    A route to another connection's agent, or a refusal the remote roster decided
    (:attr:`Refusal.remote_roster`); never a local or peer route, nor a refusal made before
    the remote roster was looked at.

    Args:
        planned: what :func:`plan_send` answered.

    Returns:
        True when a fresher remote roster could have answered otherwise.
    """
    return isinstance(planned, RelayRoute) or (isinstance(planned, Refusal) and planned.remote_roster)


DM_SIGNATURE_START = "Message from 🤖 "  # how every DM's text begins (the seed's signature, on every route)
# The longest display name a DM's header shows: at most 4 bytes a character, so the header (with a handle of at
# most 64 characters) and a message of MESSAGE_MAX_CHARS (at most 64,000 bytes) stay far under what a turn's
# text may be (the hermes CLI's command line: 100 KiB); a roster title is cut at 120 characters too.
HEADER_NAME_MAX_CHARS = 120


def header_name(display_name: str) -> str:
    """Pure: a sender's display name as a DM's header shows it: whole up to :data:`HEADER_NAME_MAX_CHARS`
    characters, else cut there (:func:`~hermes_actors.core.clipping.clip`, ending "…").

    Args:
        display_name: the sender's display name (on one line: ``one_line_name``).

    Returns:
        The name, cut when longer. A 40,000-character name made every DM of its bot larger than a turn's text
        may be: acked, then failed, blaming the message.
    """
    return display_name if len(display_name) <= HEADER_NAME_MAX_CHARS else clip(display_name, HEADER_NAME_MAX_CHARS)


def prefixed_content(sender: ProfileInfo, body: str) -> str:
    """The text the target reads: the sender's signature (its display name cut by :func:`header_name`), then
    the body."""
    return f"{DM_SIGNATURE_START}{header_name(sender.display_name)} (@{sender.handle}): {body}"


def message_length_problem(body: str) -> str | None:
    """Pure: the one rule for how long a DM's message may be (:data:`MESSAGE_MAX_CHARS`), or None when it fits.

    The live path's (:func:`plan_send`, on the stripped message), and the journal's for a DM it re-offers
    (:func:`hermes_actors.core.acks.delivery_problem`, on :func:`dm_body` of the journaled text).

    Args:
        body: the message, without the DM's header.

    Returns:
        ``message too long (N chars > 16000)``, or None.
    """
    if len(body) > MESSAGE_MAX_CHARS:
        return f"message too long ({len(body)} chars > {MESSAGE_MAX_CHARS})"
    return None


def dm_body(content: str, sender_handle: str) -> str:
    """Pure: the message of a DM's text, :func:`prefixed_content` undone (the header cut off).

    The header is the signature, the display name as :func:`header_name` shows it (at most
    :data:`HEADER_NAME_MAX_CHARS` characters) and `` (@<handle>): ``; its last `` (@<handle>): `` that
    can end a header is taken (a display name holding one is still cut off whole).

    Args:
        content: a DM's text, as the target reads it (untrusted: a journaled record's).
        sender_handle: the sender's handle its header names.

    Returns:
        The message after the header; ``content`` whole when it carries no such header.
    """
    if not content.startswith(DM_SIGNATURE_START):
        return content
    tail = f" (@{sender_handle}): "
    start = len(DM_SIGNATURE_START)
    end = content.rfind(tail, start, start + HEADER_NAME_MAX_CHARS + len(tail))
    return content if end < 0 else content[end + len(tail):]


def _find_sender(snapshot: RosterSnapshot, sender: str) -> ProfileInfo | None:
    return snapshot.index.get(profile_key(sender))


def resolve_local(raw: str, snapshot: RosterSnapshot) -> str | None:
    """Map a target to a local folder id using the snapshot's precomputed maps.

    A folder id (case-insensitive) or handle ('hermes' → 'default'); else a unique
    friendly name or its @-slug, typed as it is (case-insensitive). The typed
    text itself is never slugified: ``'bob\\x00'`` or ``"['bob']"`` would slug
    to ``bob`` and slip past the shape check, so they name nobody. Ambiguous
    friendly names resolve to None so a DM never lands on the wrong bot.

    Args:
        raw: the target as typed; surrounding whitespace and one leading ``@``
            (``@scribe``) are ignored.
        snapshot: the roster.

    Returns:
        The folder id, or None.
    """
    want = raw.strip().removeprefix("@").lower()
    if not want:
        return None
    exact = snapshot.index.get(profile_key(want))
    if exact is not None:
        return exact.profile
    hits = snapshot.aliases.get(want, frozenset())
    return next(iter(hits)) if len(hits) == 1 else None


def text_problem(what: str, value: Any) -> str | None:
    """Why ``value`` is not usable as the text of a DM field, or None when it is.

    A lone surrogate (``"\\ud800"``) is a Python ``str`` that no file, journal or
    JSON encoder can write as UTF-8, so it is refused here rather than failing
    later, after the DM was accepted.

    Args:
        what: the field's name as the caller knows it (``"message"``, ``"target"``).
        value: the stripped text.

    Returns:
        The refusal text, or None.
    """
    if value.isascii():  # a flag CPython keeps on every str: no copy to encode, and ASCII always encodes
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"{what} is not valid text: it contains an unpaired surrogate ({value[exc.start]!r} at character "
            f"{exc.start}) that cannot be encoded as UTF-8. Send plain UTF-8 text."
        )
    return None


def local_taken_forms(profiles: tuple[ProfileInfo, ...]) -> set[str]:
    """Every lowercase form a local profile answers to (so relay forms avoid them)."""
    taken: set[str] = set()
    for p in profiles:
        taken |= {p.profile.lower(), p.handle.lower()} | alias_forms(p.display_name) | alias_forms(p.title)
    return taken


def _try_relay(
    snapshot: RosterSnapshot, raw: str, me: ProfileInfo, content: str, author: dict[str, Any], now: float
) -> Any:
    """A RelayRoute, a Refusal, or None when the relay roster does not know ``raw``."""
    roster = list(snapshot.remote)
    if not roster:
        return None
    match = resolve_remote_target(raw, roster)
    if match is None:
        return None
    if match == "ambiguous":
        want = raw.strip().lstrip("@").partition("@")[0].lower()
        forms = remote_target_forms(roster, local_taken_forms(snapshot.profiles))
        listed = ", ".join(form for row, form in zip(roster, forms, strict=True) if want in target_aliases(row))
        named = shown(raw, f"'{raw}'")  # the seed's '<raw>', cut when huge
        return refuse(f"{named} exists on several connected machines — disambiguate with one of: {listed}.",
                      remote_roster=True)
    assert isinstance(match, RemoteAgent)
    age = None if snapshot.remote_mtime is None else max(0.0, now - snapshot.remote_mtime)
    if liveness(match, roster, age) is False:
        return Refusal(offline_error_text(match, via=snapshot.remote_via), "runtime_offline", remote_roster=True)
    return RelayRoute(me, match, content, author)


def plan_send(
    snapshot: RosterSnapshot,
    *,
    sender: str,
    target: Any,
    message: Any,
    session: str = BOT_CHAT_SESSION,
    now: float = 0.0,
) -> Route | Refusal:
    """Validate one call and decide where it goes.

    Args:
        snapshot: the roster as the RosterActor last published it.
        sender: the sending profile (folder id or handle).
        target: the raw target string from the tool call.
        message: the raw message from the tool call.
        session: the calling session's title (the tool is Bot Chat only).
        now: wall-clock time, for the relay roster's freshness.

    Returns:
        A route, or a :class:`Refusal` carrying the seed's text and reason.
    """
    if str(session or "").strip() != BOT_CHAT_SESSION:
        return refuse(NOT_BOT_CHAT_TEXT)
    if not snapshot.managed:
        return refuse(
            "This install is not Bot-Mode-managed (no bot roster); message_agent is unavailable. Do not retry."
        )
    sender_problem = _sender_problem(sender)
    if sender_problem is not None:
        return _roster_refusal(snapshot, None, sender_problem)
    me = _find_sender(snapshot, sender)
    peers = snapshot.peers

    if me is None:
        if not (sender or "").strip():
            return _roster_refusal(snapshot, me, "sender is required: the name of the profile that sends the DM.")
        return _roster_refusal(snapshot, me,
                               f"Unknown sender {shown(sender)}: no profile with that name on this install.")
    if message is not None and not isinstance(message, str):
        # The seed would str() it: an int, bytes or dict would reach the target as "5", "b'..'" or "{..}".
        return refuse(f"message must be text (a string), not {type(message).__name__}. Compose it as plain text.")
    body = (message or "").strip()
    problem = text_problem("message", body)
    if problem is not None:
        return refuse(problem)
    if not body:
        return refuse("message is required — compose what you want to say to that agent.")
    too_long = message_length_problem(body)
    if too_long is not None:
        return refuse(f"{too_long}. Send the essentials; share large content as a file path instead.")
    if target is not None and not isinstance(target, str):
        # The seed would str() it: Path("bob") or an object whose str() is "bob" would reach bob, 5 would be "5".
        return _roster_refusal(snapshot, me, f"Invalid target: it must be a name (text), not {type(target).__name__}.")
    raw = (target or "").strip().lstrip("@")
    if not raw:
        return _roster_refusal(snapshot, me, "target is required.")
    problem = text_problem("target", raw)
    if problem is not None:
        return _roster_refusal(snapshot, me, problem)
    content = prefixed_content(me, body)
    author = bot_author(me.profile, me.handle)

    peer_match = PEER_TARGET_RE.match(raw) if "/" in raw else None  # '<peer>/<agent>' has one
    if peer_match or raw.lower() in peers:
        peer_name, peer_agent = peer_match.groups() if peer_match else (raw.lower(), None)
        if peer_name not in peers:
            return _roster_refusal(snapshot, me, f"No registered peer named '{peer_name}'.")
        return PeerRoute(me, peer_name, peer_agent, content, author)

    if "@" in raw:
        relayed = _try_relay(snapshot, raw, me, content, author, now)
        if relayed is not None:
            return relayed

    resolved = resolve_local(raw, snapshot)
    if resolved is None and not HANDLE_RE.match(raw) and "@" not in raw:
        return _roster_refusal(snapshot, me, f"Invalid target: {shown(raw)}.")
    if resolved is None or resolved == me.profile:
        # Unknown here, or the same name on ANOTHER connection: the relay roster may know it.
        # Each answer below is the remote roster's (it knew no such agent): remote_roster=True.
        relayed = _try_relay(snapshot, raw, me, content, author, now)
        if relayed is not None:
            return relayed
        if resolved == me.profile:
            return refuse("You can't message yourself. Pick a teammate from the roster.", remote_roster=True)
        if "@" in raw and snapshot.remote_unreachable:  # 'dave@mini' may well exist: we cannot see Redis now
            return Refusal(transport_unreachable_text(shown(raw, raw), snapshot.remote_unreachable), "runtime_offline",
                           remote_roster=True)
        named = shown(raw, f"'{raw}'")  # the seed's '<raw>', cut when huge
        return _roster_refusal(
            snapshot, me,
            f"No teammate named {named} on this install, on a connected machine, or on a registered peer. "
            "Pick a name from the roster (roles are listed in your system prompt).",
            remote_roster=True,
        )
    return LocalRoute(me, snapshot.index[resolved.lower()], content, author)


def _sender_problem(sender: Any) -> str | None:
    """Pure: why ``sender`` cannot name a sending profile whatever the roster, or None (None and "" are left to the
    "sender is required" refusal).

    Args:
        sender: the ``sender`` given (a str subclass is text too).

    Returns:
        The refusal text: a sender that is not text (``Path("alice")``, 5: never ``str()``-ed into a name), or one
        holding a control character or line break (``"alice\\n"``: no profile name has one); else None.
    """
    if sender is None:
        return None
    if not isinstance(sender, str):
        return f"sender must be the sending profile's name (text), not {type(sender).__name__}."
    if has_line_break(sender):
        return (f"Invalid sender {shown(sender)}: a profile name has no control characters or line breaks; pass "
                "the name alone (a folder id or handle: 1-64 letters, digits, '_' or '-').")
    return None


def _roster_refusal(
    snapshot: RosterSnapshot, me: ProfileInfo | None, text: str, *, remote_roster: bool = False
) -> Refusal:
    """A :func:`plan_send` refusal that lists the sender's teammates and the peers (built only when refusing)."""
    teammates = tuple(p.handle for p in snapshot.profiles if me is None or p.profile != me.profile)
    return refuse(text, teammates=teammates, peers=tuple(snapshot.peers), remote_roster=remote_roster)
