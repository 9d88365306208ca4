"""The local submit endpoint: protocol, server, client, and the Gateway serving it."""

from __future__ import annotations

import contextlib
import errno
import importlib
import io
import json
import os
import re
import select
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from roots import LogCapture, RecordingRunner, await_condition, body_of, held_on, make_root, start_gateway

from hermes_actors.cli import main
from hermes_actors.cli.host_wait import settle_host
from hermes_actors.core.accept_retry import ACCEPT_BACKOFF_MAX, ACCEPT_BACKOFF_MIN, accept_backoff, accept_retries
from hermes_actors.errors import HostileFileError, StoreError
from hermes_actors.gateway import Gateway
from hermes_actors.hermes import submit_protocol
from hermes_actors.hermes.plugin import turn_hop_scope
from hermes_actors.hermes.submit import (
    RUN_GONE,
    RUN_REPLACED,
    RUN_SWAPPED,
    SOCKET_GONE,
    SOCKET_REPLACED,
    SubmitServer,
    endpoint_fault,
    fetch_outcome,
    fetch_status,
    ping,
    request,
    submit_dm,
)
from hermes_actors.hermes.submit_client import HostLost, HostOffline, lock_holder
from hermes_actors.hermes.submit_protocol import (
    MAX_REQUEST_BYTES,
    OutcomeCall,
    Ping,
    SendCall,
    StatusCall,
    encode,
    parse_request,
    socket_path,
)
from hermes_actors.hermes.submit_socket import open_dir, socket_address

# ── the protocol (pure) ─────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"op":"ping"}', Ping()),
        (b'{"op":"send","sender":"alice","target":"bob","message":"hi","hop":2}', SendCall("alice", "bob", "hi", 2)),
        (b'{"op":"send","sender":"alice","target":"bob","message":"hi"}', SendCall("alice", "bob", "hi", 0)),
        (b'{"op":"send","sender":"alice","target":"bob","message":"hi","hop":1,"session":"s-1"}',
         SendCall("alice", "bob", "hi", 1, session="s-1")),
        (b'{"op":"outcome","delivery_id":"ab12ab12ab12ab12ab12ab12ab12ab12","wait":1.5}',
         OutcomeCall("ab12ab12ab12ab12ab12ab12ab12ab12", 1.5)),
        (b'{"op":"status"}', StatusCall()),
        # Regression (CLI fuzz): what the values say is the gateway's to refuse, in its own words (plan_send), as
        # without a host; the endpoint refused these itself ("bad submit request: 'sender' must be a non-empty …")
        (b'{"op":"send","sender":"","target":"bob","message":"hi"}', SendCall("", "bob", "hi", 0)),
        (b'{"op":"send","sender":"alice","target":"' + b"a" * 300 + b'","message":"hi"}',
         SendCall("alice", "a" * 300, "hi", 0)),
        (b'{"op":"send","sender":"' + b"a" * 300 + b'","target":"","message":""}', SendCall("a" * 300, "", "", 0)),
    ],
)
def test_well_formed_requests_parse(raw: bytes, expected: object) -> None:
    assert parse_request(raw) == expected


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        (b"{nope", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object, got list"),
        (b'{"op":"fly"}', "unknown op 'fly'"),
        (b'{"op":"ping","extra":1}', "unknown field(s) for op 'ping': extra"),
        (b'{"op":"status","verbose":1}', "unknown field(s) for op 'status': verbose"),
        (b'{"op":"send","target":"bob","message":"hi"}', "'sender' must be a string, got NoneType"),
        (b'{"op":"send","sender":["a"],"target":"bob","message":"hi"}', "'sender' must be a string, got list"),
        (b'{"op":"send","sender":"a","target":7,"message":"hi"}', "'target' must be a string, got int"),
        (b'{"op":"send","sender":"a","target":"b","message":null}', "'message' must be a string, got NoneType"),
        (b'{"op":"send","sender":"a","target":"b","message":"m","hop":true}', "'hop' must be an integer"),
        (b'{"op":"send","sender":"a","target":"b","message":"m","hop":-1}', "'hop' must be an integer"),
        (b'{"op":"send","sender":"a","target":"b","message":"m","author":"x"}', "'author' must be an object"),
        (b'{"op":"send","sender":"a","target":"b","message":"m","session":7}',
         "'session' must be the hermes session id"),
        (b'{"op":"send","sender":"a","target":"b","message":"m","session":"' + b"s" * 300 + b'"}',
         "'session' must be the hermes session id"),
        (b'{"op":"outcome","delivery_id":"../etc"}', "'delivery_id' must be a delivery id"),
        (b'{"op":"outcome","delivery_id":"AB12AB12AB12AB12AB12AB12AB12AB12"}', "'delivery_id' must be a delivery id"),
        (b'{"op":"outcome","delivery_id":"ab12ab12ab12ab12ab12ab12ab12ab12","wait":1e9}',
         "'wait' must be a number of seconds"),
    ],
)
def test_bad_requests_name_what_is_wrong(raw: bytes, names: str) -> None:
    answer = parse_request(raw)
    assert isinstance(answer, dict)
    assert answer["reason"] == "unknown"
    assert answer["error"].startswith("bad submit request: ")
    assert names in answer["error"]


# ── the server with a recording send function ───────────────────────────────


class Recorder:
    def __init__(self) -> None:
        self.calls: list[SendCall] = []

    def __call__(self, call: SendCall) -> dict[str, Any]:
        self.calls.append(call)
        # a delivery id as a host gives it (32 lowercase hex): an answer with no such id is no ack (submit_dm)
        return {"status": "queued", "delivery_id": f"{len(self.calls):032x}", "to": f"@{call.target}"}


@pytest.fixture
def server_root(tmp_path: Path) -> Path:
    root = tmp_path / "r"
    root.mkdir()
    return root


def _raw_exchange(root: Path, data: bytes) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(socket_path(root)))
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    answer: dict[str, Any] = json.loads(out)
    return answer


def test_a_send_round_trips_to_the_send_function(server_root: Path) -> None:
    rec = Recorder()
    with SubmitServer(server_root, send=rec):
        answer = submit_dm(server_root, "alice", "bob", "hi", hop=3)
        pong = ping(server_root)
    assert answer == {"status": "queued", "delivery_id": f"{1:032x}", "to": "@bob"}
    assert rec.calls == [SendCall("alice", "bob", "hi", 3)]
    assert pong is not None and pong["pid"] == os.getpid() and pong["root"] == str(server_root)


def test_status_is_served_only_when_the_host_gives_a_status_function(server_root: Path) -> None:
    with SubmitServer(server_root, send=Recorder()):
        refused = fetch_status(server_root)
    with SubmitServer(server_root, send=Recorder(), status=lambda: {"running": True, "profiles": []}):
        served = fetch_status(server_root)
    assert refused["error"] == "bad submit request: this endpoint does not serve 'status'"
    assert served == {"running": True, "profiles": []}


def test_the_socket_and_its_directory_are_owner_only(server_root: Path) -> None:
    with SubmitServer(server_root, send=Recorder()) as server:
        assert (server.path.stat().st_mode & 0o777) == 0o600
        assert (server.path.parent.stat().st_mode & 0o777) == 0o700
    assert not server.path.exists()  # close() removes the socket it bound


