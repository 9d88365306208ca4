"""The Dispatcher's durable mode: journal before ack, journal before publish, recover at start.

Acceptance is journaled with group commit and the ack is released only once
that batch is on disk (``PendingAck``); an outcome is journaled before it is
published; a previous run's journal is acted on by ``Recover``.
"""

from __future__ import annotations

from typing import Any

import pykka
from loguru import logger

from actors import handles
from hermes_actors.core import outcomes
from hermes_actors.core.acks import delivery_record, journal_refusal, settled_ack
from hermes_actors.core.recovery import plan_recovery
from hermes_actors.errors import StoreError, ValidationError
from hermes_actors.faults import crashpoint
from hermes_actors.local.dispatch_base import DispatcherBase, Pending
from hermes_actors.local.live_handoff import LiveMailbox
from hermes_actors.local.wake_hook import SenderWaker
from hermes_actors.messages import Delivery, JournalDurable, Outcome, PendingAck, ProfileInfo, Recover

__all__ = ["DurableDispatch"]


class DurableDispatch(DispatcherBase):
    """Handlers of the durable mode (mixed into the DispatcherActor)."""

    waker: SenderWaker

    def _accept_durably(self, delivery: Delivery, target: ProfileInfo, ack: dict[str, Any]) -> PendingAck:
        """Journal the acceptance; the ack is released once the group commit covering it is on disk."""
        assert self.journal is not None
        future: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
        key = delivery.delivery_id
        try:
            self.journal.append({"t": "accepted", "id": key, "d": delivery_record(delivery)}, token=("accepted", key))
        except StoreError as exc:
            return settled_ack(journal_refusal(exc))
        self.awaiting_durable[key] = (delivery, target, future, ack)
        return PendingAck(future)

    @handles(JournalDurable)
    def _on_journal_durable(self, msg: JournalDurable) -> None:
        """One group commit landed: release its acks, publish its outcomes."""
        for kind, value in msg.tokens:
            if kind == "accepted":
                self._accepted_durably(value, msg.error)
            else:
                self._finished_durably(value, msg.error)

    def _accepted_durably(self, delivery_id: str, error: BaseException | None) -> None:
        entry = self.awaiting_durable.pop(delivery_id, None)
        if entry is None:
            return
        delivery, target, future, ack = entry
        if error is not None:
            future.set(journal_refusal(error))  # nothing acked, nothing queued
            return
        crashpoint("after-journal-before-ack")
        self.journaled.add(delivery.delivery_id)
        self._deliver_local(target, delivery)
        self.counters["accepted"] += 1
        future.set(ack)

    def _finished_durably(self, outcome: Outcome, error: BaseException | None) -> None:
        if error is not None:
            logger.error("outcome of {} could not be journaled ({}); publishing it anyway", outcome.delivery_id, error)
        self._publish(outcome)
        crashpoint("after-outcome-before-delivered")
        self._journal_quietly({"t": "delivered", "id": outcome.delivery_id})

    def _journal_quietly(self, record: dict[str, Any]) -> None:
        if self.journal is None:
            return
        try:
            self.journal.append(record)
        except StoreError as exc:
            logger.error("journal append failed: {}", exc)

    def _live_record(self, delivery: Delivery) -> dict[str, Any] | None:
        """The live-delivery mailbox record of ``delivery`` (None: it never went to a live owner)."""
        info = self.snapshot.index.get(delivery.target.lower())
        if info is None:
            return None
        try:
            return LiveMailbox(info.home).read(delivery.delivery_id)
        except (OSError, ValidationError):
            return None

    @handles(Recover)
    def _on_recover(self, msg: Recover) -> dict[str, int]:
        """Act on the journal of a previous run (see ``recovery.plan_recovery``)."""
        self.waker.adopt(msg.states)
        plan = plan_recovery(msg.states, idempotent_runner=msg.idempotent_runner, live_record=self._live_record)
        self.settled.update(plan.known)
        for outcome in plan.redeliver:
            self._journal_quietly({"t": "finished", "id": outcome.delivery_id, "o": outcome.as_dict()})
            self._publish(outcome)
            self._journal_quietly({"t": "delivered", "id": outcome.delivery_id})
        for delivery, outcome in plan.ambiguous:
            self.journaled.add(delivery.delivery_id)
            self.pending[delivery.delivery_id] = Pending(delivery, "local")
            self._settle(outcome)
        for delivery in plan.reoffer:
            key = delivery.delivery_id
            self.journaled.add(key)
            info = self.snapshot.index.get(delivery.target.lower())
            if info is None:
                self.pending[key] = Pending(delivery, "local")
                text = f"The profile '{delivery.target}' no longer exists; the message was NOT delivered."
                self._settle(outcomes.failed(key, delivery.label, text, "unknown"))
            else:
                self._deliver_local(info, delivery)
        counts = plan.counts()
        if any(counts.values()):
            logger.info(
                "recovery: {reoffered} re-offered, {ambiguous} ambiguous, {redelivered} outcomes re-delivered, "
                "{known} settled outcomes known",
                **counts,
            )
        return counts

