"""A slow subscriber cannot grow the notifier's backlog without bound; outcomes are never lost."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from roots import make_root

from actors.testkit import await_condition
from hermes_actors import Gateway


def test_a_slow_subscriber_sheds_notifications_but_wait_outcome_answers_all(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    slow = threading.Event()  # never set: each callback takes 50 ms, the pace of a slow consumer
    seen: list[str] = []

    def slow_subscriber(outcome: dict[str, Any]) -> None:
        slow.wait(0.05)
        seen.append(outcome["delivery_id"])

    config = {"bot_mode": {"max_notify_backlog": 5, "max_queued": 1000}}
    with Gateway(root, runner=lambda turn: "ok", config=config, durable=False) as gw:
        gw.subscribe(slow_subscriber)
        acks = [gw.message_agent(sender="alice", target="bob", message=f"dm {i}") for i in range(60)]
        outcomes = [gw.wait_outcome(a["delivery_id"], timeout=20) for a in acks]  # never held up by it
        assert all(o["status"] == "replied" for o in outcomes)
        # The newest notification is never shed (nothing waits behind it). Poll `seen`, not stats(): an ask
        # would queue behind the notifications and count toward the very backlog being measured.
        last = acks[-1]["delivery_id"]
        await_condition(lambda: last in seen, timeout=20, message="the newest notification handled")
        skipped = gw.stats()["notify_skipped"]  # answers once every notification before it was handled
        assert len(seen) + skipped == 60
        assert skipped > 0  # the backlog over the bound was shed...
        assert len(seen) >= 5  # ...but the subscriber still got the ones within it
