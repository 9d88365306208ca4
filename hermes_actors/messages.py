"""Every message and record type of the hermes_actors protocol.

All types are frozen dataclasses: they cross actor boundaries and must never
be mutated after they were sent. Reading this module top to bottom is reading
the protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BOT_CHAT_SESSION = "Bot Chat"

# ── records ─────────────────────────────────────────────────────────────────


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
class Delivery:
    """A DM accepted for a local profile (the unit a ProfileActor queues)."""

    delivery_id: str
    sender: str  # folder id of the sender
    sender_handle: str
    target: str  # folder id of the target
    target_handle: str
    content: str  # the prefixed text the target reads
    author: dict[str, Any] = field(default_factory=dict)
    hop: int = 0
    accepted_at: float = 0.0  # time.time() at acceptance
    origin: str = "local"  # "local" | "relay" (drained envelope) | "recovered"
    label: str = ""  # how the target is shown to the sender ("@bob")


@dataclass(frozen=True, slots=True)
class Outcome:
    """The one final outcome of a delivery, as the sender sees it."""

    delivery_id: str
    status: str  # replied | failed | silent | ambiguous
    reply: str = ""
    error: str = ""
    reason: str = ""
    retryable: bool = False
    from_: str = ""
    text: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The public outcome dict (DESIGN section 3): all keys always present."""
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


@dataclass(frozen=True)
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

    def message_agent(self, target: str, message: str) -> dict[str, Any]:
        """Send a DM as this profile, one hop deeper; returns the ack dict."""
        if self._send is None:
            raise RuntimeError("this turn cannot send messages (no gateway attached)")
        return self._send(target, message)


@dataclass(frozen=True, slots=True)
class RosterSnapshot:
    """An immutable view of who exists, published by the RosterActor."""

    profiles: tuple[ProfileInfo, ...]
    peers: tuple[str, ...] = ()
    remote: tuple[RemoteAgent, ...] = ()
    remote_mtime: float | None = None  # roster.json's mtime (wall clock); None = no roster
    managed: bool = False
    version: int = 0
    # Precomputed by ``roster.make_snapshot`` so resolving a target is O(1):
    index: dict[str, ProfileInfo] = field(default_factory=dict)  # lowercase folder id → profile
    aliases: dict[str, frozenset[str]] = field(default_factory=dict)  # friendly form → folder ids

    def by_id(self) -> dict[str, ProfileInfo]:
        """Profiles keyed by folder id."""
        return {p.profile: p for p in self.profiles}


# ── Dispatcher protocol ─────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class SendRequest:
    """Ask the Dispatcher to accept a DM; answered with the ack/refusal dict."""

    sender: str
    target: str
    message: str
    hop: int = 0
    session: str = BOT_CHAT_SESSION


@dataclass(frozen=True, slots=True)
class AwaitOutcome:
    """Ask for a future that resolves with the outcome dict of a delivery."""

    delivery_id: str


@dataclass(frozen=True, slots=True)
class OutcomeReady:
    """A delivery ended; told to the Dispatcher by whoever settled it."""

    outcome: Outcome


@dataclass(frozen=True, slots=True)
class RosterChanged:
    """The RosterActor published a new snapshot."""

    snapshot: RosterSnapshot


@dataclass(frozen=True, slots=True)
class StopAccepting:
    """Ask the Dispatcher to refuse new DMs from now on."""


@dataclass(frozen=True, slots=True)
class ShutdownProfiles:
    """Ask the Dispatcher to wind every ProfileActor down within ``deadline``."""

    timeout: float


@dataclass(frozen=True, slots=True)
class StatsRequest:
    """Ask the Dispatcher for counters (active profiles, pending deliveries)."""


@dataclass(frozen=True, slots=True)
class AttachOwner:
    """Attach a live owner to a profile (forwarded to its ProfileActor)."""

    profile: str
    owner: Any


@dataclass(frozen=True, slots=True)
class DetachOwner:
    """Detach the live owner of a profile."""

    profile: str


# ── ProfileActor protocol ───────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class Deliver:
    """Queue one delivery for a turn."""

    delivery: Delivery


@dataclass(frozen=True, slots=True)
class TurnFinished:
    """A worker finished the turn of ``delivery_id`` (told to its ProfileActor)."""

    delivery_id: str
    reply: str | None  # None when the turn failed
    error: str = ""
    reason: str = ""
    attempts: int = 1
    ran: bool = True  # False when the turn never started (lock wait ran out)
    ambiguous: bool = False  # it may have run; the result is unknown (live owner died mid-turn)


