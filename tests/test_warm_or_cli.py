"""WarmOrCliRunner: a turn the hermes API server could not take runs with the CLI; one it may have run never does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from roots import LogCapture

from hermes_actors.errors import TurnFailed
from hermes_actors.hermes.api_client import ApiServerProblem
from hermes_actors.hermes.cli_runner import HermesCliRunner
from hermes_actors.hermes.gateway_process import gateway_pid
from hermes_actors.hermes.warm_or_cli import (
    WarmOrCliRunner,
    falls_back,
    refused_at_own_stop,
    turn_path,
    turns_in_hermes,
    turns_info,
    while_starting,
)
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
        self.during: Callable[[], None] | None = None  # what happens meanwhile, as a turn runs (another thread)

    def run_turn(self, turn: Turn) -> str:
        self.turns.append(turn.delivery_id)
        if self.during is not None:
            self.during()
        if self.failure is not None:
            raise self.failure
        return f"{self.name}: {turn.content}"

    def release(self, delivery_id: str) -> None:
        self.released.append(delivery_id)

    def in_flight(self, profile: str) -> str | None:
        return None  # no chat request of ours is open

    def turns_in_hermes(self) -> dict[str, str]:
        return {}  # no chat request of ours is open

    def stop_turns(self, delivery_ids: list[str] | None = None) -> int:
        return 0  # no turn process of its own runs


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(*, cold: bool = False) -> tuple[WarmOrCliRunner, Fake, Fake, Clock]:
    warm, cli, clock = Fake("warm"), Fake("cli"), Clock()
    runner = WarmOrCliRunner(warm, cli, cold=cold, retry_seconds=30, clock=clock)  # type: ignore[arg-type]
    return runner, warm, cli, clock


def test_a_turn_says_how_it_runs_before_it_runs_that_way(tmp_path: Path) -> None:
    """What the journal keeps for a restart to word a turn a killed host left (review: a CLI turn on a root with
    warm turns configured was told "the hermes gateway ran it"): warm, then CLI when it fell back."""
    runner, warm, _, _ = make()
    said: list[str] = []
    turn = Turn(profile="bob", content="hi", delivery_id="d1", root=tmp_path, _note_via=said.append)
    assert runner.run_turn(turn) == "warm: hi"
    assert said == ["warm"]
    said.clear()
    warm.failure = TurnFailed("not reachable", reason="runtime_offline")  # never delivered: the CLI runs it
    assert runner.run_turn(replace(turn, delivery_id="d2")) == "cli: hi"
    assert said == ["warm", "cli"]
    said.clear()
    assert runner.run_turn(replace(turn, delivery_id="d3")) == "cli: hi"  # straight to the CLI for a while
    assert said == ["cli"]


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


Sleeper = Callable[[], "subprocess.Popen[bytes]"]


@pytest.fixture
def sleeper() -> Iterator[Sleeper]:
    """Starts stand-in gateway processes (each exits once its stdin closes); kills what is left at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _lost_turn_runner(tmp_path: Path, gateway: subprocess.Popen[bytes]) -> tuple[WarmOrCliRunner, Fake, Fake]:
    """A runner whose warm turn d1 for bob was lost mid-turn in the gateway ``gateway`` (its pid file written)."""
    (tmp_path / "gateway.pid").write_text(json.dumps({"pid": gateway.pid, "kind": "hermes-gateway"}))
    warm, cli = Fake("warm"), Fake("cli")
    runner = WarmOrCliRunner(warm, cli)  # type: ignore[arg-type]
    warm.failure = TurnFailed("the connection was lost during @bob's turn", reason="runtime_offline", ambiguous=True)
    with pytest.raises(TurnFailed):
        runner.run_turn(Turn(profile="bob", content="slow one", delivery_id="d1", root=tmp_path))
    warm.failure = TurnFailed("connection refused", reason="runtime_offline")  # the gateway stopped serving
    return runner, warm, cli


def test_while_a_stopping_gateway_may_still_run_a_bots_lost_turn_its_next_dm_fails_busy_at_once(
    tmp_path: Path, sleeper: Sleeper
) -> None:
    """Regression: the gateway went on running the lost turn while the CLI ran the bot's next one beside it.

    Not a wait: it would run on the turn's own clock (a DM reported timed out must not start later)."""
    gateway = sleeper()
    runner, _, cli = _lost_turn_runner(tmp_path, gateway)
    assert turns_in_hermes(runner) == {"bob": ""}  # what status shows busy: the state the refusal below is from
    for key in ("d2", "d3"):  # every DM while the process lives, not only the first
        with pytest.raises(TurnFailed, match="still finishing an earlier turn") as caught:
            runner.run_turn(Turn(profile="bob", content="next", delivery_id=key, root=tmp_path))
        assert caught.value.reason == "target_busy" and "NOT delivered" in caught.value.text
        assert f"pid {gateway.pid}" in caught.value.text
    assert runner.run_turn(Turn(profile="carol", content="hi", delivery_id="d4", root=tmp_path)) == "cli: hi"
    assert cli.turns == ["d4"]  # another bot is not held by bob's lost turn
    gateway.communicate(b"", timeout=30)  # the gateway finishes its drain and exits
    assert turns_in_hermes(runner) == {}
    assert runner.run_turn(Turn(profile="bob", content="later", delivery_id="d5", root=tmp_path)) == "cli: later"


