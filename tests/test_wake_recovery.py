"""A wake-up a host killed -9 had started: offered again at the next start when it provably never reached its bot.

Regression (review, ``repro_wake.py``): the hermes gateway hosting the actors was killed right after a DM's
outcome, one round in four before the wake's text reached the sender's Bot Chat; the restart reported the wake
``ambiguous`` ("The gateway stopped or crashed during the turn.") and the sender never learnt the outcome. The
journal says the wake started; hermes' ``state.db`` says whether its text ever reached the bot
(``hermes.cli_runner.never_reached``, the hermes runners' ``never_reached`` hook).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from roots import LogCapture, RecordingRunner, make_root

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.core import outcomes
from hermes_actors.core.acks import delivery_record
from hermes_actors.core.ids import new_delivery_id
from hermes_actors.core.wake import wake_delivery, wake_for, wake_id, wake_retry_delivery, wake_retry_id
from hermes_actors.errors import TurnFailed
from hermes_actors.hermes.cli_runner import never_reached
from hermes_actors.messages import Delivery, Turn
from hermes_actors.store.turnlock import TurnLock, turn_lock_path

DM = Delivery(new_delivery_id(), "alice", "alice", "bob", "bob", "Message from 🤖 Alice (@alice): ping 1", hop=1,
              label="@bob", wake=True)
REPLIED = outcomes.from_reply(DM.delivery_id, "@bob", "bob got: ping 1")


@pytest.fixture
def session_db() -> type:
    return pytest.importorskip("hermes_state", reason="needs hermes-agent (the [hermes] extra)").SessionDB


def _wake(root: Path, accepted_at: float) -> Delivery:
    request = wake_for(REPLIED, DM, mode="true", runner_is_hermes=True, local_profiles={"alice", "bob"}, root=root)
    assert request is not None
    return wake_delivery(request, now=accepted_at)


def _bot_chat(session_db: type, home: Path, *user_texts: str) -> None:
    """alice's Bot Chat, with ``user_texts`` stored now (as hermes stores a turn's message when it begins)."""
    db = session_db(db_path=home / "state.db")
    try:
        db.create_session("s1", "cli")
        db.set_session_title("s1", "Bot Chat")
        for text in user_texts:
            db.append_message("s1", "user", text)
    finally:
        db.close()


def _turn(root: Path, wake: Delivery) -> Turn:
    return Turn(profile="alice", content=wake.content, delivery_id=wake.delivery_id, session="Bot Chat",
                home=root / "profiles" / "alice", root=root)


def test_never_reached_is_true_only_when_nothing_can_still_run_the_turn_and_its_text_is_not_stored(
    tmp_path: Path, session_db: type
) -> None:
    root = make_root(tmp_path)
    home = root / "profiles" / "alice"
    wake = _wake(root, time.time())
    assert never_reached(_turn(root, wake), wake.accepted_at) is False  # no state.db: cannot tell

    _bot_chat(session_db, home, wake.content)  # an older wake with the same text does not count
    db = session_db(db_path=home / "state.db")
    try:
        with db._lock:  # dated a minute before the wake was accepted
            db._conn.execute("UPDATE messages SET timestamp = ?", (wake.accepted_at - 60,))
            db._conn.commit()
    finally:
        db.close()
    assert never_reached(_turn(root, wake), wake.accepted_at) is True

    lock = TurnLock(turn_lock_path(root, "alice"))  # a hermes CLI process of the dead host holds the bot's flock
    assert lock.try_acquire()
    try:
        assert never_reached(_turn(root, wake), wake.accepted_at) is False
    finally:
        lock.release()
        lock.close()

    # A live gateway that is not this process (a child of ours: the parent may be pid 1, which no pid file names).
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        (root / "gateway.pid").write_text(json.dumps({"pid": other.pid}), encoding="utf-8")
        assert never_reached(_turn(root, wake), wake.accepted_at) is False  # not this process: it may store it yet
    finally:
        other.communicate(timeout=30)  # stdin closed: it ends
    (root / "gateway.pid").write_text(json.dumps({"pid": os.getpid()}), encoding="utf-8")  # hosted in the gateway
    assert never_reached(_turn(root, wake), wake.accepted_at) is True

    db = session_db(db_path=home / "state.db")
    try:
        db.append_message("s1", "user", wake.content)  # the wake's turn began: it may have run
    finally:
        db.close()
    assert never_reached(_turn(root, wake), wake.accepted_at) is False


class _Hermes:
    """A runner with the hermes runners' ``never_reached`` hook; its turns are counted."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def run_turn(self, turn: Turn) -> str:
        self.ran.append(turn.content)
        return "alice noted it"

    def never_reached(self, turn: Turn, since: float) -> bool:
        return never_reached(turn, since)


