"""``serve --http``: ``/metrics``, ``/status``, ``/events`` and the live page ``/`` on a ThreadingHTTPServer.

The server's lifetime is explicit: :meth:`OpsHttpServer.start` binds and starts
its one accept thread, :meth:`OpsHttpServer.close` ends the live streams, stops
accepting, cuts the open connections (an idle or slow client cannot hold it) and
joins every request thread.

A client cannot hold the server's threads and descriptors without bound: at most
:data:`MAX_CONNECTIONS` connections are served at once (one beyond is answered a short 503
and closed at once, by the accept thread), and each must send its request line and headers
within :data:`REQUEST_HEAD_SECONDS` of being taken, however often it sends a byte (a slowloris
is cut off). An ``accept()`` that fails (out of descriptors) is retried after a bounded back-off
(:mod:`hermes_actors.core.accept_retry`) instead of at once, spinning. Outcomes reach it through
``Gateway.subscribe``; the callback only counts and appends, and cannot raise
into the notifier (which would only log it anyway: user code never stops actors).
"""

from __future__ import annotations

import contextlib
import hmac
import io
import socket
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from loguru import logger
from prometheus_client import CONTENT_TYPE_LATEST

from hermes_actors.cli.render import json_text
from hermes_actors.core.accept_retry import accept_backoff, accept_retries
from hermes_actors.core.spell import Spell
from hermes_actors.gateway import Gateway
from hermes_actors.hermes.submit_socket import timeout_by
from hermes_actors.ops.feed import LiveFeed
from hermes_actors.ops.http_config import HttpSettings, is_loopback_host
from hermes_actors.ops.metrics import DeliveryMetrics
from hermes_actors.ops.status import live_status

__all__ = ["MAX_CONNECTIONS", "MAX_STREAMS", "REQUEST_HEAD_SECONDS", "TOKEN_COOKIE", "OpsHttpServer", "cookie_values",
           "host_of"]

TOKEN_COOKIE = "hermes_actors_token"
MAX_STREAMS = 16  # open /events streams (live pages) at once
MAX_CONNECTIONS = 64  # connections served at once, the streams among them (each holds a thread and a descriptor)
REQUEST_HEAD_SECONDS = 10.0  # a client's time to send its whole request line and headers, from its connection's take
_PAGE_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
             "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def cookie_values(header: str, name: str) -> list[str]:
    """Pure: the values of the cookies called ``name`` in a ``Cookie`` header, whatever else it holds.

    Each ``;``-separated pair is read on its own: a pair another page of the same host set (``prefs={"a":1}``,
    ``x=a b``) that a strict parser refuses does not hide ours.

    Args:
        header: the ``Cookie`` header's value ("" when absent).
        name: the cookie's name.

    Returns:
        Each value sent under ``name``, in order, unquoted (``"v"`` → ``v``); [] when none.
    """
    values = []
    for pair in header.split(";"):
        key, equals, value = pair.partition("=")
        if equals and key.strip() == name:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            values.append(value)
    return values


def host_of(header: str) -> str:
    """Pure: the host part of a ``Host`` header (``[::1]:80`` → ``::1``, ``localhost:9464`` → ``localhost``)."""
    value = header.strip()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


