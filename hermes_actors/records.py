"""The data records of the hermes_actors protocol: who exists, what is delivered, how it ended.

They travel inside the messages of :mod:`hermes_actors.messages` (which re-exports
them). All are frozen: they cross actor boundaries and are never mutated after
they were sent. The ones built for every DM are also ``actors.fast_init``
(frozen all the same, built about 3× cheaper).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from actors import fast_init

__all__ = [
    "BOT_CHAT_SESSION",
    "PEER_ORIGIN",
    "REDIS_ORIGIN",
    "RELAY_ORIGIN",
    "ROOM_ORIGIN",
    "Delivery",
    "Origin",
    "Outcome",
    "OutcomeStatus",
    "ProfileInfo",
    "RemoteAgent",
    "RosterSnapshot",
    "Turn",
    "outcome_status",
]

BOT_CHAT_SESSION = "Bot Chat"

#: The one final status of a delivery (docs/protocol.md, "Outcomes").
OutcomeStatus = Literal["replied", "failed", "silent", "ambiguous"]

#: Where a delivery came from: sent here, drained from the relay, re-offered after a
#: restart, a sender wake-up turn, a group room member's turn, a DM handed to the ``bot_peers`` transport, or a DM
#: sent over Redis.
Origin = Literal["local", "relay", "recovered", "wake", "room", "peer", "redis"]

ROOM_ORIGIN: Origin = "room"  # Delivery.origin of a room member's turn
RELAY_ORIGIN: Origin = "relay"  # Delivery.origin of a DM relayed in (drained from the relay: file, Desktop, Redis)
# Delivery.origin of a DM this gateway hands to its ``bot_peers`` transport (journaled so: the next start settles one
# without an outcome ``ambiguous``, never runs it here; it has no local target)
PEER_ORIGIN: Origin = "peer"
# Delivery.origin of a DM this gateway sent over Redis, journaled so (durable mode) before its ack: the next start
# waits for it again while Redis's sent hash holds it, else settles it ``ambiguous`` (never sent again, never run here)
REDIS_ORIGIN: Origin = "redis"


def outcome_status(value: object) -> OutcomeStatus:
    """``value`` as an :data:`OutcomeStatus`; anything else (a corrupt record) is ``ambiguous``."""
    for status in get_args(OutcomeStatus):
        if value == status:
            return status
    return "ambiguous"


@dataclass(frozen=True, slots=True)
class ProfileInfo:
    """One local profile as the roster knows it."""

    profile: str  # folder id ("default" for the root)
    handle: str  # "hermes" for default, else the folder id
    home: Path
    display_name: str
    title: str = ""
    description: str = ""
    managed: bool = False


@dataclass(frozen=True, slots=True)
class RemoteAgent:
    """One normalized row of ``bot_relay/roster.json``."""

    profile: str
    handle: str
    connection_id: str
    connection_label: str = ""
    title: str = ""
    description: str = ""
    online: bool | None = None


@dataclass(frozen=True, slots=True)
class RosterSnapshot:
    """An immutable view of who exists, published by the RosterActor."""

    profiles: tuple[ProfileInfo, ...]
    peers: tuple[str, ...] = ()
    remote: tuple[RemoteAgent, ...] = ()
    remote_mtime: float | None = None  # roster.json's mtime (wall clock); None = no roster
    # the (inode, size, mtime_ns) of the roster.json the remote rows were read from (None: no file, or it could
    # not be stat'ed); a DM's sender compares it with the file's now (relay_files.roster_identity)
    remote_identity: tuple[int, int, int] | None = None
    remote_unreachable: str = ""  # the Redis address while the transport cannot reach it ("" = reachable)
    remote_via: str = ""  # "redis" once the Redis transport pushed the remote roster ("": roster.json, the Desktop)
    managed: bool = False
    version: int = 0
    # Precomputed by ``roster.make_snapshot`` so resolving a target is O(1):
    index: dict[str, ProfileInfo] = field(default_factory=dict)  # lowercase folder id → profile
    aliases: dict[str, frozenset[str]] = field(default_factory=dict)  # friendly form → folder ids


@fast_init
@dataclass(frozen=True, slots=True)
class Delivery:
    """A DM this gateway accepted: for a local profile (the unit a ProfileActor queues), or handed on to another
    connection (the relay, Redis) or to a ``bot_peers`` peer (origin ``peer``), whose ``target`` is "" (no profile of
    this root runs it) and ``label`` says where it went (``@bob on peer 'mini'``)."""

    delivery_id: str
    sender: str  # folder id of the sender
    sender_handle: str
    target: str  # folder id of the target
    target_handle: str
    content: str  # the prefixed text the target reads
    author: dict[str, Any] = field(default_factory=dict)
    hop: int = 0
    accepted_at: float = 0.0  # time.time() at acceptance
    origin: Origin = "local"
    label: str = ""  # how the target is shown to the sender ("@bob")
    session: str = BOT_CHAT_SESSION  # the target's session the turn runs in ("Group: <name>" for a room)
    # Whether the sender is woken with the outcome, decided by the gateway that accepted the DM and journaled
    # with it: a DM acked by a host and settled by a one-off `send` (which wakes nobody) still wakes its sender.
    # None: decided by the gateway that publishes the outcome (journal records of older versions).
    wake: bool | None = None


@fast_init
@dataclass(frozen=True, slots=True)
class Outcome:
    """The one final outcome of a delivery, as the sender sees it."""

    delivery_id: str
    status: OutcomeStatus
    reply: str = ""
    error: str = ""
    reason: str = ""
    retryable: bool = False
    from_: str = ""
    text: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The public outcome dict (docs/protocol.md, "Outcomes"): all keys always present."""
        return {
            "delivery_id": self.delivery_id,
            "status": self.status,
            "reply": self.reply,
            "error": self.error,
            "reason": self.reason,
            "retryable": self.retryable,
            "from": self.from_,
            "text": self.text,
        }


