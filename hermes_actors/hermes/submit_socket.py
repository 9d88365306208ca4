"""The submit endpoint's Unix socket: the ownership checks both ends make, and the framing.

The ``run`` directory is reached from the root without following a symlink at any
step (``bot_relay/`` swapped for one would lead to another root's host) and must be ours;
a peer's uid is read with SO_PEERCRED; the socket is reached through ``/proc/self/fd`` of the
checked directory (by its path only where ``/proc`` is missing). A request is one line of JSON.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import struct
import time
from pathlib import Path

from hermes_actors.hermes.submit_protocol import MAX_REQUEST_BYTES, RUN_DIR
from hermes_actors.store.hermes_root import root_path
from hermes_actors.store.relay_dirfd import open_dir_below

__all__ = [
    "RECV_CHUNK", "HostLost", "HostOffline", "UnreadableAnswer", "address_choice", "open_dir", "open_run_dir",
    "peer_cred", "read_request", "recv_by", "socket_address", "timeout_by",
]

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_SUN_PATH_MAX = 100  # sun_path is 108 bytes on Linux; keep a margin
_PROC_FD = "/proc/self/fd"
RECV_CHUNK = 64 * 1024


class HostOffline(ConnectionError):
    """Nothing serves the submit endpoint of a root (no socket, a stale one, or a host that is stopping).

    The request was not taken: it is safe to send it elsewhere (or to run it in-process).
    """


class HostLost(ConnectionError):
    """The host took the connection, then closed it without answering (it died or was killed mid-request).

    Whether it acted on the request is unknown: a DM may or may not have been queued, so it
    must not be sent again blindly (and never run in-process instead).
    """


class UnreadableAnswer(ValueError):
    """The host took the request and answered something else than an answer: not JSON, not a JSON object, too large.

    As with :class:`HostLost`, whether it acted on the request is unknown: a DM may have been queued, so it must not
    be sent again blindly, and it is never a usage error (a ``ValueError`` a command raises before it acts is one).
    """


def peer_cred(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a connected Unix socket."""
    pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid


def socket_address(dir_fd: int, path: Path) -> str:
    """A bindable/connectable address for ``path`` whose directory is open as ``dir_fd`` (:func:`address_choice`).

    Through ``/proc/self/fd/<dir_fd>/<name>`` whenever ``/proc`` is there: the directory reached is the one that
    was checked (:func:`open_run_dir`), whatever its path leads to by now. Before, a short path was connected by
    its path: a ``run/`` swapped between the checked walk and the connect redirected the connection to whatever
    listened in the new one.

    Args:
        dir_fd: the checked directory, open.
        path: the socket's path (its name is looked up in ``dir_fd``).

    Returns:
        The address to bind or connect.
    """
    via_fd = f"{_PROC_FD}/{dir_fd}/{path.name}"
    return address_choice(str(path), via_fd, proc=os.path.isdir(f"{_PROC_FD}/{dir_fd}"))


def address_choice(path: str, via_fd: str, *, proc: bool) -> str:
    """Pure: the socket address to use, the checked directory's descriptor first.

    Args:
        path: the socket's path.
        via_fd: the same socket through ``/proc/self/fd`` of its checked directory.
        proc: whether ``/proc/self/fd`` leads to that directory (no ``/proc``: a container without it).

    Returns:
        ``via_fd`` when ``/proc`` is there and it fits ``sun_path``; else ``path`` when it fits; else ``via_fd``
        (too long a path is reachable through ``/proc`` only: without it, the connect finds nothing listens).
    """
    if proc and _fits(via_fd):
        return via_fd
    return path if _fits(path) else via_fd


def _fits(address: str) -> bool:
    """Pure: whether ``address`` fits ``sun_path`` (with a margin)."""
    return len(os.fsencode(address)) < _SUN_PATH_MAX


