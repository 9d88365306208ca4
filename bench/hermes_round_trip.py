"""The DM round trip with the real hermes-agent, offline: bob's turn + alice's wake-up, warm and CLI.

    PYTHONPATH=$PWD python -m bench.hermes_round_trip [--rounds 3] [--mode warm|cli|both]

For each round, alice's DM to bob is submitted to the host exactly as her
``message_agent`` call does (:func:`hermes_actors.hermes.submit.submit_dm`); the
round trip is the time from that ack to alice's wake-up turn (``Reply from
@bob: …``) reaching the fake model, split at bob's turn reaching it.

- ``cli``: the actors hosted by ``hermes-actors serve``; every turn is a
  ``hermes`` CLI process.
- ``warm``: the actors hosted inside ``hermes gateway run``; turns go through its
  API server.

Uses the test helpers (tests/fake_model.py, tests/hermes_e2e.py); needs the
``hermes`` extra installed. Prints one line per round and the medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_TESTS = Path(__file__).resolve().parent.parent / "tests"


def _helpers() -> tuple[Any, Any]:
    sys.path.insert(0, str(_TESTS))
    import fake_model
    import hermes_e2e

    return fake_model, hermes_e2e


def _rounds(e2e: Any, model: Any, rounds: int, mode: str) -> list[tuple[float, float]]:
    from hermes_actors.hermes.submit import submit_dm

    _, helpers = _helpers()
    results = []
    for i in range(rounds):
        body = f"{mode} round {i}"
        ack = submit_dm(e2e.root, "alice", "bob", body, hop=1)
        acked = time.monotonic()
        if ack.get("status") != "queued":
            raise SystemExit(f"the DM was refused: {ack}")
        reads = helpers.dm_text("Alice", "alice", body)
        bob = model.wait_for(helpers.turn_of("bob", reads), helpers.FLOW_TIMEOUT)
        wake = model.wait_for(helpers.turn_of("alice", f"Reply from @bob: bob got: {reads}"), helpers.FLOW_TIMEOUT,
                              answered=True)
        results.append((bob.received - acked, wake.received - acked))
        print(f"  {mode} round {i}: bob's turn reached the model {bob.received - acked:6.2f}s after the ack, "
              f"alice's wake-up {wake.received - acked:6.2f}s ({bob.platform}/{wake.platform})", flush=True)
    return results


def measure(mode: str, rounds: int, cli: str) -> list[tuple[float, float]]:
    """Run ``rounds`` round trips in ``mode`` (``warm`` or ``cli``) on a fresh offline root."""
    fake_model, helpers = _helpers()
    model = fake_model.FakeModel(helpers.bot_script).start()
    try:
        with tempfile.TemporaryDirectory(prefix=f"rt-{mode}-") as scratch, helpers.processes() as procs:
            e2e = helpers.make_e2e_root(Path(scratch), model, ["alice", "bob"], cli)
            if mode == "warm":
                port = helpers.free_port()
                e2e.enable("--gateway", "--port", str(port))
                helpers.start_hermes_gateway(procs, e2e, port)
            else:
                e2e.enable()
                helpers.start_serve(procs, e2e)
            return _rounds(e2e, model, rounds, mode)
    finally:
        model.stop()


def main(argv: list[str] | None = None) -> int:
    """Measure and print the round trips."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", choices=("warm", "cli", "both"), default="both")
    args = parser.parse_args(argv)
    _, _ = _helpers()
    from hermes_fixtures import locate_hermes_cli

    cli = locate_hermes_cli()
    if cli is None:
        print("no hermes CLI: install the `hermes` extra", file=sys.stderr)
        return 2
    for mode in ("warm", "cli") if args.mode == "both" else (args.mode,):
        results = measure(mode, args.rounds, cli)
        print(f"{mode}: median bob's turn {statistics.median(r[0] for r in results):.2f}s, "
              f"median round trip (ack → alice's wake-up at the model) {statistics.median(r[1] for r in results):.2f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
