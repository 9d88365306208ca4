"""A ``j-*.log`` journal file swapped for a symlink, another user's file, a FIFO or a directory.

Regression (fuzz review, ``/tmp/journalfuzz/fuzz.py 7 journal symlink|fifo|dir|nobody``): a durable gateway acked
DMs and was killed -9; its journal file was replaced by a symlink to the real file (moved elsewhere), a FIFO or a
directory, or chowned to another user. The next start succeeded with one WARNING (a symlink: "… ignored (remove
it)", whose advice throws away the only link to the records), and every DM journaled in the file was dropped:
never run, no outcome, and ``wait_outcome`` said it "was never acked on this root". Now a file that may hold acked
DMs and cannot be read safely (a symlink, never followed; another user's file, never read) refuses the durable
start naming it and what to do, with nothing changed (``serve``: exit 2), as a swapped ``journal/`` does; what
cannot hold records (a FIFO, a directory) is moved into quarantine, never opened, with a WARNING, and
``wait_outcome``'s ``KeyError`` names it; ``doctor``'s ``journal`` check says the same before any start.
"""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import orjson
import pytest
from roots import LogCapture, RecordingRunner, make_root

from hermes_actors import Gateway
from hermes_actors.errors import HostileFileError
from hermes_actors.ops.doctor import run_doctor
from hermes_actors.ops.doctor_checks import BLOCK, OK, WARN
from hermes_actors.store.journal_adoption import lock_dead_journals, take_over_dead_journals
from hermes_actors.store.journal_records import MAX_JOURNAL_BYTES
from hermes_actors.store.journal_state import JournalState
from hermes_actors.store.relay_inbox import InboxPaths

_ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
_NOBODY = 65534


def _record(delivery_id: str, text: str) -> bytes:
    """An ``accepted`` record: a DM from alice to bob, acked and never started."""
    return orjson.dumps({"t": "accepted", "id": delivery_id, "d": {
        "delivery_id": delivery_id, "sender": "alice", "sender_handle": "alice", "target": "bob",
        "target_handle": "bob", "content": f"Message from 🤖 alice (@alice): {text}", "author": {},
        "hop": 1, "accepted_at": 1.0, "origin": "local", "label": "@bob"}}) + b"\n"


