"""A gateway in its own process, for the crash-matrix and kill-loop tests.

Every line on stdout is one JSON object, flushed at once, so a parent that
SIGKILLs this process still has everything printed before the kill.

    python tests/crash_gateway.py ROOT send [--selfkill] [--wake] [--via=warm|cli]
        start a Gateway on ROOT, send one DM hermes → bob, print the ack, wait
        for its outcome and print it. The runner appends each turn's delivery
        id to ROOT/turns.log; --selfkill makes it SIGKILL its own process right
        after logging (a true mid-runner death). HERMES_ACTORS_CRASH_AT arms a
        named crash point. --wake turns on ``bot_mode.wake_sender`` (hermes is
        woken with the outcome) and also waits for the wake's own outcome.
        --via: the runner says how its turn runs (``Turn.note_via``) first.
    python tests/crash_gateway.py ROOT recover [--notify] [--wake] [--apart] ID [ID ...]
        subscribe (before start), start, print gw.recovered, wait_outcome for
        every ID; with --notify also wait until the subscriber saw each one;
        --apart: the runner says the bot's turns run warm in a hermes gateway apart (``runs_apart``);
        print both, stop. --wake: as for send, and also wait_outcome for each
        ID's wake; the subscriber's outcomes are printed after stop() (which
        flushes them), all of them, so a wake outcome reported by mistake shows.
    python tests/crash_gateway.py ROOT load TODO_JSON [--threads N]
        send DM ``m<i>`` hermes → ``p<i % 20>`` for every index i in the JSON
        list; print one ``ack`` line per acked DM; then wait for those outcomes.
    python tests/crash_gateway.py ROOT final IDS_JSON
        start, wait_outcome for every id in the JSON list, print them, stop.
    python tests/crash_gateway.py ROOT deliver ENVELOPE_JSON [--selfkill]
        start a Gateway on ROOT as connection ``mini`` and hand it the envelope in the file ENVELOPE_JSON
        as the Desktop does (``relay_deliver``); print its ``{reply, error, reason}`` and stop. The runner
        logs to ROOT/turns.log as for send (--selfkill, HERMES_ACTORS_CRASH_AT likewise).
    python tests/crash_gateway.py ROOT drain ID [--selfkill] [--kill-before-reply] [--memory]
        start a Gateway on ROOT as connection ``mini``: its relay drains the envelopes the hub posted to
        ``inbox/``; wait for envelope ID's answer in ``delivered/`` and print it, stop (the runner as for send:
        --selfkill, HERMES_ACTORS_CRASH_AT). --kill-before-reply: the relay SIGKILLs this process as it is
        about to write ID's answer to ``delivered/``, once the journal holds the DM's ``finished`` record
        (at once with --memory, which runs the Gateway with ``durable=False``: no journal).
    python tests/crash_gateway.py ROOT expire [--resume ID]
        with ``envelope_ttl_seconds: 1`` and ``reply_wait_seconds: 1``: send one DM hermes → ``moxie`` (a remote
        profile in ROOT's relay roster, nobody drains it), print the ack and wait for
        its outcome; with ``--resume ID`` send nothing and wait for ID's outcome.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from roots import TurnLog

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.core.wake import wake_id
from hermes_actors.store.relay_inbox import InboxPaths

_print_lock = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    with _print_lock:
        sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
        sys.stdout.flush()


def logging_runner(root: Path, *, selfkill: bool = False, via: str | None = None) -> TurnLog:
    """Logs every turn to ``ROOT/turns.log``, then replies at once (or, with ``selfkill``, SIGKILLs this process);
    with ``via``, says first how the turn runs (journaled before the runner goes on)."""

    def reply(turn: Any) -> str:
        if via is not None:
            turn.note_via(via)
        if selfkill:
            os.kill(os.getpid(), signal.SIGKILL)
        return f"reply to {turn.delivery_id}"

    return TurnLog(root / "turns.log", reply)


class ApartRunner:
    """A logging runner whose bots' turns run warm in a hermes gateway apart from this host (``runs_apart``)."""

    def __init__(self, log: TurnLog) -> None:
        self.log = log

    def run_turn(self, turn: Any) -> str:
        return self.log(turn)

    def runs_apart(self, turn: Any) -> bool:
        return True


