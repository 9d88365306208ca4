"""The operator's view of a root on the Redis transport: ``status``, ``roster``, ``doctor`` and ``/metrics``.

Each root's config.yaml selects Redis (``bot_mode.transport``), as two machines' roots do: the
commands read the roster where the transport keeps it, and say when Redis does not answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from redis_fixture import RedisServer
from roots import HERMES_019, RecordingRunner, make_root, wait_online, write_fake_cli

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.cli.main import main
from hermes_actors.ops.doctor import run_doctor
from hermes_actors.ops.status import file_status, live_status


def _root(tmp: Path, name: str, server: RedisServer, profiles: tuple[str, ...], **more: Any) -> Path:
    config = {"bot_mode": {"transport": server.url, "connection_id": name, "redis_heartbeat_seconds": 0.2,
                           "redis_claim_idle_seconds": 0.5}, **more}
    return make_root(tmp, {p: {} for p in profiles}, config=config, name=name)


@contextmanager
def _host(root: Path, **kwargs: Any) -> Iterator[Gateway]:
    with Gateway(root, runner=RecordingRunner(), durable=False, **kwargs) as gw:
        yield gw


def _metrics(gw: Gateway) -> dict[str, float]:
    prometheus_parser = pytest.importorskip("prometheus_client.parser", reason="the [ops] extra")
    from hermes_actors.ops.metrics import DeliveryMetrics

    text = DeliveryMetrics(gw.stats, lambda: live_status(gw)).render().decode()
    return {s.name: s.value for f in prometheus_parser.text_string_to_metric_families(text) for s in f.samples
            if not s.labels}


def test_with_redis_down_status_roster_and_metrics_say_it(tmp_path: Path, redis_server: RedisServer,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Regression (acceptance run, two roots over Redis): with redis-server stopped, `roster` listed the other
    machine's agents online (`yes`), `status` said nothing of Redis and /metrics had `hermes_actors_relay_up 1`
    and nothing showing Redis unreachable; only `doctor` said it."""
    laptop = _root(tmp_path, "laptop", redis_server, ("alice",))
    mini = _root(tmp_path, "mini", redis_server, ("scout",))
    url = f"redis://127.0.0.1:{redis_server.port}"
    with _host(laptop, serve_submit=True) as gw, _host(mini):
        wait_online(gw, "scout", "mini")
        assert _metrics(gw)["hermes_actors_redis_up"] == 1
        assert live_status(gw)["relay"]["reachable"] is True
        redis_server.kill()
        await_condition(lambda: gw.stats()["relay"]["reachable"] is False, timeout=20, interval=0.05,
                        message="the transport noticed Redis is down")
        metrics = _metrics(gw)
        assert metrics["hermes_actors_redis_up"] == 0 and metrics["hermes_actors_relay_up"] == 1

        assert main(["status", "--root", str(laptop), "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["source"] == "gateway" and status["relay"]["reachable"] is False
        assert any(url in p and "unreachable" in p and "start Redis" in p for p in status["problems"]), status
        assert main(["status", "--root", str(laptop)]) == 0
        text = capsys.readouterr().out
        assert f"Redis {url}" in text and "UNREACHABLE" in text
        assert f"problem: Redis transport: {url}" in text and "is unreachable" in text and "fix: start Redis" in text

        assert main(["roster", "--root", str(laptop)]) == 0
        lines = capsys.readouterr().out.splitlines()
        scout = [line for line in lines if line.startswith("@scout")]
        assert scout and scout[0].split()[-1] == "no", lines  # its DMs are refused, NOT queued: not online
        assert any(line.startswith("note: Redis transport: ") and url in line and "start Redis" in line
                   for line in lines), lines
        assert main(["roster", "--root", str(laptop), "--json"]) == 0
        out = capsys.readouterr()
        assert [r["online"] for r in json.loads(out.out) if r["connection_id"] == "mini"] == [False, False]
        assert "Redis transport: " in out.err and url in out.err

    status = file_status(laptop)  # no gateway: the files, and Redis read as the transport would
    assert status["relay"]["reachable"] is False
    assert any(url in p and "unreachable" in p for p in status["problems"]), status["problems"]


def test_status_and_doctor_read_the_roster_and_connection_id_on_redis(tmp_path: Path, redis_server: RedisServer,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Regression: on Redis `status` said `no relay roster` and `"remote_agents": 0` (it read only the file
    relay's roster.json) and doctor said "no running gateway announces a connection id" (it read only the file
    heartbeats) while a gateway ran on Redis."""
    laptop = _root(tmp_path, "laptop", redis_server, ("alice", "bob"), bot_peers=["mini", "spark"])
    mini = _root(tmp_path, "mini", redis_server, ("scout",))
    with _host(laptop, serve_submit=True) as gw, _host(mini):
        wait_online(gw, "scout", "mini")
        await_condition(lambda: file_status(mini)["relay"]["remote_agents"] == 3, timeout=20, interval=0.05,
                        message="laptop's roster on Redis: @hermes, @alice and @bob")
        relay = file_status(mini)["relay"]  # the root without a host reads Redis itself
        assert relay["roster"] == redis_server.url and relay["reachable"] is True
        assert relay["roster_age_seconds"] is not None
        relay = live_status(gw)["relay"]
        assert relay["remote_agents"] == 2 and relay["reachable"] is True  # mini's @hermes and @scout
        assert main(["status", "--root", str(laptop)]) == 0
        text = capsys.readouterr().out
        assert "no relay roster" not in text and "2 agents on other machines" in text

        checks = {c.name: c for c in run_doctor(laptop, cli=str(write_fake_cli(tmp_path, HERMES_019)))}
        assert checks["connection ids"].level == "ok"
        assert "gateway runs as laptop on Redis" in checks["connection ids"].detail, checks["connection ids"]
        assert "mini" in checks["connection ids"].detail
        # bot_peers: mini is a connection on this Redis (the Redis transport carries it); spark needs `hermes peer`
        assert checks["bot_peers"].level == "warn", checks["bot_peers"]
        assert checks["bot_peers"].detail.startswith("spark: reached with `hermes peer dm`")
        assert checks["bot_peers"].detail.endswith("; on Redis: mini")