def test_bad_and_oversized_requests_get_an_error_and_reach_nothing(server_root: Path) -> None:
    rec = Recorder()
    with SubmitServer(server_root, send=rec):
        bad = _raw_exchange(server_root, b'{"op":"send","sender":"alice"}\n')
        huge = _raw_exchange(server_root, b'{"op":"send","message":"' + b"x" * (MAX_REQUEST_BYTES + 10) + b'"}\n')
        after = submit_dm(server_root, "alice", "bob", "after")  # the server still serves
    assert "'target' must be a string" in bad["error"]
    assert f"larger than {MAX_REQUEST_BYTES} bytes" in huge["error"]
    assert [c.message for c in rec.calls] == ["after"] and after["delivery_id"] == f"{1:032x}"


def test_a_peer_of_another_uid_is_refused(server_root: Path) -> None:
    rec = Recorder()
    with SubmitServer(server_root, send=rec, allowed_uid=os.getuid() + 1):
        answer = submit_dm(server_root, "alice", "bob", "hi")
    assert f"serves uid {os.getuid() + 1} only, not uid {os.getuid()}" in answer["error"]
    assert rec.calls == []


def test_a_client_that_never_finishes_its_request_gets_a_timeout_error(server_root: Path) -> None:
    with (
        SubmitServer(server_root, send=Recorder(), read_timeout=0.2),
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock,
    ):
        sock.settimeout(30)
        sock.connect(str(socket_path(server_root)))
        sock.sendall(b'{"op":')  # and nothing more
        answer = json.loads(sock.recv(65536))
    assert "no complete request within 0.2s" in answer["error"]


def _trickle_until_closed(path: Path, give_up: float) -> tuple[bytes, float | None]:
    """Connect to ``path`` and send a byte whenever nothing is to be read, until the server closes the connection.

    Returns:
        What the server sent, and the ``time.monotonic()`` at which sending failed (the server's
        end is closed), or None when it was still open at ``give_up``.
    """
    got, shut = b"", False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(path))
        while time.monotonic() < give_up:
            # the trickle's pace, far below read_timeout; once the server shut its side, only send
            readable, _, _ = select.select([] if shut else [sock], [], [], 0.05)
            if readable:
                try:
                    chunk = sock.recv(65536)
                except ConnectionResetError:
                    return got, time.monotonic()
                got, shut = got + chunk, not chunk
            else:
                try:
                    sock.send(b" ")
                except (BrokenPipeError, ConnectionResetError):
                    return got, time.monotonic()
    return got, None


def test_a_client_trickling_bytes_is_cut_off_at_the_read_deadline(server_root: Path) -> None:
    """read_timeout bounds the whole request: a byte every few ms must not keep a slot for good."""
    with SubmitServer(server_root, send=Recorder(), max_connections=1, read_timeout=0.5) as server:
        start = time.monotonic()
        got, closed_at = _trickle_until_closed(server.path, give_up=start + 60)
        assert closed_at is not None, "the server kept a trickling connection open for 60 s"
        assert b"no complete request within 0.5s" in got
        await_condition(lambda: server.served == 1, timeout=30, message="the slot was given back")
        assert submit_dm(server_root, "alice", "bob", "hi")["status"] == "queued"  # the only slot is free again


def test_an_answer_read_before_the_host_reset_the_connection_stands(tmp_path: Path) -> None:
    # The host answers without reading the request and closes with it unread: Linux then resets
    # the connection once the client has read the answer. Seen under load with the busy refusal.
    root = tmp_path / "r"
    path = socket_path(root)
    path.parent.mkdir(mode=0o700, parents=True)
    arrived = threading.Event()

    def host(listener: socket.socket) -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(1, socket.MSG_PEEK)  # the request is in our receive queue: closing now resets
            arrived.set()
            conn.sendall(encode({"error": "the Bot Mode host is busy; try again in a moment", "reason": "unknown"}))
            conn.shutdown(socket.SHUT_WR)

    dir_fd = open_dir(path.parent)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        try:
            listener.bind(socket_address(dir_fd, path))  # as the server binds: long tmp paths go through /proc
        finally:
            os.close(dir_fd)
        listener.listen(1)
        thread = threading.Thread(target=host, args=(listener,), daemon=True)
        thread.start()
        answer = submit_dm(root, "alice", "bob", "hi")
        thread.join(timeout=30)
    assert arrived.is_set()
    assert "busy" in answer["error"], answer


def test_beyond_max_connections_a_client_is_told_the_host_is_busy(server_root: Path) -> None:
    with (
        SubmitServer(server_root, send=Recorder(), max_connections=1, read_timeout=30) as server,
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as holder,
    ):
        holder.connect(str(server.path))  # occupies the only slot, sending nothing
        answer = submit_dm(server_root, "alice", "bob", "hi")
        holder.sendall(b'{"op":"ping"}\n')
        holder.shutdown(socket.SHUT_WR)
        holder.settimeout(30)
        assert json.loads(holder.recv(65536))["op"] == "pong"
    assert "busy" in answer["error"]


@pytest.mark.parametrize(("error", "retried"), [
    (errno.EMFILE, True), (errno.ENFILE, True), (errno.ENOBUFS, True), (errno.ENOMEM, True),
    (errno.ECONNABORTED, True), (errno.EPROTO, True), (errno.EINTR, True), (errno.EPERM, True),
    (errno.ENETDOWN, True), (None, True),
    (errno.EBADF, False), (errno.ENOTSOCK, False), (errno.EINVAL, False),
])
def test_every_accept_error_but_an_unusable_listener_is_retried(error: int | None, retried: bool) -> None:
    assert accept_retries(error) is retried


def test_the_accept_backoff_grows_is_never_zero_and_is_bounded() -> None:
    waits = [accept_backoff(n) for n in (1, 2, 3, 10, 1000, 10**9)]
    assert waits[0] == ACCEPT_BACKOFF_MIN > 0 and waits[1] == 2 * ACCEPT_BACKOFF_MIN
    assert waits == sorted(waits) and max(waits) == ACCEPT_BACKOFF_MAX


def test_an_accept_out_of_descriptors_is_retried_not_the_end_of_the_endpoint(
    server_root: Path, monkeypatch: pytest.MonkeyPatch, log_records: list[Any]
) -> None:
    """Regression (review): one EMFILE at accept() ended the accept thread for good, the socket file stayed,
    and every later client waited its whole timeout to be told its DM "may or may not have been queued"."""
    server = SubmitServer(server_root, send=Recorder())
    real_accept = socket.socket.accept
    failures = {"left": 3}

    def short_of_descriptors(sock: socket.socket) -> tuple[socket.socket, Any]:
        if sock is server._sock and failures["left"] > 0:
            failures["left"] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return real_accept(sock)

    monkeypatch.setattr(socket.socket, "accept", short_of_descriptors)
    with server:
        answer = submit_dm(server_root, "alice", "bob", "hi")  # its connection meets the three failures first
        assert answer["status"] == "queued"
        assert failures["left"] == 0
        assert ping(server_root, timeout=10) is not None  # and the endpoint goes on serving
        assert server._accept_thread is not None and server._accept_thread.is_alive()
    said = [r["message"] for r in log_records
            if "accept connections" in r["message"] or "accepting connections" in r["message"]]
    assert said == ["submit endpoint cannot accept connections ([Errno 24] Too many open files); retrying until it "
                    "can", "submit endpoint accepting connections again (after 3 failed accepts)"], said


