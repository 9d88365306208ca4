"""``serve --http``: the address and token rules, /metrics, /status, /events, auth, and the CLI's refusals."""

from __future__ import annotations

import contextlib
import errno
import http.client
import os
import re
import select
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from roots import RecordingRunner, make_root, send_dm, start_gateway

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.cli.main import main
from hermes_actors.messages import Turn
from hermes_actors.ops.feed import LiveFeed, room_event
from hermes_actors.ops.http_config import TOKEN_ENV, HttpSettings, http_settings, is_loopback_host, parse_http_address

prometheus_parser = pytest.importorskip("prometheus_client.parser", reason="the [ops] extra (prometheus_client)")

from hermes_actors.ops.http_server import TOKEN_COOKIE, OpsHttpServer, cookie_values, host_of  # noqa: E402
from hermes_actors.ops.metrics import (  # noqa: E402
    METRIC_NAMES,
    REDIS_METRICS,
    DeliveryMetrics,
    profile_gauges,
    relay_files,
    relay_samples,
    room_states,
)

TOKEN = "s3cret-Token_1"


# ── pure rules ───────────────────────────────────────────────────────────────

@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:9464", ("127.0.0.1", 9464)),
    (":9464", ("127.0.0.1", 9464)),
    ("9464", ("127.0.0.1", 9464)),
    ("0.0.0.0:80", ("0.0.0.0", 80)),
    ("[::1]:9464", ("::1", 9464)),
    ("localhost:0", ("localhost", 0)),
    (" metrics.lan:9100 ", ("metrics.lan", 9100)),
    (":" + "0" * 100_000 + "9464", ("127.0.0.1", 9464)),  # leading zeros: no int() past Python's limit on digits
])
def test_http_addresses(text: str, expected: tuple[str, int]) -> None:
    assert parse_http_address(text) == expected


@pytest.mark.parametrize(("text", "says"), [
    ("", "empty"),
    ("127.0.0.1:", "is not a number"),
    ("127.0.0.1:http", "'http' is not a number"),
    ("127.0.0.1:99999", "out of range"),
    ("127.0.0.1:" + "1" * 100_000, "the port '1111"),  # cut, out of range: no int() past the limit on digits
    ("127.0.0.1:\u00b2", "the port '\u00b2' is not a number"),  # a digit to isdigit(), not to int()
    # Regression (CLI review): a negative port said `the port '-1' is not a number`: it is one, out of range
    ("127.0.0.1:-1", "--http '127.0.0.1:-1': the port -1 is out of range (0-65535)"),
    (":-" + "1" * 100_000, "is out of range (0-65535)"),  # no int() past the limit on digits
    # Regression (diff review): `-0` was taken as port 0 (the `-` dropped before the range check)
    ("127.0.0.1:-0", "--http '127.0.0.1:-0': the port -0 is out of range (0-65535)"),
    (":-000", "the port -000 is out of range (0-65535)"),
    ("127.0.0.1:+1", "the port '+1' is not a number"),
    ("127.0.0.1:+0", "the port '+0' is not a number"),
    ("127.0.0.1:-", "the port '-' is not a number"),
    ("127.0.0.1:--1", "the port '--1' is not a number"),
    ("::1:80", "in brackets"),
    ("[::1]", "brackets followed by :PORT"),
    ("[nothost]:80", "not an IPv6 address"),
    ("http://127.0.0.1:80", "not a URL"),
    ("me@host:80", "not a host name"),
])
def test_bad_http_addresses_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match="--http") as err:
        parse_http_address(text)
    assert says in str(err.value)


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.1", True), ("::1", True), ("localhost", True), ("LOCALHOST", True),
    ("0.0.0.0", False), ("::", False), ("192.168.1.5", False), ("metrics.lan", False), ("", False),
])
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_a_non_loopback_bind_needs_a_token() -> None:
    with pytest.raises(ValueError, match=rf"0\.0\.0\.0, which is not loopback.*{TOKEN_ENV}"):
        http_settings("0.0.0.0:9464", None, env={})
    assert http_settings("0.0.0.0:9464", None, env={TOKEN_ENV: TOKEN}).token == TOKEN
    assert http_settings("0.0.0.0:9464", TOKEN, env={}).token == TOKEN
    assert http_settings(":9464", None, env={}) == HttpSettings("127.0.0.1", 9464, None)
    with pytest.raises(ValueError, match="token is empty"):
        http_settings(":9464", "  ", env={})
    with pytest.raises(ValueError, match="token may only hold"):
        http_settings(":9464", "a;b", env={})


def test_host_header_table() -> None:
    assert host_of("localhost:9464") == "localhost"
    assert host_of("[::1]:80") == "::1"
    assert host_of("127.0.0.1") == "127.0.0.1"
    assert host_of("evil.example:80") == "evil.example"


def test_profile_gauges_count_in_flight_per_target_and_keep_every_profile() -> None:
    status = {
        "profiles": [{"profile": "alice", "handle": "alice", "queued": 2}, {"profile": "default", "handle": "hermes"},
                     {"handle": "bob", "queued": True}],
        "in_flight": [{"target": "@hermes"}, {"target": "alice"}, {"target": "hermes"}, {"target": "dave@mini"}],
    }
    assert profile_gauges(status) == {"alice": (1, 2), "bob": (0, 0), "default": (2, 0)}
    assert profile_gauges({}) == {}


