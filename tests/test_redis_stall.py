"""A Redis that stops answering mid-send (SIGSTOP of redis-server: a stalled fsync or a network blip does the same).

A send whose script reached Redis unanswered may be queued when Redis resumes: it is acked (never refused
"NOT queued") and settled once Redis answers; only a send nothing of which reached Redis is refused.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from redis_fixture import RedisServer, fake_connection
from roots import LogCapture, RecordingRunner, make_root, wait_online

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.transports.redis.outbound import SEND_LUA
from hermes_actors.transports.redis.store import RedisKeys

pytestmark = pytest.mark.redis
KEYS = RedisKeys()
ANSWER_TIMEOUT = 0.5  # the URL's own socket_timeout wins: a stalled command gives up after this


def _config(server: RedisServer) -> dict[str, Any]:
    return {"bot_mode": {"transport": f"{server.url}?socket_timeout={ANSWER_TIMEOUT}",
                         "redis_heartbeat_seconds": 0.2, "redis_claim_idle_seconds": 0.5}}


@contextmanager
def stalled(server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Redis stops answering (SIGSTOP) right as the next send is written (so that send, not a tick's command,
    meets the stall first), and answers again when the block ends (SIGCONT)."""
    from redis.connection import AbstractConnection

    assert server.proc is not None
    pid = server.proc.pid
    real = AbstractConnection.send_command
    stopped: list[bool] = []

    def stalling(self: AbstractConnection, *args: Any, **kwargs: Any) -> Any:
        if args and args[0] in ("EVALSHA", "EVAL") and not stopped:
            stopped.append(True)
            os.kill(pid, signal.SIGSTOP)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(AbstractConnection, "send_command", stalling)
    try:
        yield
    finally:
        monkeypatch.setattr(AbstractConnection, "send_command", real)
        if server.proc.poll() is None:
            os.kill(pid, signal.SIGCONT)


def _gateway(tmp: Path, name: str, server: RedisServer, runner: Any = None, **kwargs: Any) -> Gateway:
    root = make_root(tmp, {"alice": {}, "bob": {}}, name=name)
    return Gateway(root, runner=runner or RecordingRunner(), config=_config(server), connection_id=name,
                   **{"durable": False, **kwargs})


def _await_settled_in_redis(server: RedisServer) -> None:
    client = server.client()
    await_condition(lambda: client.hlen(KEYS.sent("alpha")) == 0 and client.xlen(KEYS.inbox("mini")) == 0,
                    timeout=20, interval=0.02, message="no sent record nor inbox entry left")


