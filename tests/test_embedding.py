"""Embedding a Gateway in a script (found by the review of the Python API): a script that never stops its
gateway still exits, and so does one whose subscriber callback never returns; a fork()ed child refuses the
gateway it inherited, an interrupt while start() runs leaves nothing running, and wait_outcome is bounded by its
timeout when the Dispatcher does not answer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
from crash_procs import child_env
from roots import RecordingRunner, held_on, make_root, send_dm

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.facade import outcomes as facade_outcomes
from hermes_actors.facade.outcomes import CHECK_GRACE
from hermes_actors.local.dispatcher import DispatcherActor
from hermes_actors.local.roster import RosterActor
from hermes_actors.messages import CheckOutcome
from hermes_actors.tool import message_agent_tool

WAIT = 30.0
PROCESS_DEADLINE = 60.0  # a child process that hangs (the bugs) fails the test instead of holding it
STOP_DEADLINE = 100.0  # the interrupt scripts' children (a 5 s storm, then a stop): under pytest's 120 s

_EXIT_SCRIPT = """
import fcntl, json, sys, threading
from loguru import logger
from roots import body_of
from hermes_actors import Gateway
from hermes_actors.store.turnlock import turn_lock_path

logger.enable("hermes_actors")
root, durable = sys.argv[1], sys.argv[2] == "1"
entered = threading.Event()
held = turn_lock_path(root, "bob")
held.parent.mkdir(parents=True, exist_ok=True)
lock_file = open(held, "a")
fcntl.flock(lock_file, fcntl.LOCK_EX)  # bob's turns wait for his flock: they never begin

def runner(turn):
    if body_of(turn.content) == "c0":
        entered.set()
        while gw.running:  # the turn runs until the stop at exit begins
            threading.Event().wait(0.01)
    return "ok: " + body_of(turn.content)

def seen(outcome):
    print(json.dumps({"id": outcome["delivery_id"], "status": outcome["status"], "reason": outcome["reason"]}),
          flush=True)

gw = Gateway(root, runner=runner, durable=durable)
gw.subscribe(seen, rooms=False)
gw.start()
ids = [gw.message_agent(sender="alice", target="carol", message="c0")["delivery_id"]]
ids += [gw.message_agent(sender="alice", target="bob", message=f"b{i}")["delivery_id"] for i in range(3)]
assert entered.wait(30)
print(json.dumps({"ids": ids}), flush=True)
# the script ends here without stop(): c0 runs, bob's DMs wait
"""

_UNREFERENCED_SCRIPT = """
import sys
from loguru import logger
from hermes_actors import Gateway

logger.enable("hermes_actors")
Gateway(sys.argv[1], runner="demo").start()  # kept by nobody
raise SystemExit("a bug after start")
"""

_FORK_SCRIPT = """
import json, os, sys
import pykka
from loguru import logger
from hermes_actors import Gateway

logger.enable("hermes_actors")
gw = Gateway(sys.argv[1], runner=lambda turn: "ok").start()
first = gw.message_agent(sender="alice", target="bob", message="before the fork")["delivery_id"]
assert gw.wait_outcome(first, 30)["status"] == "replied"
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    # What each call asked of an actor: none runs in the child, so a call that reached one would wait on it
    reached = []
    for name in ("tell", "ask"):
        def recorded(ref, message, *args, _real=getattr(pykka.ActorRef, name), **kwargs):
            reached.append(type(message).__name__)
            return _real(ref, message, *args, **kwargs)
        setattr(pykka.ActorRef, name, recorded)
    calls = {
        "message_agent": lambda: gw.message_agent(sender="alice", target="bob", message="from the child"),
        "wait_outcome": lambda: gw.wait_outcome(first, 30),
        "subscribe": lambda: gw.subscribe(print),
        "roster": gw.roster,
        "stats": gw.stats,
        "attach_live_owner": lambda: gw.attach_live_owner("bob", lambda turn: "owner"),
        "list_rooms": gw.list_rooms,
        "start": gw.start,
        "stop": lambda: gw.stop(30),
    }
    out = {"pid": os.getpid(), "running": gw.running, "calls": {}}
    for name, call in calls.items():
        reached.clear()
        try:
            call()
            result = "returned"
        except BaseException as exc:
            result = f"{type(exc).__name__}: {exc}"
        out["calls"][name] = [result, list(reached)]
    os.write(w, json.dumps(out).encode())
    os.close(w)
    sys.exit(0)  # a normal exit: the exit hook must leave the parent's gateway alone
