"""A scriptable OpenAI-compatible fake model for tests against the real hermes CLI.

The server binds 127.0.0.1 on a free port and serves:

- ``GET /v1/models`` — one model, ``fake-model``;
- ``POST /v1/chat/completions`` — non-stream and ``stream: true`` (SSE
  ``chat.completion.chunk`` events ending with ``data: [DONE]``, a usage chunk
  when ``stream_options.include_usage`` is set), the shape the openai 2.x
  client that hermes-agent 0.19 uses accumulates: ``choices[0].delta.content``
  and ``choices[0].delta.tool_calls[i]`` with ``index``/``id``/``function``.

The reply is decided by a script: ``script(messages) -> str | ToolCall``. The
default script answers ``fake reply to: <last user text>``; once a tool result
is the last message it answers ``tool said: <result>`` so a tool-calling turn
ends. Every request body is recorded in :attr:`FakeModel.requests`.

For end-to-end tests each chat request is also recorded as a :class:`ModelCall`
naming the profile it came from: :func:`make_offline_root` writes a ``SOUL.md``
per profile whose marker hermes puts in the system prompt
(:func:`profile_of`). The model can hold matching requests until the test
releases them (:meth:`FakeModel.hold`), and it records every request that
arrives while another one of the same profile is still being answered
(:attr:`FakeModel.overlaps`) — the proof that two turns ran at once on one bot.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

MODEL_NAME = "fake-model"
API_KEY = "sk-fake"


@dataclass(frozen=True)
class ToolCall:
    """A reply that calls one tool (the model's turn continues after the result)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


#: A scripted reply that breaks the stream: one cut-off chunk, then the connection closes (a provider
#: dying mid-answer; hermes retries it and then hands back "API call failed after 3 retries: …").
BROKEN_STREAM = "<<fake-model: broken stream>>"


def message_agent_call(target: str, message: str) -> ToolCall:
    """The ``message_agent(target, message)`` tool call as a scripted reply."""
    return ToolCall("message_agent", {"target": target, "message": message})


Script = Callable[[list[dict[str, Any]]], "str | ToolCall"]

PROFILE_MARKER = "Fake-model profile marker:"
_MARKER_RE = re.compile(re.escape(PROFILE_MARKER) + r" ([A-Za-z0-9_-]+)\.")
# hermes-agent 0.19's platform hint in the system prompt (agent/prompt_builder.py PLATFORM_HINTS):
# tells a CLI turn from a warm turn through the gateway's API server
_PLATFORM_HINTS = {"cli": "You are a CLI AI Agent.", "api_server": "You're responding through an API server."}
_HOLD_LIMIT = 600.0  # a held request never outlives a broken test by more than this


def soul_text(profile: str) -> str:
    """The ``SOUL.md`` of a test profile: its marker, which hermes injects into the system prompt."""
    return f"{PROFILE_MARKER} {profile}.\n"


def profile_of(messages: list[dict[str, Any]]) -> str:
    """The profile a request came from, read from the marker in its system prompt ("" when none)."""
    for message in messages:
        if message.get("role") == "system":
            found = _MARKER_RE.search(text_of(message))
            if found:
                return found.group(1)
    return ""


@dataclass
class ModelCall:
    """One chat request as the fake model saw it."""

    index: int
    profile: str
    messages: list[dict[str, Any]]
    received: float  # time.monotonic() on arrival
    answered: float | None = None  # time.monotonic() once the reply was written

    @property
    def platform(self) -> str:
        """The platform of the session's first turn, from hermes' hint: ``cli``, ``api_server`` or "" (unknown).

        hermes stores a session's system prompt with its first turn and reuses it, so
        this tells where a turn runs only on a session that began with it.
        """
        system = "".join(text_of(m) for m in self.messages if m.get("role") == "system")
        return next((name for name, hint in _PLATFORM_HINTS.items() if hint in system), "")

    @property
    def last(self) -> dict[str, Any]:
        """The last message of the request."""
        return self.messages[-1] if self.messages else {}

    @property
    def user_text(self) -> str:
        """The text of the last user message (the turn's input)."""
        return last_user_text(self.messages)

    @property
    def tool_result(self) -> str | None:
        """The tool result this request carries as its last message, else None."""
        return text_of(self.last) if self.last.get("role") == "tool" else None


class Hold:
    """Requests matching ``predicate`` wait in the fake model until :meth:`release`.

    Args:
        predicate: which calls to hold.
        count: how many calls to hold at most (later matches pass).
    """

    def __init__(self, predicate: Callable[[ModelCall], bool], count: int = 1) -> None:
        self.predicate = predicate
        self.remaining = count
        self.held: list[ModelCall] = []
        self.entered = threading.Event()
        self._released = threading.Event()

    def release(self) -> None:
        """Let every held (and any later matching) request through."""
        self._released.set()

    def wait_entered(self, timeout: float) -> ModelCall:
        """The first held call, once one arrived.

        Raises:
            AssertionError: none arrived within ``timeout`` seconds.
        """
        assert self.entered.wait(timeout), f"no request matching the hold arrived within {timeout:g}s"
        return self.held[0]


def text_of(message: dict[str, Any]) -> str:
    """The plain text of one chat message (string or content-part list)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def last_user_text(messages: list[dict[str, Any]]) -> str:
    """The text of the last user message ("" when none)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return text_of(message)
    return ""


def default_script(messages: list[dict[str, Any]]) -> str | ToolCall:
    """Echo the last user text; after a tool result, report the result."""
    if messages and messages[-1].get("role") == "tool":
        return f"tool said: {text_of(messages[-1])}"
    return f"fake reply to: {last_user_text(messages)}"


class FakeModel:
    """The server; use :func:`running_fake_model` or ``start()``/``stop()``.

    Args:
        script: decides each reply from the request's messages.
    """

    def __init__(self, script: Script = default_script) -> None:
        self.script: Script = script
        self.requests: list[dict[str, Any]] = []
        self.calls: list[ModelCall] = []
        self.overlaps: list[tuple[str, int]] = []  # (profile, index of the call that arrived during another)
        self._active: dict[str, int] = {}
        self._holds: list[Hold] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (the server must be started)."""
        assert self._server is not None, "FakeModel is not started"
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def chat_requests(self) -> list[dict[str, Any]]:
        """The recorded chat-completion request bodies, oldest first."""
        with self._lock:
            return list(self.requests)

    def hold(self, predicate: Callable[[ModelCall], bool], count: int = 1) -> Hold:
        """Hold the next ``count`` requests matching ``predicate`` until the returned hold is released."""
        hold = Hold(predicate, count)
        with self._lock:
            self._holds.append(hold)
        return hold

    def begin_call(self, body: dict[str, Any]) -> tuple[ModelCall, Hold | None]:
        """Record a chat request as a call (and as overlapping when its profile is mid-answer)."""
        messages = list(body.get("messages") or [])
        with self._lock:
            self.requests.append(body)
            call = ModelCall(len(self.calls), profile_of(messages), messages, time.monotonic())
            self.calls.append(call)
            if call.profile and self._active.get(call.profile, 0) > 0:
                self.overlaps.append((call.profile, call.index))
            self._active[call.profile] = self._active.get(call.profile, 0) + 1
            hold = next((h for h in self._holds if h.remaining > 0 and h.predicate(call)), None)
            if hold is not None:
                hold.remaining -= 1
                hold.held.append(call)
            self._changed.notify_all()
        if hold is not None:
            hold.entered.set()
        return call, hold

    def end_call(self, call: ModelCall) -> None:
        """The reply to ``call`` was written (or failed)."""
        with self._lock:
            call.answered = time.monotonic()
            self._active[call.profile] -= 1
            self._changed.notify_all()

    def calls_where(self, predicate: Callable[[ModelCall], bool]) -> list[ModelCall]:
        """The recorded calls matching ``predicate``, oldest first."""
        with self._lock:
            return [c for c in self.calls if predicate(c)]

    def wait_for(self, predicate: Callable[[ModelCall], bool], timeout: float, answered: bool = False) -> ModelCall:
        """The first call matching ``predicate`` (once answered, with ``answered``), waiting up to ``timeout``.

        Raises:
            AssertionError: none within ``timeout`` seconds (the message lists what did arrive).
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                for call in self.calls:
                    if predicate(call) and (not answered or call.answered is not None):
                        return call
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [(c.profile, c.user_text[:80], c.tool_result is not None) for c in self.calls]
                    raise AssertionError(f"no matching model call within {timeout:g}s; calls so far: {seen}")
                self._changed.wait(min(left, 1.0))

    def release_all(self) -> None:
        """Release every hold (the server is stopping)."""
        with self._lock:
            holds = list(self._holds)
        for hold in holds:
            hold.release()

    def start(self) -> FakeModel:
        """Bind 127.0.0.1 on a free port and serve in a daemon thread."""
        model = self

        class Handler(_Handler):
            fake = model

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-model", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Release held requests, stop serving and close the socket."""
        self.release_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None


@contextlib.contextmanager
def running_fake_model(script: Script = default_script) -> Iterator[FakeModel]:
    """A started :class:`FakeModel`, stopped on exit."""
    model = FakeModel(script).start()
    try:
        yield model
    finally:
        model.stop()


class _Handler(BaseHTTPRequestHandler):
    fake: FakeModel
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return  # quiet: tests read failures from assertions, not access logs

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._json(200, {"object": "list", "data": [
                {"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "fake"},
            ]})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._json(400, {"error": {"message": "invalid JSON", "type": "invalid_request_error"}})
            return
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
            return
        call, hold = self.fake.begin_call(body)
        try:
            if hold is not None:
                hold._released.wait(_HOLD_LIMIT)
            try:
                reply = self.fake.script(list(call.messages))
            except Exception as exc:  # a broken script answers 500, it never kills the server
                self._json(500, {"error": {"message": f"fake script failed: {exc!r}", "type": "server_error"}})
                return
            if body.get("stream"):
                self._stream(reply, bool((body.get("stream_options") or {}).get("include_usage")))
            else:
                self._json(200, _completion(reply))
        except OSError:
            return  # the client went away (a killed hermes process): nothing to answer
        finally:
            self.fake.end_call(call)

    def _stream(self, reply: str | ToolCall, include_usage: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        if reply == BROKEN_STREAM:
            self.wfile.write(b'data: {"id": "x", "choices": [{"index": 0, "delta": {"content": "hal')
            self.wfile.flush()
            return
        for chunk in _chunks(reply, include_usage):
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


_USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def _envelope(kind: str) -> dict[str, Any]:
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": kind, "created": int(time.time()),
            "model": MODEL_NAME}


def _tool_call_payload(call: ToolCall) -> dict[str, Any]:
    return {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}


def _completion(reply: str | ToolCall) -> dict[str, Any]:
    if isinstance(reply, ToolCall):
        message: dict[str, Any] = {"role": "assistant", "content": None,
                                   "tool_calls": [_tool_call_payload(reply)]}
        finish = "tool_calls"
    else:
        message, finish = {"role": "assistant", "content": reply}, "stop"
    return {**_envelope("chat.completion"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": _USAGE}


def _chunks(reply: str | ToolCall, include_usage: bool) -> list[dict[str, Any]]:
    base = _envelope("chat.completion.chunk")

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    if isinstance(reply, ToolCall):
        payload = _tool_call_payload(reply)
        arguments = payload["function"]["arguments"]
        half = len(arguments) // 2  # arguments arrive in pieces, as real providers send them
        chunks.append(chunk({"tool_calls": [{"index": 0, "id": payload["id"], "type": "function",
                                             "function": {"name": reply.name, "arguments": arguments[:half]}}]}))
        chunks.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[half:]}}]}))
        chunks.append(chunk({}, "tool_calls"))
    else:
        words = reply.split(" ")
        for i, word in enumerate(words):
            chunks.append(chunk({"content": word if i == 0 else " " + word}))
        chunks.append(chunk({}, "stop"))
    if include_usage:
        chunks.append({**base, "choices": [], "usage": _USAGE})
    return chunks


