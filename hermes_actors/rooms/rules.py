"""Pure rules of a group room: who may be in it, what may be sent, who speaks next, when it settles.

No I/O, no clock, no actor: the RoomActor feeds these functions and applies
their answers. Table-tested in ``tests/test_rooms_rules.py``.

A send opens up to :data:`MAX_ROUNDS` serial rounds. Round 1's responders are
the members the sent text @-mentions (every member but the sender when it
mentions none); round N+1's are the members mentioned by round N's replies
(every member when they mention none). Each responder replies briefly or
passes (a silence marker); a round in which nobody spoke settles the send, as
do :data:`MAX_MESSAGES_PER_SEND` replies and a reply mentioning ``@user``
(the room then "needs you" once the current round ends).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hermes_actors.core.clipping import shown
from hermes_actors.core.outcomes import AMBIGUOUS_TAIL, as_sentence
from hermes_actors.core.targets import MESSAGE_MAX_CHARS, Refusal, refuse, text_problem
from hermes_actors.errors import HostileFileError

__all__ = [
    "MAX_MEMBERS",
    "MAX_MESSAGES_PER_SEND",
    "MAX_ROUNDS",
    "MIN_MEMBERS",
    "NAME_MAX_CHARS",
    "USER",
    "Round",
    "Spoken",
    "after_turn",
    "entry_lines",
    "failed_turn_text",
    "find_mentions",
    "find_room",
    "interrupted_turn_text",
    "name_problem",
    "name_taken",
    "no_room",
    "not_disbanded",
    "open_round",
    "plan_members",
    "room_session",
    "send_refusal",
    "turn_text",
    "unrecorded",
]

MIN_MEMBERS = 2
MAX_MEMBERS = 6
MAX_ROUNDS = 3
MAX_MESSAGES_PER_SEND = 10
NAME_MAX_CHARS = 64
USER = "user"  # the human's author name, and the mention that marks the room "needs you"

# what a room id looks like (core.ids.new_delivery_id), in either case: a room reference is compared case-insensitively
_ROOM_ID_SHAPE = re.compile(r"[0-9a-fA-F]{32}")

# '@' not preceded by a word character (so 'a@b.c' mentions nobody), then a handle-like token.
_MENTION_RE = re.compile(r"(?<![\w@])@([A-Za-z0-9][A-Za-z0-9_.-]*)")

Resolve = Callable[[str], "str | None"]


def room_session(name: str) -> str:
    """The session every member's turns of room ``name`` run in."""
    return f"Group: {name}"


def name_problem(name: Any, *, new: bool = True) -> str | None:
    """Why ``name`` cannot name a room, or None.

    Args:
        name: the name as given.
        new: a name for a new room; False for the name in an existing room's file, which
            predates the `` #`` and room-id rules and still loads (quarantining it would lose the room).

    Returns:
        The error text, or None when the (stripped) name is usable.
    """
    if not isinstance(name, str):
        return f"room name must be text, not {type(name).__name__}"
    text = name.strip()
    if not text:
        return "room name is required"
    if len(text) > NAME_MAX_CHARS:
        return f"room name too long ({len(text)} chars > {NAME_MAX_CHARS})"
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        return "room name contains a control character"
    if new and _ROOM_ID_SHAPE.fullmatch(text):
        # a room is named by its id or its name: a name shaped like an id could be taken for another room's id
        return (f"room name {text!r} has the form of a room id (32 hex digits), so it could be taken for another "
                "room's id; choose another name")
    if new and " #" in text:
        # hermes resolves a session title "<t>" to its newest "<t> #<n>" continuation: the sessions
        # "Group: plan #launch" would be taken for room "plan"'s ("Group: plan")
        return (f"room name {text!r} contains ' #' (hermes treats 'Group: <name> #…' as a continuation of the "
                "session 'Group: <name>'); choose a name without ' #'")
    return text_problem("room name", text)


def _room_key(text: str) -> str:
    """How a room reference, a room's id and a room's name are compared: stripped, case-insensitive."""
    return text.strip().lower()