os.close(w)
data = b""
while chunk := os.read(r, 65536):
    data += chunk
_, status = os.waitpid(pid, 0)
second = gw.message_agent(sender="alice", target="bob", message="after the fork")["delivery_id"]
after = gw.wait_outcome(second, 30)["status"]
gw.stop()
print(json.dumps({"parent": os.getpid(), "child": json.loads(data), "status": status, "after": after}))
"""

_STUCK_CALLBACK_SCRIPT = """
import json, sys, threading
from hermes_actors import Gateway

entered = threading.Event()

def stuck(outcome):
    entered.set()
    threading.Event().wait()  # never returns

gw = Gateway(sys.argv[1], runner=lambda turn: "ok", durable=False)
gw.subscribe(stuck)
gw.start()
key = gw.message_agent(sender="alice", target="bob", message="hi")["delivery_id"]
print(json.dumps({"status": gw.wait_outcome(key, 30)["status"], "entered": entered.wait(30)}), flush=True)
gw.stop(timeout=1)
print(json.dumps({"running": gw.running}), flush=True)
# the script ends here, its subscriber's callback still waiting
"""


def _run_script(tmp_path: Path, text: str, *args: str, deadline: float = PROCESS_DEADLINE
                ) -> subprocess.CompletedProcess[str]:
    """Run ``text`` as a Python script with the repo and tests/ importable, within ``deadline`` seconds (a child
    that hangs, the bugs, fails the test instead of holding it), its stdin empty."""
    script = tmp_path / "script.py"
    script.write_text(text, encoding="utf-8")
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env["PYTHONPATH"]])
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env,
                          timeout=deadline, stdin=subprocess.DEVNULL, check=False)


# ── 1. a gateway never stopped is stopped at interpreter exit ───────────────


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "in-memory"])
def test_a_gateway_never_stopped_is_stopped_at_exit_and_loses_no_acked_dm(tmp_path: Path, durable: bool) -> None:
    """Regression: the actors' non-daemon threads kept a script that never called stop() from exiting, forever.
    Now the exit stops it as stop() does, with a warning naming the root: the running turn finishes; the queued
    DMs (bob's, waiting for his turn lock) stay journaled for the next start (durable) or are cancelled (in
    memory)."""
    root = make_root(tmp_path)
    done = _run_script(tmp_path, _EXIT_SCRIPT, str(root), "1" if durable else "0")
    assert done.returncode == 0, done.stderr
    assert (f"Gateway({root}) was not stopped; stopping it at interpreter exit — use `with Gateway(...)` "
            "or call stop()") in done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    ids = next(line["ids"] for line in lines if "ids" in line)
    seen = {line["id"]: f"{line['status']} {line['reason']}" for line in lines if "id" in line}
    if not durable:  # the stop flushed the subscriber: every acked DM has its outcome
        assert seen == {ids[0]: "replied ", **{key: "failed cancelled" for key in ids[1:]}}, done.stdout
        return
    assert seen == {ids[0]: "replied "}, done.stdout  # the running turn finished; bob's DMs stay journaled
    with Gateway(root, runner=RecordingRunner()) as gw:  # the next start runs them
        assert gw.recovered["reoffered"] == 3, gw.recovered
        outcomes = [gw.wait_outcome(key, timeout=WAIT) for key in ids]
    assert [o["reply"] for o in outcomes] == ["ok: c0", "ok: b0", "ok: b1", "ok: b2"], outcomes


def test_a_gateway_no_one_references_is_stopped_when_the_script_fails(tmp_path: Path) -> None:
    """Regression: ``Gateway(root).start()`` kept by nobody, then an uncaught error: the script never exited."""
    root = make_root(tmp_path)
    done = _run_script(tmp_path, _UNREFERENCED_SCRIPT, str(root))
    assert done.returncode == 1 and "a bug after start" in done.stderr, done.stderr
    assert f"Gateway({root}) was not stopped; stopping it at interpreter exit" in done.stderr
    assert "gateway stopped" in done.stderr


def test_a_subscriber_callback_that_never_returns_does_not_keep_the_process_from_exiting(tmp_path: Path) -> None:
    """Regression: stop() returned, then the interpreter waited forever for the Notifier's non-daemon thread, still
    inside the callback. Now each subscriber's thread is a daemon: the script exits once its main thread ends."""
    done = _run_script(tmp_path, _STUCK_CALLBACK_SCRIPT, str(make_root(tmp_path)))  # a hang fails at 60 s
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines == [{"status": "replied", "entered": True}, {"running": False}], done.stdout


