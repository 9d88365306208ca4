"""The policy retry of a failed Bot Chat turn, on a hermes that cannot resume one.

A failed turn earns one retry in the same session (``core.reasons.retry_action``).
Newer Hermes releases resume the unanswered turn (``HERMES_RESUME_UNANSWERED_TURN``);
hermes-agent 0.19 knows no such thing, and it has already stored the DM as a user
message when the provider failed. Sending the DM again would put it in the session
twice (hermes then merges the two user messages: the model reads the DM twice).

So before the retry we look at what the failed attempt left in the session
(:func:`plan_retry`, pure) and act on it (:func:`prepare_bot_chat_retry`):

- nothing since the attempt began: the DM never reached the session; resend it;
- exactly the DM's user message: take it back the way hermes' own ``/undo`` does
  (``SessionDB.rewind_to_message``, a soft delete), then resend: the session
  reads as if the first attempt never happened;
- anything more (the model answered, called tools, or someone else wrote):
  the model already worked on the DM, and resending would repeat it or its
  side effects: no retry; the first failure stands.

A turn can also die without a failure to act on: its process or gateway was killed
mid-turn, or a stop ended it (its DM is ``ambiguous``, and the host that ran it may
be gone). Its DM stays in the session as a user message nothing answers, and hermes
would merge it into the bot's next turn — whose answer goes to the next DM's sender
alone. So before a turn, under the bot's turn lock, :func:`take_back_unanswered`
takes back the DMs a session ends with unanswered (:func:`plan_take_back`, pure). Only
those (a DM begins with the sender's signature): a person typing in the session is not
under our lock, and their message may be a live turn's. A wake-up message (an outcome's
text) a dead turn left stays: a wake that may have started is never run again, so taking
its text back would leave the bot never knowing the outcome; merged into its next turn,
it is read late but read. A wake whose text never reached the session did not run: a
restart offers it again (:func:`text_stored_since` tells).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from hermes_actors.core.targets import DM_SIGNATURE_START
from hermes_actors.hermes.sessions import read_sqlite, resolve_title, session_db_class

__all__ = [
    "RESEND",
    "REWIND",
    "SKIP",
    "RetryPlan",
    "plan_retry",
    "plan_take_back",
    "prepare_bot_chat_retry",
    "take_back_unanswered",
    "text_stored_since",
    "unanswered_since",
]

_TAIL_ROWS = 64  # the session's last active messages looked at before a turn
_HEAD_CHARS = 512  # of each: enough for a DM's signature or an outcome's first words (a long label included)
_STORED_SLACK = 1.0  # seconds before ``since`` a message still counts (a wrong "never stored" runs a turn twice)

RESEND = "resend"
REWIND = "rewind"
SKIP = "skip"


@dataclass(frozen=True)
class RetryPlan:
    """What to do before the retry: :data:`RESEND`, :data:`REWIND` (``message_id``), or :data:`SKIP`."""

    action: str
    message_id: int | None = None


def plan_retry(since_attempt: Sequence[tuple[int, str, Any]], content: str) -> RetryPlan:
    """Decide the retry from the session's active messages stored since the failed attempt began.

    Args:
        since_attempt: ``(id, role, content)`` of each active message stored since the
            first attempt began, oldest first.
        content: the DM text the attempt sent.

    Returns:
        :data:`RESEND` when nothing was stored; :data:`REWIND` of the one message when it
        is exactly the DM as a user message; :data:`SKIP` otherwise.
    """
    if not since_attempt:
        return RetryPlan(RESEND)
    if len(since_attempt) == 1:
        message_id, role, text = since_attempt[0]
        if role == "user" and text == content:
            return RetryPlan(REWIND, message_id)
    return RetryPlan(SKIP)


def prepare_bot_chat_retry(home: Path, title: str, content: str, since: float) -> bool:
    """Make the profile's titled session ready for the retry of a failed turn.

    Args:
        home: the profile home (its ``state.db``).
        title: the session title (``Bot Chat``).
        content: the DM text.
        since: the wall-clock time (``time.time()``) the failed attempt began.

    Returns:
        True when the retry may run (nothing stored, or the stored DM was taken back);
        False when it must not (the model already worked on the DM, or the session
        cannot be read with hermes' own ``SessionDB`` in this interpreter).

    Raises:
        Exception: whatever hermes' ``SessionDB`` raises reading or rewinding (the
            caller treats it as "no retry").
    """
    db_path = Path(home) / "state.db"
    if not db_path.is_file():
        return True  # no session database yet: the attempt stored nothing
    session_db = session_db_class()
    if session_db is None:
        logger.info("no retry: hermes' SessionDB is not importable here to check what the failed turn stored")
        return False
    db = session_db(db_path=db_path)
    try:
        session_id = db.resolve_session_by_title(title)
        if not session_id:
            return True
        stored = [
            (int(m["id"]), str(m.get("role")), m.get("content"))
            for m in db.get_messages(session_id)
            if float(m.get("timestamp") or 0.0) >= since
        ]
        plan = plan_retry(stored, content)
        if plan.action == REWIND and plan.message_id is not None:
            db.rewind_to_message(session_id, plan.message_id)
            logger.info("took back the unanswered DM (message {}) of {!r} in {}, left by the failed attempt",
                        plan.message_id, title, db_path)
        elif plan.action == SKIP:
            logger.info("no retry: the failed turn already stored {} message(s) in {!r} of {}",
                        len(stored), title, db_path)
        return plan.action != SKIP
    finally:
        db.close()


def plan_take_back(tail: Sequence[tuple[int, str, Any]]) -> int | None:
    """Decide what dead turns left unanswered, from a session's last active messages.

    Args:
        tail: ``(id, role, content)`` of the session's last active messages, oldest first.

    Returns:
        The id of the first of the DMs (user messages that begin with a DM's signature) the
        session ends with — taking it back takes back every one after it too — or None when
        the session does not end with one (an answer, a tool step, a wake-up message, or a
        person's message).
    """
    first = None
    for message_id, role, content in reversed(tail):
        if role != "user" or not isinstance(content, str) or not content.startswith(DM_SIGNATURE_START):
            break
        first = message_id
    return first


@dataclass(frozen=True)
class _Unanswered:
    """The DMs a session ends with that no turn answered (:func:`plan_take_back`)."""

    session_id: str
    first: int  # the first one's message id: a rewind to it takes back every message after it too
    count: int
    stored_at: float | None  # when hermes stored the first one (its ``timestamp``)


def _read_unanswered(db_path: Path, title: str, *, quiet: bool) -> _Unanswered | None:
    """What ``title`` in ``db_path`` ends with unanswered; None when nothing, or it does not read (logged:
    at DEBUG when ``quiet``, else WARNING)."""
    if not db_path.is_file():
        return None
    try:
        return read_sqlite(db_path, lambda conn: _unanswered(conn, title))
    except sqlite3.Error as exc:
        logger.log("DEBUG" if quiet else "WARNING", "cannot read {} to look for a dead turn's unanswered messages: {}",
                   db_path, exc)
        return None


def _unanswered(conn: sqlite3.Connection, title: str) -> _Unanswered | None:
    found = _session_tail(conn, title)
    if found is None:
        return None
    session_id, tail = found
    first = plan_take_back(tail)
    if first is None:
        return None
    row = conn.execute("SELECT timestamp FROM messages WHERE id = ?", (first,)).fetchone()
    stored_at = float(row[0]) if row is not None and isinstance(row[0], int | float) else None
    return _Unanswered(session_id, first, sum(1 for message_id, _, _ in tail if message_id >= first), stored_at)


def take_back_unanswered(home: Path, title: str) -> int:
    """Before a turn in a profile's titled session: take back the DMs it ends with that no turn answered.

    Call it only while holding the profile's turn lock and once no turn of that profile can
    still be running anywhere (a stopping gateway's included): then a user message the session
    ends with belongs to a turn that died. Taken back with hermes' own ``rewind_to_message``
    (a soft delete, kept on disk for inspection). Never raises: an unreadable session is logged
    and left as it is.

    Args:
        home: the profile home (its ``state.db``).
        title: the session title (``Bot Chat``, ``Group: <name>``).

    Returns:
        How many messages were taken back.
    """
    db_path = Path(home) / "state.db"
    found = _read_unanswered(db_path, title, quiet=False)
    if found is None:
        return 0
    session_db = session_db_class()
    if session_db is None:
        logger.warning("{} unanswered message(s) end {!r} of {}, left by a turn that died; hermes' SessionDB is not "
                       "importable here to take them back: the next turn reads them too", found.count, title, db_path)
        return 0
    try:
        db = session_db(db_path=db_path)
        try:
            db.rewind_to_message(found.session_id, found.first)
        finally:
            db.close()
    except Exception as exc:  # hermes' own code: whatever it raises leaves the session as it was
        logger.warning("could not take back the unanswered message(s) ending {!r} of {}: {}", title, db_path, exc)
        return 0
    logger.warning("took back {} unanswered message(s) ending {!r} of {} (from message {}): a turn that died or was "
                   "ended (timed out, or its gateway stopped) left them; hermes would have merged them into this turn",
                   found.count, title, db_path, found.first)
    return found.count


def unanswered_since(home: Path, title: str) -> float | None:
    """When hermes stored the first of the DMs a profile's titled session ends with unanswered.

    Args:
        home: the profile home (its ``state.db``).
        title: the session title.

    Returns:
        Its ``timestamp`` (wall clock), or None: the session does not end with one (see
        :func:`plan_take_back`), or it does not read.
    """
    found = _read_unanswered(Path(home) / "state.db", title, quiet=True)
    return None if found is None else found.stored_at


def _session_tail(conn: sqlite3.Connection, title: str) -> tuple[str, list[tuple[int, str, Any]]] | None:
    session_id = resolve_title(conn, title)
    if session_id is None:
        return None
    rows = conn.execute(  # only a message's beginning is looked at: a long one is not read whole
        "SELECT id, role, substr(content, 1, ?) FROM messages WHERE session_id = ? AND active = 1 "
        "ORDER BY id DESC LIMIT ?",
        (_HEAD_CHARS, session_id, _TAIL_ROWS),
    ).fetchall()
    return session_id, [(int(row[0]), str(row[1]), row[2]) for row in reversed(rows)]


def text_stored_since(home: Path, text: str, since: float) -> bool | None:
    """Whether hermes stored a user message holding the beginning of ``text`` in a profile's ``state.db``
    since ``since`` (a second's slack), in any session, taken back or not.

    How a restart tells that a wake a dead host started never ran: its turn's whole user message is
    the wake's text (:func:`hermes_actors.core.wake.wake_delivery`), which hermes stores as the turn
    begins. Only its first :data:`_HEAD_CHARS` characters are looked for, anywhere in a message, so a
    text hermes cut or prefixed is still found: a false "stored" keeps the wake unrun, never runs it twice.

    Args:
        home: the profile home (its ``state.db``).
        text: the turn's user message.
        since: the wall-clock time (``time.time()``) before which no turn of it began.

    Returns:
        True or False; None when it cannot be told (no ``state.db``, or it does not read: logged).
    """
    db_path = Path(home) / "state.db"
    if not db_path.is_file():
        return None
    try:
        row = read_sqlite(db_path, lambda conn: conn.execute(
            "SELECT 1 FROM messages WHERE role = 'user' AND timestamp >= ? AND instr(content, ?) > 0 LIMIT 1",
            (since - _STORED_SLACK, text[:_HEAD_CHARS]),
        ).fetchone())
    except sqlite3.Error as exc:
        logger.warning("cannot read {} to tell whether a turn's message reached it: {}", db_path, exc)
        return None
    return row is not None
