"""A throwaway ``redis-server`` on loopback, for the Redis benchmark and the tests.

    server = RedisServer(tmp_dir).start()     # free port, AOF appendfsync always
    server.kill(); server.start()             # a crash, then a restart on the same port (AOF replay)

    proc, url = start_redis(tmp_dir)          # the same, as a bare process (bench scripts)
    ...
    stop_redis(proc)

The one implementation: ``tests/redis_fixture.py`` wraps :class:`RedisServer` in a pytest fixture.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

__all__ = ["RedisServer", "redis_binary", "start_redis", "stop_redis"]

_NOT_INSTALLED = "redis-server is not installed (apt-get install -y redis-server)"


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


def stop_redis(proc: subprocess.Popen[bytes]) -> None:
    """Kill the server (SIGKILL: only what the AOF fsynced survives) and reap it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover — a SIGKILLed process that does not exit
        pass


class RedisServer:
    """One ``redis-server`` on 127.0.0.1 with its AOF in ``directory``, restartable on the same port.

    Args:
        directory: its working dir (``redis.log`` and the AOF files live there across restarts).
        password: ``requirepass`` (None: no auth).
        fsync: the ``appendfsync`` policy (``always`` or ``everysec``).

    Raises:
        FileNotFoundError: no ``redis-server`` binary.
    """

    def __init__(self, directory: str | Path, *, password: str | None = None, fsync: str = "always") -> None:
        binary = redis_binary()
        if binary is None:
            raise FileNotFoundError(_NOT_INSTALLED)
        self.binary = binary
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.password = password
        self.fsync = fsync
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://[:password@]127.0.0.1:PORT/0``."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start it (on a free port the first time, on the same port after that) and wait for PING.

        Args:
            timeout: how long to wait for the first PONG, per attempt (5 attempts).

        Returns:
            This server.

        Raises:
            RuntimeError: it did not start (see ``directory/redis.log``).
        """
        for _attempt in range(5):
            port = self.port or _free_port()
            argv = [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.directory),
                    "--appendonly", "yes", "--appendfsync", self.fsync, "--save", "", "--daemonize", "no",
                    "--logfile", str(self.directory / "redis.log")]
            if self.password:
                argv += ["--requirepass", self.password]
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break  # the port was taken meanwhile: try another one (or, on a restart, again)
                if _ping(port, self.password):
                    self.port = port
                    return self
                time.sleep(0.02)
            stop_redis(self.proc)
            if self.port:  # a restart must get its own port back: give the old socket a moment
                time.sleep(0.2)
        raise RuntimeError(f"redis-server did not start; see {self.directory / 'redis.log'}")

    def kill(self) -> None:
        """SIGKILL (a crash: only what the AOF fsynced survives)."""
        if self.proc is not None:
            stop_redis(self.proc)

    def restart(self, timeout: float = 10.0) -> RedisServer:
        """Kill it and start it again on the same port (the AOF replays)."""
        self.kill()
        return self.start(timeout)

    def client(self) -> Any:
        """A ``redis.Redis`` client on it (needs redis-py)."""
        import redis

        return redis.Redis.from_url(self.url)


def start_redis(tmpdir: str | Path, *, fsync: str = "always", password: str | None = None,
                timeout: float = 10.0) -> tuple[subprocess.Popen[bytes], str]:
    """Start a :class:`RedisServer` in ``tmpdir``; ``(process, url)``. Stop it with :func:`stop_redis`.

    Raises:
        FileNotFoundError: no ``redis-server`` binary.
        RuntimeError: it did not start (see ``tmpdir/redis.log``).
    """
    server = RedisServer(tmpdir, password=password, fsync=fsync).start(timeout)
    assert server.proc is not None
    return server.proc, server.url
