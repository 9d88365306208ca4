"""The seed's relay RPC operations on the Gateway: roster sync, outbox drain, deliver, reply."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from roots import RecordingRunner, body_of, held_on, make_root

from actors.testkit import await_condition
from hermes_actors import Gateway, TurnFailed, ValidationError
from hermes_actors.store import relay_files as rf
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.relay_paths import RelayPaths
from hermes_actors.store.relay_roster import normalize_roster_row


def test_a_desktop_style_round_trip_through_the_rpc_methods(tmp_path: Path) -> None:
    sender_root, target_root = make_root(tmp_path / "a"), make_root(tmp_path / "b")
    runner = RecordingRunner(lambda turn: "from bob over the relay")
    with Gateway(sender_root, runner=lambda t: "x", durable=False) as sender, \
            Gateway(target_root, runner=runner, durable=False) as target:
        kept = sender.relay_sync_roster([
            {"profile": "bob", "handle": "bob", "connection_id": "mini", "online": True},
            {"profile": "../evil", "connection_id": "mini"},  # refused by the seed's normalization
            {"profile": "carol", "connection_id": "mini", "online": "yes"},  # online dropped: not a bool
        ])
        assert kept == 2
        ack = sender.message_agent(sender="alice", target="bob@mini", message="hello across")
        assert ack["status"] == "queued"
        drained = sender.relay_drain_outbox()
        assert [e["id"] for e in drained] == [ack["delivery_id"]]
        assert sender.relay_drain_outbox() == []  # claimed by rename: a second drain gets nothing
        fields = target.relay_deliver(drained[0], timeout=10)
        assert fields == {"reply": "from bob over the relay", "error": "", "reason": ""}
        assert target.relay_deliver(drained[0], timeout=10) == fields  # idempotent: no second turn
        assert len(runner.entered) == 1
        assert sender.relay_reply(ack["delivery_id"], **fields) is True
        assert sender.relay_reply(ack["delivery_id"], error="late") is False  # the first reply wins
        outcome = sender.wait_outcome(ack["delivery_id"], timeout=10)
    assert outcome["status"] == "replied"
    assert outcome["text"] == "Reply from @bob on mini: from bob over the relay"


@pytest.mark.parametrize("rows", [None, {"profile": "bob", "connection_id": "mini"}, "[]", ()],
                         ids=["None", "a row alone", "str", "tuple"])
def test_relay_sync_roster_refuses_rows_that_are_no_list_and_keeps_the_roster(tmp_path: Path, rows: Any) -> None:
    """Regression (review apismall): ``relay_sync_roster(None)`` (anything but a list) returned 0 quietly and
    emptied ``roster.json``: every remote agent unreachable. Now it is refused naming the argument, before the
    roster is touched."""
    root = make_root(tmp_path / "a")
    with Gateway(root, runner=lambda t: "x", durable=False) as gw:
        assert gw.relay_sync_roster([{"profile": "bob", "connection_id": "mini"}]) == 1
        with pytest.raises(TypeError, match=r"relay_sync_roster rows must be the Desktop's agents list \(a list of"):
            gw.relay_sync_roster(rows)
        assert [row["profile"] for row in gw.roster() if row["connection_id"] == "mini"] == ["bob"]
        assert gw.relay_sync_roster([]) == 0  # an empty list empties it


def test_drain_expires_old_envelopes_and_reply_classifies_a_missing_reason(tmp_path: Path) -> None:
    root = make_root(tmp_path / "a")
    paths = RelayPaths.from_root(root).ensure()
    old = rp.make_envelope(target=normalize_roster_row({"profile": "bob", "connection_id": "mini"}),  # type: ignore[arg-type]
                           message="stale", sender_profile="alice", sender_handle="alice", now=time.time() - 3600)
    rf.enqueue_envelope(paths, old)
    with Gateway(root, runner=lambda t: "x", durable=False) as gw:
        assert gw.relay_drain_outbox() == []
        expired = rf.read_reply(paths, old["id"])
        assert expired is not None and expired["reason"] == "queued_expired"
        other = uuid.uuid4().hex
        assert gw.relay_reply(other, error="429 Too Many Requests") is True
        assert rf.read_reply(paths, other)["reason"] == "provider_rate_limit"  # type: ignore[index]
        with pytest.raises(ValidationError):
            gw.relay_reply("../../etc", reply="x")
        with pytest.raises(ValidationError):
            gw.relay_deliver({"id": "nope"})


def test_deliver_to_an_unknown_profile_answers_the_call_with_the_failure(tmp_path: Path) -> None:
    root = make_root(tmp_path / "b")
    target = normalize_roster_row({"profile": "nobody", "connection_id": "mini"})
    assert target is not None
    envelope = rp.make_envelope(target=target, message="hi", sender_profile="alice", sender_handle="alice",
                                now=time.time())
    runner = RecordingRunner(lambda turn: "never")
    with Gateway(root, runner=runner, durable=False) as gw:
        fields = gw.relay_deliver(envelope, timeout=10)
    assert fields["reply"] == "" and fields["reason"] == "unknown"
    assert fields["error"] == "No agent 'nobody' on this gateway; the message was NOT delivered."
    assert runner.entered == []


def _envelope_for(profile: str, message: str = "hi") -> dict[str, Any]:
    target = normalize_roster_row({"profile": profile, "handle": profile, "connection_id": "mini"})
    assert target is not None
    return rp.make_envelope(target=target, message=message, sender_profile="zed", sender_handle="zed",
                            now=time.time())


@pytest.mark.parametrize("behave", ["reply", "failure", "silence"])
def test_a_deliver_retried_after_a_restart_gets_the_first_runs_answer_and_runs_no_turn(
    tmp_path: Path, behave: str
) -> None:
    """Review (seed interop s8b): the Desktop retries a ``relay_deliver`` our restart cut. Before, the restarted
    gateway ran the turn again (a second turn, a second, different reply): only its memory deduplicated. Now the
    journal keeps the outcome of a relayed-in DM (durable, the default) and the retry gets it back."""
    root = make_root(tmp_path / "b")
    envelope = _envelope_for("bob")

    def turn_of(turn: Any) -> str:
        if behave == "failure":
            raise TurnFailed(f"insufficient_quota (run {len(runner.entered)})")  # never retried
        return "[SILENT]" if behave == "silence" else f"answer {len(runner.entered)}"

    runner = RecordingRunner(turn_of)
    with Gateway(root, runner=runner, connection_id="mini") as gw:
        first = gw.relay_deliver(dict(envelope), timeout=10)
    assert len(runner.entered) == 1
    with Gateway(root, runner=runner, connection_id="mini") as gw:
        again = gw.relay_deliver(dict(envelope), timeout=10)
        assert gw.relay_deliver(dict(envelope), timeout=10) == first  # and within the run, as before
    with Gateway(root, runner=runner, connection_id="mini") as gw:  # a second restart keeps it too
        third = gw.relay_deliver(dict(envelope), timeout=10)
    assert again == first and third == first
    assert len(runner.entered) == 1
    expected = {"reply": {"reply": "answer 1", "error": "", "reason": ""},
                "failure": {"reply": "", "error": "insufficient_quota (run 1)", "reason": "provider_quota_limit"},
                "silence": {"reply": "", "error": "", "reason": ""}}[behave]
    assert first == expected


def test_in_memory_a_deliver_is_deduplicated_only_while_its_gateway_runs(tmp_path: Path) -> None:
    """``durable=False`` keeps no journal: what docs/protocol.md says holds in memory (in-process only)."""
    root = make_root(tmp_path / "b")
    envelope = _envelope_for("bob")
    runner = RecordingRunner(lambda turn: "fine")
    with Gateway(root, runner=runner, connection_id="mini", durable=False) as gw:
        gw.relay_deliver(dict(envelope), timeout=10)
        gw.relay_deliver(dict(envelope), timeout=10)
    assert len(runner.entered) == 1
    with Gateway(root, runner=runner, connection_id="mini", durable=False) as gw:
        gw.relay_deliver(dict(envelope), timeout=10)
    assert len(runner.entered) == 2


@pytest.mark.parametrize(("timeout", "error"), [
    ("5", TypeError), (None, TypeError), (True, TypeError), (float("nan"), ValueError),
])
def test_deliver_refuses_a_bad_timeout_before_it_takes_the_envelope(tmp_path: Path, timeout: Any,
                                                                    error: type[Exception]) -> None:
    """Regression (review apisurface, p26.py): ``relay_deliver``'s timeout was not checked, and only used once the
    envelope was taken and its turn under way: '5' failed then (TypeError about float + str), None and NaN waited
    unbounded, inf raised OverflowError. Now it is checked as ``wait_outcome``'s is, before the envelope is taken."""
    root = make_root(tmp_path / "b")
    runner = RecordingRunner(lambda turn: f"ok: {body_of(turn.content)}")
    with Gateway(root, runner=runner, connection_id="mini", durable=False) as gw:
        with pytest.raises(error, match="relay_deliver timeout"):
            gw.relay_deliver(_envelope_for("bob", "refused"), timeout=timeout)
        # bob runs his turns in arrival order: had the refused envelope been taken, its turn would run first
        fields = gw.relay_deliver(_envelope_for("bob", "taken"), timeout=10)
        assert gw.relay_deliver(_envelope_for("bob", "endless"), timeout=float("inf"))["reply"] == "ok: endless"
    assert fields == {"reply": "ok: taken", "error": "", "reason": ""}
    assert runner.bodies() == ["taken", "endless"]