def test_a_stop_during_an_accept_backoff_ends_the_accept_thread(
    server_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = SubmitServer(server_root, send=Recorder())
    real_accept = socket.socket.accept
    failing = threading.Event()

    def always_short(sock: socket.socket) -> tuple[socket.socket, Any]:
        if sock is server._sock:
            failing.set()
            raise OSError(errno.ENFILE, "Too many open files in system")
        return real_accept(sock)

    monkeypatch.setattr(socket.socket, "accept", always_short)
    server.start()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as waiting:
        waiting.connect(str(server.path))  # never accepted: the accepts keep failing
        assert failing.wait(30)
        server.close(timeout=30)
    assert server._accept_thread is not None and not server._accept_thread.is_alive()
    assert not server.path.exists()


def test_an_endpoint_whose_descriptors_number_past_1023_serves(server_root: Path) -> None:
    """Regression: the accept loop waited with ``select()``, which refuses a descriptor numbered 1024 or
    more (a gateway embedded in a process holding many files): the loop ended without a word at once,
    and every client waited its whole timeout."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1200
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"this process may open {hard} descriptors at most; the test needs {wanted}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    filler: list[int] = []
    try:
        while not filler or filler[-1] < 1030:  # the server's socket and wake-up pair come after these
            filler.append(os.open(os.devnull, os.O_RDONLY))
        with SubmitServer(server_root, send=Recorder()) as server:
            assert server._sock is not None and server._sock.fileno() >= 1024
            answer = submit_dm(server_root, "alice", "bob", "hi", timeout=20)
            assert answer["status"] == "queued", answer
            assert ping(server_root, timeout=20) is not None
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_connection_thread_that_cannot_start_is_answered_busy_not_the_end_of_the_endpoint(
    server_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: ``Thread.start`` raising ("can't start new thread": the system out of threads for a
    moment) ended the accept loop, its slot taken for good; every later client waited its whole timeout."""
    real_start = threading.Thread.start
    refused = {"left": 1}

    def out_of_threads(thread: threading.Thread) -> None:
        if thread.name == "submit-conn" and refused["left"] > 0:
            refused["left"] -= 1
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", out_of_threads)
    with SubmitServer(server_root, send=Recorder(), max_connections=1) as server:
        first = submit_dm(server_root, "alice", "bob", "hi", timeout=20)
        second = submit_dm(server_root, "alice", "bob", "again", timeout=20)  # the slot was given back
        assert server._accept_thread is not None and server._accept_thread.is_alive()
    assert refused["left"] == 0
    assert "busy" in first["error"], first
    assert second["status"] == "queued", second


def test_a_handler_exception_is_an_error_answer_not_a_dead_server(server_root: Path) -> None:
    def explode(call: SendCall) -> dict[str, Any]:
        raise ValueError("boom")

    with SubmitServer(server_root, send=explode):
        first = submit_dm(server_root, "alice", "bob", "hi")
        second = ping(server_root)
    assert "ValueError: boom" in first["error"] and "not acknowledged" in first["error"]
    assert second is not None


def test_a_failing_handler_logs_its_traceback_in_the_clis_log_without_the_dms_text(
    server_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (docs review, room create on a full disk): "submit handler failed" was logged at ERROR with
    loguru's default diagnose=True, every frame's variables printed: the raw request, with the DM's text (message
    texts never appear in logs above DEBUG: docs/operations.md). The CLI's log keeps the traceback, not the values."""
    marker = "secret-text-of-the-dm-" + os.urandom(8).hex()

    def explode(call: SendCall) -> dict[str, Any]:
        text = call.message  # a local holding the text, as a real handler has
        raise ValueError(f"boom ({len(text)} chars)")

    from hermes_actors.cli.main import _enable_logging

    _enable_logging(0)  # the sink `hermes-actors serve` logs to
    with SubmitServer(server_root, send=explode):
        answer = submit_dm(server_root, "alice", "bob", marker)
    assert "ValueError: boom" in answer["error"]
    logged = capsys.readouterr().err
    assert "submit handler failed" in logged and "Traceback" in logged and "ValueError: boom" in logged, logged
    assert marker not in logged, logged


def test_a_very_long_root_path_still_works(tmp_path: Path) -> None:
    root = tmp_path / ("d" * 60) / ("e" * 60)
    root.mkdir(parents=True)
    assert len(str(socket_path(root))) > 108
    with SubmitServer(root, send=Recorder()):
        assert submit_dm(root, "alice", "bob", "hi")["status"] == "queued"


# ── stale, hostile, twice ───────────────────────────────────────────────────


def _leave_stale_socket(root: Path) -> Path:
    path = socket_path(root)
    path.parent.mkdir(parents=True, mode=0o700)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()  # a dead host leaves its socket file behind
    return path


def test_a_stale_socket_reads_as_offline_and_a_new_host_replaces_it(server_root: Path) -> None:
    path = _leave_stale_socket(server_root)
    offline = submit_dm(server_root, "alice", "bob", "hi")
    assert offline["reason"] == "runtime_offline" and path.exists()
    with SubmitServer(server_root, send=Recorder()):
        assert submit_dm(server_root, "alice", "bob", "hi")["status"] == "queued"


def test_something_else_at_the_socket_path_is_refused_not_deleted(server_root: Path) -> None:
    path = socket_path(server_root)
    path.parent.mkdir(parents=True, mode=0o700)
    path.write_text("precious")
    with pytest.raises(HostileFileError, match="not a socket of ours"):
        SubmitServer(server_root, send=Recorder()).start()
    assert path.read_text() == "precious"


def _plant_lock(kind: str, lock: Path, outside: Path) -> None:
    if kind == "hard link":
        os.link(outside, lock)
    elif kind == "symlink":
        lock.symlink_to(outside)
    elif kind == "directory":
        lock.mkdir()
    elif kind == "FIFO":
        os.mkfifo(lock)
    else:
        lock.write_text("")
        os.chown(lock, os.getuid() + 1, -1)


@pytest.mark.parametrize(("kind", "says"), [
    ("hard link", "a hard link (2 names)"),
    ("symlink", "a symlink"),
    ("directory", "a directory"),
    ("FIFO", "a FIFO"),
    pytest.param("another uid's", "owned by uid", marks=pytest.mark.skipif(os.getuid() != 0, reason="needs chown")),
])
def test_anything_but_a_lock_file_of_ours_at_submit_lock_is_refused_and_never_written(
    server_root: Path, tmp_path: Path, kind: str, says: str
) -> None:
    """The host writes its pid into submit.lock: through a hard link that wrote a file outside the root."""
    lock = socket_path(server_root).with_name("submit.lock")
    lock.parent.mkdir(parents=True, mode=0o700)
    outside = tmp_path / "outside"
    outside.write_text("precious\n")
    _plant_lock(kind, lock, outside)
    with pytest.raises(HostileFileError, match=f"refusing to use {lock}: it is {re.escape(says)}.*remove it by hand"):
        SubmitServer(server_root, send=Recorder()).start()
    assert outside.read_text() == "precious\n"
    assert not socket_path(server_root).exists()  # nothing served


_ADVICE = {errno.EROFS: "Read-only file system (EROFS); its filesystem is mounted read-only: remount it read-write",
           errno.ENOSPC: "No space left on device (ENOSPC); free space on its filesystem"}


def _fail_on(monkeypatch: pytest.MonkeyPatch, step: str, code: int) -> None:
    """Make one OS call of the endpoint's start fail with ``code``, as a full or read-only disk does."""
    real_open, real_chmod = os.open, os.chmod

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise OSError(code, os.strerror(code))

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path) == "submit.lock":  # opened by its bare name, in the run directory's descriptor
            raise OSError(code, os.strerror(code), path)
        return real_open(path, flags, *args, **kwargs)

    def chmod(path: Any, *args: Any, **kwargs: Any) -> None:
        if str(path) == "submit.sock":
            raise OSError(code, os.strerror(code), path)
        real_chmod(path, *args, **kwargs)

    if step == "open":
        monkeypatch.setattr(os, "open", open_)
    elif step == "write":
        monkeypatch.setattr(os, "pwrite", fail)
    elif step == "chmod the socket":
        monkeypatch.setattr(os, "chmod", chmod)
    else:
        monkeypatch.setattr(os, "fchmod", fail)


