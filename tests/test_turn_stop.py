"""Stopping with turns running (issue 11, items 5 and 6), against a fake ``hermes`` CLI.

The fake records a ``start`` line (its pid, its grandchild's pid, and which earlier
turn processes are still alive: an overlap) and an ``end`` line into ``$FAKE_LOG``;
it runs until ``$FAKE_RELEASE`` exists. Real ``hermes-actors`` processes are used
where the bug was in the process's exit: ``send`` and ``serve``.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crash_procs import SIGNAL_ANOTHER_THREAD
from relay_helpers import seed_envelope
from roots import assert_gone, make_root, process_alive, write_fake_cli

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.cli.serve import cut_off_text, stop_gateway, stop_text, waiting_text
from hermes_actors.local.runners import CommandRunner
from hermes_actors.ops.stop_signals import SignalEffect, StopSignals, signal_effect, signal_exit_code
from hermes_actors.store.relay_inbox import InboxPaths, post_to_inbox

FAKE_HERMES = r"""
import json, os, subprocess, sys, time

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

log, tag = os.environ["FAKE_LOG"], os.environ.get("FAKE_TAG", "")
with open(log, "a+", encoding="utf-8") as f:
    f.seek(0)
    earlier = [json.loads(line) for line in f if line.strip()]
    running = [e["tag"] for e in earlier if e["ev"] == "start" and alive(e["pid"])]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    f.write(json.dumps({"ev": "start", "tag": tag, "pid": os.getpid(), "child_pid": child.pid,
                        "overlaps": running}) + "\n")
release = os.environ["FAKE_RELEASE"]
deadline = time.monotonic() + 120
while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.02)
child.kill()
child.wait()
if os.environ.get("FAKE_CHATTY"):  # as hermes does while it starts up: it writes before it stores the DM
    print("loading the session...", file=sys.stderr, flush=True)
    print("thinking...", flush=True)
with open(log, "a", encoding="utf-8") as f:
    f.write(json.dumps({"ev": "end", "tag": tag, "pid": os.getpid()}) + "\n")
