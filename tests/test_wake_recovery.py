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
from roots import make_root

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.core import outcomes
from hermes_actors.core.acks import delivery_record
from hermes_actors.core.ids import new_delivery_id
from hermes_actors.core.wake import wake_delivery, wake_for
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
