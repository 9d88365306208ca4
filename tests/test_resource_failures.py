"""Out of file descriptors (or memory) is a transient failure, never evidence of a swapped or removed file.

Regression (review: ``serve --http`` under ``ulimit -n 200`` with its descriptors exhausted by idle
connections): while EMFILE lasted the relay rescan said ``bot_relay`` "cannot be used ... move the file or
symlink aside", the journal's check of its path took the journal for lost (so the stop cancelled the acked
queued DMs instead of keeping them, though the journal was intact), and the roster reloaded to the default
profile alone (DMs to the others refused "No teammate named ..."). One rule now
(:func:`hermes_actors.store.os_errors.resource_failure`): such an error is said as what ran out, and what
was known is kept.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from roots import LogCapture, RecordingRunner, held_on, make_root, start_gateway, write_profile

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.errors import StoreError
from hermes_actors.store import journal_file
from hermes_actors.store.journal import Journal
from hermes_actors.store.journal_records import fold_records, parse_lines
from hermes_actors.store.os_errors import resource_failure, store_error
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.store.yaml_file import warned_while_failing

EMFILE_TEXT = os.strerror(errno.EMFILE)


def _emfile(path: object = None) -> OSError:
    return OSError(errno.EMFILE, EMFILE_TEXT, None if path is None else str(path))


def _id(n: int) -> str:
    return f"{n:032x}"


class _Shortage:
    """A switch: while on, every walk of the journal's path from the root fails with EMFILE (the descriptor of
    its first step cannot be opened), as it does in a process out of file descriptors."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on = threading.Event()
        self.hits = 0
        self.left: int | None = None  # how many walks fail before it ends on its own (None: until cleared)
        real = journal_file.open_dir_below

        def open_dir_below(anchor: Path, directory: Path | str, *, create: bool = False) -> int:
            if self.on.is_set():
                self.hits += 1
                if self.left is not None:
                    self.left -= 1
                    if self.left <= 0:
                        self.on.clear()
                raise _emfile(anchor)
            return real(anchor, directory, create=create)

        monkeypatch.setattr(journal_file, "open_dir_below", open_dir_below)


@pytest.fixture
def shortage(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Shortage]:
    yield _Shortage(monkeypatch)


# ── the rule ────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(("exc", "said"), [
    (OSError(errno.EMFILE, "Too many open files"), "out of file descriptors"),
    (OSError(errno.ENFILE, "Too many open files in system"), "out of file descriptors"),
    (OSError(errno.ENOMEM, "Cannot allocate memory"), "out of memory"),
    (OSError(errno.ENOBUFS, "No buffer space available"), "out of buffer space"),
    (InterruptedError(errno.EINTR, "Interrupted system call"), "interrupted by a signal"),
    (store_error("write", Path("/r/x.json"), OSError(errno.EMFILE, "Too many open files")), "out of file descriptors"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory"), None),
    (PermissionError(errno.EACCES, "Permission denied"), None),
    (OSError(errno.ELOOP, "Too many levels of symbolic links"), None),
    (OSError(errno.ENOTDIR, "Not a directory"), None),
    (OSError(errno.EIO, "Input/output error"), None),
    (OSError("no errno"), None),
    (ValueError("not an OS error"), None),
], ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v))
def test_resource_failure_says_what_ran_out_only_for_errors_that_say_nothing_about_the_path(
    exc: BaseException, said: str | None
) -> None:
    assert resource_failure(exc) == said


def test_a_step_failing_out_of_file_descriptors_is_said_once_by_what_ran_out_whatever_file_it_failed_on() -> None:
    with LogCapture("WARNING") as logs:
        for path in ("/r/bot_relay", "/r/bot_relay/inbox", "/r"):
            with warned_while_failing("emfile test step", (OSError,), "relay: the rescan of /r/bot_relay failed",
                                      "check that the directory belongs to you"):
                raise _emfile(path)
        with warned_while_failing("emfile test step", (OSError,), "x", ""):
            pass  # worked: forgotten
    assert len(logs.lines) == 1, logs.lines
    line = logs.lines[0]
    assert "out of file descriptors" in line and "(EMFILE)" in line and "open-files limit" in line, line
    assert "belongs to you" not in line and "/r/bot_relay/inbox" not in line, line


# ── the journal ─────────────────────────────────────────────────────────────


