"""The local submit endpoint: a Unix socket through which other processes hand DMs to the host.

Whatever process hosts the actors of a root (``hermes-actors serve``, or the
hermes gateway through our plugin) serves ``<root>/bot_relay/run/submit.sock``;
a bot's ``message_agent`` call, made inside its own ``hermes`` process, and
``hermes-actors send`` submit there and get the ack or refusal at once.

Safety: the ``run`` directory is 0700 and ours (a symlink is refused), the socket
0600; the server answers only peers of its own uid (SO_PEERCRED) and the client
talks only to a server of its own uid. ``submit.lock`` (flock) is held for the
server's life, so a socket file found by the lock holder is stale and replaced.

Threads (of :class:`SubmitServer`): one accept thread, plus one short-lived thread
per open connection (at most ``max_connections``; beyond that a client is told
the host is busy). Nothing else runs in the background.

Wire format and texts: :mod:`hermes_actors.hermes.submit_protocol`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import socket
import stat
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson
from loguru import logger

from hermes_actors.core.reasons import UNKNOWN
from hermes_actors.hermes.submit_protocol import (
    LOCK_NAME,
    MAX_REQUEST_BYTES,
    SOCKET_NAME,
    OutcomeCall,
    Ping,
    RoomCall,
    RosterCall,
    SendCall,
    StatusCall,
    bad_request,
    encode,
    offline_refusal,
    parse_request,
    socket_path,
)
from hermes_actors.store.atomic import ensure_private_dir

__all__ = [
    "HostOffline",
    "SubmitServer",
    "fetch_outcome",
    "fetch_roster",
    "fetch_status",
    "ping",
    "request",
    "submit_dm",
]

SendFn = Callable[[SendCall], dict[str, Any]]
OutcomeFn = Callable[[OutcomeCall], dict[str, Any]]
StatusFn = Callable[[], dict[str, Any]]
RoomFn = Callable[[RoomCall], dict[str, Any]]

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_SUN_PATH_MAX = 100  # sun_path is 108 bytes on Linux; keep a margin
_RECV_CHUNK = 64 * 1024


class HostOffline(ConnectionError):
    """Nothing serves the submit endpoint of a root (no socket, or a stale one)."""


def _peer_cred(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a connected Unix socket."""
    pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid


def _address(dir_fd: int, path: Path) -> str:
    """A bindable/connectable address for ``path`` whose directory is open as ``dir_fd``.

    Long paths (pytest's tmp dirs, deep homes) exceed ``sun_path``; going through
    ``/proc/self/fd`` also pins the directory we checked, whatever its path does later.
    """
    if len(os.fsencode(path)) < _SUN_PATH_MAX:
        return str(path)
    return f"/proc/self/fd/{dir_fd}/{path.name}"


def _open_dir(directory: Path) -> int:
    """Open a directory without following a symlink; check it is ours.

    Raises:
        FileNotFoundError / NotADirectoryError: it does not exist.
        PermissionError: a symlink, or another uid's.
    """
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        # O_NOFOLLOW|O_DIRECTORY on a symlink fails with ELOOP or ENOTDIR, depending on the kernel
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and os.path.islink(directory)):
            raise PermissionError(f"refusing {directory}: it is a symlink") from None
        raise
    st = os.fstat(fd)
    if st.st_uid != os.getuid():
        os.close(fd)
        raise PermissionError(f"refusing {directory}: owned by uid {st.st_uid}, expected {os.getuid()}")
    return fd


def _read_request(conn: socket.socket) -> bytes:
    """Bytes up to the first newline (or EOF), at most MAX_REQUEST_BYTES.

    Raises:
        ValueError: the request is larger than the cap.
        TimeoutError: the client stopped sending before the end of its request.
    """
    buf = bytearray()
    while True:
        chunk = conn.recv(_RECV_CHUNK)
        if not chunk:
            return bytes(buf)
        end = chunk.find(b"\n")
        if end >= 0:
            buf += chunk[:end]
            if len(buf) > MAX_REQUEST_BYTES:
                raise ValueError(f"the request is larger than {MAX_REQUEST_BYTES} bytes")
            return bytes(buf)
        buf += chunk
        if len(buf) > MAX_REQUEST_BYTES:
            raise ValueError(f"the request is larger than {MAX_REQUEST_BYTES} bytes")


