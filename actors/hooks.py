"""One rule for the user code the toolkit calls on the way of a crash or a reply.

A hook (``salvage``, ``on_crashing``, ``on_crash``, ``answer_after_crash``, an
``ask_reply_to`` reply builder) that raises anything, a ``BaseException`` such as
``SystemExit`` included, is logged and the path it was called on goes on with a
fallback: the error never reaches pykka, which would stop every actor in the process.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

from loguru import logger

__all__ = ["call_hook"]

T = TypeVar("T")


def call_hook(owner: object, name: str, hook: Callable[[], T], fallback: T) -> T:
    """Run ``hook()``; if it raises anything, log it and return ``fallback``.

    Args:
        owner: what the hook belongs to (named in the log line).
        name: the hook's name, logged as ``"<owner> <name>() failed"``.
        hook: the call to make.
        fallback: what the path goes on with when the hook failed.

    Returns:
        The hook's value, or ``fallback`` when it raised.
    """
    try:
        return hook()
    except BaseException:  # a SystemExit must not reach pykka, which would stop every actor
        logger.opt(exception=sys.exc_info()).error("{} {}() failed", owner, name)
        return fallback
