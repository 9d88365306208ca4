"""The local submit endpoint: a Unix socket through which other processes hand DMs to the host.

Whatever process hosts the actors of a root (``hermes-actors serve``, or the
hermes gateway through our plugin) serves ``<root>/bot_relay/run/submit.sock``;
a bot's ``message_agent`` call, made inside its own ``hermes`` process, and
``hermes-actors send`` submit there and get the ack or refusal at once.

Safety: the ``run`` directory is 0700 and ours (a symlink is refused), the socket
0600; the server answers only peers of its own uid (SO_PEERCRED) and the client
talks only to a server of its own uid. ``submit.lock`` (flock) is held for the
server's life, so a socket file found by the lock holder is stale and replaced; the
holder writes its pid into it, so anything there but a regular file of ours with one
name (a symlink, a hard link, a FIFO) is refused, as a foreign file at the socket path is.

Threads (of :class:`SubmitServer`): one accept thread, plus one short-lived thread
per open connection (at most ``max_connections``; beyond that a client is told
the host is busy). Nothing else runs in the background. An ``accept()`` that fails
(out of descriptors, a client gone first) is retried after a bounded back-off
(:mod:`hermes_actors.core.accept_retry`): only the server's own stop, or a listening
socket that is itself unusable, ends the accept thread.

Wire format and texts: :mod:`hermes_actors.hermes.submit_protocol`; the socket checks both ends
make: :mod:`hermes_actors.hermes.submit_socket`; the host lock: :mod:`hermes_actors.hermes.submit_lock`;
what a request is answered with: :mod:`hermes_actors.hermes.submit_handlers`; the client
(re-exported here): :mod:`hermes_actors.hermes.submit_client`.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import select
import socket
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from loguru import logger

from hermes_actors.core.accept_retry import accept_backoff, accept_retries
from hermes_actors.core.reasons import RUNTIME_OFFLINE, UNKNOWN
from hermes_actors.core.spell import Spell
from hermes_actors.errors import HostileFileError
from hermes_actors.hermes.submit_client import (
    HostLost,
    HostOffline,
    fetch_outcome,
    fetch_roster,
    fetch_status,
    ping,
    request,
    submit_dm,
)
from hermes_actors.hermes.submit_handlers import OutcomeFn, RoomFn, RosterFn, SendFn, StatusFn, SubmitHandlers
from hermes_actors.hermes.submit_lock import take_host_lock
from hermes_actors.hermes.submit_protocol import (
    LOCK_NAME,
    MAX_REQUEST_BYTES,
    SOCKET_NAME,
    STOPPING_OP,
    bad_request,
    encode,
    socket_path,
)
from hermes_actors.hermes.submit_socket import (
    RECV_CHUNK,
    open_run_dir,
    peer_cred,
    read_request,
    recv_by,
    socket_address,
)
from hermes_actors.store.os_errors import store_error
from hermes_actors.store.private_dir import ensure_private_dir

__all__ = [
    "HostLost",
    "HostOffline",
    "SubmitServer",
    "fetch_outcome",
    "fetch_roster",
    "fetch_status",
    "ping",
    "request",
    "submit_dm",
]


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
        read_timeout: seconds a client has to send its whole request (a deadline, not a pause
            between two reads: a client trickling bytes is cut off), and again to take the answer.
        info: extra keys for the ``ping`` answer.
        live_info: returns more keys for the ``ping`` answer, asked at each ping.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        send: SendFn,
        outcome: OutcomeFn | None = None,
        status: StatusFn | None = None,
        roster: RosterFn | None = None,
        room: RoomFn | None = None,
        allowed_uid: int | None = None,
        max_connections: int = 32,
        read_timeout: float = 5.0,
        info: dict[str, Any] | None = None,
        live_info: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.root = Path(root).expanduser()
        self.path = socket_path(self.root)
        self._calls = SubmitHandlers(root=self.root, send=send, outcome=outcome, status=status, roster=roster,
                                     room=room, info=dict(info or {}), live_info=live_info)
        self.allowed_uid = os.getuid() if allowed_uid is None else allowed_uid
        self.read_timeout = read_timeout
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
            HostileFileError: ``bot_relay``/``run`` is a symlink or another uid's, something
                that is not our socket sits at the socket path, or something that is not a lock
                file of ours (a regular file with one name) at ``submit.lock``.
            StoreError: the run directory, ``submit.lock`` or the socket could not be made (a full or
                read-only disk): the text names the file in full and what to do.
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
        run_dir = self.path.parent
        ensure_private_dir(run_dir, within=self.root)  # bot_relay/ and run/, neither through a swapped symlink
        self._dir_fd = open_run_dir(self.root)  # as a client opens it: bot_relay/ and run/ never followed
        if stat.S_IMODE(os.fstat(self._dir_fd).st_mode) & 0o077:
            try:
                os.fchmod(self._dir_fd, 0o700)  # ours (checked); nobody else may even look up the socket
            except OSError as exc:  # an error on a descriptor names no file: name it (a read-only disk)
                raise store_error("chmod 0700", run_dir, exc) from exc
        self._lock_fd = take_host_lock(self._dir_fd, run_dir / LOCK_NAME, self.root)
        try:
            self._bind_socket()
        except HostileFileError:
            raise
        except OSError as exc:  # named relative to the directory (or not at all): name the socket in full
            raise store_error("create the socket", self.path, exc) from exc

    def _bind_socket(self) -> None:
        """Replace a stale socket of ours, bind ours (0600) and listen: we hold the host lock."""
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
        sock.bind(socket_address(self._dir_fd, self.path))
        os.chmod(SOCKET_NAME, 0o600, dir_fd=self._dir_fd)
        self._sock_ino = os.lstat(SOCKET_NAME, dir_fd=self._dir_fd).st_ino
        sock.listen(64)
        sock.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()

    def stop_accepting(self, timeout: float = 5.0) -> None:
        """Stop accepting, remove the socket, wait up to ``timeout`` for open connections. Idempotent.

        ``submit.lock`` stays held until :meth:`close`: a host that is stopping (its turns
        finishing) is still the root's host, and ``hermes-actors send`` waits for it to be gone
        (:func:`~hermes_actors.hermes.submit_client.lock_holder`) rather than run a DM of its own
        beside it.
        """
        with self._state_lock:
            if self._state != "running":
                return
            self._state = "closing"
        # The name goes first: from now on a client finds no socket (HostOffline, "not taken") instead of
        # landing in the backlog after it was answered, to be reset when the listener closes (HostLost).
        self._unlink_socket()
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")
        if self._accept_thread is not None:
            self._accept_thread.join(timeout)
        self._release_socket()
        with self._handlers_lock:
            handlers = list(self._handlers)
        for thread in handlers:
            thread.join(timeout)
        if any(t.is_alive() for t in handlers):
            logger.warning("submit endpoint closed with {} connection(s) still being answered", len(handlers))
        logger.info("submit endpoint closed: {}", self.path)

    def close(self, timeout: float = 5.0) -> None:
        """:meth:`stop_accepting`, then release ``submit.lock``: this process no longer hosts the root. Idempotent."""
        self.stop_accepting(timeout)
        with self._state_lock:
            self._release()
            self._state = "closed"

    def _release(self) -> None:
        self._release_socket()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # drops the flock
            self._lock_fd = -1
        if self._dir_fd >= 0:
            os.close(self._dir_fd)
            self._dir_fd = -1

    def _unlink_socket(self) -> None:
        if self._sock is not None and self._sock_ino:
            with contextlib.suppress(OSError):
                if os.lstat(SOCKET_NAME, dir_fd=self._dir_fd).st_ino == self._sock_ino:
                    os.unlink(SOCKET_NAME, dir_fd=self._dir_fd)  # only the socket we bound
            self._sock_ino = 0

    def _release_socket(self) -> None:
        if self._sock is not None:
            self._unlink_socket()
            self._sock.close()
            self._sock = None
        for end in (self._wake_r, self._wake_w):
            if end is not None:
                end.close()
        self._wake_r = self._wake_w = None

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
        spell = Spell()  # accepts failing in a row (out of descriptors...): said once, and once when they pass
        while True:
            try:
                ready = _readable([sock, wake], None)
            except (OSError, ValueError):  # a socket closed under the wait: the stop is under way
                return
            if wake.fileno() in ready:
                self._turn_away_backlog(sock)
                return
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):  # that client went away first
                continue
            except OSError as exc:
                if not accept_retries(exc.errno):  # the listening socket itself is unusable
                    logger.error("submit endpoint stopped accepting: {}", exc)
                    return
                spell, say = spell.failed()
                if say:
                    logger.warning("submit endpoint cannot accept connections ({}); retrying until it can", exc)
                # the waiting connection keeps the socket readable: wait before the retry, or it would spin
                if self._wait_for_stop(wake, accept_backoff(spell.failures)):
                    self._turn_away_backlog(sock)
                    return
                continue
            spell, ended = spell.landed()
            if ended:
                logger.info("submit endpoint accepting connections again (after {} failed accepts)", ended)
            conn.setblocking(True)
            if not self._slots.acquire(blocking=False):
                self._refuse_busy(conn)
                continue
            thread = threading.Thread(target=self._serve_one, args=(conn,), name="submit-conn", daemon=True)
            with self._handlers_lock:
                self._handlers.add(thread)
            try:
                thread.start()
            except RuntimeError as exc:  # "can't start new thread": the system is out of threads for now
                with self._handlers_lock:
                    self._handlers.discard(thread)
                self._slots.release()
                logger.warning("submit endpoint could not start a thread for a connection ({}); it was answered "
                               "busy", exc)
                self._refuse_busy(conn)

    @staticmethod
    def _wait_for_stop(wake: socket.socket, seconds: float) -> bool:
        """Wait up to ``seconds`` for the stop's wake-up; whether it came (or the wait could not be made)."""
        try:
            return bool(_readable([wake], seconds))
        except (OSError, ValueError):  # the wake-up socket closed: the stop is under way
            return True

    def _serve_one(self, conn: socket.socket) -> None:
        try:
            deadline = time.monotonic() + self.read_timeout
            pid, uid = peer_cred(conn)
            try:
                # read even a refused request: closing on unread data resets the answer
                raw = read_request(conn, deadline)
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
            self._answer(conn, self._calls.answer(raw))
        except OSError as exc:
            logger.debug("submit connection dropped: {}", exc)
        finally:
            conn.close()
            self.served += 1
            self._slots.release()
            with self._handlers_lock:
                self._handlers.discard(threading.current_thread())

    def _answer(self, conn: socket.socket, answer: dict[str, Any]) -> None:
        """Send ``answer``, then drain what the client still sends (so close() is no reset), within read_timeout.

        The whole of it is bounded: a client that neither reads nor stops sending is cut off.
        """
        deadline = time.monotonic() + self.read_timeout
        with contextlib.suppress(OSError):  # TimeoutError included: the deadline passed
            conn.settimeout(self.read_timeout)
            conn.sendall(encode(answer))  # the timeout bounds the whole sendall, not each send
            conn.shutdown(socket.SHUT_WR)
            while len(recv_by(conn, deadline)) > 0:
                pass

    def _refuse_busy(self, conn: socket.socket) -> None:
        """Answer "busy" from the accept thread without ever blocking it."""
        self._answer_unread(conn, {"error": "the Bot Mode host is busy; try again in a moment", "reason": UNKNOWN})

    def _turn_away_backlog(self, sock: socket.socket) -> None:
        """Answer every connection still waiting to be accepted that this host is stopping.

        Closing the listening socket would reset them, and a client cannot tell that reset from a
        host that died after taking its DM (:class:`HostLost`: "do not resend"). Their requests
        were never read; told so, the client may send elsewhere. The socket's name is removed
        before this (:meth:`stop_accepting`): only a connect that found the name just before
        and queues just after the backlog was emptied still gets the reset.
        """
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:  # BlockingIOError: the backlog is empty
                return
            self._answer_unread(conn, {"op": STOPPING_OP, "error": "the Bot Mode host is stopping; the request was "
                                       "not taken", "reason": RUNTIME_OFFLINE})

    @staticmethod
    def _answer_unread(conn: socket.socket, answer: dict[str, Any]) -> None:
        """Answer ``conn`` from the accept thread without ever blocking it (its request is not acted on)."""
        conn.setblocking(False)
        with contextlib.suppress(OSError):
            while len(conn.recv(MAX_REQUEST_BYTES + RECV_CHUNK)) > 0:
                pass
        with contextlib.suppress(OSError):
            conn.send(encode(answer))
            conn.shutdown(socket.SHUT_WR)
        conn.close()


def _readable(socks: list[socket.socket], seconds: float | None) -> set[int]:
    """The descriptors of ``socks`` readable within ``seconds`` (None: wait until one is), by ``poll``.

    Not ``select()``: it refuses a descriptor numbered 1024 or more, which a gateway embedded in a
    process holding many files gets (the accept loop then ended without a word).

    Raises:
        OSError, ValueError: a socket was closed (its descriptor is -1 or no longer valid).
    """
    poller = select.poll()
    for sock in socks:
        poller.register(sock.fileno(), select.POLLIN)
    timeout_ms = None if seconds is None else max(0, math.ceil(seconds * 1000))
    ready = poller.poll(timeout_ms)
    if any(events & select.POLLNVAL for _, events in ready):  # closed during the wait: as select() would say
        raise OSError(errno.EBADF, "a socket was closed while it was waited on")
    return {fd for fd, _ in ready}
