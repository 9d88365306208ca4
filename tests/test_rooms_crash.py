"""kill -9 during a room's round, then a restart on the same root: the round resumes, no finished member
turn runs again, no reply is posted twice, and the member killed mid-turn shows as interrupted."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from crash_procs import Child, child_env, parse_events
from roots import logged_turns, make_root

HELPER = Path(__file__).with_name("room_crash.py")


def run(root: Path, *args: str) -> Child:
    proc = subprocess.run([sys.executable, str(HELPER), str(root), *args], env=child_env(), capture_output=True,
                          text=True, timeout=90, check=False)
    return Child(proc.returncode, parse_events(proc.stdout), proc.stderr)


def turn_profiles(root: Path) -> list[str]:
    lines = (root / "turns.log").read_text(encoding="utf-8").splitlines() if (root / "turns.log").exists() else []
    return [line.split()[1] for line in lines if line.strip()]


@pytest.mark.parametrize(
    ("kill_at", "before", "after"),
    [
        # alice replied and bob was mid-turn: carol's turn runs after the restart, nobody else's
        ("bob", ["alice", "bob"], ["carol"]),
        # the very first member turn: the acked send survives, the round goes on with bob and carol
        ("alice", ["alice"], ["bob", "carol"]),
    ],
)
def test_kill_9_mid_round_then_resume(tmp_path: Path, kill_at: str, before: list[str], after: list[str]) -> None:
    root = make_root(tmp_path, {"alice": {}, "bob": {}, "carol": {}})
    first = run(root, "run", kill_at)
    assert first.killed, f"the child was not SIGKILLed (rc={first.returncode}): {first.stderr[-2000:]}"
    (ack,) = first.of("ack")
    assert ack["status"] == "queued"
    assert turn_profiles(root) == before
    ran_before = logged_turns(root / "turns.log")

    second = run(root, "resume")
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.of("idle") == [{"event": "idle", "state": "idle"}]
    (transcript,) = second.of("transcript")
    entries = transcript["entries"]
    assert entries[0]["message_id"] == ack["message_id"] and entries[0]["text"] == "Everyone, report in."
    posted = [(e["author"], e["text"]) for e in entries if e["status"] == "said"]
    assert Counter(posted) == Counter(set(posted)), f"a reply was posted twice: {posted}"
    expected = [("user", "Everyone, report in.")] + [(p, f"{p} speaks") for p in before if p != kill_at]
    assert posted == expected
    interrupted = [e for e in entries if e["status"] == "interrupted"]
    assert [(e["author"], e["round"]) for e in interrupted] == [(kill_at, 1)]
    # no finished turn ran again, the killed one was not re-run, the rest of the round ran once each
    assert turn_profiles(root) == before + after
    assert logged_turns(root / "turns.log")[: len(ran_before)] == ran_before

    third = run(root, "resume")  # a settled room stays settled: nothing runs, nothing is added
    assert third.returncode == 0, third.stderr[-2000:]
    assert third.of("transcript")[0]["entries"] == entries
    assert turn_profiles(root) == before + after


def test_kill_9_while_a_member_turn_is_queued_behind_a_dm_runs_it_after_the_restart(tmp_path: Path) -> None:
    # Regression: the turn that never began was shown "interrupted" and its read position advanced, so bob
    # never read the acked message at all.
    root = make_root(tmp_path, {"alice": {}, "bob": {}, "carol": {}})
    first = run(root, "queued")
    assert first.killed, f"the child was not SIGKILLed (rc={first.returncode}): {first.stderr[-2000:]}"
    (ack,) = first.of("ack")
    assert ack["status"] == "queued"
    assert turn_profiles(root) == ["bob"]  # only his DM ran

    second = run(root, "resume")
    assert second.returncode == 0, second.stderr[-2000:]
    assert second.of("idle") == [{"event": "idle", "state": "idle"}]
    (transcript,) = second.of("transcript")
    assert [(e["author"], e["status"]) for e in transcript["entries"]] == [("user", "said")]  # not "interrupted"
    (ran,) = second.of("ran")
    assert ["bob", "Group: crash", True] in ran["turns"], ran  # bob's turn ran now, and it read the message
    assert not list((root / "bot_relay" / "rooms" / ".started").glob("*.json")), "a start mark was left behind"
