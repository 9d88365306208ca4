"""Starting on the Redis transport: what ``start()`` guarantees and how it refuses (issue 14, item 8).

- the remote roster is loaded when ``start()`` returns (a DM right after it reaches another machine);
- Redis down at start: DMs to other machines are refused "Redis at host:port is unreachable";
- one process per connection id (a lease on the alive key), a dead holder on this host taken over;
- refused credentials and a missing ``[redis]`` extra fail the start with one clear error.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from redis_fixture import BlackHole, RedisServer, dead_consumer
from roots import LogCapture, RecordingRunner, make_root, wait_online

from actors.testkit import await_condition
from hermes_actors import Gateway, TransportError
from hermes_actors.transports.redis.heartbeat import Heartbeat
from hermes_actors.transports.redis.lease import is_stale_here, parse_consumer
from hermes_actors.transports.redis.store import GROUP, RedisKeys, consumer_name, host_label, redis_settings

pytestmark = pytest.mark.redis
KEYS = RedisKeys()


def _config(url: str, **bot_mode: Any) -> dict[str, Any]:
    return {"bot_mode": {"transport": url, "redis_heartbeat_seconds": 0.2, "redis_claim_idle_seconds": 0.5,
                         **bot_mode}}


def _gateway(tmp: Path, name: str, url: str, *, connection_id: str | None = None,
             bot_mode: dict[str, Any] | None = None) -> Gateway:
    root = tmp / name
    if not root.exists():
        make_root(tmp, {"alice": {}, "bob": {}}, name=name)
    return Gateway(root, runner=RecordingRunner(), config=_config(url, **(bot_mode or {})),
                   connection_id=connection_id if connection_id is not None else name, durable=False)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed when this returns: nothing listens there


# ── the remote roster is there when start() returns ─────────────────────────


def test_a_dm_right_after_start_reaches_an_agent_on_another_machine(tmp_path: Path,
                                                                    redis_server: RedisServer) -> None:
    with _gateway(tmp_path, "mini", redis_server.url):
        for attempt in range(5):  # each new start must see mini's roster before it returns
            alpha = _gateway(tmp_path, "alpha", redis_server.url).start()
            try:
                ack = alpha.message_agent(sender="alice", target="bob@mini", message=f"first words {attempt}")
                assert ack.get("status") == "queued", ack
                out = alpha.wait_outcome(ack["delivery_id"], timeout=20)
                assert out["status"] == "replied", out
            finally:
                alpha.stop()


def test_redis_down_at_start_refuses_remote_dms_as_unreachable(tmp_path: Path) -> None:
    port = _closed_port()
    with _gateway(tmp_path, "alpha", f"redis://127.0.0.1:{port}/0") as alpha:
        ack = alpha.message_agent(sender="alice", target="dave@mini", message="hello")
        assert ack["reason"] == "runtime_offline", ack
        assert f"Redis at 127.0.0.1:{port} is unreachable, so it was NOT queued" in ack["error"]
        local = alpha.message_agent(sender="alice", target="bob", message="local still works")
        assert alpha.wait_outcome(local["delivery_id"], timeout=20)["status"] == "replied"
        unknown = alpha.message_agent(sender="alice", target="nobody", message="hi")
        assert unknown["reason"] == "unknown" and "No teammate named 'nobody'" in unknown["error"]


def test_redis_back_after_a_down_start_clears_the_unreachable_refusal(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    server.port = _closed_port()  # started later on this very port
    with _gateway(tmp_path, "alpha", server.url) as alpha:
        assert "unreachable" in alpha.message_agent(sender="alice", target="bob@mini", message="x")["error"]
        server.start()
        try:
            with _gateway(tmp_path, "mini", server.url):
                def reachable() -> bool:
                    ack = alpha.message_agent(sender="alice", target="bob@mini", message="now?")
                    return ack.get("status") == "queued"

                await_condition(reachable, timeout=20, interval=0.1, message="bob@mini reachable once Redis is up")
        finally:
            server.kill()


def test_a_redis_that_accepts_connections_but_never_answers_keeps_stats_start_and_stop_short(
        tmp_path: Path, black_hole_redis: BlackHole) -> None:
    """Regression (diffrev16): against a black hole (a Redis that accepts TCP connections and never answers) the
    transport actor waited 6 s in each command (3 s socket timeout, retried once), its ticks piled up behind
    them, and ``stats()`` (so /metrics, /status and the host's status) hung 30 s and failed; start took 24 s,
    stop 10 s. Each command now waits 3 s at most (no retry after a timeout) and a down Redis is probed once a
    tick, so stats answers behind at most one probe; start and stop are bounded generously (a loaded machine)."""
    alpha = _gateway(tmp_path, "alpha", black_hole_redis.url)
    try:
        began = time.monotonic()
        alpha.start()
        started_in = time.monotonic() - began
        for _ in range(3):  # later asks too: the ticks do not pile up while it lasts
            began = time.monotonic()
            relay = alpha.stats()["relay"]
            assert time.monotonic() - began < 10, "stats() waited on the black hole"
            assert relay["reachable"] is False, relay
        began = time.monotonic()
        alpha.stop()
        assert time.monotonic() - began < 20, "stop() waited on the black hole"
        assert started_in < 20, f"start() took {started_in:.1f}s"
    finally:
        alpha.stop()


def test_the_start_waits_for_a_redis_that_never_answers_once_not_once_per_call(
        tmp_path: Path, black_hole_redis: BlackHole, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (redisstart): against a Redis that accepts connections and never answers, ``Gateway.start()``
    took 9 s: the lease claim, the transport's first beat and its first probe each waited one answer timeout (3 s),
    one after the other. The first that finds Redis unreachable now decides for the whole start: one wait, and
    the start goes on as with Redis down (DMs to other machines refused as unreachable, the ticks probe it)."""
    import redis.connection

    waits: list[str] = []  # the start's Redis calls that waited for an answer and got none (by thread)
    real_read_response = redis.connection.AbstractConnection.read_response

    def recording_read_response(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return real_read_response(self, *args, **kwargs)
        except redis.exceptions.TimeoutError:
            waits.append(threading.current_thread().name)
            raise

    monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", recording_read_response)
    alpha = _gateway(tmp_path, "alpha", black_hole_redis.url)
    try:
        alpha.start()
        on_the_start = [name for name in list(waits)  # the reader's and the heartbeat's own threads wait apart
                        if not name.startswith(("redis-reader-", "redis-heartbeat-"))]
        assert len(on_the_start) == 1, on_the_start
        ack = alpha.message_agent(sender="alice", target="bob@mini", message="hello")
        assert ack["reason"] == "runtime_offline" and "unreachable, so it was NOT queued" in ack["error"], ack
        assert alpha.stats()["relay"]["reachable"] is False
    finally:
        alpha.stop()


def _claim_finds_redis_slow(monkeypatch: pytest.MonkeyPatch, hole: BlackHole) -> None:
    """The start's lease claim alone meets a Redis that does not answer (its one call is sent to ``hole``)."""
    import dataclasses

    from hermes_actors.transports.redis import lease

    real_claim = lease.claim_connection

    def claim_on_a_slow_redis(settings: Any, *args: Any, **kwargs: Any) -> bool:
        return real_claim(dataclasses.replace(settings, url=hole.url), *args, **kwargs)

    monkeypatch.setattr(lease, "claim_connection", claim_on_a_slow_redis)


def _last_read(client: Any, stream: str) -> str:
    """The id of the last entry our consumer group on ``stream`` handed to a reader."""
    return next(g for g in client.xinfo_groups(stream) if g["name"] == GROUP.encode())["last-delivered-id"].decode()


def test_a_start_that_found_redis_slow_reads_no_inbox_until_a_beat_confirms_the_lease(
        tmp_path: Path, redis_server: RedisServer, black_hole_redis: BlackHole,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (redislease): the lease claim at start timed out (a Redis slow at that moment: here the claim alone
    is sent to a black hole) while another live process held our connection id's lease. The transport then started
    without its first beat (one wait per start), so nothing had checked the lease: its reader read our inbox at once
    and its first tick, Redis answering again, reclaimed the inbox's pending entries, for up to one heartbeat period:
    DMs run by the wrong process, maybe twice. Now the inbox is neither read nor reclaimed until a beat has found
    the lease ours; the replies stream still is, and the first tick's probe finds Redis up again (not down for
    good)."""
    _claim_finds_redis_slow(monkeypatch, black_hole_redis)
    holder = "elsewhere-1-abcdefgh"  # a live gateway on another machine serves connection id alpha
    client = redis_server.client()
    client.set(KEYS.alive("alpha"), holder, ex=600)
    inbox, replies = KEYS.inbox("alpha"), KEYS.replies("alpha")
    for stream in (inbox, replies):
        client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    held = client.xadd(inbox, {"x": "held by the holder"}).decode()
    client.xreadgroup(GROUP, holder, {inbox: ">"}, count=1)
    client.xclaim(inbox, GROUP, holder, 0, [held], idle=3_600_000)  # idle past any claim idle: reclaimable
    client.xadd(inbox, {"x": "new for the holder"})
    reply = client.xadd(replies, {"x": "a reply"}).decode()

    alpha = _gateway(tmp_path, "alpha", redis_server.url, bot_mode={"redis_heartbeat_seconds": 600})
    try:
        alpha.start()  # the claim found Redis unreachable: the start goes on
        await_condition(lambda: _last_read(client, replies) == reply, timeout=20,
                        message="the reader read the replies")
        # the first tick's probe found Redis answering and ran the tick's work, reclaim included, before this ask
        await_condition(lambda: alpha.stats()["relay"]["reachable"], timeout=20, message="Redis up again")
        assert _last_read(client, inbox) == held, "the inbox was read without the lease"
        pending = client.xpending_range(inbox, GROUP, min="-", max="+", count=10)
        assert [(p["message_id"].decode(), p["consumer"].decode()) for p in pending] == [(held, holder)]
    finally:
        alpha.stop()



def test_a_start_that_found_redis_slow_reads_its_inbox_once_its_first_beat_finds_the_lease_ours(
        tmp_path: Path, redis_server: RedisServer, black_hole_redis: BlackHole,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (redislease): the inbox is read only once a beat found the lease ours, and a start whose claim
    found Redis unreachable makes no beat of its own: the heartbeat thread's first beat was one period on (5 s by
    default; here 600 s: never in this test). It now beats at once, off the start thread."""
    _claim_finds_redis_slow(monkeypatch, black_hole_redis)
    client = redis_server.client()
    inbox = KEYS.inbox("alpha")
    client.xgroup_create(inbox, GROUP, id="0", mkstream=True)
    waiting = client.xadd(inbox, {"x": "for alpha"}).decode()
    alpha = _gateway(tmp_path, "alpha", redis_server.url, bot_mode={"redis_heartbeat_seconds": 600})
    try:
        alpha.start()
        await_condition(lambda: _last_read(client, inbox) == waiting, timeout=20, message="the inbox read")
        assert client.get(KEYS.alive("alpha")) is not None
    finally:
        alpha.stop()


# ── one process per connection id ───────────────────────────────────────────


def test_a_second_gateway_on_the_same_connection_id_is_refused(tmp_path: Path, redis_server: RedisServer) -> None:
    client = redis_server.client()
    with _gateway(tmp_path, "alpha", redis_server.url):
        holder = client.get(KEYS.alive("alpha"))
        assert holder is not None
        other = _gateway(tmp_path, "beta", redis_server.url, connection_id="alpha")
        with pytest.raises(TransportError) as err:
            other.start()
        text = str(err.value)
        assert "connection id 'alpha' is already served by another live process" in text
        assert holder.decode() in text and "--connection-id" in text
        assert client.get(KEYS.alive("alpha")) == holder  # the refused one neither stole nor deleted the lease
        other.stop()
        assert client.get(KEYS.alive("alpha")) == holder
    assert client.get(KEYS.alive("alpha")) is None  # a clean stop gives the lease back
    with _gateway(tmp_path, "beta", redis_server.url, connection_id="alpha"):
        assert client.get(KEYS.alive("alpha")) is not None


def test_a_lease_left_by_a_killed_process_on_this_host_is_taken_over(tmp_path: Path,
                                                                     redis_server: RedisServer) -> None:
    stale = dead_consumer()
    client = redis_server.client()
    client.set(KEYS.alive("alpha"), stale, ex=600)  # as if that process had been killed -9 a moment ago
    with _gateway(tmp_path, "alpha", redis_server.url) as alpha:
        assert client.get(KEYS.alive("alpha")).decode() != stale
        ack = alpha.message_agent(sender="alice", target="bob", message="hi")
        assert alpha.wait_outcome(ack["delivery_id"], timeout=20)["status"] == "replied"


def test_a_dead_holders_lease_is_taken_over_when_redis_is_back_after_a_start_without_it(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Regression (chaos review): gateway A killed -9, Redis killed, gateway B started on A's connection id while
    Redis was down, Redis back (AOF). B's heartbeat logged ERROR "held by another process … stop one of them" of
    A's dead process and B read none of its inbox until A's lease expired: the start takes a dead holder's lease
    over, the heartbeat only took a free one. Now the heartbeat applies the start's rule."""
    stale = dead_consumer()
    client = redis_server.client()
    # A, killed -9: a beat takes over a lease only once it ran below half its expiry unrefreshed (a live holder in
    # another pid namespace looks dead too); without an expiry it is past that bound however slow this machine is
    client.set(KEYS.alive("alpha"), stale)
    client.close()
    redis_server.kill()  # appendfsync always: the restart replays A's lease
    with LogCapture("INFO") as logs, _gateway(tmp_path, "alpha", redis_server.url) as alpha:
        redis_server.start()
        client = redis_server.client()
        await_condition(lambda: client.get(KEYS.alive("alpha")) not in (None, stale.encode()), timeout=30,
                        message="the restarted gateway took the dead process's lease over")
        with _gateway(tmp_path, "mini", redis_server.url) as mini:
            wait_online(mini, "bob", "alpha")
            ack = mini.message_agent(sender="alice", target="bob@alpha", message="are you reading your inbox?")
            assert ack.get("status") == "queued", ack
            assert mini.wait_outcome(ack["delivery_id"], timeout=30)["status"] == "replied"
        assert alpha.running
    assert logs.matching("is held by another process") == [], logs.lines
    assert logs.matching("connection alpha was held by", stale, "taking it over"), logs.lines


def test_a_beat_takes_over_no_live_holder_and_says_when_the_lost_lease_is_ours_again(
    redis_server: RedisServer,
) -> None:
    """Regression (chaos review): a lease lost to another holder and then ours again was taken back by a beat
    without a word (the ERROR said "reads none of its inbox"; nothing said it reads it again). A holder on this
    host whose process runs, or one on another host, is never taken over by a beat."""
    settings = redis_settings({"bot_mode": {"redis_heartbeat_seconds": 600}}, redis_server.url)  # beat() only
    client = redis_server.client()
    live_here = consumer_name()  # this test's own pid: a running process
    with LogCapture("INFO") as logs:
        beat = Heartbeat(settings, KEYS, "mini", consumer_name()).start()  # start() beats once too
        try:
            for holder in (live_here, "elsewhere-1-abcdefgh"):
                client.set(KEYS.alive("mini"), holder, ex=600)
                assert beat.beat() is False and beat.lease_lost
                assert client.get(KEYS.alive("mini")) == holder.encode(), "a live holder keeps its lease"
                client.delete(KEYS.alive("mini"))  # its lease lapsed
                assert beat.beat() is True and not beat.lease_lost
                assert client.get(KEYS.alive("mini")) == beat.consumer.encode()
        finally:
            beat.stop()
    assert len(logs.matching(KEYS.alive("mini"), "is held by another process")) == 2, logs.lines
    assert len(logs.matching(KEYS.alive("mini"), "is this gateway's lease again", "reads its inbox")) == 2, \
        logs.lines
    assert logs.matching("taking it over") == [], logs.lines


def test_a_beat_never_takes_a_lease_its_holder_refreshes_though_its_pid_looks_dead(redis_server: RedisServer) -> None:
    """Regression (diffrev16): two live gateways on one connection id, one in another pid namespace (a container
    sharing the host name), each saw the other's pid as dead and took the lease from the other at every beat:
    both read the inbox in turn, and no ERROR said so. A beat now takes over a dead-looking holder only once its
    lease ran below half its expiry (it stopped refreshing it); until then it says so (a WARNING), and once the
    holder kept it a whole expiry, the ERROR of a second process, naming the pid namespace."""
    settings = redis_settings({"bot_mode": {"redis_heartbeat_seconds": 600}}, redis_server.url)  # beat() only
    expiry_ms = round(settings.heartbeat_ttl_seconds * 1000)
    half = expiry_ms // 2  # a live holder refreshes every beat, a third of the expiry: never below two thirds
    other = dead_consumer()  # how a live gateway in another pid namespace looks from here
    alive = KEYS.alive("mini")
    now = [0.0]  # the heartbeat's clock: how long the lease has been the other's
    client = redis_server.client()
    with LogCapture("INFO") as logs:
        beat = Heartbeat(settings, KEYS, "mini", consumer_name(), clock=lambda: now[0]).start()
        try:
            for _ in range(4):  # two expiries' worth of beats; the other refreshes its lease between them
                client.set(alive, other, px=expiry_ms)
                assert beat.beat() is False and beat.lease_lost
                assert client.get(alive) == other.encode(), "a holder that refreshes its lease keeps it"
                now[0] += settings.heartbeat_ttl_seconds / 2
            assert logs.matching("taking it over") == [], logs.lines
            assert len(logs.matching(alive, other, "whose pid does not run on this host", "killed a moment ago",
                                     "another pid namespace")) == 1, logs.lines
            assert len(logs.matching(alive, "is held by another process", other, "another pid namespace",
                                     "stop one of them")) == 1, logs.lines
            client.pexpire(alive, half + 60_000)  # refreshed a minute late: not overdue yet
            assert beat.beat() is False and client.get(alive) == other.encode()
            client.pexpire(alive, half - 60_000)  # not refreshed for over 1.5 beats: it stopped
            assert beat.beat() is True and not beat.lease_lost
            assert client.get(alive) == beat.consumer.encode()
        finally:
            beat.stop()
    assert len(logs.matching("connection mini was held by", other, "taking it over")) == 1, logs.lines
    assert logs.matching(alive, "is this gateway's lease again"), logs.lines


def test_a_live_lease_of_another_host_is_not_taken_over(tmp_path: Path, redis_server: RedisServer) -> None:
    client = redis_server.client()
    client.set(KEYS.alive("alpha"), "elsewhere-1-abcdefgh", ex=600)
    with pytest.raises(TransportError, match="elsewhere-1-abcdefgh"):
        _gateway(tmp_path, "alpha", redis_server.url).start()
    assert client.get(KEYS.alive("alpha")) == b"elsewhere-1-abcdefgh"


@pytest.mark.parametrize(
    ("holder", "host", "alive", "stale"),
    [
        ("box-12-abcdefgh", "box", False, True),
        ("box-12-abcdefgh", "box", True, False),  # still running
        ("box-12-abcdefgh", "other", False, False),  # another machine: its pid says nothing here
        ("my-box-7-abcdefgh", "my-box", False, True),  # a host name with dashes
        ("expired", "box", False, False),
        ("box-x-abcdefgh", "box", False, False),
        ("", "box", False, False),
    ],
)
def test_stale_holder_table(holder: str, host: str, alive: bool, stale: bool) -> None:
    assert is_stale_here(holder, host, lambda pid: alive) is stale


def test_consumer_names_parse_back() -> None:
    assert parse_consumer(consumer_name(pid=4321)) == (host_label(), 4321)


# ── start refusals ───────────────────────────────────────────────────────────


def test_a_wrong_password_fails_the_start_with_a_clear_error(tmp_path: Path) -> None:
    pytest.importorskip("redis")
    server = RedisServer(tmp_path / "redis", password="right-one")
    try:
        server.start()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    try:
        for url in (f"redis://:wrong-one@127.0.0.1:{server.port}/0", f"redis://127.0.0.1:{server.port}/0"):
            gw = _gateway(tmp_path, "alpha", url)
            with pytest.raises(TransportError) as err:
                gw.start()
            text = str(err.value)
            assert f"Redis at 127.0.0.1:{server.port} refused our credentials" in text, text
            assert "wrong-one" not in text  # never the password
        gw = _gateway(tmp_path, "alpha", f"redis://127.0.0.1:{server.port}/0")
        with pytest.raises(TransportError) as err:
            gw.start()
        # Regression (review): a URL without a password said "(HELLO must be called with the client already
        # authenticated, otherwise the HELLO AUTH <user> <pass> option can be used …)": redis-py's words
        assert "(it requires a password and the URL names none)" in str(err.value), str(err.value)
        assert "HELLO" not in str(err.value) and "Fix the user/password in the Redis URL" in str(err.value)
        with _gateway(tmp_path, "alpha", f"redis://:right-one@127.0.0.1:{server.port}/0") as ok:
            assert ok.message_agent(sender="alice", target="bob", message="in")["status"] == "queued"
    finally:
        server.kill()


def test_a_database_index_the_server_lacks_fails_the_start_saying_to_fix_it_in_the_url(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Regression (review): only "Redis at … refused the start (DB index is out of range)", nothing on the fix."""
    gw = _gateway(tmp_path, "alpha", redis_server.url.rpartition("/")[0] + "/99")
    with pytest.raises(TransportError) as err:
        gw.start()
    text = str(err.value)
    assert f"Redis at 127.0.0.1:{redis_server.port} refused the start (DB index is out of range)" in text, text
    assert "fix the database index in the Redis URL" in text and "/99: the /N at its end" in text, text
    assert not gw.running


def test_without_the_redis_extra_the_start_says_which_extra_to_install(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)  # `import redis` raises ImportError, as when not installed
    gw = _gateway(tmp_path, "alpha", "redis://127.0.0.1:6379/0")
    with pytest.raises(TransportError, match=r"pip install 'hermes-actors\[redis\]'"):
        gw.start()


def test_the_connection_id_may_come_from_config_and_is_checked(tmp_path: Path, redis_server: RedisServer) -> None:
    client = redis_server.client()
    with _gateway(tmp_path, "alpha", redis_server.url, connection_id="",
                  bot_mode={"connection_id": "from-config"}) as gw:
        assert gw.connection_id == "from-config" and client.get(KEYS.alive("from-config")) is not None
    with pytest.raises(ValueError, match="needs this gateway's connection id") as err:
        _gateway(tmp_path, "alpha", redis_server.url, connection_id="").start()
    assert "--connection-id" in str(err.value) and "bot_mode.connection_id" in str(err.value)
    with pytest.raises(ValueError, match="connection id 'two words' must be"):
        _gateway(tmp_path, "alpha", redis_server.url, connection_id="two words").start()


# ── the CLI on Redis ─────────────────────────────────────────────────────────


def test_cli_roster_and_send_use_redis_with_a_connection_id(tmp_path: Path, redis_server: RedisServer,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from hermes_actors.cli.main import main

    cli_root = make_root(tmp_path, {"alice": {}}, name="laptop")
    with _gateway(tmp_path, "mini", redis_server.url):
        assert main(["roster", "--root", str(cli_root), "--redis", redis_server.url, "--connection-id", "laptop",
                     "--json"]) == 0
        rows = orjson.loads(capsys.readouterr().out)
        assert {(r["handle"], r["connection_id"], r["online"]) for r in rows} >= {("bob", "mini", True)}
        code = main(["send", "--root", str(cli_root), "--from", "alice", "bob@mini", "over redis", "--redis",
                     redis_server.url, "--connection-id", "laptop", "--wait", "30"])
        out = capsys.readouterr().out
        assert code == 0, out
        assert "ok: over redis" in out


def test_cli_reads_the_transport_and_connection_id_from_config_yaml(tmp_path: Path, redis_server: RedisServer,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from hermes_actors.cli.main import main

    with_id = make_root(tmp_path, {"alice": {}}, name="laptop",
                        config={"bot_mode": {"transport": redis_server.url, "connection_id": "laptop"}})
    without_id = make_root(tmp_path, {"alice": {}}, name="tablet", config={"bot_mode": {"transport": redis_server.url}})
    with _gateway(tmp_path, "mini", redis_server.url):
        assert main(["roster", "--root", str(with_id), "--json"]) == 0
        assert any(r["connection_id"] == "mini" for r in orjson.loads(capsys.readouterr().out))
        assert main(["roster", "--root", str(without_id)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--connection-id" in err and "Gateway(" in err


def test_cli_roster_without_a_host_reads_redis_and_writes_nothing_there(
        tmp_path: Path, redis_server: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression (archrev): `roster` with no host started a gateway on the connection to list it: it took the
    connection's lease, published its roster (other machines then listed its agents) and read its inbox, and
    against a Redis that never answers it took 18.9 s. It now reads the roster once, as `status` does."""
    from hermes_actors.cli.main import main

    root = make_root(tmp_path, {"alice": {}}, name="laptop",
                     config={"bot_mode": {"transport": redis_server.url, "connection_id": "laptop"}})
    client = redis_server.client()
    with _gateway(tmp_path, "mini", redis_server.url):
        assert main(["roster", "--root", str(root), "--json"]) == 0
        rows = orjson.loads(capsys.readouterr().out)
        assert ("bob", "mini", True) in {(r["handle"], r["connection_id"], r["online"]) for r in rows}
        assert ("alice", None, True) in {(r["handle"], r["connection_id"], r["online"]) for r in rows}
    assert sorted(key.decode() for key in client.scan_iter(match="*laptop*")) == []


def test_cli_roster_asks_the_running_host_instead_of_joining_its_connection(
        tmp_path: Path, redis_server: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    from hermes_actors.cli.main import main

    root = make_root(tmp_path, {"alice": {}, "bob": {}}, name="alpha",
                     config={"bot_mode": {"transport": redis_server.url, "connection_id": "alpha"}})
    with _gateway(tmp_path, "mini", redis_server.url), \
            Gateway(root, runner=RecordingRunner(), durable=False, serve_submit=True,
                    config=_config(redis_server.url)) as host:
        assert host.connection_id == "alpha"
        assert main(["roster", "--root", str(root), "--json"]) == 0  # a second process on 'alpha' would be refused
        rows = orjson.loads(capsys.readouterr().out)
        assert any(r["handle"] == "bob" and r["connection_id"] == "mini" for r in rows)


def test_cli_serve_without_the_redis_extra_prints_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from hermes_actors.cli.main import main

    root = make_root(tmp_path, {"alice": {}}, name="alpha")
    monkeypatch.setitem(sys.modules, "redis", None)
    code = main(["serve", "--root", str(root), "--redis", "redis://127.0.0.1:6379/0", "--connection-id", "alpha",
                 "--runner", "demo"])
    err = capsys.readouterr().err.strip()
    assert code == 1  # a failure, not a usage error (docs/operations.md, exit codes)
    assert err.splitlines() == ["error: the Redis transport needs the redis package, which is not installed: "
                                "pip install 'hermes-actors[redis]'"]


def test_a_certificate_that_does_not_verify_fails_the_start_with_a_clear_error() -> None:
    """Regression: `rediss://` to a server whose certificate does not verify started, then refused every remote DM
    as "Redis … is unreachable … Retry once Redis is back" — which no retry cures; the cause was only in a log."""
    import ssl

    redis = pytest.importorskip("redis")
    from dataclasses import replace

    from hermes_actors.transports.redis.lease import claim_connection, is_certificate_error
    from hermes_actors.transports.redis.store import RedisSettings

    def refused() -> BaseException:  # what redis-py raises: its ConnectionError, from the ssl error
        try:
            try:
                raise ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
                                                      "self-signed certificate (_ssl.c:1006)")
            except OSError as exc:
                raise redis.exceptions.ConnectionError(f"Error 1 connecting to 127.0.0.1:6390. {exc}.") from exc
        except redis.exceptions.ConnectionError as exc:
            return exc

    class Client:
        def register_script(self, script: str) -> Any:
            raise refused()

    settings = RedisSettings(url="rediss://:secret@127.0.0.1:6390/0", claim_idle_seconds=60, max_stream_len=1000,
                             heartbeat_seconds=1, prefix="hermes", block_ms=200, connection_label="")
    with pytest.raises(TransportError) as err:
        claim_connection(settings, "alpha", "host:1", client=Client())
    text = str(err.value)
    assert "Redis at 127.0.0.1:6390: its TLS certificate did not verify" in text, text
    assert "rediss://:***@127.0.0.1:6390/0?ssl_ca_certs=/path/to/ca.pem" in text, text
    assert "nothing was started" in text and "secret" not in text
    for url, fix in (
        ("rediss://127.0.0.1:6390/0?socket_timeout=3", "/0?socket_timeout=3&ssl_ca_certs=/path/to/ca.pem"),
        ("rediss://127.0.0.1:6390/0?ssl_ca_certs=/etc/ca.pem", "did not sign it, or the certificate is not"),
    ):
        with pytest.raises(TransportError, match="did not verify") as err:
            claim_connection(replace(settings, url=url), "alpha", "host:1", client=Client())
        assert fix in str(err.value), str(err.value)
    outage = redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused.")
    assert [is_certificate_error(refused()), is_certificate_error(outage)] == [True, False]  # an outage still retries