@pytest.mark.parametrize(("step", "code", "action", "name"), [
    ("open", errno.EROFS, "open", "submit.lock"),
    ("write", errno.ENOSPC, "write", "submit.lock"),
    ("chmod the socket", errno.ENOSPC, "create the socket", "submit.sock"),
    ("chmod the run directory", errno.EROFS, "chmod 0700", ""),
])
def test_a_full_or_read_only_disk_at_start_names_the_file_in_full_and_what_to_do(
    server_root: Path, monkeypatch: pytest.MonkeyPatch, step: str, code: int, action: str, name: str
) -> None:
    """Regression (ops review): on a read-only disk the start failed with `[Errno 30] Read-only file system:
    'submit.lock'` (the lock's bare name: it is opened in the run directory's descriptor), on a full one with
    `[Errno 28] No space left on device` (no file at all: the pid is written through a descriptor)."""
    run_dir = socket_path(server_root).parent
    run_dir.mkdir(parents=True, mode=0o700)
    if step == "chmod the run directory":
        run_dir.chmod(0o755)  # the start makes it 0700 again: that fails on a read-only disk
    _fail_on(monkeypatch, step, code)
    with pytest.raises(StoreError) as info:
        SubmitServer(server_root, send=Recorder()).start()
    monkeypatch.undo()
    assert str(info.value) == f"cannot {action} {run_dir / name if name else run_dir}: {_ADVICE[code]}"
    assert info.value.errno == code
    assert lock_holder(server_root) is None  # nothing is left held: the next start, space back, serves
    with SubmitServer(server_root, send=Recorder()):
        assert ping(server_root) is not None


def test_a_symlinked_run_directory_is_refused(server_root: Path, tmp_path: Path) -> None:
    """Never followed; to a client it is no host (no host binds through one), as a file in its place is: before,
    it raised ``PermissionError``, so ``send`` ended with exit 2 instead of running the DM (its start puts the
    directory back: tests/test_start_puts_back.py)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (server_root / "bot_relay").mkdir(mode=0o700)
    (server_root / "bot_relay" / "run").symlink_to(elsewhere)
    with pytest.raises(HostileFileError, match="symlink"):
        SubmitServer(server_root, send=Recorder()).start()
    with pytest.raises(HostOffline, match="run is a symlink"):
        request(server_root, {"op": "ping"})
    assert list(elsewhere.iterdir()) == []


def test_a_symlinked_bot_relay_is_refused_not_followed_to_another_roots_host(tmp_path: Path) -> None:
    """Regression (hostile paths): with r4's ``bot_relay/`` a symlink to r1's, the client opened ``run/`` through it
    (O_NOFOLLOW applied to ``run/`` only): ``send --root r4`` was delivered by r1's host to r1's bob, and ``status``
    showed r1's host as r4's. The client now walks from the root as the host's bind does, and refuses, naming it."""
    served = tmp_path / "r1"
    mine = tmp_path / "r4"
    served.mkdir()
    mine.mkdir()
    rec = Recorder()
    with SubmitServer(served, send=rec):
        (mine / "bot_relay").symlink_to(served / "bot_relay")
        with pytest.raises(HostileFileError) as info:
            request(mine, {"op": "ping"})
        answer = submit_dm(mine, "alice", "bob", "for r4's bob only")
        assert ping(mine) is None and lock_holder(mine) is None
        assert ping(served) is not None  # the host of r1 still serves r1
    text = str(info.value)
    assert text.startswith(f"{mine / 'bot_relay'} is a symlink or not a directory; refusing to use it: ")
    assert "make it a real directory of this user again" in text and f"hermes-actors doctor --root {mine}" in text
    assert answer["reason"] == "unknown" and str(mine / "bot_relay") in answer["error"]
    assert "delivery_id" not in answer
    assert rec.calls == []  # nothing reached r1's host


def _st(mode: int, ino: int, dev: int = 7) -> os.stat_result:
    return os.stat_result((mode, ino, dev, 1, 0, 0, 0, 0, 0, 0))


_DIR, _SOCK, _LINK, _FILE = 0o040700, 0o140600, 0o120777, 0o100600


@pytest.mark.parametrize(("run_entry", "socket_entry", "fault"), [
    (_st(_DIR, 10), _st(_SOCK, 20), None),
    (None, _st(_SOCK, 20), RUN_GONE),
    (_st(_LINK, 11), _st(_SOCK, 20), RUN_SWAPPED),
    (_st(_FILE, 10), _st(_SOCK, 20), RUN_SWAPPED),
    (_st(_DIR, 12), _st(_SOCK, 20), RUN_REPLACED),  # another directory: a `send`'s start put run/ back
    (_st(_DIR, 10, dev=8), _st(_SOCK, 20), RUN_REPLACED),
    (_st(_DIR, 10), None, SOCKET_GONE),
    (_st(_DIR, 10), _st(_SOCK, 21), SOCKET_REPLACED),
    (_st(_DIR, 10), _st(_FILE, 20), SOCKET_REPLACED),
])
def test_endpoint_fault_says_whether_the_path_still_leads_to_the_bound_socket(
    run_entry: os.stat_result | None, socket_entry: os.stat_result | None, fault: str | None
) -> None:
    assert endpoint_fault(run_entry, _st(_DIR, 10), socket_entry, 20) == fault


def _swap_run(kind: str, run_dir: Path, outside: Path) -> None:
    """Do to ``run/`` what the hostile-files review did while the host ran."""
    if kind == "socket removed":
        (run_dir / "submit.sock").unlink()
        return
    run_dir.rename(run_dir.with_name("run.aside"))
    if kind == "symlink":
        run_dir.symlink_to(outside)
    elif kind == "file":
        run_dir.write_text("")
    elif kind == "another directory":  # as a `send` that found no host puts it back at its start
        run_dir.mkdir(mode=0o700)


