"""Crash matrix: a durable gateway SIGKILLed at each named point, then restarted on the same root.

Each case runs ``tests/crash_gateway.py send`` in a child with
``HERMES_ACTORS_CRASH_AT=<point>`` (or a runner that SIGKILLs its own process
mid-turn), then a second child that starts a Gateway on the same root and
waits the delivery's outcome. The expected outcome and the number of times the
runner was entered (``turns.log``) are exact for every point.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from crash_procs import journal_ids, run_child, turns_logged
from roots import make_root

from hermes_actors.core.recovery import stopped_mid_turn_text
from hermes_actors.faults import CRASH_POINTS
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.relay_roster import normalize_roster_row

# case → (crash point env, runner self-kill, expected status, turns, recovered counter that moves)
MATRIX = {
    "after-journal-before-ack": ("after-journal-before-ack", False, "replied", 1, "reoffered"),
    "after-ack-before-turn": ("after-ack-before-turn", False, "replied", 1, "reoffered"),
    "mid-turn": ("mid-turn", False, "ambiguous", 0, "ambiguous"),
    "runner-self-kill": (None, True, "ambiguous", 1, "ambiguous"),
    "after-turn-before-outcome": ("after-turn-before-outcome", False, "ambiguous", 1, "ambiguous"),
    "after-outcome-before-delivered": ("after-outcome-before-delivered", False, "replied", 1, "redelivered"),
}


def test_the_matrix_covers_every_named_crash_point() -> None:
    assert {point for point, *_ in MATRIX.values() if point} == set(CRASH_POINTS)


@pytest.mark.parametrize("case", list(MATRIX))
def test_crash_then_restart(tmp_path: Path, case: str) -> None:
    point, selfkill, status, turns, counter = MATRIX[case]
    root = make_root(tmp_path)

    first = run_child(root, "send", *(["--selfkill"] if selfkill else []), crash_at=point)
    assert first.killed, f"the child was not SIGKILLed (rc={first.returncode}): {first.stderr[-2000:]}"
    assert not first.of("outcome"), "the crash came before any outcome could be waited"
    accepted = journal_ids(root)
    assert len(accepted) == 1, f"exactly one DM was journaled: {accepted}"
    key = accepted[0]
    acks = first.of("ack")
    if case == "after-journal-before-ack":
        assert not acks, "the crash is between the journal write and the ack: no ack reached the sender"
    if acks:
        assert acks[0]["delivery_id"] == key
    ran_before_crash = case in ("runner-self-kill", "after-turn-before-outcome", "after-outcome-before-delivered")
    assert turns_logged(root) == ([key] if ran_before_crash else []), "runner entries before the crash"

    second = run_child(root, "recover", "--notify", key)
    assert second.returncode == 0, second.stderr[-2000:]
    (recovered,) = second.of("recovered")
    counts = recovered["counts"]
    assert counts[counter] == 1, counts
    assert sum(v for k, v in counts.items() if k != "known") == 1, counts
    (event,) = second.of("outcome")  # wait_outcome answers for a delivery accepted before the restart
    outcome = {k: v for k, v in event.items() if k != "event"}
    assert outcome["delivery_id"] == key
    assert outcome["status"] == status, outcome
    if status == "ambiguous":
        assert "do not resend" in outcome["error"] and "do not resend" in outcome["text"]
        assert outcome["retryable"] is False
    else:
        assert outcome["reply"] == f"reply to {key}"
    (subscribed,) = second.of("subscribed")  # a subscriber registered before start() saw it too
    assert subscribed["outcomes"] == [{"kind": "dm", **outcome}]  # a subscriber event also says what it is
    assert turns_logged(root) == [key] * turns, f"{case}: runner entries {turns_logged(root)}"

    # A third start knows the settled outcome and neither re-runs nor re-reports it.
    third = run_child(root, "recover", key)
    assert third.returncode == 0, third.stderr[-2000:]
    assert third.of("recovered")[0]["counts"] == {"reoffered": 0, "ambiguous": 0, "redelivered": 0, "known": 1}
    assert [{k: v for k, v in e.items() if k != "event"} for e in third.of("outcome")] == [outcome]
    assert third.of("subscribed")[0]["outcomes"] == []
    assert turns_logged(root) == [key] * turns


@pytest.mark.parametrize(("via", "apart"), [
    # review: a CLI turn on a root with warm turns configured was told, after a kill -9 of its host, that "the
    # hermes gateway ran it in its own process": recovery could not tell how the turn had run
    ("cli", False),
    ("warm", True),
    (None, True),  # a runner that does not say (an older journal too): worded by its runs_apart, as before
])
def test_a_turn_a_killed_host_left_is_worded_by_how_it_ran(tmp_path: Path, via: str | None, apart: bool) -> None:
    root = make_root(tmp_path)
    first = run_child(root, "send", "--selfkill", *([f"--via={via}"] if via else []))
    assert first.killed, f"the child was not SIGKILLed (rc={first.returncode}): {first.stderr[-2000:]}"
    (key,) = journal_ids(root)
    assert turns_logged(root) == [key]  # it died in the runner, after saying how the turn runs

    second = run_child(root, "recover", "--apart", key)  # the restarted host's runner says: warm, apart
    assert second.returncode == 0, second.stderr[-2000:]
    (event,) = second.of("outcome")
    assert (event["status"], event["error"]) == (
        "ambiguous", f"{stopped_mid_turn_text(apart)} The message may have been delivered — do not resend."), event


# ── a relayed-in DM (the Desktop's relay_deliver) killed mid-way, then retried after the restart ───────────────

# case → (crash point env, runner self-kill, the retry's answer, runner entries in all)
DELIVER_MATRIX = {
    "after-ack-before-turn": ("after-ack-before-turn", False, "replied", 1),  # never started: the retry runs it
    "mid-turn": ("mid-turn", False, "ambiguous", 0),  # its start is on disk: may have run, never runs again
    "runner-self-kill": (None, True, "ambiguous", 1),
    "after-turn-before-outcome": ("after-turn-before-outcome", False, "ambiguous", 1),
}


@pytest.mark.parametrize("case", list(DELIVER_MATRIX))
def test_a_relayed_in_dm_killed_mid_way_is_never_run_twice_by_the_retry_after_the_restart(
    tmp_path: Path, case: str
) -> None:
    """Review (seed interop s8b): a Desktop whose ``relay_deliver`` was cut by our gateway's death retries it
    once the gateway is back. Before, the restarted gateway knew nothing of the envelope and ran its turn again;
    now one that had started is answered ``ambiguous`` (do not resend), as a local DM is, and every later retry
    gets the same answer without a turn."""
    point, selfkill, answer, turns = DELIVER_MATRIX[case]
    root = make_root(tmp_path)
    target = normalize_roster_row({"profile": "bob", "handle": "bob", "connection_id": "mini"})
    assert target is not None
    envelope = rp.make_envelope(target=target, message="Message from 🤖 zed (@zed): hi", sender_profile="zed",
                                sender_handle="zed", now=time.time())
    key = envelope["id"]
    envelope_file = tmp_path / "envelope.json"
    envelope_file.write_text(json.dumps(envelope))

    first = run_child(root, "deliver", str(envelope_file), *(["--selfkill"] if selfkill else []), crash_at=point)
    assert first.killed, f"the child was not SIGKILLed (rc={first.returncode}): {first.stderr[-2000:]}"
    assert not first.of("delivered"), "the crash came before the call was answered"
    ran_before_crash = case in ("runner-self-kill", "after-turn-before-outcome")
    assert turns_logged(root) == ([key] if ran_before_crash else []), "runner entries before the crash"

    second = run_child(root, "deliver", str(envelope_file))  # the Desktop retries the same envelope
    assert second.returncode == 0, second.stderr[-2000:]
    (retried,) = second.of("delivered")
    fields = {k: v for k, v in retried.items() if k != "event"}
    if answer == "ambiguous":
        assert fields["reply"] == "" and fields["error"].endswith("do not resend."), fields
    else:
        assert fields == {"reply": f"reply to {key}", "error": "", "reason": ""}
    assert turns_logged(root) == [key] * turns, f"{case}: runner entries {turns_logged(root)}"

    third = run_child(root, "deliver", str(envelope_file))  # and again: answered as before, never run
    assert third.returncode == 0, third.stderr[-2000:]
    assert [{k: v for k, v in e.items() if k != "event"} for e in third.of("delivered")] == [fields]
    assert turns_logged(root) == [key] * turns


def test_a_relayed_in_envelope_posted_again_while_its_gateway_was_down_runs_no_second_turn(tmp_path: Path) -> None:
    """Review (diff review of 01453af): gateway ``mini`` is killed mid-turn of an envelope it took from the hub's
    ``inbox/``; the hub posts the same envelope to ``inbox/`` again while ``mini`` is down. Before, the restart's
    relay drained ``inbox/`` before the journal's verdict on the DM (started, never finished) reached the
    Dispatcher: the bot ran a second turn, and a later retry was answered with its reply while the sender had
    been told ``ambiguous``. Now the restart knows the verdict before any transport offers the envelope: the
    re-posted copy and every later retry are answered ``ambiguous`` and no second turn runs."""
    from hermes_actors.relay.strays import ensure_relay_directories
    from hermes_actors.store.relay_inbox import InboxPaths, post_to_inbox

    root = make_root(tmp_path)
    paths = InboxPaths.from_root(root)
    ensure_relay_directories(paths)  # the hub's tree, before mini first starts
    target = normalize_roster_row({"profile": "bob", "handle": "bob", "connection_id": "mini"})
    assert target is not None
    envelope = rp.make_envelope(target=target, message="Message from 🤖 zed (@zed): hi", sender_profile="zed",
                                sender_handle="zed", now=time.time())
    key = envelope["id"]
    envelope_file = tmp_path / "envelope.json"
    envelope_file.write_text(json.dumps(envelope))
    post_to_inbox(paths, envelope, "alpha")

    first = run_child(root, "drain", key, "--selfkill")  # the runner kills its gateway mid-turn
    assert first.killed, f"the child was not SIGKILLed (rc={first.returncode}): {first.stderr[-2000:]}"
    assert turns_logged(root) == [key]
    post_to_inbox(paths, envelope, "alpha")  # the hub posts it again while mini is down

    second = run_child(root, "deliver", str(envelope_file))  # restart; then the Desktop retries it too
    assert second.returncode == 0, second.stderr[-2000:]
    (retried,) = second.of("delivered")  # answered once the re-posted copy's fate is settled (same envelope id)
    assert retried["reply"] == "" and retried["error"].endswith("do not resend."), retried
    assert turns_logged(root) == [key], "the bot ran the relayed-in DM a second time"
    answer = json.loads((paths.delivered / f"{key}.json").read_text())
    assert answer["reply"] == "" and answer["error"].endswith("do not resend."), answer
    assert not list(paths.inbox.iterdir()), "the re-posted copy was taken and answered"


@pytest.mark.parametrize("where", ["shelf", "legacy", "memory"])
def test_a_relayed_in_turn_whose_outcome_was_journaled_before_a_kill_is_answered_with_it_after_the_restart(
    tmp_path: Path, where: str
) -> None:
    """Review: gateway ``mini`` ran a relayed-in turn to its end and journaled its outcome (``finished``), then was
    killed before its relay wrote the reply to ``delivered/``. Before, the restart answered the envelope it adopted
    with its start mark ``ambiguous`` ("do not resend") at once, though the journal held the real reply. Now the
    Dispatcher answers it with the journal's outcome (the reply text), as a reclaimed Redis entry is; no turn runs
    again. A flat ``taken/`` file of an older version (no start mark) is answered so too; without a journal
    (``durable=False``) it is ``ambiguous`` as before."""
    from hermes_actors.relay.restart import AMBIGUOUS_WHY
    from hermes_actors.relay.strays import ensure_relay_directories
    from hermes_actors.store.relay_inbox import InboxPaths, post_to_inbox

    root = make_root(tmp_path)
    paths = InboxPaths.from_root(root)
    ensure_relay_directories(paths)  # the hub's tree, before mini first starts
    target = normalize_roster_row({"profile": "bob", "handle": "bob", "connection_id": "mini"})
    assert target is not None
    envelope = rp.make_envelope(target=target, message="Message from 🤖 zed (@zed): hi", sender_profile="zed",
                                sender_handle="zed", now=time.time())
    key = envelope["id"]
    post_to_inbox(paths, envelope, "alpha")
    memory = ["--memory"] if where == "memory" else []

    first = run_child(root, "drain", key, "--kill-before-reply", *memory)
    assert first.killed, f"the child was not SIGKILLed (rc={first.returncode}): {first.stderr[-2000:]}"
    assert turns_logged(root) == [key]
    assert not (paths.delivered / f"{key}.json").exists(), "killed before the reply was written"
    assert (paths.started / f"{key}.json").exists(), "the turn's start mark is left"
    assert journal_ids(root, "finished") == ([] if memory else [key])
    if where == "legacy":  # as a version without shelves left it: a flat file in taken/, no start mark
        (shelved,) = paths.taken_parent.glob(f"s-*/{key}.json")
        shelved.rename(paths.taken_parent / f"{key}.json")
        (paths.started / f"{key}.json").unlink()

    second = run_child(root, "drain", key, *memory)  # the restart on the same root
    assert second.returncode == 0, second.stderr[-2000:]
    (answered,) = second.of("delivered")
    fields = {k: answered[k] for k in ("reply", "error", "reason")}
    if memory:
        assert fields == {"reply": "", "reason": "unknown",
                          "error": f"{AMBIGUOUS_WHY} The message may have been delivered — do not resend."}, fields
    else:
        assert fields == {"reply": f"reply to {key}", "error": "", "reason": ""}, fields
    assert answered["reply_connection"] == "alpha"
    assert turns_logged(root) == [key], "the turn ran again"
    assert list(paths.started.iterdir()) == [] and list(paths.taken_parent.rglob(f"{key}.json")) == []
