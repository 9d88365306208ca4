"""A Gateway's lifecycle state: new → running → stopping → stopped, and who waits for whom.

``start()`` holds :attr:`Lifecycle.lock` for its whole length (it only ever runs once); a
``stop()`` takes it to move the state on, and a second ``stop()`` returns once the first one
is done. A stop from inside one of the gateway's own turns is refused: it would wait for
that very turn.
"""

from __future__ import annotations

import threading
from pathlib import Path

from hermes_actors.local.notifier import in_subscriber_callback
from hermes_actors.local.turns import turn_factory_here
from hermes_actors.system import ActorSystem

__all__ = ["Lifecycle", "refuse_stop_in_own_turn"]


def refuse_stop_in_own_turn(system: ActorSystem | None) -> None:
    """Refuse a ``Gateway.stop()`` called from inside one of the gateway's own turns (its runner's or its live
    owner's: ``local.turns.running_turn_of`` marks both).

    Args:
        system: the gateway's system (None: not started).

    Raises:
        RuntimeError: this thread runs one of ``system``'s turns, which the stop would wait for.
    """
    if system is not None and system.turn_factory is not None and turn_factory_here() == system.turn_factory:
        raise RuntimeError(
            "Gateway.stop() was called from inside one of its own turns: it would wait for that very "
            "turn; stop it from another thread (e.g. threading.Thread(target=gateway.stop).start())"
        )


class Lifecycle:
    """The state, the lock that guards it (never message traffic) and the end of the stop."""

    def __init__(self) -> None:
        self.state = "new"  # new → running → stopping → stopped
        self.lock = threading.Lock()  # guards the lifecycle only, never message traffic
        self._stopped = threading.Event()  # set once a stop() has finished (a second stop() waits for it)
        self._stopping_thread: int | None = None  # the thread id of the stop() under way

    def check_startable(self, root: Path) -> None:
        """Refuse a second start, or a start on a missing root (call it under :attr:`lock`).

        Args:
            root: the Hermes root.

        Raises:
            RuntimeError: already started (or stopped).
            FileNotFoundError: the root is not a directory.
        """
        if self.state != "new":
            raise RuntimeError(f"gateway already {self.state}; create a new Gateway to start again")
        if not root.is_dir():
            raise FileNotFoundError(f"Hermes root {str(root)!r} does not exist or is not a directory")

    def begin_stop(self) -> bool:
        """A ``stop()`` begins: whether this call is the one to stop the gateway.

        A running gateway is stopping from now on (this call stops it); a new one is stopped at
        once. While another thread stops it, this returns once that stop is done, as it will
        (neither a subscriber callback, whose flush that stop waits for, nor that stop's own
        thread, from its ``on_wait``, waits for it).

        Returns:
            True when the gateway was running: the caller stops it, then calls :meth:`stopped`.
        """
        with self.lock:
            if self.state == "new":
                self.state = "stopped"
                self._stopped.set()
            state = self.state
            if state == "running":
                self.state = "stopping"
                self._stopping_thread = threading.get_ident()
        if state == "stopping" and not in_subscriber_callback() and self._stopping_thread != threading.get_ident():
            self._stopped.wait()
        return state == "running"

    def stopped(self) -> None:
        """The stop has stopped every actor: the state is ``stopped`` (a stop waiting for it goes on
        waiting until :meth:`stop_done`)."""
        with self.lock:
            self.state = "stopped"

    def stop_done(self) -> None:
        """The stop is done: wake every other ``stop()`` waiting for it."""
        self._stopped.set()
