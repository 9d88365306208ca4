"""A start puts back every directory of ``bot_relay/`` swapped for a symlink or a file, by the rescan's rule.

Regression (CLI fuzz review, ``journal_swapped.sh``): ``bot_relay/journal`` (or ``run/``) a file or a symlink made
``send`` and ``serve`` fail with exit 2 and no fix named (``…/bot_relay/journal is a symlink or not a directory;
refusing to use it``, ``refusing …/bot_relay/run: it is a symlink``), after the start had made the 14 other relay
directories; a swapped ``rooms/`` made every room call raise until a user put it right by hand. Now the start moves
the entry into ``quarantine/`` as it is (never followed: what a symlink points at is never read, written or moved),
makes the directory again with the WARNING the others get, and what it cannot put back refuses it before anything
is moved or made.
"""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

import orjson
import pytest
from roots import LogCapture, RecordingRunner, make_root, start_gateway

from hermes_actors import Gateway
from hermes_actors.cli.main import main
from hermes_actors.demo.bots import create_demo_root
from hermes_actors.errors import HostileFileError
from hermes_actors.hermes.submit_client import ping
from hermes_actors.ops.doctor import run_doctor
from hermes_actors.ops.doctor_checks import BLOCK, OK, Check
from hermes_actors.relay.strays import (
    FOREIGN,
    MISSING,
    OURS,
    SWAPPED,
    kept_directories,
    refused_at_start,
    start_directories,
)
from hermes_actors.store.relay_inbox import InboxPaths


@pytest.mark.parametrize(("found", "put_back", "refused"), [
    (MISSING, False, False),  # the start makes it (or its user does)
    (MISSING, True, False),
    (OURS, False, False),
    (OURS, True, False),
    (SWAPPED, True, False),  # moved into quarantine/ as it is, made again
    (SWAPPED, False, True),  # bot_relay/ itself, hubclaims/: the user's, the hub's
    (FOREIGN, True, True),  # another user's directory is never ours to move
    (FOREIGN, False, True),
])
def test_what_a_start_refuses(found: str, put_back: bool, refused: bool) -> None:
    assert refused_at_start(found, put_back) is refused


def _swap(directory: Path, how: str, outside: Path) -> None:
    """Put a symlink to ``outside`` (a directory holding a file of the user's) or a file in place of ``directory``."""
    if how == "symlink":
        outside.mkdir(mode=0o700)
        (outside / "theirs.txt").write_text("not ours", encoding="utf-8")
        directory.symlink_to(outside, target_is_directory=True)
    else:
        directory.write_text("planted", encoding="utf-8")


@pytest.mark.parametrize("which", ["run", "rooms", "unconfirmed"])
@pytest.mark.parametrize("how", ["symlink", "file"])
def test_a_start_puts_back_a_directory_its_user_makes_left_swapped_for_a_symlink_or_a_file(
    tmp_path: Path, gateways: list[Gateway], logs: LogCapture, which: str, how: str
) -> None:
    """The host's ``run/``, ``rooms/`` and Redis's ``unconfirmed/``: quarantined as they are, made again (0700),
    and the DM, the room and the submit endpoint work."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    paths = InboxPaths.from_root(root)
    paths.relay.base.mkdir(mode=0o700)
    directory = paths.relay.base / which
    outside = tmp_path / "outside"
    _swap(directory, how, outside)
    gw = start_gateway(gateways, root, serve_submit=True)
    found = os.lstat(directory)
    assert stat.S_ISDIR(found.st_mode) and stat.S_IMODE(found.st_mode) == 0o700
    [aside] = paths.relay.quarantine.glob(f"{which}.*.quarantined")
    if how == "symlink":  # moved as is, never followed: what it points at is untouched
        assert aside.is_symlink() and Path(os.readlink(aside)) == outside
        assert [(p.name, p.read_text(encoding="utf-8")) for p in outside.iterdir()] == [("theirs.txt", "not ours")]
    else:
        assert aside.read_text(encoding="utf-8") == "planted"
    assert len(logs.matching("quarantined", str(directory), "replaced by a symlink or a file")) == 1, logs.lines
    ack = gw.message_agent(sender="alice", target="bob", message="still here?")
    assert gw.wait_outcome(ack["delivery_id"], timeout=30)["reply"] == "ok: still here?"
    assert gw.create_room("plan", ["alice", "bob"])["name"] == "plan"
    assert ping(root) is not None


def test_every_directory_a_running_gateway_has_made_in_bot_relay_is_put_back_by_a_start_or_is_the_hubs(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """One rule for every directory of ``bot_relay/``: a new one must join :func:`kept_directories` (the rescan's
    and the start's) or :func:`start_directories` (the start's), or be named here with why it is neither."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    paths = InboxPaths.from_root(root)
    gw = start_gateway(gateways, root, serve_submit=True)
    gw.create_room("plan", ["alice", "bob"])
    ack = gw.message_agent(sender="alice", target="bob", message="hi")
    gw.wait_outcome(ack["delivery_id"], timeout=30)
    made = {entry.name for entry in paths.relay.base.iterdir() if entry.is_dir()}
    ruled = {d.name for d in (*kept_directories(paths), *start_directories(paths)) if d.parent == paths.relay.base}
    # the hub's, and the journal (it may hold acked DMs): a swapped one refuses the start (below)
    assert made - ruled == {"hubclaims", "journal"}, made - ruled


