"""A hostile relay tree: FIFOs planted where files are opened, relay directories removed or swapped for files
or symlinks, heartbeats with absurd values, envelopes adopted past their TTL. Nothing hangs, nothing raises out
of the relay's actors, and the relay keeps taking, running and answering envelopes.

A call that could block on a FIFO runs in a thread with a deadline (:func:`call_within`); when it is still
blocked, the FIFO is opened for writing so the thread ends and the test fails instead of hanging.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
from relay_helpers import hub_thread, remote_row, seed_envelope, write_roster_file
from roots import LogCapture, RecordingRunner, make_root, start_gateway

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.core.config import DEFAULTS, load_config, parse_config
from hermes_actors.errors import HostileFileError, StoreError
from hermes_actors.messages import Turn
from hermes_actors.relay.restart import recover_taken
from hermes_actors.relay.strays import quarantine_strays
from hermes_actors.store import relay_files as rf
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.journal import Journal
from hermes_actors.store.private_dir import ensure_private_dir
from hermes_actors.store.relay_heartbeat import gateway_alive
from hermes_actors.store.relay_inbox import InboxPaths, post_to_inbox
from hermes_actors.store.relay_marks import FILE_RELAY, REDIS, TurnStartMarks, clear_started, kept_reply_of_any
from hermes_actors.store.relay_sent import clear_sent
from hermes_actors.store.relay_shelf import LOCK_NAME, SHELF_PREFIX, Shelf
from hermes_actors.store.yaml_file import read_yaml_mapping

T = TypeVar("T")

BLOCK_DEADLINE = 5.0  # a call that returns at once on a FIFO gets this long; a blocked open(2) never returns
START_DEADLINE = 15.0  # a whole Gateway start


# ── helpers ─────────────────────────────────────────────────────────────────


def poke_fifos(fifos: Sequence[Path]) -> None:
    """Open each FIFO for writing (and close it): a reader blocked in open(2) on it then returns."""
    for fifo in fifos:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # ENXIO: no reader is blocked; gone: it was adopted meanwhile


def release_fifos(fifos: Sequence[Path], done: threading.Event, timeout: float = 10.0) -> None:
    """Poke the FIFOs until ``done`` is set (a reader may block again on the next one) or ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    while not done.is_set() and time.monotonic() < deadline:
        poke_fifos(fifos)
        done.wait(0.05)


def call_within(fn: Callable[[], T], seconds: float, *, fifos: Sequence[Path], what: str) -> T:
    """``fn()`` run in a thread; its result, or a test failure when it is still running after ``seconds``.

    A call that blocked is released by opening ``fifos`` for writing (so no thread is left hanging).
    """
    done = threading.Event()
    results: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(fn())
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name=f"bounded {what}", daemon=True).start()
    if not done.wait(seconds):
        release_fifos(fifos, done)
        pytest.fail(f"{what} was still blocked after {seconds}s (a FIFO in the tree)")
    if errors:
        raise errors[0]
    return results[0]


def write_private_json(path: Path, payload: Any) -> None:
    """A 0600 JSON file written in place (a dead process's leftover)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(payload, f)


def dead_shelf(parent: Path) -> Path:
    """An empty shelf directory (``s-<token>/``) under ``parent``, without its ``.lock``."""
    shelf = parent / f"{SHELF_PREFIX}{uuid.uuid4().hex}"
    shelf.mkdir(mode=0o700)
    return shelf


def quarantined(paths: InboxPaths, name: str) -> list[Path]:
    return sorted(paths.relay.quarantine.glob(f"{name}.*.quarantined"))


def delivered_record(paths: InboxPaths, envelope_id: str) -> dict[str, Any] | None:
    path = paths.delivered / f"{envelope_id}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def mini_root(tmp_path: Path) -> tuple[Path, InboxPaths]:
    root = make_root(tmp_path, {"moxie": {}}, name="mini")
    return root, InboxPaths.from_root(root).ensure()


def moxie_envelope(message: str, **kwargs: Any) -> dict[str, Any]:
    return seed_envelope(target_connection="mini", target_profile="moxie", message=message, **kwargs)


# ── 1. a FIFO as a shelf's .lock ────────────────────────────────────────────


@pytest.mark.parametrize("parent", ["taken", "hubclaims"])
def test_shelf_adopt_skips_a_shelf_whose_lock_is_a_fifo(tmp_path: Path, parent: str) -> None:
    """Opening the FIFO without O_NONBLOCK waited for a writer for ever; the shelf is now left in place."""
    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    directory = paths.taken_parent if parent == "taken" else paths.hubclaims
    bogus = dead_shelf(directory)
    os.mkfifo(bogus / LOCK_NAME, 0o600)
    held = moxie_envelope("on the bogus shelf")
    write_private_json(bogus / f"{held['id']}.json", {**held, "reply_connection": "alpha"})
    shelf = Shelf(directory)
    shelf.open()
    try:
        adopted = call_within(shelf.adopt, BLOCK_DEADLINE, fifos=[bogus / LOCK_NAME], what="Shelf.adopt()")
    finally:
        shelf.close()
    assert adopted.ids == () and adopted.shelves == 0
    assert sorted(os.listdir(bogus)) == sorted([LOCK_NAME, f"{held['id']}.json"])  # left alone


def test_gateway_starts_and_relays_beside_a_fifo_shelf_lock(tmp_path: Path, gateways: list[Gateway]) -> None:
    root, paths = mini_root(tmp_path)
    bogus = dead_shelf(paths.taken_parent)
    os.mkfifo(bogus / LOCK_NAME, 0o600)
    rec = RecordingRunner()
    gw = call_within(lambda: start_gateway(gateways, root, rec, connection_id="mini", durable=False),
                     START_DEADLINE, fifos=[bogus / LOCK_NAME], what="Gateway.start()")
    assert gw.stats()["relay_alive"]
    env = moxie_envelope("after the start")
    post_to_inbox(paths, env, "alpha")
    await_condition(lambda: delivered_record(paths, env["id"]), timeout=10, message="the envelope answered")
    assert [t.delivery_id for t in rec.entered] == [env["id"]]
    assert (bogus / LOCK_NAME).exists()


def test_hub_routes_beside_a_fifo_claim_lock(tmp_path: Path) -> None:
    """The hub adopts dead ``hubclaims/`` shelves in its actor's on_start: a FIFO there stopped all routing."""
    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    mini, pm = mini_root(tmp_path)
    pa = InboxPaths.from_root(alpha).ensure()
    bogus = dead_shelf(pa.hubclaims)
    os.mkfifo(bogus / LOCK_NAME, 0o600)
    env = moxie_envelope("through the hub")
    with hub_thread({"alpha": alpha, "mini": mini}, rescan_seconds=0.5):
        try:
            rf.enqueue_envelope(pa.relay, env)
            await_condition((pm.inbox / f"{env['id']}.json").exists, timeout=10,
                            message="the envelope posted to mini's inbox")
        finally:
            poke_fifos([bogus / LOCK_NAME])  # a hub blocked in its on_start could not stop otherwise
    assert (bogus / LOCK_NAME).exists()


# ── 2. a FIFO in place of an old journal ────────────────────────────────────


def test_journal_start_moves_a_fifo_named_like_a_journal_aside_unopened(tmp_path: Path) -> None:
    """Never waited on; and, since it holds no records, moved into quarantine by the start (it stayed there
    before, skipped with a WARNING at every start: test_journal_swapped_files.py)."""
    directory = ensure_private_dir(tmp_path / "journal")
    fifo = directory / f"j-{uuid.uuid4().hex}.log"
    os.mkfifo(fifo, 0o600)
    journal = Journal(directory, fsync=False)
    try:
        folded = call_within(journal.start, BLOCK_DEADLINE, fifos=[fifo], what="Journal.start()")
    finally:
        journal.stop()
    assert folded.states == {}
    [aside] = (tmp_path / "quarantine").glob(f"{fifo.name}.*.quarantined")
    assert stat.S_ISFIFO(os.lstat(aside).st_mode) and not os.path.lexists(fifo)