def find_room(rooms: Iterable[tuple[str, str]], room: Any) -> str:
    """Which room ``room`` names: the one whose id or name it is (stripped, case-insensitive).

    A name may not have the form of a room id (:func:`name_problem`), so a reference names one room; a
    room named before that rule with another room's id is never taken for either: the reference is refused.

    Args:
        rooms: (room id, name) of every room.
        room: the reference as given.

    Returns:
        The room's id.

    Raises:
        KeyError: it names no room (:func:`no_room`), or two rooms (one's id, the other's name), naming both.
    """
    if not isinstance(room, str):
        raise no_room(room)
    want = _room_key(room)
    hits = {room_id: name for room_id, name in rooms if want in (_room_key(room_id), _room_key(name))}
    if not hits:
        raise no_room(room)
    if len(hits) == 1:
        return next(iter(hits))
    parts = [f"the id of room {name!r}" if _room_key(room_id) == want else f"the name of room {room_id}"
             for room_id, name in sorted(hits.items(), key=lambda hit: (_room_key(hit[0]) != want, hit[0]))]
    raise KeyError(f"room {shown(room)} is ambiguous: it is {' and '.join(parts)}; nothing was done: pass a name or "
                   "id that is only one room's (Gateway.list_rooms(); on the command line: hermes-actors room list)")


def name_taken(names: Iterable[str], name: str) -> str | None:
    """Why a new room cannot be called ``name`` because of the rooms there are, or None.

    Args:
        names: the names of every room.
        name: the new room's name, already usable (:func:`name_problem`).

    Returns:
        The error text when a room of that name (compared as :func:`find_room` compares) exists.
    """
    want = _room_key(name)
    if any(_room_key(other) == want for other in names):
        return f"a room named {name.strip()!r} exists already"
    return None


def no_room(room: Any) -> KeyError:
    """The error for a reference that names no room."""
    return KeyError(f"no room {shown(room)}: pass the id or name of an existing room (Gateway.list_rooms(); "
                    "on the command line: hermes-actors room list)")


def unrecorded(name: str, what: str, why: str, undone: str) -> RuntimeError:
    """The error a room call raises when the room's file could not be written: nothing of the call is kept.

    One rule for ``create_room`` and ``room_send`` (a full disk, a ``rooms/`` swapped for a symlink).

    Args:
        name: the room's name.
        what: what was to be recorded (``"the room"``, ``"the message"``).
        why: why the write failed (the store's text, naming the file or directory).
        undone: what did not happen (``"created"``, ``"sent"``).

    Returns:
        The ``RuntimeError`` to raise (``room 'plan' could not record the message durably (<why>); it was NOT sent``).
    """
    return RuntimeError(f"room {name!r} could not record {what} durably ({why}); it was NOT {undone}")


def not_disbanded(name: str, path: object, exc: BaseException) -> RuntimeError:
    """The error ``disband_room`` raises when the room's file could not be deleted: the room stays, nothing changed.

    One rule for the gateway's disband and the host-less ``room disband`` (``RoomsOnDisk``).

    Args:
        name: the room's name.
        path: its file (``…/bot_relay/rooms/<room_id>.json``).
        exc: why the deletion failed; a :class:`~hermes_actors.errors.HostileFileError` (``rooms/`` swapped for a
            symlink or a file, another user's) adds what to do, as nothing was deleted through it.

    Returns:
        The ``RuntimeError`` to raise (``room 'plan' is not disbanded: its file … could not be deleted (<why>)``).
    """
    text = f"room {name!r} is not disbanded: its file {path} could not be deleted ({exc})"
    if isinstance(exc, HostileFileError):
        text += ("; nothing was deleted and the room stays. Put this user's real directory back in its place (the "
                 "next gateway start moves a symlink or a file there into quarantine/), then disband the room again")
    return RuntimeError(text)


def plan_members(raw: Any, resolve: Resolve) -> tuple[str, ...] | str:
    """Resolve the members of a new room.

    Args:
        raw: the members as given (names as ``message_agent`` targets accept them).
        resolve: maps a name to a local profile's folder id (None: nobody).

    Returns:
        The folder ids in the given order, or the error text naming what is wrong.
    """
    if isinstance(raw, str) or not isinstance(raw, Sequence):
        return f"members must be a list of names, not {type(raw).__name__}"
    members: list[str] = []
    for name in raw:
        if not isinstance(name, str) or not name.strip():
            return f"member {shown(name)} is not a name"
        if name.strip().removeprefix("@").lower() == USER:
            return f"'{USER}' is the human's name in a room; it cannot be a member"
        folder = resolve(name)
        if folder is None:
            return f"unknown member {shown(name)}: no local profile with that name"
        if folder in members:
            return f"member {shown(name)} is listed twice"
        members.append(folder)
    if not MIN_MEMBERS <= len(members) <= MAX_MEMBERS:
        return f"a room has {MIN_MEMBERS} to {MAX_MEMBERS} members, not {len(members)}"
    return tuple(members)


