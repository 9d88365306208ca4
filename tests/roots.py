"""Test helpers: a managed Hermes root on disk, recording and logging turn runners, starting a Gateway,
capturing log lines.

    root = make_root(tmp_path, {"alice": {}, "bob": {"title": "Builder"}})
    rec = RecordingRunner()
    with Gateway(root, runner=rec) as gw: ...

The root is the ``default`` profile's home (handle ``hermes``); every other
profile lives at ``<root>/profiles/<name>/profile.yaml`` with
``ui_meta: {hermes-bots: {title: ...}}`` (managed) and optional
``display_name`` / ``description``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from loguru import logger

from actors import Rescan, ask
from actors.testkit import await_condition
from hermes_actors.gateway import Gateway
from hermes_actors.messages import Turn

__all__ = [
    "HERMES_019", "AnsweringApi", "LogCapture", "RecordingRunner", "TurnLog", "TurnRecord", "assert_gone", "body_of",
    "is_online", "logged_turns", "make_root", "process_alive", "send_dm", "start_gateway", "wait_online",
    "write_fake_cli", "write_profile",
]


def write_profile(
    home: Path,
    *,
    title: str | None = "",
    display_name: str | None = None,
    description: str | None = None,
    managed: bool = True,
) -> Path:
    """Write ``<home>/profile.yaml``; ``managed`` adds ``ui_meta["hermes-bots"]``."""
    home.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {}
    if display_name is not None:
        meta["display_name"] = display_name
    if description is not None:
        meta["description"] = description
    if managed:
        meta["ui_meta"] = {"hermes-bots": {"title": title or ""}}
    (home / "profile.yaml").write_text(yaml.safe_dump(meta, sort_keys=True), encoding="utf-8")
    return home


def make_root(
    base: Path,
    profiles: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    default: Mapping[str, Any] | None = None,
    managed: bool = True,
    config: Mapping[str, Any] | None = None,
    name: str = "hermes-root",
) -> Path:
    """Create a Hermes root under ``base``.

    Args:
        base: a directory (usually ``tmp_path``).
        profiles: folder id → ``write_profile`` keyword arguments (``title``,
            ``display_name``, ``description``, ``managed``). Default: alice, bob, carol.
        default: keyword arguments for the root's own (``default``) profile.
        managed: the default for every profile's ``managed`` flag.
        config: written to ``<root>/config.yaml`` when given.
        name: the root's directory name under ``base``.

    Returns:
        The root.
    """
    root = base / name
    root.mkdir(parents=True, exist_ok=True)
    if profiles is None:
        profiles = {"alice": {"title": "Researcher"}, "bob": {"title": "Builder"}, "carol": {"title": "Critic"}}
    write_profile(root, **{"title": "Coordinator", "managed": managed, **(default or {})})
    for folder, spec in profiles.items():
        write_profile(root / "profiles" / folder, **{"managed": managed, **spec})
    if config is not None:
        (root / "config.yaml").write_text(yaml.safe_dump(dict(config)), encoding="utf-8")
    return root


def send_dm(gw: Gateway, message: str, target: str = "bob", sender: str = "alice") -> str:
    """Send a DM that must be queued; returns its delivery id."""
    ack = gw.message_agent(sender=sender, target=target, message=message)
    assert ack.get("status") == "queued", ack
    return str(ack["delivery_id"])


def body_of(content: str) -> str:
    """The DM body without the ``Message from 🤖 … (@x): `` signature."""
    marker = "): "
    return content.split(marker, 1)[1] if marker in content else content


@dataclass(frozen=True)
class TurnRecord:
    """One runner call: the turn and its monotonic enter/exit times."""

    turn: Turn
    entered: float
    exited: float
    thread: str

    @property
    def body(self) -> str:
        return body_of(self.turn.content)


class RecordingRunner:
    """A callable runner ``fn(turn) -> str`` that records every call, thread-safely.

    Args:
        behave: what a turn does (returns the reply or raises); default replies
            ``"ok: <body>"``.
    """

    def __init__(self, behave: Callable[[Turn], Any] | None = None) -> None:
        self.behave = behave or (lambda turn: f"ok: {body_of(turn.content)}")
        self._lock = threading.Lock()
        self._entered: list[tuple[Turn, float]] = []
        self._records: list[TurnRecord] = []
        self.active = 0
        self.max_active = 0

    def __call__(self, turn: Turn) -> Any:
        entered = time.monotonic()
        with self._lock:
            self._entered.append((turn, entered))
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            return self.behave(turn)
        finally:
            exited = time.monotonic()
            with self._lock:
                self.active -= 1
                self._records.append(TurnRecord(turn, entered, exited, threading.current_thread().name))

    @property
    def entered(self) -> list[Turn]:
        """Turns entered so far, in entry order."""
        with self._lock:
            return [t for t, _ in self._entered]

    @property
    def records(self) -> list[TurnRecord]:
        """Finished calls, in exit order."""
        with self._lock:
            return list(self._records)

    def bodies(self) -> list[str]:
        """The bodies of the entered turns, in entry order."""
        return [body_of(t.content) for t in self.entered]

    def wait_entered(self, count: int, timeout: float = 5.0) -> list[Turn]:
        """Wait until at least ``count`` turns were entered."""
        await_condition(lambda: len(self.entered) >= count, timeout=timeout, message=f"{count} turns entered")
        return self.entered

    def wait_records(self, count: int, timeout: float = 5.0) -> list[TurnRecord]:
        """Wait until at least ``count`` calls finished."""
        await_condition(lambda: len(self.records) >= count, timeout=timeout, message=f"{count} turns finished")
        return self.records


def held_on(body: str, release: threading.Event, *, reply: str = "ok: ") -> Callable[[Turn], str]:
    """A ``RecordingRunner`` behaviour: the turn whose DM body is ``body`` waits for ``release``; every turn
    answers ``reply`` + its body."""
    def behave(turn: Turn) -> str:
        if body_of(turn.content) == body:
            assert release.wait(30), f"the test never released the {body!r} turn"
        return f"{reply}{body_of(turn.content)}"

    return behave


def rescan(*running: Gateway) -> None:
    """Run the relay's reconcile rescan of each gateway now, all at once (each returns once its rescan ran)."""
    asks = [threading.Thread(target=ask, args=(gw._system.relay, Rescan("manual")), kwargs={"timeout": 30})
            for gw in running if gw._system is not None]
    for thread in asks:
        thread.start()
    for thread in asks:
        thread.join(60)


