"""The Dispatcher's relay routing: DMs to other connections, and envelopes drained for us."""

from __future__ import annotations

import time
from typing import Any

from actors import UnknownMessageError, ask, handles
from hermes_actors.core import outcomes
from hermes_actors.core.acks import outcome_from_record
from hermes_actors.core.targets import PeerRoute, Refusal, RelayRoute
from hermes_actors.local.dispatch_base import DispatcherBase, Pending
from hermes_actors.messages import Delivery, PeerSend, RelayDeliver, RelayResumed, RelaySend

__all__ = ["RelayDispatch"]


class RelayDispatch(DispatcherBase):
    """Handlers of relay routing (mixed into the DispatcherActor)."""

    def _deliver_relay(self, route: RelayRoute, delivery: Delivery) -> dict[str, Any]:
        if self.relay is None:
            return Refusal(f"The file relay is not running; {route.label} is unreachable.", "runtime_offline").as_dict()
        ack: dict[str, Any] = ask(self.relay, RelaySend(route, delivery), timeout=10, expect=dict)
        if "delivery_id" in ack:
            self.pending[ack["delivery_id"]] = Pending(delivery, "relay")
            self.counters["accepted"] += 1
        return ack

    def _peer_via_relay(self, route: PeerRoute, delivery: Delivery) -> dict[str, Any] | None:
        """The ack when the relay reaches this ``bot_peers`` peer itself (Redis); None: use the CLI transport."""
        if self.relay is None:
            return None
        try:
            ack: dict[str, Any] | None = ask(self.relay, PeerSend(route, delivery), timeout=10)
        except UnknownMessageError:  # a relay without peer support
            return None
        if ack is not None and "delivery_id" in ack:
            self.pending[ack["delivery_id"]] = Pending(delivery, "relay")
            self.counters["accepted"] += 1
        return ack

    @handles(RelayDeliver)
    def _on_relay_deliver(self, msg: RelayDeliver) -> None:
        """A drained envelope for one of our profiles (idempotent by envelope id)."""
        env = msg.envelope
        key = env["id"]
        if key in self.pending:
            return
        if key in self.settled:  # delivered before a crash, reply not written yet: write it again
            self._answer_relay_in(outcome_from_record(key, self.settled[key]), msg.reply_connection, msg.answer)
            return
        label = f"@{env['target_handle']}"
        info = self.snapshot.index.get(str(env["target_profile"]).lower())
        if info is None:
            text = f"No agent '{env['target_profile']}' on this gateway; the message was NOT delivered."
            self._answer_relay_in(outcomes.failed(key, label, text, "unknown"), msg.reply_connection, msg.answer)
            return
        hop = env.get("hop")
        delivery = Delivery(
            delivery_id=key,
            sender=str(env["from_profile"]),
            sender_handle=str(env["from_handle"]),
            target=info.profile,
            target_handle=info.handle,
            content=str(env["message"]),
            author={"id": f"bot:{env['from_profile']}", "name": env["from_handle"], "is_bot": True},
            hop=hop if isinstance(hop, int) and hop > 0 else 1,
            accepted_at=time.time(),
            origin="relay",
            label=label,
        )
        self.pending[key] = Pending(delivery, "relay-in", msg.reply_connection, msg.answer)
        self._deliver_local(info, delivery, register=False)

    @handles(RelayResumed)
    def _on_relay_resumed(self, msg: RelayResumed) -> None:
        for key, label in msg.entries:
            if key not in self.pending and key not in self.settled:
                placeholder = Delivery(key, "", "", "", "", "", label=label, origin="recovered")
                self.pending[key] = Pending(placeholder, "relay")

