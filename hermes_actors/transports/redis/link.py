"""The RedisRelayActor's connection to Redis and its outage state.

One :class:`RedisLink` per RedisRelayActor, used only on the actor's thread and
shared by its two halves (:mod:`~hermes_actors.transports.redis.outbound` for our
envelopes, :mod:`~hermes_actors.transports.redis.inbound` for the drain of our
inbox). An outage is logged once, and reported once through ``on_down`` (the actor
tells the roster, so DMs to other machines are refused "unreachable").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loguru import logger

from hermes_actors.transports.redis import store as rs
from hermes_actors.transports.redis.io import make_client

__all__ = ["RedisLink", "as_text"]


def as_text(value: Any) -> str | None:
    """A Redis reply value as ``str`` (bytes decoded; None and ``str`` as they are)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class RedisLink:
    """The client, the key names and whether Redis is reachable.

    Args:
        settings: URL and key prefix.
        me: our connection id.
        on_down: called once when Redis becomes unreachable (until it answers again).
    """

    def __init__(self, settings: rs.RedisSettings, me: str, *, on_down: Callable[[], None]) -> None:
        self.settings = settings
        self.keys = rs.RedisKeys(settings.prefix)
        self.me = me
        self.client: Any = make_client(settings.url)
        self.on_down = on_down
        self.down = False
        self.groups_ok = False  # our streams and their group are there (checked again at each tick while not)
        self.wrong_type: set[str] = set()  # our stream keys that hold another type: left alone until fixed

    def unreachable(self, exc: BaseException) -> bool:
        """Log an outage once; True when ``exc`` means Redis is unreachable (False: a command error, logged)."""
        if not rs.is_redis_unreachable(exc):
            logger.error("redis: command failed: {}", exc)
            if "NOGROUP" in str(exc) or "WRONGTYPE" in str(exc):  # a stream gone or replaced: check them again
                self.groups_ok = False
            return False
        if not self.down:
            logger.warning("redis: {} is unreachable ({}); will retry", self.settings.address, exc)
            self.down = True
            self.on_down()
        self.down = True
        self.groups_ok = False
        return True

    def back_up(self) -> bool:
        """Redis answered: True when it had been down (the caller re-reads what it missed)."""
        if not self.down:
            return False
        self.down = False
        logger.info("redis: {} is reachable again", self.settings.address)
        return True

    def ack(self, stream: str, entry_ids: list[str], *, forget: str | None = None) -> None:
        """XACK + XDEL (the stream keeps only the backlog), and forget ``forget`` from our sent hash.

        A failure is retried when the entry is offered again.
        """
        try:
            pipe = self.client.pipeline(transaction=True)
            if entry_ids and stream not in self.wrong_type:  # a stream replaced by another type lost its entries
                pipe.xack(stream, rs.GROUP, *entry_ids)
                pipe.xdel(stream, *entry_ids)
            if forget is not None:
                pipe.hdel(self.keys.sent(self.me), forget)
            pipe.execute()
        except Exception as exc:
            self.unreachable(exc)

    def close(self) -> None:
        self.client.close()
