"""A durable gateway's DMs sent over Redis survive a restart of the sender even when Redis lost them.

Regression (roomsrev ``wipe.py``, 3/3): the sender acked a Redis DM as soon as the send script ran in
Redis, with nothing written on its root; after a restart it looked for its DMs in flight in Redis's
``sent`` hash only. Had Redis lost the envelope and that record (``appendfsync everysec`` loses the
last second; here redis-server is killed and restarted empty), the DM never got an outcome:
``wait_outcome`` raised KeyError ("never acked on this root") and its sender was never woken. Now its
``accepted`` record (origin ``redis``) is journaled before the ack; the next start settles such a DM
``ambiguous`` (reason ``delivery_timeout``: it may have run on its target), and resumes one Redis still
holds as before (one outcome).

A ``kill -9`` is the journal's files as they are while the DMs are in flight, copied to a fresh root:
what the kill leaves (each record was on disk before its ack).
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from redis_fixture import RedisServer, fake_connection
from roots import RecordingRunner, make_root

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.ops.journal_view import find_outcome
from hermes_actors.store.relay_protocol import make_reply
from hermes_actors.transports.redis.store import RedisKeys, encode_reply_entry

WAIT = 30.0
DMS = 3

pytestmark = pytest.mark.redis


def _config(server: RedisServer) -> dict[str, Any]:
    # a reply budget and TTL far longer than the test: only the restart can settle these DMs
    return {"bot_mode": {"transport": server.url, "redis_heartbeat_seconds": 0.2, "reply_wait_seconds": 600,
                         "envelope_ttl_seconds": 3600}}


def _gateway(root: Path, server: RedisServer) -> Gateway:
    return Gateway(root, runner=RecordingRunner(), config=_config(server), connection_id="alpha", durable=True)


def _send(gw: Gateway) -> list[str]:
    """DMs to bob on ``mini``, a connection nobody consumes: they stay in flight, acked ``queued``."""
    await_condition(lambda: any(r["connection_id"] == "mini" and r["online"] for r in gw.roster()),
                    timeout=WAIT, message="mini online")
    acks = [gw.message_agent(sender="alice", target="bob@mini", message=f"q{i}") for i in range(DMS)]
    assert [a.get("status") for a in acks] == ["queued"] * DMS, acks
    return [a["delivery_id"] for a in acks]


def _wipe(server: RedisServer) -> None:
    """Redis loses everything (its AOF gone): a crash with ``appendfsync everysec`` losing the last second."""
    server.kill()
    shutil.rmtree(server.directory / "appendonlydir", ignore_errors=True)
    server.restart()
    fake_connection(server, "mini")


def _sent_then(tmp_path: Path, server: RedisServer, how: str) -> tuple[Path, list[str]]:
    """Send the DMs, then stop the sender as ``how`` says; the root the next start runs on, and the ids."""
    fake_connection(server, "mini")
    root = make_root(tmp_path / "live", {"alice": {}}, name="alpha")
    crashed = make_root(tmp_path / "crashed", {"alice": {}}, name="alpha")
    with _gateway(root, server) as gw:
        ids = _send(gw)
        if how == "kill -9":
            shutil.copytree(root / "bot_relay" / "journal", crashed / "bot_relay" / "journal")
    return (crashed if how == "kill -9" else root), ids


@pytest.mark.parametrize("how", ["kill -9", "clean stop"])
def test_an_acked_redis_dm_redis_lost_is_settled_ambiguous_by_the_next_start(
    tmp_path: Path, redis_server: RedisServer, how: str
) -> None:
    """Regression (roomsrev ``wipe.py`` modes 1 and 2, 3/3): KeyError "never acked on this root", no outcome ever."""
    root, ids = _sent_then(tmp_path, redis_server, how)
    _wipe(redis_server)
    with _gateway(root, redis_server) as again:
        outcomes = {key: again.wait_outcome(key, timeout=WAIT) for key in ids}
        recovered = again.recovered
    assert {(o["status"], o["reason"], o["retryable"]) for o in outcomes.values()} == {
        ("ambiguous", "delivery_timeout", False)}, outcomes
    assert all("Redis no longer holds" in o["error"] and "do not resend" in o["error"] for o in outcomes.values())
    assert recovered["ambiguous"] == DMS, recovered
    assert {key: find_outcome(root, key)["status"] for key in ids} == dict.fromkeys(ids, "ambiguous")


def test_an_acked_redis_dm_redis_still_holds_is_resumed_and_settled_once_by_its_reply(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """No wipe: the next start waits for the DMs again (pending once ``start()`` returned, never ambiguous), and
    each reply settles its DM once; the journal keeps the reply."""
    root, ids = _sent_then(tmp_path, redis_server, "clean stop")
    with _gateway(root, redis_server) as again:
        assert again.recovered.get("ambiguous", 0) == 0, again.recovered
        for key in ids:
            with pytest.raises(TimeoutError):
                again.wait_outcome(key, timeout=0)
        client = redis_server.client()
        for key in ids:  # mini answers now
            client.xadd(RedisKeys().replies("alpha"), encode_reply_entry(make_reply(key, reply=f"re {key}",
                                                                                    now=time.time())))
        outcomes = {key: again.wait_outcome(key, timeout=WAIT) for key in ids}
    assert {key: (o["status"], o["reply"]) for key, o in outcomes.items()} == {
        key: ("replied", f"re {key}") for key in ids}
    assert {key: find_outcome(root, key)["status"] for key in ids} == dict.fromkeys(ids, "replied")


def test_a_redis_dm_lost_while_redis_was_down_at_the_start_is_settled_once_redis_answers(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Redis unreachable at the next start: the journaled DMs wait (pending, never KeyError), and the relay's
    complete resume once Redis answers, empty, settles them ambiguous."""
    root, ids = _sent_then(tmp_path, redis_server, "clean stop")
    redis_server.kill()
    shutil.rmtree(redis_server.directory / "appendonlydir", ignore_errors=True)
    with _gateway(root, redis_server) as again:
        for key in ids:
            with pytest.raises(TimeoutError):
                again.wait_outcome(key, timeout=0)
        redis_server.restart()
        fake_connection(redis_server, "mini")
        outcomes = {key: again.wait_outcome(key, timeout=WAIT) for key in ids}
    assert {(o["status"], o["reason"]) for o in outcomes.values()} == {("ambiguous", "delivery_timeout")}, outcomes