def test_a_journal_whose_path_cannot_be_checked_out_of_descriptors_is_kept_not_taken_for_lost(
    tmp_path: Path, shortage: _Shortage
) -> None:
    directory = tmp_path / "bot_relay" / "journal"
    journal = Journal(directory, within=tmp_path)
    journal.start()
    name = journal.path.name
    with LogCapture("DEBUG") as logs:
        try:
            journal.append_durably({"t": "accepted", "id": _id(1), "d": {"delivery_id": _id(1)}})
            shortage.on.set()
            # acceptances go on being taken (not refused "no longer reachable"), each commit's check failing
            for n in (2, 3):
                journal.append_durably({"t": "accepted", "id": _id(n), "d": {"delivery_id": _id(n)}})
            assert shortage.hits >= 2, "every check walked the path (and failed)"
        finally:
            journal.stop()  # checks once more, still out of descriptors
        shortage.on.clear()
    lost = [line for line in logs.lines if "no longer reachable" in line or "unreachable at stop" in line]
    assert lost == [], lost
    said = logs.matching("could not be checked at its path", "(EMFILE)")
    assert len(said) == 1, logs.lines
    assert "open-files limit" in said[0] and "taken as still there while the gateway runs" in said[0], said
    states = fold_records([r for r in parse_lines((directory / name).read_bytes().splitlines()) if r]).states
    assert set(states) == {_id(1), _id(2), _id(3)}, "every acceptance is in the file at the journal's path"


def test_a_journal_check_that_works_again_ends_the_spell(tmp_path: Path, shortage: _Shortage) -> None:
    journal = Journal(tmp_path / "bot_relay" / "journal", within=tmp_path)
    journal.start()
    with LogCapture("INFO") as logs:
        try:
            shortage.on.set()
            journal.append_durably({"t": "accepted", "id": _id(1), "d": {"delivery_id": _id(1)}})
            shortage.on.clear()
            assert journal.keeps()
        finally:
            journal.stop()
    assert len(logs.matching("can be checked at its path again (1 failed check(s) before)")) == 1, logs.lines


def test_queued_dms_are_kept_at_a_stop_whose_check_works_again_within_its_retries_and_rerun_by_the_next_start(
    tmp_path: Path, shortage: _Shortage
) -> None:
    """Regression (review): the stop found the journal "no longer reachable" and cancelled the acked queued DMs;
    the journal was intact and the next start replayed it. The stop tries a check that cannot be made again."""
    root = make_root(tmp_path)
    release = threading.Event()
    first = RecordingRunner(held_on("blocker", release))
    told: list[dict[str, Any]] = []
    lock = threading.Lock()

    def collect(outcome: dict[str, Any]) -> None:
        with lock:
            told.append(outcome)
        if outcome["status"] == "ambiguous":
            release.set()

    gw = Gateway(root, runner=first, durable=True)
    gw.subscribe(collect)
    gw.start()
    with LogCapture("WARNING") as logs:
        try:
            blocker = gw.message_agent(sender="alice", target="bob", message="blocker")["delivery_id"]
            first.wait_entered(1)
            queued = [gw.message_agent(sender="alice", target="bob", message=f"queued {n}")["delivery_id"]
                      for n in range(3)]
            shortage.left = 2  # the first two walks fail, the next works
            shortage.on.set()
            gw.stop(timeout=0.3)
            shortage.on.clear()
        finally:
            release.set()
    assert shortage.hits == 2, "the stop checked the journal's path, and tried again"
    assert not logs.matching("no longer reachable") and not logs.matching("unreachable at stop"), logs.lines
    assert not logs.matching("could not be checked at its path at stop"), logs.lines

    def ids() -> Counter[str]:
        with lock:
            return Counter(o["delivery_id"] for o in told)

    await_condition(lambda: ids()[blocker] == 1, timeout=10, message="the blocked turn's outcome notified")
    assert all(ids()[key] == 0 for key in queued), f"a queued journaled DM is kept, not cancelled, at stop: {told}"
    second = RecordingRunner()
    again = Gateway(root, runner=second, durable=True).start()
    try:
        assert again.recovered.get("reoffered", 0) == 3, again.recovered
        assert [again.wait_outcome(key, timeout=10)["status"] for key in queued] == ["replied"] * 3
    finally:
        again.stop()