#: Errors of a client that went away mid-request (a closed tab, a scraper's timeout, our own close): no traceback.
_CLIENT_GONE = (ConnectionError, TimeoutError, socket.timeout)


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins every request thread: nothing outlives close()
    block_on_close = True
    ops: OpsHttpServer

    def __init__(self, address: tuple[str, int], ops: OpsHttpServer) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.ops = ops
        self._open: set[socket.socket] = set()  # the connections being served, cut at close
        self._open_lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(ops.max_connections)  # connections served at once
        self._turned_away = Spell()  # connections turned away in a row (at the cap): said once; the accept thread's
        self._accepts = Spell()  # accepts failing in a row (out of descriptors): said once; the accept thread's
        self.closing = threading.Event()  # set by close(): ends an accept back-off at once
        super().__init__(address, _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        """Take a connection; one that cannot be taken (out of descriptors...) is retried after a back-off.

        socketserver retries at once, and the waiting connection keeps the socket readable: without the
        back-off the accept thread would spin a core for as long as the shortage lasts.
        """
        try:
            taken = super().get_request()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):  # that client went away first
            raise
        except OSError as exc:
            if accept_retries(exc.errno):
                self._accepts, say = self._accepts.failed()
                if say:
                    logger.warning("operator endpoint cannot accept connections ({}); retrying until it can", exc)
                self.closing.wait(accept_backoff(self._accepts.failures))
            raise  # socketserver drops this attempt: the next select() retries
        self._accepts, ended = self._accepts.landed()
        if ended:
            logger.info("operator endpoint accepting connections again (after {} failed accepts)", ended)
        return taken

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve ``request`` on a thread of its own, or beyond :data:`MAX_CONNECTIONS` turn it away at once."""
        if not self._slots.acquire(blocking=False):
            self._turned_away, say = self._turned_away.failed()
            if say:
                logger.warning("operator endpoint: {} connections are being served; turning more away until one "
                               "ends", self.ops.max_connections)
            self._turn_away(request)
            return
        self._turned_away, _ = self._turned_away.landed()
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread was started: nothing else gives the slot back
            self._slots.release()
            raise

    def _turn_away(self, request: socket.socket) -> None:
        """Answer a short 503 and close, without ever blocking the accept thread."""
        body = f"busy: {self.ops.max_connections} connections are being served; try again in a moment\n".encode()
        with contextlib.suppress(OSError):
            request.setblocking(False)
            with contextlib.suppress(BlockingIOError):  # what already came: closing on unread data resets the 503
                while len(request.recv(65536)) > 0:
                    pass
            request.send(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\nRetry-After: 1\r\n"
                         b"Connection: close\r\n\r\n" + body)
        self.shutdown_request(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open.discard(request)
            self._slots.release()

    def cut_connections(self) -> None:
        """End every open connection at once: an idle or dribbling client must not hold the close (nor a stop).

        A request thread blocked reading the client's next bytes sees the end of its stream and returns.
        """
        with self._open_lock:
            connections = list(self._open)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its thread

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A request that failed is logged through loguru (the standard library printed a traceback to stderr)."""
        error = sys.exc_info()[1]
        if isinstance(error, _CLIENT_GONE):
            logger.debug("http {}: the client went away: {!r}", client_address[0], error)
            return
        logger.opt(exception=error).warning("http {}: the request failed: {!r}", client_address[0], error)