def _dead_journal(root: Path, records: list[dict[str, Any]]) -> None:
    directory = root / "bot_relay" / "journal"
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / f"j-{new_delivery_id()}.log"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    path.chmod(0o600)


@pytest.mark.parametrize("reached", [False, True], ids=["never-reached", "reached"])
def test_a_started_wake_runs_after_the_restart_only_when_its_text_never_reached_the_bot(
    tmp_path: Path, session_db: type, reached: bool
) -> None:
    root = make_root(tmp_path)
    wake = _wake(root, time.time() - 5)
    _bot_chat(session_db, root / "profiles" / "alice", *([wake.content] if reached else []))
    _dead_journal(root, [{"t": "accepted", "id": DM.delivery_id, "d": delivery_record(DM)},
                         {"t": "finished", "id": DM.delivery_id, "o": REPLIED.as_dict()},
                         {"t": "delivered", "id": DM.delivery_id},
                         {"t": "accepted", "id": wake.delivery_id, "d": delivery_record(wake)},
                         {"t": "started", "id": wake.delivery_id, "attempt": 1}])
    runner = _Hermes()
    with Gateway(root, runner=runner, config={"bot_mode": {"wake_sender": True}}) as gw:
        if reached:  # it may have run: it stays for the bot's next turn, never run twice
            assert (gw.recovered["reoffered"], gw.recovered["ambiguous"]) == (0, 1), gw.recovered
        else:
            assert (gw.recovered["reoffered"], gw.recovered["ambiguous"]) == (1, 0), gw.recovered
            await_condition(lambda: runner.ran == [wake.content], timeout=30, message="the wake never ran")
    assert runner.ran == ([] if reached else [wake.content])  # once, and only when it never reached alice


def test_a_started_wake_that_reached_the_bot_is_logged_with_a_wakes_words_at_the_restart(
    tmp_path: Path, session_db: type
) -> None:
    """Regression (acceptance on hermes 0.19): a wake whose serve was killed -9 mid-turn, its orphaned CLI process
    finishing it, was logged at the next start as "waking @alice failed (wake …, unknown): The gateway stopped or
    crashed during the turn. The message may have been delivered — do not resend.": a DM's words, to nobody."""
    root = make_root(tmp_path)
    wake = _wake(root, time.time() - 5)
    _bot_chat(session_db, root / "profiles" / "alice", wake.content)
    _dead_journal(root, [{"t": "accepted", "id": DM.delivery_id, "d": delivery_record(DM)},
                         {"t": "finished", "id": DM.delivery_id, "o": REPLIED.as_dict()},
                         {"t": "delivered", "id": DM.delivery_id},
                         {"t": "accepted", "id": wake.delivery_id, "d": delivery_record(wake)},
                         {"t": "started", "id": wake.delivery_id, "attempt": 1}])
    with LogCapture("WARNING") as logs, Gateway(root, runner=_Hermes(), config={"bot_mode": {"wake_sender": True}}):
        await_condition(lambda: logs.matching("waking @alice failed"), timeout=10, message="the wake was not logged")
    (line,) = logs.matching("waking @alice failed")
    assert line.endswith(f"waking @alice failed (wake {wake.delivery_id}, ambiguous): The gateway stopped or crashed "
                         "during the turn. It is not run again: a wake that may have run never runs twice, so the bot "
                         "may or may not have this outcome in its Bot Chat."), line
    assert "resend" not in line and "message may have been delivered" not in line


# ── a wake attempt that failed retryable, across a stop or a kill ───────────

RETRY = {"bot_mode": {"wake_sender": True, "wake_retry_seconds": 0.05}}


def _wake_turns(runner: RecordingRunner) -> list[str]:
    return [t.delivery_id for t in runner.entered if t.profile == "alice"]


def _restart_runs_nothing(root: Path, *settled: str) -> None:
    """One more start on the root: nothing is run or re-offered again, and each of ``settled`` is known."""
    runner = RecordingRunner()
    with Gateway(root, runner=runner, config=RETRY) as gw:
        assert (gw.recovered["reoffered"], gw.recovered["ambiguous"]) == (0, 0), gw.recovered
        for key in settled:
            assert gw.wait_outcome(key, timeout=10)["status"] in ("replied", "failed")
        assert gw.stats()["wakes_retried"] == 0
    assert runner.entered == []