def start_gateway(
    gateways: list[Gateway], root: Path, runner: Any = None, config: Mapping[str, Any] | None = None, **kwargs: Any
) -> Gateway:
    """Start a Gateway that the ``gateways`` fixture stops at teardown (even when the test failed).

    Args:
        gateways: the ``gateways`` fixture's list.
        root: the Hermes root to serve.
        runner: the turn runner; default a fresh :class:`RecordingRunner`.
        config: the config override (``{"bot_mode": {...}}``).
        **kwargs: any other ``Gateway`` keyword argument (``connection_id``, ``durable``, ...).

    Returns:
        The started Gateway.
    """
    gw = Gateway(root, runner=RecordingRunner() if runner is None else runner,
                 config=dict(config) if config is not None else None, **kwargs)
    gateways.append(gw)
    return gw.start()


class LogCapture:
    """Collects loguru records at ``level`` and above while active (a context manager).

    ``records`` holds loguru's record dicts (``r["message"]``, ``r["level"]``...), ``lines`` the message
    texts; both are live lists, appended to by the sink from any thread.
    """

    def __init__(self, level: str = "WARNING") -> None:
        self.level = level
        self.records: list[Any] = []
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._sink: int | None = None

    def __enter__(self) -> LogCapture:
        self._sink = logger.add(self._add, level=self.level, format="{message}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._sink is not None:
            logger.remove(self._sink)
            self._sink = None

    def _add(self, message: Any) -> None:
        with self._lock:
            self.records.append(message.record)
            self.lines.append(str(message).rstrip("\n"))

    def matching(self, *needles: str) -> list[str]:
        """The lines containing every one of ``needles``."""
        return [line for line in list(self.lines) if all(n in line for n in needles)]


class TurnLog:
    """A runner that logs each turn as one ``<delivery_id> <profile>`` line as it starts, then replies.

    One ``O_APPEND`` write(2) per line: lines from several threads or processes never interleave, and a
    SIGKILL right after the write leaves the line whole. Read it back with :func:`logged_turns`.

    Args:
        path: the log file (created 0600); None logs nothing.
        reply: what a turn returns (or raises); default ``done <delivery_id>``.
    """

    def __init__(self, path: Path | None, reply: Callable[[Turn], str] | None = None) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) if path is not None else None
        self.reply = reply or (lambda turn: f"done {turn.delivery_id}")

    def __call__(self, turn: Turn) -> str:
        if self.fd is not None:
            os.write(self.fd, f"{turn.delivery_id} {turn.profile}\n".encode())
        return self.reply(turn)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def logged_turns(path: Path) -> list[str]:
    """The delivery ids a :class:`TurnLog` wrote to ``path``, in order; none when there is no file."""
    if not path.exists():
        return []
    return [line.split()[0] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def is_online(gw: Gateway, handle: str, conn: str, online: bool | None = True) -> bool:
    """Whether ``gw``'s roster lists ``@handle`` on connection ``conn`` with this ``online`` state."""
    return any(r["handle"] == handle and r["connection_id"] == conn and r["online"] is online for r in gw.roster())


def wait_online(gw: Gateway, handle: str, conn: str, online: bool | None = True, timeout: float = 20) -> None:
    """Wait until :func:`is_online`; TimeoutError naming the agent otherwise."""
    await_condition(lambda: is_online(gw, handle, conn, online), timeout=timeout, interval=0.02,
                    message=f"@{handle} on {conn} online={online}")


# hermes-agent 0.19 as the peer transport meets it (for write_fake_cli): argparse refuses `peer` (exit 2)
HERMES_019 = ("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Hermes Agent v0.19.0'; exit 0; fi\n"
              "echo \"hermes: error: argument command: invalid choice: 'peer' (choose from 'chat', 'model')\" >&2\n"
              "exit 2\n")


def write_fake_cli(base: Path, script: str) -> Path:
    """Write ``script`` (starting with its ``#!`` line) as an executable ``<base>/bin/hermes``; returns its path."""
    path = base / "bin" / "hermes"
    path.parent.mkdir()
    path.write_text(script, encoding="utf-8")
    path.chmod(0o755)
    return path


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone: it only waits to be reaped)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text.rsplit(")", 1)[1].split()[0] != "Z"