# ── an offline HERMES_HOME ──────────────────────────────────────────────────


def offline_config(base_url: str) -> dict[str, Any]:
    """The config.yaml mapping that points hermes at the fake model, offline."""
    return {
        # context_length: hermes otherwise asks openrouter.ai for model metadata (a network call)
        "model": {"provider": "custom", "default": MODEL_NAME, "base_url": base_url, "api_key": API_KEY,
                  "context_length": 128000},
        "security": {"tirith_enabled": False, "allow_lazy_installs": False},
    }


def write_offline_home(home: Path, base_url: str, extra: dict[str, Any] | None = None) -> Path:
    """Create ``home`` (a root or a profile home) with an offline config.yaml.

    Args:
        home: the directory (created).
        base_url: the fake model's base URL.
        extra: top-level keys merged over the offline config.

    Returns:
        ``home``.
    """
    home.mkdir(parents=True, exist_ok=True)
    config = {**offline_config(base_url), **(extra or {})}
    (home / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return home


def make_offline_root(root: Path, base_url: str, profiles: list[str]) -> Path:
    """An offline Hermes root: the default profile at ``root``, others under ``root/profiles``.

    Profiles are laid out the way ``hermes profile create --no-alias`` does it
    for the parts hermes reads (a directory with its own config.yaml and .env);
    creating them with the real CLI costs seconds each. Every profile gets a
    ``SOUL.md`` carrying its marker (:func:`profile_of`).

    Args:
        root: the root directory (created).
        base_url: the fake model's base URL.
        profiles: the non-default profile names.

    Returns:
        ``root``.
    """
    write_offline_home(root, base_url)
    (root / "SOUL.md").write_text(soul_text("default"), encoding="utf-8")
    for name in profiles:
        home = write_offline_home(root / "profiles" / name, base_url)
        (home / "SOUL.md").write_text(soul_text(name), encoding="utf-8")
        (home / ".env").write_text("", encoding="utf-8")
        (home / ".env").chmod(0o600)
    return root


def hermes_env(root: Path, home_dir: Path) -> dict[str, str]:
    """Environment variables that keep a hermes process inside ``root`` and offline.

    Args:
        root: the Hermes root (``HERMES_HOME``).
        home_dir: a scratch ``HOME`` so nothing under the real ``~`` is read or written.

    Returns:
        The variables to set over ``os.environ``.
    """
    return {
        "HERMES_HOME": str(root),
        "HOME": str(home_dir),
        "NO_COLOR": "1",
        "HERMES_DISABLE_UPDATE_CHECK": "1",
        "OPENAI_API_KEY": "",
        "OPENROUTER_API_KEY": "",
        "ANTHROPIC_API_KEY": "",
    }