def test_a_gateway_stopped_while_a_wakes_retry_waits_runs_the_retry_once_after_the_restart(tmp_path: Path) -> None:
    """The retry is journaled (accepted, in one batch with the failed attempt's delivered record) as the failed
    attempt's outcome is published, and only its run waits for the back-off: a stop meanwhile leaves it journaled,
    never started, and the next start runs it once."""
    root = make_root(tmp_path)

    def refuse_the_wake(turn: Turn) -> str:
        if turn.profile == "alice":
            raise TurnFailed("alice's Bot Chat is open on another surface right now", "target_busy")
        return "bob got it"

    first = RecordingRunner(refuse_the_wake)
    slow = {"bot_mode": {"wake_sender": True, "wake_retry_seconds": 3600}}  # the retry waits past the stop
    with Gateway(root, runner=first, config=slow) as gw:
        ack = gw.message_agent(sender="alice", target="bob", message="ping")
        assert gw.wait_outcome(ack["delivery_id"], timeout=10)["status"] == "replied"
        wake, retry = wake_id(ack["delivery_id"]), wake_retry_id(wake_id(ack["delivery_id"]))
        assert gw.wait_outcome(wake, timeout=10)["reason"] == "target_busy"
        assert gw.stats()["wakes_retried"] == 1  # booked, waiting for its back-off
    assert _wake_turns(first) == [wake]

    second = RecordingRunner()
    with Gateway(root, runner=second, config=RETRY) as gw:
        assert gw.recovered["reoffered"] == 1, gw.recovered
        assert gw.wait_outcome(retry, timeout=20)["status"] == "replied"
    assert _wake_turns(second) == [retry]  # once: alice got bob's reply
    _restart_runs_nothing(root, retry)


@pytest.mark.parametrize("journaled", ["retry-journaled", "retry-not-journaled-yet", "window-closed",
                                       "retry-journaled-window-closed"])
def test_a_wake_attempt_that_failed_retryable_before_a_kill_is_tried_again_once_by_the_next_start(
    tmp_path: Path, journaled: str
) -> None:
    """A host killed -9 after a wake attempt failed ``target_busy``. Killed during the back-off, its journal holds
    the retry (accepted, never started; the failed attempt delivered): the next start re-offers it. Killed before
    that batch landed, the failed attempt is settled but not delivered: the next start publishes its outcome
    again, which decides the retry again (created once). Either way it runs once; past its window (the wake was
    created more than ``reply_wait_seconds`` ago) it is given up with one WARNING instead, unless the retry was
    journaled already: its back-off is not journaled, so it is re-offered at once like any accepted DM, and runs."""
    root = make_root(tmp_path)
    created = time.time() - (1000 if journaled.endswith("window-closed") else 0)
    wake = _wake(root, created)
    retry = wake_retry_delivery(wake)
    busy = outcomes.failed(wake.delivery_id, wake.label, "alice's Bot Chat is open elsewhere", "target_busy")
    records = [{"t": "accepted", "id": DM.delivery_id, "d": delivery_record(DM)},
               {"t": "finished", "id": DM.delivery_id, "o": REPLIED.as_dict()},
               {"t": "delivered", "id": DM.delivery_id},
               {"t": "accepted", "id": wake.delivery_id, "d": delivery_record(wake)},
               {"t": "started", "id": wake.delivery_id, "attempt": 1},
               {"t": "finished", "id": wake.delivery_id, "o": busy.as_dict()}]
    if journaled.startswith("retry-journaled"):  # the retry's batch: its accepted, the failed one's delivered
        records += [{"t": "accepted", "id": retry.delivery_id, "d": delivery_record(retry)},
                    {"t": "delivered", "id": wake.delivery_id}]
    _dead_journal(root, records)
    runner = RecordingRunner()
    with LogCapture("WARNING") as logs, Gateway(root, runner=runner, config=RETRY) as gw:
        if journaled == "window-closed":
            await_condition(lambda: gw.stats()["wakes_failed"] == 1, timeout=10, message="the wake was given up")
            assert gw.stats()["wakes_retried"] == 0
        else:
            assert gw.wait_outcome(retry.delivery_id, timeout=20)["status"] == "replied"
            assert gw.stats()["wakes_retried"] == (journaled == "retry-not-journaled-yet")
    if journaled == "window-closed":
        assert runner.entered == []
        (given_up,) = logs.matching("waking @alice failed")
        assert "given up: 900 s (bot_mode.reply_wait_seconds)" in given_up
        _restart_runs_nothing(root, wake.delivery_id)
        return
    assert _wake_turns(runner) == [retry.delivery_id]
    assert runner.entered[0].content == wake.content
    assert logs.matching("waking @alice") == []
    _restart_runs_nothing(root, retry.delivery_id)