def _option(args: list[str], name: str) -> str | None:
    """The value of ``--name=VALUE`` in ``args`` (None when absent)."""
    prefix = f"--{name}="
    return next((arg.removeprefix(prefix) for arg in args if arg.startswith(prefix)), None)


def _wait_all(gw: Gateway, ids: list[str], timeout: float) -> None:
    for key in ids:
        try:
            emit("outcome", **gw.wait_outcome(key, timeout=timeout))
        except (TimeoutError, KeyError) as exc:
            emit("no-outcome", delivery_id=key, error=f"{type(exc).__name__}: {exc}")


def _config(args: list[str]) -> dict[str, Any] | None:
    return {"bot_mode": {"wake_sender": True}} if "--wake" in args else None


def cmd_send(root: Path, args: list[str]) -> None:
    runner = logging_runner(root, selfkill="--selfkill" in args, via=_option(args, "via"))
    gw = Gateway(root, runner=runner, config=_config(args)).start()
    emit("ready", recovered=gw.recovered)
    ack = gw.message_agent(sender="hermes", target="bob", message="hello from the crash test")
    emit("ack", **ack)
    if "delivery_id" in ack:
        _wait_all(gw, [ack["delivery_id"]], 20)
        if "--wake" in args:
            _wait_all(gw, [wake_id(ack["delivery_id"])], 20)
    gw.stop(timeout=10)
    emit("stopped")


def cmd_recover(root: Path, args: list[str]) -> None:
    ids = [a for a in args if not a.startswith("--")]
    seen: dict[str, dict[str, Any]] = {}
    cond = threading.Condition()

    def record(outcome: dict[str, Any]) -> None:
        with cond:
            seen.setdefault(outcome["delivery_id"], outcome)
            cond.notify_all()

    log = logging_runner(root)
    gw = Gateway(root, runner=ApartRunner(log) if "--apart" in args else log, config=_config(args))
    gw.subscribe(record)  # before start(): it must see the recovered outcomes too
    gw.start()
    emit("recovered", counts=gw.recovered)
    _wait_all(gw, ids, 20)
    if "--wake" in args:
        _wait_all(gw, [wake_id(key) for key in ids], 20)
        gw.stop(timeout=10)  # flushes the subscriber: every outcome it would ever see is in ``seen`` now
        emit("subscribed", outcomes=list(seen.values()))
        emit("stopped")
        return
    with cond:
        if "--notify" in args:
            cond.wait_for(lambda: all(k in seen for k in ids), timeout=20)
        emit("subscribed", outcomes=[seen[k] for k in ids if k in seen])
    gw.stop(timeout=10)
    emit("stopped")


def cmd_load(root: Path, todo_file: str, args: list[str]) -> None:
    todo: list[int] = json.loads(Path(todo_file).read_text())
    threads = int(args[args.index("--threads") + 1]) if "--threads" in args else 8
    gw = Gateway(root, runner=logging_runner(root)).start()
    emit("ready", recovered=gw.recovered)
    acked: list[str] = []
    lock = threading.Lock()

    def send(i: int) -> None:
        ack = gw.message_agent(sender="hermes", target=f"p{i % 20:02d}", message=f"m{i}")
        if "delivery_id" in ack:
            emit("ack", i=i, id=ack["delivery_id"])
            with lock:
                acked.append(ack["delivery_id"])
        else:
            emit("refused", i=i, ack=ack)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(send, todo))
    emit("sent", count=len(acked))
    _wait_all(gw, acked, 60)
    gw.stop(timeout=10)
    emit("stopped")


