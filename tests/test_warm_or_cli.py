"""WarmOrCliRunner: a turn the hermes API server could not take runs with the CLI; one it may have run never does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from roots import LogCapture

from hermes_actors.errors import TurnFailed
from hermes_actors.hermes.warm_or_cli import WarmOrCliRunner, falls_back
from hermes_actors.messages import Turn

TURN = Turn(profile="bob", content="hi", delivery_id="d1", root=Path("/r"))


class Fake:
    """A runner that answers, or raises, what it is told; records its turns."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.turns: list[str] = []
        self.failure: TurnFailed | None = None
        self.server = f"{name}-server"
        self.cli = f"{name}-cli"
        self.released: list[str] = []

    def run_turn(self, turn: Turn) -> str:
        self.turns.append(turn.delivery_id)
        if self.failure is not None:
            raise self.failure
        return f"{self.name}: {turn.content}"

    def release(self, delivery_id: str) -> None:
        self.released.append(delivery_id)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(*, cold: bool = False) -> tuple[WarmOrCliRunner, Fake, Fake, Clock]:
    warm, cli, clock = Fake("warm"), Fake("cli"), Clock()
    runner = WarmOrCliRunner(warm, cli, cold=cold, retry_seconds=30, clock=clock)  # type: ignore[arg-type]
    return runner, warm, cli, clock


@pytest.mark.parametrize(("failure", "expected"), [
    (TurnFailed("not reachable", reason="runtime_offline"), True),
    (TurnFailed("lost mid-turn", reason="runtime_offline", ambiguous=True), False),
    (TurnFailed("timed out", reason="delivery_timeout", ambiguous=True), False),
    (TurnFailed("key refused", reason="missing_config"), False),
    (TurnFailed("boom"), False),
], ids=["unreachable", "lost-mid-turn", "timeout", "key-refused", "unclassified"])
def test_falls_back_only_when_the_turn_never_reached_the_agent(failure: TurnFailed, expected: bool) -> None:
    assert falls_back(failure) is expected


def test_a_turn_the_server_cannot_take_runs_with_the_cli_then_the_server_is_tried_again() -> None:
    runner, warm, cli, clock = make()
    assert runner.run_turn(TURN) == "warm: hi"
    warm.failure = TurnFailed("not reachable", reason="runtime_offline")
    with LogCapture("INFO") as logs:
        assert runner.run_turn(Turn(profile="bob", content="a", delivery_id="d2", root=Path("/r"))) == "cli: a"
        assert runner.run_turn(Turn(profile="bob", content="b", delivery_id="d3", root=Path("/r"))) == "cli: b"
        assert warm.turns == ["d1", "d2"]  # within the retry window the server is not asked
        clock.now += 31
        warm.failure = None
        assert runner.run_turn(Turn(profile="bob", content="c", delivery_id="d4", root=Path("/r"))) == "warm: c"
    assert cli.turns == ["d2", "d3"] and warm.turns == ["d1", "d2", "d4"]
    switches = [line for line in logs.lines if "turns run" in line]
    assert len(switches) == 2 and "not reachable" in switches[0] and "answers again" in switches[1], switches


@pytest.mark.parametrize("failure", [
    TurnFailed("lost mid-turn", reason="runtime_offline", ambiguous=True),
    TurnFailed("key refused", reason="missing_config"),
], ids=["may-have-run", "refused"])
def test_a_turn_the_server_may_have_run_or_refused_is_never_run_again(failure: TurnFailed) -> None:
    runner, warm, cli, _ = make()
    warm.failure = failure
    with pytest.raises(TurnFailed) as raised:
        runner.run_turn(TURN)
    assert raised.value is failure and cli.turns == []


def test_started_cold_the_cli_runs_until_the_retry_time() -> None:
    runner, warm, _, clock = make(cold=True)
    assert runner.run_turn(TURN) == "cli: hi" and warm.turns == []
    clock.now += 30
    assert runner.run_turn(TURN) == "warm: hi"


def test_release_and_real_hermes_pass_through() -> None:
    runner, _, cli, _ = make()
    runner.release("d9")
    assert cli.released == ["d9"] and runner.real_hermes is True
    assert "warm-server" in repr(runner)


def test_a_runner_without_a_retry_clock_keeps_the_default_clock() -> None:
    warm, cli = Fake("warm"), Fake("cli")
    runner: Any = WarmOrCliRunner(warm, cli)  # type: ignore[arg-type]
    assert runner.run_turn(TURN) == "warm: hi"
