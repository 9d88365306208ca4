"""The Redis Streams transport against a real redis-server: gateways in this process.

(The multi-process tests are in ``test_redis_processes.py``; the pure key/record
helpers are tested at the end of this file.)
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from loguru import logger
from redis_fixture import RedisServer, fake_connection
from relay_helpers import seed_envelope
from roots import LogCapture, RecordingRunner, make_root, wait_online

from actors.testkit import await_condition
from hermes_actors import Gateway, TransportError, TurnFailed
from hermes_actors.core.authors import local_origin
from hermes_actors.core.config import deep_merge
from hermes_actors.core.hops import MAX_HOP
from hermes_actors.core.wake import wake_id
from hermes_actors.errors import ValidationError
from hermes_actors.messages import Turn
from hermes_actors.store.relay_inbox import InboxPaths, write_delivered
from hermes_actors.store.relay_marks import keep_reply, kept_reply
from hermes_actors.store.relay_protocol import make_envelope, make_reply
from hermes_actors.store.relay_shelf import LOCK_NAME, SHELF_PREFIX
from hermes_actors.transports.peer_cli import PeerCliTransport
from hermes_actors.transports.redis.store import (
    KnownRoster,
    RedisKeys,
    decode_envelope_entry,
    encode_envelope_entry,
    mask_url,
    parse_remote_rows,
    redis_settings,
    redis_url_from_config,
    redis_url_problem,
    remembered_rosters,
    roster_expiry,
    server_address,
)

pytestmark = pytest.mark.redis
KEYS = RedisKeys()


def _config(server: RedisServer, **bot_mode: Any) -> dict[str, Any]:
    base = {"transport": server.url, "redis_heartbeat_seconds": 0.2, "redis_claim_idle_seconds": 0.5}
    return {"bot_mode": {**base, **bot_mode}}


@contextmanager
def gateway(tmp: Path, name: str, server: RedisServer, runner: Any = None, *, profiles: dict[str, Any] | None = None,
            config: dict[str, Any] | None = None, **kwargs: Any) -> Iterator[Gateway]:
    root = make_root(tmp, profiles if profiles is not None else {"alice": {}, "bob": {}}, name=name)
    cfg = deep_merge(_config(server), config or {})
    with Gateway(root, runner=runner or RecordingRunner(), config=cfg, connection_id=name,
                 **{"durable": False, **kwargs}) as gw:
        yield gw


def inject(server: RedisServer, target_conn: str, reply_to: str, *, profile: str = "bob", created: float | None = None,
           envelope_id: str | None = None) -> dict[str, Any]:
    """XADD an envelope as a gateway on ``reply_to`` would."""
    target = parse_remote_rows(target_conn, {b"x": orjson.dumps({"profile": profile, "handle": profile,
                                                                  "connection_id": target_conn})}, True)[0]
    envelope = make_envelope(target=target, message=f"Message from 🤖 probe (@probe): hello {profile}",
                             sender_profile="probe", sender_handle="probe",
                             now=time.time() if created is None else created, envelope_id=envelope_id)
    server.client().xadd(KEYS.inbox(target_conn), encode_envelope_entry(envelope, reply_to))
    return envelope


def await_drained(server: RedisServer, *streams: str, timeout: float = 20) -> None:
    """Wait until each stream is empty with nothing pending: no entry is left that could run a turn again."""
    client = server.client()

    def drained() -> bool:
        return all(client.xlen(s) == 0 and client.xpending(s, "hermes")["pending"] == 0 for s in streams)

    await_condition(drained, timeout=timeout, interval=0.02, message=f"{streams} drained, nothing pending")


def replies_to(server: RedisServer, conn: str) -> list[dict[str, Any]]:
    return [orjson.loads(fields[b"reply"]) for _id, fields in server.client().xrange(KEYS.replies(conn))]


# ── the basic path ──────────────────────────────────────────────────────────


def test_round_trip_roster_and_outcome(tmp_path: Path, redis_server: RedisServer) -> None:
    rec = RecordingRunner()
    with gateway(tmp_path, "alpha", redis_server) as alpha, gateway(tmp_path, "mini", redis_server, rec):
        wait_online(alpha, "bob", "mini")
        rows = [r for r in alpha.roster() if r["connection_id"] == "mini"]
        assert {r["profile"] for r in rows} == {"default", "alice", "bob"}
        ack = alpha.message_agent(sender="alice", target="bob@mini", message="hi there")
        assert ack["status"] == "queued" and ack["to"] == "@bob on mini"
        out = alpha.wait_outcome(ack["delivery_id"], timeout=10)
        assert (out["status"], out["reply"], out["from"]) == ("replied", "ok: hi there", "@bob on mini")
        assert [t.delivery_id for t in rec.entered] == [ack["delivery_id"]]  # the envelope id, end to end
        assert rec.entered[0].profile == "bob" and rec.entered[0].content.startswith("Message from 🤖 alice")
        client = redis_server.client()
        await_condition(lambda: client.xlen(KEYS.inbox("mini")) == 0 and client.xlen(KEYS.replies("alpha")) == 0,
                        timeout=5, message="acked entries deleted (the streams keep only the backlog)")
        assert client.exists(KEYS.done(ack["delivery_id"]))
        assert client.hlen(KEYS.sent("alpha")) == 0
        started = tmp_path / "mini" / "bot_relay" / "started"  # bob's turn marked its start before it ran...
        await_condition(lambda: os.listdir(started) == [], timeout=5,
                        message="the start mark cleared once the reply is in Redis")  # ...and no mark piles up


def test_the_outcome_of_a_dm_sent_over_redis_is_kept_on_the_root_past_a_restart(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Regression: `hermes-actors outcome` answered `unknown` for a replied Redis DM once its sender's host had
    restarted: the reply is consumed from Redis and nothing on the root kept it."""
    from hermes_actors.ops.journal_view import find_outcome

    with gateway(tmp_path, "alpha", redis_server, durable=True) as alpha, gateway(tmp_path, "mini", redis_server):
        wait_online(alpha, "bob", "mini")
        ack = alpha.message_agent(sender="alice", target="bob@mini", message="keep my answer")
        out = alpha.wait_outcome(ack["delivery_id"], timeout=20)
        assert out["reply"] == "ok: keep my answer"
    assert find_outcome(tmp_path / "alpha", ack["delivery_id"]) == out  # from the files, the host gone
    with gateway(tmp_path, "alpha", redis_server, durable=True) as again:  # and from the next host
        assert again.wait_outcome(ack["delivery_id"], timeout=5) == out


def test_a_reply_stays_in_redis_until_the_journal_has_its_outcome(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the reply entry was XACK'd and XDEL'd and the sent record dropped as soon as the Dispatcher was
    told, before the journal had the outcome: a kill in between lost the answered DM everywhere (wait_outcome:
    unknown id after the restart) and its sender's wake. Both stay until the outcome is journaled (and it is
    published only then)."""
    import threading

    from hermes_actors.store import journal as journal_module

    held, release = threading.Event(), threading.Event()
    write_now = journal_module.Journal._write_now

    def slow_commit(self: Any, lines: list[bytes], **kwargs: Any) -> None:
        if any(b'"t":"finished"' in line for line in lines) and not release.is_set():
            held.set()  # the commit that puts the outcome on disk waits for the test
            release.wait(30)
        write_now(self, lines, **kwargs)

    monkeypatch.setattr(journal_module.Journal, "_write_now", slow_commit)
    client = redis_server.client()
    with gateway(tmp_path, "alpha", redis_server, durable=True) as alpha, gateway(tmp_path, "mini", redis_server):
        wait_online(alpha, "bob", "mini")
        key = alpha.message_agent(sender="alice", target="bob@mini", message="keep it")["delivery_id"]
        assert held.wait(20)
        assert client.hexists(KEYS.sent("alpha"), key), "the sent record went before the journal had the outcome"
        assert client.xlen(KEYS.replies("alpha")) == 1, "the reply entry went before the journal had the outcome"
        with pytest.raises(TimeoutError):  # not on disk yet: not published either
            alpha.wait_outcome(key, timeout=0)
        release.set()
        assert alpha.wait_outcome(key, timeout=20)["reply"] == "ok: keep it"
        await_condition(lambda: client.hlen(KEYS.sent("alpha")) == 0 and client.xlen(KEYS.replies("alpha")) == 0,
                        timeout=10, message="reply entry and sent record cleared once journaled")


def test_a_reply_left_pending_by_a_killed_host_is_read_at_the_restart_not_timed_out(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Regression: a host killed after its reply arrived (unacked: the outcome was not journaled yet) left the
    entry pending for its dead consumer; the restart reclaimed it only a claim idle (60 s) later, and a reply
    deadline due before that reported the answered DM `delivery_timeout` (while the sender's wake, journaled
    earlier, told it the reply)."""
    from redis_fixture import dead_consumer

    from hermes_actors.records import RemoteAgent
    from hermes_actors.store.relay_protocol import make_envelope, make_reply
    from hermes_actors.transports.redis import store as rs
    from hermes_actors.transports.redis.io import ensure_groups

    client = redis_server.client()
    ensure_groups(client, [KEYS.inbox("alpha"), KEYS.replies("alpha")])
    target = RemoteAgent("bob", "bob", "mini")
    envelope = make_envelope(target=target, message="ping", sender_profile="alice", sender_handle="alice",
                             now=time.time() - 100, extra={"hop": 1})  # its 8 s reply budget long spent
    key = envelope["id"]
    client.hset(KEYS.sent("alpha"), key, rs.sent_meta(envelope, "@bob on mini", wake=False))
    client.xadd(KEYS.replies("alpha"), rs.encode_reply_entry(make_reply(key, reply="pong", now=time.time())))
    # read by the killed host's consumer, never acked
    assert client.xreadgroup(rs.GROUP, dead_consumer(), {KEYS.replies("alpha"): ">"}, count=10)
    with gateway(tmp_path, "alpha", redis_server, durable=True, config={"bot_mode": {"reply_wait_seconds": 8}}) \
            as alpha:
        out = alpha.wait_outcome(key, timeout=20)
        assert (out["status"], out["reply"]) == ("replied", "pong"), out
        await_condition(lambda: client.xlen(KEYS.replies("alpha")) == 0 and client.hlen(KEYS.sent("alpha")) == 0,
                        timeout=10, message="the reply entry and the sent record cleared once journaled")


def test_a_redis_that_lost_its_data_gets_each_gateways_roster_again(tmp_path: Path, redis_server: RedisServer) -> None:
    """Regression: after a FLUSHALL (a Redis restarted empty, a failover) heartbeats and groups came back but no
    roster did: DMs between machines were refused 'no teammate named' until a gateway restarted."""
    rec = RecordingRunner()
    with gateway(tmp_path, "alpha", redis_server) as alpha, gateway(tmp_path, "mini", redis_server, rec):
        wait_online(alpha, "bob", "mini")
        redis_server.client().flushall()
        await_condition(lambda: redis_server.client().exists(KEYS.roster("mini")), timeout=30,
                        message="mini's roster was never published again")
        wait_online(alpha, "bob", "mini")
        ack = alpha.message_agent(sender="alice", target="bob@mini", message="after the flush")
        assert ack["status"] == "queued", ack
        assert alpha.wait_outcome(ack["delivery_id"], timeout=20)["reply"] == "ok: after the flush"