def cmd_final(root: Path, ids_file: str) -> None:
    ids: list[str] = json.loads(Path(ids_file).read_text())
    gw = Gateway(root, runner=logging_runner(root)).start()
    emit("recovered", counts=gw.recovered)
    _wait_all(gw, ids, 60)
    emit("stats", **gw.stats())
    gw.stop(timeout=10)
    emit("stopped")


def cmd_deliver(root: Path, envelope_file: str, args: list[str]) -> None:
    envelope = json.loads(Path(envelope_file).read_text())
    gw = Gateway(root, runner=logging_runner(root, selfkill="--selfkill" in args), connection_id="mini").start()
    emit("ready", recovered=gw.recovered)
    emit("delivered", **gw.relay_deliver(envelope, timeout=20))
    gw.stop(timeout=10)
    emit("stopped")


def kill_before_reply(root: Path, envelope_id: str, *, journaled: bool) -> None:
    """Make the relay SIGKILL this process as it is about to write ``envelope_id``'s answer to ``delivered/``:
    with ``journaled``, once the root's journal holds the DM's ``finished`` record (the turn's outcome is on disk,
    its reply nowhere else)."""
    from crash_procs import journal_ids

    import hermes_actors.relay.relay_actor as relay_actor

    real = relay_actor.write_delivered

    def dying(paths: InboxPaths, record: dict[str, Any], reply_connection: str) -> bool:
        if record.get("id") == envelope_id:
            if journaled:
                await_condition(lambda: envelope_id in journal_ids(root, "finished"), timeout=20,
                                message="the relayed-in DM's finished record in the journal")
            os.kill(os.getpid(), signal.SIGKILL)
        return real(paths, record, reply_connection)

    relay_actor.write_delivered = dying  # type: ignore[assignment]


def cmd_drain(root: Path, envelope_id: str, args: list[str]) -> None:
    durable = "--memory" not in args
    if "--kill-before-reply" in args:
        kill_before_reply(root, envelope_id, journaled=durable)
    gw = Gateway(root, runner=logging_runner(root, selfkill="--selfkill" in args), connection_id="mini",
                 durable=durable).start()
    emit("ready", recovered=gw.recovered)
    answer = InboxPaths.from_root(root).delivered / f"{envelope_id}.json"
    await_condition(answer.exists, timeout=20, message="the envelope's answer in delivered/")
    emit("delivered", **(json.loads(answer.read_text()) if answer.exists() else {}))
    gw.stop(timeout=10)
    emit("stopped")


def cmd_expire(root: Path, args: list[str]) -> None:
    # Equal budgets, as the defaults (900 s each): at a restart both deadlines are due at once.
    config = {"bot_mode": {"envelope_ttl_seconds": 1, "reply_wait_seconds": 1}}
    gw = Gateway(root, runner=logging_runner(root), config=config).start()
    if args[:1] == ["--resume"]:
        ids = args[1:]
    else:
        ack = gw.message_agent(sender="hermes", target="moxie", message="anyone there?")
        emit("ack", **ack)
        ids = [ack["delivery_id"]] if "delivery_id" in ack else []
    _wait_all(gw, ids, 30)
    gw.stop(timeout=10)
    emit("stopped")


def main(argv: list[str]) -> int:
    root, command, rest = Path(argv[1]), argv[2], argv[3:]
    if command == "send":
        cmd_send(root, rest)
    elif command == "recover":
        cmd_recover(root, rest)
    elif command == "load":
        cmd_load(root, rest[0], rest[1:])
    elif command == "final":
        cmd_final(root, rest[0])
    elif command == "deliver":
        cmd_deliver(root, rest[0], rest[1:])
    elif command == "drain":
        cmd_drain(root, rest[0], rest[1:])
    elif command == "expire":
        cmd_expire(root, rest)
    else:
        print(f"unknown command {command!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
