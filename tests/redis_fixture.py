"""A real ``redis-server`` for tests and bench scripts (not a test module).

    from redis_fixture import start_redis
    proc, url = start_redis(tmp_dir)          # loopback, free port, AOF appendfsync always
    ...
    proc.kill()

The server itself is :mod:`bench.redis_server`'s (one implementation). The ``redis_server``
pytest fixture (exported through ``tests/conftest.py``) yields a :class:`RedisServer` that can
also be killed and restarted on the same port and directory (AOF replay), and is killed at
teardown. Without a
``redis-server`` binary the test is SKIPPED with the reason. The ``black_hole_redis`` fixture yields a
:class:`BlackHole`: a server that accepts TCP connections and never answers (a hung Redis, a dead route
behind a proxy).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.redis_server import RedisServer, redis_binary, start_redis

__all__ = ["BlackHole", "RedisServer", "black_hole_redis", "dead_consumer", "fake_connection", "redis_binary",
           "redis_server", "start_redis"]


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server per test (SKIPPED when the binary is missing)."""
    if redis_binary() is None:
        pytest.skip("redis-server is not installed (apt-get install -y redis-server); Redis transport tests skipped")
    pytest.importorskip("redis", reason="redis-py is not installed (pip install -e '.[dev]')")
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.kill()


class BlackHole:
    """A server on loopback that accepts every TCP connection and never answers; :meth:`close` closes all."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.held: list[socket.socket] = []
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        threading.Thread(target=self._accept, name="black-hole", daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # the listener closed: the test is over
            while True:
                self.held.append(self.listener.accept()[0])

    def close(self) -> None:
        self.listener.close()
        for conn in list(self.held):
            conn.close()


@pytest.fixture
def black_hole_redis() -> Iterator[BlackHole]:
    """A "Redis" that accepts connections and never answers (redis-py is needed; no redis-server)."""
    pytest.importorskip("redis", reason="redis-py is not installed (pip install -e '.[dev]')")
    hole = BlackHole()
    try:
        yield hole
    finally:
        hole.close()


def dead_consumer() -> str:
    """The consumer name of a process of this host that has exited (its Redis lease may be taken over)."""
    import sys

    from hermes_actors.transports.redis.store import consumer_name

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return consumer_name(pid=proc.pid)


def fake_connection(server: RedisServer, conn: str, profiles: tuple[str, ...] = ("bob",), alive: bool = True) -> None:
    """Publish a roster (and a heartbeat) for a connection nobody consumes.

    The heartbeat names a process of this host that has exited, as one killed -9 leaves it: the
    connection looks online until a real gateway on ``conn`` starts and takes its lease over.
    """
    from hermes_actors.messages import ProfileInfo
    from hermes_actors.transports.redis.store import RedisKeys, local_roster_rows

    keys = RedisKeys()
    client = server.client()
    infos = tuple(ProfileInfo(p, p, Path("/nonexistent"), p) for p in profiles)
    client.hset(keys.roster(conn), mapping=local_roster_rows(infos, conn))
    if alive:
        client.set(keys.alive(conn), dead_consumer(), ex=600)