def test_profile_gauges_prefer_the_per_profile_count_then_the_rows_profile() -> None:
    status = {  # the shape of hermes_actors.ops.status.live_status: rows count running + queued
        "profiles": [{"profile": "default", "handle": "hermes", "in_flight": 3, "queued": 2},
                     {"profile": "alice", "handle": "ally", "in_flight": None, "queued": None}],
        "in_flight": [{"profile": "alice", "target": "@ally"}, {"profile": "default", "target": "@hermes"}],
    }
    assert profile_gauges(status) == {"alice": (1, 0), "default": (3, 2)}


def test_relay_files_keep_known_directories_with_counts() -> None:
    relay = {"outbox": 2, "claimed": 0, "replies": None, "quarantine": 1, "roster_age_seconds": 3.5, "alive": True}
    assert relay_files(relay) == {"outbox": 2, "claimed": 0, "quarantine": 1}
    assert relay_files({}) == {}


def test_relay_files_are_served_when_the_status_has_them(root: Path, gateways: list[Gateway]) -> None:
    from hermes_actors.ops.status import live_status

    def with_dirs(gw: Gateway) -> dict[str, Any]:
        status = live_status(gw)
        return {**status, "relay": {**status["relay"], "outbox": 4, "quarantine": 1}}

    gw = start_gateway(gateways, root)
    with OpsHttpServer(gw, HttpSettings("127.0.0.1", 0), status=with_dirs) as server:
        scraped = samples(get(server.url + "metrics")[2].decode())
    assert scraped[("hermes_actors_relay_files", (("dir", "outbox"),))] == 4
    assert scraped[("hermes_actors_relay_files", (("dir", "quarantine"),))] == 1


def test_relay_samples_split_counters_and_gauges() -> None:
    counters, gauges = relay_samples({"sent": 3, "replies": 2, "waiting": 1, "inbound": 4, "alive": True, "x": "y"})
    assert counters == {"sent": 3.0, "replies": 2.0}
    assert gauges == {"waiting": 1.0, "inbound": 4.0}


def test_room_states_count_every_known_state() -> None:
    assert room_states({}) == {"idle": 0, "busy": 0, "needs_you": 0}
    rooms = [{"state": "busy"}, {"state": "idle"}, {"state": "busy"}, {"state": "odd"}, {}]
    assert room_states({"rooms": rooms}) == {"idle": 1, "busy": 2, "needs_you": 0, "odd": 1, "unknown": 1}


def test_room_events_never_count_as_deliveries_nor_carry_text() -> None:
    metrics = DeliveryMetrics(dict, dict)
    message = {"message_id": "m" * 32, "author": "alice", "text": "secret plan", "at": 1.0, "round": 1,
               "status": "said"}
    metrics.observe({"kind": "room", "room_id": "r" * 32, "room": "plan", "event": "message", "message": message})
    metrics.observe({"kind": "room", "room_id": "r" * 32, "room": "plan", "event": "state", "state": "idle"})
    scraped = samples(metrics.render().decode())
    assert scraped[("hermes_actors_room_messages_total", (("status", "said"),))] == 1
    assert not [key for key in scraped if key[0] == "hermes_actors_deliveries_total"]  # was 2 "unknown" deliveries
    event = room_event({"kind": "room", "room_id": "r" * 32, "room": "plan", "event": "message", "message": message},
                       5.0)
    assert event == {"kind": "room", "room_id": "r" * 32, "room": "plan", "event": "message", "at": 5.0,
                     "message_id": "m" * 32, "author": "alice", "round": 1, "status": "said"}
    state = room_event({"kind": "room", "room_id": "r" * 32, "room": "plan", "event": "state", "state": "busy"}, 6.0)
    assert state == {"kind": "room", "room_id": "r" * 32, "room": "plan", "event": "state", "at": 6.0, "state": "busy"}


def test_feed_resyncs_a_stream_that_fell_behind() -> None:
    feed = LiveFeed(keep=3)
    for n in range(5):
        feed.publish({"delivery_id": str(n), "status": "replied", "reply": "secret", "text": "secret"})
    recent, seq = feed.snapshot()
    assert seq == 5 and [e["delivery_id"] for e in recent] == ["2", "3", "4"]
    assert all("reply" not in e and "text" not in e for e in recent)  # the page never sees message texts
    assert feed.wait_after(1, 0).resync  # sequence numbers 1..5; 3..5 are kept, so a stream at 1 missed 2
    batch = feed.wait_after(2, 0)
    assert not batch.resync and [e["delivery_id"] for e in batch.events] == ["2", "3", "4"] and batch.seq == 5
    assert [e["delivery_id"] for e in feed.wait_after(4, 0).events] == ["4"]
    feed.close()
    assert feed.wait_after(5, 10).closed


# ── the server ───────────────────────────────────────────────────────────────