# ── 2. a fork()ed child refuses the gateway it inherited ────────────────────


def test_a_forked_child_refuses_every_call_at_once_and_the_parent_keeps_working(tmp_path: Path) -> None:
    """Regression: a fork()ed child inherited the Gateway but none of its actors: message_agent acked a DM that
    was lost (the journal's write offset is the parent's), wait_outcome and stop ran 30 s past their timeouts.
    Now every call refuses at once naming both processes, the child's exit leaves the gateway alone, and the
    parent's gateway keeps working."""
    done = _run_script(tmp_path, _FORK_SCRIPT, str(make_root(tmp_path)))
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    parent, child = out["parent"], out["child"]
    assert out["status"] == 0 and child["running"] is False, out
    for name, (result, reached) in child["calls"].items():
        assert result.startswith("RuntimeError: "), (name, result)
        assert (f"this Gateway was started in process {parent}; process {child['pid']} is a fork of it"
                in result), (name, result)
        assert "start a new Gateway in the child" in result, (name, result)
        # at once: refused before it asked any actor (none runs in the child: the bug waited ASK_TIMEOUT on them)
        assert reached == [], (name, reached)
    assert "not stopped" not in done.stderr  # the child's exit did not try to stop the parent's gateway
    assert out["after"] == "replied", out


# ── 3. an interrupt while start() runs leaves nothing running ───────────────


class Interrupted(BaseException):
    """What the test's signal handler raises in the main thread, as Ctrl-C's KeyboardInterrupt would."""


@pytest.fixture
def interrupt_main() -> Iterator[tuple[threading.Event, threading.Event]]:
    """SIGUSR1 raises :class:`Interrupted` in the main thread (where start() runs): yields (``raised``, set by the
    handler as it raises; ``request``, set by the test to have a helper thread send the signal)."""
    assert threading.current_thread() is threading.main_thread()
    raised, request = threading.Event(), threading.Event()

    def handler(signum: int, frame: Any) -> None:
        raised.set()
        raise Interrupted()

    previous = signal.signal(signal.SIGUSR1, handler)
    main = threading.main_thread().ident
    assert main is not None

    def sender() -> None:
        if request.wait(WAIT):
            signal.pthread_kill(main, signal.SIGUSR1)

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    try:
        yield raised, request
    finally:
        request.set()
        thread.join(WAIT)
        signal.signal(signal.SIGUSR1, previous)


def _new_actors(before: set[Any]) -> list[str]:
    """The actors running now that did not run before (stopping them, so a failed test leaks nothing)."""
    left = [ref for ref in pykka.ActorRegistry.get_all() if ref not in before]
    for ref in left:
        ref.stop(block=True, timeout=WAIT)
    return [ref.actor_class.__name__ for ref in left]


def _new_threads(before: set[threading.Thread]) -> list[str]:
    """The threads alive now that were not before, the daemon turn workers a start leaves idle aside."""
    return [t.name for t in threading.enumerate() if t not in before and t.is_alive() and not t.daemon]


