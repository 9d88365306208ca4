"""A gateway in its own process that the take-over tests SIGKILL (not a test module).

    python tests/relay_dying.py ROOT CONNECTION send
        start a Gateway on ROOT (``wake_sender`` on), send one relay DM alice → moxie, print its ack as one JSON
        line, then wait to be killed.
    python tests/relay_dying.py ROOT CONNECTION report
        as ``send``; once the DM's reply lands, it reports it (journaled, published), wakes its sender (the runner
        prints ``{"woke": <wake id>}``) and is SIGKILLed at the relay's ``relay-before-forget`` crashpoint,
        after the wake ran: its ``sent/`` record is left, though its outcome is journaled and delivered.
        With ``HERMES_ACTORS_CRASH_AT`` set, that point kills it as any crashpoint does instead.
    python tests/relay_dying.py ROOT CONNECTION hold
        start a Gateway on ROOT whose runner prints ``{"running": <delivery id>}`` when a turn enters it and
        then never returns, print ``{"started": true}``, then wait to be killed: the relayed-in envelopes taken
        meanwhile stay on its shelf, the first one started, the others queued behind it.

Every line on stdout is flushed at once, so the parent has it before its SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from roots import RecordingRunner

from hermes_actors import Gateway
from hermes_actors.records import Turn
from hermes_actors.relay import outbound


def emit(**fields: Any) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def hold_forever(turn: Turn) -> str:
    emit(running=turn.delivery_id)
    threading.Event().wait()  # until the SIGKILL
    return "never"


def die_before_forget_once_woken() -> threading.Event:
    """Kill this process at ``relay-before-forget`` once the sender's wake ran (set the returned event then).

    The relay forgets the DM as soon as the wake's batch is on disk, before the wake's turn has run: waiting
    here (on the relay's thread, which the wake does not need) makes the wake's run certain before the kill.
    """
    woken = threading.Event()
    real = outbound.crashpoint

    def crash(name: str) -> None:
        if name == "relay-before-forget":
            woken.wait(60)
            os.kill(os.getpid(), signal.SIGKILL)
        real(name)

    outbound.crashpoint = crash  # type: ignore[assignment]
    return woken


def woke(woken: threading.Event) -> Callable[[Turn], str]:
    """A runner's behaviour that prints the id of each turn (the sender's wake) and sets ``woken``."""

    def behave(turn: Turn) -> str:
        emit(woke=turn.delivery_id)
        woken.set()
        return "woken"

    return behave


def main(argv: list[str]) -> int:
    root, connection, mode = Path(argv[0]), argv[1], argv[2]
    if mode == "report":
        armed = os.environ.get("HERMES_ACTORS_CRASH_AT")
        woken = threading.Event() if armed else die_before_forget_once_woken()
        runner = RecordingRunner(woke(woken))
    else:
        runner = RecordingRunner(hold_forever if mode == "hold" else None)
    gw = Gateway(root, runner=runner, config={"bot_mode": {"wake_sender": True, "rescan_seconds": 300}},
                 connection_id=connection)
    gw.start()
    if mode in ("send", "report"):
        emit(ack=gw.message_agent(sender="alice", target="moxie", message="from the gateway about to die"))
    else:
        emit(started=True)
    sys.stdin.read()  # until the SIGKILL (or the parent closes stdin)
    gw.stop(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