@fast_init
@dataclass(frozen=True, slots=True)
class Turn:
    """One turn a runner executes for a profile.

    ``message_agent`` sends a DM as this profile from inside the turn, one hop
    deeper in the conversation; it returns the same ack dict as
    ``Gateway.message_agent``.
    """

    profile: str
    content: str
    delivery_id: str
    session: str = BOT_CHAT_SESSION
    attempt: int = 1
    handle: str = ""
    home: Path | None = None
    root: Path | None = None
    sender: str = ""
    sender_handle: str = ""
    hop: int = 0
    author: dict[str, Any] = field(default_factory=dict)
    retry_action: str = ""  # "" on attempt 1; "resume" / "compress_then_resume" on 2
    # The profile's turn-lock fd: a turn's process inherits it, so the flock stays held while that
    # process lives, even if this gateway dies first (another process cannot start an overlapping turn).
    lock_fd: int | None = field(default=None, repr=False, compare=False)
    _send: Callable[[str, str], dict[str, Any]] | None = field(default=None, repr=False, compare=False)
    # Journals how the turn runs (a durable gateway's turn): see note_via
    _note_via: Callable[[str], None] | None = field(default=None, repr=False, compare=False)

    def message_agent(self, target: str, message: str) -> dict[str, Any]:
        """Send a DM as this turn's profile, one hop deeper in the conversation (the loop guard counts it).

        Args:
            target: who receives it, as ``Gateway.message_agent`` takes it (not a string: refused).
            message: the text, as ``Gateway.message_agent`` takes it.

        Returns:
            The ack or refusal dict ``Gateway.message_agent`` returns (a refusal, ``loop_guard`` among them, is
            returned, not raised).

        Raises:
            RuntimeError: the turn has no gateway (one built by hand), or its gateway stopped
                (``gateway is not running``).
            TimeoutError: the gateway's Dispatcher did not answer within 30 s (``actors.AskTimeout``).
        """
        if self._send is None:
            raise RuntimeError("this turn cannot send messages (no gateway attached)")
        return self._send(target, message)

    def note_via(self, via: str) -> None:
        """Before the turn can reach its bot: say how it runs, ``"warm"`` (in a hermes gateway's API server) or
        ``"cli"`` (a process of this host's), so a host killed mid-turn words its ``ambiguous`` outcome by it at
        the next start. A runner that picks its path per turn calls it each time it picks (the last one counts).

        Args:
            via: ``"warm"`` or ``"cli"``.

        Raises:
            ValueError: any other ``via``.
        """
        if via not in ("warm", "cli"):
            raise ValueError(f"a turn runs 'warm' or 'cli', not {via!r}")
        if self._note_via is not None:  # no journal (not durable): nothing to tell a next start
            self._note_via(via)