class Stopping(Fake):
    """A warm runner whose gateway removes its pid file while the turn runs, then loses the connection."""

    def __init__(self, pid_file: Path) -> None:
        super().__init__("warm")
        self.pid_file = pid_file

    def run_turn(self, turn: Turn) -> str:
        if not self.pid_file.exists():  # it stopped serving
            raise TurnFailed("connection refused", reason="runtime_offline")
        self.pid_file.unlink()  # hermes 0.19 removes gateway.pid seconds before its process exits
        raise TurnFailed("the connection was lost during @bob's turn", reason="runtime_offline", ambiguous=True)


def test_the_gateway_is_watched_even_when_it_removed_its_pid_file_before_the_turn_was_lost(
    tmp_path: Path, sleeper: Sleeper
) -> None:
    """Regression: a stopping hermes 0.19 deletes gateway.pid ~6 s after SIGTERM and lives ~20 s more: read
    only once the turn was lost, nothing was watched, and the next DM ran beside the draining turn."""
    gateway = sleeper()
    pid_file = tmp_path / "gateway.pid"
    pid_file.write_text(json.dumps({"pid": gateway.pid}))
    warm, cli = Stopping(pid_file), Fake("cli")
    runner = WarmOrCliRunner(warm, cli)  # type: ignore[arg-type]
    with pytest.raises(TurnFailed):
        runner.run_turn(Turn(profile="bob", content="slow", delivery_id="d1", root=tmp_path))
    with pytest.raises(TurnFailed, match="still finishing an earlier turn"):
        runner.run_turn(Turn(profile="bob", content="next", delivery_id="d2", root=tmp_path))
    assert cli.turns == []
    gateway.communicate(b"", timeout=30)
    assert runner.run_turn(Turn(profile="bob", content="later", delivery_id="d3", root=tmp_path)) == "cli: later"


class Restarting(Fake):
    """A warm runner whose gateway is restarted during the turn: the pid file names the new process."""

    def __init__(self, pid_file: Path, new_pid: int) -> None:
        super().__init__("warm")
        self.pid_file, self.new_pid, self.calls = pid_file, new_pid, 0

    def run_turn(self, turn: Turn) -> str:
        self.calls += 1
        if self.calls == 1:
            self.pid_file.write_text(json.dumps({"pid": self.new_pid}))  # `hermes gateway restart`
            raise TurnFailed("the connection was lost during @bob's turn", reason="runtime_offline", ambiguous=True)
        return f"warm: {turn.content}"


def test_a_turn_lost_in_a_restarted_gateway_waits_for_the_old_process_not_the_new_one(
    tmp_path: Path, sleeper: Sleeper
) -> None:
    """Regression: the pid file was read again once the turn was lost; after a restart it named the new
    gateway, so the draining one was not watched and the bot was refused for as long as the new one lived."""
    old, new = sleeper(), sleeper()
    pid_file = tmp_path / "gateway.pid"
    pid_file.write_text(json.dumps({"pid": old.pid}))
    warm, cli = Restarting(pid_file, new.pid), Fake("cli")
    runner = WarmOrCliRunner(warm, cli)  # type: ignore[arg-type]
    with pytest.raises(TurnFailed):
        runner.run_turn(Turn(profile="bob", content="slow", delivery_id="d1", root=tmp_path))
    with pytest.raises(TurnFailed, match=f"pid {old.pid}"):
        runner.run_turn(Turn(profile="bob", content="next", delivery_id="d2", root=tmp_path))
    old.communicate(b"", timeout=30)  # the old gateway finished draining; the new one serves
    assert runner.run_turn(Turn(profile="bob", content="later", delivery_id="d3", root=tmp_path)) == "warm: later"


