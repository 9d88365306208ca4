"""The floors: what the primitives under every DM cost on this machine, measured in the same run.

A DM in hermes-actors crosses actor mailboxes; the cheapest possible hop is one
pykka ``ask`` round trip (the caller's message to an actor thread and the
reply back, nothing else). :func:`pykka_ask_cpu_us` measures its CPU cost so
the result can state ``CPU per DM / CPU per ask`` — a ratio of two figures
measured minutes apart in one process, on the same loaded machine.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pykka

from bench.measure import CpuClock, percentile, us_per_item

__all__ = [
    "fdatasync_ms", "measure_floors", "measure_spread_floor", "placements", "pykka_ask_cpu_us",
    "pykka_pipelined_ask_cpu_us", "pykka_spread_rate",
]


class _Echo(pykka.ThreadingActor):
    """An actor that answers every message with itself: the work inside the hop is nil.

    Args:
        cpu: the CPU its thread runs on (None: wherever the scheduler puts it).
    """

    def __init__(self, cpu: int | None = None) -> None:
        super().__init__()
        self.cpu = cpu

    def on_start(self) -> None:
        if self.cpu is not None:
            os.sched_setaffinity(0, {self.cpu})  # 0: this thread only

    def on_receive(self, message: Any) -> Any:
        return message


def placements() -> dict[str, tuple[int, int] | None]:
    """Where the caller and the actor run for each floor sample: on one CPU, on two, or unpinned.

    An ask between two threads on one CPU costs about half the CPU of one whose wake-up crosses
    to the other CPU (measured: 13 against 29 µs on a 2-core VM), and an unpinned pair lands on
    either: the floor is measured in both placements, so no run's ratio depends on where the
    scheduler happened to put two threads.
    """
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux: one unpinned sample
        return {"unpinned": None}
    if len(cpus) < 2:
        return {"one_cpu": (cpus[0], cpus[0])}
    return {"one_cpu": (cpus[0], cpus[0]), "two_cpus": (cpus[0], cpus[1])}


def pykka_ask_cpu_us(n: int, warmup: int = 200, placement: tuple[int, int] | None = None) -> tuple[float, float]:
    """CPU and wall time of one pykka ``ask`` round trip, each in microseconds.

    One caller thread asks one ``ThreadingActor`` ``n`` times in a row
    (``ref.ask(msg)``: a message into its mailbox, the actor thread wakes,
    answers through a future, the caller wakes). CPU is the whole process's
    (both threads), divided by ``n``.

    Args:
        n: asks measured.
        warmup: asks before measuring (thread start, first allocations).
        placement: the (caller, actor) CPUs (None: unpinned); the caller's affinity is restored after.

    Returns:
        ``(cpu_us, wall_us)`` per ask.
    """
    before = os.sched_getaffinity(0) if placement is not None else None
    ref = _Echo.start(placement[1] if placement is not None else None)
    try:
        if placement is not None:
            os.sched_setaffinity(0, {placement[0]})
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
        if before is not None:
            os.sched_setaffinity(0, before)
    return clock.per_item_us(n), us_per_item(wall, n)


def pykka_spread_rate(actors: int, messages: int) -> float:
    """Messages per second when ``messages`` tells are spread round-robin over ``actors`` fresh actors.

    The bare-pykka shape of the ``scale`` scenario: every actor is started on first use
    (inside the timed window, as a ProfileActor is) and each message is one ``ask``
    sent without waiting, all answers collected at the end. Nothing but pykka runs.

    Args:
        actors: how many actors share the messages.
        messages: how many messages in all.

    Returns:
        Messages per second (first start → last answer).
    """
    t0 = time.perf_counter()
    refs: list[pykka.ActorRef[Any]] = []
    futures = []
    for i in range(messages):
        if i < actors:
            refs.append(_Echo.start())
        futures.append(refs[i % actors].ask(i, block=False))
    for future in futures:
        future.get(timeout=120)
    wall = time.perf_counter() - t0
    for ref in refs:
        ref.stop()
    return messages / wall if wall > 0 else 0.0


def pykka_pipelined_ask_cpu_us(n: int, senders: int = 8, actors: int = 100) -> float:
    """CPU per ask when ``senders`` threads ask ``actors`` actors round-robin without waiting (µs).

    The bare-pykka shape of ``local-throughput`` (8 senders over 100 profiles, nothing awaited
    until the end): a hop's cost once the mailboxes batch, to set beside a DM's.

    Args:
        n: asks in all.
        senders: sending threads.
        actors: actors the asks are spread over (started before the clock).
    """
    refs = [_Echo.start() for _ in range(actors)]
    per = max(1, n // senders)

    def send(offset: int) -> None:
        futures = [refs[(offset + i) % actors].ask(i, block=False) for i in range(per)]
        for future in futures:
            future.get(timeout=120)

    try:
        clock = CpuClock().start()
        threads = [threading.Thread(target=send, args=(k * 13,)) for k in range(senders)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        clock.stop()
    finally:
        for ref in refs:
            ref.stop()
    return clock.per_item_us(per * senders)


def measure_floors(n: int) -> dict[str, Any]:
    """The ``floors`` block of the result JSON: the ask floor in each placement (:func:`placements`).

    The floor a ratio is taken against (``pykka_ask_cpu_us``) is the ask whose wake-up crosses to
    the other CPU (``two_cpus``; on one CPU, ``one_cpu``): the hop an actor system on this machine
    pays when a message wakes a sleeping thread, as the issue's own ~77 µs figure was measured.
    The one-CPU ask and the pipelined ask (:func:`pykka_pipelined_ask_cpu_us`) are reported beside it.

    Args:
        n: pykka asks to time per placement.

    Returns:
        ``{"pykka_ask_cpu_us", "pykka_ask_wall_us", "pykka_ask_n", "placement", "by_placement",
        "pykka_pipelined_ask_cpu_us"}``, ``by_placement`` being ``{name: {"cpu_us", "wall_us"}}``.
    """
    measured = {}
    for name, placement in placements().items():
        cpu_us, wall_us = pykka_ask_cpu_us(n, placement=placement)
        measured[name] = {"cpu_us": cpu_us, "wall_us": wall_us}
    floor = "two_cpus" if "two_cpus" in measured else next(iter(measured))
    return {"pykka_ask_cpu_us": measured[floor]["cpu_us"], "pykka_ask_wall_us": measured[floor]["wall_us"],
            "pykka_ask_n": n, "placement": floor, "by_placement": measured,
            "pykka_pipelined_ask_cpu_us": pykka_pipelined_ask_cpu_us(max(n, 8000))}


def measure_spread_floor(messages: int) -> dict[str, Any]:
    """The scale scenario's floor: bare pykka actors, the same messages over 100 and over 1,000 of them.

    Args:
        messages: messages per side.

    Returns:
        ``{"pykka_spread_100_per_s", "pykka_spread_1000_per_s", "pykka_spread_1000_vs_100"}``.
    """
    few = pykka_spread_rate(100, messages)
    many = pykka_spread_rate(1000, messages)
    return {"pykka_spread_100_per_s": round(few, 1), "pykka_spread_1000_per_s": round(many, 1),
            "pykka_spread_1000_vs_100": round(many / few, 3) if few > 0 else None, "pykka_spread_n": messages}


def fdatasync_ms(directory: Path, n: int = 200, *, allocated: bool = False) -> float:
    """The median time of appending one journal-sized line to a file in ``directory`` and ``fdatasync``-ing it.

    The durable floor: a durable DM waits for three such commits in a row. Measured in
    the directory the scenario journals into, right next to the measurement it explains
    (the disk of a shared VM can be three times slower one hour than the hour before).

    Args:
        directory: an existing directory on the disk under test.
        n: appends timed.
        allocated: allocate the file ahead first (``posix_fallocate``), as the journal does:
            then no sync commits a new file size.

    Returns:
        Milliseconds (median of ``n``).
    """
    path = Path(directory) / ".fdatasync-floor"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # each write lands where the last ended
    line = b"x" * 199 + b"\n"
    times: list[float] = []
    try:
        if allocated:
            os.posix_fallocate(fd, 0, n * len(line))
            os.fsync(fd)
        for _ in range(n):
            t0 = time.perf_counter()
            os.write(fd, line)
            os.fdatasync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return round(percentile(sorted(times), 50) * 1e3, 3)
