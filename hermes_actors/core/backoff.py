"""Pure: the one doubling back-off every retry here waits by.

A retry that comes back at once to a cause that has not passed spins a core (a pending
connection keeps a listening socket readable; a flock another process holds stays held); one
that waits long from the start makes every short hiccup cost that long. So each wait doubles
from a short first one up to a cap: an accept that fails (``core/accept_retry``), a journal
check that cannot be made (``store/journal``), outcome records a full disk held back
(``local/durability``), a turn's flock another process holds (``store/turnlock``), and a
stop letting in-flight sends hand their DM over (``facade/sends``).
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["doubling", "pause_after"]

_MOST_DOUBLINGS = 64  # 2**64 times any first pause used here is past its cap: no huge powers


def doubling(first: float, most: float) -> Iterator[float]:
    """Pure: the pauses of a doubling back-off, one per retry, without end.

    Args:
        first: the first pause (seconds, > 0).
        most: the longest pause (seconds, at least ``first``).

    Returns:
        An iterator of ``first``, ``2 × first``, ``4 × first``... each at most ``most``.

    Raises:
        ValueError: ``first`` is not positive, or ``most`` is below it.
    """
    _check(first, most)
    return _pauses(first, most)


def pause_after(failures: int, first: float, most: float) -> float:
    """Pure: the pause after ``failures`` failures in a row: the ``failures``-th pause of :func:`doubling`.

    Args:
        failures: failures in a row, the last one included (less than 1 counts as 1).
        first: the first pause (seconds, > 0).
        most: the longest pause (seconds, at least ``first``).

    Returns:
        ``first`` doubled at each failure after the first, at most ``most``; never 0.

    Raises:
        ValueError: ``first`` is not positive, or ``most`` is below it.
    """
    _check(first, most)
    return min(most, first * 2 ** min(max(failures, 1) - 1, _MOST_DOUBLINGS))


def _pauses(first: float, most: float) -> Iterator[float]:
    pause = first
    while True:
        yield pause
        pause = min(pause * 2, most)


def _check(first: float, most: float) -> None:
    if not first > 0:
        raise ValueError(f"a back-off's first pause must be positive, not {first!r}")
    if not most >= first:
        raise ValueError(f"a back-off's longest pause ({most!r}) must be at least its first ({first!r})")