def _dead_journal(directory: Path, delivery_id: str) -> Path:
    """A killed gateway's journal file in ``directory``: one DM from alice to bob, acked and never started."""
    record = {"t": "accepted", "id": delivery_id, "d": {
        "delivery_id": delivery_id, "sender": "alice", "sender_handle": "alice", "target": "bob",
        "target_handle": "bob", "content": "Message from 🤖 alice (@alice): journaled elsewhere", "author": {},
        "hop": 1, "accepted_at": 1.0, "origin": "local", "label": "@bob"}}
    dead = directory / f"j-{uuid.uuid4().hex}.log"
    dead.write_bytes(orjson.dumps(record) + b"\n")
    dead.chmod(0o600)
    return dead


@pytest.mark.parametrize("how", ["symlink", "file"])
def test_a_swapped_journal_refuses_a_durable_start_and_its_dms_run_once_it_is_a_directory_again(
    tmp_path: Path, how: str
) -> None:
    """Regression (review diffrev27 of fb79f9a): a journal moved to another disk and linked back was moved aside
    by the start, unread, and an empty one made: its acked DMs never ran (``wait_outcome``: KeyError), with one
    WARNING under ``serve`` and nothing at all for an embedding. Now the durable start refuses it before
    anything is moved or made, naming it and how to put the journal files back; done so, the DM runs."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    paths = InboxPaths.from_root(root)
    paths.relay.base.mkdir(mode=0o700)
    journal = paths.journal
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    key = uuid.uuid4().hex
    dead = _dead_journal(elsewhere, key)
    before = dead.read_bytes()
    if how == "symlink":
        journal.symlink_to(elsewhere, target_is_directory=True)
    else:
        journal.write_text("planted", encoding="utf-8")
    listed = sorted(os.listdir(paths.relay.base))
    first = RecordingRunner()
    with pytest.raises(HostileFileError) as info:
        Gateway(root, runner=first).start()
    text = str(info.value)
    assert text.startswith(f"{journal} is a symlink or not a directory"), text
    assert f"The gateway cannot start on {root} in durable mode: make the delivery journal a real directory of this " \
        "user again" in text, text
    assert "replace the link with a real directory holding its j-*.log files" in text, text
    assert text.endswith("; nothing was changed"), text
    assert first.entered == [] and dead.read_bytes() == before
    assert sorted(os.listdir(paths.relay.base)) == listed  # nothing quarantined, nothing made
    assert journal.is_symlink() if how == "symlink" else journal.is_file()
    with Gateway(root, runner=RecordingRunner(), durable=False):  # in memory the journal is not used: left alone
        pass
    assert journal.is_symlink() if how == "symlink" else journal.is_file()
    journal.unlink()  # what the text says to do
    journal.mkdir(mode=0o700)
    dead.rename(journal / dead.name)
    second = RecordingRunner()
    with Gateway(root, runner=second) as gw:
        assert gw.wait_outcome(key, timeout=30)["reply"] == "ok: journaled elsewhere"
    assert [turn.delivery_id for turn in second.entered] == [key]


@pytest.mark.parametrize("refused", [
    "hubclaims",  # the hub's: never put back by a gateway
    pytest.param("journal", marks=pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")),
])
def test_a_start_refuses_what_it_cannot_put_back_before_anything_is_moved_or_made(
    tmp_path: Path, refused: str
) -> None:
    """Before, the start put back and made the other relay directories, then refused: the refusal comes first now,
    naming the directory and what to do, with ``bot_relay/`` as it was (a swapped ``delivered/`` still there)."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    paths = InboxPaths.from_root(root)
    paths.relay.base.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    paths.delivered.symlink_to(elsewhere, target_is_directory=True)  # one the start would put back
    directory = paths.relay.base / refused
    if refused == "hubclaims":
        directory.symlink_to(elsewhere, target_is_directory=True)
        why = "is a symlink or not a directory"
    else:
        directory.mkdir(mode=0o700)
        os.chown(directory, 65534, 65534)
        why = "is owned by uid 65534"
    before = sorted(os.listdir(paths.relay.base))
    gw = Gateway(root, runner=RecordingRunner())
    with pytest.raises(HostileFileError) as info:
        gw.start()
    assert sorted(os.listdir(paths.relay.base)) == before and paths.delivered.is_symlink()
    assert not paths.relay.tmp.exists() and list(elsewhere.iterdir()) == []
    assert str(info.value).startswith(f"{directory} {why}"), info.value
    assert (f"The relay cannot start on {root}: make it a real directory of this user again" if refused == "hubclaims"
            else f"The gateway cannot start on {root} in durable mode: make the delivery journal a real directory of "
                 "this user again (another user's: chown it;") in str(info.value)
    assert str(info.value).endswith("; nothing was changed"), info.value