@dataclass(frozen=True, slots=True)
class WaitExpired:
    """Timer: the queued delivery's wait budget ran out."""

    delivery_id: str


@dataclass(frozen=True, slots=True)
class IdleCheck:
    """Timer: stop the ProfileActor if it stayed idle long enough."""


@dataclass(frozen=True, slots=True)
class WindDown:
    """Ask a ProfileActor to cancel what is queued and report what is running.

    With ``keep_journaled`` the queued deliveries the journal holds are dropped
    without an outcome: the next start on the same root re-offers them.
    """

    keep_journaled: bool = False


@dataclass(frozen=True, slots=True)
class ProfileIdle:
    """Told to the Dispatcher by an idle ProfileActor that offers to stop.

    The Dispatcher stops it only when ``handled`` equals the number of
    Deliver messages it sent to ``ref``: then nothing is in flight to it.
    """

    profile: str
    ref: Any
    handled: int


@dataclass(frozen=True, slots=True)
class StopProfile:
    """Told by the Dispatcher to a ProfileActor it removed from its table."""


# ── RosterActor protocol ────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class Reload:
    """Re-read profiles and config from disk and publish if anything changed."""


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Subscribe ``ref`` to RosterChanged (answered with the current snapshot)."""

    ref: Any


@dataclass(frozen=True, slots=True)
class GetSnapshot:
    """Ask the RosterActor for its current snapshot."""


@dataclass(frozen=True, slots=True)
class RosterTick:
    """Timer: look for profile changes on disk."""


@dataclass(frozen=True, slots=True)
class FinalizePending:
    """Ask the Dispatcher to settle still-pending deliveries as ambiguous (stop timeout).

    Journaled deliveries that never started (not in ``running``) stay journaled.
    """

    why: str
    running: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Notify:
    """Told to the Notifier: run subscriber callbacks for one outcome dict."""

    outcome: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AddSubscriber:
    """Ask the Notifier to call ``callback`` for every later outcome."""

    token: int
    callback: Callable[[dict[str, Any]], Any]


@dataclass(frozen=True, slots=True)
class RemoveSubscriber:
    """Ask the Notifier to stop calling the subscriber ``token``."""

    token: int


@dataclass(frozen=True, slots=True)
class Flush:
    """Ask the Notifier to answer once everything told before it ran."""


@dataclass(frozen=True, slots=True)
class NotifierStats:
    """Ask the Notifier for its counters (notified, notify_skipped, subscriber_errors)."""


# ── RelayActor protocol ─────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class RelaySend:
    """Ask the RelayActor to enqueue an envelope for ``route`` (answered with the ack/refusal)."""

    route: Any  # targets.RelayRoute
    delivery: Delivery


@dataclass(frozen=True, slots=True)
class ExportOutcomes:
    """Ask the Dispatcher for its settled outcomes (kept by a stopped Gateway)."""


@dataclass(frozen=True, slots=True)
class RelayDeliver:
    """Told by the RelayActor to the Dispatcher: run this drained envelope on a local profile.

    The outcome goes back to the relay as :class:`RelayOutcome` with the same
    ``reply_connection`` ("" for an envelope the Desktop RPC delivered).
    """

    envelope: dict[str, Any]
    reply_connection: str


@dataclass(frozen=True, slots=True)
class RelayOutcome:
    """Told by the Dispatcher to the RelayActor: a relayed-in delivery settled; write its reply."""

    outcome: Outcome
    reply_connection: str


@dataclass(frozen=True, slots=True)
class RelayResumed:
    """Told by the RelayActor to the Dispatcher at start: envelopes of ours still awaiting replies."""

    entries: tuple[tuple[str, str], ...]  # (envelope id, label)


@dataclass(frozen=True, slots=True)
class ResumeRelay:
    """Asked by the Gateway at start: finish resuming our in-flight envelopes now.

    Answers the ``RelayResumed`` entries (already told to the Dispatcher, together
    with the outcomes of replies that arrived while we were down), or None when the
    transport is unreachable and the resume waits for it. The Gateway registers the
    entries with the Dispatcher by an ask, so ``start()`` returns only once every
    resumed id is answerable.
    """


@dataclass(frozen=True, slots=True)
class ReplyDeadline:
    """Timer: the reply budget of an envelope of ours ran out."""

    envelope_id: str


@dataclass(frozen=True, slots=True)
class TtlDeadline:
    """Timer: an envelope of ours reached its TTL; expire it if nobody drained it."""

    envelope_id: str


@dataclass(frozen=True, slots=True)
class RelayTick:
    """Timer: write the heartbeat; now and then sweep stale artifacts."""


@dataclass(frozen=True, slots=True)
class Housekeep:
    """Ask the RelayActor to sweep stale relay artifacts and the DM cache now; answers the count."""


@dataclass(frozen=True, slots=True)
class RemoteRosterHint:
    """Told to the RosterActor: ``roster.json`` may have changed."""


@dataclass(frozen=True, slots=True)
class AttachRelay:
    """Told to the Dispatcher once the relay runs; ``reaches_peers``: it carries ``bot_peers`` DMs (Redis)."""

    ref: Any
    reaches_peers: bool = False


@dataclass(frozen=True, slots=True)
class RelayAccepted:
    """Told by the relay to the Dispatcher: its answer to the ``RelaySend``/``PeerSend`` of ``delivery_id``.

    ``ack`` is the ack or refusal dict; None answers a ``PeerSend`` for a peer the relay
    does not reach. ``error``: the relay's handler raised it instead.
    """

    delivery_id: str
    ack: dict[str, Any] | None
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class RosterPush:
    """Timer (hub): push every root the others' roster with online flags."""