def _dead_journal(directory: Path, delivery_id: str, text: str) -> Path:
    """A killed gateway's journal file in ``directory`` holding one acked DM."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    dead = directory / f"j-{uuid.uuid4().hex}.log"
    dead.write_bytes(_record(delivery_id, text))
    dead.chmod(0o600)
    return dead


def _root_with_journal(tmp_path: Path) -> tuple[Path, InboxPaths]:
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    paths = InboxPaths.from_root(root)
    paths.journal.mkdir(mode=0o700, parents=True)
    return root, paths


def _tree(directory: Path) -> list[tuple[str, int]]:
    """Every entry below ``directory`` (never followed) with its mode: what "nothing changed" compares."""
    found = []
    for top, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = Path(top) / name
            found.append((str(path.relative_to(directory)), os.lstat(path).st_mode))
    return sorted(found)


def _swap(dead: Path, how: str, elsewhere: Path) -> Path:
    """Swap the journal file ``dead`` as the fuzz review did; returns where its records are now."""
    if how == "symlink":
        elsewhere.mkdir(mode=0o700, exist_ok=True)
        moved = elsewhere / dead.name
        dead.rename(moved)
        dead.symlink_to(moved)
        return moved
    os.chown(dead, _NOBODY, _NOBODY)  # another user's
    return dead


@pytest.mark.parametrize(("mode", "uid", "verdict"), [
    (stat.S_IFREG | 0o600, 1000, "adopt"),  # a journal a gateway of ours wrote
    (stat.S_IFREG | 0o000, 1000, "refuse"),  # ours, unreadable: it may hold acked DMs (it was ignored, dropped)
    (stat.S_IFREG | 0o200, 1000, "refuse"),
    (stat.S_IFREG | 0o400, 1000, "adopt"),  # read is all the adoption does (then it unlinks it)
    (stat.S_IFLNK | 0o777, 1000, "refuse"),  # moved elsewhere and linked back: never followed
    (stat.S_IFREG | 0o600, _NOBODY, "refuse"),  # another user's: never read
    (stat.S_IFLNK | 0o777, _NOBODY, "refuse"),
    (stat.S_IFIFO | 0o600, 1000, "set aside"),  # holds no records: quarantined, never opened
    (stat.S_IFDIR | 0o700, 1000, "set aside"),
    (stat.S_IFSOCK | 0o600, 1000, "set aside"),
    (stat.S_IFCHR | 0o600, 1000, "set aside"),
    (stat.S_IFDIR | 0o700, _NOBODY, "set aside"),
])
def test_what_a_durable_start_does_with_each_journal_entry(mode: int, uid: int, verdict: str) -> None:
    from hermes_actors.store.journal_screen import journal_verdict

    assert journal_verdict(mode, uid, 1000) == verdict


def test_root_reads_a_journal_file_of_its_own_whatever_its_mode() -> None:
    from hermes_actors.store.journal_screen import ADOPT, entry_kind, journal_verdict

    assert journal_verdict(stat.S_IFREG | 0o000, 0, 0) == ADOPT
    assert entry_kind(stat.S_IFREG | 0o000, 1000, 1000) == "a journal file of this user that it may not read (mode " \
        "0000)"


@pytest.mark.parametrize(("size", "verdict"), [
    (0, "adopt"), (MAX_JOURNAL_BYTES, "adopt"), (MAX_JOURNAL_BYTES + 1, "refuse"), (4 << 30, "refuse"),
])
def test_a_journal_file_larger_than_any_a_gateway_writes_is_refused(size: int, verdict: str) -> None:
    from hermes_actors.store.journal_screen import entry_kind, journal_verdict

    assert journal_verdict(stat.S_IFREG | 0o600, 1000, 1000, size) == verdict
    kind = entry_kind(stat.S_IFREG | 0o600, 1000, 1000, size)
    assert (kind == "a journal file of this user") == (verdict == "adopt"), kind
    if size == 4 << 30:
        assert kind == "a journal file of this user of 4.0 GiB, larger than any journal a gateway writes (at most " \
            "512 MiB)"


def _oversize(dead: Path) -> None:
    """Extend a journal file past the bound as the review did (`truncate -s 1G`): sparse, nothing written."""
    os.truncate(dead, 1 << 30)


def test_a_huge_journal_file_refuses_a_durable_start_unread_and_outcome_status_and_doctor_name_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (hostile-files review): `truncate -s 1G journal/j-….log` made `outcome <id>` read all of it (6.7 s,
    230 MB RSS), `status` 7.9 s, 4 GB 54 s, and nothing named it as damaged; a durable start read it whole too. Now
    a file larger than any a gateway writes is refused unread (by size, before it is opened): the start names it
    and what to do, with nothing changed; `outcome`, `status` and doctor name it."""
    from hermes_actors.ops.journal_view import find_outcome, read_journals
    from hermes_actors.store import journal_records

    root, paths = _root_with_journal(tmp_path)
    key = uuid.uuid4().hex
    dead = _dead_journal(paths.journal, key, "journaled before the damage")
    _oversize(dead)

    def never(stream: object) -> None:  # not one line of it is read
        raise AssertionError("the oversize journal file was read")

    monkeypatch.setattr(journal_records, "read_lines", never)
    for module in ("hermes_actors.ops.journal_index", "hermes_actors.ops.journal_view",
                   "hermes_actors.store.journal_adoption"):
        monkeypatch.setattr(f"{module}.read_lines", never)
    named = f"journal file {dead} is a journal file of this user of 1.0 GiB, larger than any journal a gateway " \
        "writes (at most 512 MiB), never read"
    before = _tree(paths.relay.base)
    with pytest.raises(HostileFileError) as info:
        Gateway(root, runner=RecordingRunner()).start()
    assert str(info.value).startswith(f"{named}: look at it"), info.value
    assert str(info.value).endswith("; nothing was changed"), info.value
    assert _tree(paths.relay.base) == before
    assert named in find_outcome(root, key)["error"]
    assert any(named in problem for problem in read_journals(root)[1])
    check = {c.name: c for c in run_doctor(root, cli=sys.executable, ping=lambda r: None)}["journal"]
    assert check.level == BLOCK and named in check.detail, check
    assert f"truncate -s <its size up to that line> {dead}" in check.fix, check
    monkeypatch.undo()
    os.truncate(dead, len(_record(key, "journaled before the damage")))  # cut back as the fix says: its DM runs
    second = RecordingRunner()
    with Gateway(root, runner=second) as again:
        assert again.wait_outcome(key, timeout=30)["reply"] == "ok: journaled before the damage"
    assert [turn.delivery_id for turn in second.entered] == [key]


