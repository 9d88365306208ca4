"""Warm turns through a running ``hermes gateway run`` API server (no process per turn).

hermes-agent 0.19's API server platform (``gateway/platforms/api_server.py``),
with ``gateway.multiplex_profiles: true``, serves every profile of the root
under ``/p/<profile>/`` (``default`` for the root profile), bearer
``API_SERVER_KEY``:

- ``GET  /p/<p>/api/sessions?limit=&offset=`` → ``{"data": [{"id", "title", "started_at", ...}], "has_more"}``
  (no title filter: we list and match; ``limit`` ≤ 200);
- ``POST /p/<p>/api/sessions {"title": ...}`` → 201 ``{"session": {"id", ...}}``,
  400 ``invalid_title`` when the title is taken;
- ``POST /p/<p>/api/sessions/<id>/chat {"message": ...}`` → ``{"session_id",
  "message": {"role": "assistant", "content": <reply>}}``; 404 ``session_not_found``.

The same ``state.db`` as the CLI. Nothing in hermes serializes turns on one
session: the caller (a ProfileActor) runs one turn per profile at a time. The
requests themselves, and their transport failures, are in
:mod:`hermes_actors.hermes.api_client`.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.parse
from typing import Any

from loguru import logger

from hermes_actors.core.reasons import MISSING_CONFIG, RUNTIME_OFFLINE, TARGET_BUSY, UNKNOWN, classify_agent_error
from hermes_actors.errors import TurnFailed
from hermes_actors.hermes.api_client import ApiHttpError, ApiServer, call_api
from hermes_actors.hermes.cli_runner import no_model_failure, turn_home
from hermes_actors.hermes.install import cli_profile_name
from hermes_actors.hermes.plugin import turn_hop_scope
from hermes_actors.hermes.retry import prepare_bot_chat_retry
from hermes_actors.hermes.sessions import EMPTY_ANSWER, final_answer_since
from hermes_actors.messages import Turn

__all__ = ["ApiRunner", "answer_of", "pick_titled_session"]

_PAGE = 200
_MAX_PAGES = 50
_FAILURE_CHARS = 2000  # of a failure text hermes handed back as an answer
_NO_REPLY_WARNING = "⚠️ No reply:"  # hermes 0.19's text for a model's empty answer (it stores EMPTY_ANSWER)
#: How hermes 0.19 words the ``final_response`` of a turn it gave up on (agent/conversation_loop.py), which its
#: API server hands back as the answer. state.db decides (:func:`answer_of`); where it cannot be read, such a
#: text is the failure, whatever reason it classifies as ("… Provider returned an empty stream …" is none).
_HERMES_FAILURE_ANSWERS = (
    "API call failed after ",
    "Invalid API response after ",
    "Billing or credits exhausted:",
    "Request payload too large",
    "Context length exceeded",
)


def pick_titled_session(rows: list[dict[str, Any]], title: str) -> str | None:
    """The session ``hermes chat -c TITLE`` would pick among listed sessions.

    Args:
        rows: session rows (``id``, ``title``, ``started_at``).
        title: the title.

    Returns:
        The newest ``"<title> #N"`` continuation's id, else the exact
        title's id, else None.
    """
    numbered = re.compile(rf"^{re.escape(title)} #\d+\Z")
    continuations = [r for r in rows if isinstance(r.get("title"), str) and numbered.match(r["title"])]
    if continuations:
        newest = max(continuations, key=lambda r: float(r.get("started_at") or 0))
        return str(newest["id"])
    for row in rows:
        if row.get("title") == title:
            return str(row["id"])
    return None


def answer_of(content: str, stored: tuple[bool, str | None], handle: str) -> str:
    """Pure: what a warm turn answered, from the text hermes' API server handed back and what ``state.db`` holds.

    hermes' API server hands a failed turn's error text back as if it were the answer (HTTP 200:
    "API call failed after 3 retries: Provider returned an empty stream …", worded any way) and a
    model's empty answer as its own warning. ``state.db`` says which it was, whatever the text reads
    like, as the exit status does on a CLI turn: a turn that stored no answer failed, and one that
    stored one replied, error-like words and all. Only where it cannot be read does the text decide:
    hermes' give-up wording (:data:`_HERMES_FAILURE_ANSWERS`) is a failure.

    Args:
        content: the ``message.content`` the API server answered.
        stored: ``(readable, answer)`` of :func:`~hermes_actors.hermes.sessions.final_answer_since` for the turn.
        handle: the bot, for the failure text.

    Returns:
        The reply (``""``: the model chose to say nothing, a silent outcome).

    Raises:
        TurnFailed: the turn stored no answer (or, with ``state.db`` unreadable, the text is hermes'
            give-up wording), with the reason the text names (``unknown`` for none, as on a CLI turn).
    """
    readable, answer = stored
    if (answer is None) if readable else content.startswith(_HERMES_FAILURE_ANSWERS):
        raise TurnFailed(f"hermes on @{handle}'s Bot Chat turn: {content[:_FAILURE_CHARS]}",
                         reason=classify_agent_error(content))
    if readable and answer == EMPTY_ANSWER and content.startswith(_NO_REPLY_WARNING):
        return ""  # the model chose to say nothing: a silent outcome, not hermes' warning as the bot's reply
    return content


def _stored_answer(turn: Turn, session: str, began: float) -> tuple[bool, str | None]:
    """:func:`~hermes_actors.hermes.sessions.final_answer_since` for the turn (unreadable: a turn naming no home)."""
    try:
        home = turn_home(turn)
    except TurnFailed:
        return False, None
    return final_answer_since(home, session, began)


def busy_in_gateway_text(handle: str) -> str:
    """Pure: why a DM is refused while hermes still runs the bot's earlier turn for us."""
    return (f"@{handle} is still running an earlier turn in the hermes gateway (its answer has not come back); "
            "the message was NOT delivered — resend shortly.")


