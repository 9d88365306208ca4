"""A real ``redis-server`` for tests and bench scripts (not a test module).

    from redis_fixture import start_redis
    proc, url = start_redis(tmp_dir)          # loopback, free port, AOF appendfsync always
    ...
    proc.kill()

The ``redis_server`` pytest fixture (exported through ``tests/conftest.py``)
yields a :class:`RedisServer` that can also be killed and restarted on the same
port and directory (AOF replay), and is killed at teardown. Without a
``redis-server`` binary the test is SKIPPED with the reason.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["RedisServer", "dead_consumer", "fake_connection", "redis_binary", "redis_server", "start_redis"]


def redis_binary() -> str | None:
    """The ``redis-server`` executable, or None."""
    return shutil.which("redis-server") or next(
        (p for p in ("/usr/bin/redis-server", "/usr/local/bin/redis-server") if Path(p).is_file()), None)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(port: int, password: str | None) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            if password:
                s.sendall(f"AUTH {password}\r\n".encode())
                if not s.recv(64).startswith(b"+OK"):
                    return False
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")  # "-LOADING" while the AOF replays
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` on 127.0.0.1 with AOF (``appendfsync always``) in ``directory``.

    Args:
        directory: its working dir (AOF files live there across restarts).
        password: ``requirepass`` (None: no auth).
        fsync: ``appendfsync`` policy (``always`` or ``everysec``).
    """

    def __init__(self, directory: Path, *, password: str | None = None, fsync: str = "always") -> None:
        binary = redis_binary()
        if binary is None:
            raise FileNotFoundError("redis-server is not installed (apt-get install -y redis-server)")
        self.binary = binary
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.password = password
        self.fsync = fsync
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start (on a free port the first time, on the same port after that); waits for PING."""
        for _attempt in range(5):
            port = _free_port() if not self.port else self.port
            argv = [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.directory),
                    "--appendonly", "yes", "--appendfsync", self.fsync, "--save", "", "--daemonize", "no",
                    "--logfile", str(self.directory / "redis.log")]
            if self.password:
                argv += ["--requirepass", self.password]
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break  # the port was taken meanwhile: try another one
                if _ping(port, self.password):
                    self.port = port
                    return self
                time.sleep(0.02)
            self._reap()
            if self.port:  # a restart on the same port must work
                time.sleep(0.2)
        raise RuntimeError(f"redis-server did not start; see {self.directory / 'redis.log'}")

    def kill(self) -> None:
        """SIGKILL (a crash: only what AOF fsynced survives)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self._reap()

    def restart(self, timeout: float = 10.0) -> RedisServer:
        self.kill()
        return self.start(timeout)

    def _reap(self) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def client(self):  # type: ignore[no-untyped-def]
        import redis

        return redis.Redis.from_url(self.url)


def start_redis(tmpdir: str | Path, *, password: str | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """Start a redis-server in ``tmpdir`` (for bench scripts); returns (process, url). Kill the process when done."""
    server = RedisServer(Path(tmpdir), password=password).start()
    assert server.proc is not None
    return server.proc, server.url


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
