"""Hostile names and ids are refused before any path is built; private modes; roster injection; foreign uids.

Every refusal test snapshots the whole tmp tree before and after: nothing is
created anywhere (in the root or beside it) for a refused name.
"""

from __future__ import annotations

import json
import os
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from relay_helpers import remote_row, seed_envelope, write_roster_file
from roots import RecordingRunner, make_root, start_gateway

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.cli.main import main as cli_main
from hermes_actors.core.names import HANDLE_RE
from hermes_actors.errors import ValidationError
from hermes_actors.local.dm_files import dm_file_path, write_dm_file
from hermes_actors.local.live_handoff import LiveMailbox
from hermes_actors.store import relay_files as rf
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.relay_inbox import InboxPaths, post_to_inbox, take_from_inbox
from hermes_actors.store.relay_roster import normalize_roster_row
from hermes_actors.store.turnlock import turn_lock_path
from hermes_actors.tool import message_agent_tool

IS_ROOT = os.geteuid() == 0
HOSTILE_NAMES = [
    "../x", "../../etc/passwd", "/etc/passwd", "/tmp/x", "a\x00b", "\x00", "a" * 65, "..", ".", "bob/../alice",
    "~root", "bob\\..\\alice", "a/b/c", "nobody\n", "x" * 10_000,
]
HOSTILE_IDS = [
    "../x", "../../etc/passwd", "/etc/passwd", "a\x00b", "0" * 31, "0" * 33, "A" * 32, "g" * 32, "0" * 32 + "\n",
    "0" * 16 + "/" + "0" * 15, "", "0" * 32 + ".json", " " + "0" * 31,
]
# A sentinel outside the root: a traversal of "../x" or "/tmp/x" would land beside it.
WATCHED_ABSOLUTE = [Path("/tmp/x"), Path("/x"), Path("/etc/x")]


