"""Warm turns through a real ``hermes gateway run`` API server (hermes-agent 0.19) against the fake model."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fake_model import FakeModel
from hermes_fixtures import OfflineRoot

from hermes_actors.hermes.select import api_server_of, default_runner, probe_api_server
from hermes_actors.hermes.sessions import find_bot_chat
from hermes_actors.hermes.setup import enable
from hermes_actors.hermes.warm_or_cli import WarmOrCliRunner
from hermes_actors.messages import Turn

API_KEY = "test-api-key-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class HermesGateway:
    """A ``hermes gateway run`` on the root (its API server serves warm turns) until stopped."""

    def __init__(self, proc: subprocess.Popen[bytes], env: dict[str, str]) -> None:
        self.proc = proc
        self.env = env

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.fixture
def hermes_gateway(hermes_cli: str, offline_root: OfflineRoot, tmp_path: Path) -> Iterator[HermesGateway]:
    """``enable --gateway`` on the root, then ``hermes gateway run`` until the test ends."""
    env = {**os.environ, **offline_root.env, "API_SERVER_KEY": API_KEY}
    enable(offline_root.root, gateway=True, port=free_port(), cli=hermes_cli, env=env)
    with open(tmp_path / "gateway.log", "w") as log:
        proc = subprocess.Popen([hermes_cli, "gateway", "run"], env=env, cwd=offline_root.root,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    gateway = HermesGateway(proc, env)
    try:
        yield gateway
    finally:
        gateway.stop()


def test_warm_turns_through_the_gateway_then_the_cli_once_it_stopped_all_in_bot_chat(
    offline_root: OfflineRoot, fake_model: FakeModel, hermes_gateway: HermesGateway, hermes_cli: str
) -> None:
    env = hermes_gateway.env
    server = api_server_of(yaml.safe_load((offline_root.root / "config.yaml").read_text()), env)
    assert server is not None, "enable --gateway configured the API server"
    deadline = time.monotonic() + 90
    while not probe_api_server(server) and time.monotonic() < deadline:
        time.sleep(0.5)  # polling the gateway's startup with a deadline
    runner = default_runner(offline_root.root, env=env, cli=hermes_cli)
    assert isinstance(runner, WarmOrCliRunner) and probe_api_server(server), "the API server did not come up in 90 s"

    bob = offline_root.home("bob")
    expected = find_bot_chat(bob)  # enable created it
    assert expected is not None
    turn = Turn(profile="bob", content="warm hello", delivery_id="w1", root=offline_root.root)
    assert runner.run_turn(turn) == "fake reply to: warm hello"
    assert runner.warm.session_id("bob", "Bot Chat") == expected  # it went through the API server
    assert runner.run_turn(Turn(profile="bob", content="warm again", delivery_id="w2",
                                root=offline_root.root)) == "fake reply to: warm again"
    assert find_bot_chat(bob) == expected

    hermes_gateway.stop()  # the hermes gateway goes away; our host does not
    assert not probe_api_server(server)
    cold = Turn(profile="bob", content="cold now", delivery_id="w3", root=offline_root.root, home=bob)
    assert runner.run_turn(cold) == "fake reply to: cold now"  # the CLI ran it, in the same session
    assert find_bot_chat(bob) == expected
