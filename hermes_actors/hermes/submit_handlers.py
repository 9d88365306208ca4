"""What the submit endpoint answers a request with: the host's calls, one per operation.

:class:`SubmitHandlers` holds the calls a host serves (send, outcome, status, roster,
room) and turns one raw request into its answer dict: a malformed request or an
operation the host does not serve is a ``bad_request`` answer, a call that raises or
answers something but a dict is an error answer (never the server's end). The socket,
its threads and its lifetime are :class:`hermes_actors.hermes.submit.SubmitServer`'s.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger

from hermes_actors.core.reasons import UNKNOWN
from hermes_actors.hermes.submit_protocol import (
    OutcomeCall,
    Ping,
    RoomCall,
    RosterCall,
    SendCall,
    StatusCall,
    bad_request,
    parse_request,
)

__all__ = ["OutcomeFn", "RoomFn", "RosterFn", "SendFn", "StatusFn", "SubmitHandlers"]

SendFn = Callable[[SendCall], dict[str, Any]]
OutcomeFn = Callable[[OutcomeCall], dict[str, Any]]
StatusFn = Callable[[], dict[str, Any]]
RosterFn = Callable[[], list[dict[str, Any]]]
RoomFn = Callable[[RoomCall], dict[str, Any]]


@dataclass(frozen=True)
class SubmitHandlers:
    """The host's calls behind the submit endpoint of ``root``.

    Attributes:
        root: the Hermes root (named in the ``ping`` answer).
        send: takes a :class:`SendCall`, returns the ack or refusal dict.
        outcome: takes an :class:`OutcomeCall`, returns the outcome dict; None: the op is refused.
        status: returns the host's status dict; None: the op is refused.
        roster: returns the host's roster rows; None: the op is refused.
        room: takes a :class:`RoomCall`, returns its answer; None: the op is refused.
        info: extra keys for the ``ping`` answer.
        live_info: returns more keys for the ``ping`` answer, asked at each ping (what changes while the host
            runs); None: none. One that raises adds nothing (logged).
    """

    root: Path
    send: SendFn
    outcome: OutcomeFn | None = None
    status: StatusFn | None = None
    roster: RosterFn | None = None
    room: RoomFn | None = None
    info: dict[str, Any] = field(default_factory=dict)
    live_info: Callable[[], dict[str, Any]] | None = None

    def _live_info(self) -> dict[str, Any]:
        if self.live_info is None:
            return {}
        try:
            return dict(self.live_info())
        except Exception:  # the ping still answers: it says the host is up
            logger.exception("submit endpoint: the ping's live keys failed")
            return {}

    def answer(self, raw: bytes) -> dict[str, Any]:
        """The answer to one raw request (already read whole, from a peer of the allowed uid).

        Args:
            raw: the request's bytes.

        Returns:
            The answer dict: the call's own, or an ``error`` dict naming what went wrong
            (with a ``reason``); never raises for a call's failure.
        """
        call = parse_request(raw)
        if isinstance(call, dict):
            return call
        if isinstance(call, Ping):
            from hermes_actors import __version__

            return {**self.info, **self._live_info(), "op": "pong", "pid": os.getpid(), "root": str(self.root),
                    "version": __version__}
        try:
            if isinstance(call, SendCall):
                answer = self.send(call)
            elif isinstance(call, StatusCall):
                if self.status is None:
                    return bad_request("this endpoint does not serve 'status'")
                answer = self.status()
            elif isinstance(call, RosterCall):
                if self.roster is None:
                    return bad_request("this endpoint does not serve 'roster'")
                answer = {"rows": self.roster()}
            elif isinstance(call, RoomCall):
                if self.room is None:
                    return bad_request("this endpoint does not serve 'room'")
                answer = self.room(call)
            elif self.outcome is None:
                return bad_request("this endpoint does not serve 'outcome'")
            else:
                answer = self.outcome(call)
        except Exception as exc:  # a handler's failure is the client's answer, never the server's end
            logger.exception("submit handler failed")
            return {"error": f"the Bot Mode host could not take the request ({type(exc).__name__}: {exc}); "
                             "it was not acknowledged", "reason": UNKNOWN}
        if not isinstance(answer, dict):
            return {"error": f"the Bot Mode host answered {type(answer).__name__}, not a dict", "reason": UNKNOWN}
        return answer