class OpsHttpServer:
    """The operator endpoint of one running gateway.

    Args:
        gateway: the gateway (started before :meth:`start`; :meth:`subscribe` may come before its start).
        settings: where to listen and the bearer token (see :func:`~hermes_actors.ops.http_config.http_settings`).
        status: the ``live_status`` function (``/status`` and the page).
        stream_interval: seconds between the status refreshes each ``/events`` stream sends between outcomes.
        max_connections: connections served at once (:data:`MAX_CONNECTIONS`); one more is answered 503.
        request_head_seconds: a connection's time to send its request line and headers (:data:`REQUEST_HEAD_SECONDS`).
    """

    def __init__(self, gateway: Gateway, settings: HttpSettings, *,
                 status: Callable[[Gateway], dict[str, Any]] = live_status, stream_interval: float = 1.0,
                 max_connections: int = MAX_CONNECTIONS, request_head_seconds: float = REQUEST_HEAD_SECONDS) -> None:
        self.gateway = gateway
        self.settings = settings
        self.status = status
        self.stream_interval = stream_interval
        self.max_connections = max_connections
        self.request_head_seconds = request_head_seconds
        self.feed = LiveFeed()
        self.streams = threading.BoundedSemaphore(MAX_STREAMS)  # each open page holds a request thread
        self.metrics = DeliveryMetrics(gateway.stats, lambda: status(gateway))
        self.page = resources.files("hermes_actors.ops").joinpath("live_page.html").read_bytes()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._port = settings.port  # the bound one once started (settings may say 0)

    def bind(self) -> OpsHttpServer:
        """Bind the listening socket without serving yet (idempotent). Returns self.

        ``serve`` binds before its gateway starts, so an address that cannot be bound
        starts nothing; requests wait in the backlog until :meth:`start`.

        Raises:
            OSError: the address cannot be bound (in use, not local, ...).
        """
        if self._server is None:
            self._server = _Server((self.settings.host, self.settings.port), self)
            self._port = int(self._server.server_address[1])
        return self

    def subscribe(self) -> OpsHttpServer:
        """Count and show the gateway's outcomes from now on (idempotent). Returns self.

        ``serve`` subscribes before its gateway starts: the outcomes the start settles (its recovery:
        ``ambiguous`` DMs, outcomes re-delivered) then reach ``hermes_actors_deliveries_total`` and the
        live page's recent outcomes as they reach ``hermes_actors_settled_total``.

        Raises:
            RuntimeError: the gateway is stopping or stopped (``Gateway.subscribe``).
        """
        if self._unsubscribe is None:
            self._unsubscribe = self.gateway.subscribe(self._on_outcome, details=True, rooms=True)
        return self

    def start(self) -> OpsHttpServer:
        """Subscribe to outcomes (unless :meth:`subscribe` did), bind (unless :meth:`bind` did) and start serving.

        Returns:
            self.

        Raises:
            OSError: the address cannot be bound (in use, not local, ...).
        """
        subscribed = self._unsubscribe is not None
        self.subscribe()
        try:
            self.bind()
        except OSError:
            if not subscribed and self._unsubscribe is not None:
                self._unsubscribe()
                self._unsubscribe = None
            raise
        assert self._server is not None
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.5},
                                        name="ops-http", daemon=True)
        self._thread.start()
        logger.info("operator endpoint on {}", self.url)
        return self

    @property
    def url(self) -> str:
        """The base URL actually bound (the real port when 0 was asked)."""
        port, host = self._port, self.settings.host
        return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"

    def close(self) -> None:
        """End the live streams, stop serving and join the server's threads (idempotent)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.feed.close()
        if self._server is not None:
            self._server.closing.set()  # an accept back-off ends at once
            if self._thread is not None:  # shutdown() waits for serve_forever, which a bound-only server never ran
                self._server.shutdown()
            self._server.cut_connections()  # then the join below waits for no client
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> OpsHttpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on_outcome(self, outcome: dict[str, Any]) -> None:
        for record in (self.metrics.observe, self.feed.publish):  # each on its own: one failing spares the other
            try:
                record(outcome)
            except Exception:  # a bug here costs a log line, never the notifier or another subscriber
                logger.exception("operator endpoint could not record outcome {}", outcome.get("delivery_id"))

    def view(self) -> dict[str, Any]:
        """What the page shows besides outcomes: the status and the roster with liveness."""
        try:
            return {"status": self.status(self.gateway), "roster": self.gateway.roster()}
        except (RuntimeError, TimeoutError):  # stopping, or an actor gone or stuck
            return {"status": {"running": False}, "roster": []}

    def token_matches(self, offered: str) -> bool:
        """Whether ``offered`` is the bearer token (in constant time); always True when none is set."""
        token = self.settings.token
        return token is None or hmac.compare_digest(offered.encode(), token.encode())

    def authorized(self, headers: Any) -> bool:
        """Whether a request carries the bearer token (``Authorization: Bearer`` or the cookie); True without one."""
        if self.settings.token is None:
            return True
        offered: list[str] = []
        auth = headers.get("Authorization", "")
        if auth[:7].lower() == "bearer ":
            offered.append(auth[7:].strip())
        for header in headers.get_all("Cookie") or []:  # a browser sends one; HTTP/2 proxies may split it
            offered += cookie_values(header, TOKEN_COOKIE)
        return any(self.token_matches(o) for o in offered)


class _HeadReader(io.RawIOBase):
    """The connection's bytes for the request's head, each read bounded by one deadline for the whole head.

    The handler's ``timeout`` bounds each read afresh: a client sending a byte now and then (a slowloris)
    would hold its thread and descriptor for as long as it likes. Once the head is read
    (:meth:`head_read`), reads are bounded by ``timeout`` alone.
    """

    def __init__(self, conn: socket.socket, deadline: float, timeout: float) -> None:
        super().__init__()
        self._conn = conn
        self._deadline: float | None = deadline
        self._timeout = timeout

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._deadline is not None:
            timeout_by(self._conn, self._deadline, at_most=self._timeout)  # TimeoutError: the head came too slowly
        return self._conn.recv_into(buffer)

    def head_read(self) -> None:
        """The head is in: from now on each read is bounded by the handler's ``timeout`` only."""
        if self._deadline is not None:
            self._deadline = None
            self._conn.settimeout(self._timeout)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 10  # a client that stops reading cannot hold a request thread (and close()) for long
    server_version = "hermes-actors"
    _head: _HeadReader

    def setup(self) -> None:
        super().setup()
        self._head = _HeadReader(self.connection, time.monotonic() + self.server.ops.request_head_seconds,
                                 self.timeout)
        self.rfile.close()  # the plain reader, replaced before it read anything
        self.rfile = io.BufferedReader(self._head)

    def parse_request(self) -> bool:
        """Parse the request line and read the headers (within the head's deadline), then lift the deadline."""
        parsed = super().parse_request()
        self._head.head_read()
        return parsed

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("http {} " + format, self.client_address[0], *args)

    def do_GET(self) -> None:
        ops = self.server.ops
        url = urlsplit(self.path)
        # ?token= only on the page, where it becomes a cookie; elsewhere it would linger in logs and histories
        query_token = parse_qs(url.query).get("token", [None])[-1] if url.path == "/" else None
        if ops.settings.token is None and not is_loopback_host(host_of(self.headers.get("Host", ""))):
            # no token means loopback only: a page elsewhere that rebinds its DNS name to 127.0.0.1 is refused
            self._text(HTTPStatus.FORBIDDEN, "forbidden: this endpoint answers loopback host names only\n")
            return
        if query_token is not None and ops.settings.token is not None and ops.token_matches(query_token):
            # the token moves into a cookie, out of the address bar
            self.send_response(HTTPStatus.SEE_OTHER)
            self.send_header("Location", "/")
            self.send_header("Set-Cookie", f"{TOKEN_COOKIE}={query_token}; HttpOnly; SameSite=Strict; Path=/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if not ops.authorized(self.headers) or (query_token is not None and not ops.token_matches(query_token)):
            self._text(HTTPStatus.UNAUTHORIZED, "unauthorized: send the bearer token (Authorization: Bearer TOKEN)\n",
                       {"WWW-Authenticate": 'Bearer realm="hermes-actors"'})
            return
        route = {"/": self._page, "/metrics": self._metrics, "/status": self._status, "/events": self._events}
        handler = route.get(url.path)
        if handler is None:
            self._text(HTTPStatus.NOT_FOUND, f"not found: {url.path} (try /, /metrics, /status, /events)\n")
            return
        handler()

    def _reply(self, status: HTTPStatus, body: bytes, content_type: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _text(self, status: HTTPStatus, text: str, extra: dict[str, str] | None = None) -> None:
        self._reply(status, text.encode(), "text/plain; charset=utf-8", extra)

    def _page(self) -> None:
        self._reply(HTTPStatus.OK, self.server.ops.page, "text/html; charset=utf-8",
                    {"Content-Security-Policy": _PAGE_CSP, "X-Frame-Options": "DENY"})

    def _metrics(self) -> None:
        self._reply(HTTPStatus.OK, self.server.ops.metrics.render(), CONTENT_TYPE_LATEST)

    def _status(self) -> None:
        ops = self.server.ops
        try:
            status, code = ops.status(ops.gateway), HTTPStatus.OK
        except (RuntimeError, TimeoutError) as exc:  # stopping, or an actor gone or stuck
            status, code = {"running": False, "error": str(exc)}, HTTPStatus.SERVICE_UNAVAILABLE
        self._reply(code, json_text(status, default=str).encode(), "application/json")

    def _events(self) -> None:
        """Server-Sent Events: ``snapshot`` first, then ``outcome`` and ``room`` as each arrives, and ``status``
        refreshes."""
        ops = self.server.ops
        if not ops.streams.acquire(blocking=False):
            self._text(HTTPStatus.SERVICE_UNAVAILABLE, f"too many live pages open (at most {MAX_STREAMS})\n",
                       {"Retry-After": "10"})
            return
        try:
            self._stream(ops)
        finally:
            ops.streams.release()

    def _stream(self, ops: OpsHttpServer) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        try:
            seq = self._send_snapshot(ops)
            last_status = time.monotonic()
            while True:
                wait = max(0.0, last_status + ops.stream_interval - time.monotonic())
                batch = ops.feed.wait_after(seq, wait)
                if batch.closed:
                    return
                seq = batch.seq
                if batch.resync:
                    seq = self._send_snapshot(ops)
                    last_status = time.monotonic()
                    continue
                for event in batch.events:
                    self._send("room" if event.get("kind") == "room" else "outcome", event)
                if time.monotonic() - last_status >= min(0.25, ops.stream_interval) or not batch.events:
                    self._send("status", ops.view())
                    last_status = time.monotonic()
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            return  # the browser went away

    def _send_snapshot(self, ops: OpsHttpServer) -> int:
        """Send the view and the kept outcomes; returns the sequence number they go up to."""
        recent, seq = ops.feed.snapshot()
        outcomes = [event for event in recent if event.get("kind") != "room"]  # rooms: the status has them
        self._send("snapshot", {**ops.view(), "recent": outcomes})
        return seq

    def _send(self, event: str, data: Any) -> None:
        # the CLI's --json rule (cli.render.json_text): a lone surrogate (a root whose path is not UTF-8) is escaped
        self.wfile.write(b"event: " + event.encode() + b"\ndata: " + json_text(data, default=str).encode() + b"\n\n")
        self.wfile.flush()
