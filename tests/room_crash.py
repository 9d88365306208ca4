"""A gateway with a room in its own process, for the room kill -9 tests.

Every line on stdout is one JSON object, flushed at once (the parent SIGKILLs us).

    python tests/room_crash.py ROOT run KILL_AT
        start a durable Gateway on ROOT, create the room ``crash`` (alice, bob, carol),
        print the ack of one user message to it, wait until it is idle. The runner logs
        every turn as ``<turn id> <profile>`` to ROOT/turns.log as it starts; the turn of
        KILL_AT SIGKILLs this process (a true mid-turn death), the others reply
        ``<profile> speaks``.
    python tests/room_crash.py ROOT queued
        as ``run``, but bob's room turn is still queued behind his DM when the DM's turn
        SIGKILLs this process (bob's room turn never began).
    python tests/room_crash.py ROOT resume
        start a Gateway on ROOT (every turn now passes), wait until the room is idle,
        print the transcript and the turns that ran (profile, session, whether the room's
        first message was in the turn's text), stop.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from roots import TurnLog

from hermes_actors import Gateway
from hermes_actors.messages import Turn


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def main(root: Path, command: str, args: list[str]) -> None:
    if command == "run":
        kill_at = args[0]
        acked = threading.Event()  # the first member's turn may start before room_send returns

        def reply(turn: Turn) -> str:
            if turn.profile == kill_at:
                acked.wait(timeout=60)  # the parent must see the ack line before we die
                os.kill(os.getpid(), signal.SIGKILL)
            return f"{turn.profile} speaks"

        gw = Gateway(root, runner=TurnLog(root / "turns.log", reply)).start()
        gw.create_room("crash", ["alice", "bob", "carol"])
        emit("ack", **gw.room_send("crash", "user", "Everyone, report in."))
        acked.set()
        emit("idle", state=gw.wait_room_idle("crash", timeout=20))
        gw.stop()
        return
    if command == "queued":
        entered, acked = threading.Event(), threading.Event()

        def dm(turn: Turn) -> str:
            if turn.session == "Bot Chat":
                entered.set()
                acked.wait(timeout=60)  # bob's room turn is queued behind this one by now
                os.kill(os.getpid(), signal.SIGKILL)
            return f"{turn.profile} speaks"

        gw = Gateway(root, runner=TurnLog(root / "turns.log", dm)).start()
        gw.create_room("crash", ["alice", "bob", "carol"])
        gw.message_agent(sender="alice", target="bob", message="a long job")
        entered.wait(timeout=60)
        emit("ack", **gw.room_send("crash", "user", "@bob draft it"))
        acked.set()
        emit("idle", state=gw.wait_room_idle("crash", timeout=20))
        return
    ran: list[list[Any]] = []

    def silent(turn: Turn) -> str:
        ran.append([turn.profile, turn.session, "draft it" in turn.content])
        return "[SILENT]"

    gw = Gateway(root, runner=TurnLog(root / "turns.log", silent)).start()
    emit("idle", state=gw.wait_room_idle("crash", timeout=20))
    emit("transcript", entries=gw.room_transcript("crash"))
    emit("ran", turns=ran)
    gw.stop()
    emit("stopped")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