def test_an_interrupt_while_an_actor_starts_leaves_nothing_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interrupt_main: tuple[threading.Event, threading.Event]
) -> None:
    """Regression: a Ctrl-C landing between an actor's thread starting and start() recording it (here, inside
    the RosterActor's start) left that actor running after start() raised, a non-daemon thread that kept the
    process from exiting. Now the start runs on a thread of its own; the interrupted caller waits for it to undo
    what it built, then re-raises; the gateway is still new and starts again."""
    raised, request = interrupt_main
    original = RosterActor._start_actor_loop
    first = [True]

    def interrupted_as_it_starts(self: RosterActor) -> None:
        original(self)  # its thread runs
        if first[0]:  # the first start only: the interrupt lands before start() could record the actor
            first[0] = False
            request.set()
            assert raised.wait(WAIT), "the main thread was never interrupted"

    monkeypatch.setattr(RosterActor, "_start_actor_loop", interrupted_as_it_starts)
    actors_before, threads_before = set(pykka.ActorRegistry.get_all()), set(threading.enumerate())
    gw = Gateway(make_root(tmp_path), runner=RecordingRunner())
    with pytest.raises(Interrupted):
        gw.start()
    assert _new_actors(actors_before) == []
    assert _new_threads(threads_before) == []
    assert not gw.running
    with gw:  # still new: it starts again
        assert gw.wait_outcome(send_dm(gw, "after the interrupt"), timeout=WAIT)["status"] == "replied"
    assert _new_actors(actors_before) == []


def test_an_interrupt_as_start_returns_stops_the_started_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interrupt_main: tuple[threading.Event, threading.Event]
) -> None:
    """An interrupt that lands once the start is done (as start() returns) stops the gateway it started before
    start() re-raises: nothing is left running."""
    raised, request = interrupt_main
    original = Gateway._commit_start

    def interrupted_at_the_commit(self: Gateway, *args: Any) -> None:
        request.set()
        assert raised.wait(WAIT), "the main thread was never interrupted"
        original(self, *args)

    monkeypatch.setattr(Gateway, "_commit_start", interrupted_at_the_commit)
    actors_before, threads_before = set(pykka.ActorRegistry.get_all()), set(threading.enumerate())
    gw = Gateway(make_root(tmp_path), runner=RecordingRunner())
    with pytest.raises(Interrupted):
        gw.start()
    assert _new_actors(actors_before) == []
    assert _new_threads(threads_before) == []
    assert not gw.running


# ── 4. wait_outcome is bounded by its timeout ───────────────────────────────


def test_wait_outcome_is_bounded_by_its_timeout_when_the_dispatcher_does_not_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: once the wait ran out, wait_outcome asked the Dispatcher where the DM stands with a 30 s
    timeout of its own: a Dispatcher that did not answer made wait_outcome(id, t) take t + 30 s. Now the whole
    call returns within t + CHECK_GRACE with the documented TimeoutError."""
    release_turn, release_check = threading.Event(), threading.Event()
    original = DispatcherActor._on_check

    def stuck(self: DispatcherActor, msg: Any) -> Any:
        release_check.wait(WAIT * 2)
        return original(self, msg)

    monkeypatch.setattr(DispatcherActor, "_on_check", stuck)
    # What wait_outcome was willing to wait for the Dispatcher's answer, not how long the call took
    checks: list[float] = []
    real_ask = facade_outcomes.ask

    def ask(ref: Any, message: Any, *, timeout: float, expect: type | None = None) -> Any:
        if isinstance(message, CheckOutcome):
            checks.append(timeout)
        return real_ask(ref, message, timeout=timeout, expect=expect)

    monkeypatch.setattr(facade_outcomes, "ask", ask)
    runner = RecordingRunner(held_on("held", release_turn))
    gw = Gateway(make_root(tmp_path), runner=runner)
    gw.start()
    try:
        key = send_dm(gw, "held")
        runner.wait_entered(1, timeout=WAIT)
        for timeout in (0.0, 0.5):
            checks.clear()
            with pytest.raises(TimeoutError, match=f"no outcome for delivery {key} within"):
                gw.wait_outcome(key, timeout=timeout)
            # the Dispatcher's answer was awaited for what was left of t and CHECK_GRACE more (the bug: 30 s more)
            assert len(checks) == 1 and checks[0] <= timeout + CHECK_GRACE, (timeout, checks)
    finally:
        release_check.set()
        release_turn.set()
        gw.stop()


def test_the_tool_answers_a_dispatcher_that_does_not_answer_in_time_with_its_error_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (review apismall): ``message_agent_tool`` caught only ``RuntimeError``: a Dispatcher that did not
    answer within the send's wait (30 s; 0.3 s here) raised ``TimeoutError`` into the calling bot's tool loop. Now
    it is the tool's error result, saying the request may still be taken (it waits in the Dispatcher's mailbox),
    never that it was NOT queued."""
    from hermes_actors import system

    release, stuck_in = threading.Event(), threading.Event()
    original = DispatcherActor._on_send

    def stuck(self: DispatcherActor, msg: Any) -> Any:
        stuck_in.set()
        release.wait(WAIT)
        return original(self, msg)

    monkeypatch.setattr(DispatcherActor, "_on_send", stuck)
    monkeypatch.setattr(system, "ASK_TIMEOUT", 0.3)
    gw = Gateway(make_root(tmp_path), runner=RecordingRunner())
    gw.start()
    try:
        # a target no local profile has is asked of the Dispatcher (a local one is admitted on this thread)
        text = message_agent_tool(gw, sender="alice", target="nobody", message="hi")
        assert stuck_in.is_set()
    finally:
        release.set()
        gw.stop()
    result = json.loads(text)
    assert set(result) == {"error", "reason"} and result["reason"] == "unknown", result
    assert result["error"].startswith("The gateway did not answer in time (AskTimeout: "), result
    assert "NOT queued" not in result["error"] and "Do NOT resend" in result["error"], result


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this error cannot be rendered")


