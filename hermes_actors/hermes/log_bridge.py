"""Our log records inside a hermes process, in hermes' own logs.

The library disables its loguru loggers at import (only our CLI turns them on).
Inside ``hermes gateway run`` nobody would, and a failure to host the actors, a
refused file or a ``bot_mode`` change would be logged nowhere. The host platform
calls :func:`forward_to_hermes_logging` once: records at INFO and above are handed
to the standard ``logging`` logger ``hermes_plugins.<our name>``
(``hermes_plugins.hermes_actors.…``, ``hermes_plugins.actors.…``), which hermes'
handlers write to ``logs/gateway.log`` (and its catch-all ``agent.log``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from loguru import logger

__all__ = ["STDLIB_PREFIX", "forward_to_hermes_logging"]

# hermes writes the records of loggers under this prefix to gateway.log (its component filter's
# "gateway" prefixes in hermes_logging), and `hermes logs --component gateway` shows them
STDLIB_PREFIX = "hermes_plugins"

_lock = threading.Lock()
_sink_id: int | None = None


def _to_stdlib(message: Any) -> None:
    record = message.record
    exc = record["exception"]
    std = logging.getLogger(f"{STDLIB_PREFIX}.{record['name'] or 'hermes_actors'}")
    # loguru's level numbers are the logging module's (INFO 20, WARNING 30, ERROR 40...)
    std.log(record["level"].no, record["message"],
            exc_info=(exc.type, exc.value, exc.traceback) if exc is not None else None)


def _ours(record: Any) -> bool:
    name = str(record["name"] or "")
    return name == "actors" or name.startswith(("actors.", "hermes_actors"))


def forward_to_hermes_logging(level: str = "INFO") -> None:
    """Send our records at ``level`` and above to the standard ``logging`` module (idempotent).

    Args:
        level: the lowest loguru level forwarded.
    """
    global _sink_id
    with _lock:
        if _sink_id is not None:
            return
        # loguru's default sink (id 0) prints every enabled record, DEBUG included, to stderr: beside
        # hermes' own handlers that would double each line. hermes does not use loguru; a program that
        # does has replaced that sink with its own already (then there is nothing to remove).
        with contextlib.suppress(ValueError):
            logger.remove(0)
        # diagnose=False: loguru's own rendering of a traceback (unused here: the exception goes to logging as
        # exc_info) would show every frame's variables, a DM's text among them
        _sink_id = logger.add(_to_stdlib, level=level, filter=_ours, format="{message}", diagnose=False)
        logger.enable("hermes_actors")
        logger.enable("actors")