@pytest.mark.parametrize("how", ["symlink", pytest.param("another user's", marks=_ROOT_ONLY)])
def test_a_swapped_journal_file_refuses_a_durable_start_and_its_dms_run_once_it_is_put_right(
    tmp_path: Path, how: str
) -> None:
    """The start is refused naming the file and the fix, with nothing changed (the relay's directories neither
    made nor put back, the records where they were); the look-up names the file; done as the text says, the DM
    runs once."""
    root, paths = _root_with_journal(tmp_path)
    key = uuid.uuid4().hex
    dead = _dead_journal(paths.journal, key, "journaled before the kill")
    records = _swap(dead, how, tmp_path / "elsewhere")
    before, data = _tree(paths.relay.base), records.read_bytes()
    first = RecordingRunner()
    gw = Gateway(root, runner=first)
    with pytest.raises(HostileFileError) as info:
        gw.start()
    text = str(info.value)
    if how == "symlink":
        assert text.startswith(f"journal file {dead} is a symlink (to {records}), never followed: replace the link "
                               f"with the real file (rm {dead} && mv {records} {dead}), or move it out of journal/ "
                               "to give its DMs up (they never run)"), text
    else:
        assert text.startswith(f"journal file {dead} is a file of another user (uid {_NOBODY}), never read: chown "
                               f"it to this user (as root: chown {os.getuid()} {dead}), or move it out of journal/ to "
                               "give its DMs up (they never run)"), text
    assert f"The gateway cannot start on {root} in durable mode" in text, text
    assert text.endswith("; nothing was changed"), text
    assert first.entered == [] and records.read_bytes() == data
    assert _tree(paths.relay.base) == before  # nothing quarantined, made or put back
    with pytest.raises(KeyError) as unknown:  # not started: the root's files answer, naming the file
        gw.wait_outcome(key, timeout=0)
    assert f"journal file {dead} is " in str(unknown.value), unknown.value
    if how == "symlink":  # what the text says to do
        subprocess.run(["/bin/sh", "-c", f"rm {shlex.quote(str(dead))} && mv {shlex.quote(str(records))} "
                        f"{shlex.quote(str(dead))}"], check=True)
    else:
        os.chown(dead, os.getuid(), os.getgid())
    second = RecordingRunner()
    with Gateway(root, runner=second) as again:
        assert again.wait_outcome(key, timeout=30)["reply"] == "ok: journaled before the kill"
    assert [turn.delivery_id for turn in second.entered] == [key]