def test_a_dm_sent_into_a_stalled_redis_is_acked_and_runs_once_and_one_refused_never_runs(
        tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (chaos review): a send Redis did not answer within its timeout was refused "NOT queued", yet
    Redis ran the script when it resumed: the DM ran, its reply went unread, and a restart of the sender
    published the outcome of an id it never handed out. Now it is acked, runs once and gets its outcome; a
    send while Redis is known down (nothing written) is refused at once and never runs."""
    rec = RecordingRunner()
    with _gateway(tmp_path, "alpha", redis_server) as alpha, _gateway(tmp_path, "mini", redis_server, rec):
        wait_online(alpha, "bob", "mini")
        with stalled(redis_server, monkeypatch):
            ack = alpha.message_agent(sender="alice", target="bob@mini", message="into the stall")
            refusal = alpha.message_agent(sender="alice", target="bob@mini", message="while known down")
        assert "delivery_id" in ack, ack
        assert refusal["reason"] == "runtime_offline" and "NOT queued" in refusal["error"], refusal
        out = alpha.wait_outcome(ack["delivery_id"], timeout=20)
        assert out["status"] == "replied", out
        _await_settled_in_redis(redis_server)
    assert rec.bodies() == ["into the stall"]  # once (the stalled script and its check ran both), the refused never


def test_an_unconfirmed_send_redis_lost_is_queued_once_it_answers(
        tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stalled Redis dies with the script unrun (killed while stopped): the acked DM is queued by the check
    once Redis is back, and runs once."""
    rec = RecordingRunner()
    with _gateway(tmp_path, "alpha", redis_server) as alpha, _gateway(tmp_path, "mini", redis_server, rec):
        wait_online(alpha, "bob", "mini")
        with stalled(redis_server, monkeypatch):
            ack = alpha.message_agent(sender="alice", target="bob@mini", message="lost with redis")
            redis_server.kill()
        assert "delivery_id" in ack, ack
        redis_server.start()
        out = alpha.wait_outcome(ack["delivery_id"], timeout=30)
        assert out["status"] == "replied", out
        _await_settled_in_redis(redis_server)
    assert rec.bodies() == ["lost with redis"]


def test_an_unconfirmed_send_survives_its_senders_restart_and_runs_once(
        tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sender stops before Redis answers, and Redis loses the script: the next start finds the send kept
    in bot_relay/unconfirmed/, waits for it (its outcome published under the acked id) and queues it once."""
    fake_connection(redis_server, "mini")  # online; nobody drains it until mini starts below
    root = make_root(tmp_path, {"alice": {}}, name="alpha")
    cfg = _config(redis_server)
    with Gateway(root, runner="demo", config=cfg, connection_id="alpha") as first:
        wait_online(first, "bob", "mini")
        with stalled(redis_server, monkeypatch):
            ack = first.message_agent(sender="alice", target="bob@mini", message="across a restart")
            assert "delivery_id" in ack, ack
            first.stop()
            redis_server.kill()
    kept = root / "bot_relay" / "unconfirmed"
    assert [p.name for p in kept.iterdir()] == [f"{ack['delivery_id']}.json"]
    redis_server.start()
    redis_server.client().delete(KEYS.alive("alpha"))  # the stop could not remove our lease: as if it lapsed
    rec = RecordingRunner()
    with Gateway(root, runner="demo", config=cfg, connection_id="alpha") as second, \
            _gateway(tmp_path, "mini", redis_server, rec):
        out = second.wait_outcome(ack["delivery_id"], timeout=30)
        assert out["status"] == "replied", out
        _await_settled_in_redis(redis_server)
        await_condition(lambda: not list(kept.iterdir()), timeout=10, interval=0.02, message="record dropped")
    assert rec.bodies() == ["across a restart"]


def test_the_send_script_is_idempotent_on_the_envelope_id(redis_server: RedisServer) -> None:
    """Run twice (a stalled first run and its check), it queues one entry; after the turn claim, none."""
    client = redis_server.client()
    script = client.register_script(SEND_LUA)

    def send(envelope_id: str) -> list[Any]:
        return script(keys=[KEYS.inbox("mini"), KEYS.sent("alpha"), KEYS.claim(envelope_id)],
                      args=[100, b"{}", "alpha", envelope_id, b"{}"])

    assert send("e1")[0] == 1 and send("e1") == [1, b"queued"]
    assert client.xlen(KEYS.inbox("mini")) == 1
    client.hdel(KEYS.sent("alpha"), "e1")  # its reply came and was forgotten; then a late run
    client.set(KEYS.claim("e1"), "consumer")
    assert send("e1") == [1, b"queued"]
    assert client.xlen(KEYS.inbox("mini")) == 1 and client.hlen(KEYS.sent("alpha")) == 0


@pytest.mark.parametrize(("stopping", "level", "text"), [
    (True, "INFO", "redis: 2 inbox entr(ies) a read took as this gateway stopped were handed back to the stream for "
                   "the connection's next start"),
    (False, "WARNING", "redis: 2 inbox entr(ies) read as our connection id's lease was lost were handed back to the "
                       "stream for the process that holds it"),
])
def test_entries_handed_back_at_a_stop_are_not_logged_as_a_lost_lease(
        redis_server: RedisServer, stopping: bool, level: str, text: str) -> None:
    """Regression (chaos review): a clean stop logged the lost-lease WARNING though no lease was lost."""
    from hermes_actors.transports.redis import io
    from hermes_actors.transports.redis.store import redis_settings

    client = redis_server.client()
    inbox = KEYS.inbox("mini")
    client.xgroup_create(inbox, "hermes", id="0", mkstream=True)
    for n in range(2):
        client.xadd(inbox, {"n": str(n)})
    entries = [(i.decode(), f) for _s, batch in client.xreadgroup("hermes", "me", {inbox: ">"}) for i, f in batch]
    room = io.InboxRoom(5, lambda: 0, closed=lambda: True, stopping=lambda: stopping)
    reader = io.StreamReader(redis_settings({}, redis_server.url), KEYS, "mini", "host-1-abcdefgh", None, room=room)
    with LogCapture("INFO") as logs:
        reader._hand_back(client, entries)
    assert [(r["level"].name, r["message"]) for r in logs.records if "handed back" in r["message"]] == [(level, text)]
    assert client.xlen(inbox) == 2 and client.xpending(inbox, "hermes")["pending"] == 0
