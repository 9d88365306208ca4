"""The ``hermes_actors`` gateway platform: hosts our actors inside ``hermes gateway run``.

Imported only by the hermes gateway (it subclasses hermes' ``BasePlatformAdapter``).
It carries no chats: ``connect()`` (gateway start) acquires the shared
``Gateway(root, serve_submit=True)`` of the root and ``disconnect()`` (gateway stop)
releases it. With ``gateway.multiplex_profiles: true`` hermes starts a platform once
per profile that enables it; the shared host is counted per resolved root, so the
actors run once.

Config (``platforms: {hermes_actors: {enabled: true, extra: {host_actors: true, ...}}}``; without
``host_actors`` the platform is never started, see ``plugin.hosting_configured``), other extras optional:
``root`` (default: the root of the profile starting the platform) and ``runner``
(``demo`` for the offline demo bots; default: the real Hermes — warm turns through
this gateway's API server when it serves the root, else the ``hermes`` CLI).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.config import Platform
from gateway.platforms.base import BasePlatformAdapter, SendResult
from loguru import logger

from hermes_actors.hermes.gateway_process import own_gateway_stop_begun, watch_own_stop
from hermes_actors.hermes.host import acquire_host, release_host
from hermes_actors.hermes.log_bridge import forward_to_hermes_logging
from hermes_actors.hermes.plugin import PLATFORM_NAME, active_profile_home, root_and_profile

__all__ = ["HostAdapter", "hermes_stop_begun", "make_host_gateway"]

_STOP_TIMEOUT = 20.0


def make_host_gateway(root: Path, runner_kind: str = "",
                      on_failure: Callable[[BaseException | None], Any] | None = None) -> Any:
    """The Gateway a hermes gateway hosts for ``root`` (not started).

    Its ``host_stopping`` is hermes' own stop (:func:`~hermes_actors.hermes.gateway_process.own_gateway_stop_begun`):
    hermes closes its API server and drains before it disconnects our platform (which stops the Gateway), so no
    turn starts from the beginning of hermes' stop on, rather than on the CLI while nothing of ours stops yet.

    Args:
        root: the Hermes root.
        runner_kind: ``demo`` for the offline demo bots; anything else: the real
            Hermes (``Gateway``'s default runner, chosen when it starts).
        on_failure: the Gateway's ``on_failure`` (the shared host restarts it).

    Returns:
        The Gateway.
    """
    from hermes_actors.gateway import Gateway

    return Gateway(root, runner="demo" if runner_kind == "demo" else None, serve_submit=True, on_failure=on_failure,
                   host_stopping=own_gateway_stop_begun)


def hermes_stop_begun(runner: Any) -> bool:
    """Whether the stop of the hermes gateway ``runner`` (hermes' ``GatewayRunner``, the platform's
    ``gateway_runner``) has begun: its ``stop()`` made its stop task (Ctrl-C, SIGTERM, a restart).

    Args:
        runner: the runner hermes set on the platform (None before it did, or in a hermes without it).

    Returns:
        False when not known (no runner, or a hermes without that attribute).
    """
    return getattr(runner, "_stop_task", None) is not None


class HostAdapter(BasePlatformAdapter):
    """A chat-less platform whose lifetime is the lifetime of our shared host."""

    def __init__(self, config: Any) -> None:
        super().__init__(config, Platform(PLATFORM_NAME))
        forward_to_hermes_logging()  # a failure to host, a refused file... reach hermes' gateway.log
        extra = getattr(config, "extra", None) or {}
        self._configured_root = str(extra.get("root") or "")
        self._runner_kind = str(extra.get("runner") or "")
        self._root: Path | None = None
        self._releasing = False  # our disconnect began: the gateway stops (hermes tears platforms down at its stop)
        watch_own_stop(self.stopping, begun=self.stop_begun)

    def stopping(self) -> bool:
        """Whether the hermes gateway this platform runs in has begun to stop (its stop, or our disconnect, began).

        Asked when a warm turn is refused or its connection drops: hermes closes its API server before it
        disconnects us.
        """
        return self._releasing or self.stop_begun()

    def stop_begun(self) -> bool:
        """Whether hermes' own stop of the gateway this platform runs in has begun (for good: the process goes
        down); not our disconnect alone. The hosted Gateway starts no turn from then on."""
        return hermes_stop_begun(getattr(self, "gateway_runner", None))

    def _resolve_root(self) -> Path:
        if self._configured_root:
            return Path(self._configured_root).expanduser()
        return root_and_profile(active_profile_home())[0]  # called inside hermes' per-profile scope

    async def connect(self, *, is_reconnect: bool = False) -> bool:
        """Start (or join) the host of this profile's root. False (logged) when it cannot start."""
        if self._root is not None:
            return True
        root = self._resolve_root()
        kind = self._runner_kind
        try:
            await asyncio.to_thread(acquire_host, root,
                                    lambda key, on_failure: make_host_gateway(key, kind, on_failure))
        except Exception as exc:
            logger.error("hermes-actors could not host the actors of {}: {}", root, exc)
            return False
        self._root = root
        self._releasing = False
        self._mark_connected()
        return True

    async def disconnect(self) -> None:
        """Release the host; the last platform of the root stops it."""
        root, self._root = self._root, None
        if root is not None:
            self._releasing = True
            try:
                await asyncio.to_thread(self._release, root)
            except Exception as exc:
                logger.error("hermes-actors host of {} did not stop cleanly: {}", root, exc)
        self._mark_disconnected()

    def _release(self, root: Path) -> None:
        """Release the host (on a worker thread). Our disconnect stays "stopping" until it is done, even once hermes
        gave up waiting for it (5 s, then it goes on and cuts the turns still running): a turn of ours cut then was
        cut by this stop. Once released, no turn of ours is left to cut."""
        try:
            release_host(root, _STOP_TIMEOUT)
        finally:
            self._releasing = False

    async def send(
        self, chat_id: str, content: str, reply_to: str | None = None, metadata: dict[str, Any] | None = None
    ) -> Any:
        """This platform has no chats to send to."""
        return SendResult(success=False, error="the hermes-actors host platform has no chats")

    async def get_chat_info(self, chat_id: str) -> dict[str, Any]:
        """A placeholder: this platform has no chats."""
        return {"name": "hermes-actors", "type": "dm"}