@pytest.fixture
def endpoint(root: Path, gateways: list[Gateway]) -> Iterator[OpsHttpServer]:
    gw = start_gateway(gateways, root)
    with OpsHttpServer(gw, HttpSettings("127.0.0.1", 0)) as server:
        yield server


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in prometheus_parser.text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_move_after_dms(endpoint: OpsHttpServer) -> None:
    gw = endpoint.gateway
    status, headers, body = get(endpoint.url + "metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    before = samples(body.decode())
    assert before[("hermes_actors_up", ())] == 1
    assert before[("hermes_actors_accepted_total", ())] == 0
    assert before[("hermes_actors_in_flight", (("profile", "bob"),))] == 0
    assert before[("hermes_actors_queued", (("profile", "alice"),))] == 0
    assert before[("hermes_actors_delivery_latency_seconds_count", ())] == 0
    ids = [send_dm(gw, f"m{n}") for n in range(3)]
    for delivery_id in ids:
        assert gw.wait_outcome(delivery_id, timeout=30)["status"] == "replied"
    replied = ("hermes_actors_deliveries_total", (("reason", "none"), ("status", "replied")))

    def scraped() -> dict[Any, float] | None:
        now = samples(get(endpoint.url + "metrics")[2].decode())
        return now if now.get(replied) == 3 else None

    after = await_condition(scraped, timeout=30, interval=0.05, message="3 replied deliveries counted")
    assert after[("hermes_actors_accepted_total", ())] == 3
    assert after[("hermes_actors_settled_total", ())] == 3
    assert after[("hermes_actors_delivery_latency_seconds_count", ())] == 3
    assert after[("hermes_actors_delivery_latency_seconds_bucket", (("le", "+Inf"),))] == 3
    assert after[("hermes_actors_journal_records_total", ())] > 0
    assert after[("hermes_actors_relay_up", ())] == 1
    text = get(endpoint.url + "metrics")[2].decode()
    families = {f.name for f in prometheus_parser.text_string_to_metric_families(text)}
    for name in METRIC_NAMES.keys() - REDIS_METRICS:  # every documented name is served (the parser names
        # counters without _total); the Redis ones by a gateway on Redis: tests/test_redis_ops.py
        assert name.removesuffix("_total") in families, name


def test_failed_outcomes_are_counted_by_reason(root: Path, gateways: list[Gateway]) -> None:
    from hermes_actors.errors import TurnFailed

    def fail(turn: Any) -> str:
        raise TurnFailed("no model", reason="provider_error")

    gw = start_gateway(gateways, root, runner=fail)
    with OpsHttpServer(gw, HttpSettings("127.0.0.1", 0)) as server:
        delivery_id = send_dm(gw, "x")
        outcome = gw.wait_outcome(delivery_id, timeout=30)
        key = ("hermes_actors_deliveries_total", (("reason", outcome["reason"]), ("status", "failed")))
        await_condition(lambda: samples(get(server.url + "metrics")[2].decode()).get(key) == 1, timeout=30,
                        interval=0.05, message=f"failed/{outcome['reason']} counted")


def test_a_failing_metric_never_reaches_the_notifier(endpoint: OpsHttpServer, logs: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(outcome: Any) -> None:
        raise ValueError("metrics bug")

    monkeypatch.setattr(endpoint.metrics, "observe", broken)
    gw = endpoint.gateway
    ids = [send_dm(gw, "a"), send_dm(gw, "b")]
    await_condition(lambda: len(endpoint.feed.snapshot()[0]) == 2, timeout=30, message="both outcomes on the page")
    assert {e["delivery_id"] for e in endpoint.feed.snapshot()[0]} == set(ids)
    assert gw.stats()["subscriber_errors"] == 0  # caught in the endpoint: the notifier never saw it
    assert logs.matching("could not record outcome")


def test_a_scrape_after_the_gateway_stopped_says_down(endpoint: OpsHttpServer) -> None:
    endpoint.gateway.stop(timeout=5)
    after = samples(get(endpoint.url + "metrics")[2].decode())
    assert after[("hermes_actors_up", ())] == 0
    assert ("hermes_actors_accepted_total", ()) not in after
    status, _, body = get(endpoint.url + "status")
    assert status in (200, 503) and orjson.loads(body)["running"] is False


def test_status_is_the_live_status_json(endpoint: OpsHttpServer) -> None:
    delivery_id = send_dm(endpoint.gateway, "hello")
    endpoint.gateway.wait_outcome(delivery_id, timeout=30)
    status, headers, body = get(endpoint.url + "status")
    assert status == 200 and headers["Content-Type"] == "application/json"
    data = orjson.loads(body)
    assert {"running", "profiles", "in_flight", "counters", "relay"} <= set(data)
    assert data["running"] is True
    assert {p["handle"] for p in data["profiles"]} == {"hermes", "alice", "bob", "carol"}
    assert data["counters"]["accepted"] == 1


def test_status_and_events_of_a_root_whose_path_is_not_utf8_are_valid_json(tmp_path: Path,
                                                                          gateways: list[Gateway]) -> None:
    """Regression (cliedges): ``/status`` and ``/events`` encoded with plain ``orjson.dumps``: a lone surrogate (a
    root under a folder whose name is not UTF-8) failed the request (an empty reply, a WARNING with a traceback)
    and the live page. Both are written by the ``--json`` rule now (cli.render.json_text): ``\\udcff``."""
    root = make_root(tmp_path / os.fsdecode(b"h\xff"))
    gw = start_gateway(gateways, root)
    with OpsHttpServer(gw, HttpSettings("127.0.0.1", 0)) as server:
        status, headers, body = get(server.url + "status")
        assert status == 200 and headers["Content-Type"] == "application/json"
        assert orjson.loads(body)["root"] == str(root).replace("\udcff", "\\udcff")
        response = urllib.request.urlopen(server.url + "events", timeout=30)
        try:
            assert response.readline() == b"event: snapshot\n"
            data = response.readline()
        finally:
            response.close()
    assert data.startswith(b"data: ")
    assert orjson.loads(data[6:])["status"]["root"] == str(root).replace("\udcff", "\\udcff")


def test_the_page_is_self_contained(endpoint: OpsHttpServer) -> None:
    status, headers, body = get(endpoint.url)
    page = body.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert "EventSource(" in page and 'id="latency-chart"' in page
    assert "<script src" not in page and "http://" not in page and "https://" not in page
    assert re.findall(r"<link[^>]*>", page) == ['<link rel="icon" href="data:,">']  # an empty icon: no /favicon.ico


def test_unknown_path_is_404(endpoint: OpsHttpServer) -> None:
    status, _, body = get(endpoint.url + "nope")
    assert status == 404 and b"/metrics" in body


def test_without_a_token_only_loopback_host_names_are_answered(endpoint: OpsHttpServer) -> None:
    status, _, body = get(endpoint.url + "status", {"Host": "attacker.example:80"})  # a DNS-rebinding page
    assert status == 403 and b"loopback" in body
    assert get(endpoint.url + "status", {"Host": "localhost"})[0] == 200


def test_a_token_is_required_when_set(root: Path, gateways: list[Gateway]) -> None:
    gw = start_gateway(gateways, root)
    with OpsHttpServer(gw, HttpSettings("127.0.0.1", 0, TOKEN)) as server:
        for path in ("", "metrics", "status", "events"):
            status, headers, body = get(server.url + path)
            assert status == 401, path
            assert headers["WWW-Authenticate"].startswith("Bearer") and b"bearer token" in body
            assert get(server.url + path, {"Authorization": "Bearer wrong"})[0] == 401
            assert get(server.url + path, {"Cookie": f"{TOKEN_COOKIE}=wrong"})[0] == 401
        assert get(server.url + "?token=wrong")[0] == 401
        assert get(server.url + "?token=wrong", {"Cookie": f"{TOKEN_COOKIE}={TOKEN}"})[0] == 401  # no cookie swap
        assert get(server.url + f"status?token={TOKEN}")[0] == 401  # in the address only to open the page
        assert get(server.url + "status", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
        assert get(server.url + "metrics", {"Cookie": f"{TOKEN_COOKIE}={TOKEN}"})[0] == 200
        # opening /?token=... moves the token into an HttpOnly cookie and out of the address bar
        conn = http.client.HTTPConnection("127.0.0.1", int(server.url.rsplit(":", 1)[1].strip("/")), timeout=30)
        conn.request("GET", f"/?token={TOKEN}")
        response = conn.getresponse()
        assert response.status == 303 and response.headers["Location"] == "/"
        assert f"{TOKEN_COOKIE}={TOKEN}" in response.headers["Set-Cookie"]
        assert "HttpOnly" in response.headers["Set-Cookie"]
        conn.close()


@pytest.mark.parametrize(("header", "values"), [
    ("", []),
    (f"{TOKEN_COOKIE}=T", ["T"]),
    (f'prefs={{"theme":"dark"}}; {TOKEN_COOKIE}=T', ["T"]),  # a JSON cookie a strict parser stops at
    (f"x=a b; {TOKEN_COOKIE}=T", ["T"]),
    (f'{TOKEN_COOKIE}=T; prefs={{"a":1}}', ["T"]),
    (f'{TOKEN_COOKIE}="T"', ["T"]),
    (f"  {TOKEN_COOKIE} = T ;other=1", ["T"]),
    (f"{TOKEN_COOKIE}=a; {TOKEN_COOKIE}=b", ["a", "b"]),
    (f"x{TOKEN_COOKIE}=T; {TOKEN_COOKIE}x=T; {TOKEN_COOKIE}", []),  # other names, a pair without a value
    (f"{TOKEN_COOKIE}=a=b", ["a=b"]),
])
def test_the_token_cookie_is_found_among_any_other_pairs(header: str, values: list[str]) -> None:
    assert cookie_values(header, TOKEN_COOKIE) == values


def test_a_token_cookie_beside_a_cookie_a_strict_parser_refuses_is_accepted(root: Path,
                                                                           gateways: list[Gateway]) -> None:
    """Regression (review): SimpleCookie stops at the first pair it cannot parse, so another page's JSON cookie on
    the same host hid ours and the page answered 401 for the right token."""
    gw = start_gateway(gateways, root)
    with OpsHttpServer(gw, HttpSettings("127.0.0.1", 0, TOKEN)) as server:
        for cookie in (f'prefs={{"theme":"dark"}}; {TOKEN_COOKIE}={TOKEN}', f"x=a b; {TOKEN_COOKIE}={TOKEN}"):
            assert get(server.url + "status", {"Cookie": cookie})[0] == 200, cookie
        assert get(server.url + "status", {"Cookie": f'prefs={{"theme":"dark"}}; {TOKEN_COOKIE}=wrong'})[0] == 401


def _port(server: OpsHttpServer) -> int:
    return int(server.url.rstrip("/").rsplit(":", 1)[1])


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            out += chunk
    return out


def test_connections_beyond_the_cap_are_answered_503_at_once(root: Path, gateways: list[Gateway]) -> None:
    """Regression (review): every connection got a thread and a descriptor, without bound: slow clients could take
    them all (then the submit endpoint's accept failed, and a SIGTERM could not stop serve)."""
    gw = start_gateway(gateways, root)
    with (
        OpsHttpServer(gw, HttpSettings("127.0.0.1", 0), max_connections=2, request_head_seconds=600) as server,
        contextlib.ExitStack() as held,
    ):
        assert server._server is not None
        slow = [held.enter_context(socket.create_connection(("127.0.0.1", _port(server)), timeout=30))
                for _ in range(2)]
        for sock in slow:
            sock.sendall(b"GET /sta")  # and nothing more: each holds its connection's slot
        await_condition(lambda: server._server is not None and len(server._server._open) == 2, timeout=10,
                        message="both slow clients are being served")
        with socket.create_connection(("127.0.0.1", _port(server)), timeout=30) as third:
            third.sendall(b"GET /status HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            answer = _read_all(third)  # timeout=30: without the cap it would be served (200), not refused
        assert answer.startswith(b"HTTP/1.0 503 ") and b"Retry-After: 1" in answer, answer
        assert answer.endswith(b"\r\n\r\nbusy: 2 connections are being served; try again in a moment\n"), answer
        slow[0].sendall(b"tus HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")  # the first one finishes its request
        assert _read_all(slow[0]).startswith(b"HTTP/1.0 200 ")
        await_condition(lambda: server._server is not None and len(server._server._open) == 1, timeout=10,
                        message="its slot was given back")
        assert get(server.url + "status")[0] == 200  # served again


def _trickle_until_closed(port: int, give_up: float) -> float | None:
    """Send a request's head a byte at a time, whenever nothing is to be read, until the server closes the connection.

    Returns:
        The ``time.monotonic()`` at which the server's end was found closed; None when it was still open at ``give_up``.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /status HTTP/1.0\r\nHost: 127.0.0.1\r\nX-Slow: ")
        while time.monotonic() < give_up:
            readable, _, _ = select.select([sock], [], [], 0.05)  # the trickle's pace, far below the read timeout
            try:
                if readable:
                    if not sock.recv(65536):
                        return time.monotonic()
                else:
                    sock.send(b"a")
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic()
    return None


def test_a_client_trickling_its_request_head_is_cut_off_at_the_head_deadline(root: Path,
                                                                           gateways: list[Gateway]) -> None:
    """Regression (review): only each read had a timeout (10 s), so a byte a second held a thread and a descriptor
    for good."""
    gw = start_gateway(gateways, root)
    with OpsHttpServer(gw, HttpSettings("127.0.0.1", 0), max_connections=1, request_head_seconds=0.5) as server:
        closed_at = _trickle_until_closed(_port(server), give_up=time.monotonic() + 60)
        assert closed_at is not None, "the server kept a trickling connection open for 60 s"
        await_condition(lambda: server._server is not None and not server._server._open, timeout=10,
                        message="its slot was given back")
        assert get(server.url + "status")[0] == 200  # the only slot is free again


def test_a_request_sent_whole_in_time_is_served_and_may_stream_past_the_head_deadline(
    root: Path, gateways: list[Gateway]
) -> None:
    gw = start_gateway(gateways, root)
    with OpsHttpServer(gw, HttpSettings("127.0.0.1", 0), request_head_seconds=0.5, stream_interval=0.05) as server:
        response = urllib.request.urlopen(server.url + "events", timeout=30)
        deadline_passed = time.monotonic() + 1.0
        lines = 0
        while time.monotonic() < deadline_passed or lines < 3:  # status refreshes keep coming after the deadline
            line = response.readline()
            assert line, "the stream was cut"
            lines += line.startswith(b"event: ")
        response.close()


def test_an_accept_out_of_descriptors_backs_off_and_is_said_once(
    endpoint: OpsHttpServer, monkeypatch: pytest.MonkeyPatch, log_records: list[Any]
) -> None:
    """Regression (review): socketserver retried a failed accept at once, and the waiting connection kept the socket
    readable: the accept thread spun a core for as long as the process was out of descriptors, saying nothing."""
    from hermes_actors.ops import http_server

    server = endpoint._server
    assert server is not None
    real_accept = socket.socket.accept
    failures = {"left": 3}
    waits: list[int] = []

    def short_of_descriptors(sock: socket.socket) -> tuple[socket.socket, Any]:
        if sock is server.socket and failures["left"] > 0:
            failures["left"] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return real_accept(sock)

    real_backoff = http_server.accept_backoff

    def backoff(n: int) -> float:
        waits.append(n)
        return real_backoff(n)

    monkeypatch.setattr(socket.socket, "accept", short_of_descriptors)
    monkeypatch.setattr(http_server, "accept_backoff", backoff)
    assert get(endpoint.url + "status")[0] == 200  # its connection meets the three failures first
    assert failures["left"] == 0 and waits == [1, 2, 3]
    said = [r["message"] for r in log_records if "accept connections" in r["message"]
            or "accepting connections" in r["message"]]
    assert said == ["operator endpoint cannot accept connections ([Errno 24] Too many open files); retrying until it "
                    "can", "operator endpoint accepting connections again (after 3 failed accepts)"], said


def test_events_stream_outcomes_and_close_ends_the_stream(endpoint: OpsHttpServer) -> None:
    response = urllib.request.urlopen(endpoint.url + "events", timeout=30)
    assert response.headers["Content-Type"] == "text/event-stream"

    def next_event() -> tuple[str, Any]:
        name, data = "", None
        while True:
            line = response.readline().decode()
            assert line, "the stream ended"
            if line.startswith("event: "):
                name = line[7:].strip()
            elif line.startswith("data: "):
                data = orjson.loads(line[6:])
            elif line == "\n" and name:
                return name, data

    name, data = next_event()
    assert name == "snapshot" and data["recent"] == [] and {r["handle"] for r in data["roster"]} >= {"alice", "bob"}
    delivery_id = send_dm(endpoint.gateway, "hi there", target="bob", sender="alice")
    while True:
        name, data = next_event()
        if name == "outcome":
            break
    assert data["delivery_id"] == delivery_id and data["status"] == "replied"
    assert data["sender"] == "alice" and data["target"] == "bob" and data["latency_seconds"] >= 0
    assert "hi there" not in orjson.dumps(data).decode()  # never the message text
    closed = threading.Thread(target=endpoint.close)
    closed.start()
    assert response.read() is not None  # returns at EOF: close() ended the stream
    closed.join(30)
    assert not closed.is_alive()
    assert not [t for t in threading.enumerate() if t.name == "ops-http"]
    response.close()


def alice_answers_once() -> RecordingRunner:
    """A runner: in a room alice replies once, every other turn passes."""
    answered: list[str] = []

    def behave(turn: Turn) -> str:
        if turn.profile == "alice" and not answered:
            answered.append(turn.delivery_id)
            return "On it."
        return "[SILENT]"

    return RecordingRunner(behave)


def test_rooms_on_metrics_and_status_and_events(root: Path, gateways: list[Gateway]) -> None:
    gw = start_gateway(gateways, root, alice_answers_once())
    with OpsHttpServer(gw, HttpSettings("127.0.0.1", 0), stream_interval=0.2) as server:
        response = urllib.request.urlopen(server.url + "events", timeout=30)
        assert response.readline() == b"event: snapshot\n"  # the stream's start: every later event comes after
        room = gw.create_room("plan", ["alice", "bob"])
        assert gw.room_send("plan", "user", "Plan Friday, secretly")["status"] == "queued"
        assert gw.wait_room_idle("plan", timeout=30) == "idle"
        said = ("hermes_actors_room_messages_total", (("status", "said"),))

        def scraped() -> dict[Any, float] | None:
            now = samples(get(server.url + "metrics")[2].decode())
            return now if now.get(said) == 2 else None

        after = await_condition(scraped, timeout=30, interval=0.05, message="2 room messages counted")
        assert after[("hermes_actors_rooms", (("state", "idle"),))] == 1
        assert after[("hermes_actors_rooms", (("state", "busy"),))] == 0
        assert not [key for key in after if key[0] == "hermes_actors_deliveries_total"]  # no DM was sent
        status = orjson.loads(get(server.url + "status")[2])
        assert [(r["room_id"], r["state"], r["messages"]) for r in status["rooms"]] == [(room["room_id"], "idle", 2)]

        seen: list[dict[str, Any]] = []
        name = ""
        while not (seen and seen[-1].get("state") == "idle"):  # the stream carries the room's events in order
            line = response.readline().decode()
            assert line, "the stream ended"
            if line.startswith("event: "):
                name = line[7:].strip()
            elif line.startswith("data: ") and name == "room":
                seen.append(orjson.loads(line[6:]))
            assert "secretly" not in line and "On it." not in line  # never a message's text
        assert [e["event"] for e in seen] == ["message", "state", "message", "state"]
        assert [e.get("author") for e in seen if e["event"] == "message"] == ["user", "alice"]
        assert all(e["room_id"] == room["room_id"] and e["room"] == "plan" for e in seen)
        response.close()


def test_open_streams_are_capped(endpoint: OpsHttpServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(endpoint, "streams", threading.BoundedSemaphore(1))
    first = urllib.request.urlopen(endpoint.url + "events", timeout=30)
    assert first.readline().startswith(b"event: snapshot")  # the first stream holds the only slot
    status, headers, body = get(endpoint.url + "events")
    assert status == 503 and b"too many live pages" in body and headers["Retry-After"] == "10"
    first.close()


# ── the CLI ──────────────────────────────────────────────────────────────────

@pytest.mark.parametrize(("value", "says"), [
    ("nonsense", "'nonsense' is not a number"),
    ("127.0.0.1:70000", "out of range"),
    ("::1:80", "in brackets"),
    ("0.0.0.0:9464", "not loopback"),
])
def test_serve_refuses_bad_http_values_before_starting(value: str, says: str, root: Path,
                                                       capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert main(["serve", "--root", str(root), "--runner", "demo", "--http", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and says in err
    assert not (root / "bot_relay").exists()  # refused before the gateway started (it creates bot_relay/)


def test_serve_on_an_address_in_use_starts_nothing(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--root", str(root), "--runner", "demo", "--http", f"127.0.0.1:{port}"]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: cannot serve HTTP on http://127.0.0.1:{port}/: "), captured.err
    assert "gateway started" not in captured.err + captured.out
    assert not (root / "bot_relay").exists()  # no gateway started: it would have recovered and journaled there


def test_a_second_serve_on_the_first_ones_http_address_names_the_host_not_the_port(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Gateway(root, runner=lambda turn: "ok", serve_submit=True), socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # the first host's --http
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--root", str(root), "--runner", "demo", "--http", f"127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert f"already hosts the actors of {root}" in err and "Address already in use" not in err, err


def test_serve_refuses_a_token_without_http(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--root", str(root), "--runner", "demo", "--http-token", TOKEN]) == 2
    assert "--http-token needs --http" in capsys.readouterr().err


@contextlib.contextmanager
def serving(root: Path) -> Iterator[Any]:
    """``serve --http`` on ``root`` (an answering runner, port 0) in a thread: its endpoint while it runs; stopped on
    exit, with exit code 0."""
    from hermes_actors.cli.serve import serve

    ready: list[Any] = []
    up, stop = threading.Event(), threading.Event()
    result: list[int] = []

    def on_ready(endpoint: Any) -> None:
        ready.append(endpoint)
        up.set()

    thread = threading.Thread(target=lambda: result.append(serve(
        root, connection_id=None, runner=lambda turn: "ok", stop=stop, http=HttpSettings("127.0.0.1", 0),
        on_ready=on_ready)))
    thread.start()
    try:
        assert up.wait(60), "serve did not come up"
        yield ready[0]
    finally:
        stop.set()
        thread.join(60)
    assert result == [0]


def test_serve_with_http_serves_until_stopped(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serving(root) as endpoint:
        url = endpoint.url
        status, _, body = get(url + "status")
        assert status == 200 and orjson.loads(body)["running"] is True
    captured = capsys.readouterr()
    assert f"live page, /metrics and /status on {url}" in captured.out
    assert captured.err.splitlines()[-1] == "gateway stopped"  # the last word: the stop is over
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "status", timeout=5)


def test_serve_counts_and_shows_the_outcomes_its_start_settles(root: Path) -> None:
    """Review (opsfix): outcomes a ``serve`` start settled from the journal (a turn a killed gateway left
    running: ``ambiguous``; an outcome it never delivered: published again) were in ``settled_total`` but never in
    ``hermes_actors_deliveries_total`` nor the live page's recent outcomes: the endpoint subscribed after the start."""
    running, settled = "a" * 32, "b" * 32
    delivery = {"sender": "alice", "sender_handle": "alice", "target": "bob", "target_handle": "bob",
                "content": "hi", "author": {}, "hop": 1, "accepted_at": 1.0, "origin": "local", "label": "@bob",
                "wake": False}
    outcome = {"delivery_id": settled, "status": "replied", "reply": "ok", "error": "", "reason": "",
               "retryable": False, "from": "@bob", "text": "Reply from @bob: ok"}
    records = [{"t": "accepted", "id": running, "d": {**delivery, "delivery_id": running}},
               {"t": "started", "id": running, "attempt": 1},
               {"t": "accepted", "id": settled, "d": {**delivery, "delivery_id": settled}},
               {"t": "started", "id": settled, "attempt": 1},
               {"t": "finished", "id": settled, "o": outcome}]
    directory = root / "bot_relay" / "journal"  # the journal of a gateway killed -9
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    dead = directory / "j-deaddeaddeaddeaddeaddeaddeaddead.log"
    dead.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    dead.chmod(0o600)

    with serving(root) as endpoint:
        url = endpoint.url

        def counted() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
            return samples(get(url + "metrics")[2].decode())

        await_condition(lambda: counted().get(("hermes_actors_settled_total", ())) == 2, timeout=30,
                        message="the start never settled the two journaled DMs")
        await_condition(lambda: sum(v for (name, _), v in counted().items()
                                    if name == "hermes_actors_deliveries_total") == 2, timeout=30,
                        message="deliveries_total never counted what the start settled")
        statuses = {dict(labels)["status"]: v for (name, labels), v in counted().items()
                    if name == "hermes_actors_deliveries_total"}
        assert statuses == {"ambiguous": 1, "replied": 1}, statuses
        events, _ = endpoint.feed.snapshot()
        assert sorted((e["delivery_id"], e["status"]) for e in events) == [(running, "ambiguous"),
                                                                           (settled, "replied")], events


def test_an_idle_client_does_not_hold_the_close(root: Path, gateways: list[Gateway],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (review): close() joined every request thread, and one waiting for a client that sent half a
    request line held it for the handler's read timeout at each byte; serve closed it before stopping its gateway,
    so a slow client kept the stop (and the acks) going, and a second Ctrl-C meanwhile left serve running."""
    from hermes_actors.ops import http_server

    monkeypatch.setattr(http_server._Handler, "timeout", 600)  # without the cut, close() would wait this long
    gw = start_gateway(gateways, root)
    server = OpsHttpServer(gw, HttpSettings("127.0.0.1", 0)).start()
    assert server._server is not None
    with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1].rstrip("/"))), timeout=30) as idle:
        idle.sendall(b"GET /sta")  # and nothing more
        await_condition(lambda: server._server is not None and len(server._server._open) == 1, timeout=10,
                        message="the idle client's request thread is serving it")
        closer = threading.Thread(target=server.close)
        closer.start()
        closer.join(60)
        assert not closer.is_alive(), "close() waited for the idle client"
        idle.settimeout(10)
        assert idle.recv(100) == b"", "the idle connection was cut, not answered"


def test_a_client_gone_mid_request_is_logged_quietly_not_printed(
    endpoint: OpsHttpServer, capfd: pytest.CaptureFixture[str], logs: Any
) -> None:
    """Regression (review): a client that reset its connection printed the standard library's traceback on stderr."""
    server = endpoint._server
    assert server is not None
    for error in (ConnectionResetError(104, "Connection reset by peer"), BrokenPipeError(32, "Broken pipe")):
        try:
            raise error
        except OSError:
            server.handle_error(None, ("127.0.0.1", 1234))
    assert capfd.readouterr().err == "", "a client that went away is no error to print"
    try:
        raise ValueError("a bug in a handler")
    except ValueError:
        server.handle_error(None, ("127.0.0.1", 1234))
    assert any("a bug in a handler" in line for line in logs.lines), logs.lines  # through loguru, as a WARNING


@pytest.mark.parametrize("signame", ["SIGHUP", "SIGINT"])
def test_serve_with_an_idle_http_client_stops_cleanly_on_a_stop_signal(tmp_path: Path, signame: str) -> None:
    """Regressions (review): a SIGHUP (the terminal closing) killed serve outright, like a kill -9; and with an idle
    client on the HTTP endpoint serve waited for it before stopping its gateway (still acking DMs), with the
    signals back to their defaults, so a second Ctrl-C left it running for good."""
    import signal
    import subprocess
    import sys

    from hermes_actors.demo.bots import create_demo_root

    root = create_demo_root(tmp_path / "root")
    proc = subprocess.Popen([sys.executable, "-c", "from hermes_actors.cli.main import main; raise SystemExit(main())",
                             "serve", "--root", str(root), "--runner", "demo", "--http", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = ""
        for _ in range(5):
            line = proc.stdout.readline()
            if line.startswith("live page"):
                url = line.rsplit(" ", 1)[1].strip()
                break
        assert url, "serve printed its live page address"
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as idle:
            idle.sendall(b"GET /sta")  # a request that never ends
            proc.send_signal(getattr(signal, signame))
            _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "stopping the gateway" in err and "gateway stopped" in err, err
    assert "Traceback" not in err, err
    assert not (root / "bot_relay" / "run" / "submit.sock").exists()


def test_every_refusal_is_counted_once_by_reason(root: Path, gateways: list[Gateway],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (ops review): refusals made on the sender's thread (a first-hop DM whose journal write failed:
    a full disk) or after the Dispatcher answered (a journal commit that failed) were not counted; one from
    inside a turn must not count twice. Each is counted once, by reason, in stats() and on /metrics."""
    import errno
    import os

    asked: list[dict[str, Any]] = []

    def asks_nobody(turn: Turn) -> str:
        asked.append(turn.message_agent("nobody", "hi"))  # refused by the Dispatcher, from inside a turn
        return "ok"

    gw = start_gateway(gateways, root, runner=asks_nobody)
    journal = gw._journal
    assert journal is not None, "a durable gateway (the default)"
    full = {"on": False}
    real_pwrite = os.pwrite

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if full["on"] and fd == journal._file.fd:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    with OpsHttpServer(gw, HttpSettings("127.0.0.1", 0)) as server:
        unknown = gw.message_agent(sender="alice", target="nobody", message="x")  # the Dispatcher's admission
        full["on"] = True
        fast = gw.message_agent(sender="alice", target="bob", message="disk full")  # journaled on this thread
        deep = gw.message_agent(sender="alice", target="bob", message="disk full", hop=2)  # by the Dispatcher
        full["on"] = False
        assert "delivery_id" not in unknown and unknown["reason"] == "unknown", unknown
        for refused in (fast, deep):  # the disk, not the teammate: told apart by the reason (review)
            assert "delivery_id" not in refused and refused["reason"] == "runtime_offline", refused
        assert "No space left" in fast["error"] and "No space left" in deep["error"]
        ok = gw.message_agent(sender="alice", target="bob", message="disk freed")
        assert gw.wait_outcome(ok["delivery_id"], timeout=30)["status"] == "replied"
        assert len(asked) == 1 and asked[0]["reason"] == "unknown", asked
        stats = gw.stats()
        assert stats["refused"] == 4, stats
        assert stats["refused_by_reason"] == {"unknown": 2, "runtime_offline": 2}, stats
        scraped = samples(get(server.url + "metrics")[2].decode())
        assert scraped[("hermes_actors_refused_total", (("reason", "unknown"),))] == 2
        assert scraped[("hermes_actors_refused_total", (("reason", "runtime_offline"),))] == 2
        assert scraped[("hermes_actors_accepted_total", ())] == 1
