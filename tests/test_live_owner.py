"""Live-owner handoff (DESIGN 4.3): DMs go to the open Bot Chat window through a durable mailbox."""

from __future__ import annotations

import json
import os
import shutil
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
from roots import (
    LogCapture,
    RecordingRunner,
    body_of,
    crash_enqueue_once,
    send_dm,
    start_gateway,
    watch_pool_joins,
)

from actors import WorkerPool
from actors.testkit import await_condition
from hermes_actors import Gateway, TurnFailed
from hermes_actors.errors import HostileFileError, StoreError
from hermes_actors.local import turn_launch
from hermes_actors.local.live_handoff import LiveMailbox, give_up_on, hand_to_owner
from hermes_actors.local.runners import as_runner
from hermes_actors.local.turns import TurnGate
from hermes_actors.messages import Delivery, Turn


def mailbox_file(root: Path, key: str, profile: str = "bob") -> Path:
    return root / "profiles" / profile / "runtime" / "bot_live_delivery" / f"{key}.json"


def write_record(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(record, handle)


def record(key: str, state: str, **fields: str) -> dict[str, Any]:
    return {"delivery_id": key, "status": state, "at": 1, "reply": "", "error": "", "reason": "", **fields}


class Owner:
    """A live Bot Chat owner that records its turns; ``behave`` decides the reply."""

    def __init__(self, behave: Any = None) -> None:
        self.turns: list[Turn] = []
        self.lock = threading.Lock()
        self.behave = behave or (lambda turn: f"owner: {body_of(turn.content)}")

    def run_turn(self, turn: Turn) -> str:
        with self.lock:
            self.turns.append(turn)
        return str(self.behave(turn))

    def bodies(self) -> list[str]:
        with self.lock:
            return [body_of(t.content) for t in self.turns]


# ── routing ─────────────────────────────────────────────────────────────────


def test_dms_go_to_the_attached_owner_not_the_runner(root: Path, gateways: list[Gateway]) -> None:
    runner, owner = RecordingRunner(), Owner()
    gw = start_gateway(gateways, root, runner)
    gw.attach_live_owner("bob", owner)
    ids = [send_dm(gw, f"dm {n}") for n in range(3)]
    outs = [gw.wait_outcome(k, timeout=10) for k in ids]
    assert [o["reply"] for o in outs] == ["owner: dm 0", "owner: dm 1", "owner: dm 2"]
    assert all(o["status"] == "replied" for o in outs)
    assert owner.bodies() == ["dm 0", "dm 1", "dm 2"]
    assert runner.entered == []
    # Another profile, without an owner, still runs turns normally.
    other = send_dm(gw, "to carol", target="carol")
    assert gw.wait_outcome(other, timeout=10)["reply"] == "ok: to carol"
    assert runner.bodies() == ["to carol"]


def test_a_stop_from_inside_an_owner_turn_is_refused_as_from_a_runners_and_leaves_nothing_half_stopped(
    root: Path, gateways: list[Gateway]
) -> None:
    """Regression (acklost ``owner_stop2.py``): only a runner's turn marked its thread, so an owner's
    ``gw.stop()`` was not refused: the stop waited out its timeout for that very turn, its pool then raised
    ``cannot join current thread`` before the journal and the scheduler stopped (their threads alive, the
    journal's flock held: no new Gateway could adopt the DMs queued behind), and the owner's reply became
    ambiguous. Now it is refused as a runner's is, and the owner's reply and the queued DMs go through."""
    errors: list[BaseException] = []
    holder: dict[str, Gateway] = {}

    def behave(turn: Turn) -> str:
        if body_of(turn.content) == "stop yourself":
            try:
                holder["gw"].stop(timeout=3)
            except BaseException as exc:
                errors.append(exc)
        return "still here"

    gw = start_gateway(gateways, root, RecordingRunner())
    holder["gw"] = gw
    gw.attach_live_owner("bob", Owner(behave))
    ids = [send_dm(gw, "stop yourself"), send_dm(gw, "queued behind")]
    outs = [gw.wait_outcome(key, timeout=10) for key in ids]
    assert [(o["status"], o["reply"]) for o in outs] == [("replied", "still here")] * 2
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError), errors
    assert "from inside one of its own turns" in str(errors[0]) and "another thread" in str(errors[0])
    assert gw.running  # the refused stop changed nothing
    gw.stop()
    assert not gw.running


def test_detach_with_dms_queued_sends_them_to_the_runner(root: Path, gateways: list[Gateway]) -> None:
    release, entered = threading.Event(), threading.Event()

    def behave(turn: Turn) -> str:
        entered.set()
        assert release.wait(10), "the test never released the owner"
        return "owner handled it"

    runner, owner = RecordingRunner(), Owner(behave)
    gw = start_gateway(gateways, root, runner)
    gw.attach_live_owner("bob", owner)
    first = send_dm(gw, "first")
    assert entered.wait(10)
    queued = [send_dm(gw, f"queued {n}") for n in range(3)]
    gw.detach_live_owner("bob")
    release.set()
    assert gw.wait_outcome(first, timeout=10)["reply"] == "owner handled it"
    replies = [gw.wait_outcome(k, timeout=10)["reply"] for k in queued]
    assert replies == ["ok: queued 0", "ok: queued 1", "ok: queued 2"]
    assert owner.bodies() == ["first"]
    assert runner.bodies() == ["queued 0", "queued 1", "queued 2"]
    for key in queued:
        assert not mailbox_file(root, key).exists(), "a runner turn never goes through the live mailbox"


def test_a_detach_before_start_forgets_the_owner_under_any_spelling_and_checks_no_name(
    root: Path, gateways: list[Gateway]
) -> None:
    """Regression: before start(), detach_live_owner("Bob") left the owner attached as "bob" (the names kept for
    the start were matched as typed), so its DMs still went to the owner; once started, "Bob" detached it. A name
    no owner was attached under is not checked before the start (the docstring said KeyError): nothing happens."""
    runner, owner = RecordingRunner(), Owner()
    gw = Gateway(root, runner=runner)
    gateways.append(gw)
    gw.attach_live_owner("bob", owner)
    assert gw.detach_live_owner("@Bob") is None
    assert gw.detach_live_owner("nobody") is None
    gw.start()
    assert gw.wait_outcome(send_dm(gw, "who answers?"), timeout=10)["reply"] == "ok: who answers?"
    assert owner.bodies() == [] and runner.bodies() == ["who answers?"]
    with pytest.raises(KeyError, match="no local profile named 'nobody'"):
        gw.detach_live_owner("nobody")