@pytest.mark.parametrize("how", ["symlink", "file"])
def test_send_on_a_root_whose_run_directory_is_swapped_runs_the_dm_and_puts_it_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    """``send`` refused a symlinked ``run/`` (exit 2, ``refusing …/bot_relay/run: it is a symlink``) and left a
    file there (exit 0): no host serves through either, so it is no host, and the send's start puts it back."""
    root = create_demo_root(tmp_path / "root")
    paths = InboxPaths.from_root(root)
    paths.relay.base.mkdir(mode=0o700, exist_ok=True)
    run = paths.relay.base / "run"
    _swap(run, how, tmp_path / "outside")
    code = main(["send", "--root", str(root), "--from", "hermes", "scout", "hi", "--runner", "demo"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.splitlines()[1].startswith("Reply from @scout: ")
    assert run.is_dir() and not run.is_symlink()
    assert len(list(paths.relay.quarantine.glob("run.*.quarantined"))) == 1



@pytest.mark.parametrize("swapped", ["journal", "bot_relay"])
def test_doctor_blocks_on_what_a_durable_start_refuses_with_the_starts_own_words(tmp_path: Path, swapped: str) -> None:
    """Regression (closing note of 2026-12-07, "doctor ok on swapped journal"): with ``bot_relay/journal`` (or
    ``bot_relay/`` itself) swapped for a symlink, ``doctor`` said the relay directories were fine while ``serve``
    refused to start (exit 2). The "relay directories" check now blocks with the very refusal the start gives
    (one rule: ``start_refusal``), and changes nothing; once put right it is ok again."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    paths = InboxPaths.from_root(root)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if swapped == "journal":
        paths.relay.base.mkdir(mode=0o700)
        victim = paths.journal
    else:
        victim = paths.relay.base
    victim.symlink_to(elsewhere, target_is_directory=True)

    def relay_check() -> Check:
        return {c.name: c for c in run_doctor(root, cli="/nonexistent/hermes", ping=lambda r: None)}[
            "relay directories"]

    check = relay_check()
    with pytest.raises(HostileFileError) as info:
        Gateway(root, runner=RecordingRunner()).start()
    assert check.level == BLOCK, check
    assert check.detail == str(info.value), (check.detail, str(info.value))
    assert str(victim) in check.detail and "cannot start" in check.detail
    assert "refuses to start" in check.fix, check.fix
    assert victim.is_symlink() and os.listdir(elsewhere) == []  # the doctor only looks
    victim.unlink()
    victim.mkdir(mode=0o700)
    assert relay_check().level == OK
