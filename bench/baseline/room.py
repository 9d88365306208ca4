"""A model of the upstream group-room driver: it polls for room work every 2 s.

Upstream Bot Mode drives a room from a loop that wakes every
:data:`ROOM_POLL_S` seconds (hermes-agent issue #92760: "group bots reply
slowly"). The model gives that loop the most favourable reading: each tick runs
one whole round (every responder's turn, serially, back to back), so a send
costs the wait for the next tick plus one tick per further round, the silent
round that settles it included. The round rules are ours
(:mod:`hermes_actors.rooms.rules`), and the turns are the same instant
callable on both sides: only the driving mechanism differs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from hermes_actors.rooms.rules import Round, Spoken, after_turn, find_mentions, open_round

__all__ = ["ROOM_POLL_S", "PollingRoom"]

ROOM_POLL_S = 2.0

Turn = Callable[[str, list[tuple[str, str]]], str]  # (member, news) -> reply or "[SILENT]"


class PollingRoom:
    """One room driven by a polling loop (start with ``with PollingRoom(...)``).

    Args:
        members: the members, in order.
        turn: a member's turn.
        poll_s: the loop's period.
    """

    def __init__(self, members: Sequence[str], turn: Turn, *, poll_s: float = ROOM_POLL_S) -> None:
        self.members = tuple(members)
        self.turn = turn
        self.poll_s = poll_s
        self.lock = threading.Lock()
        self.transcript: list[tuple[str, str]] = []
        self.seen = dict.fromkeys(self.members, 0)
        self.pending: list[int] = []  # transcript index of each send not started
        self.active: Round | None = None
        self.idle = threading.Event()
        self.idle.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="polling-room", daemon=True)

    def __enter__(self) -> PollingRoom:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def send(self, text: str) -> None:
        """Post a user message (the driver notices it at its next tick)."""
        with self.lock:
            self.transcript.append(("user", text))
            self.pending.append(len(self.transcript) - 1)
            self.idle.clear()

    def wait_idle(self, timeout: float) -> bool:
        """Block until the room settled; False on timeout."""
        return self.idle.wait(timeout)

    def _resolve(self, name: str) -> str | None:
        want = name.strip().removeprefix("@")
        return want if want in self.members else None

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            with self.lock:
                self._tick()

    def _tick(self) -> None:
        if self.active is None:
            if not self.pending:
                return
            index = self.pending.pop(0)
            mentioned, _ = find_mentions(self.transcript[index][1], self.members, self._resolve)
            self.active = open_round(str(index), self.members, "user", mentioned)
        number = self.active.number
        state: Round | None = self.active
        while state is not None and state.number == number:  # one round per tick
            member = state.queue[0]
            news = [(a, t) for a, t in self.transcript[self.seen[member]:] if a != member]
            self.seen[member] = len(self.transcript)
            spoken = Spoken(False)
            if news:
                reply = self.turn(member, news)
                if reply != "[SILENT]":
                    self.transcript.append((member, reply))
                    self.seen[member] = len(self.transcript)
                    mentioned, user = find_mentions(reply, self.members, self._resolve)
                    spoken = Spoken(True, mentioned, user)
            state = after_turn(state, self.members, member, spoken)
        self.active = state
        if state is None and not self.pending:
            self.idle.set()
