"""1,000 DMs across 20 profiles while the gateway process is SIGKILLed five times.

Each run is ``tests/crash_gateway.py load`` in a child: it sends the DMs not
acked yet and prints one ``ack`` line per acked DM. The parent kills it with
SIGKILL after a random number of acks plus a random extra delay (the fault
injection; nothing is synchronized by time), restarts it on the same root and
continues with the remainder. A sixth run sends the rest cleanly and a final
gateway waits the outcome of every acked id.

Invariants: every acked DM has exactly one outcome; no delivery id was ever
entered twice into the runner (``turns.log``): a ``replied`` one exactly once,
an ``ambiguous`` one at most once.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from crash_procs import HELPER, child_env, parse_events, run_child, turns_logged
from roots import make_root

TOTAL = 1000
PROFILES = 20
KILLS = 5


def _reader(stream: Any, out: queue.Queue[str | None]) -> None:
    for line in stream:
        out.put(line)
    out.put(None)


def _run_and_kill(root: Path, todo: list[int], rng: random.Random, acked: dict[str, int]) -> int:
    """One child run, SIGKILLed after a random number of acks; returns how many it acked."""
    todo_file = root.parent / "todo.json"
    todo_file.write_text(json.dumps(todo))
    proc = subprocess.Popen(
        [sys.executable, str(HELPER), str(root), "load", str(todo_file), "--threads", "8"],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True)
    reader.start()
    kill_after = rng.randint(20, 150)
    seen = 0
    try:
        deadline = time.monotonic() + 60
        while seen < kill_after:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, "the child exited before it was killed"
            for event in parse_events(line):
                if event["event"] == "ack":
                    acked[event["id"]] = event["i"]
                    seen += 1
                assert event["event"] != "refused", event
        time.sleep(rng.uniform(0, 0.02))  # a random kill moment (fault injection, not synchronization)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=30)
    while True:  # everything printed before the kill still counts as acked
        line = lines.get_nowait() if not lines.empty() else None
        if line is None:
            break
        for event in parse_events(line):
            if event["event"] == "ack":
                acked[event["id"]] = event["i"]
                seen += 1
    assert proc.returncode == -signal.SIGKILL, proc.returncode
    return seen


def test_kill_loop_every_acked_dm_has_exactly_one_outcome_and_no_turn_runs_twice(tmp_path: Path) -> None:
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    root = make_root(tmp_path, {f"p{i:02d}": {} for i in range(PROFILES)})
    acked: dict[str, int] = {}  # delivery id → message index
    for _ in range(KILLS):
        done = set(acked.values())
        count = _run_and_kill(root, [i for i in range(TOTAL) if i not in done], rng, acked)
        assert count > 0
    done = set(acked.values())
    rest = [i for i in range(TOTAL) if i not in done]
    assert rest, f"seed {seed}: the kills came after everything was sent"
    todo_file = tmp_path / "todo.json"
    todo_file.write_text(json.dumps(rest))
    clean = run_child(root, "load", str(todo_file), timeout=120)
    assert clean.returncode == 0, clean.stderr[-3000:]
    assert not clean.of("refused")
    for event in clean.of("ack"):
        acked[event["id"]] = event["i"]
    assert sorted(acked.values()) == list(range(TOTAL)), f"seed {seed}: every message index acked exactly once"

    ids_file = tmp_path / "ids.json"
    ids_file.write_text(json.dumps(sorted(acked)))
    final = run_child(root, "final", str(ids_file), timeout=180)
    assert final.returncode == 0, final.stderr[-3000:]
    assert not final.of("no-outcome"), f"seed {seed}: {final.of('no-outcome')[:3]}"
    outcomes = final.of("outcome")
    per_id = Counter(o["delivery_id"] for o in outcomes)
    assert set(per_id) == set(acked) and set(per_id.values()) == {1}, f"seed {seed}"
    statuses = Counter(o["status"] for o in outcomes)
    assert set(statuses) <= {"replied", "ambiguous"}, f"seed {seed}: {statuses}"

    entered = Counter(turns_logged(root))
    twice = {k: n for k, n in entered.items() if n > 1}
    assert not twice, f"seed {seed}: turns ran more than once: {twice}"
    for outcome in outcomes:
        runs = entered.get(outcome["delivery_id"], 0)
        if outcome["status"] == "replied":
            assert runs == 1, f"seed {seed}: {outcome} ran {runs} times"
            assert outcome["reply"] == f"reply to {outcome['delivery_id']}"
        else:
            assert runs <= 1 and "do not resend" in outcome["error"], outcome
    print(f"kill loop seed={seed}: {statuses}, {len(entered)} turns, {len(entered) - len(acked)} unacked turns")
