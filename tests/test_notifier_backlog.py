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
    # The subscriber is stuck in its first callback until every DM has its outcome: a stuck consumer, whatever
    # the machine's speed (a 50 ms pace was not enough on a loaded machine, where outcomes came in few batches).
    stuck = threading.Event()
    seen: list[str] = []

    def slow_subscriber(outcome: dict[str, Any]) -> None:
        assert stuck.wait(20)
        seen.append(outcome["delivery_id"])

    config = {"bot_mode": {"max_notify_backlog": 5, "max_queued": 1000}}
    with Gateway(root, runner=lambda turn: "ok", config=config, durable=False) as gw:
        gw.subscribe(slow_subscriber)
        try:
            acks, outcomes = [], []
            for i in range(60):  # one at a time: each outcome reaches the notifier as a message of its own
                acks.append(gw.message_agent(sender="alice", target="bob", message=f"dm {i}"))
                outcomes.append(gw.wait_outcome(acks[-1]["delivery_id"], timeout=20))  # never held up by it
        finally:
            stuck.set()
        assert all(o["status"] == "replied" for o in outcomes)
        # The newest notification is never shed (nothing waits behind it). Poll `seen`, not stats(): an ask
        # would queue behind the notifications and count toward the very backlog being measured.
        last = acks[-1]["delivery_id"]
        await_condition(lambda: last in seen, timeout=20, message="the newest notification handled")
        skipped = gw.stats()["notify_skipped"]  # answers once every notification before it was handled
        assert len(seen) + skipped == 60
        assert skipped > 0  # the backlog over the bound was shed...
        assert len(seen) >= 5  # ...but the subscriber still got the ones within it