def test_a_stop_whose_check_of_the_journal_cannot_be_made_cancels_the_queued_dms_and_tells_their_senders(
    tmp_path: Path, shortage: _Shortage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (review): ``bot_relay/journal/`` really moved aside while the process was out of descriptors:
    the stop kept the queued DMs in a file no start reads, and their senders were never told."""
    monkeypatch.setattr(Journal, "stop_check_seconds", 0.2)
    root = make_root(tmp_path)
    release = threading.Event()
    first = RecordingRunner(held_on("blocker", release))
    told: list[dict[str, Any]] = []
    lock = threading.Lock()

    def collect(outcome: dict[str, Any]) -> None:
        with lock:
            told.append(outcome)

    gw = Gateway(root, runner=first, durable=True)
    gw.subscribe(collect)
    gw.start()
    with LogCapture("WARNING") as logs:
        try:
            gw.message_agent(sender="alice", target="bob", message="blocker")
            first.wait_entered(1)
            queued = [gw.message_agent(sender="alice", target="bob", message=f"queued {n}")["delivery_id"]
                      for n in range(3)]
            journal = root / "bot_relay" / "journal"
            os.rename(journal, root / "bot_relay" / "journal.moved")  # an operator, a clean-up script
            shortage.on.set()  # ... while the check cannot be made: it never could at this stop
            gw.stop(timeout=0.3)
        finally:
            shortage.on.clear()
            release.set()
    assert shortage.hits >= 2, "the stop tried the check again"

    def statuses() -> dict[str, str]:
        with lock:
            return {o["delivery_id"]: f"{o['status']}/{o['reason']}" for o in told if o["delivery_id"] in queued}

    await_condition(lambda: len(statuses()) == 3, timeout=10, message="every queued DM's sender told")
    assert set(statuses().values()) == {"failed/cancelled"}, told
    said = logs.matching("could not be checked at its path at stop", "(EMFILE)")
    assert len(said) == 1, logs.lines
    assert "open-files limit" in said[0] and "settled cancelled and their senders told" in said[0], said


def test_a_journal_check_that_cannot_be_made_at_stop_is_tried_again_then_not_kept(
    tmp_path: Path, shortage: _Shortage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Journal, "stop_check_seconds", 0.2)
    journal = Journal(tmp_path / "bot_relay" / "journal", within=tmp_path)
    journal.start()
    try:
        shortage.left = 2
        shortage.on.set()
        assert journal.keeps(), "a check that works again within the stop's tries keeps the journal"
        assert shortage.hits == 2
        shortage.left = None
        shortage.on.set()
        with LogCapture("ERROR") as logs:
            assert not journal.keeps(), "a check still not made at stop: nothing tells a start would find it"
        assert shortage.hits > 3, "it was tried again"
        assert len(logs.matching("could not be checked at its path at stop (tried for 0.2s)")) == 1, logs.lines
    finally:
        shortage.on.clear()
        journal.stop()


@pytest.mark.parametrize(("seconds", "pauses"), [
    (0.0, ()),
    (-1.0, ()),
    (0.03, (0.03,)),
    (0.2, (0.05, 0.1, 0.05)),
    (2.0, (0.05, 0.1, 0.2, 0.4, 0.5, 0.5, 0.25)),
])
def test_the_pauses_between_tries_of_a_check_double_up_to_a_bound_within_the_time_given(
    seconds: float, pauses: tuple[float, ...]
) -> None:
    from hermes_actors.store.journal import check_pauses

    assert check_pauses(seconds) == pytest.approx(pauses)


# ── the relay rescan ────────────────────────────────────────────────────────


def test_a_relay_rescan_out_of_descriptors_says_so_once_and_never_asks_to_move_bot_relay(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (review): ``ERROR relay: .../bot_relay cannot be used ... move the file or symlink aside`` while
    nothing was swapped."""
    from actors import Rescan
    from hermes_actors.relay import strays

    root = make_root(tmp_path)
    paths = InboxPaths.from_root(root)
    gw = start_gateway(gateways, root, RecordingRunner(), connection_id="mini", durable=False,
                       config={"bot_mode": {"rescan_seconds": 3600}})  # the rescans are asked for here
    assert gw._system is not None and gw._system.relay is not None
    relay = gw._system.relay
    real = strays.swapped_below
    steps = iter([root, paths.relay.base, paths.inbox, root])

    def swapped_below(anchor: Path, directory: Path) -> bool:
        raise _emfile(next(steps, root))  # whichever step the walk failed at

    with LogCapture("INFO") as logs:
        monkeypatch.setattr(strays, "swapped_below", swapped_below)
        for _ in range(3):
            relay.ask(Rescan("manual"), timeout=30)
        monkeypatch.setattr(strays, "swapped_below", real)
        relay.ask(Rescan("manual"), timeout=30)
    assert not logs.matching("cannot be used") and not logs.matching("move the file or symlink aside"), logs.lines
    said = logs.matching("out of file descriptors")
    assert len(said) == 1, logs.lines
    assert "EMFILE" in said[0] and "open-files limit" in said[0], said
    assert not logs.matching("is a usable directory again"), logs.lines
    assert paths.relay.base.is_dir() and not any(paths.relay.quarantine.iterdir()), "nothing was moved aside"


def test_the_clean_up_out_of_descriptors_raises_before_it_moves_or_marks_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hermes_actors.relay import strays

    paths = InboxPaths.from_root(tmp_path / "root").ensure()

    def swapped_below(anchor: Path, directory: Path) -> bool:
        raise _emfile(anchor)

    monkeypatch.setattr(strays, "swapped_below", swapped_below)
    unfixable: set[Path] = set()
    with LogCapture("INFO") as logs, pytest.raises(OSError) as raised:
        strays.quarantine_strays(paths, unfixable=unfixable)
    assert raised.value.errno == errno.EMFILE
    assert unfixable == set(), "bot_relay/ is not marked unusable"
    assert logs.lines == [], logs.lines


# ── the roster ──────────────────────────────────────────────────────────────


@pytest.mark.parametrize("fails", ["listing profiles/", "reading profile.yaml"])
def test_a_roster_reload_out_of_descriptors_keeps_the_last_good_roster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: str
) -> None:
    """Regression (review): the roster reloaded to the default profile alone while files could not be opened."""
    from actors import Scheduler, ask
    from hermes_actors.local.roster import RosterActor
    from hermes_actors.messages import GetSnapshot, Reload, RosterSnapshot

    root = make_root(tmp_path)
    short = threading.Event()
    real_open, real_iterdir = os.open, Path.iterdir

    def fake_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if short.is_set() and fails == "reading profile.yaml" and str(path).endswith("profile.yaml"):
            raise _emfile(path)
        return real_open(path, flags, *args, **kwargs)

    def fake_iterdir(self: Path) -> Iterator[Path]:
        if short.is_set() and fails == "listing profiles/" and self == root / "profiles":
            raise _emfile(self)
        return real_iterdir(self)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(Path, "iterdir", fake_iterdir)
    with Scheduler() as scheduler, LogCapture("WARNING") as logs:
        roster = RosterActor.start(root, overrides=None, scheduler=scheduler, rescan_seconds=0)
        try:
            before = ask(roster, GetSnapshot(), timeout=10, expect=RosterSnapshot)
            assert [p.profile for p in before.profiles] == ["default", "alice", "bob", "carol"]
            short.set()
            for _ in range(2):
                assert ask(roster, Reload(), timeout=10) == before
            assert ask(roster, GetSnapshot(), timeout=10, expect=RosterSnapshot) == before
            short.clear()
            after = ask(roster, Reload(), timeout=10, expect=RosterSnapshot)
            assert [p.profile for p in after.profiles] == ["default", "alice", "bob", "carol"]
            assert all(p.managed for p in after.profiles[1:])
        finally:
            short.clear()
            roster.stop()
    said = logs.matching("roster reload of", "out of file descriptors", "stays in effect (4 profiles)")
    assert len(said) == 1, logs.lines
    assert not logs.matching("only the default profile is used") and not logs.matching("ignoring it"), logs.lines