sys.stdout.write(f"done {tag}\n")
"""

WAIT = 30.0  # generous deadline for positive waits


@pytest.fixture
def fake_cli(tmp_path: Path) -> Path:
    return write_fake_cli(tmp_path, f"#!{sys.executable}\n{FAKE_HERMES}")


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids a failing test might leave behind; killed at teardown."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def events(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]


def started(log: Path, tag: str) -> dict[str, Any] | None:
    return next((e for e in events(log) if e["ev"] == "start" and e["tag"] == tag), None)


def await_started(log: Path, tag: str, leftovers: list[int]) -> dict[str, Any]:
    event = await_condition(lambda: started(log, tag), timeout=WAIT, message=f"turn {tag} started")
    leftovers += [event["pid"], event["child_pid"]]
    return event


def fake_env(log: Path, release: Path, tag: str) -> dict[str, str]:
    return {**os.environ, "FAKE_LOG": str(log), "FAKE_RELEASE": str(release), "FAKE_TAG": tag,
            "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}


class Proc:
    """A ``hermes-actors`` process with its own fake-CLI environment; stdout and stderr go to files."""

    def __init__(self, name: str, args: list[str], tmp_path: Path, env: dict[str, str]) -> None:
        self.out, self.err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "hermes_actors.cli.main", *args],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def await_stderr(self, needle: str) -> None:
        await_condition(lambda: needle in self.stderr() or self.proc.poll() is not None, timeout=WAIT,
                        message=f"{needle!r} on stderr")
        assert needle in self.stderr(), f"exit={self.proc.poll()} stderr={self.stderr()[-2000:]}"

    def wait(self, timeout: float = WAIT) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=WAIT)


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.kill()


# ── item 5: no turn outlives its gateway, turns of one profile never overlap ─


def test_a_stopping_gateway_ends_its_running_turns_process_group_as_ambiguous(
    tmp_path: Path, fake_cli: Path, leftovers: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_root(tmp_path)
    log, release = tmp_path / "turns.log", tmp_path / "release"
    for key, value in fake_env(log, release, "A").items():
        monkeypatch.setenv(key, value)
    gw = Gateway(root, runner=CommandRunner(str(fake_cli))).start()
    try:
        ack = gw.message_agent(sender="alice", target="bob", message="a long one")
        turn = await_started(log, "A", leftovers)
    finally:
        gw.stop(timeout=0.5)
    assert gw.wait_outcome(ack["delivery_id"])["status"] == "ambiguous"
    assert_gone(turn["pid"])
    assert_gone(turn["child_pid"])  # the whole process group, not only the CLI
    with Gateway(root, runner=lambda t: "") as again:  # journaled: the next start reports it the same way
        assert again.wait_outcome(ack["delivery_id"], timeout=WAIT)["status"] == "ambiguous"


def test_send_whose_wait_expired_ends_the_turn_on_a_ctrl_c_and_leaves_no_orphan(
    tmp_path: Path, fake_cli: Path, leftovers: list[int], procs: list[Proc]
) -> None:
    root = make_root(tmp_path)
    log, release = tmp_path / "turns.log", tmp_path / "release"
    send = Proc("send", ["send", "--root", str(root), "--from", "alice", "bob", "hi", "--wait", "2", "--json",
                         "--cli", str(fake_cli), "--runner", "command"], tmp_path, fake_env(log, release, "A"))
    procs.append(send)
    turn = await_started(log, "A", leftovers)
    send.await_stderr("no outcome for delivery")  # --wait 2 expired while the turn runs
    send.await_stderr("waiting for 1 running turn, up to 30 s; Ctrl-C to abandon it")
    send.proc.send_signal(signal.SIGINT)
    assert send.wait() == 1  # no outcome in time: exit 1, like an ambiguous one
    assert "abandoned the running turns" in send.stderr()
    assert_gone(turn["pid"])
    assert_gone(turn["child_pid"])
    delivery_id = json.loads(send.stdout().splitlines()[0])["delivery_id"]
    with Gateway(root, runner=lambda t: "") as again:  # the abandoned turn is journaled ambiguous
        assert again.wait_outcome(delivery_id, timeout=WAIT)["status"] == "ambiguous"


def test_a_second_send_never_overlaps_a_turn_whose_gateway_was_killed(
    tmp_path: Path, fake_cli: Path, leftovers: list[int], procs: list[Proc]
) -> None:
    root = make_root(tmp_path)
    log = tmp_path / "turns.log"
    release_a, release_b = tmp_path / "release-a", tmp_path / "release-b"
    release_b.touch()  # B answers at once once it runs
    first = Proc("first", ["send", "--root", str(root), "--from", "alice", "bob", "one", "--wait", "60",
                           "--cli", str(fake_cli), "--runner", "command"], tmp_path, fake_env(log, release_a, "A"))
    procs.append(first)
    turn_a = await_started(log, "A", leftovers)
    first.kill()  # SIGKILL: nothing of the gateway runs any more; the turn (its own session) lives on
    assert process_alive(turn_a["pid"])
    second = Proc("second", ["-v", "send", "--root", str(root), "--from", "carol", "bob", "two", "--wait", "60",
                             "--cli", str(fake_cli), "--runner", "command"], tmp_path, fake_env(log, release_b, "B"))
    procs.append(second)
    await_condition(lambda: "waiting for the lock" in second.stderr() or started(log, "B"), timeout=WAIT,
                    message="the second turn waits for the lock (or starts)")
    assert started(log, "B") is None, "a second turn of @bob started while the first one still runs"
    release_a.touch()
    assert second.wait() == 0, second.stderr()[-2000:]
    assert "done B" in second.stdout()
    turn_b = started(log, "B")
    assert turn_b is not None and turn_b["overlaps"] == []
    assert [(e["ev"], e["tag"]) for e in events(log)] == [("start", "A"), ("end", "A"), ("start", "B"), ("end", "B")]


def test_a_turn_whose_host_was_killed_finishes_even_if_it_writes_output_afterwards(
    tmp_path: Path, fake_cli: Path, leftovers: list[int], procs: list[Proc]
) -> None:
    """Regression: the turn's output went to pipes, so a hermes child still starting up when its host died
    (kill -9) was killed by the broken pipe at its next write, before it stored the DM; the restarted host,
    which had journaled the turn's start, reported it "may have been delivered", and a wake was lost."""
    root = make_root(tmp_path)
    log, release = tmp_path / "turns.log", tmp_path / "release"
    host = Proc("host", ["send", "--root", str(root), "--from", "alice", "bob", "one", "--wait", "60",
                         "--cli", str(fake_cli), "--runner", "command"], tmp_path,
                {**fake_env(log, release, "A"), "FAKE_CHATTY": "1"})
    procs.append(host)
    turn = await_started(log, "A", leftovers)
    host.kill()  # SIGKILL: its end of whatever the turn writes to is gone
    release.touch()
    await_condition(lambda: any(e["ev"] == "end" and e["tag"] == "A" for e in events(log)), timeout=WAIT,
                    message="the orphaned turn wrote its output and finished")
    assert_gone(turn["pid"])


# ── item 6: serve stops as soon as its turns end, says so, and a second Ctrl-C abandons them ─


