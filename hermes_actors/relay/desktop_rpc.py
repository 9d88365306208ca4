"""The seed's relay RPC operations (what a Desktop calls), as plain functions over the files.

``Gateway.relay_sync_roster`` / ``relay_drain_outbox`` / ``relay_deliver`` /
``relay_reply`` wrap these; the hub uses the same rules through its own actor.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pykka
from loguru import logger

from actors import ask
from hermes_actors.core.config import BotModeConfig
from hermes_actors.core.reasons import classify_agent_error
from hermes_actors.errors import HostileFileError, ValidationError
from hermes_actors.messages import Outcome, RelayDeliver, RemoteRosterHint
from hermes_actors.store import relay_files as rf
from hermes_actors.store.relay_files import RelayPaths, parse_envelope, write_reply, write_roster

__all__ = ["RelayRpcMixin", "drain_outbox", "expiry_text", "reply_record"]

_ASK_TIMEOUT = 30.0


def expiry_text(envelope: dict[str, Any], ttl: float) -> str:
    """The seed's ``queued_expired`` text for ``envelope``."""
    return rf.expired_error_text(str(envelope.get("target_handle") or "?"),
                                 str(envelope.get("target_connection") or "?"), ttl)


def reply_record(envelope_id: str, *, reply: str = "", error: str = "", reason: str = "", now: float) -> dict[str, Any]:
    """A seed reply record; a missing reason is classified from the error text (as the seed does)."""
    code = reason or (classify_agent_error(error) if error else "")
    return rf.make_reply(envelope_id, reply=reply, error=error, reason=code, now=now)


def drain_outbox(paths: rf.RelayPaths, *, ttl: float, now: float | None = None) -> list[dict[str, Any]]:
    """``bot_relay.outbox.drain``: claim every pending envelope by rename and return them.

    Envelopes older than ``ttl`` (> 0) are not returned: each gets a ``queued_expired``
    reply instead. Stale artifacts are swept first; hostile files are quarantined.
    """
    now = time.time() if now is None else now
    rf.sweep_stale(paths, now=now)
    drained: list[dict[str, Any]] = []
    for envelope_id in rf.list_ids(paths.outbox):
        try:
            claimed = rf.claim_envelope(paths, envelope_id)
        except (OSError, ValidationError) as exc:
            logger.warning("drain: could not claim {}: {}", envelope_id, exc)
            continue
        if claimed is None:
            continue  # another drainer won the rename
        try:
            envelope = rf.read_envelope(claimed)
        except (HostileFileError, ValidationError) as exc:
            rf.quarantine(paths, claimed, str(exc))
            continue
        if ttl > 0 and rf.is_expired(envelope, ttl, now):
            rf.write_reply(paths, reply_record(envelope_id, error=expiry_text(envelope, ttl),
                                               reason="queued_expired", now=now))
            continue
        drained.append(envelope)
    return drained


class RelayRpcMixin:
    """The seed's relay RPC operations as ``Gateway`` methods (what a Desktop calls)."""

    root: Path
    config: BotModeConfig | None
    _roster: pykka.ActorRef[Any] | None

    def _live_dispatcher(self) -> pykka.ActorRef[Any]:
        raise NotImplementedError

    def relay_sync_roster(self, rows: Any) -> int:
        """``bot_relay.roster.sync``: store the remote roster (untrusted rows, normalized as the seed does).

        Returns:
            How many rows were kept.
        """
        self._live_dispatcher()
        count = write_roster(RelayPaths.from_root(self.root), rows, now=time.time())
        if self._roster is not None:  # asked, not told: the next message_agent sees the new roster
            ask(self._roster, RemoteRosterHint(), timeout=_ASK_TIMEOUT)
        return count

    def relay_drain_outbox(self) -> list[dict[str, Any]]:
        """``bot_relay.outbox.drain``: claim (by rename) and return the queued envelopes.

        Envelopes past ``bot_mode.envelope_ttl_seconds`` get a ``queued_expired`` reply instead.
        """
        self._live_dispatcher()
        assert self.config is not None
        return drain_outbox(RelayPaths.from_root(self.root), ttl=self.config.envelope_ttl_seconds)

    def relay_deliver(self, envelope: dict[str, Any], *, timeout: float = 900) -> dict[str, str]:
        """``bot_relay.deliver``: run a drained envelope on the target profile here; its reply fields.

        Idempotent by envelope id. Returns ``{"reply", "error", "reason"}`` (the seed's reply
        fields) once the turn settled.

        Raises:
            ValidationError: the envelope is malformed.
            TimeoutError: no outcome within ``timeout``.
        """
        dispatcher = self._live_dispatcher()
        env = parse_envelope(envelope)
        answer: pykka.ThreadingFuture[Outcome] = pykka.ThreadingFuture()
        dispatcher.tell(RelayDeliver(env, "", answer))
        try:
            outcome = answer.get(timeout=timeout)
        except pykka.Timeout:
            raise TimeoutError(f"envelope {env['id']} did not settle within {timeout}s") from None
        from hermes_actors.relay.relay_actor import reply_from_outcome

        return reply_from_outcome(outcome)

    def relay_reply(self, envelope_id: str, *, reply: str = "", error: str = "", reason: str = "") -> bool:
        """``bot_relay.reply``: write ``replies/<id>.json`` (first write wins; reason classified if empty).

        Raises:
            ValidationError: the id is not 32 lowercase hex chars.
        """
        self._live_dispatcher()
        record = reply_record(envelope_id, reply=reply, error=error, reason=reason, now=time.time())
        return write_reply(RelayPaths.from_root(self.root), record)

