"""The Dispatcher never blocks on the relay: a relay stuck on a send stalls nobody else.

Before the reply-later change the Dispatcher asked the relay synchronously
(``RelaySend``, 10 s): a Redis brownout stalled local DMs, and a send the relay
answered after 10 s failed with ``AskTimeout`` although it was queued.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from redis_fixture import RedisServer
from roots import RecordingRunner, make_root, wait_online

from hermes_actors import Gateway

pytestmark = pytest.mark.redis


def _gateway(tmp: Path, name: str, server: RedisServer, runner: Any) -> Gateway:
    root = make_root(tmp, {"alice": {}, "bob": {}}, name=name)
    config = {"bot_mode": {"transport": server.url, "redis_heartbeat_seconds": 0.2}}
    return Gateway(root, runner=runner, config=config, connection_id=name, durable=False)


def test_a_relay_stuck_on_a_send_stalls_neither_local_dms_nor_that_send_s_ack(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hermes_actors.transports.redis.actor import RedisRelayActor

    original = RedisRelayActor._on_send
    entered, release = threading.Event(), threading.Event()

    def stuck(self: Any, msg: Any) -> dict[str, Any]:  # a Redis brownout: the send hangs until released
        entered.set()
        assert release.wait(timeout=60), "the test never released the relay"
        return original(self, msg)

    local_rec, remote_rec = RecordingRunner(), RecordingRunner()
    with _gateway(tmp_path, "alpha", redis_server, local_rec) as alpha, \
            _gateway(tmp_path, "mini", redis_server, remote_rec):
        wait_online(alpha, "bob", "mini")
        monkeypatch.setattr(RedisRelayActor, "_on_send", stuck)
        relay_ack: dict[str, Any] = {}
        sender = threading.Thread(
            target=lambda: relay_ack.update(alpha.message_agent(sender="alice", target="bob@mini", message="far")),
            daemon=True,
        )
        sender.start()
        try:
            assert entered.wait(timeout=10), "the relay never got the send"
            ack = alpha.message_agent(sender="alice", target="bob", message="near")  # while the relay hangs
            assert alpha.wait_outcome(ack["delivery_id"], timeout=20)["reply"] == "ok: near"
            assert relay_ack == {}  # the relay has not answered: its caller still waits
        finally:
            release.set()
        sender.join(timeout=30)
        assert relay_ack.get("status") == "queued", relay_ack
        assert alpha.wait_outcome(relay_ack["delivery_id"], timeout=20)["reply"] == "ok: far"
    assert local_rec.bodies() == ["near"] and remote_rec.bodies() == ["far"]