def send_refusal(sender: Any, text: Any, members: Sequence[str], resolve: Resolve) -> Refusal | str:
    """Validate one ``room_send``: the sender's author name (``user`` or a member's folder id), or a refusal.

    Args:
        sender: ``"user"`` or a member's name.
        text: the message.
        members: the room's folder ids.
        resolve: maps a name to a folder id.

    Returns:
        The sender's folder id (or ``"user"``), or a :class:`Refusal`.
    """
    if not isinstance(sender, str) or not sender.strip():
        return refuse(f"sender is required: '{USER}' or a member of the room")
    if sender.strip().lower() == USER:
        who = USER
    else:
        folder = resolve(sender)
        if folder is None and sender.strip() in members:  # a member whose profile left the root
            return refuse(f"Sender {sender!r} is a member of this room, but no profile of that name is on this root "
                          "any more.")
        if folder is None or folder not in members:
            return refuse(f"Unknown sender {shown(sender)}: not a member of this room (members: {', '.join(members)}).")
        who = folder
    if text is not None and not isinstance(text, str):
        return refuse(f"text must be a string, not {type(text).__name__}")
    body = (text or "").strip()
    if not body:
        return refuse("text is required — write what you want to say to the room.")
    problem = text_problem("text", body)
    if problem is not None:
        return refuse(problem)
    if len(body) > MESSAGE_MAX_CHARS:
        return refuse(f"text too long ({len(body)} chars > {MESSAGE_MAX_CHARS}).")
    return who


def find_mentions(text: str, members: Sequence[str], resolve: Resolve) -> tuple[tuple[str, ...], bool]:
    """The members ``text`` @-mentions (room order) and whether it mentions ``@user``.

    Args:
        text: a message.
        members: the room's folder ids.
        resolve: maps a name (handle, folder id, friendly-name slug) to a folder id.

    Returns:
        (mentioned folder ids in the room's order, True when ``@user`` is mentioned).
    """
    hit: set[str] = set()
    user = False
    for token in _MENTION_RE.findall(text):
        token = token.rstrip(".-")
        folder = resolve(token)
        if folder is not None and folder in members:
            hit.add(folder)
        elif token.lower() == USER:
            user = True
    return tuple(m for m in members if m in hit), user


@dataclass(frozen=True, slots=True)
class Round:
    """Where one send's deliberation stands.

    Attributes:
        send_id: the message id of the send.
        number: the round (1 to :data:`MAX_ROUNDS`).
        queue: members still to take their turn this round, in order.
        said: replies posted this round.
        posted: replies posted for this send.
        mentioned: members the replies of this round mentioned (they answer next round).
        needs_you: a reply mentioned ``@user``.
    """

    send_id: str
    number: int
    queue: tuple[str, ...]
    said: int = 0
    posted: int = 0
    mentioned: tuple[str, ...] = ()
    needs_you: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "send": self.send_id, "round": self.number, "queue": list(self.queue), "said": self.said,
            "posted": self.posted, "mentioned": list(self.mentioned), "needs_you": self.needs_you,
        }


@dataclass(frozen=True, slots=True)
class Spoken:
    """What one member's turn contributed: nothing (a pass), or a reply and its mentions."""

    replied: bool
    mentioned: tuple[str, ...] = ()
    mentions_user: bool = False


def _ordered(members: Sequence[str], chosen: Iterable[str]) -> tuple[str, ...]:
    wanted = set(chosen)
    return tuple(m for m in members if m in wanted)


def open_round(send_id: str, members: Sequence[str], sender: str, mentioned: Sequence[str]) -> Round:
    """Round 1 of a send: the mentioned members, else every member but the sender.

    Args:
        send_id: the sent message's id.
        members: the room's folder ids, in order.
        sender: ``"user"`` or the sending member's folder id.
        mentioned: the members the sent text mentions.

    Returns:
        The first round.
    """
    chosen = [m for m in mentioned if m != sender] or [m for m in members if m != sender]
    return Round(send_id, 1, _ordered(members, chosen))