class ApiRunner:
    """Runs Bot Chat turns through a hermes gateway's API server.

    Args:
        server: the API server.
        timeout: seconds the chat request of one turn stays open waiting for hermes' answer; while
            it is open, the bot's next turns are refused ``target_busy`` (hermes would run them
            beside it), so it is far longer than the turn timeout the sender is told about.
        connect_timeout: seconds for the session lookups.

    Raises:
        ValueError: a timeout is not positive.
    """

    real_hermes = True  # turns run on the real Hermes: ``bot_mode.wake_sender: auto`` wakes senders

    def __init__(self, server: ApiServer, *, timeout: float = 600, connect_timeout: float = 10) -> None:
        if not timeout > 0 or not connect_timeout > 0:
            raise ValueError(f"timeouts must be > 0 seconds, got {timeout!r} and {connect_timeout!r}")
        self.server = server
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self._sessions: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        # profile → the delivery whose chat request is still open. hermes runs the turn until it answers,
        # even after our side reported it timed out: the bot's next turn must not run beside it.
        self._in_flight: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"ApiRunner({self.server!r}, timeout={self.timeout:g})"

    # ── HTTP ────────────────────────────────────────────────────────────────

    def _call(
        self, handle: str, method: str, path: str, body: dict[str, Any] | None, timeout: float, *,
        delivers: bool = False,
    ) -> Any:
        """One request to this runner's server (:func:`~hermes_actors.hermes.api_client.call_api`)."""
        return call_api(self.server, handle, method, path, body, timeout, delivers=delivers)

    # ── sessions ────────────────────────────────────────────────────────────

    def _prefix(self, profile: str) -> str:
        return f"/p/{urllib.parse.quote(cli_profile_name(profile), safe='')}"

    def _find_session(self, profile: str, title: str, handle: str) -> str | None:
        rows: list[dict[str, Any]] = []
        for page in range(_MAX_PAGES):
            payload = self._call(
                handle, "GET", f"{self._prefix(profile)}/api/sessions?limit={_PAGE}&offset={page * _PAGE}",
                None, self.connect_timeout,
            )
            data = payload.get("data") if isinstance(payload, dict) else None
            rows.extend(r for r in (data or []) if isinstance(r, dict))
            if not (isinstance(payload, dict) and payload.get("has_more")):
                break
        return pick_titled_session(rows, title)

    def session_id(self, profile: str, title: str, handle: str = "") -> str:
        """The id of the profile's titled session, created when missing (cached).

        Args:
            profile: the folder id.
            title: the session title.
            handle: the handle for failure texts.

        Returns:
            The session id.

        Raises:
            TurnFailed: the server is unreachable or refused.
        """
        key = (profile, title)
        with self._lock:
            cached = self._sessions.get(key)
        if cached:
            return cached
        found = self._find_session(profile, title, handle or profile)
        if found is None:
            try:
                payload = self._call(
                    handle, "POST", f"{self._prefix(profile)}/api/sessions", {"title": title}, self.connect_timeout
                )
                found = str(payload["session"]["id"])
                logger.info("created the {!r} session {} for {} through the API server", title, found, profile)
            except ApiHttpError as failure:
                if failure.code() != "invalid_title":
                    raise
                found = self._find_session(profile, title, handle or profile)  # a concurrent creator won
                if found is None:
                    raise
        with self._lock:
            self._sessions[key] = found
        return found

    def forget(self, profile: str, title: str) -> None:
        """Drop a cached session id (it was deleted or continued elsewhere).

        Args:
            profile: the folder id.
            title: the session title.
        """
        with self._lock:
            self._sessions.pop((profile, title), None)

    # ── one turn ────────────────────────────────────────────────────────────

    def run_turn(self, turn: Turn) -> str:
        """Run ``turn`` through the API server and return the reply.

        Args:
            turn: the turn.

        Returns:
            ``message.content`` of the server's answer.

        Raises:
            TurnFailed: ``runtime_offline`` (unreachable, draining, unknown
                profile), ``missing_config`` (the key was refused),
                ``delivery_timeout``, or a classified reason.
        """
        handle = turn.handle or turn.profile
        with self._lock:
            if self._in_flight.get(turn.profile, turn.delivery_id) != turn.delivery_id:
                raise TurnFailed(busy_in_gateway_text(handle), reason=TARGET_BUSY)
            self._in_flight[turn.profile] = turn.delivery_id
        try:
            return self._run(turn, handle, retry_missing=True)
        except ApiHttpError as failure:
            raise self._failure(failure, handle, turn) from None
        except ValueError as exc:  # a profile name hermes rejects
            raise TurnFailed(str(exc), reason=UNKNOWN) from None
        finally:
            with self._lock:
                if self._in_flight.get(turn.profile) == turn.delivery_id:
                    del self._in_flight[turn.profile]

    def in_flight(self, profile: str) -> str | None:
        """The delivery whose turn of ``profile`` hermes is still running for us (its request is open)."""
        with self._lock:
            return self._in_flight.get(profile)

    def in_flight_turns(self) -> list[str]:
        """The deliveries whose turns hermes is still running for us (their requests are open)."""
        with self._lock:
            return list(self._in_flight.values())

    def turns_in_hermes(self) -> dict[str, str]:
        """profile → the delivery whose turn hermes is still running for us (its request is open): the bot's next
        turns are refused ``target_busy`` until it answers (:meth:`run_turn`)."""
        with self._lock:
            return dict(self._in_flight)

    def prepare_retry(self, turn: Turn, began: float) -> bool:
        """Before the policy retry: take back the DM the gateway stored when the first attempt failed.

        The API server replays the session from ``state.db`` on every request, so the
        retry would otherwise carry the DM twice (see :mod:`hermes_actors.hermes.retry`).

        Args:
            turn: the retry's turn.
            began: ``time.time()`` when the first attempt began.

        Returns:
            Whether the retry may run.
        """
        return prepare_bot_chat_retry(turn_home(turn), turn.session, turn.content, began)

    def forget_failed(self, turn: Turn, began: float) -> None:
        """After a final failure: take back the DM the gateway stored, if it is all the turn left.

        Args:
            turn: the failed turn.
            began: ``time.time()`` when its first attempt began.
        """
        self.prepare_retry(turn, began)  # the same taking back, its answer unneeded: no retry follows

    def _run(self, turn: Turn, handle: str, *, retry_missing: bool) -> str:
        session = self.session_id(turn.profile, turn.session, handle)
        path = f"{self._prefix(turn.profile)}/api/sessions/{urllib.parse.quote(session, safe='')}/chat"
        began = time.time()
        try:
            # When this process is the hermes gateway (our actors hosted in it), the tool call of
            # this turn runs here too: the scope tells it the turn's hop (an env var can't be per turn).
            with turn_hop_scope(session, turn.hop):
                payload = self._call(handle, "POST", path, {"message": turn.content}, self.timeout, delivers=True)
        except ApiHttpError as failure:
            if failure.status == 404 and failure.code() == "session_not_found" and retry_missing:
                self.forget(turn.profile, turn.session)
                return self._run(turn, handle, retry_missing=False)
            raise
        effective = payload.get("session_id") if isinstance(payload, dict) else None
        if effective and effective != session:  # compression continued the session under a new id
            with self._lock:
                self._sessions[(turn.profile, turn.session)] = str(effective)
        message = payload.get("message") if isinstance(payload, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, str):
            raise TurnFailed(f"hermes API server answered without a reply for @{handle}: {str(payload)[:300]}")
        return answer_of(content, _stored_answer(turn, str(effective or session), began), handle)

    def _failure(self, failure: ApiHttpError, handle: str, turn: Turn) -> TurnFailed:
        text = f"hermes API server answered {failure.status} on @{handle}'s {turn.session} turn: {failure.message()}"
        # hermes logs "No inference provider configured" and answers a bare 500: say what is wrong
        missing = no_model_failure(turn, handle, text) if failure.status == 500 else None
        if missing is not None:
            return missing
        if failure.status == 401:
            return TurnFailed(text + " — the API_SERVER_KEY we use is not the gateway's", reason=MISSING_CONFIG)
        if failure.status == 404 and failure.code() != "session_not_found":
            return TurnFailed(text + f" — the gateway does not serve profile {handle}", reason=RUNTIME_OFFLINE)
        if failure.status == 503:
            return TurnFailed(text, reason=RUNTIME_OFFLINE)
        return TurnFailed(text, reason=classify_agent_error(text))
