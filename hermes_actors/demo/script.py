"""The scripted conversation ``hermes-actors demo`` runs, with a live transcript.

Four offline demo bots on a temporary managed root: a question and reply, a
DM sent from inside a turn, a fan-in of several DMs to one slow bot (one gets
the bounded-wait ``target_busy`` refusal), an intentional silence, refusals of
bad targets, a short group-room conversation, and a closing summary table.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

from hermes_actors.cli.render import clip, outcome_line, refusal_line
from hermes_actors.demo.bots import DemoBot, DemoRunner, create_demo_root
from hermes_actors.gateway import Gateway

__all__ = ["run_demo"]

DEMO_CONFIG = {"bot_mode": {"turn_wait_seconds": 0.5, "max_pair_rate": 30}}


class _Transcript:
    """Prints each outcome as it arrives (on its subscription's notifier thread) with its latency."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.sent: dict[str, tuple[float, str]] = {}
        self.latencies: list[float] = []
        self.statuses: Counter[str] = Counter()
        self.lock = threading.Condition()  # the script thread and the subscription's notifier thread both print
        self.seen = 0
        self.disbanded: set[str] = set()  # rooms whose "disbanded" line is printed
        self.expected = 0

    def say(self, text: str) -> None:
        with self.lock:
            print(text, file=self.out, flush=True)

    def on_outcome(self, outcome: dict[str, Any]) -> None:
        if outcome.get("kind") == "room":
            self.on_room_event(outcome)
            return
        now = time.perf_counter()
        with self.lock:
            started, who = self.sent.get(outcome["delivery_id"], (None, "(from inside a turn)"))
            key = outcome["status"] if outcome["status"] != "failed" else f"failed:{outcome['reason']}"
            self.statuses[key] += 1
            if started is None:
                latency = "   nested"
            else:
                ms = (now - started) * 1000
                self.latencies.append(ms)
                latency = f"{ms:7.1f} ms"
            print(f"  [{latency}] {who:<22} ⇐ {clip(outcome_line(outcome), 110)}", file=self.out, flush=True)
            self.seen += 1
            self.lock.notify_all()

    def on_room_event(self, event: dict[str, Any]) -> None:
        """A room's message or state change (the user's own messages are printed as they are sent)."""
        with self.lock:
            if event["event"] == "message" and event["message"]["author"] != "user":
                entry = event["message"]
                print(f"  [room {event['room']} · round {entry['round']}] @{entry['author']}: {entry['text'][:100]}",
                      file=self.out, flush=True)
            elif event["event"] == "state" and event["state"] == "disbanded":
                print(f"  [room {event['room']}] disbanded", file=self.out, flush=True)
                self.disbanded.add(event["room"])
                self.lock.notify_all()
            elif event["event"] == "state" and event["state"] != "busy":
                self.statuses[f"room:{event['state']}"] += 1
                print(f"  [room {event['room']}] settled: {event['state']}", file=self.out, flush=True)
                self.lock.notify_all()

    def await_seen(self, count: int, timeout: float = 10.0) -> None:
        """Block until ``count`` outcomes were printed (bounded)."""
        with self.lock:
            self.lock.wait_for(lambda: self.seen >= count, timeout=timeout)


def _send(gw: Gateway, t: _Transcript, sender: str, target: str, message: str) -> dict[str, Any]:
    who = f"{sender} → {target}"
    with t.lock:  # held across the call so the outcome line can't overtake the ack line
        started = time.perf_counter()
        ack = gw.message_agent(sender=sender, target=target, message=message)
        if "error" in ack:
            t.statuses[f"refused:{ack['reason']}"] += 1
            print(f"  [refused ] {who:<22} ✗ {clip(refusal_line(ack), 110)}", file=t.out, flush=True)
            return ack
        t.sent[ack["delivery_id"]] = (started, who)
        ms = (time.perf_counter() - started) * 1000
        print(f"  [ack {ms:4.1f}ms] {who:<22} → {clip(message, 70)}", file=t.out, flush=True)
    return ack


def _wait_all(gw: Gateway, t: _Transcript, acks: list[dict[str, Any]], nested: int = 0) -> None:
    """Wait until the outcomes of ``acks`` (and ``nested`` DMs sent inside turns) are printed."""
    for ack in acks:
        if "delivery_id" in ack:
            gw.wait_outcome(ack["delivery_id"], timeout=30)
    with t.lock:
        t.expected += sum(1 for a in acks if "delivery_id" in a) + nested
    t.await_seen(t.expected)


def run_demo(*, keep: bool = False, out: TextIO) -> int:
    """Run the scripted demo on a temporary root, removed on every way out (unless ``keep``).

    Whatever ends the demo (an error, an interrupt, a stdout whose reader left at its first line) removes the
    root (:func:`_remove`); before, one raised before the script's first step (a ``BrokenPipeError`` at the first
    line) left it.

    Args:
        keep: keep the temporary root and print its path.
        out: where the transcript goes.

    Returns:
        The exit code: 0 when every step behaved, else 1.
    """
    tmp = Path(tempfile.mkdtemp(prefix="hermes-actors-demo-"))
    root = tmp / "root"
    try:
        return _run_script(root, out)
    finally:
        if keep:
            print(f"\nroot kept at {root}", file=out)
        else:
            _remove(tmp)


def _remove(tmp: Path) -> None:
    """Remove the demo's temporary directory, even when an interrupt (Ctrl-C; SIGTERM or SIGHUP under the command)
    lands in the middle of it: the removal is done again in full, then the interrupt raised again.

    Raises:
        KeyboardInterrupt: the one that interrupted the first attempt.
    """
    try:
        shutil.rmtree(tmp, ignore_errors=True)
    except KeyboardInterrupt:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _run_script(root: Path, out: TextIO) -> int:
    """The demo's steps on a root made at ``root`` (the second connection's beside it); the exit code."""
    create_demo_root(root)
    t = _Transcript(out)
    print(f"hermes-actors demo — a managed Hermes root with four bots at {root}", file=out)
    gw = Gateway(root, runner=DemoRunner(delays={"scribe": 0.3}), config=DEMO_CONFIG)
    gw.subscribe(t.on_outcome, rooms=True)
    with gw:
        print("\nRoster:", file=out)
        for row in gw.roster():
            line = f"  @{row['handle']:<8} {row['display_name']:<8} {row['title']:<12} {row['description']}"
            print(line, file=out)

        t.say("\n1. A question and its reply")
        _wait_all(gw, t, [_send(gw, t, "hermes", "scout", "What do we know about churn in the EU market?")])

        t.say("\n2. A DM sent from inside a turn (@hermes asks @scout while answering)")
        _wait_all(gw, t, [_send(gw, t, "scout", "hermes", "Can you make a plan for the launch review?")], nested=1)

        t.say("\n3. Fan-in: four DMs to @scribe at once (one turn at a time, 0.5 s wait budget)")
        acks: list[dict[str, Any]] = []
        barrier = threading.Barrier(4)
        senders = [("hermes", "Draft the intro."), ("scout", "Add the EU numbers."),
                   ("critic", "Shorten para 2."), ("hermes", "And a title, please.")]

        def fire(sender: str, text: str) -> None:
            try:
                barrier.wait()
                acks.append(_send(gw, t, sender, "scribe", text))
            except (threading.BrokenBarrierError, RuntimeError):  # the demo was interrupted: its gateway stops
                return

        threads = [threading.Thread(target=fire, args=pair) for pair in senders]
        try:
            for th in threads:
                th.start()
            for th in threads:
                th.join()
        except BaseException:  # interrupted (Ctrl-C, SIGTERM): none waits at the barrier for ever, where the
            barrier.abort()  # process's exit would wait for it
            raise
        _wait_all(gw, t, acks)

        t.say("\n4. An intentional silence")
        _wait_all(gw, t, [_send(gw, t, "scout", "critic", "FYI: the draft moved to docs/launch.md")])

        t.say("\n5. Refusals, answered at once")
        _send(gw, t, "hermes", "nobody", "hello?")
        _send(gw, t, "scout", "scout", "note to self")
        _send(gw, t, "hermes", "a b!", "hi")

        t.say("\n6. A group room: one message, serial rounds, each bot answers or passes")
        _room(gw, t)

        t.say("\n7. Across connections: a second gateway ('mini') and the relay hub, through bot_relay/ files")
        _cross_connection(gw, t, root, root.parent / "mini")
    _summary(t, out)
    expected = {"replied", "silent", "failed:target_busy", "refused:unknown", "room:needs_you"}
    return 0 if expected <= set(t.statuses) else 1


def _room(gw: Gateway, t: _Transcript) -> None:
    """Create a room of the four bots, post one message, wait until it settles (the coordinator asks @user)."""
    room = gw.create_room("launch", ["hermes", "scout", "scribe", "critic"])
    t.say(f"  room '{room['name']}': " + ", ".join("@" + m for m in room["members"]))
    text = "Launch post for Friday: what do we need?"
    t.say(f"  [room launch · round 0] user: {text}")
    gw.room_send("launch", "user", text)
    state = gw.wait_room_idle("launch", timeout=30)
    with t.lock:  # its events reach the transcript on its subscription's notifier thread: print them before going on
        t.lock.wait_for(lambda: t.statuses[f"room:{state}"] > 0, timeout=10)
    gw.disband_room("launch")
    with t.lock:  # printed in this section, not under the next one's heading
        t.lock.wait_for(lambda: "launch" in t.disbanded, timeout=10)


def _cross_connection(gw: Gateway, t: _Transcript, root: Path, mini_root: Path) -> None:
    """Run a second gateway and the hub in this process; DM @dave on mini and wait for the reply."""
    from hermes_actors.relay.hub import run_hub

    cast = (DemoBot("default", "Mini", "Coordinator", "Runs the mini box."),
            DemoBot("dave", "Dave", "Analyst", "Crunches the numbers."))
    create_demo_root(mini_root, cast)
    stop = threading.Event()
    hub = threading.Thread(
        target=run_hub, args=([root, mini_root],), kwargs={"names": ["alpha", "mini"], "stop": stop, "quiet": True},
        name="demo-hub", daemon=True,
    )
    with Gateway(mini_root, runner=DemoRunner(cast), connection_id="mini"):
        hub.start()
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not any(r["connection_id"] == "mini" for r in gw.roster()):
                time.sleep(0.02)  # the hub pushes the roster on its first tick
            _wait_all(gw, t, [_send(gw, t, "hermes", "dave@mini", "Can you pull the Q3 churn numbers?")])
        finally:
            stop.set()
            hub.join(timeout=10)


def _summary(t: _Transcript, out: TextIO) -> None:
    lat = sorted(t.latencies)
    print("\nSummary", file=out)
    print(f"  {'outcome':<28} {'count':>5}", file=out)
    for key, count in sorted(t.statuses.items()):
        print(f"  {key:<28} {count:>5}", file=out)
    if lat:
        p50 = statistics.median(lat)
        print(f"  {'latency p50 / max (ms)':<28} {p50:>5.1f} / {lat[-1]:.1f}", file=out)
