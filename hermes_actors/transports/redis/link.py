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

__all__ = ["RedisLink", "Unanswered", "as_text"]


class Unanswered(Exception):
    """A command :meth:`RedisLink.call_once` sent got no answer.

    Args:
        cause: what redis-py raised (a connection error, a timeout).
        written: False when it failed before the command was written whole to the connection
            (connecting, or writing), or Redis answered that it is still loading its dataset
            (``-LOADING``): Redis ran nothing. True when it was written and the answer did not come
            (a read timeout, the connection lost): Redis may have run it, or may run it later.
    """

    def __init__(self, cause: BaseException, *, written: bool) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.written = written


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
            self._command_failed(exc)
            return False
        if not self.down:
            logger.warning("redis: {} is unreachable ({}); will retry", self.settings.address, exc)
            self.down = True
            self.on_down()
        self.down = True
        self.groups_ok = False
        return True

    def _command_failed(self, exc: BaseException) -> None:
        """A command Redis refused: a stream gone or replaced (``NOGROUP``, ``WRONGTYPE``) is checked again."""
        if "NOGROUP" in str(exc) or "WRONGTYPE" in str(exc):
            self.groups_ok = False

    def back_up(self) -> bool:
        """Redis answered: True when it had been down (the caller re-reads what it missed)."""
        if not self.down:
            return False
        self.down = False
        logger.info("redis: {} is reachable again", self.settings.address)
        return True

    def call_once(self, *args: Any) -> Any:
        """Run one command on one connection, never retried, telling apart whether Redis may have run it.

        (A client's own command is retried once on a new connection after a connection error, which
        after the write would run it twice.)

        Args:
            args: the command and its arguments.

        Returns:
            Its answer.

        Raises:
            Unanswered: no answer (``written`` says whether the command reached the connection whole), or
                Redis answered ``-LOADING`` (still loading its dataset: it ran nothing; ``written`` False).
            redis.exceptions.ResponseError: Redis answered with an error (the command ran, or was refused).
        """
        from redis.exceptions import BusyLoadingError, ResponseError

        pool = self.client.connection_pool
        try:
            conn = pool.get_connection()  # connects, or reconnects a connection Redis closed
        except Exception as exc:
            raise Unanswered(exc, written=False) from exc
        try:
            try:
                conn.send_command(*args)
            except Exception as exc:  # a command not written whole is never run
                conn.disconnect()
                raise Unanswered(exc, written=False) from exc
            try:
                return conn.read_response()
            except ResponseError:
                raise
            except BusyLoadingError as exc:  # an answer (a ConnectionError to redis-py): Redis refused the command
                raise Unanswered(exc, written=False) from exc
            except Exception as exc:
                conn.disconnect()  # its answer, if it ever comes, must not be read as the next command's
                raise Unanswered(exc, written=True) from exc
        finally:
            pool.release(conn)

    def ack(self, stream: str, entry_ids: list[str], *, forget: str | None = None) -> bool:
        """XACK + XDEL (the stream keeps only the backlog), and forget ``forget`` from our sent hash.

        A failure is logged (an outage once) and retried when the entry is offered again.

        Returns:
            Whether it was done.
        """
        exc = self.try_ack(stream, entry_ids, forget=forget)
        if exc is not None and not rs.is_redis_unreachable(exc):
            self.unreachable(exc)  # logs the command error
        return exc is None

    def try_ack(self, stream: str, entry_ids: list[str], *, forget: str | None = None) -> BaseException | None:
        """:meth:`ack`, telling Redis unreachable (logged once, as :meth:`unreachable` does) from a command error
        (not logged: the caller says it, e.g. once for a spell of them).

        Returns:
            None when done; else the exception (:func:`rs.is_redis_unreachable` tells which).
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
            if rs.is_redis_unreachable(exc):
                self.unreachable(exc)
            else:
                self._command_failed(exc)
            return exc
        return None

    def close(self) -> None:
        self.client.close()
