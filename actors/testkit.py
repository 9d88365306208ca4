"""Test kit: a probe actor that records what it is told, and condition waits.

Tests await a condition with a deadline; they never sleep to synchronize.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pykka

__all__ = ["Probe", "await_condition"]

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


class Probe(pykka.ThreadingActor):
    """An actor that records every message it receives, for assertions.

    Use ``Probe.start()`` and read through the returned proxy-free helpers:
    ``probe = Probe.start().proxy()`` is not needed; call :func:`Probe.records`
    on the actor object via ``ref._actor`` or use :meth:`expect` through
    ``Probe.spawn()`` which returns ``(ref, probe)``.
    """

    def __init__(self) -> None:
        super().__init__()
        self._cond = threading.Condition()
        self._records: list[Any] = []

    @classmethod
    def spawn(cls) -> tuple[pykka.ActorRef[Any], Probe]:
        """Start a probe; returns its ref (to give to code under test) and itself (to assert)."""
        probe = cls()
        ref = cls._start_existing(probe)
        return ref, probe

    @classmethod
    def _start_existing(cls, probe: Probe) -> pykka.ActorRef[Any]:
        pykka.ActorRegistry.register(probe.actor_ref)
        probe._start_actor_loop()
        return probe.actor_ref

    def on_receive(self, message: Any) -> Any:
        with self._cond:
            self._records.append(message)
            self._cond.notify_all()
        return None

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
