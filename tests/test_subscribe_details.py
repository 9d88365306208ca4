"""``Gateway.subscribe(details=True)``: sender, target and latency for metrics and logs; plain subscribers unchanged."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from roots import send_dm, start_gateway

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.core.outcomes import delivery_details
from hermes_actors.messages import Delivery


def test_details_name_sender_target_and_latency(root: Path, gateways: list[Gateway]) -> None:
    gw = start_gateway(gateways, root)
    plain: list[dict[str, Any]] = []
    detailed: list[dict[str, Any]] = []
    gw.subscribe(plain.append)
    gw.subscribe(detailed.append, details=True)
    delivery_id = send_dm(gw, "hi", target="bob", sender="alice")
    await_condition(lambda: len(plain) == 1 and len(detailed) == 1, message="both subscribers called")
    assert set(plain[0]) == {"kind", "delivery_id", "status", "reply", "error", "reason", "retryable", "from", "text"}
    assert detailed[0]["delivery_id"] == delivery_id
    assert detailed[0]["sender"] == "alice"
    assert detailed[0]["target"] == "bob"
    assert isinstance(detailed[0]["latency_seconds"], float) and detailed[0]["latency_seconds"] >= 0.0


def test_details_of_a_subscriber_added_before_start(root: Path) -> None:
    got: list[dict[str, Any]] = []
    done = threading.Event()
    gw = Gateway(root, runner=lambda turn: "ok")
    gw.subscribe(lambda o: (got.append(o), done.set()), details=True)
    with gw:
        send_dm(gw, "hi")
        assert done.wait(10)
    assert got[0]["target"] == "bob"


def test_delivery_details_table() -> None:
    d = Delivery("a" * 32, "alice", "alice", "bob", "bobby", "hi", accepted_at=100.0, label="@bobby")
    assert delivery_details(d, 102.5) == {"sender": "alice", "target": "bobby", "latency_seconds": 2.5}
    assert delivery_details(d, 99.0)["latency_seconds"] == 0.0  # a clock step back is not a negative latency
    resumed = Delivery("b" * 32, "", "", "", "", "", label="@dave@mini", origin="recovered")
    assert delivery_details(resumed, 5.0) == {"sender": "", "target": "dave@mini", "latency_seconds": None}
    assert delivery_details(None, 5.0) == {"sender": "", "target": "", "latency_seconds": None}
