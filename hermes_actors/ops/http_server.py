"""``serve --http``: ``/metrics``, ``/status``, ``/events`` and the live page ``/`` on a ThreadingHTTPServer.

The server's lifetime is explicit: :meth:`OpsHttpServer.start` binds and starts
its one accept thread, :meth:`OpsHttpServer.close` ends the live streams, stops
accepting, cuts the open connections (an idle or slow client cannot hold it) and
joins every request thread. Outcomes reach it through
``Gateway.subscribe``; the callback only counts and appends, and cannot raise
into the notifier (which would only log it anyway: user code never stops actors).
"""

from __future__ import annotations

import hmac
import socket
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
from loguru import logger
from prometheus_client import CONTENT_TYPE_LATEST

from hermes_actors.gateway import Gateway
from hermes_actors.ops.feed import LiveFeed
from hermes_actors.ops.http_config import HttpSettings, is_loopback_host
from hermes_actors.ops.metrics import DeliveryMetrics
from hermes_actors.ops.status import live_status

__all__ = ["MAX_STREAMS", "TOKEN_COOKIE", "OpsHttpServer", "host_of"]

TOKEN_COOKIE = "hermes_actors_token"
MAX_STREAMS = 16  # open /events streams (live pages) at once
_PAGE_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
             "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


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
        super().__init__(address, _Handler)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open.discard(request)

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
    """

    def __init__(self, gateway: Gateway, settings: HttpSettings, *,
                 status: Callable[[Gateway], dict[str, Any]] = live_status, stream_interval: float = 1.0) -> None:
        self.gateway = gateway
        self.settings = settings
        self.status = status
        self.stream_interval = stream_interval
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
        cookie = SimpleCookie()
        try:
            cookie.load(headers.get("Cookie", ""))
        except CookieError:
            pass
        if TOKEN_COOKIE in cookie:
            offered.append(cookie[TOKEN_COOKIE].value)
        return any(self.token_matches(o) for o in offered)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 10  # a client that stops reading cannot hold a request thread (and close()) for long
    server_version = "hermes-actors"

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
        self._reply(code, orjson.dumps(status, default=str), "application/json")

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
        self.wfile.write(b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data, default=str) + b"\n\n")
        self.wfile.flush()