def test_right_after_redis_lost_its_data_a_known_remote_agent_is_offline_until_republished(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Regression (review): right after Redis restarted empty a DM to a known remote agent was refused "No teammate
    named 'bob@mini' …" (reason unknown) until mini's gateway published its roster again. The rosters that vanish
    with our own are kept, offline, until republished; one that vanishes alone is dropped."""
    client = redis_server.client()
    fake_connection(redis_server, "mini")  # a roster nobody republishes: what alpha shows is what it remembers
    with gateway(tmp_path, "alpha", redis_server) as alpha:
        wait_online(alpha, "bob", "mini")
        client.flushall()
        wait_online(alpha, "bob", "mini", online=False, timeout=10)
        refused = alpha.message_agent(sender="alice", target="bob@mini", message="still there?")
        assert refused.get("reason") == "runtime_offline", refused
        assert "is offline right now" in refused["error"] and "NOT queued" in refused["error"], refused
        assert client.xlen(KEYS.inbox("mini")) == 0
        fake_connection(redis_server, "mini")  # its gateway publishes again
        wait_online(alpha, "bob", "mini")
        client.delete(KEYS.roster("mini"))  # gone alone (not with ours): retired, not remembered
        await_condition(lambda: not [r for r in alpha.roster() if r["connection_id"] == "mini"], timeout=10,
                        message="mini dropped once its roster alone was gone")


def test_failed_and_silent_turns_come_back_with_their_reason(tmp_path: Path, redis_server: RedisServer) -> None:
    def behave(turn: Turn) -> str:
        if "quota" in turn.content:
            raise TurnFailed("402 insufficient_quota", reason="provider_quota_limit")
        return "[SILENT]"

    with gateway(tmp_path, "alpha", redis_server) as alpha, \
            gateway(tmp_path, "mini", redis_server, RecordingRunner(behave)):
        wait_online(alpha, "bob", "mini")
        failed = alpha.message_agent(sender="alice", target="bob@mini", message="quota please")
        silent = alpha.message_agent(sender="alice", target="bob@mini", message="fyi")
        out = alpha.wait_outcome(failed["delivery_id"], timeout=10)
        assert (out["status"], out["reason"], out["retryable"]) == ("failed", "provider_quota_limit", False)
        assert alpha.wait_outcome(silent["delivery_id"], timeout=10)["status"] == "silent"


def test_a_clean_stop_is_offline_at_once_and_a_new_start_delivers(tmp_path: Path, redis_server: RedisServer) -> None:
    with gateway(tmp_path, "alpha", redis_server) as alpha:
        with gateway(tmp_path, "mini", redis_server):
            wait_online(alpha, "bob", "mini")
        wait_online(alpha, "bob", "mini", online=False, timeout=5)
        refusal = alpha.message_agent(sender="alice", target="bob@mini", message="anyone?")
        assert refusal["reason"] == "runtime_offline" and "NOT queued" in refusal["error"]
        assert "back on Redis" in refusal["error"] and "Desktop" not in refusal["error"]  # no Desktop on Redis
        with gateway(tmp_path, "mini", redis_server):
            wait_online(alpha, "bob", "mini")
            ack = alpha.message_agent(sender="alice", target="bob@mini", message="back?")
            assert alpha.wait_outcome(ack["delivery_id"], timeout=10)["status"] == "replied"


def test_a_restarted_sender_resumes_waiting_for_its_replies(tmp_path: Path, redis_server: RedisServer) -> None:
    fake_connection(redis_server, "mini")  # online, not draining yet
    root = make_root(tmp_path, {"alice": {}}, name="alpha")
    cfg = _config(redis_server)
    with Gateway(root, runner="demo", config=cfg, connection_id="alpha") as first:
        wait_online(first, "bob", "mini")
        ack = first.message_agent(sender="alice", target="bob@mini", message="across a restart")
    assert redis_server.client().hexists(KEYS.sent("alpha"), ack["delivery_id"])
    with Gateway(root, runner="demo", config=cfg, connection_id="alpha") as second, \
            gateway(tmp_path, "mini", redis_server):
        out = second.wait_outcome(ack["delivery_id"], timeout=10)
    assert (out["status"], out["reply"]) == ("replied", "ok: across a restart")
    assert redis_server.client().hlen(KEYS.sent("alpha")) == 0


def test_a_dm_resumed_after_the_senders_restart_wakes_its_sender(tmp_path: Path, redis_server: RedisServer) -> None:
    """The sent meta names the sending DM (profile, handle, hop): after a restart, the resumed DM's
    outcome wakes alice as it would have before (before, the meta kept no hop: outcome, no wake)."""
    fake_connection(redis_server, "mini")  # online, not draining yet
    root = make_root(tmp_path, {"alice": {}}, name="alpha")
    cfg = _config(redis_server, wake_sender=True)
    with Gateway(root, runner=RecordingRunner(), config=cfg, connection_id="alpha") as first:
        wait_online(first, "bob", "mini")
        dm = first.message_agent(sender="alice", target="bob@mini", message="across a restart")["delivery_id"]
    rec = RecordingRunner(lambda turn: "noted")
    with Gateway(root, runner=rec, config=cfg, connection_id="alpha") as second, \
            gateway(tmp_path, "mini", redis_server, RecordingRunner(lambda turn: "hello back")):
        assert second.wait_outcome(dm, timeout=10)["reply"] == "hello back"
        wake = second.wait_outcome(wake_id(dm), timeout=10)  # alice's wake turn ran and settled
    assert wake["status"] == "replied"
    (turn,) = [t for t in rec.entered if t.profile == "alice"]
    assert "hello back" in turn.content and turn.hop == 1  # the DM's hop, as stored when it was sent


def test_a_redis_replys_wake_is_queued_past_its_senders_full_queue(tmp_path: Path, redis_server: RedisServer) -> None:
    """Chaos review: the wake of a DM answered over Redis failed ``target_busy`` ("the queue for profile 'alice' is
    full") when its sender's own queue was full, so alice never learnt the reply. It is queued past the bound and
    runs once, behind the DMs queued before it."""
    release = threading.Event()

    def behave(turn: Turn) -> str:
        if turn.content.endswith("blocker"):
            assert release.wait(30), "the test never released the blocker"
        return "noted"

    rec = RecordingRunner(behave)
    with gateway(tmp_path, "alpha", redis_server, rec, profiles={"alice": {}, "carol": {}},
                 config={"bot_mode": {"wake_sender": True, "max_queued": 1}}) as alpha, \
            gateway(tmp_path, "mini", redis_server, RecordingRunner(lambda turn: "hello back")), \
            LogCapture("DEBUG") as logs:
        wait_online(alpha, "bob", "mini")
        blocker = alpha.message_agent(sender="carol", target="alice", message="blocker")["delivery_id"]
        rec.wait_entered(1)
        fill = alpha.message_agent(sender="carol", target="alice", message="fill")["delivery_id"]
        refused = alpha.message_agent(sender="carol", target="alice", message="one too many")
        assert refused.get("reason") == "target_busy" and "is full" in refused["error"], refused
        dm = alpha.message_agent(sender="alice", target="bob@mini", message="ping")["delivery_id"]
        assert alpha.wait_outcome(dm, timeout=10)["reply"] == "hello back"
        await_condition(lambda: logs.matching("waking @alice", f"the outcome of {dm} "), timeout=10,
                        message="the Dispatcher queued the wake")
        alpha.stats()  # an ask: the wake is told to alice's ProfileActor, whose queue is full
        release.set()
        wake = alpha.wait_outcome(wake_id(dm), timeout=20)
    assert wake["status"] == "replied", wake
    assert [t.delivery_id for t in rec.entered if t.profile == "alice"] == [blocker, fill, wake_id(dm)]


class KeyEvents:
    """Redis keyspace notifications (set, expired, del) of the liveness keys, collected on a thread."""

    def __init__(self, server: RedisServer) -> None:
        self.client = server.client()  # kept: a collected client closes the pubsub connection
        self.client.config_set("notify-keyspace-events", "Kg$x")
        self.events: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.pubsub = self.client.pubsub()
        self.pubsub.psubscribe(**{f"__keyspace@0__:{KEYS.alive('*')}": self._on,
                                  f"__keyspace@0__:{KEYS.consumer_alive('*')}": self._on})
        self.thread = self.pubsub.run_in_thread(sleep_time=0.01, daemon=True)

    def _on(self, message: dict[str, Any]) -> None:
        key = message["channel"].decode().split(":", 1)[1]
        with self.lock:
            self.events.append((key, message["data"].decode()))

    def count(self, key: str, event: str) -> int:
        with self.lock:
            return sum(1 for k, e in self.events if k == key and e == event)

    def of(self, event: str) -> list[str]:
        with self.lock:
            return [k for k, e in self.events if e == event]

    def close(self) -> None:
        self.thread.stop()
        self.thread.join(timeout=10)
        self.pubsub.close()
        self.client.close()


def test_a_transport_actor_busy_longer_than_the_heartbeat_ttl_stays_online(
        tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes_actors.transports.redis.actor import RedisRelayActor
    from hermes_actors.transports.redis.store import redis_settings

    settings = redis_settings(_config(redis_server), redis_server.url)
    beats_past_ttl = int(settings.heartbeat_ttl_seconds / settings.heartbeat_seconds) + 3
    entered, release = threading.Event(), threading.Event()

    def busy(self: Any, msg: Any) -> int:  # stands for a burst: the mailbox is stuck behind this message
        entered.set()
        release.wait(timeout=60)
        return 0

    events = KeyEvents(redis_server)
    rec = RecordingRunner()
    try:
        with gateway(tmp_path, "alpha", redis_server) as alpha, gateway(tmp_path, "mini", redis_server, rec) as mini:
            wait_online(alpha, "bob", "mini")
            monkeypatch.setattr(RedisRelayActor, "_on_housekeep", busy)
            blocker = threading.Thread(target=mini.housekeep, daemon=True)
            blocker.start()
            assert entered.wait(timeout=10), "mini's transport actor never got the blocking message"
            try:
                before = events.count(KEYS.alive("mini"), "set")
                await_condition(lambda: events.of("expired") or
                                events.count(KEYS.alive("mini"), "set") >= before + beats_past_ttl,
                                timeout=30, interval=0.02, message=f"{beats_past_ttl} heartbeats or an expiry")
                assert events.of("expired") == []  # no liveness key expired while mini's actor was busy
                ack = alpha.message_agent(sender="alice", target="bob@mini", message="still there?")
                assert ack.get("status") == "queued", ack  # alpha never saw mini offline
            finally:
                release.set()
                blocker.join(timeout=30)
            assert alpha.wait_outcome(ack["delivery_id"], timeout=10)["reply"] == "ok: still there?"
    finally:
        events.close()
    assert events.of("expired") == []


def test_the_transport_housekeeps_on_its_tick_and_a_failing_sweep_stops_nothing(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (review): the Redis transport swept orphaned DM files only when ``Gateway.housekeep()`` was
    called, while the file relay sweeps on its own tick. Now it sweeps on its existing tick with the file relay's
    schedule (the first tick after the start, then hourly: ``housekeeping_due``); a sweep that raises is logged
    and the transport goes on (the next try an hour later, not at every tick)."""
    from hermes_actors.local import dm_files

    sweeps: list[float] = []

    def broken(*_args: Any, **_kwargs: Any) -> int:
        sweeps.append(time.monotonic())
        raise ValueError("a sweep's own bug")

    monkeypatch.setattr(dm_files, "cleanup_bot_dm_cache", broken)
    with LogCapture("ERROR") as logs, gateway(tmp_path, "alpha", redis_server) as alpha, \
            gateway(tmp_path, "mini", redis_server) as mini:
        await_condition(lambda: len(logs.matching("redis: housekeeping failed; the transport goes on")) == 2,
                        timeout=30, message="each gateway's first tick swept (and logged its failure)")
        beats = mini.stats()["relay"]["heartbeats"]
        wait_online(alpha, "bob", "mini")
        ack = alpha.message_agent(sender="alice", target="bob@mini", message="still relayed")
        assert alpha.wait_outcome(ack["delivery_id"], timeout=30)["reply"] == "ok: still relayed"
        await_condition(lambda: mini.stats()["relay"]["heartbeats"] >= beats + 5, timeout=30,
                        message="more ticks went by")
        assert mini.stats()["relay_alive"] and alpha.stats()["relay_alive"]
    assert len(sweeps) == 2, "one sweep per gateway: the next is an hour on"


def test_a_queued_envelope_its_sender_expired_leaves_no_start_mark(tmp_path: Path, redis_server: RedisServer) -> None:
    """Regression (review): a relayed-in turn writes its start mark before it claims the turn; when the claim found
    its sender's ``expired`` mark (it expired the envelope while it was queued here), the outcome dropped the flight
    and acked the entry but left the mark: one file per such DM in ``bot_relay/started/``, read by every start.
    Now it is cleared (the turn never ran anywhere: no turn claimed it)."""
    from hermes_actors.transports.redis import store as rs

    release = threading.Event()
    rec = RecordingRunner(lambda turn: (release.wait(timeout=30), "done")[1])
    client = redis_server.client()
    started = tmp_path / "mini" / "bot_relay" / "started"
    with gateway(tmp_path, "mini", redis_server, rec) as mini:
        first = inject(redis_server, "mini", "probe")
        await_condition(lambda: len(rec.entered) == 1, timeout=10, message="the first turn is running")
        second = inject(redis_server, "mini", "probe")
        await_condition(lambda: client.xpending(KEYS.inbox("mini"), "hermes")["pending"] == 2, timeout=10,
                        message="the second one read by mini")
        mini.housekeep()  # an ask: the transport actor's mailbox is flushed past it (queued behind bob's turn)
        client.set(KEYS.claim(second["id"]), rs.EXPIRED_CLAIM)  # its sender expired it meanwhile
        release.set()
        await_drained(redis_server, KEYS.inbox("mini"))
        await_condition(lambda: os.listdir(started) == [], timeout=10,
                        message="no start mark left: the first's cleared with its reply, the expired one's too")
    assert [t.delivery_id for t in rec.entered] == [first["id"]]  # the expired one never ran
    assert [r["id"] for r in replies_to(redis_server, "probe")] == [first["id"]]  # its sender already reported it


def test_housekeeping_removes_old_start_marks_nothing_needs_and_never_one_keeping_a_reply(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Regression (review): on a Redis root nothing ever removed a start mark a turn left behind (an envelope its
    sender expired before the fix above, a turn whose claim was lost): the file relay's housekeeping sweeps them
    after 6 h, the Redis transport's swept only DM files. Now it sweeps ``started/`` by the same 6 h rule, never a
    mark that keeps a reply (owed to a sender's replies key of another type, or the file relay's on a root that
    switched), nor the mark of a turn running here, nor one whose envelope is on a file-relay shelf."""
    client = redis_server.client()
    root = make_root(tmp_path, {"alice": {}, "bob": {}}, name="mini")
    paths = InboxPaths.from_root(root).ensure()
    old = time.time() - 7 * 3600

    def mark(envelope_id: str, *, reply_to: str | None = None, via: str = "redis") -> Path:
        path = paths.started / f"{envelope_id}.json"
        if reply_to is None:
            path.write_text(json.dumps({"id": envelope_id, "at": int(old)}), encoding="utf-8")
            os.chmod(path, 0o600)
        else:
            keep_reply(paths, make_reply(envelope_id, reply="kept", now=old), reply_to, now=old, via=via)
        os.utime(path, (old, old))
        return path

    stale = mark(uuid.uuid4().hex)
    young = paths.started / f"{uuid.uuid4().hex}.json"
    young.write_text(json.dumps({"id": young.stem, "at": int(time.time())}), encoding="utf-8")
    client.set(KEYS.replies("probe"), "oops")  # its reply stays owed
    owed = mark(uuid.uuid4().hex, reply_to="probe")
    file_relays = mark(uuid.uuid4().hex, reply_to="alpha", via="relay")
    shelved = mark(uuid.uuid4().hex)  # a switched root: the file relay's adopter answers it ambiguous
    shelf = paths.taken_parent / f"{SHELF_PREFIX}{uuid.uuid4().hex}"
    shelf.mkdir(mode=0o700)
    (shelf / LOCK_NAME).touch(mode=0o600)
    envelope = seed_envelope(target_connection="mini", target_profile="bob", message="on the file relay's shelf",
                             envelope_id=shelved.stem)
    (shelf / shelved.name).write_text(json.dumps({**envelope, "reply_connection": "alpha"}), encoding="utf-8")
    release = threading.Event()
    rec = RecordingRunner(lambda turn: (release.wait(timeout=30), "done")[1])
    try:
        with gateway(tmp_path, "mini", redis_server, rec) as mini:
            running = inject(redis_server, "mini", "probe2")
            await_condition(lambda: len(rec.entered) == 1, timeout=10, message="a turn is running")
            in_flight = paths.started / f"{running['id']}.json"
            os.utime(in_flight, (old, old))  # a turn running for 7 h: its mark says it started
            mini.housekeep()
            left = set(os.listdir(paths.started))
            release.set()
            await_condition(lambda: replies_to(redis_server, "probe2"), timeout=10, message="its reply")
    finally:
        release.set()
    assert stale.name not in left
    assert {young.name, owed.name, file_relays.name, shelved.name, in_flight.name} <= left, left
    assert (paths.started / owed.name).exists() and kept_reply(paths, owed.stem, via="redis") is not None


def test_housekeeping_runs_at_the_first_tick_then_hourly() -> None:
    from hermes_actors.relay.relay_actor import HOUSEKEEP_EVERY_SECONDS, housekeeping_due

    assert housekeeping_due(None, 5.0)  # not yet since the start
    assert not housekeeping_due(100.0, 100.0 + HOUSEKEEP_EVERY_SECONDS - 1)
    assert housekeeping_due(100.0, 100.0 + HOUSEKEEP_EVERY_SECONDS)


# ── configuration and refusals ──────────────────────────────────────────────


def test_redis_needs_a_connection_id(tmp_path: Path, redis_server: RedisServer) -> None:
    root = make_root(tmp_path)
    gw = Gateway(root, config=_config(redis_server))
    with pytest.raises(ValueError, match="connection_id"):
        gw.start()
    assert not gw.running
    with pytest.raises(ValueError, match="neither 'file' nor"):
        Gateway(root, config={"bot_mode": {"transport": "http://x"}}, connection_id="a").start()


def test_redis_down_at_send_is_a_clear_refusal(tmp_path: Path, redis_server: RedisServer) -> None:
    rec = RecordingRunner()
    with gateway(tmp_path, "alpha", redis_server) as alpha, gateway(tmp_path, "mini", redis_server, rec):
        wait_online(alpha, "bob", "mini")
        redis_server.kill()
        # A refusal naming Redis (how soon it comes is a timing claim: bench/ measures, this test does not)
        refusal = alpha.message_agent(sender="alice", target="bob@mini", message="is redis there?")
        assert refusal["reason"] == "runtime_offline"
        assert f"Redis at 127.0.0.1:{redis_server.port} is unreachable" in refusal["error"]
        assert "NOT queued" in refusal["error"] and "delivery_id" not in refusal
        redis_server.start()
        wait_online(alpha, "bob", "mini", timeout=15)
        ack = alpha.message_agent(sender="alice", target="bob@mini", message="and now?")
        assert alpha.wait_outcome(ack["delivery_id"], timeout=15)["status"] == "replied"
    assert rec.bodies() == ["and now?"]


def test_a_full_target_stream_refuses_target_busy(tmp_path: Path, redis_server: RedisServer) -> None:
    fake_connection(redis_server, "ghost")  # online, but nobody consumes its stream
    with gateway(tmp_path, "alpha", redis_server, config={"bot_mode": {"redis_max_stream_len": 5}}) as alpha:
        wait_online(alpha, "bob", "ghost")
        acks = [alpha.message_agent(sender="alice", target="bob@ghost", message=f"m{i}") for i in range(6)]
        assert all("delivery_id" in a for a in acks[:5])
        assert acks[5]["reason"] == "target_busy"
        assert "queue for @bob on ghost is full" in acks[5]["error"] and "NOT delivered" in acks[5]["error"]
        assert redis_server.client().xlen(KEYS.inbox("ghost")) == 5


@pytest.mark.parametrize("broken", ["sent", "inbox"])
def test_a_send_refused_for_a_key_of_the_wrong_type_queues_nothing(
    tmp_path: Path, redis_server: RedisServer, broken: str
) -> None:
    """Regression (review): with ``sent:<me>`` a string the script's XADD had already queued the envelope when its
    HSET failed; the sender was told "Nothing was sent." and the target ran the turn anyway."""
    fake_connection(redis_server, "ghost")  # online, but nobody consumes its stream: what is queued stays there
    client = redis_server.client()
    with gateway(tmp_path, "alpha", redis_server) as alpha:
        wait_online(alpha, "bob", "ghost")
        key = KEYS.sent("alpha") if broken == "sent" else KEYS.inbox("ghost")
        client.set(key, "oops")
        refused = alpha.message_agent(sender="alice", target="bob@ghost", message="hi")
        client.delete(key)
        assert "delivery_id" not in refused, refused
        assert "Nothing was sent" in refused["error"] and "wrong kind of value" in refused["error"], refused
        assert client.xlen(KEYS.inbox("ghost")) == 0, "a refused DM left nothing queued"
        assert client.hlen(KEYS.sent("alpha")) == 0
        acked = alpha.message_agent(sender="alice", target="bob@ghost", message="again")
        assert "delivery_id" in acked, acked  # the key fixed, the next DM goes
        assert client.xlen(KEYS.inbox("ghost")) == 1


def test_a_key_of_the_wrong_type_under_the_prefix_hides_no_other_connection(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Regression (review): one ``roster:<c>`` key that is not a hash failed the one pipeline that reads every
    roster, at every read: no other connection's roster was read (a new one stayed invisible, DMs to it were
    refused 'No teammate named'). An ``alive:<c>`` key that is not a string (no gateway's heartbeat) showed its
    connection online. Each bad key is now skipped and named once, with the fix."""
    client = redis_server.client()
    client.set(KEYS.roster("zzz"), "not a hash")
    with LogCapture("WARNING") as logs, gateway(tmp_path, "alpha", redis_server) as alpha:
        fake_connection(redis_server, "newconn")
        wait_online(alpha, "bob", "newconn", timeout=10)
        ack = alpha.message_agent(sender="alice", target="bob@newconn", message="hi")
        assert ack.get("status") == "queued", ack
        fake_connection(redis_server, "ghost")
        wait_online(alpha, "bob", "ghost")
        client.delete(KEYS.alive("ghost"))
        client.hset(KEYS.alive("ghost"), "a", "b")
        wait_online(alpha, "bob", "ghost", online=False, timeout=10)
        fake_connection(redis_server, "later")  # seen online: the roster was read again with both keys still bad
        wait_online(alpha, "bob", "later")
    assert len(logs.matching(KEYS.roster("zzz"), "is not a roster hash", "redis-cli DEL")) == 1, logs.lines
    assert len(logs.matching(KEYS.alive("ghost"), "holds a hash", "shown offline", "redis-cli DEL")) == 1, logs.lines
    assert logs.matching("command failed") == [], "no other periodic work failed with the roster read"


def test_a_heartbeat_key_of_the_wrong_type_is_named_once_and_the_process_stays_a_live_claim_holder(
    redis_server: RedisServer,
) -> None:
    """Regression (review): with ``alive:<me>`` a hash every beat logged "heartbeat failed: WRONGTYPE …" (five
    a second) without saying which key or what to do, and the process's consumer key expired (its claimed
    turns looked like a dead process's)."""
    from hermes_actors.transports.redis.heartbeat import Heartbeat

    settings = redis_settings({"bot_mode": {"redis_heartbeat_seconds": 600}}, redis_server.url)  # beat() only
    client = redis_server.client()
    client.hset(KEYS.alive("mini"), "a", "b")
    with LogCapture("INFO") as logs:
        beat = Heartbeat(settings, KEYS, "mini", "host-1-abcdefgh").start()  # start() beats once too
        try:
            assert [beat.beat() for _ in range(3)] == [False] * 3
            assert client.exists(KEYS.consumer_alive("host-1-abcdefgh")), "the live process's consumer key"
            client.delete(KEYS.alive("mini"))  # the fix the log line names
            assert beat.beat() is True
            assert client.get(KEYS.alive("mini")) == b"host-1-abcdefgh"
        finally:
            beat.stop()
    assert len(logs.matching(KEYS.alive("mini"), "holds a hash", "redis-cli DEL")) == 1, logs.lines
    assert logs.matching("heartbeat failed") == []
    assert logs.matching(KEYS.alive("mini"), "heartbeat again")


def test_a_backlog_past_max_queued_waits_in_redis_and_every_entry_is_answered(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Regression (review): the reader checked the bound only before each read and then took up to 100 entries,
    so a backlog past ``max_queued`` reached the target's full queue and acked DMs failed ``target_busy``; the
    docs say "A gateway holds at most ``max_queued`` entries in flight; the rest wait in Redis"."""
    release = threading.Event()
    first = threading.Event()

    def behave(turn: Turn) -> str:
        if not first.is_set():
            first.set()
            assert release.wait(30), "the test never released the first turn"
        return "ok"

    injected = [inject(redis_server, "mini", "ghost")["id"] for _ in range(20)]  # all there before mini reads
    rec = RecordingRunner(behave)
    with gateway(tmp_path, "mini", redis_server, rec, config={"bot_mode": {"max_queued": 3}}):
        assert first.wait(20), "mini never ran the first entry"
        release.set()
        await_condition(lambda: redis_server.client().xlen(KEYS.replies("ghost")) >= len(injected), timeout=30,
                        message="a reply for every entry")
    replies = replies_to(redis_server, "ghost")
    assert [(r["reply"], r["error"]) for r in replies] == [("ok", "")] * len(injected), replies  # none target_busy
    assert sorted(r["id"] for r in replies) == sorted(injected)


class _Told:
    """Stands in for the Redis actor: keeps what a :class:`StreamReader` tells it (from the reader's thread)."""

    def __init__(self) -> None:
        self.messages: list[Any] = []

    def tell(self, message: Any) -> None:
        self.messages.append(message)


def test_a_reader_loop_is_one_read_and_held_back_replies_are_taken_at_full_rate(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (review): with the inbox's room between 1 and 99 places, every loop of the reader issued a second,
    non-blocking XREADGROUP on the replies stream (COUNT is per stream), whether replies waited or not. Now a loop
    is one read, and the replies stream is read again at full rate only after a read that took as many replies as
    its COUNT: 30 waiting replies still all arrive in the first loop."""
    from hermes_actors.transports.redis import io

    reads: list[tuple[tuple[str, ...], int | None, int | None]] = []  # (streams, COUNT, BLOCK) of each XREADGROUP
    real_client = io.make_client

    def recording_client(url: str, *, socket_timeout: float = 3.0) -> Any:
        client = real_client(url, socket_timeout=socket_timeout)
        xreadgroup = client.xreadgroup

        def recorded(group: str, consumer: str, streams: dict[str, str], count: int | None = None,
                     block: int | None = None, **kwargs: Any) -> Any:
            reads.append((tuple(streams), count, block))
            return xreadgroup(group, consumer, streams, count=count, block=block, **kwargs)

        client.xreadgroup = recorded
        return client

    monkeypatch.setattr(io, "make_client", recording_client)
    inbox, replies = KEYS.inbox("mini"), KEYS.replies("mini")
    for n in range(30):  # all there before the first read (the group reads from the start)
        redis_server.client().xadd(replies, {"n": str(n)})
    told = _Told()
    settings = replace(redis_settings({}, redis_server.url), block_ms=50)
    reader = io.StreamReader(settings, KEYS, "mini", "host-1-abcdefgh", told, room=io.InboxRoom(5, lambda: 0)).start()
    try:
        await_condition(lambda: sum(1 for r in list(reads) if r[2] is not None) >= 4, timeout=20,
                        message="four loops of the reader")
    finally:
        reader.stop()
    assert {r for r in reads if r[2] is not None} == {((inbox, replies), 5, 50)}, reads  # the room's COUNT
    assert [r for r in reads if r[2] is None] == [((replies,), io.READ_COUNT, None)], reads  # once, after the first
    assert [(m.stream, len(m.entries)) for m in told.messages] == [("replies", 5), ("replies", 25)], told.messages


def test_a_gateway_that_lost_its_connection_ids_lease_stops_reading_its_inbox(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Regression (review): after a FLUSHALL a second process started on the same connection id; the first
    logged that it lost the lease ("stop one of them") and went on taking entries of the shared inbox."""
    first_runner, second_runner = RecordingRunner(), RecordingRunner()
    slow_beat = {"bot_mode": {"redis_heartbeat_seconds": 3}}
    with LogCapture("ERROR") as logs, gateway(tmp_path, "alpha", redis_server) as alpha, \
            gateway(tmp_path, "mini", redis_server, first_runner, config=slow_beat):
        wait_online(alpha, "bob", "mini")
        redis_server.client().flushall()  # the lease (the alive key) is gone: a second process can take it
        with gateway(tmp_path / "second", "mini", redis_server, second_runner):
            await_condition(lambda: logs.matching("is held by another process"), timeout=30,
                            message="the first gateway noticed the lease is another process's")
            wait_online(alpha, "bob", "mini")
            acks = [alpha.message_agent(sender="alice", target="bob@mini", message=f"m{i}") for i in range(10)]
            outcomes = [alpha.wait_outcome(a["delivery_id"], timeout=30) for a in acks]
    assert [o["status"] for o in outcomes] == ["replied"] * 10, outcomes
    assert first_runner.entered == [], "the process without the lease ran none of them"
    assert len(second_runner.entered) == 10


def test_a_replies_key_of_another_type_stops_neither_the_inbox_nor_the_roster(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Regression (review): one XREADGROUP covered both streams, so ``replies:<us>`` holding a string failed every
    read and the inbox was never read either (and the tick's group check failed before the roster was published).
    Now the bad key is named in one ERROR saying to delete it, the inbox is read on, and once the key is deleted
    the replies are read again."""
    client = redis_server.client()
    replies = KEYS.replies("mini")
    client.set(replies, "oops")
    with LogCapture("ERROR") as logs, gateway(tmp_path, "alpha", redis_server) as alpha, \
            gateway(tmp_path, "mini", redis_server) as mini:
        wait_online(alpha, "bob", "mini")  # mini's roster is published
        ack = alpha.message_agent(sender="alice", target="bob@mini", message="inbox still read")
        assert alpha.wait_outcome(ack["delivery_id"], timeout=30)["status"] == "replied"
        named = logs.matching(f"{replies} holds a value that is not a stream", f"redis-cli DEL {replies}")
        assert len(named) == 1, logs.lines
        client.delete(replies)  # fixed by hand: mini's own DMs get their replies again
        wait_online(mini, "bob", "alpha")
        ack = mini.message_agent(sender="alice", target="bob@alpha", message="replies read again")
        assert mini.wait_outcome(ack["delivery_id"], timeout=30)["status"] == "replied"
    assert len(logs.matching("holds a value that is not a stream")) == 1, "logged once, not at each read"


@pytest.mark.parametrize("durable", [False, True])
def test_a_reply_owed_to_a_replies_key_of_another_type_survives_the_targets_restart(
    tmp_path: Path, redis_server: RedisServer, durable: bool
) -> None:
    """Regression (review): with the sender's ``replies:<sender>`` a string, the target's MULTI ran on past the
    failed XADD (the entry acked, ``done`` set) and the reply was kept in memory only: a restart of the target lost
    it, and the DM, which ran, never got its reply. Now it is kept in the envelope's start mark, the key is named in
    one WARNING saying to delete it, and the reply is written once the key is a stream again, after a restart too."""
    client = redis_server.client()
    replies = KEYS.replies("alpha")
    warning = (f"{replies} holds a value that is not a stream", "cannot be written", f"redis-cli DEL {replies}")
    started = tmp_path / "mini" / "bot_relay" / "started"
    rec = RecordingRunner()
    with LogCapture("WARNING") as logs, gateway(tmp_path, "alpha", redis_server, durable=durable) as alpha:
        with gateway(tmp_path, "mini", redis_server, rec, durable=durable):
            wait_online(alpha, "bob", "mini")
            client.delete(replies)
            client.set(replies, "oops")
            acks = [alpha.message_agent(sender="alice", target="bob@mini", message=f"owed {i}") for i in range(3)]
            await_condition(lambda: len(rec.entered) == 3, timeout=30, message="the three turns ran")
            await_drained(redis_server, KEYS.inbox("mini"))  # their entries are acked: Redis no longer holds them
        with gateway(tmp_path, "mini", redis_server, durable=durable):  # the target restarted
            client.delete(replies)  # fixed by hand
            outcomes = [alpha.wait_outcome(a["delivery_id"], timeout=30) for a in acks]
            assert [(o["status"], o["reply"]) for o in outcomes] == [("replied", f"ok: owed {i}") for i in range(3)]
            await_condition(lambda: os.listdir(started) == [], timeout=10, message="the marks cleared once written")
    named = logs.matching(*warning)
    # once per run while the key lasted (the restarted one names it again if its first retry came before the fix)
    assert 1 <= len(named) <= 2, logs.lines
    assert {r["level"].name for r in logs.records if all(w in r["message"] for w in warning)} == {"WARNING"}


def test_replies_kept_before_their_multi_are_written_when_their_entries_come_back_never_answered_ambiguous(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """A target killed after keeping replies in their start marks and before the ``MULTI`` that writes them leaves
    their entries pending, their turns claimed by the dead consumer. The next start reclaims them while their
    sender's replies key still refuses writes, so the kept replies are still owed (retried once per tick for that
    sender: the second one had no ``done`` mark yet). Each entry is settled with its kept reply: none is answered
    ``ambiguous`` (which also replaced the kept reply in its mark), and no turn runs."""
    client = redis_server.client()
    dead = "deadhost-1-abc"  # a consumer with no heartbeat: its claims and its pending entries are a dead run's
    inbox, replies = KEYS.inbox("mini"), KEYS.replies("probe")
    client.xgroup_create(inbox, "hermes", id="0", mkstream=True)
    envelopes = [inject(redis_server, "mini", "probe") for _ in range(2)]
    client.xreadgroup("hermes", dead, {inbox: ">"})  # pending for the dead consumer
    client.set(replies, "oops")
    root = make_root(tmp_path, {"alice": {}, "bob": {}}, name="mini")
    paths = InboxPaths.from_root(root).ensure()
    for i, envelope in enumerate(envelopes):
        client.set(KEYS.claim(envelope["id"]), dead)
        keep_reply(paths, make_reply(envelope["id"], reply=f"kept answer {i}", now=time.time()), "probe",
                   now=time.time(), via="redis")
    rec = RecordingRunner()
    with gateway(tmp_path, "mini", redis_server, rec):
        await_drained(redis_server, inbox)  # reclaimed and settled: their MULTIs acked them (the XADD refused)
        client.delete(replies)  # fixed by hand
        await_condition(lambda: len(replies_to(redis_server, "probe")) == 2, timeout=10, message="the owed replies")
        await_condition(lambda: os.listdir(paths.started) == [], timeout=10, message="their marks cleared")
    written = {r["id"]: (r["reply"], r["reason"]) for r in replies_to(redis_server, "probe")}
    assert written == {e["id"]: (f"kept answer {i}", "") for i, e in enumerate(envelopes)}, written
    assert rec.entered == []


def _write_mark_without_via(paths: InboxPaths, envelope_id: str, reply: str, reply_connection: str) -> Path:
    """A start mark keeping a reply as versions before 621dfa7 wrote it, both transports alike: no ``via``."""
    now = int(time.time())
    mark = paths.started / f"{envelope_id}.json"
    record = {**make_reply(envelope_id, reply=reply, now=now), "reply_connection": reply_connection}
    mark.write_text(json.dumps({"id": envelope_id, "at": now, "reply": record}), encoding="utf-8")
    os.chmod(mark, 0o600)
    return mark


@pytest.mark.parametrize("written_by", ["this version", "an older version, without via"])
def test_a_reply_the_file_relay_kept_before_the_switch_to_redis_goes_back_only_through_the_file_relay(
    tmp_path: Path, redis_server: RedisServer, written_by: str
) -> None:
    """Regression (review): a root that ran the file relay can leave a start mark keeping the reply of a DM the file
    relay carried (its delivered/ write failed; the envelope stays on its shelf). Switched to Redis, the root's
    gateway read every kept reply as owed to Redis: it wrote it to ``replies:<reply_connection>`` (a stream no
    sender waits on) and cleared the mark, so the file relay's next start found the envelope unmarked and ran its
    turn again. Now a mark names the transport that kept it: Redis leaves the file relay's alone (one WARNING),
    and the file relay writes the reply at its next start, the turn never run again. A mark an older version
    wrote names none: its envelope on a file-relay shelf makes it the file relay's."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}}, name="mini")
    paths = InboxPaths.from_root(root).ensure()
    envelope = seed_envelope(target_connection="mini", target_profile="bob", message="carried by the file relay")
    shelf = paths.taken_parent / f"{SHELF_PREFIX}{uuid.uuid4().hex}"  # a killed gateway's: its lock, nobody's flock
    shelf.mkdir(mode=0o700)
    (shelf / LOCK_NAME).touch(mode=0o600)
    shelved = shelf / f"{envelope['id']}.json"
    shelved.write_text(json.dumps({**envelope, "reply_connection": "alpha"}), encoding="utf-8")
    os.chmod(shelved, 0o600)
    if written_by == "this version":
        keep_reply(paths, make_reply(envelope["id"], reply="kept answer", now=time.time()), "alpha", now=time.time())
    else:
        _write_mark_without_via(paths, envelope["id"], "kept answer", "alpha")
    mark = paths.started / f"{envelope['id']}.json"
    rec = RecordingRunner()
    with LogCapture("WARNING") as logs, gateway(tmp_path, "mini", redis_server, rec):
        pass  # its start read the marks and ran its first tick, which writes the owed replies
    assert not redis_server.client().exists(KEYS.replies("alpha")), "a file-relay reply was written to Redis"
    assert mark.exists()
    assert len(logs.matching("came in through the file relay", envelope["id"])) == 1, logs.lines
    with Gateway(root, runner=rec, connection_id="mini", durable=False):  # back on the file relay
        delivered = paths.delivered / f"{envelope['id']}.json"
        await_condition(delivered.exists, timeout=20, message="the kept reply written by the file relay")
    record = json.loads(delivered.read_text(encoding="utf-8"))
    assert (record["reply"], record["reply_connection"]) == ("kept answer", "alpha"), record
    assert rec.entered == [] and not mark.exists()


def test_a_reply_the_previous_version_owed_over_redis_is_written_after_the_upgrade(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Regression (review): a reply the previous version owed over Redis (its sender's replies key held another
    type) is kept in a start mark without ``via``, as it wrote them. After the upgrade every mark without ``via``
    was the file relay's: Redis left it ("came in through the file relay ... left as they are"), the file relay
    never writes it either (its envelope is on no shelf), so the sender ended the DM ``delivery_timeout``. Now a
    mark without ``via`` whose envelope is on no file-relay shelf (and whose reply is in no ``delivered/``) is
    Redis's: written once the key is a stream (its sender's ``sent`` hash still holds the envelope: it waits for
    the reply), its mark cleared, no turn run."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}}, name="mini")
    paths = InboxPaths.from_root(root).ensure()
    envelope_id = uuid.uuid4().hex
    mark = _write_mark_without_via(paths, envelope_id, "ok: hello bob", "probe")
    _left_by_the_previous_redis_transport(redis_server, envelope_id, "probe", sender_waits=True)
    rec = RecordingRunner()
    with LogCapture("WARNING") as logs, gateway(tmp_path, "mini", redis_server, rec):
        await_condition(lambda: replies_to(redis_server, "probe"), timeout=20, message="the owed reply written")
        await_condition(lambda: not mark.exists(), timeout=10, message="its mark cleared once it is in Redis")
    assert [(r["id"], r["reply"]) for r in replies_to(redis_server, "probe")] == [(envelope_id, "ok: hello bob")]
    assert not logs.matching("came in through the file relay"), logs.lines
    assert rec.entered == []


def _left_by_the_previous_redis_transport(server: RedisServer, envelope_id: str, sender: str, *,
                                          sender_waits: bool) -> None:
    """What Redis holds of an envelope whose reply the previous Redis transport owed: the ``MULTI`` that met the
    sender's bad replies key set ``done:<id>`` all the same, and the turn's claim names the dead run. With
    ``sender_waits`` the sender's ``sent`` hash still holds the envelope (its reply never came)."""
    client = server.client()
    client.set(KEYS.done(envelope_id), b"1", ex=3600)
    client.set(KEYS.claim(envelope_id), "deadhost-1-abc", ex=3600)
    if sender_waits:
        client.hset(KEYS.sent(sender), envelope_id, orjson.dumps({"label": "@bob on mini", "created_at": 1}))


@pytest.mark.parametrize("left_by", ["the file relay, its reply forwarded by the hub",
                                     "the previous Redis transport, its reply read by the sender"])
def test_a_kept_reply_no_sender_waits_for_any_more_is_not_written_to_redis_again(
    tmp_path: Path, redis_server: RedisServer, left_by: str
) -> None:
    """Regression (review): a start mark without ``via`` whose envelope is on no file-relay shelf and whose reply is
    in no ``delivered/`` was taken as owed to Redis, and the root's Redis gateway wrote that reply to its sender's
    replies stream, which already had it: an older file relay killed between taking the envelope off its shelf and
    clearing the mark, its reply since forwarded out of ``delivered/`` by the hub (Redis never carried the DM), or
    the previous Redis transport killed between writing an owed reply and clearing its mark (``done:<id>`` is set
    either way, by the MULTI that met the bad key too, so it proves nothing). Redis decides now: the reply is owed
    only while its sender's ``sent`` hash still holds the envelope. This one is left as it is, never written."""
    client = redis_server.client()
    root = make_root(tmp_path, {"alice": {}, "bob": {}}, name="mini")
    paths = InboxPaths.from_root(root).ensure()
    envelope_id = uuid.uuid4().hex
    mark = _write_mark_without_via(paths, envelope_id, "answered long ago", "alpha")
    if "Redis" in left_by:
        _left_by_the_previous_redis_transport(redis_server, envelope_id, "alpha", sender_waits=False)
    rec = RecordingRunner()
    with LogCapture("INFO") as logs, gateway(tmp_path, "mini", redis_server, rec):
        pass  # its start read the marks and ran its first tick, which writes the owed replies
    assert not client.exists(KEYS.replies("alpha")), "a reply its sender already has was written again"
    assert mark.exists() and rec.entered == []
    assert len(logs.matching("no sender waits for", envelope_id)) == 1, logs.lines
    assert not logs.matching("came in through the file relay"), logs.lines


def test_a_kept_reply_no_sender_waits_for_is_swept_by_the_redis_housekeeping_once_6_h_old(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Review (diffrev10): a start mark without ``via`` whose reply no sender waits for on Redis was left in place,
    the INFO saying "a gateway of this root on the file relay removes them after 6 h"; on a root that stays on Redis
    nothing did (``sweep_marks`` kept every mark that keeps a reply), so each start logged the INFO and asked Redis
    about them again. The Redis transport's housekeeping now removes such a mark once older than 6 h, as the file
    relay's would: only one Redis answered about, never one still younger, nor one whose envelope a file-relay
    shelf holds, nor one whose sender waits (written) or Redis could not be asked about."""
    client = redis_server.client()
    root = make_root(tmp_path, {"alice": {}, "bob": {}}, name="mini")
    paths = InboxPaths.from_root(root).ensure()
    old = time.time() - 7 * 3600

    def aged(mark: Path) -> Path:
        os.utime(mark, (old, old))
        return mark

    stale = aged(_write_mark_without_via(paths, uuid.uuid4().hex, "answered long ago", "alpha"))
    young = _write_mark_without_via(paths, uuid.uuid4().hex, "answered an hour ago", "alpha")
    shelved = _write_mark_without_via(paths, uuid.uuid4().hex, "its envelope shelved later", "alpha")
    with LogCapture("INFO") as logs, gateway(tmp_path, "mini", redis_server, RecordingRunner()) as mini:
        # after the start read the marks: a file-relay shelf holds the envelope of a mark Redis answered about
        shelf = paths.taken_parent / f"{SHELF_PREFIX}{uuid.uuid4().hex}"
        shelf.mkdir(mode=0o700)
        (shelf / LOCK_NAME).touch(mode=0o600)
        envelope = seed_envelope(target_connection="mini", target_profile="bob", message="on a shelf",
                                 envelope_id=shelved.stem)
        (shelf / shelved.name).write_text(json.dumps({**envelope, "reply_connection": "alpha"}), encoding="utf-8")
        aged(shelved)
        mini.housekeep()  # as the first tick's (and then hourly) housekeeping does
    assert not stale.exists(), "a mark no sender waits for, older than 6 h, is swept"
    assert young.exists() and shelved.exists()
    assert len(logs.matching("no sender waits for", stale.stem)) == 1, logs.lines
    assert logs.matching("no sender waits for", "removed once older than 6 h by the housekeeping"), logs.lines
    assert not client.exists(KEYS.replies("alpha")), "a reply no sender waits for was written"
    with LogCapture("INFO") as logs, gateway(tmp_path, "mini", redis_server, RecordingRunner()):
        pass
    assert not logs.matching("no sender waits for", stale.stem), "the next start asks about it no more"
    assert logs.matching("no sender waits for", young.stem), logs.lines
    assert shelved.exists()


def test_a_kept_reply_redis_could_not_be_asked_about_is_not_swept_by_age(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Redis down at the start: whether its sender still waits is unknown, so an old mark without ``via`` keeping
    a reply stays (written once Redis answers), however old."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}}, name="mini")
    paths = InboxPaths.from_root(root).ensure()
    mark = _write_mark_without_via(paths, uuid.uuid4().hex, "answered long ago", "alpha")
    old = time.time() - 7 * 3600
    os.utime(mark, (old, old))
    redis_server.kill()
    try:
        with gateway(tmp_path, "mini", redis_server, RecordingRunner()) as mini:  # started while Redis is down
            mini.housekeep()
            assert mark.exists()
    finally:
        redis_server.start()


def test_a_mark_without_via_that_redis_cannot_be_asked_about_at_start_is_written_and_its_sender_drops_it(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Redis down at the start: whether the sender of a reply kept in a mark without ``via`` still waits for it
    cannot be asked, so the reply is taken as owed, as before, and written once Redis answers. A sender that no
    longer waits for it (it has the reply) acks and deletes it: no second outcome."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}}, name="mini")
    paths = InboxPaths.from_root(root).ensure()
    envelope_id = uuid.uuid4().hex
    mark = _write_mark_without_via(paths, envelope_id, "answered long ago", "alpha")
    client = redis_server.client()
    redis_server.kill()
    with gateway(tmp_path, "mini", redis_server, RecordingRunner()):  # started while Redis is down
        redis_server.start()
        await_condition(lambda: replies_to(redis_server, "alpha"), timeout=30, message="written once Redis is back")
        await_condition(lambda: not mark.exists(), timeout=10, message="its mark cleared once it is in Redis")
    assert [r["id"] for r in replies_to(redis_server, "alpha")] == [envelope_id]
    seen: Counter[str] = Counter()
    with gateway(tmp_path, "alpha", redis_server) as alpha:
        alpha.subscribe(lambda o: seen.update([o["delivery_id"]]))
        await_condition(lambda: client.xlen(KEYS.replies("alpha")) == 0, timeout=20,
                        message="the sender acked and deleted a reply it does not wait for")
        await_drained(redis_server, KEYS.replies("alpha"))
        assert alpha.stats()["pending"] == 0
    assert seen == Counter(), seen


def test_a_reply_the_file_relay_wrote_before_a_kill_left_its_mark_is_not_written_to_redis(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """The other mark without ``via`` whose envelope is on no shelf: an older file relay killed between taking the
    envelope off its shelf and clearing the mark, the reply already in ``delivered/``. It is the file relay's (its
    reply is written): Redis leaves it, never writes it to a stream no sender waits on."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}}, name="mini")
    paths = InboxPaths.from_root(root).ensure()
    envelope_id = uuid.uuid4().hex
    mark = _write_mark_without_via(paths, envelope_id, "answered", "alpha")
    write_delivered(paths, make_reply(envelope_id, reply="answered", now=time.time()), "alpha")
    with LogCapture("WARNING") as logs, gateway(tmp_path, "mini", redis_server):
        pass  # its start read the marks and ran its first tick, which writes the owed replies
    assert not redis_server.client().exists(KEYS.replies("alpha")), "a file-relay reply was written to Redis"
    assert mark.exists()
    assert len(logs.matching("came in through the file relay", envelope_id)) == 1, logs.lines


def test_an_inbox_replaced_by_another_type_while_running_still_lets_the_replies_in(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """The other way round: our inbox replaced by a string while we run; the replies to our DMs are still read,
    the key is named in one ERROR, and once it is deleted the inbox is read again."""
    client = redis_server.client()
    inbox = KEYS.inbox("mini")
    with LogCapture("ERROR") as logs, gateway(tmp_path, "alpha", redis_server) as alpha, \
            gateway(tmp_path, "mini", redis_server) as mini:
        wait_online(mini, "bob", "alpha")
        wait_online(alpha, "bob", "mini")
        client.delete(inbox)
        client.set(inbox, "oops")
        ack = mini.message_agent(sender="alice", target="bob@alpha", message="replies still read")
        assert mini.wait_outcome(ack["delivery_id"], timeout=30)["status"] == "replied"
        await_condition(lambda: logs.matching(f"{inbox} holds a value that is not a stream", "DEL"), timeout=10,
                        message="the bad inbox key named")
        client.delete(inbox)
        ack = alpha.message_agent(sender="alice", target="bob@mini", message="inbox read again")
        assert alpha.wait_outcome(ack["delivery_id"], timeout=30)["status"] == "replied"
    assert len(logs.matching("holds a value that is not a stream")) == 1, logs.lines


def test_replies_waiting_for_an_absent_sender_are_never_trimmed(tmp_path: Path, redis_server: RedisServer) -> None:
    """Every reply waits in its sender's stream until the sender reads it, however many wait.

    The reply ``XADD`` used to carry ``MAXLEN ~ redis_max_stream_len``: with more unread replies
    than that (the sender away), the oldest were trimmed and those DMs, which ran, would have
    ended ``delivery_timeout``.
    """
    client = redis_server.client()
    client.config_set("stream-node-max-entries", 1)  # so that approximate trimming, were it used, trims exactly
    with gateway(tmp_path, "mini", redis_server, config={"bot_mode": {"redis_max_stream_len": 2}}):
        answered: list[str] = []
        for _wave in range(4):  # 8 replies for an absent sender, 2 envelopes at a time (the inbox bound)
            answered += [inject(redis_server, "mini", "away")["id"] for _ in range(2)]
            await_drained(redis_server, KEYS.inbox("mini"))  # its replies are written in the same MULTI
        assert [r["id"] for r in replies_to(redis_server, "away")] == answered
        assert {r["reply"] for r in replies_to(redis_server, "away")} == {"ok: hello bob"}


def test_sender_expires_an_undrained_envelope_and_it_never_runs_later(tmp_path: Path,
                                                                      redis_server: RedisServer) -> None:
    fake_connection(redis_server, "mini")
    with gateway(tmp_path, "alpha", redis_server, config={"bot_mode": {"envelope_ttl_seconds": 0.5}}) as alpha:
        wait_online(alpha, "bob", "mini")
        ack = alpha.message_agent(sender="alice", target="bob@mini", message="too late")
        out = alpha.wait_outcome(ack["delivery_id"], timeout=10)
        assert (out["status"], out["reason"], out["retryable"]) == ("failed", "queued_expired", True)
        assert "expired after 0.5s" in out["error"] and "NOT delivered" in out["error"]
        assert "waiting in Redis" in out["error"] and "Desktop" not in out["error"]
        rec = RecordingRunner()
        with gateway(tmp_path, "mini", redis_server, rec, config={"bot_mode": {"envelope_ttl_seconds": 0}}):
            client = redis_server.client()
            await_condition(lambda: client.xlen(KEYS.inbox("mini")) == 0, timeout=5, message="expired entry acked")
        assert rec.entered == []  # the sender's "expired" claim wins over a late drain


def test_drain_side_expiry_replies_queued_expired(tmp_path: Path, redis_server: RedisServer) -> None:
    rec = RecordingRunner()
    with gateway(tmp_path, "mini", redis_server, rec, config={"bot_mode": {"envelope_ttl_seconds": 60}}):
        envelope = inject(redis_server, "mini", "probe", created=time.time() - 120)
        await_condition(lambda: replies_to(redis_server, "probe"), timeout=5, message="a reply to probe")
    [reply] = replies_to(redis_server, "probe")
    assert (reply["id"], reply["reason"], reply["reply"]) == (envelope["id"], "queued_expired", "")
    assert "expired after 60s" in reply["error"] and "Desktop" not in reply["error"]
    assert rec.entered == []


def test_duplicate_entries_of_one_envelope_run_one_turn(tmp_path: Path, redis_server: RedisServer) -> None:
    release = threading.Event()
    rec = RecordingRunner(lambda turn: (release.wait(timeout=30), "once")[1])
    client = redis_server.client()
    with gateway(tmp_path, "mini", redis_server, rec) as mini:
        envelope = inject(redis_server, "mini", "probe")
        await_condition(lambda: len(rec.entered) == 1, timeout=10, message="the first turn is running")
        inject(redis_server, "mini", "probe", envelope_id=envelope["id"])  # e.g. a retried XADD, while it runs
        await_condition(lambda: client.xpending(KEYS.inbox("mini"), "hermes")["pending"] == 2, timeout=10,
                        message="the duplicate was read by mini")
        mini.housekeep()  # an ask: the transport actor's mailbox is flushed past the duplicate
        release.set()
        await_condition(lambda: replies_to(redis_server, "probe"), timeout=10, message="a reply")
        inject(redis_server, "mini", "probe", envelope_id=envelope["id"])  # after it was answered
        await_drained(redis_server, KEYS.inbox("mini"))  # every entry acked: none left to run a turn
    assert [t.delivery_id for t in rec.entered] == [envelope["id"]]
    assert [r["reply"] for r in replies_to(redis_server, "probe")] == ["once"]


def _stop_with_one_running_and_one_queued(
    tmp_path: Path, server: RedisServer, on_wait: Callable[[dict[str, Any], threading.Event], Callable[..., Any]]
) -> tuple[dict[str, Any], dict[str, Any], RecordingRunner]:
    """Start mini, get one injected envelope's turn running and a second queued behind it, then stop mini.

    Args:
        on_wait: given the queued envelope and the event that releases the running turn, the
            stop's ``on_wait`` callback (it must set the event).

    Returns:
        (the running envelope, the queued one, mini's runner).
    """
    release = threading.Event()
    first = RecordingRunner(lambda turn: (release.wait(timeout=30), "first done")[1])
    root = make_root(tmp_path, {"alice": {}, "bob": {}}, name="mini")
    mini = Gateway(root, runner=first, config=_config(server), connection_id="mini", durable=False).start()
    queued: dict[str, Any] = {}
    try:
        running = inject(server, "mini", "probe")
        await_condition(lambda: len(first.entered) == 1, timeout=10, message="the first turn is running")
        queued = inject(server, "mini", "probe")
        await_condition(lambda: mini.stats()["pending"] == 2, timeout=10, message="the second one queued")
    finally:
        mini.stop(timeout=30, on_wait=on_wait(queued, release))
        release.set()
    return running, queued, first


def test_an_entry_still_queued_at_stop_is_left_unacked_and_the_next_start_runs_it_once(
    tmp_path: Path, redis_server: RedisServer, logs: LogCapture
) -> None:
    """Not answered ``cancelled`` (resend): its entry stays pending, and the next start reclaims and runs it."""
    running, queued, first = _stop_with_one_running_and_one_queued(
        tmp_path, redis_server, lambda queued, release: lambda turns, grace: release.set())
    assert logs.matching("redis: 1 relayed-in entr(ies) never started and stay pending")  # a warning, seen without -v
    assert [r["id"] for r in replies_to(redis_server, "probe")] == [running["id"]]  # no "cancelled" reply
    client = redis_server.client()
    assert client.xpending(KEYS.inbox("mini"), "hermes")["pending"] == 1  # the queued entry, unacked
    assert not client.exists(KEYS.claim(queued["id"]))  # its turn was never claimed
    again = RecordingRunner()
    with gateway(tmp_path, "mini", redis_server, again):
        await_condition(lambda: len(replies_to(redis_server, "probe")) == 2, timeout=10, message="its reply")
        await_drained(redis_server, KEYS.inbox("mini"))
    replies = {r["id"]: r for r in replies_to(redis_server, "probe")}
    assert (replies[running["id"]]["reply"], replies[queued["id"]]["reply"]) == ("first done", "ok: hello bob")
    assert [t.delivery_id for t in first.entered] == [running["id"]]
    assert [t.delivery_id for t in again.entered] == [queued["id"]]  # run once, by the next start only


def test_a_clean_stop_with_an_inbox_backlog_writes_every_finished_reply_and_leaves_the_rest_pending(
    tmp_path: Path, redis_server: RedisServer, logs: LogCapture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (the file relay's chaos-run crash, same pattern here): an inbox entry the transport handled
    after the Dispatcher had stopped was told to it plainly, and the ActorDeadError crashed the unsupervised
    transport, which dropped what was queued behind: the reply of a turn that finished during the stop never
    reached Redis. The transport is held in its handling of the entry ``late`` until the Dispatcher is gone,
    so everything the stop tells it queues behind, as in the chaos run."""
    from hermes_actors.transports.redis.inbound import InboundDrain

    late_id = uuid.uuid4().hex
    held, go_on = threading.Event(), threading.Event()
    on_entry = InboundDrain.on_entry

    def held_entry(self: InboundDrain, entry_id: str, fields: dict[Any, Any]) -> None:
        if decode_envelope_entry(fields)[0]["id"] == late_id and not held.is_set():
            held.set()
            go_on.wait(30)  # bounded: a stuck test fails, it never hangs
        on_entry(self, entry_id, fields)

    monkeypatch.setattr(InboundDrain, "on_entry", held_entry)
    release = threading.Event()
    first = RecordingRunner(lambda turn: (release.wait(timeout=30), "first done")[1])
    root = make_root(tmp_path, {"alice": {}, "bob": {}}, name="mini")
    mini = Gateway(root, runner=first, config=_config(redis_server), connection_id="mini", durable=False).start()
    try:
        running = inject(redis_server, "mini", "probe")
        await_condition(lambda: len(first.entered) == 1, timeout=10, message="the first turn is running")
        queued = inject(redis_server, "mini", "probe")
        await_condition(lambda: mini.stats()["pending"] == 2, timeout=10, message="the second one queued")
        inject(redis_server, "mini", "probe", envelope_id=late_id)
        assert held.wait(10), "the transport took up the late entry"
        assert mini._system is not None and mini._system.dispatcher is not None
        dispatcher = mini._system.dispatcher
        stopper = threading.Thread(target=mini.stop, kwargs={"timeout": 20,
                                                             "on_wait": lambda turns, grace: release.set()})
        stopper.start()
        await_condition(lambda: not dispatcher.is_alive(), timeout=20, message="the Dispatcher stopped")
    finally:
        go_on.set()
        release.set()
    stopper.join(timeout=30)
    assert not stopper.is_alive()
    replies = replies_to(redis_server, "probe")
    assert [(r["id"], r["reply"]) for r in replies] == [(running["id"], "first done")]  # the finished turn's
    assert redis_server.client().xpending(KEYS.inbox("mini"), "hermes")["pending"] == 2  # queued and late, unacked
    assert not logs.matching("crashed")
    again = RecordingRunner()
    with gateway(tmp_path, "mini", redis_server, again):
        await_condition(lambda: len(replies_to(redis_server, "probe")) == 3, timeout=15, message="their replies")
        await_drained(redis_server, KEYS.inbox("mini"))
    assert sorted(t.delivery_id for t in again.entered) == sorted([queued["id"], late_id])  # each run once
    assert [t.delivery_id for t in first.entered] == [running["id"]]


def _times_delivered(server: RedisServer, conn: str, entry_of: str) -> int:
    """How often the pending inbox entry of envelope ``entry_of`` was handed to a consumer (0: not pending)."""
    client = server.client()
    stream = KEYS.inbox(conn)
    for pending in client.xpending_range(stream, "hermes", min="-", max="+", count=100):
        fields = dict(client.xrange(stream, pending["message_id"], pending["message_id"])[0][1])
        if decode_envelope_entry(fields)[0]["id"] == entry_of:
            return int(pending["times_delivered"])
    return 0


def test_an_entry_put_back_by_a_long_stop_is_reclaimed_by_that_stop_and_still_not_answered(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """The stopping gateway's own reclaim takes the put-back entry again (nothing holds it now): that is
    left pending again, never handed to the stopping Dispatcher, never answered from the stop's first
    ``cancelled``."""

    def on_wait(queued: dict[str, Any], release: threading.Event) -> Callable[[int, float], None]:
        def wait(turns: int, grace: float) -> None:  # two reclaims (claim idle 0.5 s) while the stop waits
            await_condition(lambda: _times_delivered(redis_server, "mini", queued["id"]) >= 3
                            or len(replies_to(redis_server, "probe")) > 0, timeout=15,
                            message="the put-back entry reclaimed twice, or answered")
            release.set()

        return wait

    running, queued, first = _stop_with_one_running_and_one_queued(tmp_path, redis_server, on_wait)
    assert [r["id"] for r in replies_to(redis_server, "probe")] == [running["id"]]  # no "cancelled" reply
    assert _times_delivered(redis_server, "mini", queued["id"]) >= 3
    assert [t.delivery_id for t in first.entered] == [running["id"]]


def test_a_live_owners_turn_that_ends_cancelled_during_the_stop_is_answered_not_left_to_run_again(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """A live owner's turn takes no Redis turn claim; its start mark still says it may have been shown."""
    release = threading.Event()
    shown: list[str] = []

    def owner(turn: Turn) -> str:
        shown.append(turn.delivery_id)
        release.wait(timeout=30)
        raise TurnFailed("the Bot Chat window closed as the gateway stopped", reason="cancelled")

    root = make_root(tmp_path, {"alice": {}, "bob": {}}, name="mini")
    mini = Gateway(root, runner=RecordingRunner(), config=_config(redis_server), connection_id="mini",
                   durable=False)
    mini.attach_live_owner("bob", owner)
    mini.start()
    try:
        envelope = inject(redis_server, "mini", "probe")
        await_condition(lambda: shown == [envelope["id"]], timeout=10, message="the owner shows the DM")
    finally:
        mini.stop(timeout=20, on_wait=lambda turns, grace: release.set())
        release.set()
    [reply] = replies_to(redis_server, "probe")
    assert (reply["id"], reply["reason"]) == (envelope["id"], "cancelled")
    client = redis_server.client()
    assert client.xpending(KEYS.inbox("mini"), "hermes")["pending"] == 0  # acked: nothing left to run it again
    assert os.listdir(root / "bot_relay" / "started") == []


def test_an_entry_whose_turn_a_dead_consumer_claimed_is_ambiguous(tmp_path: Path, redis_server: RedisServer) -> None:
    envelope_id = uuid.uuid4().hex
    redis_server.client().set(KEYS.claim(envelope_id), b"deadhost-1-abc")  # claimed by a consumer with no heartbeat
    rec = RecordingRunner()
    with gateway(tmp_path, "mini", redis_server, rec):
        inject(redis_server, "mini", "probe", envelope_id=envelope_id)
        await_condition(lambda: replies_to(redis_server, "probe"), timeout=5, message="a reply")
    [reply] = replies_to(redis_server, "probe")
    assert reply["reason"] == "ambiguous" and reply["error"] == (
        "The gateway process that was running this turn (deadhost-1-abc) died before it replied. "
        "The message may have been delivered — do not resend.")
    assert rec.entered == []


def test_entries_addressed_elsewhere_or_malformed_are_dropped(tmp_path: Path, redis_server: RedisServer) -> None:
    rec = RecordingRunner()
    client = redis_server.client()
    with gateway(tmp_path, "mini", redis_server, rec):
        envelope = inject(redis_server, "other", "probe")
        client.xadd(KEYS.inbox("mini"), encode_envelope_entry(envelope, "probe"))  # target_connection "other"
        client.xadd(KEYS.inbox("mini"), {"envelope": b"{not json", "reply_to": b"probe"})
        client.xadd(KEYS.inbox("mini"), {"junk": b"1"})
        await_condition(lambda: client.xlen(KEYS.inbox("mini")) == 0, timeout=5, message="dropped and acked")
    assert rec.entered == [] and replies_to(redis_server, "probe") == []


BAD_HOPS = ["abc", -5, 1.5, None, 1e40, True, 1001]


def test_a_hand_written_envelope_with_a_bad_hop_is_dropped_with_a_warning_not_run(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Regression (review): an envelope's ``hop`` was not checked ("abc", -5, 1.5, null, 1e40 were run); now it is
    checked as a submit request's (an integer from 0 to MAX_HOP, or absent) and a bad one is dropped as the other
    malformed entries are: a WARNING, acked, no turn, no reply."""
    rec = RecordingRunner()
    client = redis_server.client()

    def entry(**hop: Any) -> tuple[str, dict[str, bytes]]:
        envelope = {"id": uuid.uuid4().hex, "created_at": int(time.time()), "from_profile": "probe",
                    "from_handle": "probe", "target_connection": "mini", "target_profile": "bob",
                    "target_handle": "bob", "message": "hand-written", **hop}
        return envelope["id"], {"envelope": orjson.dumps(envelope), "reply_to": b"probe"}

    bad = [entry(hop=h) for h in BAD_HOPS]
    good = [entry(), entry(hop=0), entry(hop=3)]
    with LogCapture("WARNING") as logs, gateway(tmp_path, "mini", redis_server, rec):
        for _id, fields in bad + good:
            client.xadd(KEYS.inbox("mini"), fields)
        await_condition(lambda: len(replies_to(redis_server, "probe")) == len(good), timeout=20,
                        message="a reply for each envelope with a good hop")
        await_drained(redis_server, KEYS.inbox("mini"))
    assert sorted(t.delivery_id for t in rec.entered) == sorted(i for i, _ in good), "no bad hop ran a turn"
    assert sorted(r["id"] for r in replies_to(redis_server, "probe")) == sorted(i for i, _ in good)
    dropped = logs.matching("dropping a malformed inbox entry", "'hop'")
    assert len(dropped) == len(bad), logs.lines


def test_a_dm_whose_hop_no_target_would_accept_is_refused_not_sent(tmp_path: Path, redis_server: RedisServer) -> None:
    """The target would drop an envelope past MAX_HOP unanswered (a ``delivery_timeout`` much later), so the
    sender refuses hop 1001 at once and queues nothing, even with ``max_hops`` at its most (MAX_HOP: the config
    takes no deeper limit); hop 1000 is sent."""
    fake_connection(redis_server, "ghost")
    with gateway(tmp_path, "alpha", redis_server, config={"bot_mode": {"max_hops": MAX_HOP}}) as alpha:
        wait_online(alpha, "bob", "ghost")
        refused = alpha.message_agent(sender="alice", target="bob@ghost", message="deep", hop=1001)
        assert refused["reason"] == "loop_guard" and "NOT sent" in refused["error"], refused
        assert "delivery_id" in alpha.message_agent(sender="alice", target="bob@ghost", message="ok", hop=1000)
    assert redis_server.client().xlen(KEYS.inbox("ghost")) == 1


def test_credentials_never_reach_the_logs(tmp_path: Path) -> None:
    from redis_fixture import redis_binary

    if redis_binary() is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(tmp_path / "redis", password="s3cret-pw").start()
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="DEBUG")
    try:
        with gateway(tmp_path, "alpha", server) as alpha, gateway(tmp_path, "mini", server):
            wait_online(alpha, "bob", "mini")
            ack = alpha.message_agent(sender="alice", target="bob@mini", message="auth works")
            assert alpha.wait_outcome(ack["delivery_id"], timeout=10)["status"] == "replied"
            server.kill()
            refusal = alpha.message_agent(sender="alice", target="bob@mini", message="down")
            assert "s3cret" not in str(refusal)
            await_condition(lambda: sum("unreachable" in line for line in lines) >= 2, timeout=10,
                            message="the outage logged (by the send and by a tick)")
    finally:
        logger.remove(sink)
        server.kill()
    text = "\n".join(lines)
    assert "redis://:***@127.0.0.1" in text
    assert "s3cret" not in text


def test_acl_user_in_the_url(tmp_path: Path, redis_server: RedisServer) -> None:
    admin = redis_server.client()
    admin.acl_setuser("gateway", enabled=True, passwords=["+gw-pass"], keys=["hermes:bot:*"],
                      commands=["+@all", "-@dangerous", "+info"])
    url = f"redis://gateway:gw-pass@127.0.0.1:{redis_server.port}/0"
    cfg = {"bot_mode": {"transport": url}}
    with gateway(tmp_path, "alpha", redis_server, config=cfg) as alpha, \
            gateway(tmp_path, "mini", redis_server, config=cfg):
        wait_online(alpha, "bob", "mini")
        ack = alpha.message_agent(sender="alice", target="bob@mini", message="acl")
        assert alpha.wait_outcome(ack["delivery_id"], timeout=10)["status"] == "replied"
    bad = {"bot_mode": {"transport": f"redis://gateway:wrong@127.0.0.1:{redis_server.port}/0"}}
    with pytest.raises(TransportError, match="refused our credentials"), \
            gateway(tmp_path, "beta", redis_server, config=bad):  # not retried forever: the start fails
        pytest.fail("a gateway started with a wrong password")


# ── bot_peers: over Redis, and over the CLI transport ───────────────────────


def test_bot_peers_target_that_is_a_redis_connection(tmp_path: Path, redis_server: RedisServer) -> None:
    rec = RecordingRunner()
    peers = {"bot_peers": {"mini": {}, "elsewhere": {}}}
    cli = tmp_path / "no-hermes-here"
    transport = PeerCliTransport(cli=str(cli), timeout=5)
    with gateway(tmp_path, "alpha", redis_server, config=peers, peer_transport=transport) as alpha, \
            gateway(tmp_path, "mini", redis_server, rec):
        wait_online(alpha, "bob", "mini")
        main = alpha.message_agent(sender="alice", target="mini", message="to your main agent")
        bob = alpha.message_agent(sender="alice", target="mini/bob", message="to bob")
        assert main["to"] == "@mini on peer 'mini'" and bob["to"] == "@bob on peer 'mini'"
        assert alpha.wait_outcome(main["delivery_id"], timeout=10)["reply"] == "ok: to your main agent"
        assert alpha.wait_outcome(bob["delivery_id"], timeout=10)["reply"] == "ok: to bob"
        assert sorted((t.profile, t.delivery_id) for t in rec.entered) == sorted(
            [("default", main["delivery_id"]), ("bob", bob["delivery_id"])])
        unknown = alpha.message_agent(sender="alice", target="mini/zed", message="?")
        assert "No agent 'zed' on peer 'mini'" in unknown["error"]
        # a peer that is not on Redis goes to the CLI transport (here: no such executable)
        other = alpha.message_agent(sender="alice", target="elsewhere/bob", message="via cli")
        out = alpha.wait_outcome(other["delivery_id"], timeout=10)
        assert out["reason"] == "runtime_offline" and "hermes CLI not found" in out["error"]


def test_a_bot_peers_target_offline_on_redis_is_refused_naming_it_as_its_ack_does(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """Regression: a bare peer name `mini` was acked as `@mini on peer 'mini'` but refused as `@hermes on Mini is
    offline right now` once that machine was down; both now use the seed's peer label."""
    peers = {"bot_peers": {"mini": {}}}
    with gateway(tmp_path, "alpha", redis_server, config=peers) as alpha:
        with gateway(tmp_path, "mini", redis_server, config={"bot_mode": {"connection_label": "Mini"}}):
            wait_online(alpha, "bob", "mini")
            ack = alpha.message_agent(sender="alice", target="mini", message="while it runs")
            assert ack["to"] == "@mini on peer 'mini'"
            alpha.wait_outcome(ack["delivery_id"], timeout=10)
        wait_online(alpha, "bob", "mini", online=False)  # a clean stop deletes its heartbeat at once
        bare = alpha.message_agent(sender="alice", target="mini", message="while it is down")
        named = alpha.message_agent(sender="alice", target="mini/bob", message="while it is down")
    assert bare["reason"] == named["reason"] == "runtime_offline"
    assert bare["error"].startswith("@mini on peer 'mini' is offline right now — the message was NOT queued."), bare
    assert named["error"].startswith("@bob on peer 'mini' is offline right now"), named


FAKE_HERMES = """#!{python}
import json, os, sys
body = sys.stdin.read()
with open({log!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "stdin": body,
                        "author": json.loads(os.environ.get("HERMES_TURN_AUTHOR", "null"))}}) + "\\n")
if "fail" in body:
    print("peer is not running", file=sys.stderr)
    sys.exit(3)
print("peer says: " + body.rsplit(": ", 1)[-1])
"""


def test_bot_peers_over_the_cli_transport_with_a_fake_hermes(tmp_path: Path, redis_server: RedisServer) -> None:
    log = tmp_path / "fake-hermes.log"
    cli = tmp_path / "bin" / "hermes"
    cli.parent.mkdir()
    cli.write_text(FAKE_HERMES.format(python=sys.executable, log=str(log)), encoding="utf-8")
    cli.chmod(cli.stat().st_mode | stat.S_IXUSR)
    peers = {"bot_peers": {"studio": {}}}
    with gateway(tmp_path, "alpha", redis_server, config=peers,
                 peer_transport=PeerCliTransport(cli=str(cli), timeout=10)) as alpha:
        ok = alpha.message_agent(sender="alice", target="studio/ray", message="hello ray")
        main = alpha.message_agent(sender="alice", target="studio", message="hello main")
        bad = alpha.message_agent(sender="alice", target="studio/ray", message="please fail")
        out = alpha.wait_outcome(ok["delivery_id"], timeout=15)
        assert (out["status"], out["reply"]) == ("replied", "peer says: hello ray")
        assert out["from"] == "@ray on peer 'studio'"
        assert alpha.wait_outcome(main["delivery_id"], timeout=15)["reply"] == "peer says: hello main"
        failed = alpha.wait_outcome(bad["delivery_id"], timeout=15)
        assert failed["status"] == "failed" and "peer is not running" in failed["error"]
    calls = [orjson.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    by_body = {c["stdin"].rsplit(": ", 1)[-1]: c for c in calls}
    assert by_body["hello ray"]["argv"] == ["-p", "default", "peer", "dm", "studio/ray"]
    assert by_body["hello main"]["argv"] == ["-p", "default", "peer", "dm", "studio"]
    assert by_body["hello ray"]["stdin"].startswith("Message from 🤖 alice (@alice): ")
    # a peer dm crosses installs: the author id names this host (as the seed's bot_author_id(me, local_origin()))
    assert by_body["hello ray"]["author"] == {"id": f"bot:{local_origin()}/alice", "name": "alice", "is_bot": True}
    assert local_origin() and "/" not in local_origin()
    assert len(calls) == 3  # no local retry: the peer retries on its own side


# ── Redis killed and restarted mid-run ──────────────────────────────────────


def test_a_restart_during_a_redis_outage_answers_a_turn_that_ended_with_its_reply_not_ambiguous(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Regression (review): a relayed-in turn that ended while Redis was down had its reply in memory only, to be
    written once Redis answered again; a gateway restarted before that lost it, and its reclaimed entry (its turn
    claimed by the dead run) was answered ``ambiguous``. Now the reply is kept in the envelope's start mark before
    any write is tried: the restarted gateway writes it once Redis is back, and the turn never runs again (its
    claim is the dead run's, and the written reply's ``done`` mark acks the entry)."""
    release = threading.Event()
    first = RecordingRunner(lambda turn: (release.wait(timeout=30), "answered in the outage")[1])
    root = make_root(tmp_path, {"alice": {}, "bob": {}}, name="mini")
    mini = Gateway(root, runner=first, config=_config(redis_server), connection_id="mini", durable=False).start()
    try:
        envelope = inject(redis_server, "mini", "probe")
        await_condition(lambda: len(first.entered) == 1, timeout=10, message="its turn is running")
        redis_server.kill()
        release.set()
        # its outcome left the Dispatcher (pending 0), and the transport, asked after it, has handled it
        await_condition(lambda: mini.stats()["pending"] == 0, timeout=20, message="the turn's outcome handed over")
    finally:
        release.set()
        mini.stop(timeout=30)  # during the outage: the reply is not in Redis
    again = RecordingRunner()
    with gateway(tmp_path, "mini", redis_server, again):  # restarted while Redis is still down
        redis_server.start()
        await_condition(lambda: replies_to(redis_server, "probe"), timeout=30, message="its reply, once Redis is back")
        await_drained(redis_server, KEYS.inbox("mini"))
    [reply] = replies_to(redis_server, "probe")
    assert (reply["id"], reply["reply"], reply["reason"]) == (envelope["id"], "answered in the outage", ""), reply
    assert [t.delivery_id for t in first.entered] == [envelope["id"]] and again.entered == []
    assert os.listdir(root / "bot_relay" / "started") == []


def test_a_restart_answers_a_reclaimed_turn_that_ended_with_its_journaled_reply_when_no_mark_kept_it(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (review): while Redis hung, a relayed-in turn ended and its outcome was journaled, but the
    transport, stuck on the hung Redis, never took that outcome up, so no start mark kept the reply; the gateway
    was killed and restarted, and its reclaimed entry (its turn claimed by the dead run) was answered ``ambiguous``
    from the dead claim alone, though the root's journal held the real reply. Now the reclaimed entry goes to the
    Dispatcher, whose book (the journal's, after the restart) answers it with that reply; no turn runs again. The
    stuck transport is the patched ``on_outcome``, which drops the outcome."""
    from hermes_actors.transports.redis.inbound import InboundDrain

    handed = threading.Event()

    def stuck(self: InboundDrain, outcome: Any, *, put_back: bool = False) -> None:
        handed.set()  # the transport never gets to keep or write the reply

    monkeypatch.setattr(InboundDrain, "on_outcome", stuck)
    first = RecordingRunner(lambda turn: "answered before the kill")
    root = make_root(tmp_path, {"alice": {}, "bob": {}}, name="mini")
    with Gateway(root, runner=first, config=_config(redis_server), connection_id="mini", durable=True):
        envelope = inject(redis_server, "mini", "probe")
        assert handed.wait(20), "the turn's outcome handed to the transport"
    monkeypatch.undo()
    assert replies_to(redis_server, "probe") == []  # the reply is in the journal only
    again = RecordingRunner()
    with gateway(tmp_path, "mini", redis_server, again, durable=True):
        await_condition(lambda: replies_to(redis_server, "probe"), timeout=30, message="its reply")
        await_drained(redis_server, KEYS.inbox("mini"))
    [reply] = replies_to(redis_server, "probe")
    assert (reply["id"], reply["reply"], reply["reason"]) == (envelope["id"], "answered before the kill", ""), reply
    assert [t.delivery_id for t in first.entered] == [envelope["id"]] and again.entered == []
    assert os.listdir(root / "bot_relay" / "started") == []


def test_redis_restart_mid_run_every_acked_dm_ends_in_exactly_one_outcome(tmp_path: Path,
                                                                          redis_server: RedisServer) -> None:
    turns: Counter[str] = Counter()
    lock = threading.Lock()

    def behave(turn: Turn) -> str:
        with lock:
            turns[turn.delivery_id] += 1
        time.sleep(0.005)
        return f"done {turn.delivery_id}"

    seen: Counter[str] = Counter()
    with ExitStack() as stack:
        alpha = stack.enter_context(gateway(tmp_path, "alpha", redis_server))
        stack.enter_context(gateway(tmp_path, "mini", redis_server, RecordingRunner(behave)))
        alpha.subscribe(lambda o: seen.update([o["delivery_id"]]))
        wait_online(alpha, "bob", "mini")
        acked: list[str] = []
        refused: list[dict[str, Any]] = []
        for i in range(300):
            if i == 100:
                redis_server.kill()
            if i == 150:
                redis_server.start()
                wait_online(alpha, "bob", "mini", timeout=15)
            ack = alpha.message_agent(sender="alice", target="bob@mini", message=f"n{i}")
            (acked.append(ack["delivery_id"]) if "delivery_id" in ack else refused.append(ack))
            if 100 <= i < 150:
                time.sleep(0.01)
        outcomes = {d: alpha.wait_outcome(d, timeout=60) for d in acked}
        await_condition(lambda: all(seen[d] >= 1 for d in acked), timeout=10, message="every outcome notified")
        await_drained(redis_server, KEYS.inbox("mini"), KEYS.replies("alpha"))  # nothing left to answer twice
    assert len(acked) >= 200 and refused, (len(acked), Counter(r["error"][:60] for r in refused))
    assert {r["reason"] for r in refused} <= {"runtime_offline", "target_busy"}
    assert {d: n for d, n in seen.items() if n != 1} == {}
    assert set(seen) == set(acked)
    assert {d: n for d, n in turns.items() if n != 1} == {}  # no turn ran twice
    statuses = Counter((o["status"], o["reason"]) for o in outcomes.values())
    assert statuses[("replied", "")] >= len(acked) - 5, statuses
    for d, o in outcomes.items():
        if o["status"] == "replied":
            assert o["reply"] == f"done {d}" and turns[d] == 1


# ── the pure half ───────────────────────────────────────────────────────────


def test_transport_selection_and_url_masking() -> None:
    assert redis_url_from_config({}) is None
    assert redis_url_from_config({"bot_mode": {"transport": "file"}}) is None
    assert redis_url_from_config({"bot_mode": {"transport": "rediss://u:p@h:1/2"}}) == "rediss://u:p@h:1/2"
    assert redis_url_from_config({"bot_mode": {"transport": "redis"}}, {"REDIS_URL": "redis://h"}) == "redis://h"
    with pytest.raises(ValueError, match="REDIS_URL"):
        redis_url_from_config({"bot_mode": {"transport": "redis"}}, {})
    with pytest.raises(ValueError) as info:
        redis_url_from_config({"bot_mode": {"transport": "http://u:secret@h"}})
    assert "secret" not in str(info.value)
    # the whole URL is checked before anything connects, with one rule for config.yaml, REDIS_URL and --redis
    with pytest.raises(ValueError, match=r"^bot_mode.transport 'redis://u:\*\*\*@h:99999/0' has port '99999': a "
                                         r"port is a whole number from 1 to 65535"):
        redis_url_from_config({"bot_mode": {"transport": "redis://u:pw@h:99999/0"}})
    with pytest.raises(ValueError, match=r"^REDIS_URL \(bot_mode.transport: redis\) 'redis://h:6379/x' has database"):
        redis_url_from_config({"bot_mode": {"transport": "redis"}}, {"REDIS_URL": "redis://h:6379/x"})
    for url in ("redis://h", "redis://h:1/15", "rediss://u:p@[::1]:65535/0/", "unix:///tmp/r.sock?db=2",
                "redis://h:6379?db=3", "REDIS://H:6379/0", "redis://h/2147483647", "redis://h/0002"):
        assert redis_url_problem(url) is None, url
    for url, says in (("redis://h:0/0", "has port 0"), ("redis://h:-1/0", "has port '-1'"),
                      ("redis://exa mple/0", "has host 'exa mple'"), ("redis://h/0?db=one", "has database index 'one'"),
                      ("redis://[::1/0", "is not a valid URL"), ("unix://", "names no socket"),
                      ("redis:h", "is not a redis://"),
                      # a digit to isdigit() the client's int() refuses; past what SELECT takes (a C int)
                      ("redis://h/\u00b2", "has database index '\u00b2'"),
                      ("redis://h/?db=\u00b2", "has database index"),
                      ("redis://h/2147483648", "has database index '2147483648'"),
                      ("redis://h/" + "1" * 100_000, f"has database index '{'1' * 59}…' (100,000 characters)"),
                      ("redis://h:" + "1" * 100_000, f"has port '{'1' * 59}…' (100,000 characters)")):
        assert (redis_url_problem(url) or "").startswith(says), url
    assert mask_url("redis://user:pw@host:6380/1") == "redis://user:***@host:6380/1"
    assert mask_url("redis://:pw@host") == "redis://:***@host"
    assert mask_url("redis://host:6379/0") == "redis://host:6379/0"
    assert mask_url("unix:///tmp/r.sock?password=pw&db=1") == "unix:///tmp/r.sock?password=***&db=1"
    assert server_address("rediss://u:p@example.com:6390/0") == "example.com:6390"
    assert server_address("redis://h") == "h:6379"


def test_settings_defaults_and_bad_values() -> None:
    s = redis_settings({}, "redis://h")
    assert (s.claim_idle_seconds, s.max_stream_len, s.heartbeat_seconds, s.prefix) == (60.0, 100_000, 5.0,
                                                                                        "hermes:bot")
    bad = redis_settings({"bot_mode": {"redis_claim_idle_seconds": "soon", "redis_max_stream_len": -1,
                                       "redis_heartbeat_seconds": None}}, "redis://h")
    assert (bad.claim_idle_seconds, bad.max_stream_len, bad.heartbeat_seconds) == (60.0, 100_000, 5.0)
    assert 0.05 <= redis_settings({"bot_mode": {"redis_claim_idle_seconds": 0.5}}, "redis://h").tick_seconds <= 0.17
    assert s.heartbeat_ttl_seconds == 15.0  # three periods
    assert redis_settings({"bot_mode": {"redis_heartbeat_seconds": 0.2}}, "redis://h").heartbeat_ttl_seconds == 5.0


def test_remote_rows_are_untrusted() -> None:
    rows = parse_remote_rows("mini", {
        b"bob": orjson.dumps({"profile": "bob", "handle": "bob", "connection_id": "mini", "title": "B" * 500}),
        b"evil": orjson.dumps({"profile": "eve", "handle": "eve", "connection_id": "alpha"}),  # not its own
        b"bad": b"{nope", b"list": b"[1]", b"name": orjson.dumps({"profile": "../x", "connection_id": "mini"}),
    }, online=False)
    assert [(r.profile, r.online, len(r.title)) for r in rows] == [("bob", False, 120)]
    assert KEYS.roster_connection("hermes:bot:roster:mini") == "mini"
    assert KEYS.roster_connection("hermes:bot:roster:../x") is None


def test_only_rosters_lost_with_ours_are_remembered_and_only_until_their_key_would_expire() -> None:
    bob = parse_remote_rows("mini", {b"b": orjson.dumps({"profile": "bob", "connection_id": "mini"})}, True)
    known = {"mini": KnownRoster(tuple(bob), expires_at=100.0), "gone": KnownRoster((), expires_at=50.0)}
    assert remembered_rosters(known, set(), lost=False, now=10.0) == {}  # vanished alone: retired
    kept = remembered_rosters(known, set(), lost=True, now=60.0)
    assert list(kept) == ["mini"] and kept["mini"].remembered and [r.online for r in kept["mini"].rows] == [False]
    assert remembered_rosters(kept, set(), lost=False, now=99.0) == kept  # still remembered on the next reads
    assert remembered_rosters(kept, set(), lost=False, now=100.0) == {}  # its key would have expired now
    assert remembered_rosters(kept, {"mini"}, lost=False, now=60.0) == {}  # published again: read, not remembered
    assert roster_expiry(10.0, 5000) == 15.0 and roster_expiry(10.0, -1) == 10.0 + 24 * 3600


def test_envelope_entry_round_trip_and_refusals() -> None:
    target = parse_remote_rows("mini", {b"b": orjson.dumps({"profile": "bob", "connection_id": "mini"})}, True)[0]
    envelope = make_envelope(target=target, message="hi", sender_profile="alice", sender_handle="alice", now=1.0,
                             extra={"hop": 2})
    fields = encode_envelope_entry(envelope, "alpha")
    assert decode_envelope_entry(fields) == (envelope, "alpha")
    assert decode_envelope_entry({k.encode(): v for k, v in fields.items()})[1] == "alpha"
    for broken in ({**fields, "reply_to": b"../x"}, {"reply_to": b"alpha"}, {**fields, "envelope": b"[]"}):
        with pytest.raises(ValidationError):
            decode_envelope_entry(broken)
    for hop in BAD_HOPS:
        with pytest.raises(ValidationError, match="'hop' is not an integer from 0 to 1000"):
            decode_envelope_entry({**fields, "envelope": orjson.dumps({**envelope, "hop": hop})})
    for hop in (0, 1000):
        assert decode_envelope_entry({**fields, "envelope": orjson.dumps({**envelope, "hop": hop})})[0]["hop"] == hop
    no_hop = {k: v for k, v in envelope.items() if k != "hop"}
    assert "hop" not in decode_envelope_entry({**fields, "envelope": orjson.dumps(no_hop)})[0]  # a first DM


def test_reply_written_reads_the_multi_answers() -> None:
    """Only the reply's XADD decides: WRONGTYPE there owes the reply; any other error there is retried; an error
    after it (an ack) leaves the reply written."""
    from redis.exceptions import ResponseError

    from hermes_actors.transports.redis.inbound import reply_written

    wrong = ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
    assert reply_written([b"1-0", True, 1, 1]) is True
    assert reply_written([b"1-0", True, ResponseError("NOGROUP")]) is True
    assert reply_written([wrong, True, 1, 1]) is False
    other = ResponseError("OOM command not allowed")
    assert reply_written([other, True]) is other


def test_no_redis_keys_outside_the_prefix(tmp_path: Path, redis_server: RedisServer) -> None:
    with gateway(tmp_path, "alpha", redis_server, config={"bot_mode": {"redis_prefix": "team1"}}) as alpha, \
            gateway(tmp_path, "mini", redis_server, config={"bot_mode": {"redis_prefix": "team1"}}):
        wait_online(alpha, "bob", "mini")
        ack = alpha.message_agent(sender="alice", target="bob@mini", message="prefixed")
        assert alpha.wait_outcome(ack["delivery_id"], timeout=10)["status"] == "replied"
        keys = [k.decode() for k in redis_server.client().keys("*")]
    assert keys and all(k.startswith("team1:") for k in keys), keys
