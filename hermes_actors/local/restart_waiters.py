"""The ``AwaitRestarts`` answers the Dispatcher owes: set once no crashed ProfileActor is still down.

:class:`RestartWaiters` is owned by the DispatcherActor and used on its thread; it reads the
supervisor's children (the ProfileActors) to know when every crashed one has reported and
been restarted (or given up on).
"""

from __future__ import annotations

import pykka

from actors import SupervisorActor

__all__ = ["RestartWaiters"]


class RestartWaiters:
    """Futures waiting for the ProfileActors' restarts.

    Args:
        supervisor: the Dispatcher (its children are the ProfileActors).
    """

    def __init__(self, supervisor: SupervisorActor) -> None:
        self.supervisor = supervisor
        self.waiting: list[pykka.ThreadingFuture[None]] = []  # AwaitRestarts answers not given yet

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def add(self) -> pykka.ThreadingFuture[None]:
        """A future set once every crashed ProfileActor has reported and been restarted (or given up)."""
        future: pykka.ThreadingFuture[None] = pykka.ThreadingFuture()
        self.waiting.append(future)
        self.answer()
        return future

    def answer(self, *, stopping: bool = False) -> None:
        """Answer the futures once no ProfileActor is down (or the Dispatcher stops: ``stopping``)."""
        sup = self.supervisor
        if self.waiting and (stopping or not any(sup.child_down(name) for name in sup.children)):
            waiters, self.waiting = self.waiting, []
            for future in waiters:
                future.set(None)
