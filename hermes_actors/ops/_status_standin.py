"""STAND-IN — replace at merge with ``hermes_actors.ops.status.live_status`` (issue 16 item 1, branch ops-cli).

A small private ``live_status(gateway)`` built from ``Gateway.stats()`` and
``Gateway.roster()`` only, so the HTTP endpoint (``/status``, ``/metrics``, the
live page) works before the real one lands. It has the same top-level keys
(``running``, ``profiles``, ``in_flight``, ``counters``, ``relay``); it cannot
see per-profile queues or individual in-flight deliveries, so ``in_flight`` is
empty, profiles have no ``state`` and each one's ``queued`` is 0 (``counters["pending"]`` counts them all).
The only import of this module is in ``hermes_actors/ops/http_server.py``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from hermes_actors.gateway import Gateway

__all__ = ["live_status"]

_STARTED = time.time()


def live_status(gateway: Gateway) -> dict[str, Any]:
    """The running gateway's status (stand-in: see the module docstring).

    Args:
        gateway: a Gateway (running or not).

    Returns:
        ``running``, ``pid``, ``uptime_seconds``, ``profiles``, ``peers``, ``in_flight``, ``counters``, ``relay``.
    """
    if not gateway.running:
        return {"running": False, "pid": os.getpid(), "profiles": [], "peers": [], "in_flight": [],
                "counters": {}, "relay": {}}
    stats = gateway.stats()
    relay = {"alive": bool(stats.pop("relay_alive", False)), **stats.pop("relay", {})}
    rows = gateway.roster()
    profiles = [{"profile": r["profile"], "handle": r["handle"], "queued": 0}
                for r in rows if r["connection_id"] is None]
    peers = [{"handle": r["handle"], "connection_id": r["connection_id"], "online": r["online"]}
             for r in rows if r["connection_id"] is not None]
    return {"running": True, "pid": os.getpid(), "uptime_seconds": round(time.time() - _STARTED, 1),
            "profiles": profiles, "peers": peers, "in_flight": [], "counters": stats, "relay": relay}
