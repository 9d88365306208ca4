"""The DM round trip with the real hermes-agent, offline: bob's turn + alice's wake-up.

    PYTHONPATH=$PWD python -m bench.hermes_round_trip [--rounds 3] [--mode warm|cli|seed|all]

For each round, alice's DM to bob is handed over; the round trip is the time
from that hand-over (the ack) to alice's wake-up turn (``Reply from @bob: …``)
reaching the fake model, split at bob's turn reaching it. The model answers at
once, so the whole round trip is overhead: process starts, polling, hops.

- ``warm``: ours, the actors hosted inside ``hermes gateway run``; turns go
  through its API server (no process per turn). The DM is submitted exactly as
  alice's ``message_agent`` call does (:func:`hermes_actors.hermes.submit.submit_dm`).
- ``cli``: ours, the actors hosted by ``hermes-actors serve``; every turn is a
  ``hermes`` CLI process.
- ``seed``: a model of the seed's design with the real CLI: a runner (a thread
  here; a separate Python process in the seed, so this favours the seed) takes
  bob's turn lock with non-blocking ``flock`` attempts 100 ms apart, runs bob's
  turn as a ``hermes chat`` process and writes the reply file; a waiter polls
  that file every 250 ms (the seed's reply waiter); alice's wake-up is a
  second ``hermes chat`` process. Our plugin is not enabled on its root.

Uses the test helpers (tests/fake_model.py, tests/hermes_e2e.py); needs the
``hermes`` extra installed. Prints one line per round and the medians.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.baseline.model import LOCK_POLL_S, wait_reply_file

__all__ = ["MODES", "locate_cli", "measure"]

_TESTS = Path(__file__).resolve().parent.parent / "tests"
MODES = ("warm", "cli", "seed")

#: Called after each round with (mode, round index, seconds to bob's turn, seconds to alice's wake-up).
RoundReport = Callable[[str, int, float, float], None]


def _helpers() -> tuple[Any, Any]:
    if str(_TESTS) not in sys.path:
        sys.path.insert(0, str(_TESTS))
    import fake_model
    import hermes_e2e

    return fake_model, hermes_e2e


def locate_cli() -> str | None:
    """The hermes CLI (as the tests find it), or None when hermes-agent is not installed."""
    _helpers()
    from hermes_fixtures import locate_hermes_cli

    found: str | None = locate_hermes_cli()
    return found


def _print_round(mode: str, i: int, bob_s: float, wake_s: float) -> None:
    print(f"  {mode} round {i}: bob's turn reached the model {bob_s:6.2f}s after the ack, "
          f"alice's wake-up {wake_s:6.2f}s", flush=True)


def _our_rounds(e2e: Any, model: Any, rounds: range, mode: str, report: RoundReport) -> list[tuple[float, float]]:
    from hermes_actors.hermes.submit import submit_dm

    _, helpers = _helpers()
    results = []
    for i in rounds:
        body = f"{mode} round {i}"
        ack = submit_dm(e2e.root, "alice", "bob", body, hop=1)
        acked = time.monotonic()
        if ack.get("status") != "queued":
            raise RuntimeError(f"the DM was refused: {ack}")
        reads = helpers.dm_text("Alice", "alice", body)
        bob = model.wait_for(helpers.turn_of("bob", reads), helpers.FLOW_TIMEOUT)
        wake = model.wait_for(helpers.turn_of("alice", f"Reply from @bob: bob got: {reads}"), helpers.FLOW_TIMEOUT,
                              answered=True)
        results.append((bob.received - acked, wake.received - acked))
        report(mode, i, *results[-1])
    return results


def _seed_delivery(e2e: Any, lock_path: Path, reads: str, reply_path: Path) -> None:
    """The seed's runner: 100 ms-polled flock, bob's turn as a CLI process, then the reply file."""
    _, helpers = _helpers()
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                time.sleep(LOCK_POLL_S)  # the seed's acquire_turn_lock cadence (modelled, not synchronization)
        try:
            record: dict[str, Any] = {"reply": helpers.run_cli_turn(e2e, "bob", reads, session=None).strip()}
        except AssertionError as exc:
            record = {"error": str(exc)}
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    tmp = reply_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record), encoding="utf-8")
    os.replace(tmp, reply_path)


def _seed_rounds(e2e: Any, model: Any, rounds: range, report: RoundReport) -> list[tuple[float, float]]:
    _, helpers = _helpers()
    locks = e2e.root / "bot_relay" / "locks"
    replies = e2e.root / "bot_relay" / "replies"
    locks.mkdir(parents=True, exist_ok=True)
    replies.mkdir(parents=True, exist_ok=True)
    results = []
    for i in rounds:
        body = f"seed round {i}"
        reads = helpers.dm_text("Alice", "alice", body)
        reply_path = replies / f"round-{i}.json"
        acked = time.monotonic()
        runner = threading.Thread(target=_seed_delivery, args=(e2e, locks / "bob.lock", reads, reply_path),
                                  name=f"seed-runner-{i}", daemon=True)
        runner.start()
        record = wait_reply_file(reply_path, helpers.FLOW_TIMEOUT)
        runner.join()
        if record is None or record.get("error"):
            raise RuntimeError(f"the seed model's delivery failed: {record}")
        wake_text = f"Reply from @bob: {record['reply']}"
        helpers.run_cli_turn(e2e, "alice", wake_text, session=None)
        bob = model.wait_for(helpers.turn_of("bob", reads), helpers.FLOW_TIMEOUT)
        wake = model.wait_for(helpers.turn_of("alice", wake_text), helpers.FLOW_TIMEOUT, answered=True)
        results.append((bob.received - acked, wake.received - acked))
        report("seed", i, *results[-1])
    return results


def measure(mode: str, rounds: int, cli: str, *, report: RoundReport = _print_round, warmup: int = 0,
            on_ready: Callable[[], None] | None = None) -> list[tuple[float, float]]:
    """Run ``rounds`` round trips in ``mode`` (``warm``, ``cli`` or ``seed``) on a fresh offline root.

    Args:
        mode: one of :data:`MODES`.
        rounds: measured round trips.
        cli: the hermes executable.
        report: called after each measured round.
        warmup: unmeasured rounds first (a warm host's first turn pays lazy imports).
        on_ready: called once the host is up (before the first round).

    Returns:
        ``(seconds to bob's turn, seconds to alice's wake-up)`` per measured round.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    fake_model, helpers = _helpers()
    model = fake_model.FakeModel(helpers.bot_script).start()

    def silent(*_: Any) -> None:
        return None

    try:
        with tempfile.TemporaryDirectory(prefix=f"rt-{mode}-") as scratch, helpers.processes() as procs:
            e2e = helpers.make_e2e_root(Path(scratch), model, ["alice", "bob"], cli)
            if mode == "warm":
                port = helpers.free_port()
                e2e.enable("--gateway", "--port", str(port))
                helpers.start_hermes_gateway(procs, e2e, port)
            elif mode == "cli":
                e2e.enable()
                helpers.start_serve(procs, e2e)
            if on_ready is not None:
                on_ready()

            def run(indices: range, tell: RoundReport) -> list[tuple[float, float]]:
                if mode == "seed":
                    return _seed_rounds(e2e, model, indices, tell)
                return _our_rounds(e2e, model, indices, mode, tell)

            # Warm-up rounds get their own numbers: their texts never match a measured round's.
            run(range(rounds, rounds + warmup), silent)
            return run(range(rounds), report)
    finally:
        model.stop()


def main(argv: list[str] | None = None) -> int:
    """Measure and print the round trips."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", choices=(*MODES, "all"), default="all")
    args = parser.parse_args(argv)
    cli = locate_cli()
    if cli is None:
        print("no hermes CLI: install the `hermes` extra", file=sys.stderr)
        return 2
    for mode in MODES if args.mode == "all" else (args.mode,):
        results = measure(mode, args.rounds, cli)
        print(f"{mode}: median bob's turn {statistics.median(r[0] for r in results):.2f}s, "
              f"median round trip (ack → alice's wake-up at the model) {statistics.median(r[1] for r in results):.2f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