@pytest.mark.parametrize("kind", ["symlink", "file", "removed", "another directory", "socket removed"])
def test_a_run_directory_swapped_under_a_running_host_is_put_back_and_the_host_binds_again(
    server_root: Path, tmp_path: Path, kind: str
) -> None:
    """Regression (hostile-files review): a run/ swapped for a symlink while `serve` ran left the host unreachable
    for good: `status` said `gateway: none serves … (no submit endpoint)`, a bot's submit_dm was refused
    runtime_offline while the host ran, and nothing was logged. The host's check (its rescan) now says so, moves the
    swapped entry into quarantine/ as the relay's rescan moves its directories, and binds its endpoint again."""
    outside = tmp_path / "outside"
    outside.mkdir()
    run_dir = socket_path(server_root).parent
    rec = Recorder()
    with LogCapture("INFO") as logs, SubmitServer(server_root, send=rec, check_seconds=0.05):
        _swap_run(kind, run_dir, outside)
        await_condition(lambda: logs.matching("submit endpoint serving", "again"), timeout=30)
        assert submit_dm(server_root, "alice", "bob", "hi")["status"] == "queued"
        assert lock_holder(server_root) == os.getpid()  # the host lock is taken in the run/ it serves in
        assert stat.S_IMODE(run_dir.lstat().st_mode) == 0o700 and not run_dir.is_symlink()
    assert len(rec.calls) == 1
    assert logs.matching("no client reaches this host; binding it again")
    assert list(outside.iterdir()) == []  # never followed
    quarantined = list((server_root / "bot_relay" / "quarantine").iterdir()) if kind in ("symlink", "file") else []
    assert len(quarantined) == (1 if kind in ("symlink", "file") else 0)
    if kind == "symlink":
        assert quarantined[0].is_symlink() and quarantined[0].readlink() == outside


def test_a_host_whose_run_directory_another_host_took_says_so_once_and_keeps_trying(server_root: Path) -> None:
    """The run/ made again holds another process's host lock: binding again is refused, said once (ERROR), tried
    again at each check, and the host serves again once that lock is free."""
    run_dir = socket_path(server_root).parent
    with LogCapture("INFO") as logs, SubmitServer(server_root, send=Recorder(), check_seconds=0.05) as server:
        checking, check = threading.Event(), server._check_endpoint
        server._check_endpoint = lambda sock: check(sock) if checking.is_set() else sock  # type: ignore[method-assign]
        run_dir.rename(run_dir.with_name("run.aside"))
        with SubmitServer(server_root, send=Recorder()):  # another host, started on the free path
            checking.set()
            await_condition(lambda: server._check_spell.failures >= 3, timeout=30)  # tried at each check
        await_condition(lambda: logs.matching("submit endpoint serving", "again"), timeout=30)
        assert ping(server_root) is not None
    assert len(logs.matching("no client reaches this host")) == 1
    assert len(logs.matching("could not bind it again", "already hosts")) == 1


def test_a_second_host_on_the_same_root_is_refused(server_root: Path) -> None:
    with SubmitServer(server_root, send=Recorder()):
        with pytest.raises(RuntimeError, match=f"pid {os.getpid()}"):
            SubmitServer(server_root, send=Recorder()).start()
        assert ping(server_root) is not None  # the first one is untouched


def test_after_close_the_endpoint_is_offline(server_root: Path) -> None:
    server = SubmitServer(server_root, send=Recorder()).start()
    server.close()
    server.close()  # idempotent
    assert submit_dm(server_root, "alice", "bob", "hi")["reason"] == "runtime_offline"


# ── the Gateway as host ─────────────────────────────────────────────────────


