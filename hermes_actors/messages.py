"""The hermes_actors protocol: every message, grouped by the actor that receives it.

Reading this module top to bottom is reading the protocol. Each section names
its receiver; a message's docstring says who sends it and what answers it
("Ask" → answered, "Told" → no answer). The data records the messages carry
(``Delivery``, ``Outcome``, ``RosterSnapshot``...) are in
:mod:`hermes_actors.records` and re-exported here. All types are frozen
dataclasses: they cross actor boundaries and are never mutated once sent.
The ones built for every DM are also ``actors.fast_init``: frozen all the same,
but built without ``object.__setattr__`` per field (about 3× cheaper).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pykka

from actors import fast_init
from hermes_actors.records import BOT_CHAT_SESSION, Delivery, Outcome, RemoteAgent, RosterSnapshot
from hermes_actors.records import PEER_ORIGIN as PEER_ORIGIN
from hermes_actors.records import REDIS_ORIGIN as REDIS_ORIGIN
from hermes_actors.records import RELAY_ORIGIN as RELAY_ORIGIN
from hermes_actors.records import ROOM_ORIGIN as ROOM_ORIGIN
from hermes_actors.records import Origin as Origin  # re-exported: the records travel inside these messages
from hermes_actors.records import OutcomeStatus as OutcomeStatus
from hermes_actors.records import ProfileInfo as ProfileInfo
from hermes_actors.records import Turn as Turn

if TYPE_CHECKING:
    from hermes_actors.core.recovery import TurnPlace
    from hermes_actors.core.targets import PeerRoute, RelayRoute
    from hermes_actors.store.journal_records import DeliveryState


# ── DispatcherActor (local/dispatcher.py): every DM enters here ──────────


@fast_init
@dataclass(frozen=True, slots=True)
class SendRequest:
    """Ask the Dispatcher to accept a DM; answered with the ack/refusal dict."""

    sender: str
    target: str
    message: str
    hop: int = 0
    session: str = BOT_CHAT_SESSION


@fast_init
@dataclass(frozen=True, slots=True)
class AcceptLocal:
    """Told by a sender's thread: a first-hop local DM it admitted itself (``CallerAdmission``).

    The sender returns its ack right after this tell. In durable mode it first
    journaled the acceptance and waited for it to be on disk (``journaled``), so a
    Dispatcher that stopped accepting meanwhile leaves the DM to the next start,
    which re-offers it; in memory such a DM is cancelled (it still gets an outcome).
    """

    target: ProfileInfo
    delivery: Delivery
    ack: dict[str, Any]
    journaled: bool = False


@dataclass(frozen=True, slots=True)
class RefusalAnswered:
    """Told by a sender's thread: it returned a refusal with this ``reason`` to its caller.

    The Dispatcher counts it (``refused``, ``refused_by_reason``). Counted where the caller gets
    its answer, so each refusal counts once whichever step produced it: the Dispatcher's admission,
    a journal that could not record the acceptance (on the sender's thread or the Dispatcher's),
    the relay, or an ack not confirmed in time.
    """

    reason: str


@dataclass(frozen=True, slots=True)
class PendingAck:
    """The Dispatcher's answer when the ack comes later: once the journal fsync'd it, or the relay took it."""

    future: pykka.ThreadingFuture[dict[str, Any]]
    waiting_for: str = "The delivery journal"  # who must confirm (named when it does not in time)


@dataclass(frozen=True, slots=True)
class AwaitOutcome:
    """Told with a future the teller waits on: the Dispatcher sets it with the outcome dict of a
    delivery once there is one, or with ``KeyError`` for an id it never issued.

    A tell, not an ask: the waiter sleeps once, until the outcome, instead of waking first for
    the Dispatcher's answer that it is waiting (see ``local.sending.outcome_future``).
    """

    delivery_id: str
    reply: pykka.ThreadingFuture[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class CheckOutcome:
    """Asked: the published outcome dict of a delivery, None while it has none; ``KeyError`` for
    an id the Dispatcher never issued. What a poll asks (and a wait whose time ran out)."""

    delivery_id: str


@fast_init
@dataclass(frozen=True, slots=True)
class OutcomeReady:
    """A delivery ended; told to the Dispatcher by whoever settled it.

    ``freed``: the teller freed the delivery's place in its profile's queue (``QueueGauge``)
    already, as a ProfileActor does on its own thread; the Dispatcher then skips that.
    ``profile``: the ProfileActor that settled it (a turn of that profile's, or one it refused or
    cancelled: the Dispatcher's spells of failing turns, ``core.failing_turns``); ``""`` from anyone else.
    """

    outcome: Outcome
    freed: bool = False
    profile: str = ""


@dataclass(frozen=True, slots=True)
class RelayedOutcome:
    """An envelope of ours settled (its reply, its expiry, its reply deadline); told by the relay.

    The relay keeps the envelope's record (``sent/``, the Redis ``sent`` hash and reply entry)
    until the Dispatcher tells it ``ForgetSent``: once the outcome and the wake it starts are
    journaled (durable mode) or published. A crash before that leaves the record, and the next
    start settles the DM from it again, instead of from nothing.
    """

    outcome: Outcome


@fast_init
@dataclass(frozen=True, slots=True)
class OutcomesReady:
    """Deliveries a ProfileActor ended while handling one message, in order (told to the Dispatcher).

    Their places in the profile's queue (``QueueGauge``) are free already: the ProfileActor freed
    each as it settled it. ``profile``: that ProfileActor's (as :class:`OutcomeReady`'s).
    """

    outcomes: tuple[Outcome, ...]
    profile: str = ""


@dataclass(frozen=True, slots=True)
class StopAccepting:
    """Ask the Dispatcher to refuse new DMs from now on."""


@dataclass(frozen=True, slots=True)
class ShutdownProfiles:
    """Ask the Dispatcher to cancel what is queued everywhere; answered with the ids of running turns."""

    answer_within: float = 10.0  # seconds the ProfileActors get to answer (ProfileTable.wind_down)


@dataclass(frozen=True, slots=True)
class AwaitRestarts:
    """Ask for a future that resolves once no ProfileActor is down (each crashed one reported and restarted).

    The stop asks it after ``ShutdownProfiles``: a ProfileActor that crashed as the stop
    began has its held deliveries settled by its restart (``ProfileTable.restarting``)
    before the stop settles what is left as ``ambiguous``.
    """


@dataclass(frozen=True, slots=True)
class FinalizePending:
    """Ask the Dispatcher to settle still-pending deliveries: ambiguous when running (stop timeout), else cancelled.

    The Dispatcher words each running one's outcome by where its turn runs: ``places``, which the stopping
    thread asked the runner (``turns.turn_places_at_stop``); the Dispatcher never calls runner code for it.
    """

    # deliveries not in here never started: cancelled, or (journaled) they stay journaled for the next start
    running: tuple[str, ...] = ()
    places: Mapping[str, TurnPlace] = field(default_factory=dict)  # absent: "here" (only still running)


@dataclass(frozen=True, slots=True)
class ExportOutcomes:
    """Ask the Dispatcher for its settled outcomes (kept by a stopped Gateway)."""


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


@dataclass(frozen=True, slots=True)
class ProfileIdle:
    """Told to the Dispatcher by an idle ProfileActor that offers to stop."""

    profile: str
    ref: pykka.ActorRef[Any]
    handled: int  # stopped only when this equals the Delivers sent to ``ref``: nothing is in flight to it


@dataclass(frozen=True, slots=True)
class RosterChanged:
    """Told by the RosterActor to its subscribers: a new snapshot."""

    snapshot: RosterSnapshot


@dataclass(frozen=True, slots=True)
class AttachRelay:
    """Told to the Dispatcher once the relay runs; ``reaches_peers``: it carries ``bot_peers`` DMs (Redis).

    ``journals_sends``: nothing on this root keeps the relay's envelopes (Redis): in durable mode the Dispatcher
    journals each one's ``accepted`` record (origin ``redis``) before its ack.
    """

    ref: pykka.ActorRef[Any]
    reaches_peers: bool = False
    journals_sends: bool = False


@dataclass(frozen=True, slots=True)
class RelayAccepted:
    """Told by the relay to the Dispatcher: its answer to the ``RelaySend``/``PeerSend`` of ``delivery_id``."""

    delivery_id: str
    ack: dict[str, Any] | None  # the ack or refusal dict; None: a PeerSend for a peer the relay does not reach
    error: BaseException | None = None  # the relay's handler raised this instead


@dataclass(frozen=True, slots=True)
class RoomTurn:
    """Told by a RoomActor: run this member turn on the member's ProfileActor, queued behind its DMs.

    Its outcome goes to ``reply`` (called on the Dispatcher's thread), never to ``subscribe``
    callbacks as a DM outcome; the Dispatcher's journal does not record it (the room file does).
    The RoomActor's own messages are in its section below.
    """

    delivery: Delivery
    reply: Callable[[Outcome], None]


@dataclass(frozen=True, slots=True)
class RelayDeliver:
    """Told by the RelayActor to the Dispatcher: run this drained envelope on a local profile."""

    envelope: dict[str, Any]
    reply_connection: str  # where the outcome goes back (as RelayOutcome); "": the Desktop RPC delivered it
    # its turn may have run in a gateway process that died (a reclaimed Redis entry whose turn claim a dead consumer
    # holds, an envelope a dead file relay gateway had started): never run here, answered with the outcome the
    # journal recorded of it, else ``ambiguous`` for this reason (``relay_in_step``); "": it never ran elsewhere
    dead_why: str = ""


@dataclass(frozen=True, slots=True)
class ResumedSend:
    """One envelope of ours a restarted relay waits for again.

    ``sender`` (a local profile), ``sender_handle`` and ``hop`` are those of the DM that sent it, when
    the relay recorded them: its outcome then wakes that sender as it would have before the restart.
    """

    envelope_id: str
    label: str
    sender: str = ""
    sender_handle: str = ""
    hop: int = 0
    wake: bool | None = None  # whether its outcome wakes the sender (``Delivery.wake``; None: not recorded)


@dataclass(frozen=True, slots=True)
class RelayResumed:
    """Told by the RelayActor to the Dispatcher at start: envelopes of ours still awaiting replies.

    ``complete``: the relay read all it holds (False: the Gateway's start found the transport unreachable; the
    relay tells the full list once it resumes). Only a complete list settles a journaled Redis DM it lacks.
    """

    entries: tuple[ResumedSend, ...]
    complete: bool = True


@dataclass(frozen=True, slots=True)
class JournalDurable:
    """Told by the journal writer once per group commit: these records are on disk (or failed)."""

    # ("accepted", delivery_id), ("finished", Outcome), ("forget", Outcome: tell the relay ForgetSent),
    # ("kept", Outcome: a peer DM's outcome, published already) and ("relayed-in", Outcome: a relayed-in DM's,
    # answered through the relay already) pairs
    tokens: tuple[tuple[str, Any], ...]
    error: BaseException | None


@dataclass(frozen=True, slots=True)
class RetryJournal:
    """Told by the Dispatcher's own timer while outcome records wait: write them to the journal again."""


@dataclass(frozen=True, slots=True)
class WakeDue:
    """Told by the Dispatcher's own timer: the back-off of a wake's next attempt is over, run it
    (``SenderWaker.due``; its records are on disk when ``journaled``)."""

    delivery: Delivery  # the attempt (origin "wake")
    previous: str  # the id of the failed attempt it follows
    journaled: bool


@dataclass(frozen=True, slots=True)
class TurnHeld:
    """Told by a ProfileActor: a turn's ``started`` record could not be written to the delivery journal (a full
    disk), so the turn never ran and is queued again; the profile starts no turn until it is told ``ResumeTurns``."""

    profile: str
    error: BaseException  # why the record failed (said once per disk-full spell)


@dataclass(frozen=True, slots=True)
class AdoptJournal:
    """Ask the Dispatcher, before the relay resumes (or, at a running gateway's adoption, before its relay takes
    over the dead gateway's sent/ records), to learn what the adopted journal already settled:
    its outcomes and its wakes, and to settle its relayed-in DMs (started, never finished: ``ambiguous``), so
    that no transport offers one of their envelopes before their verdict is known (answers the relayed-in
    counts, ``ambiguous`` and ``known``; ``Recover`` acts on the rest once the relay runs)."""

    states: dict[str, DeliveryState]  # delivery id → what the journal knows of it
    idempotent_runner: bool = False  # an unfinished relayed-in DM is then forgotten (its retry runs it)


@dataclass(frozen=True, slots=True)
class Recover:
    """Ask the Dispatcher to act on the journal state adopted at start, or by a running gateway at a relay
    rescan (``adopted_from`` names the files then); answers the counts."""

    states: dict[str, DeliveryState]  # delivery id → what the journal knows of it
    idempotent_runner: bool = False
    adopted_from: tuple[str, ...] = ()  # a running gateway's adoption: the journal files adopted
    # relayed DMs (journaled outcome, no acceptance, not delivered) whose sent/ record or consumed/ mark is still in
    # the relay (at a start: not a record our relay resumed): the gateway that took over the record reports them (and
    # wakes); JournalTakeover.follow settles them here once the record goes
    relayed: frozenset[str] = frozenset()
    relay_reported: frozenset[str] = frozenset()  # those of them reported and forgotten already (consumed/ only)


# ── ProfileActor (local/profile_actor.py): one per local profile, runs its turns one at a time ───


@fast_init
@dataclass(frozen=True, slots=True)
class Deliver:
    """Queue deliveries for their turns, in this order (the Dispatcher hands a burst over at once)."""

    deliveries: tuple[Delivery, ...]


@fast_init
@dataclass(frozen=True, slots=True)
class TurnFinished:
    """A worker finished the turn of ``delivery_id`` (told to its ProfileActor)."""

    delivery_id: str
    reply: str | None  # None when the turn failed
    error: str = ""
    reason: str = ""
    ambiguous: bool = False  # it may have run; the result is unknown (live owner died mid-turn)
    # Set when its ``started`` record could not be written to the delivery journal: the turn never ran and is
    # queued again, not failed (``turns.not_recorded``)
    unrecorded: BaseException | None = None


@dataclass(frozen=True, slots=True)
class OwnerTurnReturned:
    """A live owner's turn returned after the ProfileActor that handed it crashed (told to the Dispatcher).

    The Dispatcher hands ``result`` to the profile's restarted ProfileActor: that one started
    no turn while the owner still had this one (``ProfileSalvage.owner_busy``).
    """

    profile: str
    result: TurnFinished


@dataclass(frozen=True, slots=True)
class RunSalvaged:
    """A restarted ProfileActor tells itself to run the queue it took over.

    Never from ``on_start``: a turn that crashes there would bypass the crash handling
    (no salvage, no restart), and every DM behind it would wait for ever.
    """


@dataclass(frozen=True, slots=True)
class WaitExpired:
    """Timer (one per profile, re-armed): the oldest queued delivery's wait budget ran out."""


@dataclass(frozen=True, slots=True)
class TurnTimeout:
    """Timer: the running turn of ``delivery_id`` exceeded ``turn_timeout_seconds``."""

    delivery_id: str


@dataclass(frozen=True, slots=True)
class TimedOutTurnPlace:
    """To a ProfileActor, from the thread that ends a timed-out turn: whether a turn process of ours ran it.

    The runner's ``running_turns()`` (runner code) is asked there, bounded, never in the actor
    (``turns.turn_process_running``); the actor gives the turn up on this answer.
    """

    delivery_id: str
    live: bool | None  # listed by running_turns(); None: the hook raised or did not answer (not known)


@dataclass(frozen=True, slots=True)
class IdleCheck:
    """Timer: stop the ProfileActor if it stayed idle long enough."""


@dataclass(frozen=True, slots=True)
class WindDown:
    """Ask a ProfileActor to cancel what is queued and report what is running."""

    keep_journaled: bool = False  # drop journaled queued deliveries without an outcome: the next start re-offers them


@dataclass(frozen=True, slots=True)
class ResumeTurns:
    """Told by the Dispatcher to a ProfileActor holding its turns for the journal (``TurnHeld``): the journal may take
    records again (a commit landed, or its retry timer fired): the held turn starts again, its record written again."""


@dataclass(frozen=True, slots=True)
class StopProfile:
    """Told by the Dispatcher to a ProfileActor it removed from its table."""


# ── RosterActor (local/roster.py): who exists ────────────────────────────


@dataclass(frozen=True, slots=True)
class Reload:
    """Re-read profiles and config from disk and publish if anything changed."""


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Subscribe ``ref`` to RosterChanged (answered with the current snapshot)."""

    ref: pykka.ActorRef[Any]


@dataclass(frozen=True, slots=True)
class GetSnapshot:
    """Ask the RosterActor for its current snapshot."""


@dataclass(frozen=True, slots=True)
class RosterTick:
    """Timer: look for profile changes on disk."""


@dataclass(frozen=True, slots=True)
class RemoteRosterHint:
    """Told to the RosterActor: ``roster.json`` may have changed."""


@dataclass(frozen=True, slots=True)
class RemoteRows:
    """Told to the RosterActor by a transport that owns the remote roster (Redis): replaces it."""

    rows: tuple[RemoteAgent, ...]
    mtime: float  # wall-clock time the rows were read (their freshness)
    unreachable: str = ""  # the Redis address while it is unreachable (the rows are the last ones read)


# ── NotifierActor (local/notifier.py): one subscriber's callback ─────────


@dataclass(frozen=True, slots=True)
class Notify:
    """Told to the subscribers (``Notifier.tell``): run their callbacks for one event (a room's: only for
    those subscribed with ``rooms``)."""

    outcome: dict[str, Any]
    details: dict[str, Any] = field(default_factory=dict)  # sender, target, latency_seconds: opted-in only


@fast_init
@dataclass(frozen=True, slots=True)
class NotifyOutcomes:
    """Told to every subscriber by the Dispatcher (``Notifier.tell``): DM outcomes, in the order they were published.

    Each note is ``(outcome dict, its delivery or None, publish time)``; a subscriber's NotifierActor
    builds the ``details=True`` fields from the delivery only when that subscriber wants them.
    """

    notes: tuple[tuple[dict[str, Any], Delivery | None, float], ...]


@dataclass(frozen=True, slots=True)
class Flush:
    """Ask a subscriber's NotifierActor to answer once everything told before it ran."""


# ── RelayActor (relay/relay_actor.py) and RedisRelayActor (transports/redis/): DMs between connections ───


@dataclass(frozen=True, slots=True)
class RelaySend:
    """Ask the RelayActor to enqueue an envelope for ``route`` (answered with the ack/refusal)."""

    route: RelayRoute
    delivery: Delivery


@dataclass(frozen=True, slots=True)
class PeerSend:
    """Ask a relay that reaches peers (Redis) to carry a ``bot_peers`` DM; answered with an ack/refusal or None."""

    route: PeerRoute
    delivery: Delivery


@dataclass(frozen=True, slots=True)
class RelayOutcome:
    """Told by the Dispatcher to the RelayActor: a relayed-in delivery settled; write its reply.

    ``put_back``: the stop cancelled it (``cancelled``, told while the gateway stops); unless
    its turn started, the relay keeps the envelope for the next start instead of answering.
    """

    outcome: Outcome
    reply_connection: str
    put_back: bool = False


@dataclass(frozen=True, slots=True)
class ForgetSent:
    """Told by the Dispatcher: the outcome of our envelope ``envelope_id`` (``RelayedOutcome``) is kept
    where it must be (journaled, or published when there is no journal); clear the envelope's record."""

    envelope_id: str


@dataclass(frozen=True, slots=True)
class ResumeRelay:
    """Asked by the Gateway at start: answers the ``RelayResumed`` entries (None: the transport is unreachable).

    The Gateway registers them with the Dispatcher by an ask: ``start()`` returns once each resumed id is answerable.
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


# ── the Desktop's relay RPC (``Gateway.relay_*``), asked of the RelayActor, which owns the files ───


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

    future: pykka.ThreadingFuture[dict[str, str]]  # {"reply", "error", "reason"}


@dataclass(frozen=True, slots=True)
class DesktopReply:
    """``bot_relay.reply``: write this reply record (first write wins); answered True when it was stored."""

    record: dict[str, Any]


# ── RedisRelayActor only ─────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class RedisEntries:
    """Told by the Redis reader thread to its actor: entries read from one of our streams."""

    stream: str  # "in" | "replies"
    entries: tuple[tuple[str, dict[Any, Any]], ...]  # (entry id, fields)
    read: bool = False  # read by the reader thread (its inbox entries count against the InboxRoom until handled)


@dataclass(frozen=True, slots=True)
class RedisTick:
    """Timer: the Redis actor's periodic work (heartbeat, roster, touch, reclaim, retries)."""


# ── RoomActor (rooms/room_actor.py): one per group room, asked through ``Rooms`` (rooms/rooms.py) ───


@dataclass(frozen=True, slots=True)
class RoomSend:
    """Ask a RoomActor to accept a message; answered with the ack or refusal dict once it is on disk.

    ``snapshot`` is the roster now: names in the text (and the sender's) resolve against it.
    """

    sender: str
    text: Any
    snapshot: RosterSnapshot


@dataclass(frozen=True, slots=True)
class MemberTurnDone:
    """Told to the RoomActor (through the Dispatcher) when a member's turn settled."""

    turn_id: str
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class GetTranscript:
    """Ask for the transcript: a list of ``{message_id, author, text, at, round, status}`` dicts."""


@dataclass(frozen=True, slots=True)
class GetSummary:
    """Ask for the room's ``list_rooms`` row: ``room_id``, ``name``, ``members``, ``state``, ``messages``,
    ``last_activity``."""


@dataclass(frozen=True, slots=True)
class AwaitIdle:
    """Ask for a future resolved with the room's state once it is not ``busy``."""


@dataclass(frozen=True, slots=True)
class Halt:
    """Ask the RoomActor to start no further member turns (the gateway is stopping)."""


@dataclass(frozen=True, slots=True)
class Disband:
    """Ask the RoomActor to delete its file and end; answered with the room dict."""


# ── RoomsTakeover (rooms/rooms.py): while another process holds the rooms owner lock ───


@dataclass(frozen=True, slots=True)
class RoomsTick:
    """Timer (``RoomsTakeover``, rooms/rooms.py): try to take the root's rooms over (their owner lock is free now?)."""


# ── HubActor (relay/hub.py) ──────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class RosterPush:
    """Timer (hub): push every root the others' roster with online flags."""


@dataclass(frozen=True, slots=True)
class InboxDeadline:
    """Timer (hub): an envelope the hub found in ``connection``'s ``inbox/`` reaches its sender's TTL."""

    connection: str
    envelope_id: str