def open_dir(directory: Path, *, parent_fd: int | None = None) -> int:
    """Open a directory without following a symlink; check it is ours.

    Args:
        directory: the directory.
        parent_fd: its parent, already open and checked: ``directory``'s name is opened relative to it
            (nothing above it is looked up by path again). None: ``directory`` is opened by its path.

    Raises:
        FileNotFoundError / NotADirectoryError: it does not exist.
        PermissionError: a symlink, or another uid's.
    """
    name = directory if parent_fd is None else directory.name
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    except OSError as exc:
        # O_NOFOLLOW|O_DIRECTORY on a symlink fails with ELOOP or ENOTDIR, depending on the kernel
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and _is_link(name, parent_fd)):
            raise PermissionError(f"refusing {directory}: it is a symlink") from None
        raise
    st = os.fstat(fd)
    if st.st_uid != os.getuid():
        os.close(fd)
        raise PermissionError(f"refusing {directory}: owned by uid {st.st_uid}, expected {os.getuid()}")
    return fd


def _is_link(name: str | Path, parent_fd: int | None) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=parent_fd).st_mode)
    except OSError:
        return False


def open_run_dir(root: str | Path) -> int:
    """Open the run directory of ``root`` (``bot_relay/run``): the one rule both ends of the endpoint follow.

    ``bot_relay/`` is reached from the root as every relay directory is
    (:func:`~hermes_actors.store.relay_dirfd.open_dir_below`: never followed, ours), and ``run/``
    is opened relative to it by :func:`open_dir`. A ``bot_relay/`` swapped for a symlink would
    otherwise lead a client to another root's host, which would take the DMs meant for this one.

    Args:
        root: the Hermes root (trusted as named, ``~`` expanded).

    Returns:
        The run directory's descriptor (the caller closes it).

    Raises:
        HostileFileError: ``bot_relay/`` is a symlink, not a directory, or another uid's (the text names it).
        FileNotFoundError / NotADirectoryError: ``bot_relay/`` or ``run/`` does not exist (or ``run/`` is a file).
        PermissionError: ``run/`` is a symlink or another uid's (no errno), or a directory on the way may not be
            entered (errno EACCES, naming ``run/``'s path).
    """
    run_dir = root_path(root).joinpath(*RUN_DIR)
    try:
        relay_fd = open_dir_below(root_path(root), run_dir.parent)
    except OSError as exc:  # raised for the step's bare name: say the path, as opening run/ by its path would
        if exc.errno is None:
            raise
        raise type(exc)(exc.errno, exc.strerror, os.fspath(run_dir)) from None
    try:
        return open_dir(run_dir, parent_fd=relay_fd)
    finally:
        os.close(relay_fd)


def recv_by(conn: socket.socket, deadline: float) -> bytes:
    """One ``recv`` of at most RECV_CHUNK bytes that returns by ``deadline`` at the latest.

    A timeout set once on the socket would apply to each ``recv`` afresh: a client sending
    a byte now and then would keep the connection (and a server slot) for as long as it likes.

    Args:
        conn: a connected socket (left with a timeout set).
        deadline: a ``time.monotonic()`` time.

    Returns:
        The bytes received (empty: the peer closed its end).

    Raises:
        TimeoutError: the deadline passed before anything arrived.
        OSError: the connection failed.
    """
    timeout_by(conn, deadline)
    return conn.recv(RECV_CHUNK)


def timeout_by(conn: socket.socket, deadline: float, at_most: float | None = None) -> None:
    """Set ``conn``'s timeout to what is left until ``deadline``: its next read (or write) returns by then.

    Args:
        conn: a connected socket.
        deadline: a ``time.monotonic()`` time.
        at_most: a timeout it never exceeds (None: what is left, however long).

    Raises:
        TimeoutError: the deadline passed.
    """
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline passed")
    conn.settimeout(left if at_most is None else min(left, at_most))


def read_request(conn: socket.socket, deadline: float) -> bytes:
    """Bytes up to the first newline (or EOF), at most MAX_REQUEST_BYTES, all received by ``deadline``.

    Args:
        conn: the client's connection.
        deadline: the ``time.monotonic()`` time by which the whole request must have arrived.

    Returns:
        The request line, without its newline.

    Raises:
        ValueError: the request is larger than the cap.
        TimeoutError: the request was not complete by the deadline (however often the client sent a little).
    """
    buf = bytearray()
    while True:
        chunk = recv_by(conn, deadline)
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
