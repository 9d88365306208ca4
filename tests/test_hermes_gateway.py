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
from fake_model import FakeModel
from hermes_fixtures import OfflineRoot

from hermes_actors.hermes.api_runner import ApiRunner
from hermes_actors.hermes.select import default_runner
from hermes_actors.hermes.sessions import find_bot_chat
from hermes_actors.hermes.setup import enable
from hermes_actors.messages import Turn

API_KEY = "test-api-key-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def gateway_env(hermes_cli: str, offline_root: OfflineRoot, tmp_path: Path) -> Iterator[dict[str, str]]:
    """``enable --gateway`` on the root, then ``hermes gateway run`` until the test ends."""
    env = {**os.environ, **offline_root.env, "API_SERVER_KEY": API_KEY}
    enable(offline_root.root, gateway=True, port=free_port(), cli=hermes_cli, env=env)
    with open(tmp_path / "gateway.log", "w") as log:
        proc = subprocess.Popen([hermes_cli, "gateway", "run"], env=env, cwd=offline_root.root,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        yield env
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_warm_turn_through_the_gateway_lands_in_bot_chat(offline_root: OfflineRoot, fake_model: FakeModel,
                                                         gateway_env: dict[str, str], hermes_cli: str) -> None:
    deadline = time.monotonic() + 90
    runner = default_runner(offline_root.root, env=gateway_env, cli=hermes_cli)
    while not isinstance(runner, ApiRunner) and time.monotonic() < deadline:
        time.sleep(0.5)  # polling the gateway's startup with a deadline
        runner = default_runner(offline_root.root, env=gateway_env, cli=hermes_cli)
    assert isinstance(runner, ApiRunner), "the gateway's API server did not come up within 90 s"

    bob = offline_root.home("bob")
    expected = find_bot_chat(bob)  # enable created it
    assert expected is not None
    turn = Turn(profile="bob", content="warm hello", delivery_id="w1", root=offline_root.root)
    assert runner.run_turn(turn) == "fake reply to: warm hello"
    assert runner.session_id("bob", "Bot Chat") == expected
    assert runner.run_turn(Turn(profile="bob", content="warm again", delivery_id="w2",
                                root=offline_root.root)) == "fake reply to: warm again"
    assert find_bot_chat(bob) == expected
