"""Turns through the Gateway: serialization, bounded wait, retry policy, silence, the CLI runner."""

from __future__ import annotations

import itertools
import json
import re
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from roots import RecordingRunner, body_of, held_on, start_gateway, write_fake_cli

from actors.testkit import await_condition
from hermes_actors import CommandRunner, Gateway, TurnFailed
from hermes_actors.messages import Turn


def queued(ack: dict[str, Any]) -> str:
    assert ack.get("status") == "queued", ack
    delivery_id = ack["delivery_id"]
    assert isinstance(delivery_id, str) and len(delivery_id) == 32
    assert delivery_id == delivery_id.lower() and int(delivery_id, 16) >= 0
    return delivery_id


# ── one turn at a time, in arrival order, exactly one outcome each ─────────


def _busy_turn(turn: Turn) -> str:
    for _ in range(20):  # give other threads every chance to interleave
        time.sleep(0)
    return f"done {body_of(turn.content)}"


def test_concurrent_dms_from_several_senders_never_overlap(root: Path, gateways: list[Gateway]) -> None:
    runner = RecordingRunner(_busy_turn)
    gw = start_gateway(gateways, root, runner)
    seen: list[str] = []
    seen_lock = threading.Lock()

    def collect(outcome: dict[str, Any]) -> None:
        with seen_lock:
            seen.append(outcome["delivery_id"])

    gw.subscribe(collect)
    senders = ["alice", "carol", "hermes", "default", "CAROL"]
    per_sender = 10
    acked: dict[str, list[str]] = {s: [] for s in senders}
    errors: list[BaseException] = []
    go = threading.Barrier(len(senders))

    def fire(sender: str) -> None:
        try:
            go.wait(timeout=5)
            for n in range(per_sender):
                ack = gw.message_agent(sender=sender, target="bob", message=f"{sender}#{n}")
                acked[sender].append(queued(ack))
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=fire, args=(s,)) for s in senders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    all_ids = [d for ids in acked.values() for d in ids]
    assert len(all_ids) == len(set(all_ids)) == 50

    outcomes = {d: gw.wait_outcome(d, timeout=20) for d in all_ids}
    assert all(o["status"] == "replied" for o in outcomes.values())
    for sender, ids in acked.items():
        for n, d in enumerate(ids):
            assert outcomes[d]["reply"] == f"done {sender}#{n}"

    records = runner.wait_records(50)
    assert len(records) == 50 and runner.max_active == 1
    ordered = sorted(records, key=lambda r: r.entered)
    for before, after in itertools.pairwise(ordered):
        assert before.exited <= after.entered, "two turns of one profile overlapped"
    # Each sender's DMs ran in the order their acks came back.
    entry_order = [t.delivery_id for t in runner.entered]
    for ids in acked.values():
        positions = [entry_order.index(d) for d in ids]
        assert positions == sorted(positions)
    # Every DM got exactly one outcome (stop flushes the subscriber callbacks).
    gw.stop(timeout=5)
    counts = Counter(seen)
    assert set(counts) == set(all_ids)
    assert set(counts.values()) == {1}


def test_global_arrival_order_is_kept(root: Path, gateways: list[Gateway]) -> None:
    runner = RecordingRunner(_busy_turn)
    gw = start_gateway(gateways, root, runner)
    senders = ["alice", "carol", "hermes"]
    ids = [
        queued(gw.message_agent(sender=senders[n % 3], target="bob", message=f"m{n}")) for n in range(50)
    ]
    for d in ids:
        assert gw.wait_outcome(d, timeout=20)["status"] == "replied"
    assert [t.delivery_id for t in runner.entered] == ids
    assert runner.bodies() == [f"m{n}" for n in range(50)]
    assert runner.max_active == 1


def test_different_profiles_run_in_parallel(root: Path, gateways: list[Gateway]) -> None:
    both_in = threading.Barrier(2, timeout=5)

    def meet(turn: Turn) -> str:
        both_in.wait()  # only passes when alice's and bob's turns run at the same time
        return "met"

    gw = start_gateway(gateways, root, RecordingRunner(meet))
    a = queued(gw.message_agent(sender="carol", target="alice", message="hi"))
    b = queued(gw.message_agent(sender="carol", target="bob", message="hi"))
    assert gw.wait_outcome(a, timeout=10)["reply"] == "met"
    assert gw.wait_outcome(b, timeout=10)["reply"] == "met"


