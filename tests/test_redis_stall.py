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


def _send_script(script: Any, envelope_id: str) -> list[Any]:
    """One run of SEND_LUA from alpha to mini, as the transport runs it."""
    return script(keys=[KEYS.inbox("mini"), KEYS.sent("alpha"), KEYS.claim(envelope_id), KEYS.done(envelope_id)],
                  args=[100, b"{}", "alpha", envelope_id, b"{}"])


def test_the_send_script_is_idempotent_on_the_envelope_id(redis_server: RedisServer) -> None:
    """Run twice (a stalled first run and its check), it queues one entry; after the turn claim, none."""
    client = redis_server.client()
    script = client.register_script(SEND_LUA)

    def send(envelope_id: str) -> list[Any]:
        return _send_script(script, envelope_id)

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


def test_a_late_run_of_a_send_its_target_answered_without_a_turn_claim_queues_nothing(
        redis_server: RedisServer) -> None:
    """Regression (review): a target that answers an envelope before any turn claim (it refused it) sets only
    done:<id> and deletes the entry; once the sender had the reply and dropped its sent record, the stalled first
    run of the script, run late, queued the DM again and wrote its sent record back (a restart then published a
    second outcome, delivery_timeout). The done mark now says it was queued."""
    client = redis_server.client()
    script = client.register_script(SEND_LUA)
    envelope_id = "e" * 32
    assert _send_script(script, envelope_id)[0] == 1
    client.set(KEYS.done(envelope_id), b"1", ex=3600)  # the target's reply MULTI: done mark, entry acked and deleted
    client.xdel(KEYS.inbox("mini"), *[entry_id for entry_id, _ in client.xrange(KEYS.inbox("mini"))])
    client.hdel(KEYS.sent("alpha"), envelope_id)  # the sender has the reply and forgot it
    assert _send_script(script, envelope_id) == [1, b"queued"]  # the stalled original, run late
    assert client.xlen(KEYS.inbox("mini")) == 0 and client.hlen(KEYS.sent("alpha")) == 0


# ── records of unconfirmed sends (bot_relay/unconfirmed/<id>.json) ─────────────────────────────────────────

ENVELOPE_ID = "a" * 32
OTHER_ID = "b" * 32


def _send_call(envelope_id: str = ENVELOPE_ID, sender: str = "alice") -> Any:
    """A SendCall of alice@alpha to bob@mini, as the transport keeps it."""
    import time

    from hermes_actors.records import RemoteAgent
    from hermes_actors.store.relay_protocol import make_envelope
    from hermes_actors.transports.redis import store as rs
    from hermes_actors.transports.redis.outbound import SendCall

    envelope = make_envelope(target=RemoteAgent("bob", "bob", "mini"), message="kept unconfirmed",
                             sender_profile=sender, sender_handle=sender, now=time.time(),
                             envelope_id=envelope_id, extra={"hop": 0})
    fields = rs.encode_envelope_entry(envelope, "alpha")
    return SendCall(envelope_id, "mini", fields["envelope"], rs.sent_meta(envelope, "@bob on mini"))


def _record(**changes: Any) -> dict[str, Any]:
    return {**_send_call().record(), **changes}


@pytest.mark.parametrize(("record", "file_id", "why"), [
    ("not a record", ENVELOPE_ID, "not a JSON object"),
    (_record(id="zz"), "zz", "invalid envelope id 'zz'"),
    (_record(id=OTHER_ID), ENVELOPE_ID, "does not match its file name"),
    (_record(id=OTHER_ID), OTHER_ID, "is not the record's"),  # the envelope's own id is another
    (_record(target_connection="../x"), ENVELOPE_ID, "invalid target connection"),
    (_record(target_connection="other"), ENVELOPE_ID, "is not the record's"),
    (_record(envelope="{not json"), ENVELOPE_ID, "its envelope is not JSON"),
    (_record(envelope='{"id": "zz"}'), ENVELOPE_ID, "invalid envelope id"),
    (_record(meta="{}"), ENVELOPE_ID, "its sent meta is unreadable"),
    (_record(meta=None), ENVELOPE_ID, "is not a string"),
])
def test_a_record_that_is_no_send_of_ours_is_refused(record: Any, file_id: str, why: str) -> None:
    """Regression (review): a record whose id was no envelope id ("zz"), or not its envelope's, was queued again
    at every start and never removed (its ValidationError raised inside the tick, a delivery_timeout published
    for "zz" each start). Such a record is refused, naming why."""
    from hermes_actors.errors import ValidationError
    from hermes_actors.transports.redis.outbound import SendCall

    with pytest.raises(ValidationError, match=why):
        SendCall.from_record(record, file_id=file_id)


