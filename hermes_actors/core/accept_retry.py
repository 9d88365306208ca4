"""Pure: what a listening socket's server does when ``accept()`` fails: retry after a bounded back-off, or end.

An ``accept()`` fails for reasons that pass: the process or the system is out of descriptors
(``EMFILE``, ``ENFILE``: a client holding many connections, a burst), of memory (``ENOBUFS``,
``ENOMEM``), or the connection it was to take went away first (``ECONNABORTED``, ``EPROTO``,
and the network errors Linux hands on from the new socket). None of them is the listening
socket's own fault: the server keeps accepting once they pass. Ending there stopped the submit
endpoint for good while its socket file stayed, so every later client waited its whole timeout
to be told its DM "may or may not have been queued". Only a listening socket that is itself
unusable (closed, not a socket, not listening) ends the accept loop, and so does the server's
own stop, which its owner checks first.

The pending connection that cannot be taken keeps the socket readable: retrying at once would spin
a core for as long as the shortage lasts, so each retry waits :func:`accept_backoff` first (doubling
from :data:`ACCEPT_BACKOFF_MIN` up to :data:`ACCEPT_BACKOFF_MAX`). That the accepts fail is said
once per spell, and once when they succeed again (:class:`~hermes_actors.core.spell.Spell`).
"""

from __future__ import annotations

import errno

from hermes_actors.core.backoff import pause_after

__all__ = ["ACCEPT_BACKOFF_MAX", "ACCEPT_BACKOFF_MIN", "UNUSABLE_LISTENER_ERRNOS", "accept_backoff",
           "accept_retries"]

ACCEPT_BACKOFF_MIN = 0.01  # seconds before the first retry
ACCEPT_BACKOFF_MAX = 0.5  # seconds between retries at most: a client waits this long at worst once it passes

#: The errors of a listening socket that is itself unusable: retrying cannot cure them.
UNUSABLE_LISTENER_ERRNOS = frozenset({errno.EBADF, errno.ENOTSOCK, errno.EINVAL, errno.EFAULT})


def accept_retries(error: int | None) -> bool:
    """Pure: whether an ``accept()`` that failed with ``error`` is retried (after :func:`accept_backoff`).

    Args:
        error: the failure's errno (None: an OSError without one).

    Returns:
        True for every error but those of an unusable listening socket (:data:`UNUSABLE_LISTENER_ERRNOS`):
        ``EMFILE``, ``ENFILE``, ``ENOBUFS``, ``ENOMEM``, ``ECONNABORTED``, ``EPROTO``, ``EINTR``, ``EPERM``...
    """
    return error not in UNUSABLE_LISTENER_ERRNOS


def accept_backoff(failures: int) -> float:
    """Pure: seconds to wait before retrying after ``failures`` failed accepts in a row.

    Args:
        failures: failed accepts in a row, this one included (at least 1).

    Returns:
        :data:`ACCEPT_BACKOFF_MIN` doubled at each failure after the first, at most
        :data:`ACCEPT_BACKOFF_MAX`; never 0 (a retry at once would spin).
    """
    return pause_after(failures, ACCEPT_BACKOFF_MIN, ACCEPT_BACKOFF_MAX)
