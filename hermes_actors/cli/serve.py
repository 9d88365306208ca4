"""``hermes-actors serve``: run one gateway on a root until interrupted."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

from hermes_actors.gateway import Gateway

__all__ = ["serve"]


def serve(root: Path, *, connection_id: str | None, runner: Any, config: dict[str, Any] | None = None,
          stop: threading.Event | None = None) -> int:
    """Start a gateway serving the root's submit endpoint, block until SIGINT/SIGTERM (or ``stop``), then stop it.

    Raises:
        RuntimeError: another process already hosts the root.
    """
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    with Gateway(root, runner=runner, config=config, connection_id=connection_id, serve_submit=True) as gw:
        names = ", ".join(f"@{r['handle']}" for r in gw.roster() if r["connection_id"] is None)
        print(f"gateway serving {root} as {connection_id or '(no connection id)'}: {names}", flush=True)
        stop.wait()
    return 0