# ── bounded wait: target_busy ───────────────────────────────────────────────


def test_queued_dm_fails_target_busy_after_the_wait_budget(root: Path, gateways: list[Gateway]) -> None:
    started, release = threading.Event(), threading.Event()

    def behave(turn: Turn) -> str:
        if body_of(turn.content) == "first":
            started.set()
            assert release.wait(10)
        return f"did {body_of(turn.content)}"

    runner = RecordingRunner(behave)
    gw = start_gateway(gateways, root, runner, {"bot_mode": {"turn_wait_seconds": 1.0}})
    try:
        first = queued(gw.message_agent(sender="alice", target="bob", message="first"))
        assert started.wait(5)
        t0 = time.monotonic()  # before the send: the DM's wait (on the same monotonic clock) begins after it
        second = queued(gw.message_agent(sender="carol", target="bob", message="second"))
        out = gw.wait_outcome(second, timeout=10)
        waited = time.monotonic() - t0
    finally:
        release.set()
    # It waited its whole budget before failing: exact, so a slow machine cannot fail it; and 1 s, so that a
    # budget that expired at once could pass only on a machine that took a second to answer one DM.
    assert waited >= 1.0
    assert out["status"] == "failed"
    assert out["reason"] == "target_busy"
    assert out["retryable"] is True
    # The seconds it names are the wait as the gateway measured it: at least the budget, more on a loaded machine.
    waited_text = re.fullmatch(
        r"target_busy: another delivery turn is already running for profile 'bob' — "
        r"queued behind it for ~(\d+)s without it finishing\. The message was NOT delivered; retry shortly\.",
        out["error"],
    )
    assert waited_text and int(waited_text[1]) >= 1, out["error"]
    assert out["text"] == f"Delivery to @bob failed [reason: target_busy]: {out['error']}"
    assert out["reply"] == "" and out["from"] == "@bob"

    assert gw.wait_outcome(first, timeout=5)["reply"] == "did first"
    third = queued(gw.message_agent(sender="carol", target="bob", message="third"))
    assert gw.wait_outcome(third, timeout=5)["reply"] == "did third"
    # FIFO: had the second DM been kept, it would have run before the third.
    assert runner.bodies() == ["first", "third"]


# ── the retry policy ────────────────────────────────────────────────────────

RETRIED = [
    ("runtime_offline", "resume"),
    ("delivery_timeout", "resume"),
    ("provider_rate_limit", "resume"),
    ("provider_server_error", "resume"),
    ("context_overflow", "compress_then_resume"),
]
NOT_RETRIED = [
    "provider_auth_or_access",
    "provider_quota_limit",
    "missing_config",
    "model_unavailable",
    "unknown",
]
RETRYABLE = {"runtime_offline", "provider_rate_limit", "provider_server_error"}


class FailingFirst:
    """Fails attempt 1 (or every attempt) with ``error``; records every turn."""

    def __init__(self, error: BaseException, *, always: bool = False) -> None:
        self.error, self.always = error, always
        self.turns: list[Turn] = []

    def __call__(self, turn: Turn) -> str:
        self.turns.append(turn)
        if turn.attempt == 1 or self.always:
            raise self.error
        return "recovered"


def _run_one(root: Path, gateways: list[Gateway], runner: Any) -> tuple[str, dict[str, Any]]:
    gw = start_gateway(gateways, root, runner)
    delivery_id = queued(gw.message_agent(sender="alice", target="bob", message="please"))
    return delivery_id, gw.wait_outcome(delivery_id, timeout=10)


@pytest.mark.parametrize(("reason", "action"), RETRIED)
def test_retried_once_in_the_same_session(root: Path, gateways: list[Gateway], reason: str, action: str) -> None:
    runner = FailingFirst(TurnFailed(f"attempt failed ({reason})", reason=reason))
    delivery_id, out = _run_one(root, gateways, runner)
    assert [t.attempt for t in runner.turns] == [1, 2]
    assert [t.retry_action for t in runner.turns] == ["", action]
    assert [t.session for t in runner.turns] == ["Bot Chat", "Bot Chat"]
    assert [t.delivery_id for t in runner.turns] == [delivery_id, delivery_id]
    assert runner.turns[0].content == runner.turns[1].content
    assert out["status"] == "replied" and out["reply"] == "recovered"
    assert out["error"] == "" and out["reason"] == ""


