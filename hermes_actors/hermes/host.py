"""Hosting the actors of a root in this process: the Gateway's submit endpoint and the shared hosts.

- :func:`open_submit_endpoint` serves a running Gateway on its root's submit socket
  (``Gateway(serve_submit=True)`` calls it) and records it as this process's host
  of that root, so a ``message_agent`` call made in this very process (the hermes
  gateway hosting us) skips the socket.
- :func:`acquire_host` / :func:`release_host` share one Gateway per resolved root
  among several users (the hermes gateway starts our platform once per profile):
  the first acquire starts it, the last release stops it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loguru import logger

from actors import RestartPolicy
from hermes_actors.facade.options import runs_hermes
from hermes_actors.hermes.plugin import dm_hop
from hermes_actors.hermes.submit import SubmitServer
from hermes_actors.hermes.submit_protocol import OutcomeCall, SendCall, offline_refusal
from hermes_actors.hermes.warm_or_cli import turns_info

if TYPE_CHECKING:
    from hermes_actors.gateway import Gateway

__all__ = [
    "HOST_RESTART_POLICY", "HostFactory", "acquire_host", "hosted_gateway", "open_submit_endpoint", "release_host",
]

_serving: dict[Path, Gateway] = {}  # resolved root → the running Gateway serving its endpoint here
_serving_lock = threading.Lock()


def _key(root: str | Path) -> Path:
    return Path(root).expanduser().resolve()


def hosted_gateway(root: str | Path) -> Gateway | None:
    """The Gateway that serves ``root``'s submit endpoint in this process, if any."""
    with _serving_lock:
        gw = _serving.get(_key(root))
    return gw if gw is not None and gw.running else None


def _send_via(gw: Gateway) -> Callable[[SendCall], dict[str, Any]]:
    def send(call: SendCall) -> dict[str, Any]:
        # ``author`` is not forwarded: the attribution is derived from the sender by the
        # Dispatcher, so a client cannot sign a DM as someone else. A DM from a warm turn
        # this host runs (in a separate hermes gateway: serve) is one hop deeper than it.
        hop = dm_hop(call.hop, call.session)
        try:
            return gw.message_agent(sender=call.sender, target=call.target, message=call.message, hop=hop)
        except RuntimeError:  # the gateway began stopping: nothing would run the DM
            return offline_refusal(gw.root)

    return send


def _outcome_via(gw: Gateway) -> Callable[[OutcomeCall], dict[str, Any]]:
    def outcome(call: OutcomeCall) -> dict[str, Any]:
        try:
            return gw.wait_outcome(call.delivery_id, timeout=call.wait)
        except TimeoutError:  # the same keys as an outcome read from the root's files (ops.journal_view)
            return {"status": "pending", "delivery_id": call.delivery_id,
                    "error": "accepted by the running host; no outcome yet"}
        except KeyError as exc:
            why = str(exc.args[0] if exc.args else exc)
            return {"status": "unknown", "delivery_id": call.delivery_id, "error": why}

    return outcome


def _status_via(gw: Gateway) -> Callable[[], dict[str, Any]]:
    def status() -> dict[str, Any]:
        from hermes_actors.ops.status import live_status

        return live_status(gw)

    return status


class _Endpoint:
    """A Gateway's submit server plus its entry in this process's host table."""

    def __init__(self, gw: Gateway) -> None:
        self.key = _key(gw.root)
        self.gw = gw
        from hermes_actors.rooms.remote import room_handler

        # The pong says whether turns run hermes (the real one, or a Bot Mode release's CLI): doctor then
        # knows the hermes CLI and the plugin matter; the connection id the host runs as (given by
        # --connection-id, not always in config.yaml): doctor looks for it on Redis; and how its turns run
        # now (warm or the CLI, asked at each ping: the real Hermes' runner is chosen as the start ends)
        # Its path is checked at the gateway's rescan period: a run/ swapped meanwhile is put back and bound again.
        hermes_turns = runs_hermes(gw.runner)
        self.server = SubmitServer(gw.root, send=_send_via(gw), outcome=_outcome_via(gw), status=_status_via(gw),
                                   roster=gw.roster, room=room_handler(gw),
                                   info={"runs_hermes": hermes_turns, "connection_id": gw.connection_id},
                                   live_info=lambda: turns_info(gw.runner),
                                   check_seconds=gw.config.rescan_seconds if gw.config is not None else None)

    def open(self) -> _Endpoint:
        self.server.start()
        with _serving_lock:
            _serving[self.key] = self.gw
        return self

    def stop_accepting(self, timeout: float = 5.0) -> None:
        """No more DMs through this endpoint; the root stays this process's until :meth:`close`."""
        with _serving_lock:
            if _serving.get(self.key) is self.gw:
                del _serving[self.key]
        self.server.stop_accepting(timeout)

    def close(self, timeout: float = 5.0) -> None:
        self.stop_accepting(timeout)
        self.server.close(timeout)


