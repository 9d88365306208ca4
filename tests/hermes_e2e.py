"""Helpers for the end-to-end tests with the real hermes-agent (test_hermes_e2e.py, bench/hermes_round_trip.py).

Everything is offline: hermes talks to the fake model (tests/fake_model.py) on
127.0.0.1, the profiles are the ones :func:`make_offline_root` lays out, and
every process started here runs in its own process group, killed by
:class:`Processes` when the test ends.

The bots' behaviour is :func:`bot_script`, decided by the text of the turn:

- ``DM <target>: <message>`` anywhere in a user message → the model calls
  ``message_agent(target, message)``; after the tool result it answers
  ``<profile> sent it: <tool result>`` (so the ack or refusal is on record);
- a wake-up (``Reply from …`` and the other outcome texts) → ``<profile> noted: <text>``;
- anything else → ``<profile> got: <text>``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml
from fake_model import (
    FakeModel,
    ModelCall,
    ToolCall,
    hermes_env,
    last_user_text,
    make_offline_root,
    message_agent_call,
    profile_of,
    text_of,
)

import hermes_actors
from actors.testkit import await_condition

BOT_CHAT = "Bot Chat"
API_KEY = "e2e-api-key-0123456789abcdef"
CLI_TURN_TIMEOUT = 240.0  # one CLI turn costs 5-9 s of CPU here, far more on a loaded machine
START_TIMEOUT = 180.0  # a host or a hermes gateway coming up
FLOW_TIMEOUT = 240.0  # a DM's whole way: the target's turn, then the sender's wake-up turn
POLL_SECONDS = 0.25  # between looks at a host, a gateway or a Bot Chat (each look is a socket or a sqlite read)
_DM_RE = re.compile(r"DM @?([A-Za-z0-9_-]+): (.+)\Z", re.S)
_WAKE_PREFIXES = ("Reply from ", "Delivery to ", "target_busy:")  # the outcome texts (core/outcomes.py)
_SILENT_MARK = "read your message and chose not to reply"
PLUGIN_GROUP = "hermes_agent.plugins"
PLUGIN_ENTRY = "hermes-actors"


# ── the bots ────────────────────────────────────────────────────────────────


def is_wake_text(text: str) -> bool:
    """Whether a user message is an outcome delivered as a wake-up turn (not a DM to act on)."""
    return text.startswith(_WAKE_PREFIXES) or _SILENT_MARK in text


def bot_script(messages: list[dict[str, Any]]) -> str | ToolCall:
    """How every test bot answers (see the module docstring)."""
    profile = profile_of(messages) or "someone"
    if messages and messages[-1].get("role") == "tool":
        return f"{profile} sent it: {text_of(messages[-1])}"
    text = last_user_text(messages)
    if is_wake_text(text):
        return f"{profile} noted: {text}"
    found = _DM_RE.search(text)
    if found:
        return message_agent_call(found.group(1), found.group(2))
    return f"{profile} got: {text}"


def dm_text(sender_title: str, sender: str, message: str) -> str:
    """What the target's turn reads for a DM (the seed's prefix)."""
    return f"Message from 🤖 {sender_title} (@{sender}): {message}"


def turn_of(profile: str, text: str) -> Callable[[ModelCall], bool]:
    """Matches the first request of ``profile``'s turn whose input is exactly ``text``."""
    return lambda c: c.profile == profile and c.tool_result is None and c.user_text == text


def tool_result_of(profile: str, text: str) -> Callable[[ModelCall], bool]:
    """Matches the request carrying the tool result of ``profile``'s turn on input ``text``."""
    return lambda c: c.profile == profile and c.tool_result is not None and c.user_text == text


def wake_calls(model: FakeModel, profile: str, text: str) -> list[ModelCall]:
    """The wake-up turns ``profile`` got whose input is exactly ``text``."""
    return model.calls_where(turn_of(profile, text))


# ── the root ────────────────────────────────────────────────────────────────


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def plugin_entry_point_installed() -> bool:
    """Whether the installed hermes-actors metadata declares our hermes plugin entry point."""
    return any(ep.name == PLUGIN_ENTRY for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP))


def subprocess_pythonpath(scratch: Path) -> str:
    """The PYTHONPATH for hermes processes: this checkout first, and the entry point when not installed.

    An editable install made before the entry point was added to pyproject has
    stale metadata; a throwaway ``.dist-info`` declaring it stands in (``make test``
    installs fresh metadata, so there the installed one is used).
    """
    parts = [str(Path(hermes_actors.__file__).resolve().parent.parent)]
    if not plugin_entry_point_installed():
        dist = scratch / "entry-point" / "hermes_actors_e2e-0.0.dist-info"
        dist.mkdir(parents=True, exist_ok=True)
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hermes-actors-e2e\nVersion: 0.0\n")
        (dist / "entry_points.txt").write_text(f"[{PLUGIN_GROUP}]\n{PLUGIN_ENTRY} = hermes_actors.hermes.plugin\n")
        parts.append(str(dist.parent))
    inherited = os.environ.get("PYTHONPATH")
    return os.pathsep.join([*parts, inherited] if inherited else parts)


