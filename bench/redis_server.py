"""A throwaway ``redis-server`` for the Redis benchmark (a small copy of ``tests/redis_fixture.py``).

    proc, url = start_redis(tmp_dir)          # loopback, free port, AOF appendfsync always
    ...
    stop_redis(proc)

``bench/`` does not import from ``tests/``, so the start logic lives here too.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["redis_binary", "start_redis", "stop_redis"]


def redis_binary() -> str | None:
    """The ``redis-server`` executable, or None."""
    return shutil.which("redis-server") or next(
        (p for p in ("/usr/bin/redis-server", "/usr/local/bin/redis-server") if Path(p).is_file()), None)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")  # "-LOADING" while the AOF replays
    except OSError:
        return False


def stop_redis(proc: subprocess.Popen[bytes]) -> None:
    """Kill the server and reap it."""
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover — a SIGKILLed process that does not exit
        pass


def start_redis(tmpdir: str | Path, *, fsync: str = "always",
                timeout: float = 10.0) -> tuple[subprocess.Popen[bytes], str]:
    """Start a redis-server on 127.0.0.1 (free port) with its AOF in ``tmpdir``; waits for PING.

    Args:
        tmpdir: its working directory (``redis.log`` and the AOF go there).
        fsync: the ``appendfsync`` policy (``always`` or ``everysec``).
        timeout: how long to wait for the first PONG, per attempt.

    Returns:
        ``(process, url)``; stop the process with :func:`stop_redis` when done.

    Raises:
        FileNotFoundError: no ``redis-server`` binary.
        RuntimeError: it did not start (see ``tmpdir/redis.log``).
    """
    binary = redis_binary()
    if binary is None:
        raise FileNotFoundError("redis-server is not installed (apt-get install -y redis-server)")
    directory = Path(tmpdir)
    directory.mkdir(parents=True, exist_ok=True)
    for _attempt in range(5):
        port = _free_port()
        argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
                "--appendonly", "yes", "--appendfsync", fsync, "--save", "", "--daemonize", "no",
                "--logfile", str(directory / "redis.log")]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break  # the port was taken meanwhile: try another one
            if _ping(port):
                return proc, f"redis://127.0.0.1:{port}/0"
            time.sleep(0.02)
        stop_redis(proc)
    raise RuntimeError(f"redis-server did not start; see {directory / 'redis.log'}")