def test_a_redis_dm_whose_record_the_journal_cannot_write_is_acked_all_the_same(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guard of the new record: Redis queued the DM before its record is journaled, so a journal that cannot write
    it (a full disk) must not refuse it "NOT queued" (a DM its sender was told was not sent would run): it is
    acked, logged, and its reply settles it."""
    fake_connection(redis_server, "mini")
    root = make_root(tmp_path, {"alice": {}}, name="alpha")
    with _gateway(root, redis_server) as gw:
        await_condition(lambda: any(r["connection_id"] == "mini" and r["online"] for r in gw.roster()),
                        timeout=WAIT, message="mini online")
        journal = gw._journal
        assert journal is not None
        real_write = os.pwrite

        def full_disk(fd: int, data: Any, offset: int) -> int:
            if fd == journal._file.fd:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_write(fd, data, offset)

        monkeypatch.setattr(os, "pwrite", full_disk)
        ack = gw.message_agent(sender="alice", target="bob@mini", message="while the disk is full")
        monkeypatch.undo()
        assert ack.get("status") == "queued", ack
        key = ack["delivery_id"]
        redis_server.client().xadd(RedisKeys().replies("alpha"),
                                   encode_reply_entry(make_reply(key, reply="re", now=time.time())))
        assert gw.wait_outcome(key, timeout=WAIT)["reply"] == "re"