class SubmitServer:
    """Serves the submit endpoint of one root for an explicit lifetime (``start()`` … ``close()``).

    Args:
        root: the Hermes root.
        send: takes a :class:`SendCall`, returns the ack or refusal dict (never raises
            for a refusal; an exception becomes an error answer).
        outcome: takes an :class:`OutcomeCall`, returns the outcome dict or
            ``{"status": "pending" | "unknown", ...}``; None: the op is refused.
        status: returns the host's status dict; None: the op is refused.
        roster: returns the host's roster rows (``Gateway.roster()``); None: the op is refused.
        room: takes a :class:`RoomCall`, returns its answer (:mod:`hermes_actors.rooms.remote`);
            None: the op is refused.
        allowed_uid: the only peer uid served (default: ours).
        max_connections: connections handled at once.
        read_timeout: seconds a client has to send its request.
        info: extra keys for the ``ping`` answer.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        send: SendFn,
        outcome: OutcomeFn | None = None,
        status: StatusFn | None = None,
        roster: Callable[[], list[dict[str, Any]]] | None = None,
        room: RoomFn | None = None,
        allowed_uid: int | None = None,
        max_connections: int = 32,
        read_timeout: float = 5.0,
        info: dict[str, Any] | None = None,
    ) -> None:
        self.root = Path(root).expanduser()
        self.path = socket_path(self.root)
        self._send = send
        self._outcome = outcome
        self._status = status
        self._roster = roster
        self._room = room
        self.allowed_uid = os.getuid() if allowed_uid is None else allowed_uid
        self.read_timeout = read_timeout
        self._info = dict(info or {})
        self._slots = threading.BoundedSemaphore(max_connections)
        self._state_lock = threading.Lock()
        self._state = "new"
        self._dir_fd = -1
        self._lock_fd = -1
        self._sock: socket.socket | None = None
        self._sock_ino = 0
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._handlers: set[threading.Thread] = set()
        self._handlers_lock = threading.Lock()
        self.served = 0  # connections answered (for tests and stats)

    # ── lifetime ────────────────────────────────────────────────────────────

    def start(self) -> SubmitServer:
        """Bind the socket and start the accept thread. Returns self.

        Raises:
            RuntimeError: already started, or another process serves this root.
            HostileFileError: ``bot_relay``/``run`` is a symlink or another uid's,
                or something that is not our socket sits at the socket path.
        """
        with self._state_lock:
            if self._state != "new":
                raise RuntimeError(f"submit server already {self._state}")
            try:
                self._bind()
            except BaseException:
                self._release()
                raise
            self._state = "running"
        self._accept_thread = threading.Thread(target=self._accept_loop, name="submit-accept", daemon=True)
        self._accept_thread.start()
        logger.info("submit endpoint serving {}", self.path)
        return self

    def _bind(self) -> None:
        from hermes_actors.errors import HostileFileError

        run_dir = self.path.parent
        ensure_private_dir(run_dir.parent)
        ensure_private_dir(run_dir)
        self._dir_fd = _open_dir(run_dir)
        if stat.S_IMODE(os.fstat(self._dir_fd).st_mode) & 0o077:
            os.fchmod(self._dir_fd, 0o700)  # ours (checked); nobody else may even look up the socket
        self._lock_fd = os.open(LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                                dir_fd=self._dir_fd)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._lock_fd, 32, 0).decode(errors="replace").strip() or "?"
            raise RuntimeError(
                f"another process (pid {holder}) already hosts the actors of {self.root} "
                f"(its submit endpoint is {self.path}); stop it first"
            ) from None
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, f"{os.getpid()}\n".encode(), 0)
        try:
            st = os.lstat(SOCKET_NAME, dir_fd=self._dir_fd)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
                raise HostileFileError(
                    f"refusing to replace {self.path}: it is not a socket of ours; remove it by hand"
                )
            os.unlink(SOCKET_NAME, dir_fd=self._dir_fd)  # we hold the lock: whoever bound it is gone
            logger.info("replaced the stale submit socket {}", self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._sock = sock
        sock.bind(_address(self._dir_fd, self.path))
        os.chmod(SOCKET_NAME, 0o600, dir_fd=self._dir_fd)
        self._sock_ino = os.lstat(SOCKET_NAME, dir_fd=self._dir_fd).st_ino
        sock.listen(64)
        sock.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting, remove the socket, wait up to ``timeout`` for open connections. Idempotent."""
        with self._state_lock:
            if self._state != "running":
                self._state = "closed"
                return
            self._state = "closing"
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")
        if self._accept_thread is not None:
            self._accept_thread.join(timeout)
        self._release()
        with self._handlers_lock:
            handlers = list(self._handlers)
        for thread in handlers:
            thread.join(timeout)
        if any(t.is_alive() for t in handlers):
            logger.warning("submit endpoint closed with {} connection(s) still being answered", len(handlers))
        with self._state_lock:
            self._state = "closed"
        logger.info("submit endpoint closed: {}", self.path)

    def _release(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                if os.lstat(SOCKET_NAME, dir_fd=self._dir_fd).st_ino == self._sock_ino:
                    os.unlink(SOCKET_NAME, dir_fd=self._dir_fd)  # only the socket we bound
            self._sock.close()
            self._sock = None
        for end in (self._wake_r, self._wake_w):
            if end is not None:
                end.close()
        self._wake_r = self._wake_w = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # drops the flock
            self._lock_fd = -1
        if self._dir_fd >= 0:
            os.close(self._dir_fd)
            self._dir_fd = -1

    def __enter__(self) -> SubmitServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ── serving ─────────────────────────────────────────────────────────────

    def _accept_loop(self) -> None:
        sock, wake = self._sock, self._wake_r
        assert sock is not None and wake is not None
        while True:
            try:
                ready, _, _ = select.select([sock, wake], [], [])
            except (OSError, ValueError):
                return
            if wake in ready:
                return
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue
            except OSError as exc:
                logger.error("submit endpoint stopped accepting: {}", exc)
                return
            conn.setblocking(True)
            if not self._slots.acquire(blocking=False):
                self._refuse_busy(conn)
                continue
            thread = threading.Thread(target=self._serve_one, args=(conn,), name="submit-conn", daemon=True)
            with self._handlers_lock:
                self._handlers.add(thread)
            thread.start()

    def _serve_one(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(self.read_timeout)
            pid, uid = _peer_cred(conn)
            try:
                raw = _read_request(conn)  # read even a refused request: closing on unread data resets the answer
            except ValueError as exc:
                self._answer(conn, bad_request(str(exc)))
                return
            except TimeoutError:
                self._answer(conn, bad_request(f"no complete request within {self.read_timeout:g}s"))
                return
            if uid != self.allowed_uid:
                logger.warning("submit endpoint refused pid {} of uid {}", pid, uid)
                self._answer(conn, bad_request(f"this endpoint serves uid {self.allowed_uid} only, not uid {uid}"))
                return
            self._answer(conn, self._dispatch(raw))
        except OSError as exc:
            logger.debug("submit connection dropped: {}", exc)
        finally:
            conn.close()
            self.served += 1
            self._slots.release()
            with self._handlers_lock:
                self._handlers.discard(threading.current_thread())

    def _dispatch(self, raw: bytes) -> dict[str, Any]:
        call = parse_request(raw)
        if isinstance(call, dict):
            return call
        if isinstance(call, Ping):
            from hermes_actors import __version__

            return {**self._info, "op": "pong", "pid": os.getpid(), "root": str(self.root), "version": __version__}
        try:
            if isinstance(call, SendCall):
                answer = self._send(call)
            elif isinstance(call, StatusCall):
                if self._status is None:
                    return bad_request("this endpoint does not serve 'status'")
                answer = self._status()
            elif isinstance(call, RosterCall):
                if self._roster is None:
                    return bad_request("this endpoint does not serve 'roster'")
                answer = {"rows": self._roster()}
            elif isinstance(call, RoomCall):
                if self._room is None:
                    return bad_request("this endpoint does not serve 'room'")
                answer = self._room(call)
            elif self._outcome is None:
                return bad_request("this endpoint does not serve 'outcome'")
            else:
                answer = self._outcome(call)
        except Exception as exc:  # a handler's failure is the client's answer, never the server's end
            logger.exception("submit handler failed")
            return {"error": f"the Bot Mode host could not take the request ({type(exc).__name__}: {exc}); "
                             "it was not acknowledged", "reason": UNKNOWN}
        if not isinstance(answer, dict):
            return {"error": f"the Bot Mode host answered {type(answer).__name__}, not a dict", "reason": UNKNOWN}
        return answer

    @staticmethod
    def _answer(conn: socket.socket, answer: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(encode(answer))
            conn.shutdown(socket.SHUT_WR)
            with contextlib.suppress(TimeoutError):  # drain what the client still sends, so close() is no reset
                while len(conn.recv(_RECV_CHUNK)) > 0:
                    pass

    def _refuse_busy(self, conn: socket.socket) -> None:
        """Answer "busy" from the accept thread without ever blocking it."""
        conn.setblocking(False)
        with contextlib.suppress(OSError):
            while len(conn.recv(MAX_REQUEST_BYTES + _RECV_CHUNK)) > 0:
                pass
        with contextlib.suppress(OSError):
            conn.send(encode({"error": "the Bot Mode host is busy; try again in a moment", "reason": UNKNOWN}))
            conn.shutdown(socket.SHUT_WR)
        conn.close()


# ── the client ──────────────────────────────────────────────────────────────


def request(root: str | Path, payload: dict[str, Any], *, timeout: float = 10.0) -> dict[str, Any]:
    """Send one request to the host of ``root`` and return its answer.

    Raises:
        HostOffline: nothing listens (no socket, a stale one, no run directory).
        PermissionError: the run directory is a symlink or another uid's, or the
            socket is served by another uid.
        TimeoutError: the host did not answer within ``timeout``.
        ValueError: the answer is not a JSON object.
    """
    path = socket_path(root)
    try:
        dir_fd = _open_dir(path.parent)
    except (FileNotFoundError, NotADirectoryError):
        raise HostOffline(f"no submit endpoint at {path}") from None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(timeout)
            try:
                sock.connect(_address(dir_fd, path))
            except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as exc:
                raise HostOffline(f"nothing listens on {path} ({exc.strerror or exc})") from None
            _pid, uid = _peer_cred(sock)
            if uid != os.getuid():
                raise PermissionError(f"refusing {path}: it is served by uid {uid}, not by us (uid {os.getuid()})")
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the host answered early: read it
                sock.sendall(encode(payload))
                sock.shutdown(socket.SHUT_WR)
            data = bytearray()
            while True:
                chunk = sock.recv(_RECV_CHUNK)
                if not chunk:
                    break
                data += chunk
                if len(data) > 4 * MAX_REQUEST_BYTES:
                    raise ValueError(f"the answer from {path} is larger than {4 * MAX_REQUEST_BYTES} bytes")
    finally:
        os.close(dir_fd)
    if not data:
        raise HostOffline(f"the host on {path} closed the connection without answering (it is stopping)")
    answer = orjson.loads(bytes(data))
    if not isinstance(answer, dict):
        raise ValueError(f"the answer from {path} is not a JSON object")
    return answer


def submit_dm(
    root: str | Path,
    sender: str,
    target: str,
    message: str,
    hop: int = 0,
    timeout: float = 10.0,
    author: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Hand a DM to the host of ``root``; returns its ack or refusal dict, never raises.

    When nothing hosts the actors, the answer is the ``runtime_offline`` refusal
    naming the command to start one — never an ack nobody would process.
    """
    payload: dict[str, Any] = {"op": "send", "sender": sender, "target": target, "message": message, "hop": hop}
    if author:
        payload["author"] = author
    try:
        return request(root, payload, timeout=timeout)
    except HostOffline:
        return offline_refusal(root)
    except TimeoutError:
        return {"error": f"The Bot Mode host on {root} did not answer within {timeout:g}s; the message may or may "
                         "not have been queued — do not resend it blindly.", "reason": UNKNOWN}
    except (PermissionError, ValueError, OSError) as exc:
        return {"error": f"Could not submit the message to the Bot Mode host on {root}: {exc}", "reason": UNKNOWN}


def ping(root: str | Path, timeout: float = 2.0) -> dict[str, Any] | None:
    """The host's ``ping`` answer (pid, root, version), or None when nothing serves ``root``."""
    try:
        return request(root, {"op": "ping"}, timeout=timeout)
    except (HostOffline, TimeoutError, PermissionError, ValueError, OSError):
        return None


def fetch_roster(root: str | Path, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The roster rows of the host serving ``root``.

    Raises:
        HostOffline: nothing serves ``root``.
        TimeoutError: the host did not answer within ``timeout``.
        ValueError: the host answered something else than rows (e.g. an older host without the op).
    """
    answer = request(root, {"op": "roster"}, timeout=timeout)
    rows = answer.get("rows")
    if not isinstance(rows, list):
        raise ValueError(answer.get("error") or f"the host of {root} answered no roster rows")
    return rows


def fetch_outcome(
    root: str | Path, delivery_id: str, wait: float = 0.0, timeout: float | None = None
) -> dict[str, Any]:
    """The outcome of ``delivery_id`` from the host, waiting up to ``wait`` seconds there.

    Returns:
        The outcome dict, or ``{"status": "pending" | "unknown", ...}``.

    Raises:
        HostOffline: nothing serves ``root``.
        TimeoutError: the host did not answer within ``timeout`` (default ``wait`` + 10 s).
    """
    payload = {"op": "outcome", "delivery_id": delivery_id, "wait": wait}
    return request(root, payload, timeout=wait + 10.0 if timeout is None else timeout)


def fetch_status(root: str | Path, timeout: float = 10.0) -> dict[str, Any]:
    """The status of the host serving ``root`` (see :mod:`hermes_actors.ops.status`).

    Raises:
        HostOffline: nothing serves ``root``.
        TimeoutError: the host did not answer within ``timeout``.
        PermissionError: the endpoint is not ours.
        ValueError: the answer is not a JSON object.
    """
    return request(root, {"op": "status"}, timeout=timeout)
