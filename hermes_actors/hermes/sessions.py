"""A profile's "Bot Chat" session in its ``state.db`` (hermes-agent's SessionDB).

Lookup follows hermes' own ``-c NAME`` resolution (``SessionDB.resolve_session_by_title``):
the newest ``"<title> #N"`` continuation when one exists, else the exact title.
Titles are unique (a unique index on ``sessions.title``).

Three ways, best first: hermes' ``SessionDB`` when ``hermes_state`` imports in
this interpreter; plain sqlite on an existing ``state.db``; for a profile that
has no ``state.db`` yet, hermes' own interpreter (from the CLI's shebang) runs
``SessionDB`` so the schema is hermes' and never ours.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from loguru import logger

from hermes_actors.hermes.install import hermes_python
from hermes_actors.messages import BOT_CHAT_SESSION

__all__ = [
    "EMPTY_ANSWER", "SESSION_SOURCE", "BotChatError", "ensure_bot_chat", "final_answer_since", "find_bot_chat",
    "new_session_id",
    "read_only_uri",
    "read_sqlite",
    "resolve_title",
    "session_db_class",
]

SESSION_SOURCE = "cli"  # the turns that use the session are CLI turns
_SQLITE_TIMEOUT = 10.0
T = TypeVar("T")
_HELPER_TIMEOUT = 120.0

# Runs inside hermes' interpreter: argv = [home, title, session_id, source].
_HELPER = r"""
import json, sys
from pathlib import Path
from hermes_state import SessionDB
home, title, new_id, source = sys.argv[1:5]
db = SessionDB(db_path=Path(home) / "state.db")
try:
    found = db.resolve_session_by_title(title)
    created = False
    if not found:
        db.create_session(new_id, source, cwd=home)
        try:
            db.set_session_title(new_id, title)
            found, created = new_id, True
        except ValueError:
            found = db.resolve_session_by_title(title)
    print(json.dumps({"id": found, "created": created}))
finally:
    db.close()
"""


class BotChatError(RuntimeError):
    """The Bot Chat session could not be found or created."""


def new_session_id() -> str:
    """A session id in the CLI's format, ``YYYYmmdd_HHMMSS_<6 hex>``.

    Returns:
        The id.
    """
    return f"{time.strftime('%Y%m%d_%H%M%S')}_{uuid.uuid4().hex[:6]}"


def session_db_class() -> Any:
    """hermes' ``SessionDB`` class when ``hermes_state`` imports in this interpreter, else None."""
    try:
        from hermes_state import SessionDB
    except Exception:  # hermes-agent is not installed in this interpreter (or broken)
        return None
    return SessionDB


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def resolve_title(conn: sqlite3.Connection, title: str) -> str | None:
    """hermes' ``resolve_session_by_title`` in plain SQL."""
    numbered = conn.execute(
        "SELECT id FROM sessions WHERE title LIKE ? ESCAPE '\\' ORDER BY started_at DESC LIMIT 1",
        (f"{_escape_like(title)} #%",),
    ).fetchone()
    if numbered:
        return str(numbered[0])
    exact = conn.execute("SELECT id FROM sessions WHERE title = ?", (title,)).fetchone()
    return str(exact[0]) if exact else None


def find_bot_chat(home: Path, title: str = BOT_CHAT_SESSION) -> str | None:
    """The id of a profile's titled session, as ``hermes chat -c TITLE`` would resolve it.

    Args:
        home: the profile home.
        title: the session title.

    Returns:
        The session id, or None (no ``state.db`` yet, or no such session).

    Raises:
        BotChatError: the database exists but cannot be read.
    """
    db_path = Path(home) / "state.db"
    if not db_path.is_file():
        return None
    session_db = session_db_class()
    try:
        if session_db is not None:
            db = session_db(db_path=db_path, read_only=True)
            try:
                found = db.resolve_session_by_title(title)
            finally:
                db.close()
            return str(found) if found else None
        return read_sqlite(db_path, lambda conn: resolve_title(conn, title))
    except (sqlite3.Error, OSError) as exc:
        raise BotChatError(f"cannot read {db_path}: {exc}") from exc


def read_only_uri(db_path: Path) -> str:
    """Pure: the sqlite URI that opens ``db_path`` read-only, whatever characters its path has.

    Every byte of the path but ``/`` and the unreserved ones is percent-quoted: a ``?`` or ``#`` in a
    directory name (``~/a?b/profiles/alice``) would otherwise end the path there, cutting ``mode=ro`` off,
    and sqlite would open (and create) the file named by what came before it, read-write; a ``%`` would be
    taken for an escape. Quoted as bytes, so a name that is not UTF-8 is kept as it is on disk.

    Args:
        db_path: the database file.

    Returns:
        ``file:<quoted path>?mode=ro``.
    """
    return f"file:{quote(os.fsencode(db_path))}?mode=ro"


def read_sqlite(db_path: Path, read: Callable[[sqlite3.Connection], T]) -> T:
    """``read(conn)`` on a read-only connection to ``db_path`` (hermes may be writing it meanwhile).

    Raises:
        sqlite3.Error: the database cannot be opened (a missing one is never created) or read.
    """
    conn = sqlite3.connect(read_only_uri(db_path), uri=True, timeout=_SQLITE_TIMEOUT)
    try:
        return read(conn)
    finally:
        conn.close()