def after_turn(current: Round, members: Sequence[str], member: str, spoken: Spoken) -> Round | None:
    """The round after ``member``'s turn, or None when the send has settled.

    Args:
        current: the round the turn belonged to (``member`` heads its queue).
        members: the room's folder ids, in order.
        member: who took the turn.
        spoken: what the turn contributed.

    Returns:
        The next state (the same round with the queue advanced, or the next round),
        or None: a full round stayed silent, the reply cap or the round cap was
        reached, or ``@user`` was mentioned and the round is over.
    """
    queue = tuple(m for m in current.queue if m != member)
    state = replace(current, queue=queue)
    if spoken.replied:
        mentioned = set(state.mentioned) | {m for m in spoken.mentioned if m != member}
        state = replace(
            state, said=state.said + 1, posted=state.posted + 1, mentioned=_ordered(members, mentioned),
            needs_you=state.needs_you or spoken.mentions_user,
        )
        if state.posted >= MAX_MESSAGES_PER_SEND:
            return None
    if state.queue:
        return state
    if state.said == 0 or state.number >= MAX_ROUNDS or state.needs_you:
        return None
    return Round(state.send_id, state.number + 1, state.mentioned or tuple(members), posted=state.posted)


# A member turn fails with the texts of a DM's turn (local/turns.never_ran: "…; the DM was NOT delivered.
# Resend shortly."). In a room it is no DM, and nothing is to be resent: the failed turn counts as a pass.
_DM_NOT_DELIVERED = re.compile(r"\b(?:the|this) DM was NOT delivered\.(?: Resend[^.]*\.)?")
_DM = re.compile(r"\b(?:the|this) DM\b")


def failed_turn_text(reason: str, error: str) -> str:
    """Pure: the transcript text of a member turn that failed, its DM wording said of the member's turn.

    Args:
        reason: the outcome's reason (``runtime_offline``, ``target_busy``...).
        error: the outcome's error text.

    Returns:
        ``(turn failed [<reason>]: <error>)``.
    """
    text = _DM_NOT_DELIVERED.sub("the member's turn did not run (it counts as a pass).", error)
    return f"(turn failed [{reason}]: {_DM.sub('the turn', text)})"


def interrupted_turn_text(error: str) -> str:
    """Pure: the transcript text of a member turn that may have run and whose result is unknown (status
    ``interrupted``), said of the member's turn: it is never run again, and counts as a pass.

    The why is the turn's own (the gateway stopped during it, the member's ProfileActor crashed settling it, …);
    a DM's advice to its sender (:data:`~hermes_actors.core.outcomes.AMBIGUOUS_TAIL`) is left out: the room
    resends nothing.

    Args:
        error: why its result is unknown: an ``ambiguous`` outcome's error text, or the room's own words.

    Returns:
        ``(interrupted: <why> It may have run; it was not run again.)``.
    """
    why = as_sentence(_DM.sub("the turn", error.removesuffix(AMBIGUOUS_TAIL)).strip())
    return f"(interrupted: {why or 'Its result is unknown.'} It may have run; it was not run again.)"


_CONTINUATION = "  "  # before every further line of a message: only an entry's first line starts a line


def entry_lines(author: str, text: str) -> str:
    """Pure: one message as ``author: <first line>``, each further line indented by :data:`_CONTINUATION`.

    A reply's own lines can then never pass for other entries (``user: …``, ``@carol: …``).
    """
    first, *rest = text.splitlines() or [""]
    return "\n".join([f"{author}: {first}", *(_CONTINUATION + line for line in rest)])


def turn_text(name: str, handles: Sequence[str], entries: Sequence[tuple[str, str]]) -> str:
    """The content of one member's turn: the room's messages since its last turn, attributed.

    Every message starts a line with its author (``user:``, ``@bob:``); its further lines
    are indented, so a line that starts with an author always is a message of that author.

    Args:
        name: the room's name.
        handles: the members' handles.
        entries: (author label, text) of each new message, oldest first.

    Returns:
        The turn's text.
    """
    lines = [
        f"Group room '{name}' (members: {', '.join('@' + h for h in handles)}). "
        "New messages since your last turn:",
        *(entry_lines(author, text) for author, text in entries),
        "Reply briefly to the room, or answer [SILENT] to pass. Mention @user to ask the human.",
    ]
    return "\n".join(lines)
