"""Durable stop: DMs queued behind a blocked turn stay journaled and the next start re-offers them."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from roots import RecordingRunner, held_on, make_root

from actors.testkit import await_condition
from hermes_actors import Gateway


def test_stop_keeps_queued_dms_journaled_and_the_next_start_runs_each_once(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    release = threading.Event()
    first_runner = RecordingRunner(held_on("blocker", release))
    outcomes: list[dict[str, Any]] = []
    lock = threading.Lock()

    def seen(outcome: dict[str, Any]) -> None:
        with lock:
            outcomes.append(outcome)
        if outcome["status"] == "ambiguous":
            release.set()  # the blocked turn is reported: let its worker finish so stop() returns promptly

    gw = Gateway(root, runner=first_runner, durable=True)
    gw.subscribe(seen)
    gw.start()
    blocker = gw.message_agent(sender="alice", target="bob", message="blocker")["delivery_id"]
    first_runner.wait_entered(1)
    queued = [gw.message_agent(sender="alice", target="bob", message=f"queued {n}")["delivery_id"] for n in range(3)]
    also = gw.message_agent(sender="alice", target="carol", message="carol is idle")["delivery_id"]
    assert gw.wait_outcome(also, timeout=10)["status"] == "replied"
    gw.stop(timeout=0.3)
    release.set()

    def blocker_notified() -> bool:  # the stuck turn used up the timeout: its notification may follow the stop
        with lock:
            return any(o["delivery_id"] == blocker for o in outcomes)

    await_condition(blocker_notified, timeout=10, message="the blocked turn's outcome notified")
    with lock:
        by_id = {o["delivery_id"]: o for o in outcomes}
    assert by_id[blocker]["status"] == "ambiguous", "a turn still running after the stop timeout is ambiguous"
    for key in queued:
        assert key not in by_id, "a journaled DM that never ran gets no outcome at stop"
        # DESIGN 3: KeyError only for an id neither this gateway issued nor the journal holds
        with pytest.raises(TimeoutError, match="not running: accepted; it has not started"):
            gw.wait_outcome(key, timeout=0.1)
    assert gw.wait_outcome(blocker, timeout=0)["status"] == "ambiguous"
    with pytest.raises(KeyError, match="unknown delivery id"):
        gw.wait_outcome("0" * 32, timeout=0)
    assert first_runner.bodies() == ["blocker", "carol is idle"]

    second_runner = RecordingRunner()
    again = Gateway(root, runner=second_runner, durable=True)
    with pytest.raises(TimeoutError, match="the next gateway on"):  # not started yet: the journal answers
        again.wait_outcome(queued[0], timeout=0)
    later: list[dict[str, Any]] = []
    again.subscribe(later.append)
    again.start()
    try:
        assert again.recovered["reoffered"] == 3, again.recovered
        assert again.recovered["ambiguous"] == 0
        replies = [again.wait_outcome(k, timeout=10) for k in queued]
        assert [o["status"] for o in replies] == ["replied"] * 3
        assert [o["reply"] for o in replies] == ["ok: queued 0", "ok: queued 1", "ok: queued 2"]
        assert again.wait_outcome(blocker, timeout=5)["status"] == "ambiguous"  # known, not re-run
        assert again.wait_outcome(also, timeout=5)["reply"] == "ok: carol is idle"
    finally:
        again.stop()
    assert second_runner.bodies() == ["queued 0", "queued 1", "queued 2"], "each re-offered DM ran exactly once"
    assert Counter(o["delivery_id"] for o in later) == Counter(queued), (again.recovered, blocker, also)

    third_runner = RecordingRunner()
    third = Gateway(root, runner=third_runner, durable=True).start()
    try:
        assert third.recovered.get("reoffered", 0) == 0
        assert [third.wait_outcome(k, timeout=5)["reply"] for k in queued] == [
            "ok: queued 0", "ok: queued 1", "ok: queued 2"
        ]
    finally:
        third.stop()
    assert third_runner.entered == []


@pytest.mark.parametrize(
    ("reply", "cut"),
    [
        pytest.param("x" * (9 << 20), True, id="9MiB-plain"),  # past the outcome limit: cut, with a note
        pytest.param("\x01" * (3 << 20), False, id="3MiB-escaped"),  # fits, but JSON writes 6 bytes a byte
    ],
)
def test_a_long_reply_outlives_a_restart_whole_or_cut_never_lost(tmp_path: Path, reply: str, cut: bool) -> None:
    from hermes_actors.core.outcomes import TEXT_MAX_BYTES

    root = make_root(tmp_path)
    with Gateway(root, runner=RecordingRunner(lambda turn: reply), durable=True) as gw:
        key = gw.message_agent(sender="alice", target="bob", message="the long answer")["delivery_id"]
        first = gw.wait_outcome(key, timeout=60)
    assert first["status"] == "replied"
    assert len(first["reply"].encode()) <= TEXT_MAX_BYTES
    assert (first["reply"] != reply) is cut
    if cut:
        assert reply.startswith(first["reply"].partition("\n\n[cut here")[0]) and "[cut here" in first["reply"]

    again_runner = RecordingRunner()
    with Gateway(root, runner=again_runner, durable=True) as again:
        assert again.wait_outcome(key, timeout=10) == first  # the journal line was read back whole
    assert again_runner.entered == []
    assert not list((root / "bot_relay" / "quarantine").glob("*")), "the journal was not quarantined as damaged"


def test_a_running_gateway_answers_the_outcome_another_gateway_on_its_root_journaled(tmp_path: Path) -> None:
    """DESIGN 3: ``KeyError`` only for an id neither this gateway issued nor the root's journal holds.

    A second gateway started before the first one settled (and stopped) reads the first one's journal.
    """
    root = make_root(tmp_path)
    release = threading.Event()
    first_runner = RecordingRunner(held_on("held", release))
    first = Gateway(root, runner=first_runner, durable=True).start()
    second = Gateway(root, runner=RecordingRunner(), durable=True).start()
    try:
        done = first.message_agent(sender="alice", target="carol", message="quick")["delivery_id"]
        held = first.message_agent(sender="alice", target="bob", message="held")["delivery_id"]
        assert first.wait_outcome(done, timeout=10)["status"] == "replied"
        first_runner.wait_entered(2)
        # Journaled by the first gateway after the second one started: not in the second's memory.
        assert second.wait_outcome(done, timeout=0)["status"] == "replied"
        assert second.wait_outcome(done, timeout=5)["reply"] == first.wait_outcome(done, timeout=0)["reply"]
        with pytest.raises(TimeoutError, match="another gateway on"):
            second.wait_outcome(held, timeout=0.1)
        with pytest.raises(KeyError, match="no journal on"):
            second.wait_outcome("0" * 32, timeout=0)
        release.set()
        assert first.wait_outcome(held, timeout=10)["status"] == "replied"
        first.stop(timeout=5)
        assert second.wait_outcome(held, timeout=1)["status"] == "replied"
    finally:
        release.set()
        first.stop(timeout=5)
        second.stop(timeout=5)