def test_durable_gateway_starts_beside_a_fifo_journal(tmp_path: Path, gateways: list[Gateway]) -> None:
    root = make_root(tmp_path)
    fifo = ensure_private_dir(root / "bot_relay" / "journal") / f"j-{uuid.uuid4().hex}.log"
    os.mkfifo(fifo, 0o600)
    gw = call_within(lambda: start_gateway(gateways, root, durable=True, fsync=False), START_DEADLINE,
                     fifos=[fifo], what="a durable Gateway.start()")
    ack = gw.message_agent(sender="alice", target="bob", message="still journaled")
    assert gw.wait_outcome(ack["delivery_id"], timeout=10)["status"] == "replied"


# ── 3. a FIFO in place of config.yaml ───────────────────────────────────────


def test_config_yaml_fifo_is_refused_not_waited_on(tmp_path: Path, logs: LogCapture) -> None:
    root = make_root(tmp_path)
    fifo = root / "config.yaml"
    os.mkfifo(fifo, 0o600)
    mapping, problem = call_within(lambda: read_yaml_mapping(fifo), BLOCK_DEADLINE, fifos=[fifo],
                                   what="read_yaml_mapping(config.yaml)")
    assert mapping == {}
    assert problem is not None and "not a regular file" in problem and str(fifo) in problem
    config = call_within(lambda: load_config(root), BLOCK_DEADLINE, fifos=[fifo], what="load_config(root)")
    assert config == parse_config(DEFAULTS)[0]  # the defaults, nothing from the FIFO
    assert logs.matching(str(fifo), "not a regular file")


# ── 4. absurd heartbeats ────────────────────────────────────────────────────

HUGE_PID = "1" * 20  # int() takes it; os.kill raised OverflowError


@pytest.mark.parametrize(("pid", "at"), [
    pytest.param(HUGE_PID, "fresh", id="huge-pid-string"),
    pytest.param(int(HUGE_PID), "fresh", id="huge-pid-int"),
    pytest.param(2**31, "fresh", id="pid-past-pid_t"),
    pytest.param("self", "nan", id="nan-time"),
])
def test_gateway_alive_is_false_for_an_absurd_heartbeat(tmp_path: Path, pid: Any, at: str) -> None:
    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    beat = {"pid": os.getpid() if pid == "self" else pid, "connection_id": "mini",
            "at": time.time() if at == "fresh" else at}
    write_private_json(paths.heartbeat / "123.json", beat)
    assert gateway_alive(paths) is False
    sane = {"pid": os.getpid(), "connection_id": "mini", "at": time.time()}
    write_private_json(paths.heartbeat / f"{os.getpid()}.json", sane)
    assert gateway_alive(paths) is True  # the control: a sane one (under its pid) is read past the bad one


def test_hub_keeps_routing_with_a_huge_pid_heartbeat(tmp_path: Path) -> None:
    """``gateway_alive`` raised OverflowError in the hub's roster push, and the (unsupervised) HubActor died."""
    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    mini, pm = mini_root(tmp_path)
    pa = InboxPaths.from_root(alpha).ensure()
    write_private_json(pm.heartbeat / "123.json", {"pid": HUGE_PID, "connection_id": "mini", "at": time.time() + 60})
    env = moxie_envelope("past the bad heartbeat")
    with hub_thread({"alpha": alpha, "mini": mini}, rescan_seconds=0.5):
        await_condition(pa.relay.roster.exists, timeout=10, message="the hub pushed alpha's roster")
        rows = json.loads(pa.relay.roster.read_text(encoding="utf-8"))["agents"]
        assert {r["handle"] for r in rows} == {"hermes", "moxie"}
        assert not any("online" in r for r in rows)  # the bad heartbeat is not taken for a live gateway
        rf.enqueue_envelope(pa.relay, env)
        await_condition((pm.inbox / f"{env['id']}.json").exists, timeout=10,
                        message="the envelope posted to mini's inbox")


# ── 5. a directory where a mark is removed ──────────────────────────────────


@pytest.mark.parametrize("which", ["sent", "started"])
def test_clearing_a_mark_that_is_a_directory_moves_it_aside(tmp_path: Path, which: str) -> None:
    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    envelope_id = uuid.uuid4().hex
    mark = (paths.sent if which == "sent" else paths.started) / f"{envelope_id}.json"
    mark.mkdir(mode=0o700)
    (mark / "inner").write_text("x", encoding="utf-8")
    (clear_sent if which == "sent" else clear_started)(paths, envelope_id)
    assert not os.path.lexists(mark)
    [moved] = quarantined(paths, mark.name)
    assert (moved / "inner").read_text(encoding="utf-8") == "x"


@pytest.mark.parametrize("which", ["sent", "started"])
def test_clearing_a_mark_never_removes_a_file_through_a_swapped_directory(
    tmp_path: Path, which: str, logs: LogCapture
) -> None:
    """Regression (hostile review): ``drop_mark`` removed ``<id>.json`` by path, so through a ``started/`` or
    ``sent/`` swapped for a symlink it deleted the file of that name outside the root (a relayed-in turn's reply,
    a relayed DM's outcome). Now nothing is removed through it, and the refusal is logged."""
    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    envelope_id = uuid.uuid4().hex
    directory = paths.sent if which == "sent" else paths.started
    outside = tmp_path / "outside"
    outside.mkdir()
    precious = outside / f"{envelope_id}.json"
    precious.write_text("outside", encoding="utf-8")
    directory.rename(directory.with_name(f"{which}.aside"))
    directory.symlink_to(outside, target_is_directory=True)
    (clear_sent if which == "sent" else clear_started)(paths, envelope_id)
    assert precious.read_text(encoding="utf-8") == "outside"
    assert logs.matching("was not removed", f"{directory} is a symlink"), logs.lines


