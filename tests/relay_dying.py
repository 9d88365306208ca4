"""A gateway in its own process that the take-over tests SIGKILL (not a test module).

    python tests/relay_dying.py ROOT CONNECTION send
        start a Gateway on ROOT (``wake_sender`` on), send one relay DM alice → moxie, print its ack as one JSON
        line, then wait to be killed.
    python tests/relay_dying.py ROOT CONNECTION hold
        start a Gateway on ROOT whose runner prints ``{"running": <delivery id>}`` when a turn enters it and
        then never returns, print ``{"started": true}``, then wait to be killed: the relayed-in envelopes taken
        meanwhile stay on its shelf, the first one started, the others queued behind it.

Every line on stdout is flushed at once, so the parent has it before its SIGKILL.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

from roots import RecordingRunner

from hermes_actors import Gateway
from hermes_actors.records import Turn


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def hold_forever(turn: Turn) -> str:
    emit(running=turn.delivery_id)
    threading.Event().wait()  # until the SIGKILL
    return "never"


def main(argv: list[str]) -> int:
    root, connection, mode = Path(argv[0]), argv[1], argv[2]
    runner = RecordingRunner(hold_forever if mode == "hold" else None)
    gw = Gateway(root, runner=runner, config={"bot_mode": {"wake_sender": True, "rescan_seconds": 300}},
                 connection_id=connection)
    gw.start()
    if mode == "send":
        emit(ack=gw.message_agent(sender="alice", target="moxie", message="from the gateway about to die"))
    else:
        emit(started=True)
    sys.stdin.read()  # until the SIGKILL (or the parent closes stdin)
    gw.stop(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
