"""A host that holds the root but does not answer: wait for it before a command runs DMs itself.

``send`` and ``room`` run a gateway of their own when no host answers. A host that is
stopping still runs its last turns and still holds its journaled DMs; a DM run beside it
could reach a bot before the DMs that host acked earlier (they run at the next start). A
host still holds ``submit.lock`` until its last turn is done, so the command waits until
that process lets go of the lock or exits (or, for one that was starting, answers).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["HOST_SETTLE_SECONDS", "ask_settled_host", "settle_host"]

T = TypeVar("T")

HOST_SETTLE_SECONDS = 45.0  # serve's stop grace for running turns (30 s), then ending them and exiting
# There is no event for "the starting host bound its socket": while the holder lives, it is asked again
# this often. Only a command that found the root's host starting or stopping ever waits here.
_ASK_AGAIN_SECONDS = 0.25


def settle_host(root: Path, limit: float = HOST_SETTLE_SECONDS) -> bool:
    """When a process holds the root's ``submit.lock`` without answering, wait for it to answer or exit.

    Prints one note on stderr when it waits.

    Args:
        root: the Hermes root.
        limit: seconds to wait at most.

    Returns:
        True once a host answers (the caller asks it again); False when no process holds
        the lock, or once the holder has let go of it or exited (the caller may run the DM itself).

    Raises:
        TimeoutError: the holder neither answered nor let go within ``limit``; the message
            names it and says that nothing was sent.
    """
    from hermes_actors.hermes.submit_client import lock_holder, ping
    from hermes_actors.store.processes import ProcessWatch

    pid = lock_holder(root)
    if pid is None:
        return False
    try:
        watch = ProcessWatch(pid)
    except ProcessLookupError:
        return False
    print(f"note: the host of {root} (pid {pid}) holds the root but does not answer (starting or stopping); "
          f"waiting up to {limit:g} s for it", file=sys.stderr)
    deadline = time.monotonic() + limit
    try:
        while True:
            if watch.wait(max(0.0, min(_ASK_AGAIN_SECONDS, deadline - time.monotonic()))):
                return False
            if ping(root) is not None:
                return True
            if lock_holder(root) != pid:  # a process that embeds a gateway stopped it and lives on
                return ping(root) is not None
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"the host of {root} (pid {pid}) neither answered nor let go of it within {limit:g} s; nothing was "
                    "sent (see `hermes-actors status` and `doctor`; send again once it answers or has exited)"
                )
    finally:
        watch.close()


def ask_settled_host(root: Path, ask: Callable[[], T | None], limit: float = HOST_SETTLE_SECONDS) -> T | None:
    """``ask()`` the root's host; when none answers but a process holds the root, wait for it and ask again.

    Args:
        root: the Hermes root.
        ask: asks the host; None when no host answers.
        limit: seconds :func:`settle_host` waits at most.

    Returns:
        What the host answered, or None when no host remains (the caller may run the work itself).

    Raises:
        TimeoutError: from :func:`settle_host`: the holder neither answered nor let go in time.
    """
    answer = ask()
    if answer is None and settle_host(root, limit):  # it was starting: it answers now
        answer = ask()
    return answer