@pytest.mark.parametrize(("raised", "says"), [
    (ValueError("a bug"), "message_agent failed in the gateway (ValueError: a bug)"),
    (_Unprintable(), "message_agent failed in the gateway (_Unprintable)"),
    (TimeoutError("no answer"), "The gateway did not answer in time (TimeoutError: no answer)"),
])
def test_the_tool_answers_any_failure_of_the_send_with_its_error_result(raised: Exception, says: str) -> None:
    """Regression (review apismall): any failure of the gateway's machinery but ``RuntimeError`` escaped the tool."""

    class Failing:
        def message_agent(self, **_: Any) -> dict[str, Any]:
            raise raised

    result = json.loads(message_agent_tool(Failing(), sender="alice", target="bob", message="hi"))  # type: ignore[arg-type]
    assert result == {"error": f"{says}, so whether the message was queued is unknown: it may still be delivered. "
                               "Do NOT resend it (a resend could deliver it twice); if it was queued, its outcome "
                               "notification follows.", "reason": "unknown"}


@pytest.mark.parametrize("durable", [False, True])
def test_a_signal_handler_that_sends_while_the_main_thread_is_inside_message_agent_is_sent_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool
) -> None:
    """Regression (embedding review): a handler calling ``message_agent`` while the main thread was inside its own
    ``message_agent`` (on a mailbox's lock) waited forever on that lock. The main thread's calls run on the
    gateway's call thread: the handler's call queues behind the one it interrupted, and both are sent."""
    import hermes_actors.local.sending as sending

    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    runner = RecordingRunner()
    nested: list[Any] = []
    raised: list[bool] = []
    real_tell = sending.tell

    def tell_interrupted(ref: Any, message: Any) -> bool:
        if not raised:  # the signal lands in the middle of the outer send, as a SIGALRM or a Ctrl-C would
            raised.append(True)
            signal.raise_signal(signal.SIGUSR1)
        return real_tell(ref, message)

    def handler(_signum: int, _frame: Any) -> None:
        nested.append(gw.message_agent(sender="alice", target="bob", message="from the handler"))

    with Gateway(root, runner=runner, durable=durable) as gw:
        previous = signal.signal(signal.SIGUSR1, handler)
        monkeypatch.setattr(sending, "tell", tell_interrupted)
        try:
            outer = gw.message_agent(sender="alice", target="bob", message="the interrupted send")
            await_condition(lambda: nested, timeout=WAIT, message="the handler's send answered")
        finally:
            signal.signal(signal.SIGUSR1, previous)
            monkeypatch.undo()
        (inner,) = nested
        assert gw.wait_outcome(outer["delivery_id"], timeout=WAIT)["status"] == "replied"
        assert gw.wait_outcome(inner["delivery_id"], timeout=WAIT)["status"] == "replied"
    assert sorted(t.content.split(": ", 1)[-1] for t in runner.entered) == ["from the handler", "the interrupted send"]