@pytest.mark.parametrize(("reason", "action"), RETRIED)
def test_retried_once_then_fails(root: Path, gateways: list[Gateway], reason: str, action: str) -> None:
    runner = FailingFirst(TurnFailed("still failing", reason=reason), always=True)
    _, out = _run_one(root, gateways, runner)
    assert [t.attempt for t in runner.turns] == [1, 2]
    assert out["status"] == "failed"
    assert out["reason"] == reason
    assert out["error"] == "still failing"
    assert out["retryable"] is (reason in RETRYABLE)
    assert out["text"] == f"Delivery to @bob failed [reason: {reason}]: still failing"


@pytest.mark.parametrize("reason", NOT_RETRIED)
def test_not_retried(root: Path, gateways: list[Gateway], reason: str) -> None:
    runner = FailingFirst(TurnFailed("nope", reason=reason))
    _, out = _run_one(root, gateways, runner)
    assert [t.attempt for t in runner.turns] == [1]
    assert out["status"] == "failed"
    assert out["reason"] == reason
    assert out["retryable"] is False


@pytest.mark.parametrize(
    ("error", "reason", "attempts"),
    [
        (RuntimeError("429 Too Many Requests"), "provider_rate_limit", 2),
        (OSError("upstream: 503 Service Unavailable"), "provider_server_error", 2),
        (TurnFailed("Connection refused by the model host"), "runtime_offline", 2),  # no reason: classified
        (ValueError("prompt is too long for the context window"), "context_overflow", 2),
        (RuntimeError("401 Unauthorized"), "provider_auth_or_access", 1),
        (KeyError("nothing to classify here"), "unknown", 1),
        (RuntimeError("error 4290 in module"), "unknown", 1),  # status codes only as whole numbers
    ],
)
def test_plain_exceptions_are_classified(root: Path, gateways: list[Gateway], error: BaseException, reason: str,
                                         attempts: int) -> None:
    runner = FailingFirst(error, always=True)
    _, out = _run_one(root, gateways, runner)
    assert len(runner.turns) == attempts
    assert out["status"] == "failed" and out["reason"] == reason
    if attempts == 2:
        assert runner.turns[1].retry_action == ("compress_then_resume" if reason == "context_overflow" else "resume")


class PreparingRetry(FailingFirst):
    """FailingFirst with a ``prepare_retry`` hook that answers ``allow`` (or raises it)."""

    def __init__(self, allow: bool | BaseException) -> None:
        super().__init__(TurnFailed("provider down", reason="provider_server_error"))
        self.allow = allow
        self.prepared: list[tuple[Turn, float]] = []

    def run_turn(self, turn: Turn) -> str:
        return self(turn)

    def prepare_retry(self, turn: Turn, began: float) -> bool:
        self.prepared.append((turn, began))
        if isinstance(self.allow, BaseException):
            raise self.allow
        return self.allow


def test_a_runner_preparing_the_retry_is_asked_with_the_retry_turn_and_when_attempt_1_began(
    root: Path, gateways: list[Gateway]
) -> None:
    before = time.time()
    runner = PreparingRetry(True)
    _, out = _run_one(root, gateways, runner)
    assert [t.attempt for t in runner.turns] == [1, 2] and out["status"] == "replied"
    [(turn, began)] = runner.prepared
    assert (turn.attempt, turn.retry_action) == (2, "resume")
    assert before <= began <= time.time()


@pytest.mark.parametrize("allow", [False, RuntimeError("state.db is locked"), KeyboardInterrupt()])
def test_a_runner_refusing_the_retry_keeps_the_first_failure(root: Path, gateways: list[Gateway],
                                                             allow: bool | BaseException) -> None:
    runner = PreparingRetry(allow)
    _, out = _run_one(root, gateways, runner)
    assert [t.attempt for t in runner.turns] == [1]  # no second attempt ran
    assert len(runner.prepared) == 1
    assert out["status"] == "failed" and out["reason"] == "provider_server_error" and out["error"] == "provider down"