def tree(base: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``base`` with its (mode, size); transient relay temp/heartbeat files excluded."""
    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(base))
            if "/bot_relay/tmp/" in f"/{rel}" or "/bot_relay/gateways/" in f"/{rel}":
                continue
            st = os.lstat(path)
            out[rel] = (st.st_mode, st.st_size if stat.S_ISREG(st.st_mode) and not rel.endswith(".lock") else 0)
    return out


def _start(gateways: list[Gateway], root: Path, runner: Any = None, **kwargs: Any) -> Gateway:
    return start_gateway(gateways, root, runner, connection_id="alpha", **kwargs)


def _assert_refused(answer: dict[str, Any]) -> None:
    assert "delivery_id" not in answer and answer.get("status") != "queued", answer
    assert isinstance(answer.get("error"), str) and answer["error"], answer
    assert isinstance(answer.get("reason"), str) and answer["reason"], answer


def _assert_only_the_marker_runs(gw: Gateway, rec: RecordingRunner) -> None:
    """A valid DM sent after refused ones runs, and is the only turn: nothing refused ran before it."""
    marker = gw.message_agent(sender="alice", target="bob", message="the marker")
    assert gw.wait_outcome(marker["delivery_id"], timeout=10)["status"] == "replied"
    assert [(t.delivery_id, t.profile) for t in rec.entered] == [(marker["delivery_id"], "bob")]


# ── the Gateway API ─────────────────────────────────────────────────────────


def test_an_empty_root_is_refused_and_nothing_is_created_in_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for empty in ("", "   "):
        with pytest.raises(ValueError, match="Hermes root is empty"):
            Gateway(empty, runner=RecordingRunner())
    with pytest.raises(SystemExit) as exited:
        cli_main(["roster", "--root", ""])
    assert exited.value.code == 2
    assert list(tmp_path.iterdir()) == [], "an empty root must not become the current directory"


class _StrIsBob:
    """Not text, though its str() is a teammate's name (it was delivered to bob, as Path("bob") was)."""

    def __str__(self) -> str:
        return "bob"


# Junk around a name (the friendly name "Bob" slugs to bob), non-text targets and messages, unencodable text.
JUNK_TARGETS: list[Any] = ["bob\x00", "\u202ebob", ["bob"], Path("bob"), _StrIsBob(), 5, "bob\u200b", "<bob>",
                           "\ud800bob", "bob\ud800@mini"]
JUNK_MESSAGES: list[Any] = [5, b"hi", {"text": "hi"}, ["hi"], "\ud800", "hi \udfff there"]


def test_junk_targets_and_non_text_messages_are_refused_and_create_nothing(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    root = make_root(tmp_path, {"alice": {"title": "Researcher"}, "bob": {"title": "Builder", "display_name": "Bob"}},
                     name="alpha")
    write_roster_file(root, [remote_row("moxie", "mini", online=True)])
    rec = RecordingRunner()
    gw = _start(gateways, root, rec)
    before = tree(tmp_path)
    calls = [{"target": t, "message": "hi"} for t in JUNK_TARGETS]
    calls += [{"target": "bob", "message": m} for m in JUNK_MESSAGES]
    for kwargs in calls:
        answer = gw.message_agent(sender="alice", **kwargs)
        _assert_refused(answer)
        if not isinstance(kwargs["target"], str):
            kind = type(kwargs["target"]).__name__
            assert answer["error"] == f"Invalid target: it must be a name (text), not {kind}.", answer
        # The tool's JSON text is valid even for unencodable input (the refusal names it, escaped).
        tool_answer = json.loads(message_agent_tool(gw, sender="alice", **kwargs))
        assert tool_answer == answer
    assert gw.stats()["accepted"] == 0 and gw.stats()["refused"] == 2 * len(calls)
    assert tree(tmp_path) == before, "a refused call created or changed a file"
    _assert_only_the_marker_runs(gw, rec)


def test_hostile_targets_and_senders_are_refused_and_create_nothing(tmp_path: Path, gateways: list[Gateway]) -> None:
    root = make_root(tmp_path, name="alpha")
    write_roster_file(root, [remote_row("moxie", "mini", online=True)])
    rec = RecordingRunner()
    gw = _start(gateways, root, rec)
    absolute_before = {p: p.exists() for p in WATCHED_ABSOLUTE}
    before = tree(tmp_path)
    answers: list[dict[str, Any]] = []
    for name in HOSTILE_NAMES:
        answers.append(gw.message_agent(sender="alice", target=name, message="hi"))
        answers.append(gw.message_agent(sender=name, target="bob", message="hi"))
        answers.append(gw.message_agent(sender="alice", target=f"moxie@{name}", message="hi"))
        answers.append(gw.message_agent(sender="alice", target=f"{name}@mini", message="hi"))
        answers.append(gw.message_agent(sender="alice", target=f"{name}/bob", message="hi"))
    for answer in answers:
        _assert_refused(answer)
    # stats() is an ask to the dispatcher, so every refusal above has been fully handled when it answers.
    assert gw.stats()["accepted"] == 0 and gw.stats()["refused"] == len(answers)
    assert tree(tmp_path) == before, "a refused name created or changed a file"
    assert {p: p.exists() for p in WATCHED_ABSOLUTE} == absolute_before
    _assert_only_the_marker_runs(gw, rec)
    with pytest.raises(KeyError):
        gw.attach_live_owner("../x", lambda turn: "x")
    with pytest.raises(KeyError):
        gw.wait_outcome("../x", timeout=0.1)


def test_a_hostile_live_owner_profile_is_refused(tmp_path: Path, gateways: list[Gateway]) -> None:
    root = make_root(tmp_path)
    gw = _start(gateways, root)
    before = tree(tmp_path)
    for name in HOSTILE_NAMES:
        with pytest.raises(KeyError):
            gw.attach_live_owner(name, lambda turn: "x")
        with pytest.raises(KeyError):
            gw.detach_live_owner(name)
    assert tree(tmp_path) == before


# ── relay ids in file names and bodies ──────────────────────────────────────


@pytest.mark.parametrize("bad", HOSTILE_IDS, ids=repr)
def test_relay_ids_are_validated_before_any_path_is_built(bad: str, tmp_path: Path) -> None:
    root = make_root(tmp_path)
    paths = InboxPaths.from_root(root).ensure()
    before = tree(tmp_path)
    relay = paths.relay
    good = seed_envelope(target_connection="mini", target_profile="moxie")
    calls = [
        lambda: relay.id_file(relay.outbox, bad),
        lambda: rf.read_reply(relay, bad),
        lambda: rf.claim_envelope(relay, bad),
        lambda: rf.write_reply(relay, {"id": bad, "at": 1, "reply": "x", "error": "", "reason": ""}),
        lambda: rp.make_reply(bad, reply="x", now=1.0),
        lambda: rf.enqueue_envelope(relay, {**good, "id": bad}),
        lambda: post_to_inbox(paths, {**good, "id": bad}, "mini"),
        lambda: take_from_inbox(paths, bad),
        lambda: rp.parse_envelope(good, file_id=bad),
    ]
    for call in calls:
        with pytest.raises(ValidationError):
            call()
    assert tree(tmp_path) == before


@pytest.mark.parametrize("field", ["from_profile", "from_handle", "target_connection", "target_profile",
                                   "target_handle"])
@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a\x00b", "a" * 65, "bob\n"], ids=repr)
def test_hostile_names_in_envelope_bodies_are_refused(field: str, bad: str, tmp_path: Path) -> None:
    root = make_root(tmp_path)
    paths = InboxPaths.from_root(root).ensure()
    envelope = {**seed_envelope(target_connection="mini", target_profile="moxie"), field: bad}
    before = tree(tmp_path)
    with pytest.raises(ValidationError):
        rp.parse_envelope(envelope)
    with pytest.raises(ValidationError):
        rf.enqueue_envelope(paths.relay, envelope)
    with pytest.raises(ValidationError):
        post_to_inbox(paths, envelope, "mini")
    with pytest.raises(ValidationError):
        post_to_inbox(paths, seed_envelope(target_connection="mini", target_profile="moxie"), bad)
    assert tree(tmp_path) == before


def test_an_inbox_envelope_naming_a_path_is_quarantined_and_never_runs(tmp_path: Path, gateways: list[Gateway]) -> None:
    root = make_root(tmp_path, name="alpha")
    rec = RecordingRunner()
    paths = InboxPaths.from_root(root)
    _start(gateways, root, rec, config={"bot_mode": {"rescan_seconds": 0.2}})
    outside = tmp_path / "outside"
    outside.mkdir()
    staging = paths.relay.base / "staging-test"
    staging.mkdir(mode=0o700)
    hostile = {**seed_envelope(target_connection="alpha", target_profile="bob", from_profile="moxie"),
               "target_profile": "../../outside/x", "reply_connection": "../../outside"}
    prepared = staging / "prepared"
    prepared.write_text(json.dumps(hostile), encoding="utf-8")
    os.chmod(prepared, 0o600)
    os.rename(prepared, paths.inbox / f"{hostile['id']}.json")
    await_condition(lambda: any((paths.relay.quarantine).glob(f"{hostile['id']}.json.*")), timeout=5,
                    message="the hostile envelope was quarantined")
    good = seed_envelope(target_connection="alpha", target_profile="bob", from_profile="moxie")
    post_to_inbox(paths, good, "mini")
    await_condition((paths.delivered / f"{good['id']}.json").exists, timeout=5, message="a valid one still flows")
    assert [t.delivery_id for t in rec.entered] == [good["id"]]
    assert list(outside.iterdir()) == []


# ── live mailbox, DM files, turn locks ──────────────────────────────────────


@pytest.mark.parametrize("bad", HOSTILE_IDS, ids=repr)
def test_live_mailbox_and_dm_file_ids_are_refused_before_any_path(bad: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    before = tree(tmp_path)
    box = LiveMailbox(home)
    with pytest.raises(ValidationError):
        box.path(bad)
    with pytest.raises(ValidationError):
        box.read(bad)
    with pytest.raises(ValueError):
        dm_file_path(bad, base=tmp_path)
    with pytest.raises(ValueError):
        write_dm_file(bad, "secret", base=tmp_path)
    assert tree(tmp_path) == before


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=repr)
def test_turn_lock_names_stay_inside_the_locks_dir(name: str, tmp_path: Path) -> None:
    path = turn_lock_path(tmp_path, name)
    assert path.parent == tmp_path / "bot_relay" / "locks"
    assert "/" not in path.name and "\x00" not in path.name and not path.name.startswith(".")
    assert len(path.name) <= 64 + len(".lock")


# ── modes ───────────────────────────────────────────────────────────────────


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)  # the usual default: our modes must not depend on the caller's umask
    yield
    os.umask(old)


@pytest.mark.usefixtures("umask_022")
def test_relay_and_journal_files_are_0600_and_dirs_0700(tmp_path: Path, gateways: list[Gateway]) -> None:
    root = make_root(tmp_path, name="alpha")
    write_roster_file(root, [remote_row("moxie", "mini", online=True)])
    gw = _start(gateways, root, config={"bot_mode": {"rescan_seconds": 0.2}}, durable=True)
    paths = InboxPaths.from_root(root)
    for n in range(3):
        ack = gw.message_agent(sender="alice", target="bob", message=f"local {n}")
        assert gw.wait_outcome(ack["delivery_id"], timeout=10)["status"] == "replied"
    relay_ack = gw.message_agent(sender="alice", target="moxie", message="to the relay")
    assert relay_ack["status"] == "queued"
    rf.write_reply(paths.relay, rp.make_reply(relay_ack["delivery_id"], reply="pong", now=time.time()))
    assert gw.wait_outcome(relay_ack["delivery_id"], timeout=10)["reply"] == "pong"
    drained = seed_envelope(target_connection="alpha", target_profile="bob", from_profile="moxie")
    post_to_inbox(paths, drained, "mini")
    await_condition((paths.delivered / f"{drained['id']}.json").exists, timeout=10, message="drained")
    await_condition(lambda: any((paths.consumed).iterdir()), timeout=10, message="consumed marker written")

    checked = {"files": 0, "dirs": 0}
    base = root / "bot_relay"
    for dirpath, dirnames, filenames in os.walk(base):
        for name in dirnames:
            mode = stat.S_IMODE(os.lstat(Path(dirpath) / name).st_mode)
            assert mode == 0o700, f"{Path(dirpath) / name} is {mode:04o}"
            checked["dirs"] += 1
        for name in filenames:
            path = Path(dirpath) / name
            info = os.lstat(path)
            assert stat.S_ISREG(info.st_mode), path
            assert stat.S_IMODE(info.st_mode) == 0o600, f"{path} is {stat.S_IMODE(info.st_mode):04o}"
            checked["files"] += 1
    assert stat.S_IMODE(os.lstat(base).st_mode) == 0o700
    journal_files = list((base / "journal").rglob("*"))
    assert any(p.is_file() for p in journal_files), "the journal wrote files"
    for sub in ("outbox", "claimed", "replies", "delivered", "consumed", "locks", "journal"):
        assert any(True for _ in (base / sub).rglob("*")) or sub in ("outbox", "claimed"), sub
    assert checked["files"] >= 8 and checked["dirs"] >= 10, checked


# ── roster rows ─────────────────────────────────────────────────────────────


def test_roster_rows_cannot_inject_targets_outside_the_handle_grammar(tmp_path: Path, gateways: list[Gateway]) -> None:
    root = make_root(tmp_path, name="alpha")
    hostile_rows: list[Any] = [
        {"profile": "../x", "connection_id": "mini"},
        {"profile": "x", "connection_id": "../mini"},
        {"profile": "x", "handle": "/etc/passwd", "connection_id": "mini"},
        {"profile": "a\x00b", "connection_id": "mini"},
        {"profile": "a" * 65, "connection_id": "mini"},
        {"profile": "x", "handle": "x\ny", "connection_id": "mini"},
        {"profile": "ok", "connection_id": "mini\n"},  # stripped: allowed, as the seed does
        {"profile": ["list"], "connection_id": "mini"},
        "not a row", 42, None,
        remote_row("moxie", "mini", online=True),
    ]
    write_roster_file(root, hostile_rows)
    gw = _start(gateways, root)
    remote = [r for r in gw.roster() if r["connection_id"] is not None]
    assert sorted((r["connection_id"], r["profile"]) for r in remote) == [("mini", "moxie"), ("mini", "ok")]
    for row in remote:
        for key in ("profile", "handle", "connection_id"):
            assert HANDLE_RE.fullmatch(row[key]), row
    before = tree(tmp_path)
    for target in ["../x", "x@../mini", "/etc/passwd", "a\x00b", "a" * 65, "x\ny", "['list']"]:
        _assert_refused(gw.message_agent(sender="alice", target=target, message="hi"))
    assert tree(tmp_path) == before
    assert gw.message_agent(sender="alice", target="moxie", message="hi")["status"] == "queued"
    for row in hostile_rows[:6]:
        assert normalize_roster_row(row) is None, row


# ── foreign uids ────────────────────────────────────────────────────────────


@pytest.mark.skipif(not IS_ROOT, reason="chown to another uid needs root")
def test_a_live_mailbox_dir_of_another_uid_is_refused_and_the_owner_never_runs(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    root = make_root(tmp_path)
    foreign = root / "profiles" / "bob" / "runtime" / "bot_live_delivery"
    foreign.mkdir(parents=True, mode=0o700)
    os.chown(foreign, 65534, 65534)
    owner = RecordingRunner(lambda turn: "owner ran")
    gw = _start(gateways, root)
    gw.attach_live_owner("bob", owner)
    ack = gw.message_agent(sender="alice", target="bob", message="into a foreign mailbox")
    out = gw.wait_outcome(ack["delivery_id"], timeout=10)
    assert out["status"] == "failed" and "NOT delivered" in out["error"], out
    assert owner.entered == []
    assert list(foreign.iterdir()) == [], "nothing was written into the other uid's directory"


@pytest.mark.skipif(not IS_ROOT, reason="chown to another uid needs root")
def test_a_live_mailbox_record_of_another_uid_is_not_trusted(tmp_path: Path) -> None:
    home = tmp_path / "home"
    box = LiveMailbox(home)
    key = uuid.uuid4().hex
    box.admit(key)
    path = box.path(key)
    box.transition(key, "settled", reply="forged")
    os.chown(path, 65534, 65534)
    assert box.read(key) is None, "a record of another uid is never read"
    assert not path.exists() and len(list(box.quarantine.iterdir())) == 1
