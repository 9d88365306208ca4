"""A periodic pass over one relay tree that fails is logged once, not at every rescan, and never ends its actor.

The relay's actors (a gateway's RelayActor, the hub) rescan their trees every
``rescan_seconds``; a tree a user broke (``bot_relay/`` replaced by a file, a
directory of another uid) can make a pass raise at every rescan. Neither actor is
supervised, so an exception out of a pass used to end it for good: one broken root
stopped the hub relaying for every root, and a gateway never drained ``inbox/`` again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from loguru import logger

__all__ = ["FailingPasses"]


class FailingPasses:
    """Which trees' passes are failing, so each failure is logged when it starts (or changes) and when it ends."""

    def __init__(self) -> None:
        self.failing: dict[str, str] = {}

    @contextmanager
    def guard(self, tree: str, fix: str) -> Iterator[None]:
        """Run one pass over ``tree``: an ``Exception`` out of it is logged (once while it stays the same) and dropped.

        Args:
            tree: what the pass is over (a root's name, a relay directory), for the log line.
            fix: what the user should do, for the log line.
        """
        try:
            yield
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            if self.failing.get(tree) != text:
                self.failing[tree] = text
                logger.opt(exception=exc).error("relay: the rescan of {} failed ({}); {}. It is tried again at "
                                                "every rescan", tree, text, fix)
            return
        if self.failing.pop(tree, None) is not None:
            logger.info("relay: the rescan of {} works again", tree)