def _ask_while_it_exits(proc: subprocess.Popen[bytes], threads: int = 8, calls: int = 200) -> list[BaseException]:
    """Many threads ask one ProcessWatch whether ``proc`` exited while it exits; what escaped them."""
    from hermes_actors.store.processes import ProcessWatch

    watch = ProcessWatch(proc.pid)
    start = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def ask() -> None:
        start.wait()
        try:
            for _ in range(calls):
                watch.exited()
        except BaseException as exc:  # the test collects whatever escaped
            errors.append(exc)

    workers = [threading.Thread(target=ask) for _ in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    proc.communicate(b"", timeout=30)
    for worker in workers:
        worker.join(30)
    assert watch.exited() is True
    return errors


def test_a_process_watch_asked_by_many_threads_as_its_process_exits_never_fails(sleeper: Sleeper) -> None:
    """Regression: exited() checked and closed the pidfd without a lock: EBADF under concurrent calls."""
    for _ in range(50):
        assert _ask_while_it_exits(sleeper()) == []


def test_a_lost_turn_in_the_gateway_hosting_us_blocks_nothing(tmp_path: Path) -> None:
    """Hosted inside `hermes gateway run`, gateway.pid is this process: the lost turn cannot outlive it."""
    (tmp_path / "gateway.pid").write_text(json.dumps({"pid": os.getpid()}))
    warm, cli = Fake("warm"), Fake("cli")
    runner = WarmOrCliRunner(warm, cli)  # type: ignore[arg-type]
    warm.failure = TurnFailed("lost", reason="runtime_offline", ambiguous=True)
    with pytest.raises(TurnFailed):
        runner.run_turn(Turn(profile="bob", content="slow", delivery_id="d1", root=tmp_path))
    warm.failure = None
    assert runner.run_turn(Turn(profile="bob", content="next", delivery_id="d2", root=tmp_path)) == "warm: next"


class Retrying(Fake):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.prepared: list[str] = []

    def prepare_retry(self, turn: Turn, began: float) -> bool:
        self.prepared.append(turn.delivery_id)
        return True


def test_the_retry_is_prepared_by_the_path_that_ran_the_failed_attempt() -> None:
    warm, cli = Retrying("warm"), Retrying("cli")
    runner = WarmOrCliRunner(warm, cli)  # type: ignore[arg-type]
    warm.failure = TurnFailed("provider down", reason="provider_server_error")
    with pytest.raises(TurnFailed):
        runner.run_turn(TURN)
    assert runner.prepare_retry(TURN, 0.0) and (warm.prepared, cli.prepared) == (["d1"], [])
    warm.failure = TurnFailed("refused", reason="runtime_offline")  # this time the CLI ran it
    cli.failure = TurnFailed("provider down", reason="provider_server_error")
    with pytest.raises(TurnFailed):
        runner.run_turn(TURN)
    assert runner.prepare_retry(TURN, 0.0) and (warm.prepared, cli.prepared) == (["d1"], ["d1"])
    runner.release("d1")
    assert runner._paths == {}  # nothing kept per delivery once it is settled


@pytest.mark.parametrize("content", ["", "not json", "{\"pid\": \"12\"}", "{\"pid\": true}", "[1]", "1"])
def test_gateway_pid_refuses_what_is_not_a_live_pid(tmp_path: Path, content: str) -> None:
    (tmp_path / "gateway.pid").write_text(content)
    assert gateway_pid(tmp_path) is None
    assert gateway_pid(tmp_path / "missing") is None
    (tmp_path / "gateway.pid").unlink()
    (tmp_path / "gateway.pid").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_text(json.dumps({"pid": os.getpid()}))
    assert gateway_pid(tmp_path) is None  # never followed


def _bot_chat_ending_with_a_dm(home: Path, stored_at: float) -> None:
    """bob's Bot Chat: an answered exchange, then a DM hermes stored at ``stored_at`` and nobody answered yet."""
    session_db = pytest.importorskip("hermes_state", reason="needs hermes-agent (the [hermes] extra)").SessionDB
    from hermes_actors.core.targets import DM_SIGNATURE_START

    home.mkdir(parents=True, exist_ok=True)
    db = session_db(db_path=home / "state.db")
    try:
        db.create_session("s1", "cli")
        db.set_session_title("s1", "Bot Chat")
        db.append_message("s1", "user", f"{DM_SIGNATURE_START} Alice (@alice): earlier")
        db.append_message("s1", "assistant", "answered")
        db.append_message("s1", "user", f"{DM_SIGNATURE_START} Alice (@alice): still being answered")
        with db._lock:  # hermes stamps rows with time.time(): date the last one
            db._conn.execute("UPDATE messages SET timestamp = ? WHERE id = (SELECT MAX(id) FROM messages)",
                             (stored_at,))
            db._conn.commit()
    finally:
        db.close()


@pytest.mark.parametrize(("started_ago", "stored_ago", "busy"), [
    (100.0, 10.0, True),  # stored 90 s after the live gateway started: its turn may still run there
    (100.0, 200.0, False),  # stored before it started: a turn that died with an earlier gateway, taken back
    (100.0, 100.5, False),  # within the start time's second of slack: not claimed as the live gateway's
    (1000.0, 700.0, False),  # unanswered past LIVE_TURN_SECONDS: a turn that failed there, taken back
])
def test_a_turn_a_killed_host_left_in_the_live_gateway_holds_the_bot(
    tmp_path: Path, sleeper: Sleeper, monkeypatch: pytest.MonkeyPatch, started_ago: float, stored_ago: float,
    busy: bool,
) -> None:
    """Regression (end-to-end review): after `serve` was killed -9 mid warm turn, the restarted `serve` took the
    turn's question back as a dead turn's and ran the bot's next DM beside it in the still-running gateway."""
    import time

    from hermes_actors.hermes import warm_or_cli

    gateway = sleeper()
    (tmp_path / "gateway.pid").write_text(json.dumps({"pid": gateway.pid, "kind": "hermes-gateway"}))
    now = time.time()
    monkeypatch.setattr(warm_or_cli, "process_started_at",
                        lambda pid: now - started_ago if pid == gateway.pid else None)
    _bot_chat_ending_with_a_dm(tmp_path / "profiles" / "bob", now - stored_ago)
    warm, cli = Fake("warm"), Fake("cli")
    runner = WarmOrCliRunner(warm, cli)  # type: ignore[arg-type]
    turn = Turn(profile="bob", content="next", delivery_id="d2", root=tmp_path)
    if busy:
        with pytest.raises(TurnFailed, match="still answering an earlier message") as caught:
            runner.run_turn(turn)
        assert caught.value.reason == "target_busy" and "NOT delivered" in caught.value.text
        assert f"pid {gateway.pid}" in caught.value.text and warm.turns == []
        gateway.communicate(b"", timeout=30)  # the gateway is gone: the DM it left is a dead turn's now
    assert runner.run_turn(turn) == "warm: next" and warm.turns == ["d2"]


def test_process_started_at_tells_when_a_process_started(sleeper: Sleeper) -> None:
    import time

    from hermes_actors.store.processes import process_started_at

    before = time.time()
    proc = sleeper()
    started = process_started_at(proc.pid)
    assert started is not None and before - 1.5 <= started <= time.time() + 1.5  # btime is whole seconds
    proc.communicate(b"", timeout=30)
    assert process_started_at(proc.pid) is None  # gone (reaped)


def test_a_turn_runs_apart_from_a_serve_host_but_not_from_the_gateway_hosting_the_actors(tmp_path: Path,
                                                                                         sleeper: Sleeper) -> None:
    """What a restart tells the sender of a warm turn the previous host lost (review: a `serve` host killed mid
    warm turn said "The gateway stopped or crashed during the turn" though the hermes gateway ran on and answered)."""
    runner, _, _, _ = make()
    turn = Turn(profile="bob", content="hi", delivery_id="d1", root=tmp_path)
    assert runner.runs_apart(turn)  # no gateway running: this host is serve, not the gateway
    other = sleeper()  # another live process (not os.getppid(): the suite's parent may be pid 1, never a gateway)
    (tmp_path / "gateway.pid").write_text(json.dumps({"pid": other.pid}), encoding="utf-8")
    assert runner.runs_apart(turn)  # another process is the gateway
    (tmp_path / "gateway.pid").write_text(json.dumps({"pid": os.getpid()}), encoding="utf-8")
    assert not runner.runs_apart(turn)  # this process is the hermes gateway hosting the actors


class InFlight(Fake):
    """A warm path that reports its turn in flight while it runs, and what ``warm_turns`` said meanwhile."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.now: list[str] = []
        self.seen: list[list[str]] = []
        self.runner: WarmOrCliRunner | None = None

    def in_flight_turns(self) -> list[str]:
        return list(self.now)

    def run_turn(self, turn: Turn) -> str:
        self.now.append(turn.delivery_id)
        try:
            assert self.runner is not None
            self.seen.append(self.runner.warm_turns())
            return super().run_turn(turn)
        finally:
            self.now.remove(turn.delivery_id)


@pytest.mark.parametrize("gateway", ["another process", "this process"])
def test_a_stop_is_told_which_turns_run_warm_in_a_gateway_apart_from_this_host(
    tmp_path: Path, sleeper: Sleeper, gateway: str
) -> None:
    """What words a warm turn a stop of ``serve`` cuts off (review: it said only "the gateway stopped", though the
    hermes gateway went on to answer): listed while it runs in another process's gateway, never once done, never
    when this process is the gateway (its turns stop with it), and never a turn that fell back to the CLI."""
    pid = sleeper().pid if gateway == "another process" else os.getpid()
    (tmp_path / "gateway.pid").write_text(json.dumps({"pid": pid, "kind": "hermes-gateway"}), encoding="utf-8")
    warm, cli = InFlight("warm"), Fake("cli")
    runner = WarmOrCliRunner(warm, cli)  # type: ignore[arg-type]
    warm.runner = runner
    assert runner.run_turn(Turn(profile="bob", content="hi", delivery_id="d1", root=tmp_path)) == "warm: hi"
    assert warm.seen == ([["d1"]] if gateway == "another process" else [[]])
    assert runner.warm_turns() == []  # done: nothing runs in the gateway for us
    warm.failure = TurnFailed("not reachable", reason="runtime_offline")
    assert runner.run_turn(Turn(profile="bob", content="b", delivery_id="d2", root=tmp_path)) == "cli: b"
    assert runner.warm_turns() == []  # it ran with the CLI (its process is what running_turns lists)


_LOST = TurnFailed("the connection to the hermes API server at 127.0.0.1:8642 was lost during @bob's Bot Chat turn "
                   "(Remote end closed connection without response)", reason="runtime_offline", ambiguous=True)
_AT_STOP = "The turn was still running when the gateway stopped."


@pytest.mark.parametrize(("failure", "here", "stopping", "told"), [
    (_LOST, True, True, _AT_STOP),  # Ctrl-C of the hermes gateway hosting the actors, a warm turn running
    (_LOST, True, False, _LOST.text),  # the API server went, the gateway did not stop: a lost connection
    (_LOST, False, True, _LOST.text),  # another process's gateway (serve's warm turns): its own story
    (TurnFailed("timed out", reason="delivery_timeout", ambiguous=True), True, True, "timed out"),
    (TurnFailed("connection refused", reason="runtime_offline"), True, True, "connection refused"),  # never sent
], ids=["own-stop", "not-stopping", "not-here", "timed-out", "not-sent"])
def test_cut_by_own_stop_words_only_a_connection_our_gateways_stop_cut(
    failure: TurnFailed, here: bool, stopping: bool, told: str
) -> None:
    from hermes_actors.hermes.warm_or_cli import cut_by_own_stop

    out = cut_by_own_stop(failure, here=here, stopping=stopping)
    assert out.text == told
    assert (out.reason, out.ambiguous) == (failure.reason, failure.ambiguous)


class _Sign:
    """A stop sign as the gateway platform registers one (a bound method, held weakly)."""

    def __init__(self) -> None:
        self.stopping = False  # hermes' own stop began (both signs say so)
        self.disconnecting = False  # our platform's disconnect alone (a multiplexing gateway going on)

    def says(self) -> bool:
        return self.stopping or self.disconnecting

    def begun(self) -> bool:
        return self.stopping

    def during(self, runner: Fake) -> None:
        """The stop begins while ``runner``'s next turns run (as they reach hermes)."""
        runner.during = lambda: setattr(self, "stopping", True)


@pytest.fixture
def own_stop() -> Iterator[_Sign]:
    """The stop sign of a hermes gateway platform of ours in this process (``gateway_process.watch_own_stop``);
    it says nothing once the test is over, whatever the test left."""
    from hermes_actors.hermes.gateway_process import watch_own_stop

    sign = _Sign()
    watch_own_stop(sign.says, begun=sign.begun)
    try:
        yield sign
    finally:
        sign.stopping = sign.disconnecting = False


def test_a_warm_turn_cut_by_the_stop_of_the_gateway_hosting_us_is_still_running_when_it_stopped(
    tmp_path: Path, own_stop: _Sign
) -> None:
    """Regression (acceptance on hermes 0.19): Ctrl-C of `hermes gateway run` (hosting the actors) during a warm turn
    told the sender "the connection to the hermes API server … was lost … (Remote end closed connection without
    response)", while the docs promise "The turn was still running when the gateway stopped.": hermes closes its
    API server before our platform's disconnect runs."""
    (tmp_path / "gateway.pid").write_text(json.dumps({"pid": os.getpid()}))  # this process is the gateway
    runner, warm, cli, _ = make()
    warm.failure = _LOST
    with pytest.raises(TurnFailed) as caught:
        runner.run_turn(Turn(profile="bob", content="hi", delivery_id="d1", root=tmp_path))
    assert caught.value.text == _LOST.text  # not stopping: the connection was lost
    own_stop.during(warm)  # Ctrl-C while the turn runs: hermes' stop began
    with pytest.raises(TurnFailed) as caught:
        runner.run_turn(Turn(profile="bob", content="hi", delivery_id="d2", root=tmp_path))
    assert (caught.value.text, caught.value.reason, caught.value.ambiguous) == (_AT_STOP, "runtime_offline", True)
    assert cli.turns == []  # never run again


_REFUSED = TurnFailed("hermes API server at 127.0.0.1:55127 is not reachable ([Errno 111] Connection refused) — is "
                      "`hermes gateway run` running?", reason="runtime_offline")
_DRAINING = TurnFailed("hermes API server answered 503 on @bob's Bot Chat turn: Gateway is draining existing work; "
                       "retry shortly.", reason="runtime_offline")


@pytest.mark.parametrize(("failure", "stopping", "cancelled"), [
    (_REFUSED, True, True),  # the stopping gateway hosting us closed its API server: the turn never reached it
    (_DRAINING, True, True),  # it drains: it takes no new turn
    (_REFUSED, False, False),  # a server down while no stop of ours runs: the CLI runs the turn
    (_LOST, True, False),  # it may have reached hermes: cut_by_own_stop words it, never run again
    (TurnFailed("HTTP 500 from the provider", reason="provider_server_error"), True, False),  # a turn that ran
], ids=["refused-at-stop", "draining-at-stop", "refused-no-stop", "lost-at-stop", "ran-at-stop"])
def test_refused_at_own_stop_cancels_only_a_turn_the_stopping_gateway_never_took(
    failure: TurnFailed, stopping: bool, cancelled: bool
) -> None:
    out = refused_at_own_stop(failure, "bob", stopping=stopping)
    if not cancelled:
        assert out is None
        return
    assert out is not None and (out.reason, out.ambiguous) == ("runtime_offline", False)
    assert out.text == ("@bob's turn was ended because the gateway stopped before it began (the hermes gateway "
                        "hosting the actors is stopping); the message was NOT delivered — resend once the gateway is "
                        "back.")


def test_a_warm_turn_the_stopping_gateway_hosting_us_refuses_is_cancelled_never_run_with_the_cli(
    tmp_path: Path, own_stop: _Sign
) -> None:
    """Regression (real-hermes soak, SIGTERM of `hermes gateway run` hosting the actors while bob's turn ran and DMs
    waited behind it): the next turn's warm call was refused (hermes had already closed its API server) and the
    turn ran with the CLI during the stop, behind our closed submit endpoint (its `message_agent` failed "Bot Mode is
    not running ... NOT sent" while its DM was reported replied), and the stopping gateway logged `warm turns stopped
    (... Connection refused) — is hermes gateway run running?`. Refused once that stop began, a turn is `cancelled`
    (NOT delivered, it ran nowhere), and warm turns are not said to have stopped."""
    (tmp_path / "gateway.pid").write_text(json.dumps({"pid": os.getpid()}))  # this process is the gateway
    runner, warm, cli, _ = make()
    warm.failure = _REFUSED
    own_stop.during(warm)  # the stop begins as the server refuses the turn
    with LogCapture("INFO") as logs, pytest.raises(TurnFailed) as caught:
        runner.run_turn(Turn(profile="bob", handle="bob", content="hi", delivery_id="d1", root=tmp_path))
    assert (caught.value.reason, caught.value.ambiguous) == ("runtime_offline", False)
    assert "NOT delivered" in caught.value.text
    assert (warm.turns, cli.turns) == (["d1"], [])
    assert logs.matching("warm turns stopped") == [] and not runner.cold
    assert runner.turns_now()["turns_via"] == "warm"


@pytest.mark.parametrize("cold", [False, True], ids=["warm", "cli"])
def test_no_turn_starts_once_the_gateway_hosting_us_began_to_stop_on_any_path(
    tmp_path: Path, own_stop: _Sign, cold: bool
) -> None:
    """A turn that comes once the stop of the hermes gateway hosting the actors began (past its turn gate just
    before) runs nowhere: not warm (hermes drains and takes no new turn), not with the CLI (a turn behind a closed
    submit endpoint): `cancelled`, NOT delivered."""
    runner, warm, cli, _ = make(cold=cold)
    own_stop.stopping = True
    with pytest.raises(TurnFailed) as caught:
        runner.run_turn(Turn(profile="bob", handle="bob", content="hi", delivery_id="d1", root=tmp_path))
    assert (caught.value.reason, caught.value.ambiguous) == ("runtime_offline", False)
    assert (warm.turns, cli.turns) == ([], [])


def test_our_platforms_disconnect_alone_refuses_no_turn(tmp_path: Path, own_stop: _Sign) -> None:
    """Review (diffrev28): the pre-turn check read the process-wide sign that our platform's disconnect also
    raises, so a multiplexing gateway dropping one profile's platform and going on refused the other bots' turns;
    only hermes' own stop refuses them (our own stop holds the turns not begun at its gates)."""
    runner, warm, cli, _ = make(cold=False)
    own_stop.disconnecting = True
    assert runner.run_turn(Turn(profile="bob", handle="bob", content="hi", delivery_id="d1", root=tmp_path))
    assert len(warm.turns) == 1 and cli.turns == []


def test_a_turn_waiting_for_the_api_server_to_start_never_runs_once_the_gateway_hosting_us_began_to_stop(
    tmp_path: Path, own_stop: _Sign
) -> None:
    """A Ctrl-C of the hermes gateway while a turn waits for its API server to start: the turn stops waiting and
    runs nowhere (not with the CLI once the wait would have run out)."""
    def stop_during_the_first_probe(call: int) -> None:
        if call == 1:
            own_stop.stopping = True

    runner, warm, cli, _, probes = starting(lambda clock: Probes(clock, [DOWN], step=12.0,
                                                                  then=stop_during_the_first_probe))
    with pytest.raises(TurnFailed) as caught:
        runner.run_turn(Turn(profile="bob", handle="bob", content="hi", delivery_id="d1", root=tmp_path))
    assert caught.value.reason == "runtime_offline" and "before it began" in caught.value.text
    assert (warm.turns, cli.turns, probes.calls) == ([], [], 1)


# ── inside the hermes gateway hosting the actors: its API server may still be starting ─────────────────


DOWN = ApiServerProblem("does not answer ([Errno 111] Connection refused)", False)
OTHER = ApiServerProblem("answered HTTP 404 on /health, not as hermes' API server does: another program may hold "
                         "the port", True)


@pytest.mark.parametrize(("now", "cli_until", "starting", "expected"), [
    (100.0, 0.0, False, "warm"),
    (100.0, 130.0, False, "cli"),  # after a fallback: the CLI until the server is tried again
    (130.0, 130.0, False, "warm"),
    (100.0, 0.0, True, "starting"),  # the server of the gateway hosting us may still be starting: probe first
    (100.0, 130.0, True, "starting"),
], ids=["warm", "cli-after-fallback", "tried-again", "starting", "starting-wins"])
def test_turn_path(now: float, cli_until: float, starting: bool, expected: str) -> None:
    assert turn_path(now, cli_until, starting) == expected


@pytest.mark.parametrize(("now", "problem", "expected"), [
    (100.0, None, "warm"),
    (100.0, DOWN, "wait"),
    (129.9, DOWN, "wait"),
    (130.0, DOWN, "cli"),  # the wait is over
    (100.0, OTHER, "cli"),  # something else answers on its port: waiting will not cure it
    (130.0, None, "warm"),  # answering is all that counts, however late
], ids=["answers", "not-yet", "just-before-the-end", "over", "misconfigured", "answers-late"])
def test_while_starting(now: float, problem: ApiServerProblem | None, expected: str) -> None:
    assert while_starting(now, 130.0, problem) == expected


class Probes:
    """A probe of the API server that sees what it is told, in turn, then the last thing for good; it may move
    the runner's clock on and run something at each probe (what another thread would do meanwhile)."""

    def __init__(self, clock: Clock, seen: list[ApiServerProblem | None], *, step: float = 0.0,
                 then: Callable[[int], None] | None = None) -> None:
        self.clock, self.seen, self.step, self.then = clock, list(seen), step, then
        self.calls = 0

    def __call__(self, timeout: float) -> ApiServerProblem | None:
        assert 0 < timeout <= 2.0  # one probe never takes longer than the time left, nor 2 s
        self.calls += 1
        self.clock.now += self.step
        if self.then is not None:
            self.then(self.calls)
        return self.seen.pop(0) if len(self.seen) > 1 else self.seen[0]


def starting(probe: Callable[[Clock], Probes]) -> tuple[WarmOrCliRunner, Fake, Fake, Clock, Probes]:
    """A runner made as the hermes gateway hosting the actors starts: turns wait 30 s for its API server."""
    warm, cli, clock = Fake("warm"), Fake("cli"), Clock()
    probes = probe(clock)
    runner = WarmOrCliRunner(warm, cli, await_server=30, probe=probes, retry_seconds=30,  # type: ignore[arg-type]
                             clock=clock)
    runner.probe_every = 0.001  # the pause between two probes (the probes here answer at once)
    return runner, warm, cli, clock, probes


def test_in_the_gateway_a_turn_waits_for_the_api_server_starting_and_runs_warm(tmp_path: Path) -> None:
    """Regression (acceptance, hermes 0.19): with `platforms.hermes_actors` listed before `api_server`, the gateway
    connected our platform first; the API server was not up yet, and every DM for the next 30-40 s ran as a cold
    `hermes chat` process (8-29 s each) until the 30 s re-probe found it. A turn now waits for it and runs warm."""
    runner, warm, cli, _, probes = starting(lambda clock: Probes(clock, [DOWN, DOWN, None], step=1.0))
    assert runner.turns_now() == {"turns_via": "starting", "cli_seconds": 0.0}
    with LogCapture("INFO") as logs:
        assert runner.run_turn(Turn(profile="bob", content="hi", delivery_id="d1", root=tmp_path)) == "warm: hi"
    assert (warm.turns, cli.turns, probes.calls) == (["d1"], [], 3)
    assert logs.matching("the hermes API server warm-server answers: turns run warm")
    assert not [r for r in logs.records if r["level"].name == "WARNING"], logs.lines
    # warm from then on: no more probes
    assert runner.run_turn(Turn(profile="bob", content="again", delivery_id="d2", root=tmp_path)) == "warm: again"
    assert probes.calls == 3 and runner.turns_now()["turns_via"] == "warm"


def test_in_the_gateway_an_api_server_that_never_answers_falls_back_to_the_cli_with_a_warning(tmp_path: Path) -> None:
    """Bounded: 30 s after the host's start (the turn's own wait counted), the CLI as after any fallback, and the
    WARNING docs/hermes.md names (`warm turns are off at the start: …`), once; later turns try the server again."""
    runner, warm, cli, clock, probes = starting(lambda clock: Probes(clock, [DOWN], step=12.0))
    with LogCapture("INFO") as logs:
        assert runner.run_turn(Turn(profile="bob", content="hi", delivery_id="d1", root=tmp_path)) == "cli: hi"
        assert probes.calls == 3  # at 12 s and 24 s it waits; at 36 s the wait is over
        assert runner.run_turn(Turn(profile="bob", content="b", delivery_id="d2", root=tmp_path)) == "cli: b"
    assert (warm.turns, cli.turns, probes.calls) == ([], ["d1", "d2"], 3)  # no probe once it gave up
    warned = [r["message"] for r in logs.records if r["level"].name == "WARNING"]
    assert warned == [f"warm turns are off at the start: the hermes API server warm-server does not answer ([Errno "
                      f"111] Connection refused) 36 s after this hermes gateway began hosting the actors; turns on "
                      f"{tmp_path} run with the hermes CLI cli-cli (2–4 s of CPU each) until it answers (hermes says "
                      f"in {tmp_path / 'logs' / 'gateway.log'} why its API server did not start)"], logs.lines
    assert runner.turns_now() == {"turns_via": "cli", "cli_seconds": 30.0}
    clock.now += 30  # as after any fallback: the server is tried again
    assert runner.run_turn(Turn(profile="bob", content="c", delivery_id="d3", root=tmp_path)) == "warm: c"


def test_in_the_gateway_something_else_on_the_api_servers_port_is_not_waited_for(tmp_path: Path) -> None:
    runner, warm, _, _, probes = starting(lambda clock: Probes(clock, [OTHER]))
    with LogCapture("WARNING") as logs:
        assert runner.run_turn(Turn(profile="bob", content="hi", delivery_id="d1", root=tmp_path)) == "cli: hi"
    assert (warm.turns, probes.calls) == ([], 1)
    assert logs.matching("the hermes API server warm-server answered HTTP 404", "until it is fixed", "doctor")


def test_a_turn_the_stop_ends_while_it_waits_for_the_api_server_never_runs(tmp_path: Path) -> None:
    """Not warm once the server answers, nor with the CLI once the wait is over: the stop settled it already."""
    holder: list[WarmOrCliRunner] = []

    def stop_during_the_first_probe(call: int) -> None:
        if call == 1:
            holder[0].stop_turns(["d1"])

    runner, warm, cli, _, _ = starting(lambda clock: Probes(clock, [DOWN, None], then=stop_during_the_first_probe))
    holder.append(runner)
    with pytest.raises(TurnFailed) as caught:
        runner.run_turn(Turn(profile="bob", content="hi", delivery_id="d1", root=tmp_path))
    assert caught.value.reason == "cancelled" and "before it began" in caught.value.text
    assert (warm.turns, cli.turns) == ([], [])
    runner.release("d1")  # settled: the same id would run again (a journal replay on a later start)
    assert runner.run_turn(Turn(profile="bob", content="hi", delivery_id="d1", root=tmp_path)) == "warm: hi"


def test_turns_info_says_how_a_hosts_turns_run(tmp_path: Path) -> None:
    """What a host's ping carries for doctor: warm, the CLI for how long (None: for good), nothing for others."""
    runner, _, _, clock = make(cold=True)
    assert turns_info(runner) == {"turns_via": "cli", "cli_seconds": 30.0}
    clock.now += 10
    assert turns_info(runner) == {"turns_via": "cli", "cli_seconds": 20.0}
    clock.now += 20
    assert turns_info(runner) == {"turns_via": "warm", "cli_seconds": 0.0}
    assert turns_info(HermesCliRunner("/bin/sh")) == {"turns_via": "cli", "cli_seconds": None}
    assert turns_info(Fake("demo")) == {}
    waiting, _, _, clock, _ = starting(lambda clock: Probes(clock, [DOWN]))
    assert turns_info(waiting)["turns_via"] == "starting"
    clock.now += 30  # no turn came during the wait: the next one tries the server first, as a warm one does
    assert turns_info(waiting)["turns_via"] == "warm"


def test_a_stop_ends_a_turn_waiting_for_the_api_server_at_once_and_it_never_runs(tmp_path: Path) -> None:
    """Regression (review of the wait): a stop while a turn waited for the API server to start did not end the
    wait (the runner heard of the stop only once the stop's own timeout had run out): the stop then reported
    ``ambiguous`` a turn that never ran, or, the wait over first, the turn ran with the CLI during the stop.
    The stop now ends the wait as it begins: the turn is ``cancelled`` and runs nowhere."""
    from roots import make_root

    from hermes_actors import Gateway

    probing = threading.Event()
    runner, warm, cli, _, _ = starting(lambda clock: Probes(clock, [DOWN], then=lambda call: probing.set()))
    seen: list[dict[str, Any]] = []
    gw = Gateway(make_root(tmp_path), runner=runner).start()
    try:
        gw.subscribe(seen.append)
        ack = gw.message_agent(sender="alice", target="bob", message="hi")
        assert probing.wait(30), "the turn never began waiting for the API server"
    finally:
        gw.stop(timeout=5)
    outcome = next(o for o in seen if o["delivery_id"] == ack["delivery_id"])
    assert (outcome["status"], outcome.get("reason")) == ("failed", "cancelled"), outcome
    assert (warm.turns, cli.turns) == ([], [])


def test_a_turn_that_comes_to_the_wait_after_the_stop_began_never_waits_nor_runs(tmp_path: Path) -> None:
    """Review: the stop's ``stop_waiting`` ended only the turns waiting at that moment; a turn whose worker reached
    the wait a moment later (past its turn gate, on a loaded machine) waited on and was reported ``ambiguous`` at
    the stop's cut-off, or ran with the CLI once its wait was over. The stop is for good: it never waits."""
    runner, warm, cli, _, probes = starting(lambda clock: Probes(clock, [DOWN], step=12.0))
    assert runner.stop_waiting() == 0  # nothing waits yet
    with pytest.raises(TurnFailed) as caught:
        runner.run_turn(Turn(profile="bob", content="hi", delivery_id="d1", root=tmp_path))
    assert caught.value.reason == "cancelled" and "before it began" in caught.value.text
    assert (warm.turns, cli.turns, probes.calls) == ([], [], 0)
