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

A client reaches the host only through the path: a ``run/`` swapped for a symlink (or
removed, or replaced) while the host runs leaves its socket where no client finds it. So the
accept thread looks at the path every ``check_seconds`` (the gateway's rescan) and, when it
no longer leads to the socket it bound (:func:`endpoint_fault`), says so (WARNING), moves a
swapped ``run/`` into ``quarantine/`` as the relay's rescan moves its directories, makes
``run/`` again, takes the host lock there and binds the socket again.

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
from hermes_actors.relay.strays import move_swapped_aside
from hermes_actors.store.os_errors import resource_failure, store_error
from hermes_actors.store.private_dir import ensure_private_dir
from hermes_actors.store.relay_dirfd import open_dir_below
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.store.relay_quarantine import quarantine

__all__ = [
    "HostLost",
    "HostOffline",
    "SubmitServer",
    "endpoint_fault",
    "fetch_outcome",
    "fetch_roster",
    "fetch_status",
    "ping",
    "request",
    "submit_dm",
]


# what endpoint_fault finds: the run directory at its path is not the one the socket is in, or the socket is gone
RUN_GONE = "its directory is gone"
RUN_SWAPPED = "its directory was replaced by a symlink or a file"
RUN_REPLACED = "its directory was replaced by another directory"
SOCKET_GONE = "the socket file is gone"
SOCKET_REPLACED = "the socket file was replaced"
_RUN_FAULTS = (RUN_GONE, RUN_SWAPPED, RUN_REPLACED)


def endpoint_fault(run_entry: os.stat_result | None, held_dir: os.stat_result, socket_entry: os.stat_result | None,
                   bound_ino: int) -> str | None:
    """Pure: why a client no longer reaches the socket this host bound, or None when it does.

    Args:
        run_entry: ``lstat`` of ``bot_relay/run`` as it is now (None: missing).
        held_dir: ``fstat`` of the run directory the host opened and bound its socket in.
        socket_entry: ``lstat`` of ``submit.sock`` in that directory (None: missing).
        bound_ino: the inode of the socket the host bound.

    Returns:
        :data:`RUN_GONE`, :data:`RUN_SWAPPED` (a symlink or anything but a directory), :data:`RUN_REPLACED`
        (another directory at the path), :data:`SOCKET_GONE` or :data:`SOCKET_REPLACED`; None when the path
        leads to the bound socket.
    """
    if run_entry is None:
        return RUN_GONE
    if not stat.S_ISDIR(run_entry.st_mode):
        return RUN_SWAPPED
    if (run_entry.st_dev, run_entry.st_ino) != (held_dir.st_dev, held_dir.st_ino):
        return RUN_REPLACED
    if socket_entry is None:
        return SOCKET_GONE
    if not stat.S_ISSOCK(socket_entry.st_mode) or socket_entry.st_ino != bound_ino:
        return SOCKET_REPLACED
    return None


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
        check_seconds: how often the accept thread checks that the socket's path still leads to the socket
            it bound, and binds it again when not (the gateway's ``bot_mode.rescan_seconds``); None: never.
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
        check_seconds: float | None = None,
    ) -> None:
        self.root = Path(root).expanduser()
        self.path = socket_path(self.root)
        self._calls = SubmitHandlers(root=self.root, send=send, outcome=outcome, status=status, roster=roster,
                                     room=room, info=dict(info or {}), live_info=live_info)
        self.allowed_uid = os.getuid() if allowed_uid is None else allowed_uid
        self.read_timeout = read_timeout
        self.check_seconds = check_seconds
        self._check_spell = Spell()  # checks in a row that found the endpoint unreachable: said once, and its end
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
        self._dir_fd, self._lock_fd = self._open_run_dir()
        self._sock, self._sock_ino = self._bind_socket(self._dir_fd)
        self._wake_r, self._wake_w = socket.socketpair()

    def _open_run_dir(self) -> tuple[int, int]:
        """Make (0700) and open the run directory, take the host lock in it: (its descriptor, the lock's).

        Raises:
            As :meth:`start` (nothing is left open).
        """
        run_dir = self.path.parent
        ensure_private_dir(run_dir, within=self.root)  # bot_relay/ and run/, neither through a swapped symlink
        dir_fd = open_run_dir(self.root)  # as a client opens it: bot_relay/ and run/ never followed
        try:
            if stat.S_IMODE(os.fstat(dir_fd).st_mode) & 0o077:
                try:
                    os.fchmod(dir_fd, 0o700)  # ours (checked); nobody else may even look up the socket
                except OSError as exc:  # an error on a descriptor names no file: name it (a read-only disk)
                    raise store_error("chmod 0700", run_dir, exc) from exc
            return dir_fd, take_host_lock(dir_fd, run_dir / LOCK_NAME, self.root)
        except BaseException:
            os.close(dir_fd)
            raise

    def _bind_socket(self, dir_fd: int) -> tuple[socket.socket, int]:
        """Replace a stale socket of ours, bind ours (0600) in ``dir_fd`` and listen: we hold the host lock.

        Returns:
            The listening socket and the inode of its file.

        Raises:
            HostileFileError: something that is not a socket of ours sits at the socket's name.
            StoreError: the socket could not be made (the text names it in full).
        """
        try:
            try:
                st = os.lstat(SOCKET_NAME, dir_fd=dir_fd)
            except FileNotFoundError:
                pass
            else:
                if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
                    raise HostileFileError(
                        f"refusing to replace {self.path}: it is not a socket of ours; remove it by hand"
                    )
                os.unlink(SOCKET_NAME, dir_fd=dir_fd)  # we hold the lock: whoever bound it is gone
                logger.info("replaced the stale submit socket {}", self.path)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                sock.bind(socket_address(dir_fd, self.path))
                os.chmod(SOCKET_NAME, 0o600, dir_fd=dir_fd)
                ino = os.lstat(SOCKET_NAME, dir_fd=dir_fd).st_ino
                sock.listen(64)
                sock.setblocking(False)
            except BaseException:
                sock.close()
                raise
        except OSError as exc:  # named relative to the directory (or not at all): name the socket in full
            raise store_error("create the socket", self.path, exc) from exc
        return sock, ino

    # ── the endpoint's path, checked every check_seconds ────────────────────

    def _check_endpoint(self, sock: socket.socket) -> socket.socket:
        """On the accept thread: bind the endpoint again when its path no longer leads to ``sock``.

        Said once while it lasts (a WARNING naming what was found, an ERROR when it cannot be bound again,
        retried at each check), and once when it serves again.

        Args:
            sock: the socket the accept thread listens on.

        Returns:
            The socket to listen on from now on (``sock`` when nothing changed).
        """
        with self._state_lock:
            if self._state != "running" or self._sock is not sock:
                return sock
            fault = self._fault()
            if fault is None:
                return sock
            self._check_spell, say = self._check_spell.failed()
            if say:
                logger.warning("submit endpoint {}: {}, so no client reaches this host; binding it again",
                               self.path, fault)
            try:
                self._serve_again(fault)
            except (OSError, RuntimeError, ValueError) as exc:  # StoreError; HostileFileError; another host
                self._said_cannot_bind(exc, say)
                return sock
            self._check_spell, _ = self._check_spell.landed()
            logger.info("submit endpoint serving {} again", self.path)
            assert self._sock is not None
            return self._sock

    @staticmethod
    def _said_cannot_bind(exc: BaseException, first: bool) -> None:
        if first:
            logger.error("submit endpoint: could not bind it again: {}; clients find no host on this root until it "
                         "can be (tried again at each rescan)", exc)
        else:
            logger.debug("submit endpoint: could not bind it again: {}", exc)

    def _fault(self) -> str | None:
        """What :func:`endpoint_fault` finds now; None too when the path cannot be looked at for a transient reason.

        ``bot_relay/`` itself swapped or another user's is a fault (:data:`RUN_SWAPPED`): binding again then
        fails, and says why.
        """
        run_dir = self.path.parent
        try:
            parent = open_dir_below(self.root, run_dir.parent)
        except FileNotFoundError:
            return RUN_GONE
        except HostileFileError:
            return RUN_SWAPPED
        except OSError as exc:
            if not resource_failure(exc):
                logger.debug("submit endpoint: {} could not be looked at: {}", run_dir.parent, exc)
            return None  # out of descriptors: no sign that anything moved; the next check looks again
        try:
            run_entry = _lstat_or_none(run_dir.name, parent)
        finally:
            os.close(parent)
        return endpoint_fault(run_entry, os.fstat(self._dir_fd), _lstat_or_none(SOCKET_NAME, self._dir_fd),
                              self._sock_ino)

    def _serve_again(self, fault: str) -> None:
        """Bind the endpoint again (under the state lock, while running): in a new run directory for a fault of
        the directory, else in the one held; then let the old socket go.

        Raises:
            RuntimeError: another process took the host lock of the new run directory.
            HostileFileError: ``bot_relay/`` is swapped or another user's, or the socket's name is taken.
            StoreError: a directory, the lock or the socket could not be made.
        """
        run_dir = self.path.parent
        if fault in _RUN_FAULTS:
            if fault == RUN_SWAPPED:
                move_swapped_aside(InboxPaths.from_root(self.root), run_dir)  # the relay's rule; never raises
            dir_fd, lock_fd = self._open_run_dir()
        else:
            dir_fd, lock_fd = self._dir_fd, self._lock_fd
            if fault == SOCKET_REPLACED:  # not ours to serve on, ours to move aside (never followed)
                quarantine(InboxPaths.from_root(self.root).relay, self.path, "not the host's submit socket")
        try:
            sock, ino = self._bind_socket(dir_fd)
        except BaseException:
            if dir_fd != self._dir_fd:
                os.close(lock_fd)
                os.close(dir_fd)
            raise
        old_sock, old_dir_fd, old_lock_fd = self._sock, self._dir_fd, self._lock_fd
        if old_sock is not None:
            self._turn_away_backlog(old_sock, {"error": "the Bot Mode host is binding its submit endpoint again; "
                                               "try again in a moment", "reason": RUNTIME_OFFLINE})
            self._unlink_socket()  # only the socket we bound, where it is now
            old_sock.close()
        if dir_fd != old_dir_fd:
            os.close(old_lock_fd)
            os.close(old_dir_fd)
        self._dir_fd, self._lock_fd, self._sock, self._sock_ino = dir_fd, lock_fd, sock, ino

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
                ready = _readable([sock, wake], self.check_seconds)
            except (OSError, ValueError):  # a socket closed under the wait: the stop is under way
                return
            if wake.fileno() in ready:
                self._turn_away_backlog(sock)
                return
            if not ready:  # check_seconds passed: does the path still lead here?
                sock = self._check_endpoint(sock)
                continue
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

    def _turn_away_backlog(self, sock: socket.socket, answer: dict[str, Any] | None = None) -> None:
        """Answer every connection still waiting to be accepted that this host is stopping (or ``answer``).

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
            self._answer_unread(conn, answer or {"op": STOPPING_OP, "error": "the Bot Mode host is stopping; the "
                                                 "request was not taken", "reason": RUNTIME_OFFLINE})

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


def _lstat_or_none(name: str, dir_fd: int) -> os.stat_result | None:
    """``lstat`` of ``name`` in the open directory ``dir_fd`` (never followed), None when it is not there."""
    try:
        return os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return None


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