def test_a_relayed_in_turns_mark_is_never_cleared_through_a_started_swapped_during_the_turn(
    tmp_path: Path, gateways: list[Gateway], logs: LogCapture
) -> None:
    """Regression (hostile review): ``started/`` swapped for a symlink while a relayed-in turn ran: once the reply
    was written, clearing the turn's start mark deleted ``<id>.json`` in the directory the symlink points to. Now
    the reply is written all the same, and nothing outside the root is removed."""
    from actors import Rescan

    mini, paths = mini_root(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    env = moxie_envelope("a slow question")
    precious = outside / f"{env['id']}.json"
    precious.write_text("outside", encoding="utf-8")

    def swap_then_answer(turn: Turn) -> str:  # the swap lands after the turn's start mark, before its reply
        paths.started.rename(paths.relay.base / "started.aside")
        paths.started.symlink_to(outside, target_is_directory=True)
        return "the real answer"

    # no periodic rescan during the test: it would put started/ back before the mark is cleared
    gw = start_gateway(gateways, mini, RecordingRunner(swap_then_answer), connection_id="mini", durable=False,
                       config={"bot_mode": {"rescan_seconds": 3600}})
    post_to_inbox(paths, env, "alpha")
    record = await_condition(lambda: delivered_record(paths, env["id"]), timeout=20, message="the reply")
    assert record["reply"] == "the real answer"
    assert gw._system is not None and gw._system.relay is not None
    gw._system.relay.ask(Rescan("manual"), timeout=30)  # queued behind the handler that wrote the reply
    assert precious.read_text(encoding="utf-8") == "outside"
    assert logs.matching("was not removed", env["id"]), logs.lines


# ── 6. sent/ replaced by a file under a running sender ──────────────────────


def test_sender_survives_sent_dir_replaced_by_a_file(tmp_path: Path, gateways: list[Gateway]) -> None:
    """``clear_sent`` raised NotADirectoryError: out of ``message_agent``, and in the RelayActor at a reply."""
    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    write_roster_file(alpha, [remote_row("moxie", "mini", online=True)])
    # A slow rescan: it would repair sent/ (quarantine_strays) before the sends below; replies come by file event.
    gw = start_gateway(gateways, alpha, connection_id="alpha", durable=False,
                       config={"bot_mode": {"rescan_seconds": 60}})
    first = gw.message_agent(sender="alice", target="moxie@mini", message="one")
    second = gw.message_agent(sender="alice", target="moxie@mini", message="two")
    assert first.get("status") == second.get("status") == "queued", (first, second)
    paths = InboxPaths.from_root(alpha)
    shutil.rmtree(paths.sent)
    paths.sent.write_text("", encoding="utf-8")

    refused = gw.message_agent(sender="alice", target="moxie@mini", message="three")
    assert "error" in refused and "status" not in refused, refused

    for ack, text in ((first, "r1"), (second, "r2")):
        rf.write_reply(paths.relay, rp.make_reply(ack["delivery_id"], reply=text, now=time.time()))
        out = gw.wait_outcome(ack["delivery_id"], timeout=10)
        assert (out["status"], out["reply"]) == ("replied", text)
    assert gw.stats()["relay_alive"]


# ── 7. the start mark of a relayed-in turn ──────────────────────────────────


def test_start_mark_recreates_a_removed_started_dir(tmp_path: Path) -> None:
    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    os.rmdir(paths.started)
    envelope_id = uuid.uuid4().hex
    TurnStartMarks(tmp_path / "root", fsync=False).append_durably({"t": "started", "id": envelope_id})
    assert paths.started.is_dir()
    assert json.loads((paths.started / f"{envelope_id}.json").read_text(encoding="utf-8"))["id"] == envelope_id


def test_start_mark_refuses_when_started_is_a_file(tmp_path: Path) -> None:
    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    os.rmdir(paths.started)
    paths.started.write_text("", encoding="utf-8")
    with pytest.raises(StoreError):
        TurnStartMarks(tmp_path / "root", fsync=False).append_durably({"t": "started", "id": uuid.uuid4().hex})


def test_relayed_turn_is_marked_after_started_dir_was_removed(tmp_path: Path, gateways: list[Gateway]) -> None:
    """The turn ran unmarked, so an adopter after a crash would have run it a second time."""
    mini, paths = mini_root(tmp_path)
    marked: list[bool] = []

    def runner(turn: Turn) -> str:
        marked.append((paths.started / f"{turn.delivery_id}.json").exists())
        return "fine"

    # A slow rescan: the turn itself must recreate started/, not quarantine_strays.
    start_gateway(gateways, mini, runner, connection_id="mini", durable=False,
                  config={"bot_mode": {"rescan_seconds": 60}})
    os.rmdir(paths.started)
    env = moxie_envelope("marked?")
    post_to_inbox(paths, env, "alpha")
    record = await_condition(lambda: delivered_record(paths, env["id"]), timeout=10, message="the reply")
    assert record["reply"] == "fine"
    assert marked == [True]


def test_relayed_turn_is_refused_when_started_is_a_file(tmp_path: Path, gateways: list[Gateway]) -> None:
    """The turn ran unmarked, then clearing its mark raised in the RelayActor, which died."""
    mini, paths = mini_root(tmp_path)
    rec = RecordingRunner()
    gw = start_gateway(gateways, mini, rec, connection_id="mini", durable=False,
                       config={"bot_mode": {"rescan_seconds": 60}})  # slow: the rescan would repair started/
    os.rmdir(paths.started)
    paths.started.write_text("", encoding="utf-8")
    env = moxie_envelope("unmarkable")
    post_to_inbox(paths, env, "alpha")
    record = await_condition(lambda: delivered_record(paths, env["id"]), timeout=10, message="the refusal")
    assert record["error"] and record["reply"] == "", record
    assert rec.entered == []
    assert gw.stats()["relay_alive"]


# ── 8. the rescan repairs relay directories ─────────────────────────────────


# locks/ and quarantine/ were left out: a swapped locks/ failed every turn of the root (runtime_offline) for good
@pytest.mark.parametrize("which", ["started", "sent", "consumed", "expiring", "gateways", "locks", "quarantine"])
@pytest.mark.parametrize("how", ["file", "symlink", "removed"])
def test_quarantine_strays_puts_relay_directories_back(tmp_path: Path, which: str, how: str) -> None:
    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    directory = paths.relay.base / which
    os.rmdir(directory)
    if how == "file":
        directory.write_text("planted", encoding="utf-8")
    elif how == "symlink":  # swapped at runtime for a link elsewhere: never followed, put back
        (tmp_path / "elsewhere").mkdir()
        directory.symlink_to(tmp_path / "elsewhere")
    moved = quarantine_strays(paths)
    assert directory.is_dir() and not directory.is_symlink()
    if how == "file":
        assert moved == 1
        [aside] = quarantined(paths, which)
        assert aside.read_text(encoding="utf-8") == "planted"
    elif how == "symlink":
        assert moved == 1 and len(quarantined(paths, which)) == 1
    else:
        assert moved == 0 and quarantined(paths, which) == []


@pytest.mark.parametrize("durable", [False, True])
def test_a_dm_whose_turn_finds_locks_swapped_runs_after_the_turn_puts_it_back(
    tmp_path: Path, gateways: list[Gateway], durable: bool
) -> None:
    """Regression (hostile-files review): with bot_relay/locks swapped for a symlink, an acked DM failed at once,
    `failed [runtime_offline] … Taking the turn lock failed (PermissionError: … locks is a symlink…); the DM was NOT
    delivered. Resend shortly.`, though the host ran and its rescan put locks/ back 2 s later. Its turn now puts
    locks/ back by the rescan's rule (the rescan here never comes: once an hour) and the DM runs."""
    root = make_root(tmp_path, config={"bot_mode": {"rescan_seconds": 3600}})
    outside = tmp_path / "outside"
    outside.mkdir()
    rec = RecordingRunner()
    gw = start_gateway(gateways, root, rec, durable=durable)
    locks = root / "bot_relay" / "locks"
    os.rename(locks, tmp_path / "locks.aside")
    locks.symlink_to(outside, target_is_directory=True)
    ack = gw.message_agent(sender="alice", target="bob", message="hi")
    outcome = gw.wait_outcome(ack["delivery_id"], timeout=30)
    assert outcome["status"] == "replied", outcome
    assert locks.is_dir() and not locks.is_symlink()
    assert [q.is_symlink() for q in quarantined(InboxPaths.from_root(root), "locks")] == [True]
    assert list(outside.iterdir()) == []  # never followed


def test_a_relay_directory_that_cannot_be_put_back_stops_none_of_the_others_and_is_logged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the put-back was one ``paths.ensure()``, which stopped at a locks/ it could not make (a symlink
    still there), so a delivered/ removed in the same pass was never made again (the next reply failed ENOENT),
    and the same ERROR came back at every rescan, every 2 s."""
    from hermes_actors.relay import strays

    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    (tmp_path / "elsewhere").mkdir()
    os.rmdir(paths.relay.locks)
    paths.relay.locks.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    os.rmdir(paths.delivered)
    real_quarantine = strays.quarantine

    def stuck(relay: Any, path: Path, why: str) -> Path | None:  # locks/ cannot be moved aside (yet)
        return None if path == paths.relay.locks else real_quarantine(relay, path, why)

    monkeypatch.setattr(strays, "quarantine", stuck)
    unfixable: set[Path] = set()
    with LogCapture("INFO") as logs:
        for _ in range(3):
            quarantine_strays(paths, unfixable=unfixable)
        assert paths.delivered.is_dir() and not paths.delivered.is_symlink()
        assert len(logs.matching("could not recreate", "locks")) == 1, logs.lines
        monkeypatch.setattr(strays, "quarantine", real_quarantine)  # now it can: put back, and said so
        quarantine_strays(paths, unfixable=unfixable)
        assert paths.relay.locks.is_dir() and not paths.relay.locks.is_symlink()
        assert logs.matching("relay directory", "locks", "is back"), logs.lines
        assert unfixable == set()
        quarantine_strays(paths, unfixable=unfixable)
        assert len(logs.matching("could not recreate")) == 1 and len(logs.matching("is back")) == 1
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_relay_directory_others_may_write_in_is_set_back_to_0700_at_start_and_at_the_rescan(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Regression (hostile review): ``replies/``, ``outbox/`` and ``sent/`` chmod 0777 (another user could plant,
    replace or remove DM files there) were used as they were, silently. Not refused (a seed makes them with a
    plain ``mkdir``, as loose as its umask): the start sets each back to 0700 with one WARNING naming it, and so
    does the rescan for one loosened while the gateway runs."""
    from actors import Rescan

    mini, paths = mini_root(tmp_path)
    loosened = [paths.relay.replies, paths.relay.outbox, paths.sent]
    for directory in loosened:
        os.chmod(directory, 0o777)
    os.chmod(paths.relay.base, 0o775)  # a seed's mkdir under umask 002
    with LogCapture() as logs:
        gw = start_gateway(gateways, mini, RecordingRunner(), connection_id="mini", durable=False,
                           config={"bot_mode": {"rescan_seconds": 3600}})  # the rescans are asked for here
        for directory in (paths.relay.base, *loosened):
            assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700, directory
            assert len(logs.matching(f"relay: {directory} was writable by other users", "set back to 0700")) == 1, \
                logs.lines
        assert len(logs.matching("was writable by other users")) == 4, logs.lines
        assert gw._system is not None and gw._system.relay is not None
        relay = gw._system.relay
        os.chmod(paths.relay.replies, 0o770)
        for _ in range(2):
            relay.ask(Rescan("manual"), timeout=30)
        assert stat.S_IMODE(os.stat(paths.relay.replies).st_mode) == 0o700
        assert len(logs.matching(f"relay: {paths.relay.replies} was writable by other users (mode 0770)")) == 1, \
            logs.lines
        assert len(logs.matching("was writable by other users")) == 5, logs.lines
    os.chmod(paths.relay.claimed, 0o755)  # readable by others is not what this restores
    relay.ask(Rescan("manual"), timeout=30)
    assert stat.S_IMODE(os.stat(paths.relay.claimed).st_mode) == 0o755


def _every_directory(paths: InboxPaths) -> list[Path]:
    """Every directory on disk in ``bot_relay/`` (itself included) and the temp directory beside it."""
    found = [paths.relay.tmp]
    for top, dirs, _files in os.walk(paths.relay.base):
        found.append(Path(top))
        found += [Path(top) / name for name in dirs if (Path(top) / name).is_symlink()]
    return sorted(found)


def test_every_directory_of_ours_in_bot_relay_is_set_back_to_0700(tmp_path: Path) -> None:
    """Regression (configfix): ``journal/`` and ``rooms/`` at 0777 were never set back nor reported (only the
    directories of a fixed list were looked at: ``run/``, ``unconfirmed/``, ``rooms/.started/``,
    ``hubclaims/expiring/`` and the per-process shelves were left out too). Every directory of ours there is
    now under the one rule, whichever process of ours uses it."""
    from hermes_actors.relay.strays import restore_private_modes

    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    for directory in (paths.journal, paths.run, paths.rooms, paths.room_starts, paths.unconfirmed,
                      paths.expiring_shelves):
        ensure_private_dir(directory, within=paths.relay.root)
    shelves = [dead_shelf(parent) for parent in (paths.taken_parent, paths.hubclaims, paths.expiring_shelves)]
    every = _every_directory(paths)
    assert {paths.journal, paths.rooms, paths.room_starts, *shelves} <= set(every)
    for directory in every:
        os.chmod(directory, 0o777)
    with LogCapture() as logs:
        restored = restore_private_modes(paths)
    assert sorted(restored) == every
    for directory in every:
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700, directory
        assert len(logs.matching(f"relay: {directory} was writable by other users (mode 0777)")) == 1, logs.lines
    assert restore_private_modes(paths) == []  # set back: nothing more to say


def test_journal_and_rooms_others_may_write_in_are_set_back_at_the_rescan(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Regression (configfix): a running gateway's rescan set ``outbox/`` back to 0700 but left ``journal/`` and
    ``rooms/`` at 0777, saying nothing."""
    from actors import Rescan

    mini, paths = mini_root(tmp_path)
    gw = start_gateway(gateways, mini, RecordingRunner(), connection_id="mini", durable=True,
                       config={"bot_mode": {"rescan_seconds": 3600}})  # the rescan is asked for here
    assert gw._system is not None and gw._system.relay is not None
    ensure_private_dir(paths.rooms, within=paths.relay.root)
    loosened = [paths.journal, paths.rooms]
    for directory in loosened:
        os.chmod(directory, 0o777)
    with LogCapture() as logs:
        gw._system.relay.ask(Rescan("manual"), timeout=30)
        for directory in loosened:
            assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700, directory
            assert len(logs.matching(f"relay: {directory} was writable by other users (mode 0777)",
                                     "set back to 0700")) == 1, logs.lines


def _bot_relay_swapped(paths: InboxPaths, how: str) -> Path:
    """Move ``bot_relay/`` aside and put a file (or a symlink to one) in its place; returns where it went."""
    aside = paths.relay.root.parent / "bot_relay.aside"
    paths.relay.base.rename(aside)
    if how == "file":
        paths.relay.base.write_text("planted", encoding="utf-8")
    else:
        target = paths.relay.root.parent / "a-file"
        target.write_text("x", encoding="utf-8")
        paths.relay.base.symlink_to(target)
    return aside


def _bot_relay_back(paths: InboxPaths, aside: Path) -> None:
    paths.relay.base.unlink()
    aside.rename(paths.relay.base)


@pytest.mark.parametrize("how", ["file", "symlink to a file"])
def test_a_bot_relay_that_is_no_directory_is_refused_once_while_it_lasts_and_cleaned_once_back(
    tmp_path: Path, how: str
) -> None:
    """Regression: the look at each relay directory (``os.lstat``) caught only FileNotFoundError, so with
    ``bot_relay/`` a file NotADirectoryError escaped the clean-up and ended the gateway's RelayActor (or the
    hub's actor) for good. Now it is refused, logged once while it lasts, never moved, and the clean-up
    works again once it is a directory."""
    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    aside = _bot_relay_swapped(paths, how)
    unfixable: set[Path] = set()
    with LogCapture("INFO") as logs:
        for _ in range(3):
            assert quarantine_strays(paths, unfixable=unfixable) == 0
        assert len(logs.matching("bot_relay cannot be used", "move the file or symlink aside")) == 1, logs.lines
        assert paths.relay.base in unfixable and not logs.matching("could not recreate")
        assert paths.relay.base.is_symlink() == (how != "file") and not paths.relay.base.is_dir()  # not moved
        _bot_relay_back(paths, aside)
        os.rmdir(paths.delivered)
        quarantine_strays(paths, unfixable=unfixable)
        assert logs.matching("bot_relay is a usable directory again"), logs.lines
    assert unfixable == set() and paths.delivered.is_dir()


def test_a_gateway_relays_again_at_the_rescan_after_its_bot_relay_was_a_file(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Regression: the first rescan with ``bot_relay/`` a file crashed the unsupervised RelayActor; once the
    directory was back, inbox/ was never drained again. Now the rescans refuse it (logged once) and the one
    after it is back takes the envelope."""
    from actors import Rescan

    mini, paths = mini_root(tmp_path)
    rec = RecordingRunner()
    gw = start_gateway(gateways, mini, rec, connection_id="mini", durable=False,
                       config={"bot_mode": {"rescan_seconds": 3600}})  # the rescans are asked for here
    assert gw._system is not None and gw._system.relay is not None
    relay = gw._system.relay
    aside = _bot_relay_swapped(paths, "file")
    with LogCapture() as logs:
        for _ in range(2):
            relay.ask(Rescan("manual"), timeout=30)
        assert len(logs.matching("bot_relay cannot be used")) == 1, logs.lines
    _bot_relay_back(paths, aside)
    env = moxie_envelope("still there?")
    post_to_inbox(paths, env, "alpha")
    relay.ask(Rescan("manual"), timeout=30)  # the watch may have lost bot_relay/: the rescan takes it
    record = await_condition(lambda: delivered_record(paths, env["id"]), timeout=20, message="the reply")
    assert record["reply_connection"] == "alpha" and len(rec.entered) == 1


def test_an_os_error_in_a_rescan_is_logged_once_and_the_relay_goes_on(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever a rescan meets, it never ends the (unsupervised) RelayActor: the error is logged once while
    it lasts, naming the directory, and the next rescan works."""
    from actors import Rescan
    from hermes_actors.relay import relay_actor

    mini, paths = mini_root(tmp_path)
    gw = start_gateway(gateways, mini, RecordingRunner(), connection_id="mini", durable=False,
                       config={"bot_mode": {"rescan_seconds": 3600}})
    assert gw._system is not None and gw._system.relay is not None
    relay = gw._system.relay
    real = relay_actor.quarantine_strays

    def denied(*args: Any, **kwargs: Any) -> int:
        raise PermissionError(13, "Permission denied", str(paths.relay.quarantine))

    monkeypatch.setattr(relay_actor, "quarantine_strays", denied)
    with LogCapture() as logs:
        for _ in range(3):
            relay.ask(Rescan("manual"), timeout=30)
        assert len(logs.matching("rescan of", str(paths.relay.base), "PermissionError", "belong to the user")
                   ) == 1, logs.lines
        monkeypatch.setattr(relay_actor, "quarantine_strays", real)
        env = moxie_envelope("after the error")
        post_to_inbox(paths, env, "alpha")
        relay.ask(Rescan("manual"), timeout=30)
        await_condition(lambda: delivered_record(paths, env["id"]), timeout=20, message="the reply")


@pytest.mark.parametrize(("name", "kept"), [
    ("stray.txt", b"stray.txt"),
    ("x" * 255, b"x" * 214),  # the longest name a directory holds: cut to fit beside the suffix
    ("é" * 127, "é".encode() * 107),  # 254 bytes of 2-byte characters: cut on a character boundary here
    (os.fsdecode(b"\xff" * 10), b"\xff" * 10),  # not UTF-8: its bytes are kept as they are
], ids=["short", "255-bytes", "multibyte", "not-utf8"])
def test_quarantine_name_fits_one_file_name(name: str, kept: bytes) -> None:
    from hermes_actors.store.relay_quarantine import quarantine_name

    out = os.fsencode(quarantine_name(name, 1_700_000_000_123_456_789, "0a1b2c3d"))
    assert out == kept + b".1700000000123456789.0a1b2c3d.quarantined" and len(out) <= 255


def test_a_stray_with_the_longest_possible_name_is_quarantined_once(tmp_path: Path, logs: LogCapture) -> None:
    """Its quarantined name was too long: the move failed and was warned about at every rescan, forever."""
    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    stray = paths.inbox / ("s" * 255)
    stray.write_text("planted", encoding="utf-8")
    assert quarantine_strays(paths) == 1
    assert not stray.exists()
    [aside] = [p for p in paths.relay.quarantine.iterdir() if p.name.startswith("s" * 200)]
    assert aside.read_text(encoding="utf-8") == "planted"
    assert not any("could not quarantine" in line for line in logs.lines), logs.lines


# ── 9. our shelf removed or swapped under a running gateway ─────────────────


@pytest.mark.parametrize("how", ["symlink", "removed"])
def test_receiver_takes_a_new_shelf_when_taken_is_replaced(
    tmp_path: Path, gateways: list[Gateway], how: str
) -> None:
    mini, paths = mini_root(tmp_path)
    rec = RecordingRunner()
    start_gateway(gateways, mini, rec, connection_id="mini", durable=False,
                  config={"bot_mode": {"rescan_seconds": 0.2}})
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o700)
    if how == "symlink":
        os.rename(paths.taken_parent, tmp_path / "taken.moved")
        paths.taken_parent.symlink_to(outside, target_is_directory=True)
    else:
        shutil.rmtree(paths.taken_parent)
    env = moxie_envelope("after the swap")
    post_to_inbox(paths, env, "alpha")
    rec.wait_entered(1, timeout=10)
    assert [t.delivery_id for t in rec.entered] == [env["id"]]
    await_condition(lambda: delivered_record(paths, env["id"]), timeout=10, message="the reply")
    assert paths.taken_parent.is_dir() and not paths.taken_parent.is_symlink()
    assert os.listdir(outside) == []  # the symlink was never followed


# ── 10. adopted envelopes past their TTL ────────────────────────────────────


def plant_dead_shelf(paths: InboxPaths, *envelopes: dict[str, Any]) -> Path:
    """A killed gateway's shelf: an unlocked ``.lock`` and its taken envelopes (reply to ``alpha``)."""
    shelf = dead_shelf(paths.taken_parent)
    write_private_json(shelf / LOCK_NAME, {})
    for env in envelopes:
        write_private_json(shelf / f"{env['id']}.json", {**env, "reply_connection": "alpha"})
    return shelf


def test_recover_taken_expires_a_never_started_envelope_past_the_ttl(tmp_path: Path) -> None:
    now = time.time()
    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    old = moxie_envelope("an hour ago", created_at=now - 3600)
    fresh = moxie_envelope("a minute ago", created_at=now - 60)
    plant_dead_shelf(paths, old, fresh)
    shelf = Shelf(paths.taken_parent)
    ours = paths.on_shelf(shelf.open())
    try:
        adopted = shelf.adopt()
        assert sorted(adopted.ids) == sorted([old["id"], fresh["id"]])
        recovery = recover_taken(ours, adopted, ttl=900, now=now)
    finally:
        shelf.close()
    assert [(env["id"], conn) for env, conn in recovery.rerun] == [(fresh["id"], "alpha")]
    assert (recovery.expired, recovery.ambiguous, recovery.finished) == (1, 0, 0)
    record = delivered_record(paths, old["id"])
    assert record is not None
    assert (record["reason"], record["reply"], record["reply_connection"]) == ("queued_expired", "", "alpha")
    assert not (ours.taken / f"{old['id']}.json").exists()
    assert delivered_record(paths, fresh["id"]) is None


def _files(directory: Path) -> dict[str, bytes]:
    """Every file below ``directory``: its path relative to it -> its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _taken_swapped_for_a_copy(paths: InboxPaths, outside: Path) -> dict[str, bytes]:
    """Swap ``taken/`` for a symlink to a copy of it at ``outside``; what the copy holds (:func:`_files`)."""
    shutil.copytree(paths.taken_parent, outside, symlinks=True)
    paths.taken_parent.rename(paths.relay.base / "taken.aside")
    paths.taken_parent.symlink_to(outside, target_is_directory=True)
    return _files(outside)


def test_recover_taken_never_takes_an_envelope_off_a_shelf_through_a_swapped_taken(
    tmp_path: Path, logs: LogCapture
) -> None:
    """Regression (hostile review of removals): the adopted envelope answered at a start was removed from the shelf
    by path, so through a ``taken/`` swapped for a symlink the envelope file of that name outside the root went.
    Now nothing outside is removed; nor read: the shelf, reached through the symlink, is refused before any
    envelope is read (test_recover_taken_never_reads_an_envelope_through_a_swapped_shelf), so none is answered."""
    now = time.time()
    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    old = moxie_envelope("an hour ago", created_at=now - 3600)
    plant_dead_shelf(paths, old)
    shelf = Shelf(paths.taken_parent, within=paths.relay.root)
    ours = paths.on_shelf(shelf.open())
    try:
        adopted = shelf.adopt()
        outside = _taken_swapped_for_a_copy(paths, tmp_path / "outside")
        assert f"{ours.taken.name}/{old['id']}.json" in outside
        recovery = recover_taken(ours, adopted, ttl=900, now=now)
    finally:
        shelf.close()
    assert recovery.expired == 0 and delivered_record(paths, old["id"]) is None
    assert _files(tmp_path / "outside") == outside  # nothing removed through the symlink
    assert logs.matching("our shelf", "cannot be read", "is a symlink"), logs.lines


def test_a_shelf_is_never_removed_through_a_swapped_taken(tmp_path: Path, logs: LogCapture) -> None:
    """Regression (hostile review of removals): a stopping gateway's empty shelf was listed and removed by path, so
    through a ``taken/`` swapped for a symlink its ``.lock`` and directory of that name outside the root went."""
    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    shelf = Shelf(paths.taken_parent, within=paths.relay.root)
    shelf.open()
    outside = _taken_swapped_for_a_copy(paths, tmp_path / "outside")
    assert f"{shelf.path.name}/{LOCK_NAME}" in outside
    shelf.close()
    assert (tmp_path / "outside" / shelf.path.name / LOCK_NAME).exists()
    assert logs.matching("could not remove the shelf", "is a symlink"), logs.lines


def _swapped_for_symlink(directory: Path, outside: Path) -> None:
    """Move ``directory`` aside (``<name>.aside``) and put a symlink to ``outside`` in its place."""
    directory.rename(directory.with_name(f"{directory.name}.aside"))
    directory.symlink_to(outside, target_is_directory=True)


def _outside_with(tmp_path: Path, name: str | None, payload: Any) -> Path:
    """A directory outside the root, holding a decoy ``name`` (none when ``name`` is None)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    if name is not None:
        write_private_json(outside / name, payload)
    return outside


@pytest.mark.parametrize("decoy", [True, False], ids=["decoy-mark-outside", "nothing-outside"])
def test_was_started_never_looks_through_a_swapped_started(tmp_path: Path, decoy: bool, logs: LogCapture) -> None:
    """Regression (swapped directories): ``was_started`` looked the mark up by path, so through a ``started/``
    swapped for a symlink a file outside the root said whether a relayed-in turn had started (the stop's
    put-back and a start's adoption decide a DM's fate by it): with no such file there, a turn that may have run
    counted as never started. Now ``started/`` is looked into only through the checked walk: refused, the turn
    counts as started (never run twice), said at WARNING."""
    from hermes_actors.store.relay_marks import was_started

    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    envelope_id = uuid.uuid4().hex
    outside = _outside_with(tmp_path, f"{envelope_id}.json" if decoy else None, {"id": envelope_id, "at": 1})
    _swapped_for_symlink(paths.started, outside)
    assert was_started(paths, envelope_id)
    assert logs.matching("cannot tell whether the turn of", envelope_id, f"{paths.started} is a symlink"), logs.lines


def _adopted_onto_our_shelf(paths: InboxPaths, *envelopes: dict[str, Any]) -> tuple[Shelf, InboxPaths, Any]:
    """Our shelf (opened, within the root) after it adopted a dead shelf holding ``envelopes``; close it after."""
    plant_dead_shelf(paths, *envelopes)
    shelf = Shelf(paths.taken_parent, within=paths.relay.root)
    ours = paths.on_shelf(shelf.open())
    adopted = shelf.adopt()
    assert sorted(adopted.ids) == sorted(env["id"] for env in envelopes)
    return shelf, ours, adopted


def test_recover_taken_never_reads_an_envelope_through_a_swapped_shelf(tmp_path: Path, logs: LogCapture) -> None:
    """Regression (swapped directories): the adopted envelopes were read from our shelf by path, so with the shelf
    swapped for a symlink after the adoption, an envelope file of that name outside the root was read, and run as
    the DM. Now the shelf is opened by the checked walk: refused, nothing is read or run, said at WARNING."""
    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    env = moxie_envelope("the real question")
    shelf, ours, adopted = _adopted_onto_our_shelf(paths, env)
    try:
        outside = _outside_with(tmp_path, f"{env['id']}.json",
                                {**moxie_envelope("a decoy question"), "id": env["id"], "reply_connection": "alpha"})
        _swapped_for_symlink(ours.taken, outside)
        recovery = recover_taken(ours, adopted, ttl=900)
    finally:
        shelf.close()
    assert recovery.rerun == [] and recovery.counts()["quarantined"] == 0
    assert (outside / f"{env['id']}.json").exists() and delivered_record(paths, env["id"]) is None
    assert logs.matching("our shelf", "cannot be read", "is a symlink"), logs.lines


def test_recover_taken_never_takes_a_reply_outside_for_the_adopted_envelopes(tmp_path: Path) -> None:
    """Regression (swapped directories): whether an adopted envelope was replied was looked up in ``delivered/`` by
    path, so a file of that name outside the root, through a ``delivered/`` swapped for a symlink, took a
    never-started envelope for finished: it left our shelf unanswered, never run. Now the lookup goes through the
    checked walk: refused, nothing proves it replied, and the envelope is run once (still on our shelf)."""
    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    env = moxie_envelope("a question")
    shelf, ours, adopted = _adopted_onto_our_shelf(paths, env)
    try:
        decoy = {"id": env["id"], "at": 1, "reply": "a decoy reply", "error": "", "reason": "",
                 "reply_connection": "alpha"}
        _swapped_for_symlink(paths.delivered, _outside_with(tmp_path, f"{env['id']}.json", decoy))
        recovery = recover_taken(ours, adopted, ttl=900)
    finally:
        shelf.close()
    assert [(e["id"], e["message"]) for e, _ in recovery.rerun] == [(env["id"], "a question")]
    assert recovery.finished == 0 and (ours.taken / f"{env['id']}.json").exists()


@pytest.mark.parametrize("decoy", [True, False], ids=["decoy-mark-outside", "nothing-outside"])
def test_recover_taken_answers_ambiguous_when_started_is_swapped(tmp_path: Path, decoy: bool) -> None:
    """Regression (swapped directories): through a ``started/`` swapped for a symlink, a start's adoption ran an
    envelope again unless a file of its name was outside the root (its turn may have run). Now ``started/`` is
    refused and the envelope counted as one whose turn may have run, whatever is outside: never run again, it is
    handed to the Dispatcher to answer with the journal's outcome of it, else ``ambiguous``."""
    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    env = moxie_envelope("a question")
    shelf, ours, adopted = _adopted_onto_our_shelf(paths, env)
    try:
        outside = _outside_with(tmp_path, f"{env['id']}.json" if decoy else None, {"id": env["id"], "at": 1})
        _swapped_for_symlink(paths.started, outside)
        recovery = recover_taken(ours, adopted, ttl=900)
    finally:
        shelf.close()
    assert recovery.rerun == [] and [envelope["id"] for envelope, _ in recovery.may_have_run] == [env["id"]]
    assert sorted(os.listdir(outside)) == ([f"{env['id']}.json"] if decoy else [])


def test_a_dead_shelf_swapped_once_locked_is_never_adopted_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logs: LogCapture
) -> None:
    """Regression (swapped directories): a dead shelf was listed and its envelopes renamed onto ours by path once
    its lock was taken, so a shelf swapped for a symlink at that moment had the files outside the root it points to
    moved onto our shelf (and run as DMs). Now both shelves are opened by the checked walk: the swapped one is
    refused, nothing is moved, and it is logged."""
    from hermes_actors.store import relay_shelf

    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    env = moxie_envelope("the real question")
    dead = plant_dead_shelf(paths, env)
    decoy = {**moxie_envelope("a decoy question"), "reply_connection": "alpha"}
    outside = _outside_with(tmp_path, f"{decoy['id']}.json", decoy)
    real_take_dead = relay_shelf.take_dead

    def take_then_swap(parent: Path, name: str, **kwargs: Any) -> int | None:
        fd = real_take_dead(parent, name, **kwargs)
        if name == dead.name:
            _swapped_for_symlink(dead, outside)
        return fd

    monkeypatch.setattr(relay_shelf, "take_dead", take_then_swap)
    shelf = Shelf(paths.taken_parent, within=paths.relay.root)
    shelf.open()
    try:
        adopted = shelf.adopt()
        on_ours = sorted(os.listdir(shelf.path))
    finally:
        shelf.close()
    assert adopted.ids == () and dead.name in adopted.alive
    assert on_ours == [LOCK_NAME] and (outside / f"{decoy['id']}.json").exists()
    assert logs.matching("could not adopt the shelf", "is a symlink"), logs.lines


def test_gateway_does_not_run_an_adopted_envelope_past_the_ttl(tmp_path: Path, gateways: list[Gateway]) -> None:
    """The TTL applied to inbox envelopes only: one adopted an hour late ran although its sender had given up."""
    mini, paths = mini_root(tmp_path)
    old = moxie_envelope("from an hour ago", created_at=time.time() - 3600)
    fresh = moxie_envelope("from just now")
    plant_dead_shelf(paths, old, fresh)
    rec = RecordingRunner()
    start_gateway(gateways, mini, rec, connection_id="mini", durable=False,
                  config={"bot_mode": {"envelope_ttl_seconds": 900}})
    expired = await_condition(lambda: delivered_record(paths, old["id"]), timeout=10, message="the expiry reply")
    assert expired["reason"] == "queued_expired" and expired["reply"] == ""
    answered = await_condition(lambda: delivered_record(paths, fresh["id"]), timeout=10, message="the fresh reply")
    assert answered["reply"] == "ok: from just now"  # adoption works: the fresh one ran
    assert [t.delivery_id for t in rec.entered] == [fresh["id"]]


# ── 10. a relayed-in reply whose delivered/ write failed ────────────────────


def test_a_reply_that_could_not_be_written_to_delivered_is_written_once_it_is_back(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Regression: delivered/ swapped for a symlink while the turn ran: the reply write failed, was logged and
    dropped; the sender waited 900 s for delivery_timeout (or, after a restart, got ``ambiguous``) although the
    turn had run. Now it is kept (in memory and in its start mark) and written by the next rescan, whose
    clean-up has put delivered/ back; nothing is ever written through the symlink."""
    from actors import Rescan

    mini, paths = mini_root(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()

    def swap_then_answer(turn: Turn) -> str:  # the swap lands between the turn's start and its reply
        paths.delivered.rename(paths.relay.base / "delivered.aside")
        paths.delivered.symlink_to(outside, target_is_directory=True)
        return "the real answer"

    # no periodic rescan during the test: the one that writes the reply is asked for below
    gw = start_gateway(gateways, mini, RecordingRunner(swap_then_answer), connection_id="mini", durable=False,
                       config={"bot_mode": {"rescan_seconds": 3600}})
    env = moxie_envelope("a slow question")
    mark = paths.started / f"{env['id']}.json"
    with LogCapture() as logs:
        post_to_inbox(paths, env, "alpha")
        await_condition(lambda: logs.matching("could not write the reply of", env["id"]), timeout=20,
                        message="the failed write")
    assert list(outside.iterdir()) == []
    kept = json.loads(mark.read_text(encoding="utf-8"))  # for a restart: see the test below
    assert kept["reply"]["reply"] == "the real answer" and kept["reply"]["reply_connection"] == "alpha"
    assert gw._system is not None and gw._system.relay is not None
    gw._system.relay.ask(Rescan("manual"), timeout=30)  # puts delivered/ back, then writes the kept reply
    record = delivered_record(paths, env["id"])
    assert record is not None and record["reply"] == "the real answer" and record["reply_connection"] == "alpha"
    assert not mark.exists() and rf.list_ids(paths.taken) == []  # done: off the shelf, mark dropped
    assert list(outside.iterdir()) == []
    gw._system.relay.ask(Rescan("manual"), timeout=30)
    assert len(logs.matching("could not write the reply of", env["id"])) == 1, logs.lines  # logged once


def test_a_restart_writes_the_reply_kept_in_a_start_mark_instead_of_ambiguous(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """A gateway stopped before it could write a relayed-in reply (it is in the envelope's start mark):
    the next gateway writes that reply, not ``ambiguous``, and never runs the turn again."""
    from hermes_actors.store.relay_marks import keep_reply

    mini, paths = mini_root(tmp_path)
    env = moxie_envelope("answered before the stop")
    (paths.taken_parent / f"{env['id']}.json").write_text(json.dumps({**env, "reply_connection": "alpha"}),
                                                          encoding="utf-8")  # a flat (dead) taken file
    os.chmod(paths.taken_parent / f"{env['id']}.json", 0o600)
    keep_reply(paths, rp.make_reply(env["id"], reply="kept answer", now=time.time()), "alpha", now=time.time())
    rec = RecordingRunner()
    start_gateway(gateways, mini, rec, connection_id="mini", durable=False)
    record = await_condition(lambda: delivered_record(paths, env["id"]), timeout=20, message="the kept reply")
    assert (record["reply"], record["error"], record["reply_connection"]) == ("kept answer", "", "alpha"), record
    assert rec.entered == [] and not (paths.started / f"{env['id']}.json").exists()


def test_a_start_puts_back_a_delivered_left_swapped_and_writes_the_kept_reply(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Regression: a gateway killed after its delivered/ write failed (delivered/ swapped for a symlink to a
    user's directory) left the reply in the start mark "for the next start", but that start refused the root
    (``delivered is a symlink or not a directory; refusing to use it``). Now the start puts delivered/ back
    by the rescan's rule (the link moved into quarantine/, never followed) and writes the kept reply."""
    from hermes_actors.store.relay_marks import keep_reply

    mini, paths = mini_root(tmp_path)
    env = moxie_envelope("answered before the kill")
    (paths.taken_parent / f"{env['id']}.json").write_text(json.dumps({**env, "reply_connection": "alpha"}),
                                                          encoding="utf-8")  # a flat (dead) taken file
    os.chmod(paths.taken_parent / f"{env['id']}.json", 0o600)
    keep_reply(paths, rp.make_reply(env["id"], reply="kept answer", now=time.time()), "alpha", now=time.time())
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("the user's", encoding="utf-8")
    os.rmdir(paths.delivered)
    paths.delivered.symlink_to(user, target_is_directory=True)
    rec = RecordingRunner()
    start_gateway(gateways, mini, rec, connection_id="mini", durable=False,
                  config={"bot_mode": {"rescan_seconds": 3600}})  # the start does it, not a rescan
    record = await_condition(lambda: delivered_record(paths, env["id"]), timeout=20, message="the kept reply")
    assert (record["reply"], record["reply_connection"]) == ("kept answer", "alpha"), record
    assert rec.entered == [] and not paths.delivered.is_symlink()
    [link] = quarantined(paths, "delivered")
    assert link.is_symlink() and [p.name for p in user.iterdir()] == ["notes.txt"]  # the target untouched


def test_a_start_walks_the_relay_tree_once(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: ``ensure_relay_directories`` (the clean-up walk, then the mkdirs) ran twice at every start,
    in ``ActorSystem.start`` and again in ``RelayActor.__init__``; the system's, before the watch, is the one."""
    from hermes_actors.relay import strays

    mini, paths = mini_root(tmp_path)
    walked: list[Path] = []
    real = strays.quarantine_strays  # what ensure_relay_directories calls (the rescans have their own binding)

    def counted(walked_paths: InboxPaths, *, unfixable: set[Path] | None = None, also: tuple[Path, ...] = ()) -> int:
        walked.append(walked_paths.relay.base)
        return real(walked_paths, unfixable=unfixable, also=also)

    monkeypatch.setattr(strays, "quarantine_strays", counted)
    start_gateway(gateways, mini, RecordingRunner(), connection_id="mini", durable=False,
                  config={"bot_mode": {"rescan_seconds": 3600}})
    assert walked == [paths.relay.base]


def test_a_start_refuses_a_bot_relay_swapped_for_a_symlink_naming_it_and_saying_what_to_do(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """``bot_relay/`` itself is never moved (it is the user's): the start refuses it and says how to fix it."""
    mini, paths = mini_root(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    paths.relay.base.rename(tmp_path / "bot_relay.moved")
    paths.relay.base.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(HostileFileError, match=r"bot_relay is a symlink.*move the symlink or file aside"):
        start_gateway(gateways, mini, RecordingRunner(), connection_id="mini", durable=False)
    assert paths.relay.base.is_symlink() and list(elsewhere.iterdir()) == []


# ── 11. an unreadable taken/ entry and the start marks without via ──────────


def _shelved(paths: InboxPaths, envelope: dict[str, Any]) -> Path:
    """A dead file-relay gateway's shelf (its lock taken by nobody) holding ``envelope``, as the relay wrote it."""
    shelf = paths.taken_parent / f"{SHELF_PREFIX}{uuid.uuid4().hex}"
    shelf.mkdir(mode=0o700, parents=True)
    (shelf / LOCK_NAME).touch(mode=0o600)
    held = shelf / f"{envelope['id']}.json"
    held.write_text(json.dumps({**envelope, "reply_connection": "alpha"}), encoding="utf-8")
    os.chmod(held, 0o600)
    return shelf


def _mark_without_via(paths: InboxPaths, envelope_id: str) -> None:
    """A start mark keeping a reply as versions before 621dfa7 wrote it, both transports alike: no ``via``."""
    mark = paths.started / f"{envelope_id}.json"
    reply = {**rp.make_reply(envelope_id, reply="kept", now=time.time()), "reply_connection": "alpha"}
    mark.write_text(json.dumps({"id": envelope_id, "at": int(time.time()), "reply": reply}), encoding="utf-8")
    os.chmod(mark, 0o600)


@pytest.mark.parametrize("bad", ["a shelf that cannot be read", "a symlink in place of the envelope",
                                 "a directory in place of the envelope"])
def test_an_unreadable_taken_entry_decides_only_for_its_own_envelopes_start_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logs: LogCapture, bad: str
) -> None:
    """Regression (review): a start mark without ``via`` is the file relay's while its envelope is on a file-relay
    shelf, else Redis's (which writes it while its sender waits for it). A shelf that could not be looked into (its
    mode) made every such mark the file relay's, so one bad shelf kept the previous Redis transport's owed replies
    from being written at all; and an entry of the envelope's name the relay refuses to read (a symlink, a
    directory) counted as a held envelope, though no file relay ever answers from it (it quarantines it). Now only
    an envelope the relay's reader takes, named by the mark's id, makes its mark the file relay's; what cannot be
    read is named in a WARNING and decides nothing."""
    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    held = seed_envelope(target_connection="mini", target_profile="bob")  # readable, on a shelf: the file relay's
    _shelved(paths, held)
    unrelated = uuid.uuid4().hex  # on no shelf
    for envelope_id in (held["id"], unrelated):
        _mark_without_via(paths, envelope_id)
    bad_one = seed_envelope(target_connection="mini", target_profile="bob")
    shelf = _shelved(paths, bad_one)
    _mark_without_via(paths, bad_one["id"])
    entry = shelf / f"{bad_one['id']}.json"
    if bad == "a shelf that cannot be read":
        os.chmod(shelf, 0)
        if os.geteuid() == 0:  # root reads it all the same: fail its open as any other user's would fail
            real_open = os.open

            def refusing_open(path: Any, *args: Any, **kwargs: Any) -> int:
                if path == shelf.name or Path(os.fspath(path)) == shelf:
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
                return real_open(path, *args, **kwargs)

            monkeypatch.setattr(os, "open", refusing_open)
    elif bad == "a symlink in place of the envelope":
        outside = tmp_path / "outside.json"
        entry.rename(outside)
        entry.symlink_to(outside)
    else:
        entry.unlink()
        entry.mkdir(mode=0o700)
    try:
        vias = {e: kept.via for e in (held["id"], unrelated, bad_one["id"])
                if (kept := kept_reply_of_any(paths, e)) is not None}
    finally:
        os.chmod(shelf, 0o700)
    assert vias == {held["id"]: FILE_RELAY, unrelated: REDIS, bad_one["id"]: REDIS}, vias
    assert logs.matching(f"{bad_one['id']}.json cannot be read in", "bot_relay/taken/"), logs.lines


@pytest.mark.parametrize("swap", ["directory", "entry"])
def test_is_consumed_never_looks_through_a_swapped_consumed_nor_takes_a_symlink_for_a_mark(
    tmp_path: Path, swap: str
) -> None:
    """Regression (left by the swapped task): ``is_consumed`` looked ``consumed/<id>.json`` up by path, following
    symlinks, so a file outside the root — through a ``consumed/`` swapped for a symlink, or a symlink planted at the
    mark's name — made a DM count as reported, and its ``sent/`` record was dropped unreported (its outcome lost).
    Now the mark is looked up through the checked walk and only a regular file is one: refused, not consumed."""
    from hermes_actors.store.relay_inbox import is_consumed

    paths = InboxPaths.from_root(tmp_path / "root").ensure()
    envelope_id = uuid.uuid4().hex
    outside = _outside_with(tmp_path, f"{envelope_id}.json", {"id": envelope_id})
    paths.consumed.mkdir(exist_ok=True, mode=0o700)
    if swap == "directory":
        _swapped_for_symlink(paths.consumed, outside)
    else:
        (paths.consumed / f"{envelope_id}.json").symlink_to(outside / f"{envelope_id}.json")
    assert not is_consumed(paths, envelope_id)
    if swap == "entry":  # a real mark of ours still counts
        (paths.consumed / f"{envelope_id}.json").unlink()
        write_private_json(paths.consumed / f"{envelope_id}.json", {"id": envelope_id})
        assert is_consumed(paths, envelope_id)
