"""One request to a hermes gateway's API server, with transport failures as typed turn failures.

The HTTP layer of :class:`~hermes_actors.hermes.api_runner.ApiRunner`: where the
server is (:class:`ApiServer`), the request with its bearer key, and the mapping
of "unreachable", "timed out" and "connection lost" to :class:`TurnFailed`
reasons (ambiguous once the turn's own request may have reached hermes); and
the probe that tells whether the server answers as ours does (:func:`api_server_problem`).

A request's ``timeout`` bounds the whole call (connecting, sending, the status line, the
headers and the body), not each read: a server that trickles its answer a byte at a time
is cut off at it. An answer is read up to :data:`ANSWER_MAX_BYTES`; a longer one is not read
at all, and the turn fails naming the cap.
"""

from __future__ import annotations

import http.client
import io
import json
import socket
import time
from dataclasses import dataclass
from typing import Any

from hermes_actors.core.outcomes import TEXT_MAX_BYTES
from hermes_actors.core.reasons import DELIVERY_TIMEOUT, RUNTIME_OFFLINE, UNKNOWN
from hermes_actors.errors import TurnFailed

__all__ = ["ANSWER_MAX_BYTES", "ApiHttpError", "ApiServer", "ApiServerProblem", "api_request", "api_server_problem",
           "call_api"]

# What an answer of the API server may be. It carries one reply (``message.content``), which an outcome keeps up
# to TEXT_MAX_BYTES (cut there with a note); JSON may escape every byte of it to 6 (\u00XX), and the answer holds
# a little beside it: 16 times the text's cap (64 MiB), as a relay reply file is read (docs/reliability.md).
ANSWER_MAX_BYTES = 16 * TEXT_MAX_BYTES
_CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class ApiServer:
    """Where a gateway's API server listens and the key it takes."""

    host: str
    port: int
    key: str

    def __repr__(self) -> str:  # never print the key
        return f"ApiServer(host={self.host!r}, port={self.port})"

    def __str__(self) -> str:  # how logs and doctor name it: 127.0.0.1:8642
        return f"{self.host}:{self.port}"


class ApiHttpError(Exception):
    """The API server answered with an error status (its JSON body in ``payload``).

    Args:
        status: the HTTP status.
        payload: the decoded body (``{"error": text}`` when it was not JSON).
    """

    def __init__(self, status: int, payload: Any) -> None:
        super().__init__(status)
        self.status = status
        self.payload = payload

    def message(self) -> str:
        """The server's error message (or code, or the body), for failure texts."""
        error = self.payload.get("error") if isinstance(self.payload, dict) else None
        if isinstance(error, dict):
            return str(error.get("message") or error.get("code") or "")
        return str(error or self.payload)[:500]

    def code(self) -> str:
        """The server's error code (``session_not_found``, ``invalid_title``...), ``""`` when it gave none."""
        error = self.payload.get("error") if isinstance(self.payload, dict) else None
        return str(error.get("code") or "") if isinstance(error, dict) else ""


class _Unreachable(Exception):
    """The connection to the API server could not be opened: nothing was sent."""


class _TooLarge(Exception):
    """The server's answer is longer than :data:`ANSWER_MAX_BYTES`: it was not read."""