def start_serve_with_a_relayed_turn(
    tmp_path: Path, fake_cli: Path, leftovers: list[int], procs: list[Proc]
) -> tuple[Proc, dict[str, Any], Path, Path]:
    root = make_root(tmp_path, {"moxie": {}}, name="mini")
    log, release = tmp_path / "turns.log", tmp_path / "release"
    serve = Proc("serve", ["serve", "--root", str(root), "--connection-id", "mini", "--cli", str(fake_cli),
                           "--runner", "command"],
                 tmp_path, fake_env(log, release, "A"))
    procs.append(serve)
    await_condition(lambda: "gateway serving" in serve.stdout() or serve.proc.poll() is not None, timeout=WAIT,
                    message="serve is up")
    envelope = seed_envelope(target_connection="mini", target_profile="moxie", message="relayed")
    post_to_inbox(InboxPaths.from_root(root), envelope, "alpha")
    turn = await_started(log, "A", leftovers)
    return serve, turn, root / "bot_relay" / "delivered" / f"{envelope['id']}.json", release


def assert_abandoned_by(sig: signal.Signals, serve: Proc, turn: dict[str, Any], delivered: Path) -> None:
    """A second ``sig`` abandons serve's running turn: serve exits at once, the turn's processes are gone, and
    its sender's answer (on disk) says it may have been delivered."""
    serve.proc.send_signal(sig)
    assert serve.wait(timeout=20) == 0  # well before the 30 s grace: the turn is never released
    assert "abandoned the running turns" in serve.stderr()
    assert_gone(turn["pid"])
    assert_gone(turn["child_pid"])
    record = json.loads(delivered.read_text(encoding="utf-8"))  # the sender's answer, on disk
    assert record["reply"] == "" and "may have been delivered — do not resend" in record["error"]


def test_serve_on_ctrl_c_says_what_it_waits_for_and_exits_once_the_turn_ends(
    tmp_path: Path, fake_cli: Path, leftovers: list[int], procs: list[Proc]
) -> None:
    serve, turn, delivered, release = start_serve_with_a_relayed_turn(tmp_path, fake_cli, leftovers, procs)
    serve.proc.send_signal(signal.SIGINT)
    serve.await_stderr("waiting for 1 running turn, up to 30 s; Ctrl-C again to abandon it")
    release.touch()
    # The grace is 30 s from the Ctrl-C: an exit within 20 s of the release is the turn's end, not the grace.
    assert serve.wait(timeout=20) == 0
    record = json.loads(delivered.read_text(encoding="utf-8"))
    assert record["reply"] == "done A" and record["error"] == ""
    assert_gone(turn["child_pid"])
    assert "gave up on the running turns" not in serve.stderr() and "abandoned" not in serve.stderr()


def test_a_stop_whose_wait_runs_out_says_it_gave_up_on_the_running_turn(tmp_path: Path) -> None:
    """Regression (acceptance review): one Ctrl-C whose wait for the running turn ran out printed "waiting for 1
    running turn, up to 30 s; Ctrl-C again to abandon it" then "gateway stopped", never that the turn was cut
    off (a second Ctrl-C says "abandoned the running turns: their outcome is ambiguous")."""
    entered, release = threading.Event(), threading.Event()

    def behave(turn: Any) -> str:
        entered.set()
        assert release.wait(30), "the test never released the turn"
        return "too late"

    gw = Gateway(make_root(tmp_path), runner=behave).start()
    out = io.StringIO()
    try:
        ack = gw.message_agent(sender="alice", target="bob", message="a long one")
        assert entered.wait(20)
        stop_gateway(gw, StopSignals(received=signal.SIGINT), out=out, timeout=1)  # the turn is held: the wait runs out
    finally:
        release.set()
    assert out.getvalue().splitlines() == ["waiting for 1 running turn, up to 1 s; Ctrl-C again to abandon it",
                                           "gave up on the running turns after 1 s: their outcome is ambiguous"]
    assert cut_off_text(1) == out.getvalue().splitlines()[-1]
    assert gw.wait_outcome(ack["delivery_id"], timeout=0)["status"] == "ambiguous"


