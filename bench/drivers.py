"""Load shapes shared by scenarios, written once against the Gateway's calls.

A *system* is anything with ``message_agent(sender=, target=, message=)``,
``wait_outcome(id, timeout)`` and ``subscribe(callback)`` — our
:class:`hermes_actors.Gateway` and :class:`bench.baseline.BaselineGateway`
alike — so ours and the baseline run exactly the same driver code.

Every driver returns a :class:`Run`: per-DM latencies (seconds) and the wall
time the DMs took.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bench.progress import Progress

__all__ = ["BenchError", "Run", "System", "fan_in", "pipelined", "sequential_roundtrip"]

_MESSAGE = "bench ping"


class BenchError(RuntimeError):
    """A DM was refused or failed: the benchmark is misconfigured, not slow."""


class System(Protocol):
    """The calls a driver uses."""

    def message_agent(self, *, sender: str, target: str, message: str) -> dict[str, Any]:
        """Send a DM; the ack dict."""
        ...

    def wait_outcome(self, delivery_id: str, timeout: float = 30) -> dict[str, Any]:
        """Block for an outcome dict."""
        ...

    def subscribe(self, callback: Callable[[dict[str, Any]], Any]) -> Callable[[], None]:
        """Register an outcome callback; returns the unsubscribe function."""
        ...


@dataclass(frozen=True)
class Run:
    """What a driver measured."""

    latencies_s: list[float]
    wall_s: float
    sender_cpu_s: float = 0.0  # CPU the driver's own sender threads spent (0: not measured)


def _delivery_id(ack: dict[str, Any]) -> str:
    if ack.get("status") != "queued" or not ack.get("delivery_id"):
        raise BenchError(f"DM was not accepted: {ack}")
    return str(ack["delivery_id"])


def _check(outcome: dict[str, Any]) -> None:
    if outcome.get("status") != "replied":
        raise BenchError(f"DM did not get a reply: {outcome}")


def sequential_roundtrip(
    system: System, sender: str, target: str, n: int, progress: Progress, timeout: float = 60, warmup: int = 1
) -> Run:
    """Send, wait for the outcome, repeat ``n`` times (after ``warmup`` unmeasured DMs).

    Latency per DM: from the ``message_agent`` call's start to ``wait_outcome`` returning.
    """
    for _ in range(warmup):  # first DM pays lazy imports / the profile's first start
        _check(system.wait_outcome(_delivery_id(system.message_agent(sender=sender, target=target,
                                                                     message=_MESSAGE)), timeout))
    latencies: list[float] = []
    begin = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        did = _delivery_id(system.message_agent(sender=sender, target=target, message=_MESSAGE))
        _check(system.wait_outcome(did, timeout))
        latencies.append(time.perf_counter() - t0)
        progress.advance()
    return Run(latencies, time.perf_counter() - begin)


def pipelined(
    system: System, shares: Sequence[Sequence[tuple[str, str]]], progress: Progress, timeout: float = 120
) -> Run:
    """One sender thread per share sends its (sender, target) DMs without waiting.

    Outcomes are counted through ``subscribe``. Latency per DM: from the send
    call's start to the outcome callback; wall time: first send to last outcome.
    After a run that succeeded the subscription ends with ``system``: stop it after
    this one run.

    Raises:
        BenchError: a DM was refused or failed.
        TimeoutError: not every outcome arrived within ``timeout``.
    """
    total = sum(len(share) for share in shares)
    sent: dict[str, float] = {}
    done: list[tuple[str, float, str]] = []
    lock = threading.Lock()
    all_done = threading.Event()
    errors: list[BaseException] = []

    def on_outcome(outcome: dict[str, Any]) -> None:
        now = time.perf_counter()
        with lock:
            done.append((str(outcome.get("delivery_id")), now, str(outcome.get("status"))))
            finished = len(done) >= total
        progress.advance()
        if finished:
            all_done.set()

    start_gate = threading.Barrier(len(shares) + 1)

    sender_cpu: list[float] = []

    def send_share(share: Sequence[tuple[str, str]]) -> None:
        start_gate.wait()
        local: dict[str, float] = {}
        cpu_start = time.thread_time()
        try:
            for sender, target in share:
                t0 = time.perf_counter()
                local[_delivery_id(system.message_agent(sender=sender, target=target, message=_MESSAGE))] = t0
        except BaseException as exc:  # report to the main thread
            errors.append(exc)
            all_done.set()
        with lock:
            sent.update(local)
            sender_cpu.append(time.thread_time() - cpu_start)

    # Kept past a run that succeeded: our callback runs on a NotifierActor thread of its own, which an unsubscribe
    # ends, and the caller's per-thread CPU (ThreadCpu, read after this returns) counts living threads only
    unsubscribe = system.subscribe(on_outcome)
    threads = [threading.Thread(target=send_share, args=(share,), name=f"bench-sender-{i}") for i, share in
               enumerate(shares)]
    try:
        for thread in threads:
            thread.start()
        start_gate.wait()
        begin = time.perf_counter()
        if not all_done.wait(timeout):
            raise TimeoutError(f"only {len(done)}/{total} outcomes within {timeout}s")
        wall = max(t for _, t, _ in done) - begin
        for thread in threads:
            thread.join()
    except BaseException:
        unsubscribe()
        raise
    if errors:
        raise BenchError(f"a sender failed: {errors[0]}") from errors[0]
    bad = [status for _, _, status in done if status != "replied"]
    if bad:
        raise BenchError(f"{len(bad)} DMs did not get a reply (first: {bad[0]})")
    latencies = [t1 - sent[did] for did, t1, _ in done if did in sent]
    if len(latencies) != total:
        raise BenchError(f"{total - len(latencies)} outcomes did not match a sent DM")
    return Run(latencies, wall, sum(sender_cpu))


def fan_in(
    system: System, senders: Sequence[str], target: str, rounds: int, progress: Progress, timeout: float = 120
) -> Run:
    """Every sender sends one DM to ``target`` at the same moment; repeat ``rounds`` times.

    Persistent sender threads meet at a barrier, each sends and waits for its
    own outcome. Latency per DM: send call start → outcome; wall time: the sum
    of the rounds' durations (barrier release → last outcome of the round).
    """
    latencies: list[float] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    gate = threading.Barrier(len(senders) + 1)

    def sender_loop(name: str) -> None:
        for _ in range(rounds):
            try:
                gate.wait(timeout)
            except threading.BrokenBarrierError:
                return
            try:
                t0 = time.perf_counter()
                did = _delivery_id(system.message_agent(sender=name, target=target, message=_MESSAGE))
                _check(system.wait_outcome(did, timeout))
                with lock:
                    latencies.append(time.perf_counter() - t0)
            except BaseException as exc:  # report to the main thread
                errors.append(exc)
            progress.advance()
            try:
                gate.wait(timeout)
            except threading.BrokenBarrierError:
                return

    threads = [threading.Thread(target=sender_loop, args=(s,), name=f"bench-fanin-{s}") for s in senders]
    for thread in threads:
        thread.start()
    wall = 0.0
    try:
        for _ in range(rounds):
            gate.wait(timeout)
            t0 = time.perf_counter()
            gate.wait(timeout)
            wall += time.perf_counter() - t0
            if errors:
                break
    finally:
        if errors:
            gate.abort()
        for thread in threads:
            thread.join(timeout)
    if errors:
        raise BenchError(f"a fan-in sender failed: {errors[0]}") from errors[0]
    return Run(latencies, wall)