def test_plain_exception_recovers_on_retry(root: Path, gateways: list[Gateway]) -> None:
    runner = FailingFirst(RuntimeError("HTTP 429: rate limit exceeded"))
    _, out = _run_one(root, gateways, runner)
    assert [t.attempt for t in runner.turns] == [1, 2]
    assert out["status"] == "replied" and out["reply"] == "recovered"


# ── silence ─────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("reply", "status"),
    [
        ("[SILENT]", "silent"),
        (" no reply ", "silent"),
        ("NO_REPLY", "silent"),
        ("silent", "silent"),
        ("No   Reply", "silent"),
        ("", "silent"),
        ("  \n ", "silent"),
        ("silently", "replied"),
        ("[SILENT] but not really", "replied"),
    ],
)
def test_silence(root: Path, gateways: list[Gateway], reply: str, status: str) -> None:
    _, out = _run_one(root, gateways, lambda turn: reply)
    assert out["status"] == status
    if status == "silent":
        assert out["reply"] == "" and out["error"] == "" and out["reason"] == ""
        assert out["retryable"] is False
        assert out["text"].startswith("@bob ") and "silence" in out["text"]
    else:
        assert out["reply"] == reply and out["text"] == f"Reply from @bob: {reply}"


# ── the command runner through the Gateway ─────────────────────────────────

FAKE_CLI = """#!{python}
import json, os, sys
argv = sys.argv[1:]
query_file = argv[argv.index("--query-file") + 1]
with open(query_file, encoding="utf-8") as f:
    query = f.read()
resume = os.environ.get("HERMES_RESUME_UNANSWERED_TURN") == "1"
with open(os.environ["FAKE_LOG"], "a", encoding="utf-8") as log:
    log.write(json.dumps({{"argv": argv, "query": query, "resume": resume}}) + "\\n")
if query.endswith("busy"):
    sys.stderr.write("lease check\\nhermes-refusal-reason: SESSION_NOT_OWNED\\n")
    sys.exit(1)
if query.endswith("rate") and not resume:
    sys.stderr.write("provider said: 429 rate limit\\n")
    sys.exit(1)
sys.stdout.write("Hello from " + argv[argv.index("-p") + 1] + ("" if not resume else " (resumed)") + "\\n\\n")
"""


@pytest.fixture
def fake_cli(tmp_path: Path) -> tuple[str, Path]:
    return str(write_fake_cli(tmp_path, FAKE_CLI.format(python=sys.executable))), tmp_path / "cli.log"