EMPTY_ANSWER = "(empty)"  # what hermes 0.19 stores for a model's empty answer (it returns a warning instead)


def final_answer_since(home: Path, session_id: str, since: float) -> tuple[bool, str | None]:
    """The answer hermes stored in ``session_id`` since ``since`` (``time.time()``), if any.

    hermes stores a turn's answer in ``state.db`` before it returns it; a turn whose provider
    failed stores none (only the user message, and the tool-calling steps it got through), even
    where hermes hands the failure text back as if it were the answer (its API server does).
    An assistant message that calls tools is a step, not the answer.

    Args:
        home: the profile home.
        session_id: the session the turn ran in.
        since: when the turn began.

    Returns:
        ``(readable, answer)``: ``answer`` is the last stored answer's text (None: none stored);
        ``readable`` is False when the database cannot be read (then ``answer`` is None).
    """
    db_path = Path(home) / "state.db"
    try:
        row = read_sqlite(db_path, lambda conn: conn.execute(
            "SELECT content FROM messages WHERE session_id = ? AND role = 'assistant' AND active = 1 "
            "AND timestamp >= ? AND (tool_calls IS NULL OR tool_calls IN ('', '[]', 'null')) "
            "ORDER BY id DESC LIMIT 1",
            (session_id, since),
        ).fetchone())
    except sqlite3.Error as exc:
        logger.warning("cannot tell whether hermes answered in {}: {}", db_path, exc)
        return False, None
    return True, (None if row is None else str(row[0] or ""))


def _create_sqlite(db_path: Path, home: Path, title: str) -> tuple[str, bool]:
    """Insert the titled session into an existing state.db (one IMMEDIATE transaction)."""
    conn = sqlite3.connect(str(db_path), timeout=_SQLITE_TIMEOUT, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            found = resolve_title(conn, title)
            if found:
                conn.execute("COMMIT")
                return found, False
            new_id = new_session_id()
            conn.execute(
                "INSERT INTO sessions (id, source, cwd, started_at, title) VALUES (?, ?, ?, ?, ?)",
                (new_id, SESSION_SOURCE, str(home), time.time(), title),
            )
            conn.execute("COMMIT")
            return new_id, True
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()


def _create_with_session_db(session_db: Any, db_path: Path, home: Path, title: str) -> tuple[str, bool]:
    db = session_db(db_path=db_path)
    try:
        found = db.resolve_session_by_title(title)
        if found:
            return str(found), False
        new_id = new_session_id()
        db.create_session(new_id, SESSION_SOURCE, cwd=str(home))
        try:
            db.set_session_title(new_id, title)
        except ValueError:  # another process titled its own session first: use that one
            db.delete_session(new_id)
            found = db.resolve_session_by_title(title)
            if not found:
                raise
            return str(found), False
        return new_id, True
    finally:
        db.close()


def _create_with_helper(python: str, home: Path, title: str) -> tuple[str, bool]:
    try:
        done = subprocess.run(
            [python, "-c", _HELPER, str(home), title, new_session_id(), SESSION_SOURCE],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=_HELPER_TIMEOUT,
            check=False, cwd=str(home),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BotChatError(f"cannot run hermes' interpreter {python}: {exc}") from exc
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise BotChatError(f"hermes' interpreter could not create the session: {done.stderr.strip()[-500:]}")
    result = json.loads(lines[-1])
    return str(result["id"]), bool(result["created"])


def _has_sessions_table(db_path: Path) -> bool:
    try:
        row = read_sqlite(db_path, lambda conn: conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='sessions'").fetchone())
    except sqlite3.Error:
        return False
    return row is not None


def ensure_bot_chat(home: Path, *, cli: str | None = None, title: str = BOT_CHAT_SESSION) -> tuple[str, bool]:
    """Find the profile's titled session, creating it when missing.

    Args:
        home: the profile home (must exist).
        cli: the hermes executable; its interpreter creates a ``state.db``
            that does not exist yet when ``hermes_state`` is not importable here.
        title: the session title.

    Returns:
        ``(session id, created)``.

    Raises:
        BotChatError: the home is missing, the database is unusable, or a
            fresh database is needed and no hermes interpreter is known.
    """
    home = Path(home)
    if not home.is_dir():
        raise BotChatError(f"profile home {home} does not exist")
    db_path = home / "state.db"
    session_db = session_db_class()
    try:
        if session_db is not None:
            result = _create_with_session_db(session_db, db_path, home, title)
        elif db_path.is_file() and _has_sessions_table(db_path):
            result = _create_sqlite(db_path, home, title)
        else:
            python = hermes_python(cli) if cli else None
            if python is None:
                raise BotChatError(
                    f"{db_path} does not exist yet and no hermes interpreter is known to create it "
                    "(install hermes-agent in this environment or pass its CLI)"
                )
            result = _create_with_helper(python, home, title)
    except sqlite3.IntegrityError:  # a concurrent creator won the unique title
        found = find_bot_chat(home, title)
        if not found:
            raise BotChatError(f"cannot create the {title!r} session in {db_path}") from None
        result = (found, False)
    except (sqlite3.Error, OSError) as exc:
        raise BotChatError(f"cannot use {db_path}: {exc}") from exc
    if result[1]:
        logger.info("created the {!r} session {} in {}", title, result[0], db_path)
    return result