# The Desktop's relay RPC (``Gateway.relay_*``), asked of the RelayActor, which owns the files.


@dataclass(frozen=True, slots=True)
class DesktopSyncRoster:
    """``bot_relay.roster.sync``: store these untrusted roster rows; answered with how many were kept."""

    rows: Any


@dataclass(frozen=True, slots=True)
class DesktopDrainOutbox:
    """``bot_relay.outbox.drain``: claim the queued envelopes; answered with the fresh ones (a list)."""


@dataclass(frozen=True, slots=True)
class DesktopDeliver:
    """``bot_relay.deliver``: run this validated envelope here; answered with a :class:`PendingReply`."""

    envelope: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PendingReply:
    """The RelayActor's answer to :class:`DesktopDeliver`: the reply fields arrive once the turn settled."""

    future: Any  # pykka.ThreadingFuture[dict[str, str]]: {"reply", "error", "reason"}


@dataclass(frozen=True, slots=True)
class DesktopReply:
    """``bot_relay.reply``: write this reply record (first write wins); answered True when it was stored."""

    record: dict[str, Any]


# ── durability ──────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class PendingAck:
    """The Dispatcher's answer when the ack comes later: once the journal fsync'd it, or the relay took it."""

    future: Any  # pykka.ThreadingFuture[dict]
    waiting_for: str = "The delivery journal"  # who must confirm (named when it does not in time)


@dataclass(frozen=True, slots=True)
class JournalDurable:
    """Told by the journal writer once per group commit: these records are on disk (or failed).

    ``tokens`` are ``("accepted", delivery_id)`` and ``("finished", Outcome)`` pairs.
    """

    tokens: tuple[tuple[str, Any], ...]
    error: BaseException | None


@dataclass(frozen=True, slots=True)
class Recover:
    """Ask the Dispatcher to act on the journal state adopted at start; answers the counts."""

    states: dict[str, Any]  # delivery id → store.journal.DeliveryState
    idempotent_runner: bool = False


@dataclass(frozen=True, slots=True)
class TurnTimeout:
    """Timer: the running turn of ``delivery_id`` exceeded ``turn_timeout_seconds``."""

    delivery_id: str


# ── Redis Streams transport ─────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class RemoteRows:
    """Told to the RosterActor by a transport that owns the remote roster (Redis): replaces it."""

    rows: tuple[RemoteAgent, ...]
    mtime: float  # wall-clock time the rows were read (their freshness)


@dataclass(frozen=True, slots=True)
class PeerSend:
    """Ask the relay whether it reaches a ``bot_peers`` peer itself; answered with an ack/refusal dict or None.

    None: the relay does not know that peer (the Dispatcher uses the CLI transport).
    """

    route: Any  # targets.PeerRoute
    delivery: Delivery


@dataclass(frozen=True, slots=True)
class RedisEntries:
    """Told by the Redis reader thread to its actor: entries read from one of our streams."""

    stream: str  # "in" | "replies"
    entries: tuple[tuple[str, dict[Any, Any]], ...]  # (entry id, fields)


@dataclass(frozen=True, slots=True)
class RedisTick:
    """Timer: the Redis actor's periodic work (heartbeat, roster, touch, reclaim, retries)."""
