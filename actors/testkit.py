"""Test kit: a probe actor that records what it is told, and condition waits.

Tests await a condition with a deadline; they never sleep to synchronize.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pykka

__all__ = ["Probe", "ProbeLog", "await_condition"]

T = TypeVar("T")


def await_condition(
    predicate: Callable[[], T], *, timeout: float = 5.0, interval: float = 0.002, message: str = ""
) -> T:
    """Wait until ``predicate()`` is truthy and return its value.

    Args:
        predicate: evaluated repeatedly.
        timeout: the deadline, in seconds.
        interval: pause between evaluations.
        message: what was awaited, for the error.

    Raises:
        TimeoutError: the deadline passed; says what was awaited.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"condition not met within {timeout}s: {message or predicate!r}")
        time.sleep(interval)


class ProbeLog:
    """What a :class:`Probe` received, readable from the test's thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._records: list[Any] = []

    def record(self, message: Any) -> None:
        """Append one received message and wake waiters."""
        with self._cond:
            self._records.append(message)
            self._cond.notify_all()

    def records(self, of_type: type | None = None) -> list[Any]:
        """A copy of what was received, optionally only messages of one type."""
        with self._cond:
            return [m for m in self._records if of_type is None or isinstance(m, of_type)]

    def expect(self, of_type: type[T], *, timeout: float = 5.0, count: int = 1) -> list[T]:
        """Wait until ``count`` messages of ``of_type`` arrived; return them.

        Raises:
            TimeoutError: fewer arrived before the deadline.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [m for m in self._records if isinstance(m, of_type)]
                if len(found) >= count:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"probe got {len(found)} of {count} {of_type.__name__} within {timeout}s"
                    )
                self._cond.wait(remaining)


class Probe(pykka.ThreadingActor):
    """An actor that records every message it receives (answering asks with None), for assertions.

    ``ref, log = Probe.spawn()``: give ``ref`` to the code under test, assert on ``log``.

    Args:
        log: where the messages are recorded.
    """

    def __init__(self, log: ProbeLog) -> None:
        super().__init__()
        self.log = log

    @classmethod
    def spawn(cls) -> tuple[pykka.ActorRef[Any], ProbeLog]:
        """Start a probe.

        Returns:
            Its ref (to give to code under test) and its :class:`ProbeLog` (to assert on).
        """
        log = ProbeLog()
        return cls.start(log), log

    def on_receive(self, message: Any) -> Any:
        self.log.record(message)
        return None