def test_a_deliver_the_stop_cancelled_before_its_turn_runs_on_the_retry_after_the_restart(tmp_path: Path) -> None:
    """``cancelled`` says the turn never ran (resending is safe): it is not what a retry after the restart gets."""
    root = make_root(tmp_path / "b")
    running, queued = _envelope_for("bob", "running"), _envelope_for("bob", "queued")
    release = threading.Event()
    runner = RecordingRunner(held_on("running", release))
    answers: dict[str, dict[str, str]] = {}
    gw = Gateway(root, runner=runner, connection_id="mini").start()
    try:
        calls = [threading.Thread(target=lambda e=e: answers.setdefault(e["id"], gw.relay_deliver(dict(e), timeout=20)))
                 for e in (running, queued)]
        calls[0].start()
        runner.wait_entered(1, timeout=10)
        calls[1].start()
        await_condition(lambda: gw.stats()["pending"] == 2, timeout=10, message="the second deliver queued")
        stopper = threading.Thread(target=gw.stop, kwargs={"timeout": 20})
        stopper.start()
        await_condition(lambda: queued["id"] in answers, timeout=10, message="the queued deliver answered")
    finally:
        release.set()
        stopper.join(timeout=30)
        for call in calls:
            call.join(timeout=30)
    assert answers[queued["id"]]["reason"] == "cancelled"
    assert answers[running["id"]] == {"reply": "ok: running", "error": "", "reason": ""}
    with Gateway(root, runner=runner, connection_id="mini") as gw:
        assert gw.relay_deliver(dict(queued), timeout=10) == {"reply": "ok: queued", "error": "", "reason": ""}
        assert gw.relay_deliver(dict(running), timeout=10) == answers[running["id"]]
    assert [body_of(t.content) for t in runner.entered] == ["running", "queued"]


def test_a_deliver_whose_turn_outlived_the_stop_is_answered_ambiguous_again_after_the_restart(tmp_path: Path) -> None:
    """A turn still running when the stop gave up on it is ``ambiguous`` (it may have reached its bot): the retry
    after the restart gets that answer again and runs nothing (before, it ran the turn a second time)."""
    root = make_root(tmp_path / "b")
    envelope = _envelope_for("bob", "slow")
    release = threading.Event()
    runner = RecordingRunner(held_on("slow", release))
    answers: list[dict[str, str]] = []
    gw = Gateway(root, runner=runner, connection_id="mini").start()
    call = threading.Thread(target=lambda: answers.append(gw.relay_deliver(dict(envelope), timeout=20)))
    try:
        call.start()
        runner.wait_entered(1, timeout=10)
        gw.stop(timeout=0.2)  # gives up on the running turn
        call.join(timeout=10)
        (first,) = answers
        assert first["reply"] == "" and first["error"].endswith("do not resend."), first
        with Gateway(root, runner=runner, connection_id="mini") as again:
            assert again.relay_deliver(dict(envelope), timeout=10) == first
    finally:
        release.set()
    assert len(runner.entered) == 1
