"""State and seams shared by the RedisRelayActor's parts (the sender half and the drain half).

The RedisRelayActor is one actor; its handlers are split by concern across
:mod:`hermes_actors.transports.redis.send` (our envelopes: send, replies,
expiry, reply budget) and :mod:`hermes_actors.transports.redis.actor` (the actor
shell, lifecycle, roster/heartbeat and the drain of our inbox). Everything
here runs on the actor's own thread.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import pykka
from loguru import logger

from actors import TimerHandle, TimerSet, TypedActor
from hermes_actors.core.config import BotModeConfig
from hermes_actors.messages import ProfileInfo, RemoteAgent, RemoteRows
from hermes_actors.transports.redis import store as rs
from hermes_actors.transports.redis.io import ClaimGuard, StreamReader

__all__ = ["Inbound", "RedisBase", "Waiting", "as_text"]


@dataclass
class Waiting:
    """One of our envelopes awaiting its reply (with its reply-budget and TTL timers)."""

    label: str
    handle: str
    connection: str
    timers: list[TimerHandle]


@dataclass
class Inbound:
    """An envelope drained from our inbox whose reply is not in Redis yet."""

    reply_to: str
    entry_ids: set[str] = field(default_factory=set)
    record: dict[str, Any] | None = None  # the reply, once settled (kept until written)




def as_text(value: Any) -> str | None:
    """A Redis reply value as ``str`` (bytes decoded; None and ``str`` as they are)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class RedisBase(TypedActor):
    """The RedisRelayActor's state (owned by its thread) and the methods its parts share."""

    settings: rs.RedisSettings
    keys: rs.RedisKeys
    guard: ClaimGuard
    consumer: str
    config: BotModeConfig
    dispatcher: pykka.ActorRef[Any]
    roster: pykka.ActorRef[Any] | None
    timers: TimerSet
    me: str
    local_profiles: frozenset[str]
    client: Any
    send_script: Any
    reader: StreamReader | None
    waiting: dict[str, Waiting]
    expire_due: set[str]
    inbound: dict[str, Inbound]
    reported: OrderedDict[str, None]
    profiles: tuple[ProfileInfo, ...]
    published: dict[str, bytes] | None
    remote: list[RemoteAgent]
    resumed: bool
    resumed_entries: tuple[tuple[str, str], ...]  # kept until the Gateway's ResumeRelay takes them
    down: bool
    groups_ok: bool
    due: dict[str, float]
    counters: dict[str, int]

    def _unreachable(self, exc: BaseException) -> bool:
        """Log an outage once; True when ``exc`` means Redis is unreachable."""
        if not rs.is_redis_unreachable(exc):
            logger.error("redis: command failed: {}", exc)
            return False
        if not self.down:
            logger.warning("redis: {} is unreachable ({}); will retry", self.settings.address, exc)
            if self.roster is not None:  # DMs to other machines are refused "unreachable", not "no teammate"
                self.roster.tell(RemoteRows(tuple(self.remote), time.time(), unreachable=self.settings.address))
        self.down = True
        self.groups_ok = False
        return True

    def _ack(self, stream: str, entry_ids: list[str], *, forget: str | None = None) -> None:
        """XACK + XDEL (the stream keeps only the backlog); a failure is retried when the entry is re-offered."""
        try:
            pipe = self.client.pipeline(transaction=True)
            if entry_ids:
                pipe.xack(stream, rs.GROUP, *entry_ids)
                pipe.xdel(stream, *entry_ids)
            if forget is not None:
                pipe.hdel(self.keys.sent(self.me), forget)
            pipe.execute()
        except Exception as exc:
            self._unreachable(exc)