FINALIZER_SENDS = r"""
import json, os, sys, threading
from hermes_actors import Gateway

gw = Gateway(sys.argv[1], runner=lambda turn: "ok", durable=False).start()
inbox = gw._system.dispatcher.actor_inbox  # pykka's queue.Queue: its put holds a non-reentrant lock
nested = []

class SendsWhenCollected:
    def __del__(self):
        try:
            nested.append(gw.message_agent(sender="alice", target="bob", message="from the finalizer"))
        except RuntimeError as exc:
            nested.append(str(exc))

held = [SendsWhenCollected()]
real_put = inbox._put

def put_then_collect(item):  # inside Queue.put, under its lock, where a garbage collection may run a finalizer
    real_put(item)
    if held and threading.current_thread().name == "sender":
        held.clear()  # the last reference: its __del__ runs here, on the sender's thread

inbox._put = put_then_collect
acks = []
sender = threading.Thread(target=lambda: acks.append(gw.message_agent(sender="alice", target="bob", message="outer")),
                          name="sender", daemon=True)
sender.start()
sender.join(30)
if sender.is_alive():
    print(json.dumps({"hung": True}), flush=True)
    os._exit(3)  # the gateway cannot stop: the sender holds the Dispatcher's mailbox lock for good
status = gw.wait_outcome(acks[0]["delivery_id"], 30)["status"]
gw.stop(10)
print(json.dumps({"hung": False, "nested": nested, "outer": status}), flush=True)
"""


def test_a_finalizer_that_sends_in_the_middle_of_a_send_on_its_thread_is_refused_not_hung(tmp_path: Path) -> None:
    """A finalizer (``__del__``) can run on any thread in the middle of its ``message_agent``, while that call
    holds the Dispatcher's mailbox lock (pykka's inbox, not reentrant): its own ``message_agent`` waited on that
    lock forever (without SendsInFlight's guard the sender hangs, and the gateway with it). It is refused at once,
    nothing sent, and the interrupted send goes on."""
    done = _run_script(tmp_path, FINALIZER_SENDS, str(make_root(tmp_path, {"alice": {}, "bob": {}})))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    (refused,) = facts["nested"]
    assert refused.startswith("message_agent was called on a thread already inside message_agent: a finalizer"), facts
    assert "Nothing was sent" in refused
    assert facts["outer"] == "replied", facts


def test_an_interrupt_storm_on_the_main_thread_never_wedges_the_gateway(tmp_path: Path) -> None:
    """Regression (review): KeyboardInterrupts raised every 0.3 ms on the main thread, which sent durable DMs in a
    loop, landed inside a mailbox's lock (pykka's queue, taken in a Python-level ``Condition.__enter__``) and left
    it taken: every sender, the journal's writer and ``stop()`` hung for good. The main thread's calls run on
    the gateway's call thread; an interrupt ends only the main thread's wait. A hang fails the child's deadline;
    the stop is asserted clean by what it was willing to wait, not by how long it took."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    done = _run_script(tmp_path, INTERRUPT_STORM, str(root), deadline=STOP_DEADLINE)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["interrupted"] > 0, facts  # how many sends also got their ack depends on the machine's speed
    assert facts["after"] == "replied", facts
    # Every turn settled before the pool's shutdown (it waited for no worker): no step of the stop timed out on a
    # mailbox an interrupt left wedged (an unclean stop waits for the workers until its own deadline).
    assert facts["pool_joins"] == [0.0], facts


# A child records what its stop gave the worker pool to join (tests/roots.py watch_pool_joins, patched for the
# child's whole life: it has no pytest monkeypatch).
_WATCH_POOL_JOINS = """
from roots import watch_pool_joins

class _ForLife:
    setattr = staticmethod(setattr)

pool_joins = watch_pool_joins(_ForLife())
"""

INTERRUPT_STORM = _WATCH_POOL_JOINS + r"""
import json, signal, sys, time
from hermes_actors import Gateway

armed = [False]

def storm(*_):
    if armed[0]:  # at most one interrupt per arming, so it always lands inside the try below
        armed[0] = False
        raise KeyboardInterrupt

