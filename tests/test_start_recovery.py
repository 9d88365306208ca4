"""When ``Gateway.start()`` returns, every id the relay still knows is answerable (issue 11, item 1).

Before the fix the relay actors resumed their in-flight envelopes in ``on_start`` on
their own thread and told the Dispatcher later, so a ``wait_outcome`` right after
``start()`` could raise ``KeyError("unknown delivery id ...")``. These tests widen
that window with a slow resume (a hook that waits until ``start()`` has returned, or
1 s) so the race decides every run, not one run in twenty.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from redis_fixture import RedisServer, fake_connection
from relay_helpers import remote_row, write_roster_file
from roots import RecordingRunner, make_root

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors import system as system_module
from hermes_actors.relay.relay_actor import RelayActor
from hermes_actors.store import relay_files as rf
from hermes_actors.store.relay_paths import RelayPaths
from hermes_actors.store.relay_protocol import make_reply
from hermes_actors.transports.redis.actor import RedisRelayActor
from hermes_actors.transports.redis.store import RedisKeys, encode_reply_entry

SLOW_RESUME_SECONDS = 1.0
REDIS_KEYS = RedisKeys()


def answerability(gw: Gateway, ids: list[str]) -> dict[str, str]:
    """Each id → ``unknown`` (KeyError), ``pending`` (no outcome yet) or its outcome's status."""
    found: dict[str, str] = {}
    for delivery_id in ids:
        try:
            found[delivery_id] = gw.wait_outcome(delivery_id, timeout=0)["status"]
        except TimeoutError:
            found[delivery_id] = "pending"
        except KeyError:
            found[delivery_id] = "unknown"
    return found


@contextmanager
def slow_resume(monkeypatch: pytest.MonkeyPatch, actor_class: type[Any]) -> Iterator[threading.Event]:
    """Make ``actor_class._resume`` wait until the test sets the yielded event (or 1 s): a wide race window."""
    start_returned = threading.Event()
    original = actor_class._resume

    def resume_late(self: Any) -> None:
        start_returned.wait(timeout=SLOW_RESUME_SECONDS)
        original(self)

    monkeypatch.setattr(actor_class, "_resume", resume_late)
    try:
        yield start_returned
    finally:
        start_returned.set()


# ── the file relay ──────────────────────────────────────────────────────────


def _file_sender(tmp_path: Path) -> Path:
    root = make_root(tmp_path, name="alpha")
    write_roster_file(root, [remote_row("moxie", "mini", online=True)])
    return root


def _send_while_up(root: Path, count: int) -> list[str]:
    with Gateway(root, runner=RecordingRunner(), connection_id="alpha", durable=False) as gw:
        acks = [gw.message_agent(sender="alice", target="moxie", message=f"m{i}") for i in range(count)]
    assert all(a.get("status") == "queued" for a in acks), acks
    return [a["delivery_id"] for a in acks]


def _desktop_replies(root: Path, ids: list[str]) -> None:
    """What the Desktop does while the gateway is down: write the replies of these envelopes."""
    for envelope_id in ids:
        rf.write_reply(RelayPaths.from_root(root), make_reply(envelope_id, reply=f"re {envelope_id}",
                                                                    now=time.time()))


def test_file_relay_every_in_flight_id_is_answerable_when_start_returns(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    root = _file_sender(tmp_path)
    ids = _send_while_up(root, 40)
    replied = ids[::2]
    _desktop_replies(root, replied)
    with slow_resume(monkeypatch, RelayActor) as start_returned:
        gw = Gateway(root, runner=RecordingRunner(), connection_id="alpha", durable=False)
        try:
            gw.start()
            found = answerability(gw, ids)
            start_returned.set()
        finally:
            gw.stop(timeout=5)
    assert {d: s for d, s in found.items() if s == "unknown"} == {}
    assert {found[d] for d in replied} == {"replied"}  # the replies written while down are settled already
    assert {found[d] for d in ids if d not in replied} == {"pending"}


def test_file_relay_100_restarts_with_replies_written_while_down(tmp_path: Path) -> None:
    root = _file_sender(tmp_path)
    ids = _send_while_up(root, 100)
    unknown: dict[int, list[str]] = {}
    for i, envelope_id in enumerate(ids):
        _desktop_replies(root, [envelope_id])  # ids[:i] were reported (consumed) by an earlier run
        with Gateway(root, runner=RecordingRunner(), connection_id="alpha", durable=False) as gw:
            found = answerability(gw, ids[i:])
        missing = [d for d, s in found.items() if s == "unknown"]
        if missing:
            unknown[i] = missing
        assert found[envelope_id] in ("replied", "unknown"), found[envelope_id]
    assert unknown == {}


def test_a_relay_that_never_finishes_resuming_fails_start_clearly(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    root = _file_sender(tmp_path)
    _send_while_up(root, 1)
    monkeypatch.setattr(system_module, "_RESUME_TIMEOUT", 0.3)
    with slow_resume(monkeypatch, RelayActor):
        gw = Gateway(root, runner=RecordingRunner(), connection_id="alpha", durable=False)
        with pytest.raises(RuntimeError, match=r"did not finish resuming .* within 0\.3s"):
            gw.start()
    assert not gw.running


# ── the Redis transport ─────────────────────────────────────────────────────


def _redis_config(server: RedisServer) -> dict[str, Any]:
    return {"bot_mode": {"transport": server.url, "redis_heartbeat_seconds": 0.2, "redis_claim_idle_seconds": 0.5}}


@pytest.mark.redis
def test_redis_every_in_flight_id_is_answerable_when_start_returns(tmp_path: Path, redis_server: RedisServer,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fake_connection(redis_server, "mini")
    root = make_root(tmp_path, {"alice": {}}, name="alpha")
    cfg = _redis_config(redis_server)
    with Gateway(root, runner=RecordingRunner(), config=cfg, connection_id="alpha", durable=False) as first:
        await_condition(lambda: any(r["connection_id"] == "mini" and r["online"] for r in first.roster()),
                        timeout=10, message="mini online")
        acks = [first.message_agent(sender="alice", target="bob@mini", message=f"m{i}") for i in range(40)]
    ids = [a["delivery_id"] for a in acks]
    replied = ids[::2]
    client = redis_server.client()
    for envelope_id in replied:  # mini answers while alpha is down
        record = make_reply(envelope_id, reply=f"re {envelope_id}", now=time.time())
        client.xadd(REDIS_KEYS.replies("alpha"), encode_reply_entry(record))
    with slow_resume(monkeypatch, RedisRelayActor) as start_returned:
        gw = Gateway(root, runner=RecordingRunner(), config=cfg, connection_id="alpha", durable=False)
        try:
            gw.start()
            found = answerability(gw, ids)
            start_returned.set()
            outcomes = {d: gw.wait_outcome(d, timeout=10) for d in replied}
        finally:
            gw.stop(timeout=5)
    assert {d: s for d, s in found.items() if s == "unknown"} == {}
    assert {d: o["reply"] for d, o in outcomes.items()} == {d: f"re {d}" for d in replied}
