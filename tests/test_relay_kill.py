"""issue 14, done when: the receiving gateway, and separately the hub, SIGKILLed at random moments during relay DMs.

Three processes (``relay_peer.py`` on alpha sends, ``relay_peer.py`` on mini serves, the hub relays); the victim
is killed -9 when the far side's turn log (or alpha's replies) reaches a random count, and restarted. Every
acked DM must end exactly once, within the sender's wait (far below ``reply_wait_seconds``, 900 s), no turn may
run twice, and a DM whose turn never started must be run and replied. So a kill leaves at most two ``ambiguous``
DMs: the turn running (one profile runs one turn at a time; its start mark may be on disk a moment before the
runner logs it), and the turn that had just finished but whose reply was not on disk yet (it ran; its result
died with the process, exactly as a local DM's outcome not yet journaled).
"""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from relay_procs import Child, children, hub_argv, peer_argv
from roots import logged_turns

from actors.testkit import await_condition
from hermes_actors.demo.bots import create_demo_root
from hermes_actors.store import relay_files as rf

TURN_SECONDS = "0.03"  # a turn long enough for a kill to land mid-turn now and then
AMBIGUOUS = "may have been delivered — do not resend"
KILLS = 3


def _kill(child: Child) -> None:
    child.proc.kill()  # SIGKILL: no cleanup, the flock of its shelf goes with it
    child.proc.wait(timeout=30)


def _thresholds(rng: random.Random, count: int) -> list[int]:
    """``KILLS`` increasing counts in (0, count) at which to kill."""
    return sorted(rng.sample(range(1, count - 1), KILLS))


def _check(summary: dict[str, Any], served: Path, count: int, *, ambiguous_allowed: int, seed: int) -> Counter[str]:
    where = f"(seed {seed})"
    assert summary["refusals"] == [], where
    sent = summary["sent"]
    assert len(sent) == count and len(set(sent)) == count, where
    turns = Counter(logged_turns(served))
    assert {i: n for i, n in turns.items() if n > 1} == {}, f"a turn ran twice {where}"
    assert set(turns) <= set(sent), where
    outcomes: Counter[str] = Counter()
    for delivery_id, status, error in zip(sent, summary["statuses"], summary["errors"], strict=True):
        if status == "replied":
            assert turns[delivery_id] == 1, f"{delivery_id} replied without its turn {where}"
            outcomes["replied"] += 1
        else:
            assert status == "ambiguous" and AMBIGUOUS in (error or ""), (delivery_id, status, error, where)
            outcomes["ambiguous"] += 1
    assert outcomes["ambiguous"] <= 2 * ambiguous_allowed, (outcomes, where)
    never_ran = [i for i, status in zip(sent, summary["statuses"], strict=True) if status != "replied" and not turns[i]]
    assert len(never_ran) <= ambiguous_allowed, (never_ran, where)  # only a turn killed between its mark and runner
    return outcomes


def _run_receiver_kills(tmp_path: Path, count: int, capsys: Any) -> None:
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    alpha, mini = create_demo_root(tmp_path / "alpha"), create_demo_root(tmp_path / "mini")
    served = tmp_path / "mini.turns"

    def receiver(spawn: Any, n: int) -> Child:
        return spawn(f"mini-{n}", peer_argv(mini, "mini", "scout@alpha", 0, "--turn-log", str(served),
                                            "--turn-seconds", TURN_SECONDS, "--rescan", "0.5"))

    with children(tmp_path) as spawn:
        hub = spawn("hub", hub_argv({"alpha": alpha, "mini": mini}))
        hub.wait_line(lambda line: line.startswith("relay hub running"), timeout=30)
        victim = receiver(spawn, 0)
        sender = spawn("alpha", peer_argv(alpha, "alpha", "scout@mini", count, "--wait", "120", "--rescan", "0.5"))
        sender.wait_json("ready", timeout=60)
        for n, at in enumerate(_thresholds(rng, count), start=1):
            await_condition(lambda at=at: len(logged_turns(served)) >= at, timeout=60, interval=0.005,  # type: ignore[misc]
                            message=f"{at} turns on mini (seed {seed})")
            _kill(victim)
            victim = receiver(spawn, n)
        summary = sender.wait_json("sent", timeout=150)
    outcomes = _check(summary, served, count, ambiguous_allowed=KILLS, seed=seed)
    with capsys.disabled():
        print(f"\nreceiver killed -9 {KILLS}x during {count} relay DMs (seed {seed}): {dict(outcomes)}, "
              f"all ended in {summary['elapsed']:.1f} s")


def _run_hub_kills(tmp_path: Path, count: int, capsys: Any) -> None:
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    alpha, mini = create_demo_root(tmp_path / "alpha"), create_demo_root(tmp_path / "mini")
    roots = {"alpha": alpha, "mini": mini}
    served = tmp_path / "mini.turns"
    replies = alpha / "bot_relay" / "replies"
    armed = ["env", "HERMES_ACTORS_CRASH_AT=hub-after-claim-before-post", *hub_argv(roots)]
    with children(tmp_path) as spawn:
        hub = spawn("hub-0", armed)  # dies -9 right after its first claim, before the inbox post
        hub.wait_line(lambda line: line.startswith("relay hub running"), timeout=30)
        spawn("mini", peer_argv(mini, "mini", "scout@alpha", 0, "--turn-log", str(served),
                                "--turn-seconds", TURN_SECONDS, "--rescan", "0.5"))
        sender = spawn("alpha", peer_argv(alpha, "alpha", "scout@mini", count, "--wait", "120", "--rescan", "0.5"))
        hub.proc.wait(timeout=60)
        assert hub.proc.returncode == -9, hub.stderr_tail()
        for n, at in enumerate([0, *_thresholds(rng, count)], start=1):
            await_condition(lambda at=at: len(rf.list_ids(replies)) >= at, timeout=60, interval=0.005,  # type: ignore[misc]
                            message=f"{at} replies on alpha (seed {seed})")
            if n > 1:
                _kill(hub)
            hub = spawn(f"hub-{n}", hub_argv(roots))
            hub.wait_line(lambda line: line.startswith("relay hub running"), timeout=30)
        summary = sender.wait_json("sent", timeout=150)
    outcomes = _check(summary, served, count, ambiguous_allowed=0, seed=seed)
    assert outcomes["replied"] == count
    with capsys.disabled():
        print(f"\nhub killed -9 {KILLS + 1}x (once between claim and post) during {count} relay DMs "
              f"(seed {seed}): all {count} replied in {summary['elapsed']:.1f} s")


def test_receiving_gateway_killed_at_random_moments_every_dm_ends_once(tmp_path: Path, capsys: Any) -> None:
    _run_receiver_kills(tmp_path, 60, capsys)


def test_hub_killed_at_random_moments_and_between_claim_and_post_every_dm_ends_once(
    tmp_path: Path, capsys: Any
) -> None:
    _run_hub_kills(tmp_path, 60, capsys)


@pytest.mark.soak
def test_soak_receiving_gateway_killed_during_300_dms(tmp_path: Path, capsys: Any) -> None:
    _run_receiver_kills(tmp_path, 300, capsys)


@pytest.mark.soak
def test_soak_hub_killed_during_300_dms(tmp_path: Path, capsys: Any) -> None:
    _run_hub_kills(tmp_path, 300, capsys)