gw = Gateway(sys.argv[1], runner=lambda turn: "ok").start()
acked = interrupted = 0
signal.signal(signal.SIGALRM, storm)
signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)
deadline = time.monotonic() + 5
while time.monotonic() < deadline:
    try:
        armed[0] = True
        ack = gw.message_agent(sender="alice", target="bob", message="storm")
        armed[0] = False
        acked += "delivery_id" in ack
    except KeyboardInterrupt:
        interrupted += 1
signal.setitimer(signal.ITIMER_REAL, 0)
signal.signal(signal.SIGALRM, signal.SIG_DFL)
after = gw.message_agent(sender="bob", target="alice", message="after the storm")  # alice's queue is empty
status = gw.wait_outcome(after["delivery_id"], timeout=30)["status"]
gw.stop(10)
print(json.dumps({"acked": acked, "interrupted": interrupted, "after": status, "pool_joins": pool_joins}))
"""


LONG_WAIT_INTERRUPTED = _WATCH_POOL_JOINS + r"""
import json, signal, sys, threading
from hermes_actors import Gateway

hold = threading.Event()
def held(turn):
    hold.wait(60)  # a turn that runs long; the stop abandons it
    return "late"

def interrupt(*_):
    raise KeyboardInterrupt

gw = Gateway(sys.argv[1], runner=held, durable=False).start()
waiting = threading.Event()  # the interrupted wait still runs (on the call thread)
answer = gw._outcomes.answer

def watched_answer(*args, **kwargs):
    waiting.set()
    try:
        return answer(*args, **kwargs)
    finally:
        waiting.clear()

gw._outcomes.answer = watched_answer
stop_waits = []  # what the stop gave the running turn, and whether the interrupted wait still ran then

def on_wait(count, seconds):
    stop_waits.append({"turns": count, "seconds": seconds, "wait_still_running": waiting.is_set()})

ack = gw.message_agent(sender="alice", target="bob", message="long")
signal.signal(signal.SIGALRM, interrupt)
signal.setitimer(signal.ITIMER_REAL, 0.3)
try:
    gw.wait_outcome(ack["delivery_id"], timeout=300)  # a Ctrl-C ends this wait
except KeyboardInterrupt:
    pass
gw.stop(1, on_wait=on_wait)
hold.set()
print(json.dumps({"stop_waits": stop_waits, "pool_joins": pool_joins}))
"""


def test_a_stop_after_an_interrupted_long_wait_is_not_queued_behind_it(tmp_path: Path) -> None:
    """The main thread's calls run on one call thread; a ``wait_outcome(id, 300)`` whose wait a Ctrl-C ended goes
    on there, and the stop that follows must not wait behind it (it gets a thread of its own). Asserted as the
    order of the two (the stop waited for the running turn while the interrupted wait still ran) and what the
    stop was willing to wait, not as how long it took (queued behind, it would have waited the 300 s out, past
    the child's deadline)."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    done = _run_script(tmp_path, LONG_WAIT_INTERRUPTED, str(root), deadline=STOP_DEADLINE)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["stop_waits"] == [{"turns": 1, "seconds": 1, "wait_still_running": True}], facts
    assert facts["pool_joins"] == [0.0], facts  # the abandoned turn's worker is not waited for


def test_dir_of_the_package_lists_every_public_name_before_it_is_loaded() -> None:
    """Regression: the public names load on first use (module ``__getattr__``), and ``dir(hermes_actors)`` left
    out those not loaded yet ('Gateway' in dir(hermes_actors) was False). Listing them loads none of the actors."""
    probe = ("import json, sys, hermes_actors; names = dir(hermes_actors); "
             "print(json.dumps([names, [m for m in ('pykka', 'hermes_actors.gateway') if m in sys.modules], "
             "hermes_actors.__all__]))")
    done = subprocess.run([sys.executable, "-c", probe], env=child_env(), capture_output=True, text=True,
                          timeout=PROCESS_DEADLINE, check=True)
    names, loaded, public = json.loads(done.stdout)
    assert "Gateway" in names and set(public) <= set(names), names
    assert "__version__" in names and "__name__" in names  # the module's own names are still listed
    assert loaded == []