def test_serve_on_a_root_whose_journal_file_is_a_symlink_exits_2_naming_it(tmp_path: Path) -> None:
    """``serve`` served on, with one WARNING, and ran none of the file's DMs: it exits 2 now, with the fix."""
    root, paths = _root_with_journal(tmp_path)
    dead = _dead_journal(paths.journal, uuid.uuid4().hex, "journaled before the kill")
    records = _swap(dead, "symlink", tmp_path / "elsewhere")
    done = subprocess.run(
        [sys.executable, "-c", "from hermes_actors.cli.main import main; raise SystemExit(main())",
         "serve", "--root", str(root), "--runner", "demo"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)  # a deadline: it served before
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert f"error: journal file {dead} is a symlink (to {records}), never followed: replace the link with the " \
           "real file" in done.stderr, done.stderr
    assert dead.is_symlink()


@pytest.mark.parametrize("how", ["fifo", "directory"])
def test_a_journal_file_swapped_for_what_holds_no_records_is_quarantined_unopened_and_named_by_wait_outcome(
    tmp_path: Path, logs: LogCapture, how: str
) -> None:
    """A FIFO (never opened: it must not block) or a directory in place of a journal file is moved into
    quarantine with one WARNING, the other journals are adopted, and ``wait_outcome`` of a DM the swapped file
    held names it (it said "never acked on this root"); doctor then warns about the quarantined entry."""
    root, paths = _root_with_journal(tmp_path)
    kept, lost = uuid.uuid4().hex, uuid.uuid4().hex
    _dead_journal(paths.journal, kept, "in a journal left whole")
    swapped = _dead_journal(paths.journal, lost, "in the journal swapped")
    swapped.unlink()
    if how == "fifo":
        os.mkfifo(swapped, 0o600)
    else:
        swapped.mkdir(mode=0o700)
    runner = RecordingRunner()
    with Gateway(root, runner=runner) as gw:
        assert gw.wait_outcome(kept, timeout=30)["reply"] == "ok: in a journal left whole"
        assert not os.path.lexists(swapped)
        [aside] = paths.relay.quarantine.glob(f"{swapped.name}.*.quarantined")
        mode = os.lstat(aside).st_mode
        assert stat.S_ISFIFO(mode) if how == "fifo" else stat.S_ISDIR(mode)
        said = logs.matching("quarantined", str(swapped), "holds no journal records")
        assert len(said) == 1, logs.lines
        with pytest.raises(KeyError) as unknown:
            gw.wait_outcome(lost, timeout=0)
        text = str(unknown.value)
        assert "it was never acked on this root" in text  # still one of the reasons, no longer the only one
        assert f"or it is journaled in a journal file that was not read: {swapped} was a " \
               f"{'FIFO' if how == 'fifo' else 'directory'} at this gateway's start, which holds no journal " \
               f"records (moved to {aside}): DMs journaled in a file it took the place of cannot be re-offered" \
               in text, text
    assert [turn.delivery_id for turn in runner.entered] == [kept]
    check = {c.name: c for c in run_doctor(root, cli=sys.executable, ping=lambda r: None)}["journal"]
    assert check.level == WARN and f"{aside} (a {'FIFO' if how == 'fifo' else 'directory'}) was moved into " \
        "quarantine by a start" in check.detail, check
    assert f"rm -r {aside}" in check.fix, check


def test_an_in_memory_gateway_leaves_a_symlinked_journal_file_alone_and_its_keyerror_names_it(
    tmp_path: Path
) -> None:
    """In memory the journal is not used (the start is not refused, nothing is moved), but ``wait_outcome`` of an
    id it never issued reads the root's journals: the file it refused to follow is named, not left out."""
    root, paths = _root_with_journal(tmp_path)
    key = uuid.uuid4().hex
    dead = _dead_journal(paths.journal, key, "journaled before the kill")
    records = _swap(dead, "symlink", tmp_path / "elsewhere")
    with Gateway(root, runner=RecordingRunner(), durable=False) as gw, pytest.raises(KeyError) as unknown:
        gw.wait_outcome(key, timeout=0)
    assert f"or it is journaled in a journal file that was not read: journal file {dead} is a symlink (to " \
           f"{records}), never followed" in str(unknown.value), unknown.value
    assert dead.is_symlink() and Path(os.readlink(dead)) == records


@pytest.mark.parametrize("how", ["symlink", "fifo"])
def test_an_entry_swapped_in_after_the_starts_screen_is_refused_or_skipped_by_its_adoption(
    tmp_path: Path, logs: LogCapture, how: str
) -> None:
    """The adoption judges each file by the same rule (a file swapped in between the screen and the lock): a
    symlink refuses the start there too; a FIFO is skipped with a WARNING (never opened), left for the next start."""
    directory = tmp_path / "journal"
    dead = _dead_journal(directory, uuid.uuid4().hex, "journaled before the kill")
    if how == "symlink":
        _swap(dead, "symlink", tmp_path / "elsewhere")
        with pytest.raises(HostileFileError, match="never followed"):
            lock_dead_journals(directory, directory / "j-ours.log")
        return
    dead.unlink()
    os.mkfifo(dead, 0o600)
    held = lock_dead_journals(directory, directory / "j-ours.log")
    held.release()
    assert held.folded.states == {} and stat.S_ISFIFO(os.lstat(dead).st_mode)
    assert logs.matching(f"journal file {dead} is a FIFO, which holds no journal records; ignored (the next start "
                         "moves it into quarantine)"), logs.lines


@pytest.mark.parametrize("how", ["symlink", pytest.param("another user's", marks=_ROOT_ONLY), "fifo", "none"])
def test_doctor_blocks_on_a_journal_file_a_start_refuses_and_warns_on_one_it_moves_aside(
    tmp_path: Path, how: str
) -> None:
    root, paths = _root_with_journal(tmp_path)
    dead = _dead_journal(paths.journal, uuid.uuid4().hex, "journaled before the kill")
    if how == "fifo":
        dead.unlink()
        os.mkfifo(dead, 0o600)
    elif how != "none":
        _swap(dead, how, tmp_path / "elsewhere")
    check = {c.name: c for c in run_doctor(root, cli=sys.executable, ping=lambda r: None)}["journal"]
    if how == "none":
        assert check.level == OK and check.detail == "1 journal file(s), each a regular file of this user", check
    elif how == "fifo":
        assert check.level == WARN and check.detail.startswith(
            f"journal file {dead} is a FIFO, which holds no journal records (the next start moves it into "
            "quarantine)"), check
        assert stat.S_ISFIFO(os.lstat(dead).st_mode)  # doctor changes nothing
    else:
        assert check.level == BLOCK and f"journal file {dead} is a " in check.detail, check
        assert "a durable start (serve, Gateway) refuses the root until it is put right" in check.detail, check
        assert check.fix.endswith("or move it out of journal/ to give its DMs up (they never run)"), check
        assert (f"rm {dead} && mv " if how == "symlink" else f"chown {os.getuid()} {dead}") in check.fix, check


def test_the_journal_check_is_a_pure_function_of_the_entries() -> None:
    from hermes_actors.ops.doctor_checks import check_journal
    from hermes_actors.store.journal_screen import ADOPT, REFUSE, SET_ASIDE, JournalEntry

    link = JournalEntry(Path("/r/bot_relay/journal/j-a.log"), "a symlink", REFUSE, "/x/j-a.log")
    fifo = JournalEntry(Path("/r/bot_relay/journal/j-b.log"), "a FIFO", SET_ASIDE)
    aside = JournalEntry(Path("/r/bot_relay/quarantine/j-c.log.1.ab.quarantined"), "a directory", SET_ASIDE)
    ours = JournalEntry(Path("/r/bot_relay/journal/j-d.log"), "a journal file of this user", ADOPT)
    assert check_journal([ours], [], 1000).level == OK
    assert check_journal([ours, link, fifo], [aside], 1000).level == BLOCK  # what refuses the start first
    assert check_journal([fifo], [], 1000).level == WARN
    warned = check_journal([ours], [aside], 1000)
    assert warned.level == WARN and warned.fix.endswith(f"rm -r {aside.path}"), warned


# ── follow-ups (review of the screen): mode 000, the quarantine race, what the texts claim ─────────────────────


def _mode_000_start_and_doctor(root: Path, key: str) -> dict[str, object]:
    """As the root's owner: a durable start, then doctor's journal check, then the look-up of ``key``."""
    try:
        with Gateway(root, runner=RecordingRunner()):
            started = "started"
    except HostileFileError as exc:
        started = str(exc)
    check = {c.name: c for c in run_doctor(root, cli=sys.executable, ping=lambda r: None)}["journal"]
    from hermes_actors.ops.journal_view import find_outcome

    return {"start": started, "level": check.level, "detail": check.detail, "fix": check.fix,
            "lookup": find_outcome(root, key)["error"]}


@_ROOT_ONLY
def test_a_journal_file_of_ours_we_may_not_read_refuses_the_durable_start_and_doctor_blocks_on_it() -> None:
    """Regression (review of the screen, as nobody): a journal file of ours with mode 000 passed doctor (``[ok]
    journal``), and the start went on with a WARNING ``cannot be opened (Permission denied); ignored``: its acked DM
    never ran. It may hold acked DMs and cannot be read, as another user's file: the start is refused, naming it
    and ``chmod 600``, with nothing changed; doctor blocks on it."""
    import shutil
    import tempfile

    from test_access_errors import call_as_nobody

    base = Path(tempfile.mkdtemp(prefix="hermes-actors-mode000-"))
    try:
        base.chmod(0o755)
        root, paths = _root_with_journal(base)
        key = uuid.uuid4().hex
        dead = _dead_journal(paths.journal, key, "journaled before the kill")
        for path in [root, *root.rglob("*")]:
            os.chown(path, _NOBODY, _NOBODY, follow_symlinks=False)
        dead.chmod(0)
        before = _tree(paths.relay.base)
        said, out, err = call_as_nobody(lambda: _mode_000_start_and_doctor(root, key))
        assert isinstance(said, dict), (said, out, err)
        assert said["start"] == (
            f"journal file {dead} is a journal file of this user that it may not read (mode 0000), never read: let "
            f"this user read and write it (chmod 600 {dead}), or move it out of journal/ to give its DMs up (they "
            f"never run). The gateway cannot start on {root} in durable mode while a journal file that may hold acked "
            "DMs cannot be read safely; it is never followed, read nor moved aside; once it is put right, the next "
            "start re-offers the DMs journaled in it; nothing was changed"), said
        assert _tree(paths.relay.base) == before
        assert said["level"] == BLOCK and f"journal file {dead} is a journal file of this user that it may not read" \
            in said["detail"], said
        assert said["fix"].startswith(f"let this user read and write it (chmod 600 {dead})"), said
        assert f"or it is journaled in a journal file that was not read: journal file {dead} is a journal file of " \
            "this user that it may not read (mode 0000), never read" in said["lookup"], said
        dead.chmod(0o600)  # what the text says to do: the DM runs
        ran, out, err = call_as_nobody(lambda: _mode_000_start_and_doctor(root, key))
        assert isinstance(ran, dict) and ran["start"] == "started" and ran["level"] == OK, (ran, out, err)
        assert not dead.exists()  # adopted
    finally:
        shutil.rmtree(base)


def test_a_journal_file_of_ours_whose_open_is_refused_refuses_a_start_as_the_screen_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its mode lets us read it, yet the open says ``EACCES`` (an ACL): the start is refused naming it, as the screen
    refuses one of mode 000 (it was ignored with a WARNING, its DMs dropped); a running gateway's rescan skips it."""
    import errno

    from hermes_actors.store import journal_adoption

    directory = tmp_path / "journal"
    dead = _dead_journal(directory, uuid.uuid4().hex, "journaled before the kill")
    real_open = os.open

    def refused(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if Path(str(path)) == dead:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(journal_adoption.os, "open", refused)
    with pytest.raises(HostileFileError) as info:
        lock_dead_journals(directory, directory / "j-ours.log")
    assert str(info.value).startswith(f"journal file {dead} is a journal file of this user that it may not open "
                                      f"(Permission denied), never read: let this user read and write it (chmod 600 "
                                      f"{dead})"), info.value
    running = lock_dead_journals(directory, directory / "j-ours.log", unchanged={})
    running.release()
    assert running.folded.states == {}


def test_the_quarantine_of_a_fifo_put_back_as_the_real_journal_file_leaves_that_file_and_its_dm_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logs: LogCapture
) -> None:
    """Regression (review of the screen, a race forced by a hook): a FIFO at ``j-X.log`` passed the screen as
    "set aside"; the real journal file was put back at that name before the rename, which moved it (by name) into
    quarantine: its DM never ran, and the WARNING said it "was a FIFO". Only the entry judged is moved now: the
    real file is put back, judged afresh (adopted), and its DM runs; nothing is quarantined."""
    from hermes_actors.store import relay_quarantine

    root, paths = _root_with_journal(tmp_path)
    key = uuid.uuid4().hex
    real = _dead_journal(tmp_path / "elsewhere", key, "journaled before the kill")
    name = paths.journal / real.name
    os.mkfifo(name, 0o600)
    ensure = relay_quarantine.ensure_private_dir

    def put_back_first(directory: Path, **kwargs: Path | None) -> None:  # after the screen's lstat, before the rename
        if stat.S_ISFIFO(os.lstat(name).st_mode):
            name.unlink()
            real.rename(name)
        ensure(directory, **kwargs)

    monkeypatch.setattr(relay_quarantine, "ensure_private_dir", put_back_first)
    runner = RecordingRunner()
    with Gateway(root, runner=runner) as gw:
        assert gw.wait_outcome(key, timeout=30)["reply"] == "ok: journaled before the kill"
    assert [turn.delivery_id for turn in runner.entered] == [key]
    assert list(paths.relay.quarantine.glob("j-*")) == []
    assert not logs.matching("quarantined", str(name)), logs.lines


def test_an_entry_that_is_not_the_one_judged_is_put_back_never_over_what_is_there_now(tmp_path: Path) -> None:
    """The rule under the quarantine of a screened entry: the entry moved is looked at in quarantine; not the one
    judged, it goes back (a link: never over an entry put at its name meanwhile, which the caller judges)."""
    from hermes_actors.store.relay_quarantine import quarantine_into

    journal = tmp_path / "journal"
    journal.mkdir()
    fifo = journal / "j-a.log"
    os.mkfifo(fifo)
    judged = os.lstat(fifo)
    fifo.unlink()
    fifo.write_bytes(b"records\n")  # the real file, put back since it was judged (maybe with the FIFO's inode)
    assert quarantine_into(tmp_path / "quarantine", fifo, "test", within=tmp_path,
                           identity=(judged.st_dev, judged.st_ino, stat.S_IFIFO)) is None
    assert fifo.read_bytes() == b"records\n" and list((tmp_path / "quarantine").iterdir()) == []
    now = os.lstat(fifo)
    moved = quarantine_into(tmp_path / "quarantine", fifo, "test", within=tmp_path,
                            identity=(now.st_dev, now.st_ino, stat.S_IFREG))
    assert moved is not None and moved.read_bytes() == b"records\n" and not fifo.exists()


def test_doctor_names_a_journal_file_a_start_moved_into_quarantine(tmp_path: Path) -> None:
    """Regression: doctor left out a regular file in quarantine that came from journal/ (one moved there in the
    race above, or adopted with unreadable lines): the DMs in it are not re-offered, and it said ``[ok] journal``."""
    root, paths = _root_with_journal(tmp_path)
    paths.relay.quarantine.mkdir(mode=0o700, exist_ok=True)
    aside = paths.relay.quarantine / f"j-{uuid.uuid4().hex}.log.1.ab.quarantined"
    aside.write_bytes(_record(uuid.uuid4().hex, "journaled before the kill"))
    check = {c.name: c for c in run_doctor(root, cli=sys.executable, ping=lambda r: None)}["journal"]
    assert check.level == WARN and check.detail == (
        f"{aside} is a journal file a start moved into quarantine (adopted with unreadable lines, or moved in a race): "
        "DMs journaled in it that no journal in journal/ holds are not re-offered"), check
    assert check.fix.endswith(f"then remove it: rm {aside}"), check


def test_a_refusal_found_after_the_start_changed_something_does_not_say_nothing_was_changed(tmp_path: Path) -> None:
    """Regression (review of the screen, a symlink swapped in after the pre-check): the screen's and the adoption's
    refusals said "nothing was changed" after the start had made directories or quarantined a FIFO."""
    from hermes_actors.store.journal_screen import screen_journal_files

    directory = tmp_path / "journal"
    dead = _dead_journal(directory, uuid.uuid4().hex, "journaled before the kill")
    _swap(dead, "symlink", tmp_path / "elsewhere")
    with pytest.raises(HostileFileError) as adoption:
        lock_dead_journals(directory, directory / "j-ours.log")
    with pytest.raises(HostileFileError) as screen:
        screen_journal_files(directory, within=None)
    for refused in (adoption, screen):
        text = str(refused.value)
        assert text.endswith("once it is put right, the next start re-offers the DMs journaled in it"), text


def test_the_outcome_of_a_dm_behind_a_symlinked_journal_file_says_it_may_be_there_and_what_to_do(
    tmp_path: Path
) -> None:
    """Regression: ``hermes-actors outcome`` said "no journal or relay file of this root knows it" as a fact, with
    no fix, of a DM journaled in a symlinked file."""
    from hermes_actors.ops.journal_view import find_outcome

    root, paths = _root_with_journal(tmp_path)
    key = uuid.uuid4().hex
    dead = _dead_journal(paths.journal, key, "journaled before the kill")
    records = _swap(dead, "symlink", tmp_path / "elsewhere")
    found = find_outcome(root, key)
    assert found["status"] == "unknown"
    assert found["error"].startswith("no journal or relay file of this root that was read knows it"), found
    assert found["error"].endswith(
        f"; or it is journaled in a journal file that was not read: journal file {dead} is a symlink (to {records}), "
        f"never followed: put that file right as hermes-actors doctor --root {root} says (its journal check), then "
        "ask again"), found


def test_an_adopted_journal_is_never_removed_through_a_journal_directory_swapped_meanwhile(
    tmp_path: Path, logs: LogCapture
) -> None:
    """Regression (hostile review of removals): an adopted journal file was removed by path once its records were
    copied, so through a ``journal/`` swapped for a symlink meanwhile the file of that name outside the root went.
    Now it stays where it is (said, as one that cannot be removed) and nothing outside is removed."""
    root, paths = _root_with_journal(tmp_path)
    dead = _dead_journal(paths.journal, uuid.uuid4().hex, "journaled before the kill")
    outside = tmp_path / "outside"
    outside.mkdir()
    precious = outside / dead.name
    precious.write_bytes(b"outside")
    held = lock_dead_journals(paths.journal, paths.journal / "j-ours.log", within=root)
    try:
        paths.journal.rename(paths.journal.with_name("journal.aside"))
        paths.journal.symlink_to(outside, target_is_directory=True)
        take_over_dead_journals(held, JournalState(), lambda lines: None, keep=100, within=root)
    finally:
        held.release()
    assert precious.read_bytes() == b"outside"
    assert logs.matching("could not remove adopted journal", f"{paths.journal} is a symlink"), logs.lines