def test_a_record_of_ours_reads_back_as_its_call() -> None:
    from hermes_actors.transports.redis.outbound import SendCall

    call = _send_call()
    assert SendCall.from_record(call.record(), file_id=ENVELOPE_ID) == call


def test_bad_unconfirmed_records_are_quarantined_once_and_a_removed_profiles_send_still_gets_its_outcome(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """Regression (review): records that were no unconfirmed send (a bad id, an id not its envelope's, not JSON)
    were read, logged as ERROR (or queued) again at every start and left forever; they are moved into the relay's
    quarantine/, one WARNING each. The send of a profile removed between the restarts was skipped silently and
    its acked DM never got an outcome: it is still queued and its outcome published, as a relayed DM's of a
    removed profile is."""
    import json

    from hermes_actors.ops.status import relay_dir_counts

    fake_connection(redis_server, "mini")  # online; nobody drains it
    root = make_root(tmp_path, {"alice": {}}, name="alpha")
    kept = root / "bot_relay" / "unconfirmed"
    kept.mkdir(parents=True, mode=0o700)
    removed_id, bad_id, corrupt_id = "c" * 32, "d" * 32, "e" * 32
    records = {"zz.json": json.dumps(_record(id="zz")),
               f"{bad_id}.json": json.dumps(_record(id=bad_id)),  # its envelope's id is another
               f"{corrupt_id}.json": "{not json",
               f"{removed_id}.json": json.dumps(_send_call(removed_id, sender="carol").record())}
    for name, text in records.items():
        (kept / name).write_text(text)
        (kept / name).chmod(0o600)
    assert relay_dir_counts(root)["unconfirmed"] == 3  # <id>.json records
    cfg = {"bot_mode": {**_config(redis_server)["bot_mode"], "reply_wait_seconds": 1.5}}
    with LogCapture("INFO") as logs, Gateway(root, runner="demo", config=cfg, connection_id="alpha") as gw:
        out = gw.wait_outcome(removed_id, timeout=20)
        unconfirmed = gw.stats()["relay"]["unconfirmed"]
    assert out["status"] == "failed" and out["reason"] == "delivery_timeout", out  # nobody drains mini
    entries = redis_server.client().xrange(KEYS.inbox("mini"))
    assert [json.loads(fields[b"envelope"])["id"] for _id, fields in entries] == [removed_id]
    assert unconfirmed == 0
    assert list(kept.iterdir()) == []
    moved = sorted(p.name.split(".")[0] for p in (root / "bot_relay" / "quarantine").iterdir())
    assert moved == sorted([bad_id, corrupt_id, "zz"])
    quarantined = [r for r in logs.records if r["message"].startswith("quarantined")]
    assert len(quarantined) == 3 and {r["level"].name for r in quarantined} == {"WARNING"}
    assert [r["message"] for r in logs.records if r["level"].name in ("ERROR", "CRITICAL")] == []
    assert any(removed_id in r["message"] and "'carol'" in r["message"] for r in logs.records)


def test_an_outcome_kept_while_redis_is_down_has_its_sent_record_dropped_once_it_is_back(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """Regression (review): the outcome of a DM kept by the Dispatcher while Redis was down had its sent record
    dropped right then (against a Redis that does not answer that held the actor an answer timeout per outcome)
    and a failure was never retried: the record stayed in Redis (AOF), for the next start to wait for again. It
    is dropped once Redis is back."""
    fake_connection(redis_server, "mini")
    root = make_root(tmp_path, {"alice": {}}, name="alpha")
    cfg = {"bot_mode": {**_config(redis_server)["bot_mode"], "reply_wait_seconds": 1.0}}
    with Gateway(root, runner="demo", config=cfg, connection_id="alpha") as gw:
        wait_online(gw, "bob", "mini")
        ack = gw.message_agent(sender="alice", target="bob@mini", message="timed out while redis is down")
        assert redis_server.client().hexists(KEYS.sent("alpha"), ack["delivery_id"])
        redis_server.kill()
        out = gw.wait_outcome(ack["delivery_id"], timeout=20)  # its reply budget ends while Redis is down
        assert out["reason"] == "delivery_timeout", out
        redis_server.start()
        client = redis_server.client()
        await_condition(lambda: not client.hexists(KEYS.sent("alpha"), ack["delivery_id"]), timeout=20,
                        interval=0.05, message="the sent record dropped once Redis is back")


def test_a_send_redis_refuses_as_loading_is_refused_not_queued_and_never_kept(
        tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (review): Redis answering -LOADING (still loading its dataset: it ran nothing) was taken for a
    send written and unanswered: acked and kept unconfirmed. It is refused NOT queued, and nothing is kept."""
    from redis.connection import AbstractConnection
    from redis.exceptions import BusyLoadingError

    real_send, real_read = AbstractConnection.send_command, AbstractConnection.read_response
    loading: list[bool] = []

    def send(self: AbstractConnection, *args: Any, **kwargs: Any) -> Any:
        if args and args[0] in ("EVALSHA", "EVAL") and not loading:  # Redis runs nothing: it answers -LOADING
            loading.append(True)
            return real_send(self, "PING")
        return real_send(self, *args, **kwargs)

    def read(self: AbstractConnection, *args: Any, **kwargs: Any) -> Any:
        answer = real_read(self, *args, **kwargs)
        if loading == [True]:
            loading.append(False)
            raise BusyLoadingError("Redis is loading the dataset in memory")
        return answer

    fake_connection(redis_server, "mini")
    root = make_root(tmp_path, {"alice": {}}, name="alpha")
    with Gateway(root, runner="demo", config=_config(redis_server), connection_id="alpha") as gw:
        wait_online(gw, "bob", "mini")
        monkeypatch.setattr(AbstractConnection, "send_command", send)
        monkeypatch.setattr(AbstractConnection, "read_response", read)
        refusal = gw.message_agent(sender="alice", target="bob@mini", message="while redis loads")
        monkeypatch.setattr(AbstractConnection, "send_command", real_send)
        monkeypatch.setattr(AbstractConnection, "read_response", real_read)
        assert refusal.get("reason") == "runtime_offline" and "NOT queued" in refusal["error"], refusal
        assert gw.stats()["relay"]["waiting"] == 0
    assert not (root / "bot_relay" / "unconfirmed").exists()
    assert redis_server.client().xlen(KEYS.inbox("mini")) == 0


def test_a_removed_profiles_confirmed_sends_get_their_outcomes_after_a_restart(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """Regression (review): a DM Redis had confirmed (its record in sent:<me>) of a profile removed between the
    restarts was skipped: wait_outcome of its acked id raised KeyError, its sent record stayed forever and its
    reply, when it came, was left pending and reclaimed at every claim interval. Both DMs now get their outcome
    (the reply's, or delivery_timeout), their sent records and the reply entry go, and no ERROR is logged."""
    import shutil

    import orjson

    fake_connection(redis_server, "mini")  # online; nobody drains it
    root = make_root(tmp_path, {"alice": {}, "carol": {}}, name="alpha")
    client = redis_server.client()
    with Gateway(root, runner="demo", config=_config(redis_server), connection_id="alpha") as gw:
        wait_online(gw, "bob", "mini")
        answered, unanswered = (gw.message_agent(sender="carol", target="bob@mini", message=text)["delivery_id"]
                                for text in ("answered later", "never answered"))
    assert client.hexists(KEYS.sent("alpha"), answered) and client.hexists(KEYS.sent("alpha"), unanswered)
    client.xadd(KEYS.replies("alpha"), {"reply": orjson.dumps(
        {"id": answered, "at": 1.0, "reply": "hi from bob", "error": "", "reason": ""})})
    shutil.rmtree(root / "profiles" / "carol")
    cfg = {"bot_mode": {**_config(redis_server)["bot_mode"], "reply_wait_seconds": 1.5}}
    with LogCapture("INFO") as logs, Gateway(root, runner="demo", config=cfg, connection_id="alpha") as gw:
        first = gw.wait_outcome(answered, timeout=20)
        second = gw.wait_outcome(unanswered, timeout=20)
        await_condition(lambda: client.hlen(KEYS.sent("alpha")) == 0, timeout=10, message="sent records forgotten")
        await_condition(lambda: client.xlen(KEYS.replies("alpha")) == 0, timeout=10, message="reply entry acked")
    assert first["status"] == "replied" and first["reply"] == "hi from bob", first
    assert second["status"] == "failed" and second["reason"] == "delivery_timeout", second
    assert any("'carol'" in r["message"] and "no profile on this root" in r["message"] for r in logs.records)
    assert [r["message"] for r in logs.records if r["level"].name in ("ERROR", "CRITICAL")] == []


def _calls(client: Any, command: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_sent_key_of_the_wrong_type_is_said_once_and_its_drops_are_not_retried_each_tick(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """Regression (review): with sent:<me> holding another type, the drop of each settled DM's sent record was
    retried at every tick (an ERROR each, ~6 a second, forever), the drops waiting grew without bound and
    retrying stopped at the first. Now Redis refusing it is logged once, naming `redis-cli DEL <key>`, and the
    drop is given up; once the key is deleted, drops work again."""
    fake_connection(redis_server, "mini")  # online; nobody drains it
    root = make_root(tmp_path, {"alice": {}}, name="alpha")
    client = redis_server.client()
    sent = KEYS.sent("alpha")
    cfg = {"bot_mode": {**_config(redis_server)["bot_mode"], "reply_wait_seconds": 0.5}}
    with LogCapture("INFO") as logs, Gateway(root, runner="demo", config=cfg, connection_id="alpha") as gw:
        wait_online(gw, "bob", "mini")
        ids = [gw.message_agent(sender="alice", target="bob@mini", message=f"dm {n}")["delivery_id"] for n in (1, 2)]
        client.delete(sent)
        client.set(sent, "not a hash")
        tried = _calls(client, "hdel")
        for did in ids:
            assert gw.wait_outcome(did, timeout=20)["reason"] == "delivery_timeout"
        await_condition(lambda: _calls(client, "hdel") >= tried + 2, timeout=10, message="both drops tried")
        hdels, ticks = _calls(client, "hdel"), _calls(client, "xautoclaim")
        await_condition(lambda: _calls(client, "xautoclaim") >= ticks + 6, timeout=20, message="ticks went by")
        assert _calls(client, "hdel") == hdels  # not retried at each tick
        client.delete(sent)  # the fix the ERROR names
        third = gw.message_agent(sender="alice", target="bob@mini", message="dm 3")["delivery_id"]
        assert gw.wait_outcome(third, timeout=20)["reason"] == "delivery_timeout"
        await_condition(lambda: client.hlen(sent) == 0, timeout=10, message="the third's sent record dropped")
    errors = [r["message"] for r in logs.records if r["level"].name in ("ERROR", "CRITICAL")]
    assert len(errors) == 1 and "refused to drop the sent record" in errors[0], errors
    assert f"redis-cli DEL {sent}" in errors[0], errors


@pytest.mark.parametrize(("error", "fix"), [
    ("Command # 3 (HDEL p:sent:alpha x) of pipeline caused error: WRONGTYPE Operation against a key holding the "
     "wrong kind of value", "p:sent:alpha holds the wrong kind of value (no gateway's): delete it, redis-cli DEL "
     "p:sent:alpha; "),
    ("Command # 1 (XACK p:replies:alpha g 1-0) of pipeline caused error: WRONGTYPE Operation against a key",
     "p:replies:alpha holds the wrong kind of value (no gateway's): delete it, redis-cli DEL p:replies:alpha; "),
    ("WRONGTYPE Operation against a key holding the wrong kind of value",
     "p:sent:alpha holds the wrong kind of value (no gateway's): delete it, redis-cli DEL p:sent:alpha; "),
    ("NOPERM this user has no permissions to run the 'hdel' command", ""),
])
def test_the_fix_a_refused_drop_names(error: str, fix: str) -> None:
    from hermes_actors.transports.redis.outbound import _forget_fix

    assert _forget_fix(error, ("p:sent:alpha", "p:replies:alpha")) == fix


def test_the_drops_waiting_for_redis_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (review): the drops kept while Redis is down grew without bound; past FORGET_DUE_MAX the
    oldest is let go (left in Redis for the next start), with one WARNING."""
    from hermes_actors.transports.redis import outbound

    monkeypatch.setattr(outbound, "FORGET_DUE_MAX", 2)
    kept = outbound.Outbound.__new__(outbound.Outbound)  # only its forget_due book is used here
    kept.forget_due, kept.forget_overflowed = {}, False
    with LogCapture("INFO") as logs:
        for n in range(4):
            kept._forget_later(f"{n}" * 32, [f"{n}-0"])
    assert list(kept.forget_due) == ["2" * 32, "3" * 32]
    assert len([r for r in logs.records if r["level"].name == "WARNING"]) == 1
