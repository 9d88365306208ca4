"""The seed's relay RPC (what a Desktop calls), as an object the Gateway composes.

:class:`DesktopRpc` validates the caller's input on the caller's thread (pure) and
asks the RelayActor, which owns the relay files, to do the file work on its own
thread. ``deliver`` is answered with a :class:`~hermes_actors.messages.PendingReply`:
the RelayActor keeps the call's future until the Dispatcher reports the
envelope's outcome, then sets it (the reply-later pattern of durable acks).
"""

from __future__ import annotations

import time
from typing import Any

import pykka

from actors import ask
from hermes_actors.core.reasons import classify_agent_error
from hermes_actors.messages import (
    DesktopDeliver,
    DesktopDrainOutbox,
    DesktopReply,
    DesktopSyncRoster,
    PendingReply,
    RemoteRosterHint,
)
from hermes_actors.store import relay_protocol as rp

__all__ = ["DESKTOP_CALLER", "DesktopRpc", "reply_record"]

DESKTOP_CALLER = ""
"""The ``reply_connection`` of an envelope the Desktop RPC delivered: its reply goes to the call, not to a file."""

_ASK_TIMEOUT = 30.0


def reply_record(envelope_id: str, *, reply: str = "", error: str = "", reason: str = "", now: float) -> dict[str, Any]:
    """Pure: a seed reply record; a missing reason is classified from the error text (as the seed does).

    Args:
        envelope_id: the envelope answered.
        reply: the reply text.
        error: the failure text.
        reason: the reason code ("" with an error: classified).
        now: the current time.

    Returns:
        The record.

    Raises:
        ValidationError: the id is not 32 lowercase hex chars.
    """
    code = reason or (classify_agent_error(error) if error else "")
    return rp.make_reply(envelope_id, reply=reply, error=error, reason=code, now=now)


class DesktopRpc:
    """The four relay RPC operations of one running gateway.

    Args:
        relay: the RelayActor (the file relay; it handles the ``Desktop*`` messages).
        roster: the RosterActor, hinted after a roster sync (None: no hint).
    """

    def __init__(self, relay: pykka.ActorRef[Any], roster: pykka.ActorRef[Any] | None) -> None:
        self.relay = relay
        self.roster = roster

    def sync_roster(self, rows: Any) -> int:
        """``bot_relay.roster.sync``: store the remote roster (untrusted rows, normalized as the seed does).

        Args:
            rows: the raw ``agents`` list.

        Returns:
            How many rows were kept.
        """
        count: int = ask(self.relay, DesktopSyncRoster(rows), timeout=_ASK_TIMEOUT, expect=int)
        if self.roster is not None:  # asked, not told: the next message_agent sees the new roster
            ask(self.roster, RemoteRosterHint(), timeout=_ASK_TIMEOUT)
        return count

    def drain_outbox(self) -> list[dict[str, Any]]:
        """``bot_relay.outbox.drain``: claim (by rename) and return the queued envelopes.

        Returns:
            The fresh envelopes; those past ``bot_mode.envelope_ttl_seconds`` got a
            ``queued_expired`` reply instead.
        """
        drained: list[dict[str, Any]] = ask(self.relay, DesktopDrainOutbox(), timeout=_ASK_TIMEOUT, expect=list)
        return drained

    def deliver(self, envelope: dict[str, Any], *, timeout: float) -> dict[str, str]:
        """``bot_relay.deliver``: run a drained envelope on the target profile here.

        Idempotent by envelope id: a retry runs no turn and gets the first run's fields. In durable mode
        across restarts too (the journal keeps a relayed-in DM's start and outcome; one whose turn started
        and never finished is answered ``ambiguous``); in memory only while this gateway runs. A
        ``cancelled`` answer (the stop came before the turn started) is not journaled: a retry after the restart
        runs it.

        Args:
            envelope: the envelope as drained.
            timeout: seconds to wait for the turn to settle, as ``facade.args.wait_seconds`` returns them (the Gateway
                checks the caller's before this takes the envelope).

        Returns:
            ``{"reply", "error", "reason"}`` (the seed's reply fields).

        Raises:
            ValidationError: the envelope is malformed.
            TimeoutError: no outcome within ``timeout``.
        """
        env = rp.parse_envelope(envelope)
        pending = ask(self.relay, DesktopDeliver(env), timeout=_ASK_TIMEOUT, expect=PendingReply)
        try:
            fields: dict[str, str] = pending.future.get(timeout=timeout)
        except pykka.Timeout:
            raise TimeoutError(f"envelope {env['id']} did not settle within {timeout}s") from None
        return fields

    def reply(self, envelope_id: str, *, reply: str = "", error: str = "", reason: str = "") -> bool:
        """``bot_relay.reply``: write ``replies/<id>.json`` (first write wins; reason classified if empty).

        Returns:
            True when this reply was stored; False when one already existed.

        Raises:
            ValidationError: the id is not 32 lowercase hex chars.
        """
        record = reply_record(envelope_id, reply=reply, error=error, reason=reason, now=time.time())
        written: bool = ask(self.relay, DesktopReply(record), timeout=_ASK_TIMEOUT, expect=bool)
        return written
