"""QueueGauge: the places a profile's queue has left, shared by the senders' threads and the Dispatcher."""

from __future__ import annotations

import threading

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