def test_owner_dying_mid_turn_is_ambiguous_and_never_rerun(root: Path, gateways: list[Gateway]) -> None:
    def behave(turn: Turn) -> str:
        raise ConnectionResetError("window closed")

    runner, owner = RecordingRunner(), Owner(behave)
    gw = start_gateway(gateways, root, runner)
    gw.attach_live_owner("bob", owner)
    key = send_dm(gw, "are you there")
    out = gw.wait_outcome(key, timeout=10)
    assert out["status"] == "ambiguous"
    assert "do not resend" in out["error"] and "do not resend" in out["text"]
    assert out["retryable"] is False
    assert len(owner.turns) == 1 and runner.entered == []
    saved = json.loads(mailbox_file(root, key).read_text())
    assert saved["status"] == "ambiguous" and "window closed" in saved["error"]
    gw.stop()
    # A restart on the same root neither re-runs it nor reports it again as something else.
    again = Gateway(root, runner=runner).start()
    try:
        assert again.recovered.get("reoffered", 0) == 0
        assert again.wait_outcome(key, timeout=5)["status"] == "ambiguous"
    finally:
        again.stop()
    assert len(owner.turns) == 1 and runner.entered == []


def test_owner_raising_turn_failed_fails_with_that_reason(root: Path, gateways: list[Gateway]) -> None:
    def behave(turn: Turn) -> str:
        raise TurnFailed("The owner's provider account is out of credit.", reason="provider_quota_limit")

    runner, owner = RecordingRunner(), Owner(behave)
    gw = start_gateway(gateways, root, runner)
    gw.attach_live_owner("bob", owner)
    key = send_dm(gw, "hello")
    out = gw.wait_outcome(key, timeout=10)
    assert out["status"] == "failed"
    assert out["reason"] == "provider_quota_limit"
    assert out["error"] == "The owner's provider account is out of credit."
    assert len(owner.turns) == 1 and runner.entered == []
    saved = json.loads(mailbox_file(root, key).read_text())
    assert saved["status"] == "failed" and saved["reason"] == "provider_quota_limit"


@pytest.mark.parametrize(("error", "status", "reason"), [
    (TurnFailed("connection lost after sending: 503 service unavailable", ambiguous=True), "ambiguous",
     "provider_server_error"),
    (TurnFailed("busy", reason=" TARGET_BUSY "), "failed", "target_busy"),
], ids=["ambiguous", "reason-to-normalize"])
def test_an_owner_raising_turn_failed_gets_the_outcome_a_runner_raising_it_gets(
    root: Path, gateways: list[Gateway], error: TurnFailed, status: str, reason: str
) -> None:
    """Regression (review): an owner raising ``TurnFailed(..., ambiguous=True)`` was reported ``failed`` and
    retryable (resend: it may be shown twice), its mailbox record ``failed``, and a reason outside the vocabulary
    was recorded as given; a runner raising it got ``ambiguous`` ("do not resend"). Both follow one rule now
    (``turns.turn_failed``), and the record says what the sender was told."""
    def behave(turn: Turn) -> str:
        raise error

    runner, owner = RecordingRunner(behave), Owner(behave)
    gw = start_gateway(gateways, root, runner)
    gw.attach_live_owner("bob", owner)
    handed = send_dm(gw, "to the owner")
    from_owner = gw.wait_outcome(handed, timeout=10)
    gw.detach_live_owner("bob")
    from_runner = gw.wait_outcome(send_dm(gw, "to the runner"), timeout=10)
    fields = ("status", "reason", "retryable", "error")
    assert [from_owner[k] for k in fields] == [from_runner[k] for k in fields], (from_owner, from_runner)
    assert (from_owner["status"], from_owner["reason"]) == (status, reason), from_owner
    assert owner.bodies() == ["to the owner"] and len(runner.entered) == 1  # neither retried
    saved = json.loads(mailbox_file(root, handed).read_text())
    assert (saved["status"], saved["reason"], saved["error"]) == (status, reason, error.text), saved


class RawOwner:
    """A live owner whose ``run_turn`` returns ``value`` as it is (not made a str)."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.turns: list[str] = []

    def run_turn(self, turn: Turn) -> Any:
        self.turns.append(turn.delivery_id)
        return self.value


@pytest.mark.parametrize("value", [None, b"bytes", {"reply": "x"}], ids=["None", "bytes", "dict"])
@pytest.mark.parametrize("form", ["object", "callable"])
def test_an_owner_returning_no_str_is_ambiguous_never_its_str_as_the_reply(
    root: Path, gateways: list[Gateway], value: Any, form: str
) -> None:
    """An owner object returning None was reported ``replied`` with the reply 'None'. Its result is now checked
    as a runner's is (``checked_reply``), as a callable owner's already was: the owner took the DM, so it is
    ``ambiguous``, never a reply, with the runner's "returned NoneType, expected str" text."""
    runner, raw = RecordingRunner(), RawOwner(value)
    gw = start_gateway(gateways, root, runner)
    gw.attach_live_owner("bob", raw if form == "object" else raw.run_turn)
    key = send_dm(gw, "hello")
    out = gw.wait_outcome(key, timeout=10)
    assert out["status"] == "ambiguous", out
    assert f"returned {type(value).__name__}, expected str" in out["error"], out
    assert raw.turns == [key] and runner.entered == []
    saved = json.loads(mailbox_file(root, key).read_text())
    assert saved["status"] == "ambiguous" and saved["reply"] == "", saved