def open_submit_endpoint(gw: Gateway) -> _Endpoint:
    """Serve ``gw`` on its root's submit socket; returns the endpoint.

    ``stop_accepting()`` it before the gateway stops, ``close()`` it once it has.

    Raises:
        RuntimeError: another process already hosts this root.
        HostileFileError: the run directory or socket path is not ours.
    """
    return _Endpoint(gw).open()


# ── shared hosts (the hermes gateway's platform, once per root) ─────────────


# factory(root, on_failure) -> a Gateway, not started, that calls on_failure if it fails
HostFactory = Callable[[Path, Callable[[BaseException | None], Any]], "Gateway"]
HOST_RESTART_POLICY = RestartPolicy(max_restarts=3, within_seconds=60.0)  # then the failed host stays down


@dataclass
class _Shared:
    gateway: Gateway
    refs: int
    factory: HostFactory
    restarts: deque[float] = field(default_factory=lambda: deque(maxlen=HOST_RESTART_POLICY.max_restarts + 1))


_shared: dict[Path, _Shared] = {}
_shared_lock = threading.Lock()  # held while a host starts or stops: acquire/release of one root never interleave


def acquire_host(root: str | Path, factory: HostFactory) -> Gateway:
    """The shared running Gateway of ``root``; the first call starts ``factory(root, on_failure)``.

    A shared Gateway that fails (its Dispatcher stopped on an error) is stopped and started
    again from ``factory`` (its journaled DMs are re-offered), at most
    :data:`HOST_RESTART_POLICY` times within its window; after that it stays down and the
    bots' DMs are refused ``runtime_offline`` until the hermes gateway restarts.

    Raises:
        Whatever ``factory(root, ...).start()`` raises (nothing is counted then).
    """
    key = _key(root)
    with _shared_lock:
        entry = _shared.get(key)
        if entry is None:
            gw = _start_shared(key, factory)
            entry = _shared[key] = _Shared(gw, 0, factory)
            logger.info("hosting the actors of {}", key)
        entry.refs += 1
        return entry.gateway


def _start_shared(key: Path, factory: HostFactory) -> Gateway:
    """Start ``factory``'s Gateway for ``key``; its failure hands a restart to its own thread."""
    def on_failure(error: BaseException | None) -> None:  # on the failed Dispatcher's thread: it cannot stop itself
        threading.Thread(target=_restart_shared, args=(key, gw, error), name=f"hermes-actors restart {key.name}",
                         daemon=True).start()

    gw = factory(key, on_failure)
    return gw.start()


def _restart_shared(key: Path, failed: Gateway, error: BaseException | None, timeout: float = 30.0) -> None:
    """Replace the failed shared Gateway of ``key`` (unless released meanwhile or failing too often)."""
    with _shared_lock:
        entry = _shared.get(key)
        if entry is None or entry.gateway is not failed:
            return  # released (and stopped) meanwhile
        failed.stop(timeout=timeout)
        now = time.monotonic()
        if not HOST_RESTART_POLICY.allows(entry.restarts, now):
            logger.error("the actors of {} failed again ({!r}) and were restarted {} times within {:.0f} s: they "
                         "stay down; the bots' DMs are refused until the hermes gateway restarts", key, error,
                         HOST_RESTART_POLICY.max_restarts, HOST_RESTART_POLICY.within_seconds)
            return
        entry.restarts.append(now)
        try:
            entry.gateway = _start_shared(key, entry.factory)
        except Exception as exc:
            logger.error("the actors of {} failed ({!r}) and could not start again: {}", key, error, exc)
            return
        logger.warning("the actors of {} failed ({!r}) and were started again (journaled DMs re-offered)", key, error)


def release_host(root: str | Path, timeout: float = 30.0) -> bool:
    """Drop one reference to ``root``'s shared Gateway; the last one stops it.

    Returns:
        True when this call stopped the Gateway.
    """
    key = _key(root)
    with _shared_lock:
        entry = _shared.get(key)
        if entry is None:
            return False
        entry.refs -= 1
        if entry.refs > 0:
            return False
        del _shared[key]
        entry.gateway.stop(timeout=timeout)
        logger.info("stopped hosting the actors of {}", key)
        return True
