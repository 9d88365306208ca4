"""Fault injection at the OS seam: disk full / permission denied, a dying watchdog, raising runners, clock jumps.

Nothing under test is mocked: the faults are injected into ``os.open`` /
``os.write`` / ``os.replace`` / ``os.link`` for the relevant paths only (the
rest of the process keeps working), or into ``time.time``. The journal's
ENOSPC case lives in ``tests/test_journal.py``
(``test_enospc_refuses_the_dm_and_leaves_no_torn_record``).
"""

from __future__ import annotations

import errno
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from relay_helpers import remote_row, seed_envelope, seed_write_json, write_roster_file
from roots import RecordingRunner, body_of, make_root, start_gateway

from actors.testkit import await_condition
from hermes_actors import Gateway, TurnFailed
from hermes_actors.store import relay_files as rf
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.relay_inbox import InboxPaths, post_to_inbox
from hermes_actors.store.relay_paths import RelayPaths

TEMP_OF_ID = re.compile(r"^\.[0-9a-f]{32}\.json\.[0-9a-f]+\.tmp$")


class OsFaults:
    """Make one OS call fail with ``code`` for paths that ``applies`` accepts; everything else is untouched."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, call: str, code: int, applies: Callable[[str], bool]) -> None:
        self.call, self.code, self.applies = call, code, applies
        self.hits = 0
        self.armed = True
        self._fds: set[int] = set()
        self._lock = threading.Lock()
        real_open, real_write, real_close = os.open, os.write, os.close
        real_replace, real_link = os.replace, os.link

        def fail(what: str) -> OSError:
            with self._lock:
                self.hits += 1
            return OSError(code, os.strerror(code), what)

        def fake_open(path: Any, flags: int, mode: int = 0o777, *args: Any, **kwargs: Any) -> int:
            if self.armed and call == "open" and self.applies(os.fspath(path)):
                raise fail(os.fspath(path))
            fd = real_open(path, flags, mode, *args, **kwargs)
            if call == "write" and self.applies(os.fspath(path)):
                with self._lock:
                    self._fds.add(fd)
            return fd

        def fake_write(fd: int, data: Any) -> int:
            if self.armed and fd in self._fds:
                half = len(data) // 2
                if half:  # a partial write lands first, as on a filling disk
                    real_write(fd, bytes(data)[:half])
                raise fail(f"fd {fd}")
            return real_write(fd, data)

        def fake_close(fd: int) -> None:
            with self._lock:
                self._fds.discard(fd)
            real_close(fd)

        def fake_replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            if self.armed and self.applies(_full_path(dst, kwargs.get("dst_dir_fd"))):
                raise fail(os.fspath(dst))
            real_replace(src, dst, *args, **kwargs)

        def fake_link(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            if self.armed and self.applies(_full_path(dst, kwargs.get("dst_dir_fd"))):
                raise fail(os.fspath(dst))
            real_link(src, dst, *args, **kwargs)

        monkeypatch.setattr(os, "open", fake_open)
        if call == "write":
            monkeypatch.setattr(os, "write", fake_write)
            monkeypatch.setattr(os, "close", fake_close)
        elif call == "replace":
            monkeypatch.setattr(os, "replace", fake_replace)
        elif call == "link":
            monkeypatch.setattr(os, "link", fake_link)


def _full_path(name: Any, dir_fd: int | None) -> str:
    """The path a ``*_dir_fd``-relative name stands for (relay writes put files in place through an open directory)."""
    if dir_fd is None or os.path.isabs(os.fspath(name)):
        return os.fspath(name)
    return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), os.fspath(name))


def _temp_files(root: Path) -> list[Path]:
    return sorted(p for p in RelayPaths.from_root(root).tmp.iterdir() if TEMP_OF_ID.match(p.name))


def _is_temp(path: str) -> bool:
    """A temp file of an atomic write: created by its bare name in the open temp directory."""
    return not os.path.isabs(path) and TEMP_OF_ID.match(path) is not None


def _start(gateways: list[Gateway], root: Path, runner: Any = None, **bot_mode: Any) -> Gateway:
    """Connection ``alpha``, not durable, ``bot_mode`` settings as keywords."""
    return start_gateway(gateways, root, runner, {"bot_mode": bot_mode} if bot_mode else None,
                         connection_id="alpha", durable=False)


# ── envelope writes (sender side) ───────────────────────────────────────────

ENVELOPE_FAULTS = [
    ("open", errno.EACCES, "Permission denied"),
    ("write", errno.ENOSPC, "No space left on device"),
    ("replace", errno.ENOSPC, "No space left on device"),
    ("replace", errno.EACCES, "Permission denied"),
]


@pytest.mark.parametrize(("call", "code", "text"), ENVELOPE_FAULTS, ids=[f"{c}-{errno.errorcode[e]}"
                                                                          for c, e, _ in ENVELOPE_FAULTS])
def test_a_failing_envelope_write_is_refused_clearly_and_leaves_nothing(
    call: str, code: int, text: str, tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_root(tmp_path, name="alpha")
    write_roster_file(root, [remote_row("moxie", "mini", online=True)])
    gw = _start(gateways, root)
    outbox = root / "bot_relay" / "outbox"

    def envelope_path(path: str) -> bool:
        p = Path(path)
        return (p.parent == outbox and p.name.endswith(".json")) or _is_temp(path)

    faults = OsFaults(monkeypatch, call, code, envelope_path)
    refused = gw.message_agent(sender="alice", target="moxie", message="while the disk is broken")
    faults.armed = False
    assert faults.hits >= 1, "the fault was injected"
    assert "delivery_id" not in refused and refused.get("status") != "queued", refused
    assert refused["error"].startswith("Could not queue the message for @moxie on mini")
    assert text in refused["error"] and "Nothing was sent." in refused["error"], refused
    assert refused["reason"] == "unknown"
    assert rf.list_ids(outbox) == [] and list(outbox.iterdir()) == []
    assert _temp_files(root) == [], "no temp file is left behind"
    assert gw.stats()["pending"] == 0

    ok = gw.message_agent(sender="alice", target="moxie", message="after the disk recovered")
    assert ok["status"] == "queued"
    assert rf.list_ids(outbox) == [ok["delivery_id"]]


# ── reply writes (drain side) ───────────────────────────────────────────────

REPLY_FAULTS = [
    ("write", errno.ENOSPC),
    ("link", errno.ENOSPC),
    ("link", errno.EACCES),
    ("open", errno.EACCES),
]


@pytest.mark.parametrize(("call", "code"), REPLY_FAULTS, ids=[f"{c}-{errno.errorcode[e]}" for c, e in REPLY_FAULTS])
def test_a_failing_reply_write_on_the_drain_side_keeps_the_relay_running(
    call: str, code: int, tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_root(tmp_path, name="alpha")
    rec = RecordingRunner()
    gw = _start(gateways, root, rec, rescan_seconds=0.2)
    paths = InboxPaths.from_root(root)
    first = seed_envelope(target_connection="alpha", target_profile="bob", from_profile="moxie", message="one")

    def delivered_path(path: str) -> bool:
        # post_to_inbox (this thread) and the turn's started mark (a worker) use the same temp names: only the
        # relay actor's own write (the reply) fails
        if not threading.current_thread().name.startswith("RelayActor"):
            return False
        p = Path(path)
        return (p.parent == paths.delivered and p.name == f"{first['id']}.json") or (
            _is_temp(path) and p.name.startswith(f".{first['id']}.json."))

    faults = OsFaults(monkeypatch, call, code, delivered_path)
    post_to_inbox(paths, first, "mini")
    await_condition(lambda: faults.hits >= 1, timeout=10, message="the reply write hit the fault")
    assert [t.delivery_id for t in rec.wait_entered(1)] == [first["id"]]
    # The reply is written inside one relay-actor message: a call queued behind it returns once the failure was
    # handled (and answers only if the actor survived it).
    stats = gw.stats()
    assert stats["relay_alive"], "the relay actor survived the failed write"
    assert stats["relay"]["drained"] == 1
    faults.armed = False
    assert not (paths.delivered / f"{first['id']}.json").exists(), "nothing half-written is visible"
    assert _temp_files(root) == [], "no temp file is left behind"

    second = seed_envelope(target_connection="alpha", target_profile="bob", from_profile="moxie", message="two")
    post_to_inbox(paths, second, "mini")
    done = paths.delivered / f"{second['id']}.json"
    await_condition(done.exists, timeout=10, message="a later valid envelope flows")
    record, connection = rp.parse_reply({k: v for k, v in _read(done).items() if k != "reply_connection"}), "mini"
    assert record["reply"] == "ok: two" and connection == "mini"
    assert [t.delivery_id for t in rec.entered] == [first["id"], second["id"]]


def _read(path: Path) -> dict[str, Any]:
    import orjson

    data: dict[str, Any] = orjson.loads(path.read_bytes())
    return data


# ── the watchdog observer dies ──────────────────────────────────────────────


def test_a_dead_observer_is_restarted_and_a_later_reply_is_still_picked_up(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    root = make_root(tmp_path, name="alpha")
    write_roster_file(root, [remote_row("moxie", "mini", online=True)])
    gw = _start(gateways, root, rescan_seconds=0.2)
    ack = gw.message_agent(sender="alice", target="moxie", message="ping")
    envelope_id = ack["delivery_id"]
    bridge = gw._bridge
    assert bridge is not None
    dead = bridge._observer
    assert dead is not None and dead.is_alive()
    dead.stop()
    dead.join(timeout=5)
    assert not dead.is_alive()

    seed_write_json(root / "bot_relay" / "replies" / f"{envelope_id}.json",
                    {"id": envelope_id, "at": int(time.time()), "reply": "pong", "error": "", "reason": ""})
    out = gw.wait_outcome(envelope_id, timeout=5)
    assert (out["status"], out["reply"]) == ("replied", "pong")
    await_condition(lambda: bridge._observer is not None and bridge._observer is not dead
                    and bridge._observer.is_alive(), timeout=5, message="the observer was restarted")

    # The relay keeps working with the restarted observer.
    ack2 = gw.message_agent(sender="alice", target="moxie", message="ping again")
    seed_write_json(root / "bot_relay" / "replies" / f"{ack2['delivery_id']}.json",
                    {"id": ack2["delivery_id"], "at": int(time.time()), "reply": "pong 2", "error": "",
                     "reason": ""})
    assert gw.wait_outcome(ack2["delivery_id"], timeout=5)["reply"] == "pong 2"


# ── runners that raise ──────────────────────────────────────────────────────


@pytest.mark.parametrize("error", [
    RuntimeError("kaboom"),
    TurnFailed("the model refused", reason="model_unavailable"),
    ZeroDivisionError("division by zero"),
    KeyError("missing"),
], ids=["RuntimeError", "TurnFailed", "ZeroDivisionError", "KeyError"])
def test_a_raising_runner_fails_that_dm_and_the_next_dm_is_served(
    error: BaseException, tmp_path: Path, gateways: list[Gateway]
) -> None:
    root = make_root(tmp_path)

    def behave(turn: Any) -> str:
        if body_of(turn.content) == "explode":
            raise error
        return f"ok: {body_of(turn.content)}"

    rec = RecordingRunner(behave)
    gw = _start(gateways, root, rec)
    bad = gw.message_agent(sender="alice", target="bob", message="explode")
    good = gw.message_agent(sender="alice", target="bob", message="next")
    out = gw.wait_outcome(bad["delivery_id"], timeout=10)
    assert out["status"] == "failed" and out["error"], out
    assert gw.wait_outcome(good["delivery_id"], timeout=10)["reply"] == "ok: next"
    assert rec.bodies()[-1] == "next"


# ── the wall clock jumps ────────────────────────────────────────────────────


@pytest.mark.parametrize("jump", [3600.0, -3600.0], ids=["forward-1h", "back-1h"])
def test_a_wall_clock_jump_does_not_expire_a_queued_dm(
    jump: float, tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_root(tmp_path)
    release = threading.Event()

    def behave(turn: Any) -> str:
        if body_of(turn.content) == "first":
            release.wait(10)
        return f"ok: {body_of(turn.content)}"

    rec = RecordingRunner(behave)
    gw = _start(gateways, root, rec, turn_wait_seconds=3.0)
    first = gw.message_agent(sender="alice", target="bob", message="first")
    rec.wait_entered(1)
    queued = gw.message_agent(sender="carol", target="bob", message="queued")
    assert queued["status"] == "queued"
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + jump)
    # A second DM queued under the jumped clock: both queue waits are measured across the jump.
    later = gw.message_agent(sender="alice", target="bob", message="queued after the jump")
    assert later["status"] == "queued"
    assert gw.stats()["pending"] == 3  # an ask to the dispatcher: both are routed, none has an outcome yet
    release.set()
    assert gw.wait_outcome(first["delivery_id"], timeout=10)["status"] == "replied"
    for ack, body in ((queued, "queued"), (later, "queued after the jump")):
        out = gw.wait_outcome(ack["delivery_id"], timeout=10)
        assert (out["status"], out["reply"]) == ("replied", f"ok: {body}"), out
    assert rec.bodies() == ["first", "queued", "queued after the jump"]


def test_the_queue_budget_still_expires_on_monotonic_time(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control for the clock-jump test: the budget is real (monotonic) and a jump backwards does not extend it."""
    root = make_root(tmp_path)
    release = threading.Event()
    rec = RecordingRunner(lambda turn: release.wait(10) and "done")
    gw = _start(gateways, root, rec, turn_wait_seconds=1.0)
    gw.message_agent(sender="alice", target="bob", message="first")
    rec.wait_entered(1)
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() - 3600)
    started = time.monotonic()  # before the send: the DM's wait (on the same monotonic clock) begins after it
    queued = gw.message_agent(sender="carol", target="bob", message="queued")
    # Not extended by the jump: it expires at all (an hour more would outlast wait_outcome's 10 s).
    out = gw.wait_outcome(queued["delivery_id"], timeout=10)
    release.set()
    assert out["reason"] == "target_busy" and "NOT delivered" in out["error"]
    # Nor cut short: its whole budget went by first. Exact, so a slow machine cannot fail it; and 1 s, so that a
    # budget that expired at once could pass only on a machine that took a second to answer one DM.
    assert time.monotonic() - started >= 1.0