def test_a_stop_during_an_owner_turn_records_it_ambiguous_and_the_late_answer_does_not_overwrite_it(
    root: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop reported the DM ``ambiguous`` but its mailbox record stayed ``claimed``. Now the record says
    ``ambiguous`` as well, and the owner's answer arriving after the stop does not replace it."""
    real, handed_back = turn_launch.hand_to_owner, threading.Event()

    def hand_to_owner_then_tell(*args: Any, **kwargs: Any) -> Any:
        try:
            return real(*args, **kwargs)
        finally:
            handed_back.set()

    monkeypatch.setattr(turn_launch, "hand_to_owner", hand_to_owner_then_tell)
    entered, release = threading.Event(), threading.Event()

    def behave(turn: Turn) -> str:
        entered.set()
        assert release.wait(30), "the test never released the owner"
        return "too late"

    owner = Owner(behave)
    gw = start_gateway(gateways, root, RecordingRunner())
    gw.attach_live_owner("bob", owner)
    key = send_dm(gw, "window")
    assert entered.wait(10)
    try:
        gw.stop(timeout=0.2)
        out = gw.wait_outcome(key, timeout=0)
        assert out["status"] == "ambiguous", out
        saved = json.loads(mailbox_file(root, key).read_text())
        assert saved["status"] == saved["state"] == "ambiguous", saved
        assert saved["error"] == "The turn was still running when the gateway stopped.", saved
    finally:
        release.set()
    assert handed_back.wait(10)
    assert json.loads(mailbox_file(root, key).read_text())["status"] == "ambiguous", "the late answer won"


def test_giving_up_on_a_live_delivery_is_idempotent_and_never_replaces_a_final_state(root: Path) -> None:
    home = root / "profiles" / "bob"
    claimed, settled, absent = "a1" * 16, "b2" * 16, "c3" * 16
    box = LiveMailbox(home)
    for key in (claimed, settled):
        box.admit(key)
        box.transition(key, "claimed")
    box.transition(settled, "settled", reply="answered")
    tail = " The message may have been delivered — do not resend."
    assert give_up_on(home, claimed, "The gateway stopped or crashed during the turn." + tail)
    first = json.loads(mailbox_file(root, claimed).read_text())
    assert (first["status"], first["error"]) == ("ambiguous", "The gateway stopped or crashed during the turn.")
    assert not give_up_on(home, claimed, "again")  # final already: unchanged
    assert json.loads(mailbox_file(root, claimed).read_text()) == first
    assert not give_up_on(home, settled, "late")  # the owner's answer stands
    assert json.loads(mailbox_file(root, settled).read_text())["reply"] == "answered"
    assert give_up_on(home, absent, "a runner's turn")  # no record: none is made
    assert not mailbox_file(root, absent).exists()


def test_an_owner_turn_past_its_timeout_is_ambiguous_and_the_next_dms_wait_for_it(
    root: Path, gateways: list[Gateway]
) -> None:
    """An owner's turn hanging past ``turn_timeout_seconds`` was reported ``target_busy`` ("NOT delivered; retry")
    though the owner had it, its record stayed ``claimed``, and the next DMs were handed to the owner beside it.
    Now it is ``ambiguous`` (record too), and while it runs no DM is handed over: each waits its
    ``turn_wait_seconds`` and fails ``target_busy`` (NOT delivered), or runs once the owner's turn returns."""
    release = threading.Event()

    def behave(turn: Turn) -> str:
        if body_of(turn.content) == "hang":
            assert release.wait(60), "the test never released the owner"
        return f"owner: {body_of(turn.content)}"

    owner = Owner(behave)
    config = {"bot_mode": {"turn_timeout_seconds": 1.5, "turn_wait_seconds": 3}}
    gw = start_gateway(gateways, root, RecordingRunner(), config=config)
    gw.attach_live_owner("bob", owner)
    try:
        hung, behind = send_dm(gw, "hang"), send_dm(gw, "queued behind it")
        out = gw.wait_outcome(hung, timeout=30)
        assert (out["status"], out["retryable"]) == ("ambiguous", False), out
        assert "within 1.5s" in out["error"] and "do not resend" in out["error"], out
        assert json.loads(mailbox_file(root, hung).read_text())["status"] == "ambiguous"
        # one sent after the timeout, while the owner's turn still runs: not handed over beside it either
        late = send_dm(gw, "sent after the timeout")
        for key in (behind, late):
            waited = gw.wait_outcome(key, timeout=30)
            assert (waited["status"], waited["reason"]) == ("failed", "target_busy"), waited
            assert "NOT delivered" in waited["error"], waited
            assert not mailbox_file(root, key).exists()
        assert owner.bodies() == ["hang"], "a DM was handed to the owner beside its hung turn"
        after = send_dm(gw, "after it returns")
    finally:
        release.set()
    assert gw.wait_outcome(after, timeout=30)["reply"] == "owner: after it returns"
    assert owner.bodies() == ["hang", "after it returns"]
    assert json.loads(mailbox_file(root, hung).read_text())["status"] == "ambiguous", "the late answer won"


def _hanging_owner(release: threading.Event, entered: threading.Event | None = None) -> Owner:
    """An owner whose turn for the body ``hang`` returns only once ``release`` is set (``entered`` set as it starts)."""
    def behave(turn: Turn) -> str:
        if body_of(turn.content) == "hang":
            if entered is not None:
                entered.set()
            assert release.wait(60), "the test never released the owner"
        return f"owner: {body_of(turn.content)}"

    return Owner(behave)


def test_a_dm_behind_an_owner_turn_given_up_at_its_timeout_says_so_and_the_hang_is_logged(
    root: Path, gateways: list[Gateway]
) -> None:
    """Regression (hostile-input review): behind an owner's turn already reported ``ambiguous`` at
    ``turn_timeout_seconds``, every later DM failed "another delivery turn is already running for profile 'bob' —
    queued behind it", a turn the sender had been told about already, and nothing was logged. Now the text says the
    live owner has not returned a turn given up on at its timeout (NOT delivered; the owner must return it or be
    detached), one WARNING names the profile and what to do when the turn times out, one INFO when it returns."""
    release = threading.Event()
    owner = _hanging_owner(release)
    config = {"bot_mode": {"turn_timeout_seconds": 1, "turn_wait_seconds": 1}}
    with LogCapture("INFO") as logs:
        gw = start_gateway(gateways, root, RecordingRunner(), config=config)
        gw.attach_live_owner("bob", owner)
        try:
            hung = send_dm(gw, "hang")
            assert gw.wait_outcome(hung, timeout=30)["status"] == "ambiguous"
            behind = send_dm(gw, "sent behind it")
            out = gw.wait_outcome(behind, timeout=30)
            assert (out["status"], out["reason"]) == ("failed", "target_busy"), out
            assert out["error"].startswith("target_busy: the live Bot Chat owner of profile 'bob' has not returned a "
                                           "turn given up on at its timeout (that DM was reported ambiguous)"), out
            assert "NOT delivered" in out["error"] and "detach_live_owner" in out["error"], out
            assert "already running" not in out["error"], out
            warned = [r["message"] for r in logs.records if r["level"].name == "WARNING"
                      and "live Bot Chat owner did not return the turn" in r["message"]]
            assert len(warned) == 1, logs.lines
            assert hung in warned[0] and "detach_live_owner('bob')" in warned[0] and "DMs to bob wait" in warned[0]
        finally:
            release.set()
        await_condition(lambda: logs.matching("bob: its live Bot Chat owner returned the turn", hung), timeout=30,
                        message="the owner's return logged")
        after = send_dm(gw, "after it returns")
        assert gw.wait_outcome(after, timeout=30)["reply"] == "owner: after it returns"
    returned = [r for r in logs.records if "returned the turn" in r["message"]]
    assert [r["level"].name for r in returned] == ["INFO"], logs.lines


@pytest.mark.parametrize("detached", ["after its timeout", "while it ran"])
def test_detaching_an_owner_whose_turn_was_given_up_at_its_timeout_lets_the_next_dms_run(
    root: Path, gateways: list[Gateway], detached: str
) -> None:
    """The ``target_busy`` text says the owner may be detached: a detach now ends the wait for its hung turn, and
    the next DMs run on the runner (before, they waited for that owner until it returned, detached or not)."""
    release, entered = threading.Event(), threading.Event()
    runner, owner = RecordingRunner(), _hanging_owner(release, entered)
    config = {"bot_mode": {"turn_timeout_seconds": 1, "turn_wait_seconds": 20}}
    gw = start_gateway(gateways, root, runner, config=config)
    gw.attach_live_owner("bob", owner)
    try:
        hung = send_dm(gw, "hang")
        assert entered.wait(30)
        if detached == "while it ran":
            gw.detach_live_owner("bob")
        assert gw.wait_outcome(hung, timeout=30)["status"] == "ambiguous"
        behind = send_dm(gw, "sent behind it")
        if detached == "after its timeout":
            gw.detach_live_owner("bob")
        out = gw.wait_outcome(behind, timeout=15)  # well within its turn_wait_seconds: it ran, it did not time out
        assert (out["status"], out["reply"]) == ("replied", "ok: sent behind it"), out
    finally:
        release.set()
    assert runner.bodies() == ["sent behind it"]
    assert owner.bodies() == ["hang"]
    await_condition(lambda: json.loads(mailbox_file(root, hung).read_text())["status"] == "ambiguous", timeout=10)


def test_an_owner_handoff_given_up_on_before_it_began_never_reaches_the_owner(root: Path) -> None:
    """Its turn timed out while it waited for a worker: reported ``target_busy`` (NOT delivered), so the owner
    must never be handed it; the gate decides, as for a runner's turn."""
    key = "d4" * 16
    gate = TurnGate()
    gate.give_up()
    owner = Owner()
    result = hand_to_owner(_delivery(key), owner=as_runner(owner), home=root / "profiles" / "bob",
                           make_turn=_make_turn, journal=None, gate=gate)
    assert (result.reply, result.reason, result.ambiguous) == (None, "target_busy", False)
    assert owner.turns == []
    # its ProfileActor settled it and records what it decided (record_not_handed): the worker writes nothing
    assert not mailbox_file(root, key).exists()


def test_an_owner_handoff_given_up_on_between_its_gate_and_its_claim_never_reaches_the_owner(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timeout recorded the DM ``ambiguous`` just after the handoff began: the claim does not write over it,
    and the owner is not handed a DM already reported."""
    key = "e5" * 16
    home = root / "profiles" / "bob"
    gate = TurnGate()
    real_begin = gate.begin

    def begin_then_time_out() -> bool:
        began = real_begin()
        assert give_up_on(home, key, "The live Bot Chat owner did not finish the turn of @bob within 1s.")
        return began

    monkeypatch.setattr(gate, "begin", begin_then_time_out)
    owner = Owner()
    result = hand_to_owner(_delivery(key), owner=as_runner(owner), home=home, make_turn=_make_turn, journal=None,
                           gate=gate)
    assert result.ambiguous and owner.turns == []
    assert json.loads(mailbox_file(root, key).read_text())["status"] == "ambiguous"


@pytest.mark.parametrize("durable", [True, False])
def test_a_stop_while_the_handoff_waits_for_a_worker_leaves_the_dm_handed_over_next_start_or_cancelled(
    root: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch, durable: bool
) -> None:
    """Regression (review): a DM whose handoff waited for a worker at the stop was rightly left journaled, but its
    worker, finding the gate given up, wrote a final ``failed`` record ("The turn's time ran out…", ``target_busy``);
    the next start re-offered it, found that record and failed the DM, never shown to the owner. In memory mode the
    sender got ``cancelled`` and the record said ``failed``. Now the next start hands it over, and a cancelled DM's
    record says ``cancelled`` with the stop's text."""
    submitted, real_submit = threading.Semaphore(0), WorkerPool.submit

    def submit(pool: WorkerPool, fn: Any, **kwargs: Any) -> None:
        real_submit(pool, fn, **kwargs)
        submitted.release()

    monkeypatch.setattr(WorkerPool, "submit", submit)
    entered, release = threading.Event(), threading.Event()

    def behave(turn: Turn) -> str:
        entered.set()
        assert release.wait(30), "the test never released the runner"
        return "runner done"

    owner = Owner()
    gw = start_gateway(gateways, root, RecordingRunner(behave), workers=1, durable=durable)
    gw.attach_live_owner("bob", owner)
    try:
        carol = send_dm(gw, "holds the only worker", target="carol")
        assert entered.wait(10) and submitted.acquire(timeout=10)
        key = send_dm(gw, "hello owner")
        assert submitted.acquire(timeout=10), "bob's handoff never reached the worker pool"
        gw.stop(timeout=20, on_wait=lambda running, grace: release.set())
    finally:
        release.set()
    assert gw.wait_outcome(carol, timeout=0)["status"] == "replied"
    assert owner.turns == []
    if not durable:
        out = gw.wait_outcome(key, timeout=0)
        assert (out["status"], out["reason"]) == ("failed", "cancelled"), out
        saved = json.loads(mailbox_file(root, key).read_text())
        assert (saved["status"], saved["reason"], saved["error"]) == ("cancelled", "cancelled", out["error"]), saved
        return
    path = mailbox_file(root, key)
    assert not path.exists() or json.loads(path.read_text())["status"] == "queued"
    again = Gateway(root, runner=RecordingRunner(), durable=True)
    gateways.append(again)
    again.attach_live_owner("bob", owner)
    again.start()
    out = again.wait_outcome(key, timeout=20)
    assert (out["status"], out["reply"]) == ("replied", "owner: hello owner"), out
    assert owner.bodies() == ["hello owner"]
    assert json.loads(path.read_text())["status"] == "settled"


@pytest.mark.parametrize("timed_out", [True, False])
def test_a_profile_actor_crash_while_the_owner_has_a_turn_hands_nothing_beside_it(
    root: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch, timed_out: bool
) -> None:
    """Regression (review): after a ProfileActor crash the restarted one did not know the owner was still in a turn
    (timed out before the crash, or running at it) and handed it the next DM beside that turn; a turn running at the
    crash was reported ``ambiguous`` but its record stayed ``claimed``, and the owner's late answer wrote ``settled``.
    Now the record says ``ambiguous``, the DMs behind wait (and fail ``target_busy`` when their wait runs out), and
    once the owner's turn returns (its result reaches the restarted ProfileActor) the next DM is handed over."""
    crashed = crash_enqueue_once(monkeypatch)
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()

    def behave(turn: Turn) -> str:
        if body_of(turn.content) == "slow":
            entered.set()
            assert release.wait(60), "the test never released the owner"
            returned.set()
        return f"owner: {body_of(turn.content)}"

    owner = Owner(behave)
    config = {"bot_mode": {"turn_timeout_seconds": 1 if timed_out else 120, "turn_wait_seconds": 2}}
    gw = start_gateway(gateways, root, RecordingRunner(), config=config)
    gw.attach_live_owner("bob", owner)
    try:
        slow = send_dm(gw, "slow")
        assert entered.wait(10)
        if timed_out:
            assert gw.wait_outcome(slow, timeout=30)["status"] == "ambiguous"
        behind = send_dm(gw, "crash here")
        out = gw.wait_outcome(slow, timeout=30)
        assert out["status"] == "ambiguous", out
        assert json.loads(mailbox_file(root, slow).read_text())["status"] == "ambiguous"
        waited = gw.wait_outcome(behind, timeout=30)
        assert crashed.is_set()
        assert (waited["status"], waited["reason"]) == ("failed", "target_busy"), waited
        assert owner.bodies() == ["slow"], "a DM was handed to the owner beside its running turn"
    finally:
        release.set()
    assert returned.wait(10)
    after = send_dm(gw, "after it returns")
    assert gw.wait_outcome(after, timeout=30)["reply"] == "owner: after it returns"
    assert owner.bodies() == ["slow", "after it returns"]
    assert json.loads(mailbox_file(root, slow).read_text())["status"] == "ambiguous", "the late answer won"


class InlineRunner(RecordingRunner):
    """A runner whose turns never block (``blocking = False``): they run on the ProfileActor's own thread."""

    blocking = False

    def run_turn(self, turn: Turn) -> Any:
        return self(turn)


def test_an_inline_turn_crash_after_an_owner_handoff_does_not_lock_the_bot_out(
    root: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (review): ``ProfileActor.handed`` was set for worker turns only and never cleared, so after one
    owner handoff an inline turn (a non-blocking runner, owner detached) whose ProfileActor crashed was salvaged as
    an owner's turn still running (``owner_busy``): every later DM of the bot failed ``target_busy`` behind a turn
    nobody ran. Now ``handed`` describes the running turn only; the DMs after the crash run."""
    from hermes_actors.local import profile_actor

    real, crashed = profile_actor.outcome_of_turn, threading.Event()

    def crash_once(delivery: Delivery, result: Any) -> Any:
        if "crash here" in delivery.content and not crashed.is_set():
            crashed.set()
            raise RuntimeError("injected: a bug in the ProfileActor while it settles a turn")
        return real(delivery, result)

    monkeypatch.setattr(profile_actor, "outcome_of_turn", crash_once)
    runner = InlineRunner()
    gw = start_gateway(gateways, root, runner, config={"bot_mode": {"turn_wait_seconds": 2}})
    gw.attach_live_owner("bob", Owner())
    handed = send_dm(gw, "to the owner")
    assert gw.wait_outcome(handed, timeout=10)["reply"] == "owner: to the owner"
    gw.detach_live_owner("bob")
    inline = send_dm(gw, "crash here")
    assert gw.wait_outcome(inline, timeout=10)["status"] == "ambiguous"
    assert crashed.is_set()
    for body in ("after the crash", "much later"):
        out = gw.wait_outcome(send_dm(gw, body), timeout=10)
        assert out["reply"] == f"ok: {body}", f"the bot stayed locked out after the crash: {out}"
    assert runner.bodies() == ["crash here", "after the crash", "much later"]


def test_a_stop_does_not_wait_for_an_owner_turn_that_already_timed_out(
    root: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (review): ``stop(timeout)`` waited its whole timeout for the worker stuck in a live owner's turn
    that had timed out (reported ``ambiguous``) long before. It returns at once now; the worker is a daemon thread
    left behind, and the owner's late answer does not replace the record."""
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()

    def behave(turn: Turn) -> str:
        entered.set()
        try:
            assert release.wait(60), "the test never released the owner"
            return "too late"
        finally:
            returned.set()

    gw = start_gateway(gateways, root, RecordingRunner(), config={"bot_mode": {"turn_timeout_seconds": 1}})
    gw.attach_live_owner("bob", Owner(behave))
    joins = watch_pool_joins(monkeypatch)
    try:
        key = send_dm(gw, "hang")
        assert gw.wait_outcome(key, timeout=30)["status"] == "ambiguous"
        waits: list[int] = []
        gw.stop(timeout=20, on_wait=lambda running, grace: waits.append(running))
        # Asserted as what the stop was willing to wait, not as how long it took (a loaded machine stretches that):
        # no running turn to wait for, and the workers closed without a join (the bug joined them for 20 s).
        assert waits == [], "the stop waited for a turn already settled"
        assert joins == [0.0], f"the stop joined the worker pool for {joins} s"
        assert not returned.is_set(), "the owner's turn is still stuck: the stop did not wait for it"
        stuck = [t for t in threading.enumerate() if t.name.startswith("turn-") and t.is_alive()]
        assert stuck and all(t.daemon for t in stuck), "the worker left behind must not keep the process alive"
    finally:
        release.set()
    assert returned.wait(10)
    await_condition(lambda: json.loads(mailbox_file(root, key).read_text())["status"] == "ambiguous", timeout=5,
                    message="the record stays ambiguous")


# ── the mailbox ─────────────────────────────────────────────────────────────


def _delivery(key: str) -> Delivery:
    return Delivery(key, "alice", "alice", "bob", "bob", "Message from 🤖 alice (@alice): again?", label="@bob")


def _make_turn(delivery: Delivery) -> Turn:
    return Turn(profile=delivery.target, content=delivery.content, delivery_id=delivery.delivery_id)


def test_a_handoff_journals_its_start_as_live_once_claimed_and_before_the_owner_is_called(root: Path) -> None:
    """Regression (hostile files): the ``started`` record was journaled before the claim and did not say the DM went
    to an owner, so a restart trusted the mailbox file (set back to ``queued`` by a writer of our uid) and handed the
    DM over again. Now it says ``live`` and is written once the record is ``claimed``, before the owner runs."""
    key = "c7" * 16
    home = root / "profiles" / "bob"
    order: list[Any] = []

    class Journal:
        def append_durably(self, entry: dict[str, Any], timeout: float = 30.0) -> None:
            order.append((entry, json.loads(mailbox_file(root, key).read_text())["status"]))

    owner = Owner(lambda turn: order.append("owner") or "answered")
    result = hand_to_owner(_delivery(key), owner=as_runner(owner), home=home, make_turn=_make_turn,
                           journal=Journal())
    assert result.reply == "answered"
    assert order == [({"t": "started", "id": key, "attempt": 1, "live": True}, "claimed"), "owner"]


def test_a_handoff_whose_start_cannot_be_journaled_never_reaches_the_owner_and_is_recorded_failed(
    root: Path,
) -> None:
    key = "c8" * 16

    class Refusing:
        def append_durably(self, entry: dict[str, Any], timeout: float = 30.0) -> None:
            raise StoreError(28, "No space left on device")

    owner = Owner()
    result = hand_to_owner(_delivery(key), owner=as_runner(owner), home=root / "profiles" / "bob",
                           make_turn=_make_turn, journal=Refusing())
    assert (result.reply, result.reason) == (None, "runtime_offline")
    assert result.error.startswith("Recording the turn durably failed") and "NOT delivered" in result.error
    assert owner.turns == []
    assert json.loads(mailbox_file(root, key).read_text())["status"] == "failed", "a replay never runs it"


def test_replaying_a_settled_delivery_returns_the_recorded_reply(root: Path) -> None:
    home = root / "profiles" / "bob"
    key = "ab" * 16
    write_record(mailbox_file(root, key), record(key, "settled", reply="the recorded reply"))
    owner = Owner()
    result = hand_to_owner(_delivery(key), owner=as_runner(owner), home=home, make_turn=_make_turn, journal=None)
    assert result.reply == "the recorded reply" and not result.ambiguous
    assert owner.turns == [], "a replay must not run the owner again"
    assert json.loads(mailbox_file(root, key).read_text())["status"] == "settled"


@pytest.mark.parametrize(
    ("state", "fields", "expect"),
    [
        ("claimed", {}, "ambiguous"),
        ("ambiguous", {"error": "owner vanished"}, "ambiguous"),
        ("failed", {"error": "quota gone", "reason": "provider_quota_limit"}, "failed"),
        ("cancelled", {}, "cancelled"),
    ],
)
def test_replaying_other_recorded_states_never_runs_the_owner(
    root: Path, state: str, fields: dict[str, str], expect: str
) -> None:
    home = root / "profiles" / "bob"
    key = "cd" * 16
    write_record(mailbox_file(root, key), record(key, state, **fields))
    owner = Owner()
    result = hand_to_owner(_delivery(key), owner=as_runner(owner), home=home, make_turn=_make_turn, journal=None)
    assert owner.turns == []
    assert result.reply is None
    if expect == "ambiguous":
        assert result.ambiguous
    elif expect == "failed":
        assert not result.ambiguous and result.reason == "provider_quota_limit" and result.error == "quota gone"
    else:
        assert result.reason == "cancelled" and not result.ambiguous


@pytest.mark.parametrize(("fields", "reason"), [
    ({"error": "connection lost after sending", "reason": "provider_server_error"}, "provider_server_error"),
    ({"error": "owner vanished"}, "unknown"),
], ids=["owner-raised-ambiguous", "no-reason"])
def test_replaying_an_ambiguous_record_keeps_its_reason(root: Path, fields: dict[str, str], reason: str) -> None:
    """An owner's ``TurnFailed(..., ambiguous=True)`` is recorded ``ambiguous`` with its reason: a replay reports
    the reason the sender was first told, not ``unknown``."""
    key = "ce" * 16
    write_record(mailbox_file(root, key), record(key, "ambiguous", **fields))
    owner = Owner()
    result = hand_to_owner(_delivery(key), owner=as_runner(owner), home=root / "profiles" / "bob",
                           make_turn=_make_turn, journal=None)
    assert (result.reply, result.ambiguous, result.reason, result.error) == (None, True, reason, fields["error"])
    assert owner.turns == []


def test_a_record_carries_its_state_under_the_seeds_key_and_the_one_earlier_versions_read(root: Path) -> None:
    home = root / "profiles" / "bob"
    key = "fa" * 16
    result = hand_to_owner(_delivery(key), owner=as_runner(Owner()), home=home, make_turn=_make_turn, journal=None)
    assert result.reply is not None
    saved = json.loads(mailbox_file(root, key).read_text())
    assert saved["status"] == saved["state"] == "settled"  # a rollback to an earlier version still replays it


@pytest.mark.parametrize("key_name", ["status", "state"])
def test_a_settled_record_under_the_seeds_key_or_our_earlier_one_is_replayed_not_run(
    root: Path, key_name: str
) -> None:
    """The mailbox record's state is under ``status``, the key the seed's readers use (``record["status"]``);
    a record an earlier hermes-actors wrote under ``state`` still replays instead of being moved aside."""
    home = root / "profiles" / "bob"
    key = "ef" * 16
    written = record(key, "settled", reply="from before")
    written[key_name] = written.pop("status")
    write_record(mailbox_file(root, key), written)
    owner = Owner()
    result = hand_to_owner(_delivery(key), owner=as_runner(owner), home=home, make_turn=_make_turn, journal=None)
    assert owner.turns == [] and result.reply == "from before"


def test_replaying_through_a_gateway_with_the_owner_attached_is_a_no_op(root: Path, gateways: list[Gateway]) -> None:
    """The same delivery id handed over twice (e.g. a replayed Deliver) runs the owner once."""
    runner, owner = RecordingRunner(), Owner()
    gw = start_gateway(gateways, root, runner)
    gw.attach_live_owner("bob", owner)
    key = send_dm(gw, "once")
    assert gw.wait_outcome(key, timeout=10)["reply"] == "owner: once"
    home = root / "profiles" / "bob"
    result = hand_to_owner(_delivery(key), owner=as_runner(owner), home=home, make_turn=_make_turn, journal=None)
    assert result.reply == "owner: once"
    assert owner.bodies() == ["once"]


def test_a_mailbox_file_of_another_uid_is_moved_aside_and_not_trusted(root: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown a file to another uid")
    home = root / "profiles" / "bob"
    key = "ef" * 16
    path = mailbox_file(root, key)
    write_record(path, record(key, "settled", reply="forged reply"))
    os.chown(path, 65534, 65534)
    owner = Owner(lambda turn: "the real reply")
    result = hand_to_owner(_delivery(key), owner=as_runner(owner), home=home, make_turn=_make_turn, journal=None)
    assert result.reply == "the real reply", "the forged record must not be trusted"
    assert len(owner.turns) == 1
    quarantined = list((path.parent / ".quarantine").iterdir())
    assert len(quarantined) == 1 and "forged reply" in quarantined[0].read_text()
    assert quarantined[0].stat().st_uid == 65534
    info = os.stat(path)
    assert info.st_uid == os.geteuid()
    assert json.loads(path.read_text())["reply"] == "the real reply"


def test_a_symlinked_runtime_dir_is_refused_and_nothing_is_written_through_it(
    root: Path, gateways: list[Gateway], tmp_path: Path
) -> None:
    """``<home>/runtime`` swapped for a link: only the last component was checked, so the mailbox records
    landed in the linked directory outside the root. Now the DM fails before the owner sees it, nothing written."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "profiles" / "bob" / "runtime").symlink_to(outside, target_is_directory=True)
    runner, owner = RecordingRunner(), Owner()
    gw = start_gateway(gateways, root, runner)
    gw.attach_live_owner("bob", owner)
    out = gw.wait_outcome(send_dm(gw, "through the link?"), timeout=10)
    assert (out["status"], out["reason"]) == ("failed", "runtime_offline"), out
    assert "runtime is a symlink" in out["error"] and "NOT delivered" in out["error"], out
    assert owner.turns == [] and runner.entered == []
    assert list(outside.rglob("*")) == []


def _tree(top: Path) -> dict[str, tuple[int, int | None]]:
    """Every entry below ``top`` with its mtime, and a file's atime (a directory's is this listing's): a file read
    there shows in its atime, anything written in an mtime."""
    tree: dict[str, tuple[int, int | None]] = {}
    for path in [top, *top.rglob("*")]:
        info = os.lstat(path)
        tree[str(path.relative_to(top))] = (info.st_mtime_ns, None if stat.S_ISDIR(info.st_mode) else info.st_atime_ns)
    return tree


def _age(top: Path) -> None:
    """Old times on everything below ``top``: a read updates a file's atime then (relatime), a write its mtime."""
    for path in [*top.rglob("*"), top]:
        os.utime(path, ns=(10**15, 10**15), follow_symlinks=False)


def _swap_for_outside_copy(directory: Path, outside: Path) -> Path:
    """Copy ``directory`` outside the root and put a symlink to the copy in its place; the real one is kept aside."""
    copy = outside / directory.name
    shutil.copytree(directory, copy, symlinks=True)
    _age(outside)
    aside = directory.with_name(directory.name + ".real")
    directory.rename(aside)
    directory.symlink_to(copy, target_is_directory=True)
    return aside


@pytest.mark.parametrize("swapped", ["runtime", "runtime/bot_live_delivery"])
def test_a_mailbox_directory_swapped_for_a_symlink_is_never_read_or_written_through(
    root: Path, tmp_path: Path, swapped: str
) -> None:
    """Regression (hostile files): ``read`` opened the record by its path and ``transition`` wrote it by its path,
    so with ``runtime/`` (or the mailbox) swapped for a link to a copy outside the root, the record was read there
    and written there. Now each goes through the walk from the profile home: refused, nothing outside touched."""
    home = root / "profiles" / "bob"
    box, key = LiveMailbox(home), "a1" * 16
    box.admit(key)
    box.transition(key, "claimed")
    outside = tmp_path / "outside"
    outside.mkdir()
    _swap_for_outside_copy(home / swapped, outside)
    before = _tree(outside)
    with pytest.raises(HostileFileError, match=f"{swapped} is a symlink"):
        box.read(key)
    with pytest.raises(HostileFileError, match=f"{swapped} is a symlink"):
        box.advance(key, "settled", reply="written outside?")
    with pytest.raises(HostileFileError, match=f"{swapped} is a symlink"):
        box.transition(key, "settled", reply="or here?")
    assert _tree(outside) == before, "a mailbox file outside the root was read or written"


@pytest.mark.parametrize("swapped", ["runtime", "runtime/bot_live_delivery"])
def test_a_mailbox_directory_swapped_during_the_owners_turn_gets_no_record_outside_and_is_logged(
    root: Path, gateways: list[Gateway], tmp_path: Path, logs: Any, swapped: str
) -> None:
    """Regression (hostile files, ``attack2.py`` ``swap_runtime_in_turn``): with ``runtime/`` swapped for a link to a
    copy outside the root while the owner had the DM, its ``settled`` record was written outside, nothing logged, and
    the real record stayed ``claimed``. Now the write is refused and logged; the sender still gets the owner's reply."""
    home, outside = root / "profiles" / "bob", tmp_path / "outside"
    outside.mkdir()
    aside: list[Path] = []

    def swap_then_answer(turn: Turn) -> str:
        aside.append(_swap_for_outside_copy(home / swapped, outside))
        return "answered"

    gw = start_gateway(gateways, root, RecordingRunner())
    gw.attach_live_owner("bob", Owner(swap_then_answer))
    key = send_dm(gw, "swap under me")
    out = gw.wait_outcome(key, timeout=10)
    assert out["reply"] == "answered", out
    await_condition(lambda: logs.matching("could not record", key), timeout=5, message="the refused write is logged")
    (line,) = logs.matching("could not record", key)
    assert "as settled" in line
    tree = _tree(outside)
    assert tree == {name: (10**15, None if atime is None else 10**15) for name, (_, atime) in tree.items()}, \
        "a file outside the root was read or written after the swap"
    copied = outside / ("bot_live_delivery" if swapped.endswith("delivery") else "runtime/bot_live_delivery")
    assert json.loads((copied / f"{key}.json").read_text())["status"] == "claimed", "nothing was written outside"
    real = aside[0] if swapped.endswith("delivery") else aside[0] / "bot_live_delivery"
    assert json.loads((real / f"{key}.json").read_text())["status"] == "claimed"


@pytest.mark.parametrize(("entry", "kind"), [("", "symlink"), ("", "file"), (".tmp", "symlink"), (".tmp", "file")])
def test_a_swapped_mailbox_directory_is_quarantined_and_made_again_at_the_next_admission(
    root: Path, gateways: list[Gateway], tmp_path: Path, logs: Any, entry: str, kind: str
) -> None:
    """Regression (hostile files, ``attack2.py`` carol): with ``bot_live_delivery/`` swapped for a symlink, every DM
    failed ``runtime_offline`` with no WARNING, and nothing put the directory back. Now the next admission moves the
    swapped entry (as is) into the mailbox's quarantine, makes the directory again, and the DM reaches the owner."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_text("outside the root")
    _age(outside)
    owner = Owner()
    gw = start_gateway(gateways, root, RecordingRunner())
    gw.attach_live_owner("bob", owner)
    assert gw.wait_outcome(send_dm(gw, "before"), timeout=10)["reply"] == "owner: before"
    box = root / "profiles" / "bob" / "runtime" / "bot_live_delivery"
    swapped = box / entry if entry else box
    shutil.rmtree(swapped)
    if kind == "symlink":
        swapped.symlink_to(outside, target_is_directory=True)
    else:
        swapped.write_text("not a directory")
    out = gw.wait_outcome(send_dm(gw, "after the swap"), timeout=10)
    assert (out["status"], out["reply"]) == ("replied", "owner: after the swap"), out
    assert owner.bodies() == ["before", "after the swap"]
    assert stat.S_ISDIR(os.lstat(swapped).st_mode) and stat.S_IMODE(os.lstat(swapped).st_mode) == 0o700
    (moved,) = (box / ".quarantine").glob(f"{swapped.name}.*.quarantined")
    assert stat.S_ISLNK(os.lstat(moved).st_mode) == (kind == "symlink"), "the entry itself was moved, not followed"
    assert logs.matching("quarantined", str(swapped)), logs.lines
    assert sorted(p.name for p in outside.iterdir()) == ["canary.txt"]
    assert all(mtime == 10**15 for mtime, _ in _tree(outside).values())


def test_a_mailbox_that_cannot_be_put_back_is_named_in_one_warning_while_it_lasts(
    root: Path, gateways: list[Gateway], tmp_path: Path, logs: Any, log_records: list[Any]
) -> None:
    """``runtime/`` swapped for a symlink is the home's to put back: each DM fails ``runtime_offline`` (NOT delivered),
    and the mailbox directory is named in one WARNING (before: none), then in an INFO line once it works again."""
    outside = tmp_path / "outside"
    outside.mkdir()
    owner = Owner()
    gw = start_gateway(gateways, root, RecordingRunner())
    gw.attach_live_owner("bob", owner)
    assert gw.wait_outcome(send_dm(gw, "before"), timeout=10)["reply"] == "owner: before"
    runtime = root / "profiles" / "bob" / "runtime"
    runtime.rename(runtime.with_name("runtime.real"))
    runtime.symlink_to(outside, target_is_directory=True)
    for n in range(3):
        out = gw.wait_outcome(send_dm(gw, f"refused {n}"), timeout=10)
        assert (out["status"], out["reason"]) == ("failed", "runtime_offline") and "NOT delivered" in out["error"], out
    box = runtime / "bot_live_delivery"
    (line,) = logs.matching(f"live mailbox: {box} cannot be used")
    assert "runtime is a symlink" in line, line
    runtime.unlink()
    runtime.with_name("runtime.real").rename(runtime)
    assert gw.wait_outcome(send_dm(gw, "back"), timeout=10)["reply"] == "owner: back"
    assert owner.bodies() == ["before", "back"]
    assert [r["message"] for r in log_records if f"{box} is usable again" in r["message"]]
    assert list(outside.iterdir()) == []


def test_mailbox_records_go_queued_claimed_settled_on_disk(
    root: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    states: list[str] = []
    real_admit, real_transition = LiveMailbox.admit, LiveMailbox.transition

    def on_disk(box: LiveMailbox, key: str) -> str:
        return str(json.loads((box.directory / f"{key}.json").read_text())["status"])

    def admit(self: LiveMailbox, key: str) -> dict[str, Any]:
        out = real_admit(self, key)
        states.append(on_disk(self, key))
        return out

    def transition(self: LiveMailbox, key: str, state: str, **fields: str) -> dict[str, Any]:
        out = real_transition(self, key, state, **fields)
        states.append(on_disk(self, key))
        return out

    monkeypatch.setattr(LiveMailbox, "admit", admit)
    monkeypatch.setattr(LiveMailbox, "transition", transition)
    seen_during_turn: list[str] = []

    def behave(turn: Turn) -> str:
        seen_during_turn.append(json.loads(mailbox_file(root, turn.delivery_id).read_text())["status"])
        return "settled it"

    gw = start_gateway(gateways, root, RecordingRunner())
    gw.attach_live_owner("bob", Owner(behave))
    key = send_dm(gw, "track me")
    assert gw.wait_outcome(key, timeout=10)["reply"] == "settled it"
    await_condition(lambda: len(states) >= 3, timeout=5, message="three mailbox writes")
    assert states == ["queued", "claimed", "settled"]
    assert seen_during_turn == ["claimed"]
    path = mailbox_file(root, key)
    final = json.loads(path.read_text())
    assert final["delivery_id"] == key and final["status"] == "settled"
    assert final["reply"] == "settled it" and final["error"] == "" and final["reason"] == ""
    assert isinstance(final["at"], int)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert not list((path.parent / ".tmp").iterdir()), "no temp file left behind"


def test_an_owner_that_is_no_runner_is_refused_naming_the_owner(root: Path, gateways: list[Gateway]) -> None:
    gw = start_gateway(gateways, root, RecordingRunner())
    with pytest.raises(TypeError, match=r"^owner must be an object with run_turn\(turn\) -> str .* got object$"):
        gw.attach_live_owner("bob", object())
