"""The process a Gateway was started in: a fork of it refuses the gateway, and interpreter exit stops one left
running.

A ``fork()``ed child inherits the Gateway object but none of its actor threads (only the forking thread
survives a fork), and its journal's write offset is the parent's: a DM the child acked would be lost, and
every call would wait on actors that do not run there. So each public call first checks that it runs in the
process that started the gateway (:meth:`OwnerProcess.refuse_in_fork`): a fork hook keeps the current pid, so
the check costs an attribute read, not a ``getpid`` syscall per DM.

The actors run on non-daemon threads, so a script that ends without ``stop()`` (nor a ``with`` block) never
exited. :func:`stop_at_exit` has the interpreter's exit stop such a gateway, as ``stop()`` would (journaled DMs
stay for the next start; in memory the queue is cancelled), with a warning naming it.
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from pathlib import Path
from typing import Protocol

from loguru import logger

__all__ = ["OwnerProcess", "forget_at_exit", "stop_at_exit"]

_pid = os.getpid()  # this process's pid, kept by the fork hook below


def _forked() -> None:
    """In a forked child: the pid the gateways compare with is the child's."""
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):  # POSIX; where there is no fork there is no child to refuse
    os.register_at_fork(after_in_child=_forked)


class OwnerProcess:
    """The pid of the process that started a gateway (None until it started).

    Args:
        root: the gateway's Hermes root (named in the refusal).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pid: int | None = None

    def claim(self) -> None:
        """The gateway has started in this process."""
        self.pid = _pid

    def here(self) -> bool:
        """Whether the gateway may be used in this process: never started, or started here."""
        return self.pid is None or self.pid == _pid

    def refuse_in_fork(self) -> None:
        """Refuse a call from a fork of the process that started the gateway.

        Raises:
            RuntimeError: this process is not the one the gateway was started in (nothing is done).
        """
        if self.pid is not None and self.pid != _pid:
            raise RuntimeError(
                f"Gateway({self.root}): this Gateway was started in process {self.pid}; process {_pid} is a fork "
                "of it and cannot use it (its actors run in the parent only) — start a new Gateway in the child"
            )


class _Stoppable(Protocol):
    """What the exit hook needs of a gateway."""

    root: Path

    def stop(self) -> None: ...


# The gateways started in this process and not stopped, held weakly (a gateway dropped by everyone is kept
# alive by its own actors while it runs; a stopped one must not be kept at all) → the pid that started each.
_left_running: weakref.WeakKeyDictionary[_Stoppable, int] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_hooked = False


def stop_at_exit(gateway: _Stoppable) -> None:
    """Have the interpreter's exit stop ``gateway`` if it still runs then (until :func:`forget_at_exit`).

    Args:
        gateway: a gateway that just started in this process.
    """
    global _hooked
    with _lock:
        _left_running[gateway] = _pid
        if _hooked:
            return
        _hooked = True
    # threading's exit hooks run before the interpreter joins the non-daemon threads (the actors' own); atexit's
    # only after that join, which a running gateway never lets end. The hook is private CPython API
    # (concurrent.futures uses it): without it atexit is all there is, and a script must stop its gateway.
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(_stop_left_running)
            return
        except RuntimeError:  # the interpreter is already exiting (a gateway started by an exit handler)
            pass
    atexit.register(_stop_left_running)


def forget_at_exit(gateway: _Stoppable) -> None:
    """``gateway`` is stopping: the exit has nothing to stop of it.

    Args:
        gateway: the gateway.
    """
    with _lock:
        _left_running.pop(gateway, None)


def _stop_left_running() -> None:
    """At interpreter exit: stop each gateway this process started and did not stop, within its stop timeout.

    Does nothing in a forked child: the gateways it inherited are its parent's.
    """
    with _lock:
        left = [gateway for gateway, pid in _left_running.items() if pid == _pid]
    for gateway in left:
        logger.warning("Gateway({}) was not stopped; stopping it at interpreter exit — use `with Gateway(...)` "
                       "or call stop()", gateway.root)
        try:
            gateway.stop()
        except Exception:  # the next gateway still stops
            logger.exception("Gateway({}): the stop at interpreter exit failed", gateway.root)
