"""The submit endpoint's client: how a bot's ``hermes`` process and ``hermes-actors send`` reach the host.

The client talks only to a server of its own uid (see :mod:`hermes_actors.hermes.submit_socket`).
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Any

import orjson

from hermes_actors.core.clipping import shown
from hermes_actors.core.ids import is_delivery_id
from hermes_actors.core.reasons import UNKNOWN
from hermes_actors.core.shell import shell_command
from hermes_actors.errors import HostileFileError
from hermes_actors.hermes.submit_protocol import (
    LOCK_NAME,
    MAX_ANSWER_BYTES,
    STOPPING_OP,
    encode,
    offline_refusal,
    refused_unknown_field,
    socket_path,
)
from hermes_actors.hermes.submit_socket import (
    RECV_CHUNK,
    HostLost,
    HostOffline,
    UnreadableAnswer,
    open_run_dir,
    peer_cred,
    socket_address,
)

__all__ = [
    "HostLost",
    "HostOffline",
    "UnreadableAnswer",
    "fetch_outcome",
    "fetch_roster",
    "fetch_status",
    "lock_holder",
    "ping",
    "request",
    "send_answer_problem",
    "submit_dm",
]

_PROC_LOCKS = "/proc/locks"


def request(root: str | Path, payload: dict[str, Any], *, timeout: float = 10.0) -> dict[str, Any]:
    """Send one request to the host of ``root`` and return its answer.

    Raises:
        HostOffline: nothing listens (no socket, a stale one, no run directory or a symlink or a file in
            its place: no host serves through one), or the host is stopping and said it did not take the request.
        HostLost: the host took the connection and closed it without answering: it may or may
            not have acted on the request.
        HostileFileError: ``bot_relay/`` is a symlink, a file or another uid's: no host serves the root through
            it (one there would be another root's); the text names it and says what to do.
        PermissionError: the run directory is another uid's, or the socket is served by another uid.
        TimeoutError: the host did not answer within ``timeout``.
        UnreadableAnswer: the answer is not a JSON object (or is too large): the host may have acted on the request.
    """
    path = socket_path(root)
    dir_fd = _open_endpoint_dir(root, path)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(timeout)
            try:
                sock.connect(socket_address(dir_fd, path))
            except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as exc:
                raise HostOffline(f"nothing listens on {path} ({exc.strerror or exc})") from None
            _pid, uid = peer_cred(sock)
            if uid != os.getuid():
                raise PermissionError(f"refusing {path}: it is served by uid {uid}, not by us (uid {os.getuid()})")
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the host answered early: read it
                sock.sendall(encode(payload))
                sock.shutdown(socket.SHUT_WR)
            data = bytearray()
            while True:
                try:
                    chunk = sock.recv(RECV_CHUNK)
                except ConnectionResetError:
                    # A host that answers before reading (a "busy" refusal) and closes with our request
                    # still unread resets the connection once its answer is read: the answer stands.
                    if not data:
                        raise HostLost(f"the host on {path} reset the connection without answering (it stopped "
                                       "or died mid-request)") from None
                    break
                if not chunk:
                    break
                data += chunk
                if len(data) > MAX_ANSWER_BYTES:
                    raise UnreadableAnswer(f"the answer from {path} is larger than {MAX_ANSWER_BYTES} bytes")
    finally:
        os.close(dir_fd)
    if not data:
        raise HostLost(f"the host on {path} closed the connection without answering (it stopped or died "
                       "mid-request)")
    try:
        answer = orjson.loads(bytes(data))
    except orjson.JSONDecodeError as exc:
        raise UnreadableAnswer(f"the answer from {path} is not JSON ({exc})") from None
    if not isinstance(answer, dict):
        raise UnreadableAnswer(f"the answer from {path} is not a JSON object")
    if answer.get("op") == STOPPING_OP:  # taken from the backlog of a host that is stopping, never read
        raise HostOffline(f"the host on {path} is stopping; it did not take the request")
    return answer


def _open_endpoint_dir(root: str | Path, path: Path) -> int:
    """The run directory of ``root``, opened as its host opens it (:func:`open_run_dir`), for a request.

    Args:
        root: the Hermes root.
        path: its socket path (named in the errors).

    Returns:
        The run directory's descriptor (the caller closes it).

    Raises:
        HostOffline: no run directory, or a symlink or a file in its place (no host binds through one; a start
            puts it back).
        HostileFileError: ``bot_relay/`` is a symlink, a file or another uid's; the text says what to do.
        PermissionError: the run directory is another uid's.
    """
    try:
        return open_run_dir(root)
    except (FileNotFoundError, NotADirectoryError):
        raise HostOffline(f"no submit endpoint at {path}") from None
    except HostileFileError as exc:  # a host behind it serves another root (and none starts on this one)
        raise HostileFileError(
            f"{exc}: the submit endpoint {path} is not looked for through it (a host found there would serve another "
            "root, and none starts on this one); make it a real directory of this user again (move the symlink or "
            f"file aside, or chown it); then see `{shell_command('hermes-actors', 'doctor', '--root', root)}`"
        ) from None
    except PermissionError:
        if os.path.islink(path.parent):  # never followed; no host binds through one (a start puts it back)
            raise HostOffline(f"no submit endpoint at {path}: {path.parent} is a symlink") from None
        raise


def submit_dm(
    root: str | Path,
    sender: str,
    target: str,
    message: str,
    hop: int = 0,
    timeout: float = 10.0,
    author: dict[str, Any] | None = None,
    session: str = "",
) -> dict[str, Any]:
    """Hand a DM to the host of ``root``; returns its ack or refusal dict, never raises.

    When nothing hosts the actors, the answer is the ``runtime_offline`` refusal
    naming the command to start one — never an ack nobody would process.

    Args:
        session: the hermes session id the DM is sent from (the plugin's); the host
            makes a DM from a warm turn it runs on that session one hop deeper.
    """
    payload: dict[str, Any] = {"op": "send", "sender": sender, "target": target, "message": message, "hop": hop}
    if author:
        payload["author"] = author
    if session:
        payload["session"] = session
    try:
        answer = request(root, payload, timeout=timeout)
        if session and refused_unknown_field(answer, "send", "session"):
            # a host older than the field refused the request unread (nothing queued): send it as that host knows
            del payload["session"]
            answer = request(root, payload, timeout=timeout)
    except HostOffline:
        return offline_refusal(root)
    except HostLost:
        return _fate_unknown(root, "stopped without answering")
    except TimeoutError:
        return _fate_unknown(root, f"did not answer within {timeout:g}s")
    except UnreadableAnswer as exc:
        return _fate_unknown(root, f"answered something unreadable ({exc})")
    except (PermissionError, ValueError, OSError) as exc:
        return {"error": f"Could not submit the message to the Bot Mode host on {root}: {exc}", "reason": UNKNOWN}
    problem = send_answer_problem(answer)
    if problem is not None:  # taken by the host, answered neither an ack nor a refusal: never read as an ack
        return _fate_unknown(root, f"answered no ack and no refusal ({problem})")
    return answer


def _fate_unknown(root: str | Path, what: str) -> dict[str, Any]:
    """Pure: the bot's refusal when the host took its DM and ``what`` happened then: it may or may not be queued."""
    return {"error": f"The Bot Mode host on {root} {what}; the message may or may not have been queued — do not "
                     "resend it blindly.", "reason": UNKNOWN}


def send_answer_problem(answer: dict[str, Any]) -> str | None:
    """Pure: what makes a host's answer to a send no ack and no refusal, or None when it is one of them.

    Args:
        answer: the JSON object the host answered.

    Returns:
        None for a refusal (``error``) or an ack (a ``delivery_id``), else what is wrong with it.
    """
    if "error" in answer or is_delivery_id(answer.get("delivery_id")):
        return None
    return f"its answer names no delivery id and no error: {shown(answer)}"


def ping(root: str | Path, timeout: float = 2.0) -> dict[str, Any] | None:
    """The host's ``ping`` answer (pid, root, version), or None when nothing serves ``root``."""
    try:
        return request(root, {"op": "ping"}, timeout=timeout)
    except (HostOffline, TimeoutError, PermissionError, ValueError, OSError):
        return None


def fetch_outcome(
    root: str | Path, delivery_id: str, wait: float = 0.0, timeout: float | None = None
) -> dict[str, Any]:
    """The outcome of ``delivery_id`` from the host, waiting up to ``wait`` seconds there.

    Returns:
        The outcome dict, or ``{"status": "pending" | "unknown", ...}``.

    Raises:
        HostOffline: nothing serves ``root``.
        HostLost: the host closed the connection without answering.
        TimeoutError: the host did not answer within ``timeout`` (default ``wait`` + 10 s).
    """
    payload = {"op": "outcome", "delivery_id": delivery_id, "wait": wait}
    return request(root, payload, timeout=wait + 10.0 if timeout is None else timeout)


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


def fetch_status(root: str | Path, timeout: float = 10.0) -> dict[str, Any]:
    """The status of the host serving ``root`` (see :mod:`hermes_actors.ops.status`).

    Raises:
        HostOffline: nothing serves ``root``.
        TimeoutError: the host did not answer within ``timeout``.
        PermissionError: the endpoint is not ours.
        ValueError: the answer is not a JSON object.
    """
    return request(root, {"op": "status"}, timeout=timeout)


def lock_holder(root: str | Path) -> int | None:
    """The pid of the process that holds ``submit.lock`` of ``root``: a host, even one that no longer answers.

    A host keeps the lock from before its socket is bound until its last turn is done, so a
    holder that does not answer is starting or stopping. Read from ``/proc/locks`` (matched
    by the lock file's device and inode) rather than by trying the lock: a client holding it
    even for a moment would make a host starting at that moment give up.

    Args:
        root: the Hermes root.

    Returns:
        The holder's pid, or None (no lock file, nobody holds it, no ``/proc/locks``, or the
        run directory is not ours or is reached through a swapped ``bot_relay/``).
    """
    try:
        dir_fd = open_run_dir(root)
    except (OSError, HostileFileError):
        return None
    try:
        st = os.stat(LOCK_NAME, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    finally:
        os.close(dir_fd)
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open(_PROC_LOCKS, encoding="ascii", errors="replace") as table:
            lines = table.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 4242 fe:00:6373494 0 EOF"; a waiter's line has "->" after the number
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == wanted and fields[4].isdigit():
            return int(fields[4])
    return None
