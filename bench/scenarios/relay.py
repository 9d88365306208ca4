"""The relay scenario: one DM at a time through ``bot_relay/`` files and the relay hub.

Ours, as in production, is three processes: the sending gateway ``alpha`` (in
the benchmark process), the relay hub (``hermes-actors relay``) and the far
gateway ``mini`` (:mod:`bench.relay_peer`, instant runner), each with its own
interpreter and GIL. A DM to ``dave@mini`` goes alpha ``outbox/`` → hub →
mini ``inbox/`` → turn → mini ``delivered/`` → hub → alpha ``replies/`` →
outcome, every hop on a filesystem event. The baseline is
:class:`bench.baseline.BaselineRelay` (envelope files, a polling Desktop
drain, a subprocess turn, the 250 ms reply waiter).
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from bench.baseline import BaselineRelay
from bench.drivers import BenchError, Run, sequential_roundtrip
from bench.measure import summarize
from bench.registry import BenchContext, ScenarioResult, scenario
from bench.roots import BENCH_CONFIG
from bench.scenarios.local import our_system
from hermes_actors import Gateway
from hermes_actors.demo.bots import DemoBot, create_demo_root

__all__ = ["await_target", "hub_command", "peer_process", "relay_roots"]

PROJECT_DIR = Path(__file__).resolve().parents[2]
TARGET = "dave@mini"
SENDER = "hermes"
_READY_S = 60.0  # process start + the hub's first roster push (every 2 s)


def relay_roots(base: Path) -> tuple[Path, Path]:
    """Write the two roots: ``alpha`` (the sender, its default profile ``hermes``) and ``mini`` (``dave``)."""
    alpha = create_demo_root(base / "alpha", (DemoBot("default", "Hermes", "Coordinator", "sends"),))
    mini = create_demo_root(base / "mini", (DemoBot("default", "Mini", "Coordinator", "far side"),
                                            DemoBot("dave", "Dave", "Analyst", "answers")))
    return alpha, mini


def hub_command(roots: dict[str, Path]) -> list[str]:
    """``hermes-actors relay --root … --name …`` (the console script beside this interpreter when present)."""
    script = Path(sys.executable).with_name("hermes-actors")
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "hermes_actors.cli.main"]
    argv.append("relay")
    for name, root in roots.items():
        argv += ["--root", str(root), "--name", name]
    return argv


@contextlib.contextmanager
def peer_process(argv: list[str], log: Path, *, ready_line: str | None = None) -> Iterator[subprocess.Popen[str]]:
    """Run ``argv`` (stderr to ``log``), optionally wait for ``ready_line`` on stdout; terminate it after."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_DIR),
                                                                     os.environ.get("PYTHONPATH")]))}
    with open(log, "w", encoding="utf-8") as errors:
        proc = subprocess.Popen(argv, cwd=PROJECT_DIR, env=env, text=True, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE if ready_line else errors, stderr=errors)
        try:
            if ready_line is not None:
                assert proc.stdout is not None
                _await_line(proc, proc.stdout, ready_line, log)
            yield proc
        finally:
            with contextlib.suppress(OSError):
                if proc.stdin is not None:
                    proc.stdin.close()
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
            if proc.stdout is not None:
                proc.stdout.close()


def _await_line(proc: subprocess.Popen[str], stream: IO[str], line: str, log: Path) -> None:
    deadline = time.monotonic() + _READY_S
    while time.monotonic() < deadline:
        readable, _, _ = select.select([stream], [], [], 0.1)
        if readable:
            got = stream.readline()
            if got.strip() == line:
                return
            if not got:
                break
        if proc.poll() is not None:
            break
    raise BenchError(f"{proc.args!r} did not print {line!r} (exit {proc.poll()}): "
                     f"{log.read_text(encoding='utf-8', errors='replace')[-2000:]}")


def await_target(gateway: Gateway, target: str, logs: list[Path]) -> None:
    """Wait until the hub pushed a roster in which ``target`` is online."""
    handle, _, connection = target.partition("@")
    deadline = time.monotonic() + _READY_S
    while time.monotonic() < deadline:
        if any(r["handle"] == handle and r["connection_id"] == connection and r["online"] is True
               for r in gateway.roster()):
            return
        time.sleep(0.02)
    tails = "\n".join(f"{p.name}: {p.read_text(encoding='utf-8', errors='replace')[-1000:]}" for p in logs)
    raise BenchError(f"{target} never became reachable (never online in the roster)\n{tails}")


def _peer_command(root: Path, durable: bool) -> list[str]:
    argv = [sys.executable, "-m", "bench.relay_peer", "--root", str(root), "--connection-id", "mini"]
    return argv + (["--durable"] if durable else [])


def _ours(ctx: BenchContext, alpha: Path, mini: Path, *, durable: bool, n: int, warmup: int) -> Run:
    """One measured session: far gateway and hub processes, the sending gateway, ``n`` sequential DMs.

    The far gateway starts first, so the hub's first roster push already sees it alive.
    """
    label = "durable" if durable else "ours"
    peer_log, hub_log = ctx.workdir / f"peer-{label}.log", ctx.workdir / f"hub-{label}.log"
    with (peer_process(_peer_command(mini, durable), peer_log, ready_line="ready"),
          peer_process(hub_command({"alpha": alpha, "mini": mini}), hub_log)):
        gateway = our_system(alpha, connection_id="alpha", durable=durable, fsync=durable)
        with gateway:
            await_target(gateway, TARGET, [hub_log, peer_log])
            ctx.progress.start(f"relay-roundtrip {label}", n)
            try:
                return sequential_roundtrip(gateway, SENDER, TARGET, n, ctx.progress, warmup=warmup)
            finally:
                ctx.progress.finish()


@scenario(
    "relay-roundtrip",
    "sequential DMs alpha → `dave@mini` through `bot_relay/` files: three processes (sending gateway, "
    "relay hub, far gateway); latency = send call start → outcome",
)
def relay_roundtrip(ctx: BenchContext) -> ScenarioResult:
    """Latency of one cross-connection DM, nothing else in flight."""
    samples: dict[str, list[float]] = {}
    alpha, mini = relay_roots(ctx.workdir / "ours")
    n = ctx.count(40, 1000, minimum=5)
    warmup = 5
    run = _ours(ctx, alpha, mini, durable=False, n=n, warmup=warmup)
    samples["ours"] = run.latencies_s
    ours: dict[str, Any] = summarize(run.latencies_s, run.wall_s)
    if not ctx.quick:  # the production default: both gateways journal (fdatasync per group commit)
        drun = _ours(ctx, alpha, mini, durable=True, n=ctx.count(60, 300, minimum=5), warmup=warmup)
        samples["ours durable"] = drun.latencies_s
        ours["durable"] = summarize(drun.latencies_s, drun.wall_s)

    base_alpha, base_mini = relay_roots(ctx.workdir / "baseline")
    base_n = ctx.count(4, 40, minimum=3)
    turn_wait = float(BENCH_CONFIG["bot_mode"]["turn_wait_seconds"])
    with BaselineRelay(base_alpha, base_mini, target_connection="mini", turn_wait_seconds=turn_wait) as relay:
        ctx.progress.start("relay-roundtrip baseline", base_n)
        try:
            brun = sequential_roundtrip(relay, SENDER, TARGET, base_n, ctx.progress, warmup=1)
        finally:
            ctx.progress.finish()
    samples["baseline"] = brun.latencies_s
    return ScenarioResult(ours, summarize(brun.latencies_s, brun.wall_s), samples)