def assert_gone(pid: int, timeout: float = 30.0) -> None:
    """``pid`` is gone or a zombie before the deadline (a SIGKILL is not delivered instantly)."""
    await_condition(lambda: not process_alive(pid), timeout=timeout, message=f"process {pid} is gone")


def crash_enqueue_once(monkeypatch: Any, marker: str = "crash here") -> threading.Event:
    """Make a ProfileActor raise once while it queues the first delivery whose text holds ``marker``
    (a bug inside a Deliver: the supervisor restarts it with its salvage).

    Args:
        monkeypatch: pytest's ``monkeypatch`` (the patch ends with the test).
        marker: the text that triggers the crash.

    Returns:
        An event set when the crash was injected.
    """
    from hermes_actors.local import profile_actor

    enqueue, crashed = profile_actor.ProfileActor._enqueue, threading.Event()

    def crash_once(self: Any, delivery: Any, enqueued: float) -> None:
        if marker in delivery.content and not crashed.is_set():
            crashed.set()
            raise RuntimeError("injected: a bug while queueing")
        enqueue(self, delivery, enqueued)

    monkeypatch.setattr(profile_actor.ProfileActor, "_enqueue", crash_once)
    return crashed


# A reply that crashes the ProfileActor settling it, once :func:`crash_on_reply` is in place
CRASHING_REPLY = "<a reply the ProfileActor crashes settling>"


def crash_on_reply(monkeypatch: Any, reply: str = CRASHING_REPLY) -> None:
    """Make every ProfileActor raise while it settles a turn that replied ``reply`` (a bug in its outcome code:
    its supervisor restarts it with its salvage, and the DM is ``ambiguous``).

    A runner returning anything but a str no longer crashes it (the reply is refused where the runner returns
    it), so a test of the supervision injects the crash here.

    Args:
        monkeypatch: pytest's ``monkeypatch`` (the patch ends with the test).
        reply: the reply that triggers the crash, each time it is settled.
    """
    from hermes_actors.local import profile_actor

    real = profile_actor.outcome_of_turn

    def crashing(delivery: Any, result: Any) -> Any:
        if result.reply == reply:
            raise RuntimeError("injected: a bug while settling a turn's reply")
        return real(delivery, result)

    monkeypatch.setattr(profile_actor, "outcome_of_turn", crashing)


def watch_pool_joins(monkeypatch: Any) -> list[float]:
    """Record the seconds each ``WorkerPool.shutdown`` was given to join its workers (the pool still shuts down).

    A stop's tests assert on these instead of on how long the stop took: what the stop was willing to wait for
    its workers does not depend on how loaded the machine is.

    Args:
        monkeypatch: pytest's ``monkeypatch`` (the patch ends with the test).

    Returns:
        The live list of join timeouts, in call order.
    """
    from actors import WorkerPool

    joins: list[float] = []
    real_shutdown = WorkerPool.shutdown

    def shutdown(pool: WorkerPool, timeout: float = 5.0) -> bool:
        joins.append(timeout)
        return real_shutdown(pool, timeout)

    monkeypatch.setattr(WorkerPool, "shutdown", shutdown)
    return joins


class AnsweringApi:
    """A 127.0.0.1 HTTP server answering every GET /health with ``health`` (and ``{"status": "ok"}``), any other
    GET with ``sessions``: with 200 and 200, what hermes' API server answers to our probe. On ``port`` (0: a free
    one); :meth:`close` stops it."""

    def __init__(self, health: int = 200, sessions: int = 200, port: int = 0,
                 health_body: bytes = b'{"status": "ok"}') -> None:
        import http.server

        codes = {"/health": health}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                code = codes.get(self.path.split("?")[0], sessions)
                body = health_body if self.path == "/health" else b"{}"
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
