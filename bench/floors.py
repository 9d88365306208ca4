"""The floors: what the primitives under every DM cost on this machine, measured in the same run.

A DM in hermes-actors crosses actor mailboxes; the cheapest possible hop is one
pykka ``ask`` round trip (the caller's message to an actor thread and the
reply back, nothing else). :func:`pykka_ask_cpu_us` measures its CPU cost so
the result can state ``CPU per DM / CPU per ask`` — a ratio of two figures
measured minutes apart in one process, on the same loaded machine.
"""

from __future__ import annotations

import time
from typing import Any

import pykka

from bench.measure import CpuClock

__all__ = ["measure_floors", "pykka_ask_cpu_us"]


class _Echo(pykka.ThreadingActor):
    """An actor that answers every message with itself: the work inside the hop is nil."""

    def on_receive(self, message: Any) -> Any:
        return message


def pykka_ask_cpu_us(n: int, warmup: int = 200) -> tuple[float, float]:
    """CPU and wall time of one pykka ``ask`` round trip, each in microseconds.

    One caller thread asks one ``ThreadingActor`` ``n`` times in a row
    (``ref.ask(msg)``: a message into its mailbox, the actor thread wakes,
    answers through a future, the caller wakes). CPU is the whole process's
    (both threads), divided by ``n``.

    Args:
        n: asks measured.
        warmup: asks before measuring (thread start, first allocations).

    Returns:
        ``(cpu_us, wall_us)`` per ask.
    """
    ref = _Echo.start()
    try:
        for i in range(warmup):
            ref.ask(i)
        clock = CpuClock().start()
        t0 = time.perf_counter()
        for i in range(n):
            ref.ask(i)
        wall = time.perf_counter() - t0
        clock.stop()
    finally:
        ref.stop()
    return clock.per_item_us(n), round(wall / max(1, n) * 1e6, 2)


def measure_floors(n: int) -> dict[str, Any]:
    """The ``floors`` block of the result JSON.

    Args:
        n: pykka asks to time.

    Returns:
        ``{"pykka_ask_cpu_us", "pykka_ask_wall_us", "pykka_ask_n"}``.
    """
    cpu_us, wall_us = pykka_ask_cpu_us(n)
    return {"pykka_ask_cpu_us": cpu_us, "pykka_ask_wall_us": wall_us, "pykka_ask_n": n}