def _log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_command_runner_through_the_gateway(root: Path, gateways: list[Gateway], fake_cli: tuple[str, Path],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cli, log = fake_cli
    monkeypatch.setenv("FAKE_LOG", str(log))
    dm_base = root.parent / "tmp"  # the temp root the DM directory is made in (like /tmp)
    dm_base.mkdir()
    runner = CommandRunner(cli=cli, timeout=30, dm_base=dm_base)
    gw = start_gateway(gateways, root, runner)

    ok = queued(gw.message_agent(sender="alice", target="bob", message="hello"))
    out = gw.wait_outcome(ok, timeout=20)
    assert out["status"] == "replied" and out["reply"] == "Hello from bob", out
    (call,) = _log(log)
    assert call["argv"][:-1] == [
        "-p", "bob", "chat", "--in", "~", "-c", "Bot Chat", "--create-if-missing", "-Q", "--query-file",
    ]
    assert call["query"] == "Message from 🤖 alice (@alice): hello"
    assert call["resume"] is False
    assert not Path(call["argv"][-1]).exists()  # the query file is removed after the turn

    busy = queued(gw.message_agent(sender="alice", target="bob", message="are you busy"))
    out = gw.wait_outcome(busy, timeout=20)
    assert out["status"] == "failed" and out["reason"] == "target_busy"
    assert "NOT delivered" in out["error"] and out["retryable"] is True
    assert len(_log(log)) == 2  # refused by the session's owner: never retried

    rate = queued(gw.message_agent(sender="carol", target="bob", message="check the rate"))
    out = gw.wait_outcome(rate, timeout=20)
    assert out["status"] == "replied" and out["reply"] == "Hello from bob (resumed)"
    calls = _log(log)[2:]
    assert [c["resume"] for c in calls] == [False, True]
    assert calls[0]["argv"][-1] == calls[1]["argv"][-1]  # the retry replays the same query file
    assert calls[0]["query"] == calls[1]["query"] == "Message from 🤖 carol (@carol): check the rate"
    assert runner.kept() == []
    assert not any(p.is_file() for p in dm_base.rglob("*"))


def test_an_out_of_vocabulary_reason_is_normalized_before_the_retry_decision(root: Path,
                                                                           gateways: list[Gateway]) -> None:
    # A newer runner's code the vocabulary does not know: the text decides, for the outcome AND the retry.
    runner = FailingFirst(TurnFailed("upstream said 429 Too Many Requests", reason="provider_throttled_v2"))
    _, out = _run_one(root, gateways, runner)
    assert [t.attempt for t in runner.turns] == [1, 2]
    assert out["status"] == "replied" and out["reply"] == "recovered"
    runner = FailingFirst(TurnFailed("upstream said 429 Too Many Requests", reason="provider_throttled_v2"),
                          always=True)
    _, out = _run_one(root, gateways, runner)
    assert [t.attempt for t in runner.turns] == [1, 2]
    assert out["reason"] == "provider_rate_limit" and out["retryable"] is True


class TimedOutThenFailing:
    """Attempt 1 of "slow" waits until released, then fails as the command runner does at its own timeout."""

    def __init__(self) -> None:
        self.release_turn = threading.Event()
        self.released: list[str] = []  # ``release(id)`` is called once no further attempt of that DM can start
        self.attempts: list[tuple[str, int]] = []

    def run_turn(self, turn: Turn) -> str:
        self.attempts.append((body_of(turn.content), turn.attempt))
        if body_of(turn.content) == "slow":
            assert self.release_turn.wait(30), "the test never released the turn"
            raise TurnFailed("the hermes turn did not finish within its time", reason="delivery_timeout")
        return f"did {body_of(turn.content)}"

    def release(self, delivery_id: str) -> None:
        self.released.append(delivery_id)


def test_a_turn_reported_timed_out_is_never_retried_afterwards(root: Path, gateways: list[Gateway]) -> None:
    """The sender got delivery_timeout and the next DM ran; the runner's own timeout then retried the turn."""
    runner = TimedOutThenFailing()
    gw = start_gateway(gateways, root, runner, {"bot_mode": {"turn_timeout_seconds": 0.2}})
    slow = queued(gw.message_agent(sender="alice", target="bob", message="slow"))
    assert gw.wait_outcome(slow, timeout=10)["reason"] == "delivery_timeout"
    nxt = queued(gw.message_agent(sender="carol", target="bob", message="next"))
    assert gw.wait_outcome(nxt, timeout=10)["reply"] == "did next"
    runner.release_turn.set()  # the timed-out attempt now fails with a retryable reason
    await_condition(lambda: slow in runner.released, timeout=10, message="the timed-out turn's job ended")
    assert runner.attempts == [("slow", 1), ("next", 1)]


class FailsOnceTheStopWaits:
    """Attempt 1 fails (``runtime_offline``, retryable) once ``fail_first`` is set; attempt 2 replies, or fails
    too with ``second_fails``. Records every call of the runner and its hooks."""

    def __init__(self, *, second_fails: bool = False) -> None:
        self.second_fails = second_fails
        self.entered, self.fail_first = threading.Event(), threading.Event()
        self.calls: list[tuple[str, int]] = []
        self.released: list[str] = []

    def run_turn(self, turn: Turn) -> str:
        self.calls.append(("run_turn", turn.attempt))
        if turn.attempt == 1:
            self.entered.set()
            assert self.fail_first.wait(30), "the test never let attempt 1 fail"
            raise TurnFailed("connection refused by the runtime", reason="runtime_offline")
        if self.second_fails:
            raise TurnFailed("still refused", reason="runtime_offline")
        return "second attempt ok"

    def prepare_retry(self, turn: Turn, began: float) -> bool:
        self.calls.append(("prepare_retry", turn.attempt))
        return True

    def forget_failed(self, turn: Turn, began: float) -> None:
        self.calls.append(("forget_failed", turn.attempt))

    def release(self, delivery_id: str) -> None:
        self.released.append(delivery_id)  # the turn's job is over (execute_turn's last step)


@pytest.mark.parametrize("second_fails", [False, True])
def test_a_turn_running_when_the_stop_begins_keeps_its_retry_and_its_cleanup(root: Path, second_fails: bool) -> None:
    """Regression (review): the stop's WindDown asked the running turn's gate whether it began, and that marked a
    turn that had begun as given up on too: failing retryably while the stop waited for it, it skipped its one
    retry (DESIGN 4.2) and, failed for good, its ``forget_failed`` ("its turn timed out" in the log). Now only a
    turn that had not begun is given up on: this one retries (within the stop's timeout) and is cleaned up."""
    runner = FailsOnceTheStopWaits(second_fails=second_fails)
    gw = Gateway(root, runner=runner).start()
    key = queued(gw.message_agent(sender="alice", target="bob", message="hi"))
    assert runner.entered.wait(10)
    gw.stop(timeout=30, on_wait=lambda turns, grace: runner.fail_first.set())  # fails while the stop waits
    out = gw.wait_outcome(key, timeout=0)
    retried = [("run_turn", 1), ("prepare_retry", 2), ("run_turn", 2)]
    if second_fails:
        assert (out["status"], out["reason"], out["error"]) == ("failed", "runtime_offline", "still refused"), out
        assert runner.calls == [*retried, ("forget_failed", 1)], "the DM reported NOT delivered was not taken back"
    else:
        assert (out["status"], out["reply"]) == ("replied", "second attempt ok"), out
        assert runner.calls == retried


def test_a_turn_still_running_when_the_stop_gave_up_on_it_starts_no_retry(root: Path) -> None:
    """The stop's timeout is kept: a turn still running at its end is reported ``ambiguous``; failing after that,
    it starts no retry (the gateway has stopped) and is not taken back from the session (it may have been read)."""
    runner = FailsOnceTheStopWaits()
    gw = Gateway(root, runner=runner).start()
    key = queued(gw.message_agent(sender="alice", target="bob", message="hi"))
    assert runner.entered.wait(10)
    try:
        gw.stop(timeout=0.2)
        assert gw.wait_outcome(key, timeout=0)["status"] == "ambiguous"
    finally:
        runner.fail_first.set()
    await_condition(lambda: key in runner.released, timeout=10, message="the turn's job ended")
    assert runner.calls == [("run_turn", 1)]


def test_a_dm_queued_for_a_profile_deleted_meanwhile_fails_without_running(root: Path, gateways: list[Gateway]) -> None:
    """Its turn ran in a home rebuilt from root + name: hermes then recreated the deleted profile's folder."""
    import shutil

    release = threading.Event()
    runner = RecordingRunner(held_on("first", release, reply="did "))
    gw = start_gateway(gateways, root, runner, {"bot_mode": {"rescan_seconds": 0.05}})
    first = queued(gw.message_agent(sender="alice", target="bob", message="first"))
    runner.wait_entered(1, timeout=10)
    second = queued(gw.message_agent(sender="carol", target="bob", message="second"))
    shutil.rmtree(root / "profiles" / "bob")  # hermes profile delete -y bob
    await_condition(lambda: all(r["profile"] != "bob" for r in gw.roster()), timeout=10, message="bob left")
    release.set()
    assert gw.wait_outcome(first, timeout=10)["reply"] == "did first"  # it was running: it ends as it does
    out = gw.wait_outcome(second, timeout=10)
    assert (out["status"], out["reason"]) == ("failed", "unknown"), out
    assert out["error"] == "The profile 'bob' no longer exists; the message was NOT delivered."
    assert runner.bodies() == ["first"]


def test_a_turn_reported_timed_out_while_it_waited_for_the_flock_never_runs(
    root: Path, gateways: list[Gateway], warnings: list[str]
) -> None:
    """Its DM already had its outcome; running it once the flock came free ran it unreported. And the outcome must
    say NOT delivered: "may still complete, do not resend" for a DM that never runs loses it."""
    import fcntl
    import os

    from hermes_actors.store.turnlock import turn_lock_path

    path = turn_lock_path(root, "bob")
    path.parent.mkdir(parents=True, exist_ok=True)
    other = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # another process's turn of bob holds the flock
    fcntl.flock(other, fcntl.LOCK_EX)
    runner = RecordingRunner()
    gw = start_gateway(gateways, root, runner, {"bot_mode": {"turn_timeout_seconds": 0.3, "turn_wait_seconds": 60}})
    try:
        waiting = queued(gw.message_agent(sender="alice", target="bob", message="waits"))
        out = gw.wait_outcome(waiting, timeout=10)
        # it never began, and never will: NOT delivered (the sender may resend), not "may still complete"
        assert (out["reason"], out["retryable"]) == ("target_busy", True), out
        assert "NOT delivered" in out["error"]
    finally:
        os.close(other)  # the flock comes free: the timed-out job may take it now
    after = queued(gw.message_agent(sender="carol", target="bob", message="after"))
    assert gw.wait_outcome(after, timeout=30)["status"] == "replied"
    await_condition(lambda: any(waiting in w and "finished after all" in w for w in warnings), timeout=30,
                    message="the timed-out turn's job ended")
    assert runner.bodies() == ["after"]


class ForgettingRunner:
    """Fails every attempt with ``reason``; records what its ``forget_failed`` hook was asked to take back."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.forgotten: list[str] = []

    def run_turn(self, turn: Turn) -> str:
        raise TurnFailed(f"failed: {self.reason}", reason=self.reason)

    def forget_failed(self, turn: Turn, began: float) -> None:
        self.forgotten.append(turn.delivery_id)


@pytest.mark.parametrize(
    ("reason", "taken_back"),
    [
        ("unknown", True),  # failed for good, reported NOT delivered: the session must not keep it
        ("agent_blocked", True),
        ("cancelled", False),  # the gateway's stop ended it: reported ambiguous, it may have been read
    ],
)
def test_only_a_dm_reported_not_delivered_is_taken_back_from_the_session(reason: str, taken_back: bool) -> None:
    """Regression: a turn the stop ended (its DM reported "may have been delivered — do not resend") was taken
    back out of Bot Chat like a DM that failed for good."""
    from hermes_actors.local.turns import execute_turn
    from hermes_actors.messages import Delivery

    key = "ab" * 16
    runner = ForgettingRunner(reason)
    delivery = Delivery(key, "alice", "alice", "bob", "bob", "Message from 🤖 alice (@alice): hi", label="@bob")
    result = execute_turn(
        delivery, runner=runner, lock=None, lock_deadline=time.monotonic() + 5,
        make_turn=lambda d, fd: Turn(profile=d.target, content=d.content, delivery_id=d.delivery_id),
    )
    assert result.reply is None and result.reason == reason
    assert runner.forgotten == ([key] if taken_back else [])


class HookRaisingRunner:
    """Fails every attempt with a retryable reason; both hooks raise ``hook_error``."""

    def __init__(self, hook_error: BaseException) -> None:
        self.hook_error = hook_error

    def run_turn(self, turn: Turn) -> str:
        raise TurnFailed("503 service unavailable", reason="provider_server_error")

    def prepare_retry(self, turn: Turn, began: float) -> bool:
        raise self.hook_error

    def forget_failed(self, turn: Turn, began: float) -> None:
        raise self.hook_error


@pytest.mark.parametrize(("hook_error", "level"), [
    (TurnFailed("hermes CLI not found", reason="runtime_offline"), "INFO"),  # expected: the outcome says it
    (RuntimeError("bug in the runner"), "WARNING"),  # runner code broke: worth a warning
])
def test_a_runner_hooks_typed_failure_is_logged_at_info_anything_else_at_warning(
    hook_error: BaseException, level: str
) -> None:
    """Regression: `send --cli /nonexistent` printed the outcome's failure and then the same text twice more as
    WARNING records (the retry hook and the take-back hook both raised the runner's TurnFailed)."""
    from roots import LogCapture

    from hermes_actors.local.turns import execute_turn
    from hermes_actors.messages import Delivery

    delivery = Delivery("cd" * 16, "alice", "alice", "bob", "bob", "Message from 🤖 alice (@alice): hi", label="@bob")
    with LogCapture("INFO") as logs:
        result = execute_turn(
            delivery, runner=HookRaisingRunner(hook_error), lock=None, lock_deadline=time.monotonic() + 5,
            make_turn=lambda d, fd: Turn(profile=d.target, content=d.content, delivery_id=d.delivery_id),
        )
    assert result.reply is None and result.reason == "provider_server_error"  # the first failure stands
    hooks = [r for r in logs.records if "not retrying" in r["message"] or "could not take back" in r["message"]]
    assert [r["level"].name for r in hooks] == [level, level]