class _DeadlineReader(io.RawIOBase):
    """The answer's bytes, each read given only what is left of the call's time (never more)."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)  # the socket's own reader: it stays open while this is
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the call's time ran out")
        self._sock.settimeout(left)
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _DeadlineSocket:
    """The connection's socket as :mod:`http.client` uses it, under one deadline for the whole call."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def sendall(self, data: bytes) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the call's time ran out")
        self._sock.settimeout(left)
        self._sock.sendall(data)

    def makefile(self, mode: str, *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def close(self) -> None:
        self._sock.close()


def _read_capped(response: http.client.HTTPResponse, cap: int) -> bytes:
    """The whole body of ``response``, at most ``cap`` bytes.

    Raises:
        _TooLarge: its ``Content-Length``, or what it sent, is over ``cap`` (nothing more is read).
    """
    if response.length is not None and response.length > cap:
        raise _TooLarge(f"{response.length:,} bytes announced")
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = response.read(min(_CHUNK, cap + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > cap:
            raise _TooLarge(f"over {cap:,} bytes sent")


def api_request(server: ApiServer, method: str, path: str, body: dict[str, Any] | None, timeout: float, *,
                max_bytes: int = ANSWER_MAX_BYTES) -> Any:
    """One request to ``server`` with its bearer key, and its decoded JSON answer.

    Args:
        server: the API server.
        method: the HTTP method.
        path: the request path.
        body: the JSON body, if any.
        timeout: seconds for the whole call: the connection, the request and the whole answer (a server
            trickling its answer is cut off at it).
        max_bytes: the longest answer read (:data:`ANSWER_MAX_BYTES`).

    Returns:
        The decoded JSON answer (``{}`` for an empty one).

    Raises:
        _Unreachable: the connection could not be opened (nothing was sent).
        _TooLarge: the answer is longer than ``max_bytes`` (it was not read).
        ApiHttpError: the server answered with an error status.
        TimeoutError, http.client.HTTPException, OSError: the request or its answer was lost, or the whole
            call took longer than ``timeout``.
    """
    deadline = time.monotonic() + timeout
    conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
    headers = {"Authorization": f"Bearer {server.key}", "Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode("utf-8")
        headers["Content-Type"] = "application/json"
    try:
        try:
            conn.connect()
        except OSError as exc:  # refused, unresolvable, connect timeout: the request never left
            raise _Unreachable(exc) from None
        conn.sock = _DeadlineSocket(conn.sock, deadline)
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        try:
            raw = _read_capped(response, max_bytes)
        finally:
            response.close()  # what is left unread is not waited for: the connection closes
    finally:
        conn.close()
    try:
        payload = json.loads(raw) if raw else {}
    except ValueError:
        payload = {"error": raw[:500].decode("utf-8", "replace")}
    if response.status >= 400:
        raise ApiHttpError(response.status, payload)
    return payload


def call_api(
    server: ApiServer, handle: str, method: str, path: str, body: dict[str, Any] | None, timeout: float, *,
    delivers: bool = False,
) -> Any:
    """One request with transport failures mapped to typed turn failures.

    Args:
        server: the API server.
        handle: the profile's handle, for failure texts.
        method: the HTTP method.
        path: the request path.
        body: the JSON body, if any.
        timeout: seconds for the whole call (the connection, the request and the whole answer).
        delivers: the request is the turn itself (its message may reach the agent once
            it is sent): a failure after the connection opened is ``ambiguous``, never retried.

    Returns:
        The decoded JSON answer.

    Raises:
        TurnFailed: the server is unreachable (``runtime_offline``), the whole answer did not come in
            time (``delivery_timeout``), the connection was lost, or the answer is longer than
            :data:`ANSWER_MAX_BYTES` (``unknown``, never retried: the turn ran; the text names the cap).
        ApiHttpError: the server answered with an error status.
    """
    where = f"{server.host}:{server.port}"
    try:
        return api_request(server, method, path, body, timeout)
    except _TooLarge as exc:
        raise TurnFailed(
            f"the hermes API server at {where} answered @{handle}'s Bot Chat {'turn' if delivers else 'request'} "
            f"with more than {ANSWER_MAX_BYTES // (1 << 20)} MiB ({exc}), the most an answer may be (a reply is "
            f"kept up to {TEXT_MAX_BYTES // (1 << 20)} MiB): it was not read, so its reply is lost",
            reason=UNKNOWN,
        ) from None
    except _Unreachable as exc:
        raise TurnFailed(
            f"hermes API server at {where} is not reachable ({exc}) — is `hermes gateway run` running?",
            reason=RUNTIME_OFFLINE,
        ) from None
    except TimeoutError:
        if delivers:  # the server keeps running the turn: a second request would run it twice
            raise TurnFailed(
                f"hermes API server at {where} did not answer @{handle}'s Bot Chat turn within {timeout:g}s; "
                "the turn may still be running there",
                reason=DELIVERY_TIMEOUT,
                ambiguous=True,
            ) from None
        raise TurnFailed(
            f"hermes API server timed out after {timeout:g}s on @{handle}'s Bot Chat turn",
            reason=DELIVERY_TIMEOUT,
        ) from None
    except (http.client.HTTPException, OSError) as exc:
        if delivers:  # e.g. the gateway stopped mid-turn: the turn may have run (or still be running)
            raise TurnFailed(
                f"the connection to the hermes API server at {where} was lost during @{handle}'s "
                f"Bot Chat turn ({exc or type(exc).__name__})",
                reason=RUNTIME_OFFLINE,
                ambiguous=True,
            ) from None
        raise TurnFailed(
            f"the connection to the hermes API server at {where} was lost ({exc or type(exc).__name__}) — "
            "is `hermes gateway run` running?",
            reason=RUNTIME_OFFLINE,
        ) from None


@dataclass(frozen=True)
class ApiServerProblem:
    """Why warm turns cannot use the API server: ``text`` says what was seen; ``misconfigured`` when
    something answers but not as our config expects (a key it refuses, another server on the port),
    which waiting will not cure, unlike a gateway not started yet."""

    text: str
    misconfigured: bool


def api_server_problem(server: ApiServer, timeout: float = 2.0, *, key_known: bool = True) -> ApiServerProblem | None:
    """Probe ``GET /health``, then an authenticated ``GET /p/default/api/sessions?limit=1``.

    Args:
        server: the server.
        timeout: seconds per request.
        key_known: whether ``server.key`` is the key to try; without it (a gateway started with a key we do not
            see) only ``/health`` is probed, as a warm turn's wait for a starting server probes it.

    Returns:
        None when both answer (``/health`` alone without ``key_known``) as hermes' API server does; else what went
        wrong.
    """
    probes = (("/health", False), ("/p/default/api/sessions?limit=1", True))
    try:
        for path, auth in probes if key_known else probes[:1]:
            conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout)
            try:
                headers = {"Authorization": f"Bearer {server.key}"} if auth else {}
                conn.request("GET", path, headers=headers)
                response = conn.getresponse()
                body = response.read()
            finally:
                conn.close()
            if auth and response.status in (401, 403):
                return ApiServerProblem(f"refuses our API_SERVER_KEY (HTTP {response.status}): the key hermes-actors "
                                        "reads is not the one the running hermes gateway started with", True)
            if response.status != 200 or (not auth and not _health_ok(body)):
                return ApiServerProblem(f"answered HTTP {response.status} on {path}, not as hermes' API server does: "
                                        "another program may hold the port", True)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return ApiServerProblem(f"does not answer ({exc})", False)
    return None


def _health_ok(body: bytes) -> bool:
    """Pure: whether a ``/health`` body is hermes' (a JSON object whose ``status`` is ``"ok"``); any other JSON
    (a list, a string: another program on the port) is not, and is never a crash.

    Raises:
        ValueError: the body is not JSON (the caller's "does not answer").
    """
    payload = json.loads(body or b"{}")
    return isinstance(payload, dict) and payload.get("status") == "ok"