@dataclass
class E2ERoot:
    """An offline hermes root, its profiles and the environment every process here runs with."""

    root: Path
    env: dict[str, str]
    cli: str
    logs: Path
    profiles: list[str] = field(default_factory=list)

    def home(self, profile: str) -> Path:
        """The home of ``profile`` (``default`` is the root)."""
        return self.root if profile == "default" else self.root / "profiles" / profile

    def hermes_actors(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run ``hermes-actors ARGS`` (as a user would) and return the finished process."""
        return subprocess.run([sys.executable, "-c", "from hermes_actors.cli.main import main; main()", *args],
                              env=self.env, capture_output=True, text=True, timeout=timeout, check=False)

    def enable(self, *extra: str) -> str:
        """``hermes-actors enable --root R [extra]``; returns its output.

        Raises:
            AssertionError: it failed.
        """
        done = self.hermes_actors("enable", "--root", str(self.root), "--cli", self.cli, *extra)
        assert done.returncode == 0, f"enable failed ({done.returncode}): {done.stdout}{done.stderr}"
        return done.stdout

    def set_bot_mode(self, **values: Any) -> None:
        """Set keys of ``bot_mode`` in the root's config.yaml (read by the host when it starts)."""
        path = self.root / "config.yaml"
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        config.setdefault("bot_mode", {}).update(values)
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")

    def list_actors_first(self) -> None:
        """Put ``platforms.hermes_actors`` before ``platforms.api_server`` in the root's config.yaml: hermes then
        connects our platform (the actors start) before its API server."""
        path = self.root / "config.yaml"
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        platforms = config.get("platforms") or {}
        config["platforms"] = {"hermes_actors": platforms.pop("hermes_actors"), **platforms}
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")

    def keep_actors_out_of_the_gateway(self) -> None:
        """``platforms.hermes_actors.enabled: false``: the hermes gateway serves warm turns only, ``serve`` hosts."""
        path = self.root / "config.yaml"
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        config.setdefault("platforms", {}).setdefault("hermes_actors", {})["enabled"] = False
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")


def make_e2e_root(base: Path, model: FakeModel, profiles: list[str], cli: str) -> E2ERoot:
    """An offline root under ``base`` with ``profiles``, pointing at ``model``.

    Args:
        base: a scratch directory (created).
        model: the fake model.
        profiles: the non-default profile names.
        cli: the hermes executable.

    Returns:
        The root (not yet enabled).
    """
    root = make_offline_root(base / "hermes", model.base_url, profiles)
    for name in profiles:  # the name hermes shows ("Alice"); DMs are signed with it
        (root / "profiles" / name / "profile.yaml").write_text(f"display_name: {name.title()}\n", encoding="utf-8")
    scratch_home = base / "home"
    scratch_home.mkdir(parents=True, exist_ok=True)
    logs = base / "logs"
    logs.mkdir(exist_ok=True)
    env = {**os.environ, **hermes_env(root, scratch_home), "PYTHONPATH": subprocess_pythonpath(base),
           "API_SERVER_KEY": API_KEY, "HERMES_ACTORS_HERMES_CLI": cli}
    env.pop("HERMES_ACTORS_HOP", None)  # the user's own turns are hop 0
    return E2ERoot(root, env, cli, logs, list(profiles))


# ── processes ───────────────────────────────────────────────────────────────


class Processes:
    """Processes started by a test, each in its own process group; :meth:`close` kills what is left."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[Any]] = []
        self._logs: list[IO[Any]] = []

    def spawn(self, argv: list[str], *, env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen[Any]:
        """Start ``argv`` in a new session, its output appended to ``log``."""
        handle = open(log, "ab")  # noqa: SIM115 — closed in close(), after the process is gone
        self._logs.append(handle)
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=handle,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self._procs.append(proc)
        return proc

    @staticmethod
    def kill_group(proc: subprocess.Popen[Any], sig: int = signal.SIGKILL) -> None:
        """Signal ``proc``'s whole process group (the process and every child it started)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    def stop(self, proc: subprocess.Popen[Any], timeout: float = 30.0) -> None:
        """SIGTERM the group, then SIGKILL it when it outlives ``timeout``; reap the process."""
        self.kill_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        self.kill_group(proc, signal.SIGKILL)  # children that outlive their parent go too
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def close(self) -> None:
        """Stop every process group started here and close the logs."""
        for proc in reversed(self._procs):
            self.stop(proc, timeout=15.0)
        for handle in self._logs:
            handle.close()


@contextlib.contextmanager
def processes() -> Iterator[Processes]:
    """A :class:`Processes` closed on exit."""
    procs = Processes()
    try:
        yield procs
    finally:
        procs.close()


def log_tail(path: Path, chars: int = 3000) -> str:
    """The end of a log file (for failure messages)."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def start_serve(procs: Processes, e2e: E2ERoot, name: str = "serve") -> subprocess.Popen[Any]:
    """``hermes-actors serve --root R`` as a subprocess, returned once its submit endpoint answers."""
    from hermes_actors.hermes.submit import ping

    log = e2e.logs / f"{name}.log"
    proc = procs.spawn([sys.executable, "-c", "from hermes_actors.cli.main import main; main()",
                        "serve", "--root", str(e2e.root)], env=e2e.env, cwd=e2e.root, log=log)

    def up() -> bool:
        assert proc.poll() is None, f"serve exited with {proc.returncode}: {log_tail(log)}"
        answer = ping(e2e.root)
        return answer is not None and answer.get("pid") == proc.pid

    await_condition(up, timeout=START_TIMEOUT, interval=POLL_SECONDS, message=f"serve's submit endpoint on {e2e.root}")
    return proc


def start_hermes_gateway(procs: Processes, e2e: E2ERoot, port: int, *, hosts: bool = True,
                         api: bool = True) -> subprocess.Popen[Any]:
    """``hermes gateway run`` on the root, returned once its API server answers (and it hosts our actors).

    Args:
        hosts: whether the root's config has the gateway host the actors; False: only its API
            server is waited for (see :meth:`E2ERoot.keep_actors_out_of_the_gateway`).
        api: wait for the API server too; False: returned as soon as it hosts our actors.
    """
    from hermes_actors.hermes.api_client import ApiServer
    from hermes_actors.hermes.select import probe_api_server
    from hermes_actors.hermes.submit import ping

    log = e2e.logs / "hermes-gateway.log"
    proc = procs.spawn([e2e.cli, "gateway", "run"], env=e2e.env, cwd=e2e.root, log=log)
    server = ApiServer("127.0.0.1", port, API_KEY)

    def up() -> bool:
        assert proc.poll() is None, f"hermes gateway exited with {proc.returncode}: {log_tail(log)}"
        if hosts:
            answer = ping(e2e.root)
            if answer is None or answer.get("pid") != proc.pid:
                return False
        return not api or probe_api_server(server)

    await_condition(up, timeout=START_TIMEOUT, interval=POLL_SECONDS,
                    message="the hermes gateway's API server" + (" and its actors" if hosts else ""))
    return proc


def cli_turn_argv(e2e: E2ERoot, profile: str, text: str, session: str | None = BOT_CHAT) -> list[str]:
    """A user's own turn: ``hermes -p NAME chat [-c SESSION] -q TEXT -Q --no-restore-cwd``."""
    argv = [e2e.cli, "-p", profile, "chat"]
    if session is not None:
        argv += ["-c", session]
    return [*argv, "-q", text, "-Q", "--no-restore-cwd"]


def run_cli_turn(e2e: E2ERoot, profile: str, text: str, session: str | None = BOT_CHAT) -> str:
    """Run one CLI turn of ``profile`` to its end; returns its stdout.

    Raises:
        AssertionError: the turn failed.
    """
    done = subprocess.run(cli_turn_argv(e2e, profile, text, session), env=e2e.env, cwd=e2e.home(profile),
                          capture_output=True, text=True, timeout=CLI_TURN_TIMEOUT, check=False,
                          start_new_session=True)
    assert done.returncode == 0, f"{profile}'s CLI turn failed ({done.returncode}): {done.stdout}{done.stderr}"
    return done.stdout


def start_cli_turn(procs: Processes, e2e: E2ERoot, profile: str, text: str) -> subprocess.Popen[Any]:
    """Start one CLI turn of ``profile`` in Bot Chat in the background (its output in the logs)."""
    log = e2e.logs / f"cli-{profile}-{time.monotonic_ns()}.log"
    return procs.spawn(cli_turn_argv(e2e, profile, text), env=e2e.env, cwd=e2e.home(profile), log=log)


# ── state ───────────────────────────────────────────────────────────────────


def bot_chat_messages(home: Path) -> list[tuple[str, str]]:
    """(role, content) of every message in the profile's Bot Chat, oldest first ([] before it exists)."""
    if not (home / "state.db").is_file():
        return []
    conn = sqlite3.connect(f"file:{home / 'state.db'}?mode=ro", uri=True, timeout=30)
    try:
        return [(str(role), str(content)) for role, content in conn.execute(
            "SELECT m.role, m.content FROM messages m JOIN sessions s ON s.id = m.session_id "
            "WHERE s.title = ? ORDER BY m.id", (BOT_CHAT,))]
    finally:
        conn.close()


def journal_files(root: Path) -> list[Path]:
    """Every file under the root's journal and outbox directories (what a queued DM leaves)."""
    found: list[Path] = []
    for sub in ("journal", "outbox", "live"):
        base = root / "bot_relay" / sub
        if base.is_dir():
            found += [p for p in base.rglob("*") if p.is_file()]
    return found
