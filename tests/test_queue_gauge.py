"""QueueGauge: the places a profile's queue has left, shared by the senders' threads and the Dispatcher."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from roots import send_dm, start_gateway

from hermes_actors import CallableRunner, Gateway
from hermes_actors.local.queue_gauge import QueueGauge


def test_a_profile_takes_max_queued_plus_the_one_in_its_turn_then_reports_the_waiting_count() -> None:
    gauge = QueueGauge(max_queued=2)
    assert [gauge.take("bob", f"d{i}") for i in range(3)] == [None, None, None]  # 1 in its turn + 2 waiting
    assert gauge.take("bob", "d3") == 2 and gauge.held("bob") == 3  # full: 2 DMs waiting, nothing taken
    assert gauge.take("carol", "c0") is None  # other profiles are not affected
    gauge.release("d0")  # settled
    assert gauge.held("bob") == 2 and gauge.take("bob", "d3") is None and gauge.held("bob") == 3


def test_taking_holding_and_releasing_are_idempotent_by_delivery_id() -> None:
    gauge = QueueGauge(max_queued=5)
    assert gauge.take("bob", "d0") is None and gauge.take("bob", "d0") is None
    gauge.hold("bob", "d0")  # the Dispatcher queueing a DM the sender's thread admitted
    assert gauge.held("bob") == 1
    gauge.release("d0")
    gauge.release("d0")
    gauge.release("never-held")
    assert gauge.held("bob") == 0 and gauge.take("bob", "d1") is None


def test_hold_goes_past_the_bound_for_a_dm_admitted_before_it_filled() -> None:
    gauge = QueueGauge(max_queued=1)
    gauge.hold("bob", "a")
    gauge.hold("bob", "b")
    gauge.hold("bob", "c")  # checked at admission, accepted after others filled the queue
    assert gauge.held("bob") == 3 and gauge.take("bob", "d") == 2  # full: 2 waiting behind the one in its turn


def test_concurrent_takes_never_exceed_the_places() -> None:
    gauge = QueueGauge(max_queued=9)
    start = threading.Barrier(8)
    taken: list[str] = []
    lock = threading.Lock()

    def sender(n: int) -> None:
        start.wait(timeout=10)
        for i in range(50):
            key = f"{n}-{i}"
            if gauge.take("bob", key) is None:
                with lock:
                    taken.append(key)

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(taken) == 10 and gauge.held("bob") == 10



def count_calls(gauge: QueueGauge) -> Counter[str]:
    """Count ``gauge``'s take / hold / release calls from now on (each takes its lock once)."""
    calls: Counter[str] = Counter()
    for name in ("take", "hold", "release"):
        real = getattr(gauge, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
            calls[_name] += 1
            return _real(*args)

        setattr(gauge, name, counted)
    return calls


@pytest.mark.parametrize("durable", [False, True])
def test_a_first_hop_dm_takes_its_place_once_and_frees_it_once(
    durable: bool, root: Path, gateways: list[Gateway]
) -> None:
    # The sender's thread takes the place and the ProfileActor frees it as it settles the DM. The Dispatcher
    # neither holds it again (it is held) nor frees it again (the ProfileActor said so): one lock round each.
    gw = start_gateway(gateways, root, CallableRunner(lambda turn: "ok", blocking=False), durable=durable)
    system = gw._system
    assert system is not None and system.caller_admission is not None and system.caller_admission.gauge is not None
    calls = count_calls(system.caller_admission.gauge)  # the one gauge every part of the gateway shares
    ids = [send_dm(gw, f"dm {i}") for i in range(5)]
    assert [gw.wait_outcome(i, timeout=30)["status"] for i in ids] == ["replied"] * 5
    assert system.caller_admission.gauge.held("bob") == 0
    assert calls == Counter(take=5, release=5), calls