class _HeldUntilStopped:
    """A runner whose turn runs until the stop ends it (``stop_turns``, recorded)."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.stopped: list[list[str] | None] = []

    def run_turn(self, turn: Any) -> str:
        self.entered.set()
        assert self.release.wait(60), "the test never released the turn"
        return "too late"

    def stop_turns(self, delivery_ids: Any = None) -> int:
        self.stopped.append(None if delivery_ids is None else list(delivery_ids))
        self.release.set()
        return 1


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("callback", ["on_wait", "on_cut_off"])
def test_a_stop_callback_raising_an_interrupt_still_ends_the_turns_and_settles_them_then_raises_it(
    tmp_path: Path, callback: str, interrupt: type[BaseException], warnings: list[str],
) -> None:
    """Regression (review diffrev11, cutoff_raise.py): a ``KeyboardInterrupt`` raised in ``on_cut_off`` (a second
    Ctrl-C landing in it) or ``on_wait`` escaped ``Gateway.stop`` half-done: ``stop_turns`` was never called (the
    turn process left running) and the DM had no outcome until the next gateway. The stop now finishes (the turn
    ended, its DM settled ``ambiguous``), then raises it."""
    runner = _HeldUntilStopped()
    gw = Gateway(make_root(tmp_path), runner=runner).start()

    def raises(*args: Any) -> None:
        raise interrupt()

    try:
        ack = gw.message_agent(sender="alice", target="bob", message="a long one")
        assert runner.entered.wait(20)
        with pytest.raises(interrupt):
            gw.stop(timeout=0.2, **{callback: raises})  # the turn is held: the wait runs out
    finally:
        runner.release.set()
    assert runner.stopped == [[ack["delivery_id"]]]
    assert gw.wait_outcome(ack["delivery_id"], timeout=0)["status"] == "ambiguous"
    assert [line for line in warnings if f"the {callback} callback raised {interrupt.__name__}" in line], warnings
    gw.stop()  # stopped for good: a second stop is a no-op


class _StopHookRaises:
    """A runner whose ``hang`` turn runs until the test releases it, and whose stop hook ``hook`` (``stop_turns``
    or ``stop_waiting``) raises ``interrupt``."""

    def __init__(self, hook: str, interrupt: type[BaseException]) -> None:
        self.hook, self.interrupt = hook, interrupt
        self.entered, self.release = threading.Event(), threading.Event()
        self.called: list[str] = []

    def run_turn(self, turn: Any) -> str:
        if turn.content.endswith("hang"):
            self.entered.set()
            assert self.release.wait(60), "the test never released the turn"
        return "ok"

    def stop_turns(self, delivery_ids: Any = None) -> int:
        return self._hook("stop_turns")

    def stop_waiting(self) -> int:
        return self._hook("stop_waiting")

    def _hook(self, name: str) -> int:
        self.called.append(name)
        if name == self.hook:
            raise self.interrupt("from the runner's " + name)
        return 0


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("hook", ["stop_turns", "stop_waiting"])
def test_a_runner_stop_hook_raising_an_interrupt_is_logged_and_the_stop_keeps_every_outcome(
    tmp_path: Path, hook: str, interrupt: type[BaseException], warnings: list[str],
) -> None:
    """Regression (review apisurface, p15.py): a runner's ``stop_turns`` or ``stop_waiting`` that raised
    ``SystemExit`` (a ``sys.exit``) or ``KeyboardInterrupt`` escaped ``Gateway.stop`` half-done (only ``Exception``
    was caught there): the stopped gateway forgot every outcome, those settled before the stop included
    (``wait_outcome``: KeyError). Like the runner's other hooks, what they raise is now logged and never raised:
    the stop completes and every DM keeps its outcome."""
    runner = _StopHookRaises(hook, interrupt)
    gw = Gateway(make_root(tmp_path), runner=runner, durable=False).start()
    try:
        earlier = gw.message_agent(sender="alice", target="carol", message="quick")["delivery_id"]
        assert gw.wait_outcome(earlier, timeout=WAIT)["status"] == "replied"
        running = gw.message_agent(sender="alice", target="bob", message="hang")["delivery_id"]
        assert runner.entered.wait(WAIT)
        waiting = gw.message_agent(sender="alice", target="bob", message="queued")["delivery_id"]
        try:
            gw.stop(timeout=0.2)  # the turn is held: the wait runs out
        except interrupt as exc:  # a failure of this test, not a KeyboardInterrupt ending the whole session
            pytest.fail(f"stop raised the runner's {exc!r}")
    finally:
        runner.release.set()
    assert hook in runner.called
    assert not gw.running
    assert gw.wait_outcome(earlier, timeout=0)["status"] == "replied"
    assert gw.wait_outcome(running, timeout=0)["status"] == "ambiguous"
    assert gw.wait_outcome(waiting, timeout=0)["reason"] == "cancelled"
    assert [line for line in warnings if "stop: the runner could not end" in line], warnings


def test_serve_on_a_second_ctrl_c_abandons_the_turn_as_ambiguous(
    tmp_path: Path, fake_cli: Path, leftovers: list[int], procs: list[Proc]
) -> None:
    serve, turn, delivered, _ = start_serve_with_a_relayed_turn(tmp_path, fake_cli, leftovers, procs)
    serve.proc.send_signal(signal.SIGINT)
    serve.await_stderr("Ctrl-C again to abandon it")
    assert_abandoned_by(signal.SIGINT, serve, turn, delivered)


def test_serve_on_sigterm_names_it_and_a_second_sigterm_abandons_the_turn(
    tmp_path: Path, fake_cli: Path, leftovers: list[int], procs: list[Proc]
) -> None:
    """Regression (ops review): after a SIGTERM (a service manager's stop) serve said "Ctrl-C again to abandon
    it". It names the signal received and what a second one does, which it then does."""
    serve, turn, delivered, _ = start_serve_with_a_relayed_turn(tmp_path, fake_cli, leftovers, procs)
    serve.proc.send_signal(signal.SIGTERM)
    serve.await_stderr("waiting for 1 running turn, up to 30 s; a second SIGTERM (or SIGINT, SIGHUP) abandons it")
    assert "stopping the gateway (SIGTERM received)" in serve.stderr()
    assert "Ctrl-C" not in serve.stderr()
    assert_abandoned_by(signal.SIGTERM, serve, turn, delivered)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_send_without_a_host_stops_on_sigterm_or_sighup_as_on_ctrl_c_and_its_turn_finishes(
    tmp_path: Path, fake_cli: Path, leftovers: list[int], procs: list[Proc], sig: signal.Signals
) -> None:
    """Regression (CLI fuzz review, send_sigterm_orphan.sh): `send` running the DM itself died at once on a SIGTERM
    (`timeout 30 hermes-actors send …`) or a SIGHUP (the terminal closing): nothing said after the ack, the turn's
    process ran on orphaned, and the DM's outcome was "ambiguous … may have been delivered" though the turn
    completed. Either now stops it as Ctrl-C does: it says where the outcome goes, the turn gets the stop's grace
    and replies, and the exit code is the signal's (128 + its number)."""
    root = make_root(tmp_path)
    log, release = tmp_path / "turns.log", tmp_path / "release"
    send = Proc("send", ["send", "--root", str(root), "--from", "alice", "bob", "hi", "--json",
                         "--cli", str(fake_cli), "--runner", "command"], tmp_path, fake_env(log, release, "A"))
    procs.append(send)
    turn = await_started(log, "A", leftovers)
    send.proc.send_signal(sig)
    send.await_stderr(f"waiting for 1 running turn, up to 30 s; a second {sig.name} (or ")
    assert f"interrupted; the DM's outcome, once settled: hermes-actors outcome --root {root} " in send.stderr()
    release.touch()
    assert send.wait() == 128 + sig
    assert "abandoned" not in send.stderr() and "gave up" not in send.stderr(), send.stderr()
    assert_gone(turn["pid"])
    assert_gone(turn["child_pid"])
    delivery_id = json.loads(send.stdout().splitlines()[0])["delivery_id"]
    with Gateway(root, runner=lambda t: "") as again:  # the turn's reply, journaled by the send's own stop
        outcome = again.wait_outcome(delivery_id, timeout=WAIT)
    assert (outcome["status"], outcome["reply"]) == ("replied", "done A"), outcome


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_send_waiting_at_a_host_stops_on_sigterm_or_sighup_as_on_ctrl_c(
    tmp_path: Path, procs: list[Proc], monkeypatch: pytest.MonkeyPatch, sig: signal.Signals
) -> None:
    """Regression (CLI exit-code review): `send --wait` through a host died at once on a SIGTERM or SIGHUP, without a
    word (killed by the signal), where Ctrl-C says the DM stays queued at the host and how to get its outcome, and
    exits 130. Either now does as Ctrl-C: the same line, exit 128 + the signal's number; the host runs the DM."""
    root = make_root(tmp_path)
    waiting, release = threading.Event(), threading.Event()

    def held(turn: Any) -> str:
        assert release.wait(WAIT), "the test never released the turn"
        return "done"

    with Gateway(root, runner=held, durable=False, serve_submit=True) as host:
        answer = host.wait_outcome

        def watched(delivery_id: str, timeout: float = 30.0) -> dict[str, Any]:
            waiting.set()  # the send asks the host for the outcome: it waits in fetch_outcome
            return answer(delivery_id, timeout=timeout)

        monkeypatch.setattr(host, "wait_outcome", watched)
        send = Proc("send", ["send", "--root", str(root), "--from", "alice", "bob", "hi", "--wait", "60"], tmp_path,
                    {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
        procs.append(send)
        try:
            assert waiting.wait(WAIT), f"the send never waited at the host: {send.stderr()[-2000:]}"
            send.proc.send_signal(sig)
            code = send.wait()
        finally:
            release.set()
        delivery_id = send.stdout().split("delivery ")[1].split()[0]
        assert answer(delivery_id, timeout=WAIT)["reply"] == "done"  # the host ran it
    assert code == 128 + sig, send.stderr()
    assert (f"interrupted; the DM stays queued at the host; its outcome, once settled: hermes-actors outcome --root "
            f"{root} {delivery_id}") in send.stderr().splitlines(), send.stderr()


def _room_send_stopped_in_a_turn(
    tmp_path: Path, fake_cli: Path, leftovers: list[int], procs: list[Proc], name: str, text: str
) -> tuple[Path, Proc, dict[str, Any], Path]:
    """A host-less `room send` of ``text`` to a room ``name`` of alice and bob, SIGTERMed once alice's turn (the
    command runner's fake CLI) has started and the command says it waits for it.

    Returns:
        The root, the command's process, the turn's start line and the file whose creation ends the turn.
    """
    root = make_root(tmp_path)
    with Gateway(root, runner=lambda t: "") as gw:
        gw.create_room(name, ["alice", "bob"])
    log, release = tmp_path / "turns.log", tmp_path / "release"
    room = Proc("room", ["room", "send", "--root", str(root), name, text, "--cli", str(fake_cli),
                         "--runner", "command"], tmp_path, fake_env(log, release, "A"))
    procs.append(room)
    turn = await_started(log, "A", leftovers)
    room.proc.send_signal(signal.SIGTERM)
    room.await_stderr("waiting for 1 running turn, up to 30 s; a second SIGTERM (or SIGINT, SIGHUP) abandons it")
    return root, room, turn, release


def test_room_send_without_a_host_stops_on_sigterm_and_a_sighup_then_abandons_its_turn(
    tmp_path: Path, fake_cli: Path, leftovers: list[int], procs: list[Proc]
) -> None:
    """Regression (CLI fuzz review): `room send` (and `room create`) without a host run a gateway of their own, and a
    SIGTERM or SIGHUP killed them outright, a member turn's process orphaned. As for `send`, the first stop signal
    now stops the command's gateway as Ctrl-C does and a second one, any of the three, abandons the turn."""
    _, room, turn, _ = _room_send_stopped_in_a_turn(tmp_path, fake_cli, leftovers, procs, "plan", "@alice what first?")
    room.proc.send_signal(signal.SIGHUP)
    assert room.wait(timeout=20) == 128 + signal.SIGTERM  # well before the 30 s grace: the turn is never released
    assert "abandoned the running turns: their outcome is ambiguous" in room.stderr()
    assert_gone(turn["pid"])
    assert_gone(turn["child_pid"])


def test_room_send_without_a_host_stopped_by_sigterm_says_the_message_is_posted_and_where_to_look(
    tmp_path: Path, fake_cli: Path, leftovers: list[int], procs: list[Proc]
) -> None:
    """Regression (docs review, repro_room_send_signal.sh): a SIGTERM during a member turn exited 143 having printed
    only the ack and the stop's "waiting for 1 running turn…"; `send` says where a DM's outcome goes. `room send`
    now says the message is posted and names the command that shows the rounds later, and the exit code stays
    the signal's."""
    root, room, turn, release = _room_send_stopped_in_a_turn(tmp_path, fake_cli, leftovers, procs, "my team",
                                                             "@alice sig test")
    release.touch()
    assert room.wait() == 128 + signal.SIGTERM
    assert room.stdout().startswith("queued in room my team: message "), room.stdout()
    assert (f"interrupted; the message is posted and its rounds go on from the room's file (look later with: "
            f"hermes-actors room show --root {root} 'my team')") in room.stderr(), room.stderr()
    assert_gone(turn["pid"])
    assert_gone(turn["child_pid"])
    entries = Gateway(root).room_transcript("my team")  # not started: read from the room's file, as `room show`
    assert [(e["author"], e["text"]) for e in entries] == [("user", "@alice sig test"), ("alice", "done A")]


def _blocked_signals(pid: int) -> set[signal.Signals]:
    """The signals process ``pid``'s main thread blocks (``SigBlk`` in /proc)."""
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("SigBlk:"))
    mask = int(line.split()[1], 16)
    return {sig for sig in signal.Signals if 0 < sig <= 64 and mask & (1 << (sig - 1))}


def test_a_turn_process_serve_starts_blocks_no_stop_signal_and_a_sigterm_ends_it(
    tmp_path: Path, fake_cli: Path, leftovers: list[int], procs: list[Proc]
) -> None:
    """Regression: serve blocked the stop signals in every thread it started (so they reached its main thread),
    and every turn process those threads started inherited the block: a hermes CLI turn ignored the SIGTERM
    that ends an abandoned turn, and died only by the SIGKILL after the grace."""
    serve, turn, delivered, _ = start_serve_with_a_relayed_turn(tmp_path, fake_cli, leftovers, procs)
    assert _blocked_signals(turn["pid"]) & {signal.SIGINT, signal.SIGTERM, signal.SIGHUP} == set()
    serve.proc.send_signal(signal.SIGTERM)
    serve.await_stderr("waiting for 1 running turn")
    serve.proc.send_signal(signal.SIGTERM)
    assert serve.wait(timeout=20) == 0
    assert_gone(turn["pid"])
    assert "ignored SIGTERM" not in serve.stderr()  # serve has exited: its log is complete
    record = json.loads(delivered.read_text(encoding="utf-8"))  # abandoned: the sender is told it may have run
    assert "may have been delivered — do not resend" in record["error"]


SIGNAL_TO_A_WORKER = SIGNAL_ANOTHER_THREAD + r"""
from pathlib import Path
from hermes_actors.cli.serve import serve

def on_ready(_endpoint):
    signal_another_thread(signal.SIGTERM)

sys.exit(serve(Path(sys.argv[1]), connection_id=None, runner=lambda turn: "ok", on_ready=on_ready))
"""


def _run_serve_script(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    """Run ``text`` (a script serving the root it is given) on a one-bot root, as a process's main thread."""
    root = make_root(tmp_path, {"moxie": {}})
    script = tmp_path / "serve_script.py"
    script.write_text(text, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.run([sys.executable, str(script), str(root)], capture_output=True, text=True, env=env,
                          timeout=60, stdin=subprocess.DEVNULL)


def test_serve_stops_on_a_signal_handed_to_another_thread_than_main(tmp_path: Path) -> None:
    """Regression: a stop signal the kernel handed to an actor's thread ran no handler while serve's main thread
    waited on an event, and serve went on serving. Its main thread now waits on the signal wakeup fd."""
    proc = _run_serve_script(tmp_path, SIGNAL_TO_A_WORKER)
    assert proc.returncode == 0, proc.stderr
    assert "signalled" in proc.stdout
    assert "stopping the gateway (SIGTERM received)" in proc.stderr


SERVE_FAILS_WHILE_IT_WAITS = SIGNAL_ANOTHER_THREAD + r"""
from pathlib import Path
import hermes_actors.cli.serve as serve_module

reports = []  # the on_failure serve gives each gateway it starts

class Reporting(serve_module.Gateway):
    def __init__(self, *args, on_failure, **kwargs):
        super().__init__(*args, on_failure=on_failure, **kwargs)
        reports.append(on_failure)

serve_module.Gateway = Reporting

def main_thread_waits():
    frame = sys._current_frames().get(threading.main_thread().ident)
    return frame is not None and frame.f_code.co_name == "until"

def fail_once_the_main_thread_waits():
    await_condition(main_thread_waits, timeout=30, message="serve's main thread waiting")
    reports[0](RuntimeError("injected"))  # as the failed Dispatcher's thread reports it

def on_ready(_endpoint):
    if len(reports) == 1:
        threading.Thread(target=fail_once_the_main_thread_waits, daemon=True).start()
    else:  # the gateway serve started again: stop serve
        signal_another_thread(signal.SIGTERM)

sys.exit(serve_module.serve(Path(sys.argv[1]), connection_id=None, runner=lambda turn: "ok", on_ready=on_ready))
"""


def test_a_gateway_failing_while_serve_waits_on_its_main_thread_is_started_again(tmp_path: Path) -> None:
    """serve's main thread waits for its own stop event, which a failing gateway sets from its Dispatcher's
    thread: that alone ends the wait (MainThreadWait.until_set watches the event), and serve starts a new
    gateway. A stop event set from another thread without waking the wait left serve waiting for good."""
    proc = _run_serve_script(tmp_path, SERVE_FAILS_WHILE_IT_WAITS)
    assert proc.returncode == 0, proc.stderr
    assert "restarting the gateway: its dispatcher failed (RuntimeError('injected'))" in proc.stderr, proc.stderr
    assert "stopping the gateway (SIGTERM received)" in proc.stderr, proc.stderr


SERVE_HELD_IN_ITS_START = r"""
import sys
from pathlib import Path
from actors.testkit import await_condition
import hermes_actors.hermes.host as host

root, starting, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
real_open = host.open_submit_endpoint

def held_open(gw):  # the start's last step, on its own thread: the heartbeat is written, nothing is served yet
    starting.touch()
    await_condition(go.exists, timeout=30, message="the test's go-ahead")
    return real_open(gw)

host.open_submit_endpoint = held_open
from hermes_actors.cli.main import main
sys.exit(main(["serve", "--root", root, "--runner", "demo"]))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_during_serves_start_ends_in_the_same_clean_stop(tmp_path: Path, sig: signal.Signals) -> None:
    """Regression (CLI fuzz review, serve_signal_during_start.py): a stop signal after serve's start began (its
    heartbeat in bot_relay/gateways/) and before it served killed it with no output, its heartbeat left behind
    (SIGTERM, SIGHUP), or ended it with exit 130 and no output (SIGINT). The handlers are now in place before the
    start: it completes, then serve stops as after any stop signal (exit 0, saying so, nothing left behind)."""
    root = make_root(tmp_path, {"moxie": {}})
    script, starting, go = tmp_path / "serve_held.py", tmp_path / "starting", tmp_path / "go"
    script.write_text(SERVE_HELD_IN_ITS_START, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.Popen([sys.executable, str(script), str(root), str(starting), str(go)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    heartbeats = root / "bot_relay" / "gateways"
    try:
        await_condition(lambda: starting.exists() or proc.poll() is not None, timeout=WAIT,
                        message="serve's start reached its last step")
        assert (heartbeats / f"{proc.pid}.json").exists(), "the start began: its heartbeat is written"
        proc.send_signal(sig)
        go.touch()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, (proc.returncode, err)
    assert out.startswith("gateway serving "), out  # the start completed, then stopped
    assert stop_text(sig) in err.splitlines() and "gateway stopped" in err.splitlines(), err
    assert "Traceback" not in err, err
    assert list(heartbeats.glob("*.json")) == []
    assert not (root / "bot_relay" / "run" / "submit.sock").exists()


@pytest.mark.parametrize(("count", "seconds", "received", "text"), [
    (2, 30.0, signal.SIGINT, "waiting for 2 running turns, up to 30 s; Ctrl-C again to abandon them"),
    (1, 29.6, signal.SIGINT, "waiting for 1 running turn, up to 30 s; Ctrl-C again to abandon it"),
    (1, 12.0, None, "waiting for 1 running turn, up to 12 s; Ctrl-C to abandon it"),
    (2, 30.0, signal.SIGTERM, "waiting for 2 running turns, up to 30 s; a second SIGTERM (or SIGINT, SIGHUP) "
                              "abandons them"),
    (1, 30.0, signal.SIGHUP, "waiting for 1 running turn, up to 30 s; a second SIGHUP (or SIGINT, SIGTERM) "
                             "abandons it"),
])
def test_waiting_text(count: int, seconds: float, received: signal.Signals | None, text: str) -> None:
    assert waiting_text(count, seconds, received=received) == text


@pytest.mark.parametrize(("earlier", "stopping", "interrupts", "effect"), [
    (False, False, False, SignalEffect.STOP),  # serve, the hub: the first signal sets their stop event
    (False, False, True, SignalEffect.INTERRUPT),  # send, room: it interrupts their wait (as Ctrl-C does)
    (True, False, False, SignalEffect.STOP),  # another before the stop began (SIGTERM then SIGHUP): the same stop
    (True, False, True, SignalEffect.STOP),  # ... never a second interrupt
    (False, True, False, SignalEffect.ABANDON),  # any one while a stop runs, whatever asked it (a failure, a timeout)
    (True, True, False, SignalEffect.ABANDON),
    (True, True, True, SignalEffect.ABANDON),
])
def test_signal_effect(earlier: bool, stopping: bool, interrupts: bool, effect: SignalEffect) -> None:
    assert signal_effect(earlier=earlier, stopping=stopping, interrupts=interrupts) is effect


@pytest.mark.parametrize(("received", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_signal_exit_code(received: signal.Signals, code: int) -> None:
    assert signal_exit_code(received) == code


@pytest.mark.parametrize(("received", "text"), [
    (None, "stopping the gateway"),
    (signal.SIGINT, "stopping the gateway (Ctrl-C)"),
    (signal.SIGTERM, "stopping the gateway (SIGTERM received)"),
    (signal.SIGHUP, "stopping the gateway (SIGHUP received)"),
])
def test_stop_text_names_the_signal(received: signal.Signals | None, text: str) -> None:
    assert stop_text(received) == text


def test_a_timed_out_turn_is_ended_before_the_bots_next_turn_runs(
    tmp_path: Path, fake_cli: Path, leftovers: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: at the turn timeout the flock was unlocked on the descriptor the turn's process shares, so the
    bot's next turn ran beside the old one, still alive (its own timeout counts from its start, later)."""
    # 6 s, not 1: each turn is a Python process that starts another before it logs its start, and the second
    # must still be running when the test releases it; on a loaded machine 1 s killed it before it logged
    root = make_root(tmp_path, config={"bot_mode": {"turn_timeout_seconds": 6}})
    log, release = tmp_path / "turns.log", tmp_path / "release"
    for key, value in fake_env(log, release, "A").items():
        monkeypatch.setenv(key, value)
    gw = Gateway(root, runner=CommandRunner(str(fake_cli), timeout=120)).start()
    try:
        first = gw.message_agent(sender="alice", target="bob", message="hangs")["delivery_id"]
        hung = await_started(log, "A", leftovers)
        timed_out = gw.wait_outcome(first, timeout=WAIT)
        assert timed_out["reason"] == "delivery_timeout"
        # its process is ended: "may still complete" would be false (a crash review read it so)
        assert "and was stopped; it may have been partly done" in timed_out["error"], timed_out["error"]
        second = gw.message_agent(sender="alice", target="bob", message="next")["delivery_id"]
        starts = await_condition(lambda: [e for e in events(log) if e["ev"] == "start"][1:], timeout=WAIT,
                                 message="the next turn started")
        leftovers += [starts[0]["pid"], starts[0]["child_pid"]]
        assert starts[0]["overlaps"] == [], "the next turn ran while the timed-out turn's process still lived"
        assert_gone(hung["pid"])
        release.touch()
        assert gw.wait_outcome(second, timeout=WAIT)["status"] == "replied"
    finally:
        release.touch()
        gw.stop()