def test_reading_a_config_file_out_of_descriptors_raises_instead_of_reading_it_as_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hermes_actors.store.yaml_file import read_yaml_mapping

    config = tmp_path / "config.yaml"
    config.write_text("bot_mode:\n  turn_wait_seconds: 5\n", encoding="utf-8")
    real_open = os.open

    def fake_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path) == str(config):
            raise _emfile(path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)
    with pytest.raises(OSError) as raised:
        read_yaml_mapping(config)
    assert raised.value.errno == errno.EMFILE
    monkeypatch.setattr(os, "open", real_open)
    assert read_yaml_mapping(config) == ({"bot_mode": {"turn_wait_seconds": 5}}, None)


def test_a_store_error_out_of_descriptors_says_what_to_do() -> None:
    err = store_error("write", Path("/r/bot_relay/gateways/1.json"), _emfile())
    assert isinstance(err, StoreError)
    assert str(err).startswith("cannot write /r/bot_relay/gateways/1.json: Too many open files (EMFILE); raise "
                               "the process's open-files limit"), err


# ── the relay hub ───────────────────────────────────────────────────────────


def test_a_hub_roster_push_out_of_descriptors_says_so_once_and_the_hub_pushes_again_at_its_next_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (review): one EMFILE reading a profile while the hub published its rosters ended the HubActor;
    ``hermes-actors relay`` ran on, logging nothing and relaying nothing."""
    import json

    from actors import Scheduler
    from hermes_actors.messages import RosterPush
    from hermes_actors.relay import hub as hub_module
    from hermes_actors.relay.hub import HubActor, HubRoot

    alpha, mini = make_root(tmp_path, {"alice": {}}, name="alpha"), make_root(tmp_path, {"moxie": {}}, name="mini")
    short = threading.Event()
    real = hub_module.discover_profiles

    def discover_profiles(root: Path) -> Any:
        if short.is_set():
            raise _emfile(Path(root) / "profiles" / "alice" / "profile.yaml")
        return real(root)

    def listed(root: Path) -> set[str]:
        path = root / "bot_relay" / "roster.json"
        return {row["profile"] for row in json.loads(path.read_text(encoding="utf-8"))["agents"]}

    monkeypatch.setattr(hub_module, "discover_profiles", discover_profiles)
    roots = [HubRoot.make("alpha", alpha), HubRoot.make("mini", mini)]
    with Scheduler() as scheduler, LogCapture("WARNING") as logs:
        hub = HubActor.start(roots, scheduler=scheduler, roster_seconds=3600)  # the pushes are asked for here
        try:
            hub.ask(RosterPush(), timeout=30)
            assert listed(mini) == {"default", "alice"}
            short.set()
            for _ in range(2):
                hub.ask(RosterPush(), timeout=30)  # raised (and ended the hub) without the fix
            short.clear()
            assert hub.is_alive(), "the hub lives on"
            assert listed(mini) == {"default", "alice"}, "the roster pushed before stays"
            write_profile(alpha / "profiles" / "zed", managed=True)
            hub.ask(RosterPush(), timeout=30)
            assert listed(mini) == {"default", "alice", "zed"}, "the next push reads the profiles again"
        finally:
            hub.stop()
    said = logs.matching("roster push to", "failed", "out of file descriptors")
    assert len(said) == 2, logs.lines  # one per root, once while it lasts
    assert all("(EMFILE)" in line and "open-files limit" in line for line in said), said


# ── status, the live page and the CLI ───────────────────────────────────────


def test_the_live_status_out_of_descriptors_says_what_ran_out_and_goes_on(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``/status``, the live page and ``/metrics`` read: it raised (a traceback in the request's thread)."""
    from hermes_actors.ops import status as status_module

    root = make_root(tmp_path)
    gw = start_gateway(gateways, root, RecordingRunner(), durable=False)

    def discover_profiles(root: Path) -> Any:
        raise _emfile(Path(root) / "profiles")

    monkeypatch.setattr(status_module, "discover_profiles", discover_profiles)
    status = status_module.live_status(gw)
    assert status["running"] is True and status["managed"] is None
    assert {row["managed"] for row in status["profiles"]} == {None}, status["profiles"]
    said = [line for line in status["problems"] if "out of file descriptors" in line]
    assert len(said) == 1 and "open-files limit" in said[0], status["problems"]


def test_a_cli_command_out_of_descriptors_says_so_in_one_line_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hermes_actors.cli.main import main
    from hermes_actors.ops import status as status_module

    root = make_root(tmp_path)

    def discover_profiles(root: Path) -> Any:
        raise _emfile(Path(root) / "profiles")

    monkeypatch.setattr(status_module, "discover_profiles", discover_profiles)
    assert main(["status", "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("error: ") and "Too many open files" in err and "open-files limit" in err, err