def test_no_host_is_a_clear_refusal_and_nothing_is_queued(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    answer = submit_dm(root, "alice", "bob", "hi")
    assert answer["reason"] == "runtime_offline"
    assert f"hermes-actors serve --root {root}" in answer["error"] and "NOT sent" in answer["error"]
    assert "delivery_id" not in answer
    rec = RecordingRunner()
    with Gateway(root, runner=rec) as gw:  # a host started afterwards finds nothing to recover or run
        assert gw.recovered == {}
        assert gw.stats()["accepted"] == 0
    assert rec.entered == []


def test_a_serving_gateway_takes_dms_and_answers_outcomes(tmp_path: Path, gateways: list[Gateway]) -> None:
    root = make_root(tmp_path)
    release = threading.Event()
    rec = RecordingRunner(lambda turn: "ok" if release.wait(30) else "late")
    gw = start_gateway(gateways, root, rec, serve_submit=True)
    ack = submit_dm(root, "alice", "bob", "hi", hop=2)
    assert ack["status"] == "queued" and ack["to"] == "@bob"
    pending = fetch_outcome(root, ack["delivery_id"], wait=0)
    # the keys of a pending outcome read from the files (docs/operations.md): status, delivery_id, error
    assert pending == {"status": "pending", "delivery_id": ack["delivery_id"],
                       "error": "accepted by the running host; no outcome yet"}
    release.set()
    outcome = fetch_outcome(root, ack["delivery_id"], wait=30)
    assert outcome["status"] == "replied" and outcome["text"] == "Reply from @bob: ok"
    assert [t.hop for t in rec.entered] == [2]
    assert fetch_outcome(root, "0" * 32, wait=0)["status"] == "unknown"
    gw.stop()
    assert submit_dm(root, "alice", "bob", "again")["reason"] == "runtime_offline"


def test_a_serving_gateway_binds_its_endpoint_again_at_its_rescan_after_run_is_swapped(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Regression (hostile-files review): `serve` with its run/ swapped for a symlink stayed unreachable (a bot's
    submit_dm got runtime_offline while the host ran) and logged nothing; the gateway's rescan now binds it again."""
    root = make_root(tmp_path, config={"bot_mode": {"rescan_seconds": 0.05}})
    outside = tmp_path / "outside"
    outside.mkdir()
    with LogCapture() as logs:
        start_gateway(gateways, root, RecordingRunner(), serve_submit=True)
        run_dir = socket_path(root).parent
        run_dir.rename(run_dir.with_name("run.aside"))
        run_dir.symlink_to(outside)
        await_condition(lambda: not run_dir.is_symlink() and ping(root) is not None, timeout=30)
    ack = submit_dm(root, "alice", "bob", "hi")
    assert ack["status"] == "queued"
    assert fetch_outcome(root, ack["delivery_id"], wait=30)["status"] == "replied"
    assert logs.matching("its directory was replaced by a symlink or a file, so no client reaches this host")
    assert list(outside.iterdir()) == []


def test_a_submitted_hop_counts_for_the_conversation_guard(tmp_path: Path, gateways: list[Gateway]) -> None:
    root = make_root(tmp_path, config={"bot_mode": {"max_hops": 3}})
    start_gateway(gateways, root, RecordingRunner(), serve_submit=True)
    assert submit_dm(root, "alice", "bob", "deep", hop=3)["status"] == "queued"
    refused = submit_dm(root, "alice", "bob", "too deep", hop=4)
    assert refused["reason"] == "loop_guard" and "hop 4" in refused["error"]


def test_a_dm_from_a_warm_turn_the_host_runs_is_one_hop_deeper_than_that_turn(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """``serve`` runs warm turns in a separate hermes gateway, whose plugin submits hop 1 and its session."""
    root = make_root(tmp_path, config={"bot_mode": {"max_hops": 3}})
    rec = RecordingRunner()
    start_gateway(gateways, root, rec, serve_submit=True)
    with turn_hop_scope("s-warm", 2):  # the API runner's mark while hermes runs a hop-2 turn on s-warm
        deeper = submit_dm(root, "alice", "bob", "from the warm turn", hop=1, session="s-warm")
        elsewhere = submit_dm(root, "alice", "bob", "from another session", hop=1, session="s-other")
        given = submit_dm(root, "alice", "bob", "a deeper CLI turn's", hop=3, session="s-warm")  # never lowered
        with turn_hop_scope("s-deep", 3):
            refused = submit_dm(root, "alice", "bob", "one too deep", hop=1, session="s-deep")
    after = submit_dm(root, "alice", "bob", "after the turn", hop=1, session="s-warm")
    for ack in (deeper, elsewhere, given, after):
        assert ack["status"] == "queued", ack
    assert refused["reason"] == "loop_guard" and "hop 4" in refused["error"], refused
    hops = {body_of(t.content): t.hop for t in rec.wait_entered(4, timeout=60)}
    assert hops == {"from the warm turn": 3, "from another session": 1, "a deeper CLI turn's": 3,
                    "after the turn": 1}


def test_a_session_is_resent_without_the_field_to_a_host_that_does_not_know_it(
    server_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(submit_protocol._FIELDS, "send", submit_protocol._FIELDS["send"] - {"session"})  # older host
    rec = Recorder()
    with SubmitServer(server_root, send=rec):
        ack = submit_dm(server_root, "alice", "bob", "hi", hop=1, session="s-1")
        bad = request(server_root, {"op": "send", "sender": "a", "target": "b", "message": "m", "session": "s"})
    assert ack["status"] == "queued"
    assert [(c.message, c.hop, c.session) for c in rec.calls] == [("hi", 1, "")]
    assert bad["error"] == "bad submit request: unknown field(s) for op 'send': session"  # the text older hosts give


def test_send_goes_through_a_running_host(
    tmp_path: Path, gateways: list[Gateway], capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_root(tmp_path)
    rec = RecordingRunner()
    start_gateway(gateways, root, rec, serve_submit=True)
    code = main(["send", "--root", str(root), "--from", "alice", "bob", "hello", "--wait", "30", "--runner", "demo"])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].startswith("queued for @bob: delivery ")
    assert lines[1] == "Reply from @bob: ok: hello"
    assert [t.sender for t in rec.entered] == ["alice"]  # the host's runner ran it, not the send process
    assert "no host serves" not in err
    assert err.startswith("note: --runner demo ignored: the host serving "), err  # and send says so


def test_send_without_wait_returns_right_after_the_ack(
    tmp_path: Path, gateways: list[Gateway], capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_root(tmp_path)
    release = threading.Event()
    rec = RecordingRunner(lambda turn: "done" if release.wait(30) else "")
    start_gateway(gateways, root, rec, serve_submit=True)
    try:
        code = main(["send", "--root", str(root), "--from", "alice", "bob", "hello", "--json"])
        finished = len(rec.records)
    finally:
        release.set()
    assert code == 0
    assert finished == 0  # the turn was still running when send returned
    assert json.loads(capsys.readouterr().out)["status"] == "queued"


def test_send_without_a_host_says_it_runs_in_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_root(tmp_path)
    code = main(["send", "--root", str(root), "--from", "alice", "bob", "hello", "--wait", "30", "--runner", "demo"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "no host serves" in err and "hermes-actors serve --root" in err
    assert out.strip().splitlines()[1].startswith("Reply from @bob: ")


def test_encode_is_one_line() -> None:
    assert encode({"text": "a\nb"}).count(b"\n") == 1


def test_an_outcome_with_a_reply_over_a_megabyte_is_answered_and_read_back_from_the_journal(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Regression: the answer cap (1 MiB) and the journal reader's line cap (1 MiB) left `outcome` and
    `send --wait` saying "pending" forever for a DM whose reply (held twice: reply, text) was over 512 KB."""
    from hermes_actors.ops.journal_view import find_outcome

    root = make_root(tmp_path)
    long_reply = "é" * 700_000  # 1.4 MB of UTF-8, 2.8 MB in the outcome
    gw = start_gateway(gateways, root, lambda turn: long_reply, serve_submit=True)
    ack = submit_dm(root, "alice", "bob", "write a lot")
    outcome = fetch_outcome(root, ack["delivery_id"], wait=30)
    assert outcome["status"] == "replied" and outcome["reply"] == long_reply
    gw.stop()
    from_files = find_outcome(root, ack["delivery_id"])
    assert from_files["status"] == "replied" and from_files["reply"] == long_reply


# ── a host that is stopping still holds the root ────────────────────────────


def test_a_host_holds_its_lock_from_start_until_close_and_lock_holder_names_it(server_root: Path) -> None:
    assert lock_holder(server_root) is None  # no run directory yet
    server = SubmitServer(server_root, send=Recorder()).start()
    assert lock_holder(server_root) == os.getpid()
    server.stop_accepting()
    assert ping(server_root) is None
    assert lock_holder(server_root) == os.getpid()  # not answering, still the root's host
    server.close()
    assert lock_holder(server_root) is None


def _lock_holding_child(root: Path) -> subprocess.Popen[str]:
    """A process that holds ``root``'s submit.lock (as a host does) until its stdin closes."""
    run_dir = socket_path(root).parent
    run_dir.mkdir(parents=True, mode=0o700)
    script = (
        "import fcntl, os, sys\n"
        f"fd = os.open({str(run_dir / 'submit.lock')!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "held\n"
    return child


def test_settle_host_waits_for_a_silent_holder_and_returns_once_it_exits(
    server_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    child = _lock_holding_child(server_root)
    try:
        assert lock_holder(server_root) == child.pid
        with pytest.raises(TimeoutError, match=f"pid {child.pid}.*neither answered nor let go of it.*nothing was sent"):
            settle_host(server_root, limit=0.3)
        assert "holds the root but does not answer" in capsys.readouterr().err
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(30)
    assert settle_host(server_root, limit=30) is False  # gone: the caller may run the DM itself
    assert lock_holder(server_root) is None


def test_settle_host_returns_true_for_a_host_that_answers(server_root: Path) -> None:
    with SubmitServer(server_root, send=Recorder()):
        assert settle_host(server_root, limit=30) is True


class _NoteWatch(io.StringIO):
    """A stderr that says when a line containing ``needle`` was written."""

    def __init__(self, needle: str) -> None:
        super().__init__()
        self.needle = needle
        self.seen = threading.Event()

    def write(self, text: str) -> int:
        if self.needle in text:
            self.seen.set()
        return super().write(text)


def test_send_waits_for_a_stopping_host_and_runs_after_the_dms_that_host_journaled(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DM sent while the host stops must not overtake the DMs that host acked before (they run first)."""
    root = make_root(tmp_path)
    release = threading.Event()
    host_runner = RecordingRunner(held_on("first", release))
    gw = start_gateway(gateways, root, host_runner, serve_submit=True)
    assert submit_dm(root, "alice", "bob", "first")["status"] == "queued"
    host_runner.wait_entered(1, timeout=30)
    assert submit_dm(root, "alice", "bob", "second")["status"] == "queued"  # queued behind "first"
    stopper = threading.Thread(target=gw.stop, kwargs={"timeout": 60})
    stopper.start()
    await_condition(lambda: ping(root) is None, timeout=30, message="the host stopped answering")
    command_runner = RecordingRunner()
    monkeypatch.setattr(importlib.import_module("hermes_actors.cli.gateway_options"), "runner_for",
                        lambda *a: command_runner)
    stderr = _NoteWatch("holds the root but does not answer")
    monkeypatch.setattr(sys, "stderr", stderr)
    codes: list[int] = []
    sender = threading.Thread(target=lambda: codes.append(
        main(["send", "--root", str(root), "--from", "alice", "bob", "third", "--wait", "60"])))
    sender.start()
    try:
        assert stderr.seen.wait(30), stderr.getvalue()
        assert command_runner.entered == []  # nothing runs beside the stopping host
    finally:
        release.set()
        stopper.join(60)
        sender.join(90)
    assert codes == [0], stderr.getvalue()
    # Each ran once, in order: "second" on the host (when "first" ended before the host wound its profiles
    # down) or, journaled, by the command after the host was gone; "third" always last.
    assert host_runner.bodies()[0] == "first"
    assert host_runner.bodies() + command_runner.bodies() == ["first", "second", "third"]


# ── a host that stopped mid-request: the DM may be queued, never run twice ──


class _OneShotHost:
    """A stand-in host on ``root``'s socket: takes one request, then answers ``answer`` (a dict, or raw bytes) or just
    closes; then one request more for each of ``later``."""

    def __init__(self, root: Path, answer: dict[str, Any] | bytes | None, *later: dict[str, Any] | bytes) -> None:
        run_dir = socket_path(root).parent
        run_dir.mkdir(parents=True, mode=0o700, exist_ok=True)
        self._dir_fd = open_dir(run_dir)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(socket_address(self._dir_fd, socket_path(root)))
        self._sock.listen(4)
        self.requests: list[bytes] = []
        self._answers = [answer, *later]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        for answer in self._answers:
            conn, _ = self._sock.accept()
            with conn:
                data = b""
                while chunk := conn.recv(65536):
                    data += chunk
                self.requests.append(data)
                if answer is not None:
                    conn.sendall(answer if isinstance(answer, bytes) else encode(answer))

    def close(self) -> None:
        self._thread.join(30)
        self._sock.close()
        os.close(self._dir_fd)


@pytest.mark.parametrize("how", ["request", "submit_dm", "cli"])
def test_a_host_that_closes_without_answering_is_ambiguous_never_offline(
    tmp_path: Path, how: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It may have journaled the DM before it died: "NOT sent, send again" or running it here would send it twice."""
    root = make_root(tmp_path)
    host = _OneShotHost(root, answer=None)
    command_runner = RecordingRunner()
    monkeypatch.setattr(importlib.import_module("hermes_actors.cli.gateway_options"), "runner_for",
                        lambda *a: command_runner)
    try:
        if how == "request":
            with pytest.raises(HostLost, match="closed the connection without answering"):
                request(root, {"op": "send", "sender": "alice", "target": "bob", "message": "pay once", "hop": 0})
        elif how == "submit_dm":
            answer = submit_dm(root, "alice", "bob", "pay once")
            assert answer["reason"] == "unknown"
            assert "may or may not have been queued" in answer["error"] and "do not resend" in answer["error"]
        else:
            code = main(["send", "--root", str(root), "--from", "alice", "bob", "pay once", "--wait", "30"])
            err = capsys.readouterr().err
            assert code == 1
            assert err.startswith("ambiguous: ") and "may or may not be queued" in err
            assert "no host serves" not in err
    finally:
        host.close()
    assert len(host.requests) == 1 and b"pay once" in host.requests[0]
    assert command_runner.entered == []  # nothing ran here
    assert not (root / "bot_relay" / "journal").exists() or not any((root / "bot_relay" / "journal").iterdir())


_GARBAGE_ANSWERS = [b"<html>502 Bad Gateway</html>\n", b'["queued"]\n', b'{"status": "queued"}\n']
_GARBAGE_IDS = ["not-json", "not-an-object", "no-id-no-error"]


@pytest.mark.parametrize("answer", _GARBAGE_ANSWERS, ids=_GARBAGE_IDS)
def test_a_garbage_answer_to_send_is_ambiguous_exit_1_never_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, answer: bytes
) -> None:
    """Regression (cliedges): a host's answer that was no JSON object was a ValueError, said as bad arguments (exit
    2: "nothing was done"), though the host took the DM and may have queued it; one naming no id and no error was
    printed as an ack, ``queued for ?: delivery ?``, exit 0. Both are ambiguous now: exit 1, how to look for it."""
    root = make_root(tmp_path)
    host = _OneShotHost(root, answer)
    command_runner = RecordingRunner()
    monkeypatch.setattr(importlib.import_module("hermes_actors.cli.gateway_options"), "runner_for",
                        lambda *a: command_runner)
    try:
        code = main(["send", "--root", str(root), "--from", "alice", "bob", "pay once"])
    finally:
        host.close()
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert err.startswith(f"ambiguous: the host of {root} answered "), err
    assert err.rstrip().endswith(f"the DM may or may not be queued (do not resend it blindly; look for it with: "
                                 f"hermes-actors status --root {root})"), err
    assert len(host.requests) == 1 and command_runner.entered == []  # never run here instead


@pytest.mark.parametrize("answer", _GARBAGE_ANSWERS[:2], ids=_GARBAGE_IDS[:2])
def test_a_garbage_answer_to_a_bots_dm_says_it_may_be_queued(tmp_path: Path, answer: bytes) -> None:
    """Regression (cliedges): the tool's refusal said only "Could not submit the message": read as NOT sent, the
    bot would send it again."""
    _assert_bot_told_it_may_be_queued(tmp_path, answer, "answered something unreadable (the answer from ")


def _assert_bot_told_it_may_be_queued(tmp_path: Path, answer: bytes, why: str) -> None:
    """A bot's DM through a stand-in host answering ``answer`` is told it may or may not be queued, and ``why``."""
    root = make_root(tmp_path)
    host = _OneShotHost(root, answer)
    try:
        refusal = submit_dm(root, "alice", "bob", "pay once")
    finally:
        host.close()
    assert refusal["reason"] == "unknown" and refusal["error"].startswith(f"The Bot Mode host on {root} {why}"), refusal
    assert refusal["error"].endswith("the message may or may not have been queued — do not resend it blindly.")


def test_a_garbage_outcome_answer_while_send_waits_names_the_outcome_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (cliedges): with ``--wait``, an outcome answer that was no JSON ended in ``error: <orjson's
    text>``: the acked DM's id, and how to look its outcome up, were not said."""
    root = make_root(tmp_path)
    key = "ab" * 16
    host = _OneShotHost(root, {"status": "queued", "delivery_id": key, "to": "@bob"}, b"garbage\n")
    try:
        code = main(["send", "--root", str(root), "--from", "alice", "bob", "hi", "--wait", "30"])
    finally:
        host.close()
    err = capsys.readouterr().err
    assert code == 1 and err.startswith(f"ambiguous: lost the host of {root} while waiting for the outcome ("), err
    assert err.rstrip().endswith(f"look it up later with: hermes-actors outcome --root {root} {key}"), err


@pytest.mark.parametrize(("answer", "problem"), [
    ({"error": "no", "reason": "unknown"}, None),
    ({"status": "queued", "delivery_id": "ab" * 16}, None),
    ({"status": "queued"}, "its answer names no delivery id and no error: {'status': 'queued'}"),
    ({"delivery_id": "AB" * 16}, "its answer names no delivery id and no error: {'delivery_id': '" + "AB" * 16 + "'}"),
])
def test_send_answer_problem(answer: dict[str, Any], problem: str | None) -> None:
    from hermes_actors.hermes.submit_client import send_answer_problem

    assert send_answer_problem(answer) == problem


def _answer_once(listener: socket.socket, answer: dict[str, Any]) -> threading.Thread:
    """Serve one request on ``listener`` with ``answer``; a shutdown of ``listener`` ends the wait for it."""
    def serve() -> None:
        try:
            conn, _ = listener.accept()
        except OSError:  # shut down: nobody came
            return
        with conn:
            while conn.recv(65536):
                pass
            conn.sendall(encode(answer))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_a_run_directory_swapped_after_the_checked_walk_does_not_redirect_the_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression (cliedges): a short socket path was connected by its path after the checked walk to run/: a
    run/ swapped in that window (renamed away, another directory with another listener put in its place) took the
    connection, and the DM. The client connects through the checked directory's descriptor now."""
    import shutil
    import tempfile

    from hermes_actors.hermes import submit_client

    base = Path(tempfile.mkdtemp(prefix="ha-", dir="/tmp"))  # short: the path alone would fit sun_path
    listeners: list[socket.socket] = []
    threads: list[threading.Thread] = []

    def listen(path: Path, answer: dict[str, Any]) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.listen(1)
        listeners.append(listener)
        threads.append(_answer_once(listener, answer))

    try:
        root = make_root(base, name="r")
        path = socket_path(root)
        assert len(os.fsencode(path)) < 100, path
        path.parent.mkdir(mode=0o700, parents=True)
        listen(path, {"who": "checked"})
        checked_walk = submit_client._open_endpoint_dir

        def walk_then_swap(root_: str | Path, path_: Path) -> int:
            dir_fd = checked_walk(root_, path_)
            path.parent.rename(path.parent.with_name("run-checked"))  # the window: run/ swapped for another
            path.parent.mkdir(mode=0o700)
            listen(path, {"who": "swapped in"})
            return dir_fd

        monkeypatch.setattr(submit_client, "_open_endpoint_dir", walk_then_swap)
        answer = submit_client.request(root, {"op": "ping"}, timeout=30)
    finally:
        for listener in listeners:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for thread in threads:
            thread.join(30)
        shutil.rmtree(base)
    assert answer == {"who": "checked"}
    assert len(listeners) == 2  # the swap was made


@pytest.mark.parametrize(("path", "via_fd", "proc", "chosen"), [
    ("/r/bot_relay/run/submit.sock", "/proc/self/fd/7/submit.sock", True, "/proc/self/fd/7/submit.sock"),
    ("/r/bot_relay/run/submit.sock", "/proc/self/fd/7/submit.sock", False, "/r/bot_relay/run/submit.sock"),
    ("/" + "d" * 120 + "/submit.sock", "/proc/self/fd/7/submit.sock", True, "/proc/self/fd/7/submit.sock"),
    ("/" + "d" * 120 + "/submit.sock", "/proc/self/fd/7/submit.sock", False, "/proc/self/fd/7/submit.sock"),
    ("/r/submit.sock", "/proc/self/fd/7/" + "n" * 100, True, "/r/submit.sock"),  # a name too long for /proc
], ids=["proc", "no-proc", "long-path", "long-path-no-proc", "long-name"])
def test_address_choice_prefers_the_checked_directorys_descriptor(path: str, via_fd: str, proc: bool,
                                                                  chosen: str) -> None:
    from hermes_actors.hermes.submit_socket import address_choice

    assert address_choice(path, via_fd, proc=proc) == chosen


def test_a_stopping_hosts_answer_means_not_taken(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    host = _OneShotHost(root, answer={"op": "stopping", "error": "stopping", "reason": "runtime_offline"})
    try:
        answer = submit_dm(root, "alice", "bob", "hi")
    finally:
        host.close()
    assert answer["reason"] == "runtime_offline" and "NOT sent" in answer["error"]


def test_a_stopping_server_answers_the_connections_in_its_backlog(server_root: Path) -> None:
    """Closing the listening socket would reset them, which reads as "stopped mid-request"."""
    path = server_root / "backlog.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(8)
        listener.setblocking(False)
        clients = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(3)]
        try:
            for client in clients:
                client.settimeout(30)
                client.connect(str(path))  # completes into the backlog: nobody accepts yet
                client.sendall(encode({"op": "ping"}))
                client.shutdown(socket.SHUT_WR)
            SubmitServer(server_root, send=Recorder())._turn_away_backlog(listener)
            answers = []
            for client in clients:
                data = b""
                while chunk := client.recv(65536):
                    data += chunk
                answers.append(json.loads(data))
        finally:
            for client in clients:
                client.close()
    assert [a["op"] for a in answers] == ["stopping"] * 3
    assert all(a["reason"] == "runtime_offline" for a in answers)



def _stop_under_load(root: Path, clients: int = 8) -> list[str]:
    """Stop a host while ``clients`` threads send to it; what the clients saw besides answers and "offline"."""
    root.mkdir()
    server = SubmitServer(root, send=lambda call: {"status": "queued"}).start()
    done = threading.Event()
    offline, answered = threading.Semaphore(0), threading.Semaphore(0)
    seen: list[str] = []

    def client() -> None:
        while not done.is_set():
            try:
                request(root, {"op": "send", "sender": "a", "target": "b", "message": "m", "hop": 0}, timeout=30)
                answered.release()
            except HostOffline:
                offline.release()
            except Exception as exc:  # HostLost, or anything else: a finding (and the thread must not die unseen)
                seen.append(repr(exc))
                offline.release()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(50):  # the clients are sending
            assert answered.acquire(timeout=30)
        server.stop_accepting()
        for _ in range(clients):  # each client has met the stopped host at least once
            assert offline.acquire(timeout=30)
    finally:
        done.set()
        for thread in threads:
            thread.join(30)
        server.close()
    return seen


def test_a_stop_under_load_tells_no_client_it_stopped_mid_request(tmp_path: Path) -> None:
    """Every request a stopping host never read must read as "not taken" (HostOffline), never as HostLost
    ("may or may not be queued"): a client that joined the backlog after it was answered was reset."""
    seen = [what for round_no in range(5) for what in _stop_under_load(tmp_path / f"r{round_no}")]
    assert seen == []


def test_the_offline_refusal_names_commands_that_run_as_printed() -> None:
    """Regression (review diffrev12): the commands the refusal names were built unquoted: with a root holding a
    space, `hermes-actors serve --root /srv/my hermes` is split by the shell. Each word is quoted now."""
    text = submit_protocol.offline_refusal(Path("/srv/my hermes"))["error"]
    assert "Start the host with `hermes-actors serve --root '/srv/my hermes'` (or `hermes gateway run` once " \
           "`hermes-actors enable --root '/srv/my hermes' --gateway` turned its hosting on)" in text, text


@pytest.mark.parametrize("answer", [b'{"status": "queued"}\n', b'{"x": 1}\n', b'{"delivery_id": "zz"}\n'],
                         ids=["status-only", "other-object", "bad-id"])
def test_a_host_answer_to_a_bots_dm_with_no_ack_and_no_refusal_is_never_read_as_an_ack(
    tmp_path: Path, answer: bytes
) -> None:
    """Regression (diff review of cliedges): ``send`` called a host's answer naming no delivery id and no error
    ambiguous, but the bot's tool path (``submit_dm``) returned it as it was: the bot read ``{"status": "queued"}``
    as an ack with no id. Now the same rule (``send_answer_problem``) makes it the may-or-may-not-be-queued answer."""
    _assert_bot_told_it_may_be_queued(
        tmp_path, answer, "answered no ack and no refusal (its answer names no delivery id and no error: ")
