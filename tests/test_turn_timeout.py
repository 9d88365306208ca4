"""A runner that hangs: the turn times out with delivery_timeout and the profile serves the next DM."""

from __future__ import annotations

import threading
from pathlib import Path

from hermes_actors import Gateway
from hermes_actors.demo.bots import create_demo_root


def test_a_hung_turn_times_out_and_the_next_dm_is_served(tmp_path: Path) -> None:
    root = create_demo_root(tmp_path / "root")
    release = threading.Event()
    entered: list[str] = []

    def runner(turn: object) -> str:
        content = turn.content  # type: ignore[attr-defined]
        entered.append(content)
        if "hang" in content:
            release.wait(30)
        return "done"

    config = {"bot_mode": {"turn_timeout_seconds": 0.3, "turn_wait_seconds": 20}}
    with Gateway(root, runner=runner, config=config, durable=False) as gw:
        hung = gw.message_agent(sender="hermes", target="scout", message="please hang")
        after = gw.message_agent(sender="hermes", target="scout", message="and then this")
        first = gw.wait_outcome(hung["delivery_id"], timeout=10)
        second = gw.wait_outcome(after["delivery_id"], timeout=10)
        release.set()
    assert first["status"] == "failed"
    assert first["reason"] == "delivery_timeout"
    assert first["retryable"] is False
    assert "do not resend blindly" in first["error"]
    assert "it may still complete" in first["error"]  # an in-process turn cannot be ended: it may
    assert second["status"] == "replied" and second["reply"] == "done"
    assert len(entered) == 2  # the hung DM ran once; the next one ran after it timed out


def test_a_turn_within_the_timeout_is_not_cut_short(tmp_path: Path) -> None:
    root = create_demo_root(tmp_path / "root")
    with Gateway(root, runner=lambda turn: "fine", config={"bot_mode": {"turn_timeout_seconds": 5}}) as gw:
        ack = gw.message_agent(sender="hermes", target="scout", message="quick one")
        outcome = gw.wait_outcome(ack["delivery_id"], timeout=10)
    assert outcome["status"] == "replied"
