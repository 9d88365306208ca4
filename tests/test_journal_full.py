"""A full disk under the journal: an acked DM's outcome is published only once its ``finished`` record is on disk.

Review (a soak with the journal's filesystem full for a few seconds): an outcome whose
``finished`` commit failed was published anyway, and nothing wrote the record again, so the
journal still held the DM as accepted or started. The next start re-offered it (the turn ran
again: ``failed runtime_offline`` first, ``replied`` after the restart) or settled it
``ambiguous``: two outcomes for one acked DM. Now the outcome waits, unpublished, and its
record is written again (a retry timer, or the next commit that lands); a stop makes one last
attempt and leaves what still cannot be written to the next start, which settles it once.

The fault is injected at the OS seam: ``os.pwrite`` on the journal's file only.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from relay_helpers import remote_row, write_roster_file
from roots import LogCapture, RecordingRunner, body_of, held_on, make_root

from actors import ask
from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.core.wake import wake_id
from hermes_actors.errors import StoreError
from hermes_actors.local.wake_hook import SenderWaker
from hermes_actors.messages import CheckOutcome
from hermes_actors.store import relay_files as rf
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.journal import Journal
from hermes_actors.store.journal_records import parse_lines
from hermes_actors.store.relay_inbox import InboxPaths


class DiskFull:
    """The journal's filesystem fills up at the first write of a record holding ``trigger``: from then on every
    write to the journal's file fails with ENOSPC (nothing of it lands) until :meth:`free`; with ``once``, that
    first write only."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, journal: Journal, trigger: bytes, *,
                 once: bool = False) -> None:
        self.fd = journal._file.fd
        self.full = False
        self.armed = True
        self.hits = 0
        real = os.pwrite

        def pwrite(fd: int, data: Any, offset: int) -> int:
            if self.armed and fd == self.fd and (self.full or trigger in bytes(data)):
                self.full = True
                self.hits += 1
                self.armed = not once
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(fd, data, offset)

        monkeypatch.setattr(os, "pwrite", pwrite)

    def free(self) -> None:
        """Space is back: writes land again."""
        self.armed = False


class Refusing:
    """The journal refuses every ``finished`` record outright (``StoreError``, nothing queued), as a stopped or
    closed one does, until :meth:`stop`; every other record is taken."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, journal: Journal) -> None:
        self.on = True
        append, together = journal.append, journal.append_together

        def refuse(records: list[dict[str, Any]]) -> None:
            if self.on and any(record.get("t") == "finished" for record in records):
                raise StoreError(0, "the delivery journal is not running")

        def one(record: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            refuse([record])
            return append(record, *args, **kwargs)

        def many(records: list[dict[str, Any]], *args: Any, **kwargs: Any) -> Any:
            refuse(records)
            return together(records, *args, **kwargs)

        monkeypatch.setattr(journal, "append", one)
        monkeypatch.setattr(journal, "append_together", many)

    def stop(self) -> None:
        """The journal takes records again."""
        self.on = False


class Seen:
    """Every outcome a subscriber is told, thread-safely."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.outcomes: list[dict[str, Any]] = []

    def __call__(self, outcome: dict[str, Any]) -> None:
        with self._lock:
            self.outcomes.append(outcome)

    def of(self, key: str) -> list[str]:
        """The statuses told for ``key``, in order."""
        with self._lock:
            return [o["status"] for o in self.outcomes if o["delivery_id"] == key]


def _start(root: Path, gateways: list[Gateway], runner: RecordingRunner, seen: Seen, **options: Any) -> Gateway:
    gw = Gateway(root, runner=runner, **options)
    gateways.append(gw)
    gw.subscribe(seen)  # before start: a recovered DM's outcome reaches it too
    return gw.start()


WAKE_ON = {"bot_mode": {"wake_sender": True}}  # config: a DM's outcome wakes its sender
RELAYED = {"connection_id": "alpha", "durable": True}  # the Gateway options of a root that relays DMs to moxie


def _relay_root(tmp_path: Path) -> tuple[Path, InboxPaths]:
    """A root (connection ``alpha``, profile alice) whose roster has moxie online on ``mini``: a DM to moxie goes
    through the file relay. Start its gateway with ``_start(..., **RELAYED)``.

    Returns:
        The root and its relay paths.
    """
    root = make_root(tmp_path, {"alice": {}}, name="alpha")
    write_roster_file(root, [remote_row("moxie", "mini", online=True)])
    return root, InboxPaths.from_root(root)


def _lose_journal(root: Path, tmp_path: Path) -> Path:
    """The root's journal directory is replaced by a symlink to another directory: the journal is lost (a start
    finds none of it, and no fresh file can be made there: a stop keeps nothing for the next start).

    Returns:
        The symlink (unlink it before a next start).
    """
    directory = root / "bot_relay" / "journal"
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(directory)
    directory.symlink_to(outside, target_is_directory=True)
    return directory


def _finished(root: Path, key: str) -> int:
    """How many ``finished`` records of ``key`` the root's journal files hold."""
    count = 0
    for path in (root / "bot_relay" / "journal").glob("j-*.log"):
        records = parse_lines(path.read_bytes().splitlines())
        count += sum(1 for r in records if r is not None and r["id"] == key and r["t"] == "finished")
    return count


def _held(gw: Gateway, logs: LogCapture, key: str) -> None:
    """Wait until the Dispatcher handled the failed commit of the outcome of ``key``: it is held back, unpublished.

    Its log line says so (held back: at WARNING, once; before the fix, "published anyway" at ERROR).
    """
    await_condition(lambda: logs.matching("cannot be written", "held back") or logs.matching("could not be journaled"),
                    timeout=15, message="the Dispatcher handled the failed commit of the outcome")
    assert gw._system is not None and gw._system.dispatcher is not None
    assert ask(gw._system.dispatcher, CheckOutcome(key), timeout=10) is None, "held back: not published"
    assert _finished(gw.root, key) == 0


class Held(NamedTuple):
    """A DM whose outcome is held back on a full disk (:func:`_held_on_a_full_disk`,
    :func:`_relayed_held_on_a_full_disk`)."""

    root: Path
    gw: Gateway
    runner: RecordingRunner
    seen: Seen  # subscribed to ``gw`` before its start
    disk: DiskFull  # full from the first record holding its trigger on, until ``disk.free()``
    key: str  # the DM's id


def _held_on_a_full_disk(tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch, logs: LogCapture,
                         trigger: bytes = b'"t":"finished"') -> Held:
    """alice's DM to bob while the journal's disk fills at the first record holding ``trigger``: returns once its
    outcome is held back, unpublished (:func:`_held`, the failed commit said into ``logs``)."""
    root = make_root(tmp_path)
    runner, seen = RecordingRunner(), Seen()
    gw = _start(root, gateways, runner, seen)
    assert gw._journal is not None
    disk = DiskFull(monkeypatch, gw._journal, trigger=trigger)
    key = gw.message_agent(sender="alice", target="bob", message="hello")["delivery_id"]
    _held(gw, logs, key)
    return Held(root, gw, runner, seen, disk, key)


def _relayed_held_on_a_full_disk(tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch,
                                 logs: LogCapture) -> Held:
    """alice's DM to moxie goes through the relay (a root of :func:`_relay_root`) and its reply comes back while the
    journal's disk is full: the outcome's ``finished`` record cannot be written, so the outcome is held back.

    Returns once the Dispatcher handled the failed commit (said at WARNING, into ``logs``) and the outcome is
    checked unpublished.
    """
    root, paths = _relay_root(tmp_path)
    runner, seen = RecordingRunner(), Seen()
    gw = _start(root, gateways, runner, seen, **RELAYED)
    assert gw._journal is not None and gw._system is not None
    disk = DiskFull(monkeypatch, gw._journal, trigger=b'"t":"finished"')
    key = gw.message_agent(sender="alice", target="moxie", message="ping")["delivery_id"]
    rf.write_reply(paths.relay, rp.make_reply(key, reply="pong", now=time.time()))
    await_condition(lambda: disk.hits >= 1, timeout=10, message="the outcome's record hit the full disk")
    await_condition(lambda: logs.matching("cannot be written", "held back"), timeout=10,
                    message="the failed commit handled")
    assert ask(gw._system.dispatcher, CheckOutcome(key), timeout=10) is None, "held back: not published"
    return Held(root, gw, runner, seen, disk, key)


def _sent(root: Path, key: str) -> Path:
    """The relay's record of our envelope ``key`` (what a next start settles the relayed DM from)."""
    paths = InboxPaths.from_root(root)
    return paths.relay.id_file(paths.sent, key)


def test_an_outcome_whose_record_failed_is_published_once_the_record_is_on_disk(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    with LogCapture("INFO") as logs:
        root, gw, runner, seen, disk, key = _held_on_a_full_disk(tmp_path, gateways, monkeypatch, logs)
        assert seen.of(key) == []
        disk.free()  # the retry timer writes it again: then, and only then, it is published
        assert gw.wait_outcome(key, timeout=30)["status"] == "replied"
        await_condition(lambda: logs.matching("is written again"), timeout=10, message="the spell's end is said")
        assert _finished(root, key) == 1
        await_condition(lambda: seen.of(key) == ["replied"], timeout=10, message="the subscriber told once")
        assert len(logs.matching("cannot be written", "held back")) == 1, "the full disk is said once"
        assert not logs.matching("publishing it anyway")
    gw.stop()
    again, seen_again = RecordingRunner(), Seen()
    gw2 = _start(root, gateways, again, seen_again)
    assert not any(gw2.recovered.get(k) for k in ("reoffered", "ambiguous", "redelivered")), gw2.recovered
    assert gw2.wait_outcome(key, timeout=10)["status"] == "replied"
    assert again.entered == [] and seen_again.of(key) == []
    assert Counter(t.delivery_id for t in runner.entered) == {key: 1}


def test_a_stop_before_space_is_back_leaves_it_to_the_next_start_one_outcome_turn_not_rerun(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    with LogCapture("INFO") as logs:
        root, gw, runner, seen, disk, key = _held_on_a_full_disk(tmp_path, gateways, monkeypatch, logs)
        gw.stop()  # one last attempt, which fails: unpublished, named at ERROR
        assert logs.matching("NOT published", key), logs.lines
        assert seen.of(key) == []
        with pytest.raises(TimeoutError):  # the stopped gateway answers from the journal: no outcome yet
            gw.wait_outcome(key, timeout=1)
    disk.free()
    assert _finished(root, key) == 0
    again, seen_again = RecordingRunner(), Seen()
    gw2 = _start(root, gateways, again, seen_again)
    assert gw2.recovered.get("ambiguous") == 1, gw2.recovered
    assert gw2.wait_outcome(key, timeout=10)["status"] == "ambiguous"
    await_condition(lambda: seen_again.of(key) == ["ambiguous"], timeout=10, message="the recovered outcome told")
    assert again.entered == [], "a turn that started is never run again"
    assert Counter(t.delivery_id for t in runner.entered) == {key: 1}
    assert seen.of(key) + seen_again.of(key) == ["ambiguous"], "one outcome overall"


def test_a_turn_whose_start_could_not_be_recorded_is_kept_journaled_by_a_stop_and_run_once_by_the_next_start(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The soak's case: the ``started`` record failed. It used to fail the DM (runtime_offline, NOT delivered) and
    # that outcome's record was held too. Now the turn never ran and is no failure: it is queued again, its
    # profile held; a stop with the disk still full leaves it journaled (accepted), and the next start runs it.
    with LogCapture("INFO") as logs:
        root, gw, runner, seen, disk, key = _held_on_a_full_disk(tmp_path, gateways, monkeypatch, logs,
                                                                 trigger=b'"t":"started"')
        gw.stop()
        assert not logs.matching("NOT published", key), "no outcome was made to withhold"
        assert not logs.matching("NOT delivered"), logs.lines
    disk.free()
    assert runner.entered == [] and seen.of(key) == []
    again, seen_again = RecordingRunner(), Seen()
    gw2 = _start(root, gateways, again, seen_again)
    assert gw2.recovered.get("reoffered") == 1, gw2.recovered  # it never started: offered again, once
    assert gw2.wait_outcome(key, timeout=15)["status"] == "replied"
    await_condition(lambda: seen_again.of(key) == ["replied"], timeout=10, message="the re-offered DM's outcome")
    assert seen.of(key) + seen_again.of(key) == ["replied"], "one outcome overall"
    assert Counter(t.delivery_id for t in again.entered) == {key: 1}


def test_a_dm_held_for_the_journal_still_waits_no_longer_than_turn_wait_seconds_then_target_busy(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Held for the journal, a DM waits in its queue as behind any turn: past turn_wait_seconds it fails
    # target_busy (NOT delivered), never runtime_offline, and never runs later.
    root = make_root(tmp_path)
    runner, seen = RecordingRunner(), Seen()
    gw = _start(root, gateways, runner, seen, config={"bot_mode": {"turn_wait_seconds": 1}})
    assert gw._journal is not None
    disk = DiskFull(monkeypatch, gw._journal, trigger=b'"t":"started"')
    key = gw.message_agent(sender="alice", target="bob", message="hello")["delivery_id"]
    await_condition(lambda: gw.stats()["pending"] == 0, timeout=15, message="its wait ran out (outcome held back)")
    disk.free()
    outcome = gw.wait_outcome(key, timeout=30)
    assert (outcome["status"], outcome["reason"]) == ("failed", "target_busy"), outcome
    assert runner.entered == []


class Queued(NamedTuple):
    """DMs queued at bob as the journal's disk fills at the first ``started`` record (``_queued_on_a_full_disk``)."""

    root: Path
    gw: Gateway
    runner: RecordingRunner
    seen: Seen
    disk: DiskFull
    first: str  # the DM whose turn ran before the disk filled (its outcome may be held)
    keys: list[str]  # the DMs queued behind it, none started


def _queued_on_a_full_disk(tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch,
                           logs: LogCapture, count: int = 4) -> Queued:
    """``count`` DMs acked and queued at bob behind a turn, then the disk fills at the first turn's ``started``
    record: returns once the journal's failure is said and the held turn was tried again (still full)."""
    root = make_root(tmp_path)
    release = threading.Event()
    runner, seen = RecordingRunner(held_on("first", release)), Seen()
    gw = _start(root, gateways, runner, seen)
    assert gw._journal is not None
    first = gw.message_agent(sender="alice", target="bob", message="first")["delivery_id"]
    await_condition(lambda: runner.entered, timeout=10, message="bob's first turn runs")
    keys = [gw.message_agent(sender="alice", target="bob", message=f"m{i}")["delivery_id"] for i in range(count)]
    disk = DiskFull(monkeypatch, gw._journal, trigger=b'"t":"started"')
    release.set()
    await_condition(lambda: logs.matching("cannot be written", "held back"), timeout=15,
                    message="the failed started record is said")
    # the queued turns' started records (and the retry timer's writes) go on failing for a while
    await_condition(lambda: disk.hits >= 4, timeout=15, message="the disk stays full for a few writes")
    return Queued(root, gw, runner, seen, disk, first, keys)


def test_queued_dms_during_a_short_full_disk_run_once_it_has_room_none_failed(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Chaos review (a 24 MB tmpfs filled and freed while DMs flowed): 315 acked DMs queued at their profiles
    # failed runtime_offline "NOT delivered" within 1.2 s of the disk filling, each one's started record failing
    # in turn. Now the first such turn goes back to the head of its queue and the profile starts none until the
    # journal writes again: they all run, in order, once there is room.
    with LogCapture("INFO") as logs:
        _root, gw, runner, seen, disk, first, keys = _queued_on_a_full_disk(tmp_path, gateways, monkeypatch, logs)
        assert [body_of(t.content) for t in runner.entered] == ["first"], "no queued turn ran on the full disk"
        disk.free()
        for key in keys:
            assert gw.wait_outcome(key, timeout=30)["status"] == "replied", key
        assert gw.wait_outcome(first, timeout=30)["status"] == "replied"
        await_condition(lambda: all(seen.of(key) == ["replied"] for key in [first, *keys]), timeout=10,
                        message="each outcome told once")
        assert len(logs.matching("cannot be written", "held back")) == 1, "the full disk is said once"
        assert not logs.matching("NOT delivered"), logs.lines
    assert [body_of(t.content) for t in runner.entered] == ["first", "m0", "m1", "m2", "m3"], "in order, once each"


def test_a_stop_while_turns_are_held_for_the_journal_keeps_them_for_the_next_start_run_once(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The disk stays full through the stop: the held DMs (acked, never started) stay journaled, no outcome in
    # this run; the next start re-offers each and runs it once.
    with LogCapture("INFO") as logs:
        root, gw, runner, seen, disk, first, keys = _queued_on_a_full_disk(tmp_path, gateways, monkeypatch, logs)
        gw.stop(timeout=10)
        assert not logs.matching("NOT delivered"), logs.lines
    disk.free()
    assert all(seen.of(key) == [] for key in keys), "no outcome in the stopped run"
    assert [body_of(t.content) for t in runner.entered] == ["first"]
    again, seen_again = RecordingRunner(), Seen()
    gw2 = _start(root, gateways, again, seen_again)
    assert gw2.recovered.get("reoffered", 0) >= len(keys), gw2.recovered
    for key in keys:
        assert gw2.wait_outcome(key, timeout=30)["status"] == "replied", key
    assert Counter(t.delivery_id for t in again.entered if t.delivery_id in keys) == dict.fromkeys(keys, 1)
    assert first not in {t.delivery_id for t in again.entered}, "the turn that ran is never run again"
    # The first DM's one outcome: replied, or ambiguous when its record was held at the stop. A subscriber of each
    # run hears it at most once, and the same: when its `finished` record landed in the first run but its
    # `delivered` one did not (the disk full by then), the next start publishes it again, identical
    # (reliability.md: once per process).
    status = gw2.wait_outcome(first, timeout=30)["status"]
    assert status in {"replied", "ambiguous"}, status
    await_condition(lambda: seen.of(first) + seen_again.of(first), timeout=10, message="the first DM's outcome told")
    assert set(seen.of(first) + seen_again.of(first)) == {status}, (seen.of(first), seen_again.of(first))
    assert len(seen.of(first)) <= 1 and len(seen_again.of(first)) <= 1, (seen.of(first), seen_again.of(first))


def test_a_relayed_outcome_whose_records_failed_is_written_again_and_only_then_its_relay_record_goes(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The relay's forget path: the outcome of a DM sent through the relay is published once its ``finished``
    # record is on disk, and that record must reach the journal before the relay forgets the envelope. They
    # failed and nothing wrote them again: the journal never had the outcome (``unknown`` after a restart once
    # the relay's files are swept) and the relay kept its record for the next start to publish a second time.
    with LogCapture("INFO") as logs:
        root, gw, _, seen, disk, key = _relayed_held_on_a_full_disk(tmp_path, gateways, monkeypatch, logs)
        sent = _sent(root, key)
        assert sent.exists(), "the relay keeps its record while the journal lacks the outcome"
        disk.free()
        assert gw.wait_outcome(key, timeout=30)["reply"] == "pong"
        await_condition(lambda: not sent.exists(), timeout=30, message="written again, then the record goes")
        assert _finished(root, key) == 1
    # The Notifier tells subscribers after wait_outcome can answer: wait for it, then the stop flushes the rest.
    await_condition(lambda: seen.of(key), timeout=10, message="the subscriber heard of the outcome")
    gw.stop()
    assert seen.of(key) == ["replied"]  # once
    gw2 = _start(root, gateways, RecordingRunner(), Seen())
    assert gw2.wait_outcome(key, timeout=10)["reply"] == "pong", "the journal keeps it past a restart"


def test_a_failed_dispatcher_never_hands_over_an_outcome_held_back_from_the_journal(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Review: a Dispatcher that failed exported its book's held outcomes (their records not on disk) with the
    # published ones, so the failed gateway's wait_outcome answered one (``replied``) and the next start, reading
    # the journal (the DM started, no outcome), settled it ``ambiguous``: two outcomes for one DM.
    root = make_root(tmp_path)
    release = threading.Event()
    runner, seen = RecordingRunner(held_on("poison", release)), Seen()
    settling = SenderWaker.settling

    def failing(self: SenderWaker, key: str, entry: Any) -> None:  # the Dispatcher fails on the poison outcome
        if entry is not None and body_of(entry.delivery.content) == "poison":
            raise RuntimeError("injected")
        settling(self, key, entry)

    monkeypatch.setattr(SenderWaker, "settling", failing)
    failures: list[Any] = []
    gw = Gateway(root, runner=runner, on_failure=failures.append)
    gateways.append(gw)
    gw.subscribe(seen)
    gw.start()
    assert gw._journal is not None
    with LogCapture("INFO") as logs:
        poison = gw.message_agent(sender="carol", target="alice", message="poison")["delivery_id"]
        runner.wait_entered(1)  # its records are on disk: the disk fills only at the next outcome's record
        disk = DiskFull(monkeypatch, gw._journal, trigger=b'"t":"finished"')
        key = gw.message_agent(sender="alice", target="bob", message="hello")["delivery_id"]
        _held(gw, logs, key)
        release.set()  # the poison outcome reaches the Dispatcher: it fails with the outcome of ``key`` held
        await_condition(lambda: failures, timeout=15, message="the Dispatcher failed")
        with pytest.raises(TimeoutError):  # not on disk: never handed over, the journal answers (pending)
            gw.wait_outcome(key, timeout=0)
    gw.stop()
    disk.free()
    assert seen.of(key) == [] and poison
    monkeypatch.setattr(SenderWaker, "settling", settling)
    again, seen_again = RecordingRunner(), Seen()
    gw2 = _start(root, gateways, again, seen_again)
    assert gw2.wait_outcome(key, timeout=10)["status"] == "ambiguous"  # the journal says it started
    await_condition(lambda: seen_again.of(key) == ["ambiguous"], timeout=10, message="the one outcome told")
    assert Counter(t.delivery_id for t in runner.entered + again.entered)[key] == 1


def test_an_outcome_record_the_journal_refuses_outright_is_held_never_published_before_it_is_on_disk(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Review: a journal that refused the ``finished`` record outright (not a failed write: stopped, closed)
    # had the outcome published at once (ERROR 'journal append failed for the outcome of …'), while the journal
    # still held the DM started: the next start settled it ``ambiguous``, a second outcome.
    root = make_root(tmp_path)
    runner, seen = RecordingRunner(), Seen()
    gw = _start(root, gateways, runner, seen)
    assert gw._journal is not None
    Refusing(monkeypatch, gw._journal)
    with LogCapture("INFO") as logs:
        key = gw.message_agent(sender="alice", target="bob", message="hello")["delivery_id"]
        await_condition(lambda: logs.matching("refused the outcome record", key) or logs.matching("append failed"),
                        timeout=15, message="the Dispatcher handled the refusal")
        assert ask(gw._system.dispatcher, CheckOutcome(key), timeout=10) is None, "held back: not published"
        gw.stop()  # the last attempt is refused too: unpublished, named at ERROR with what the next start does
        assert logs.matching("NOT published", key), logs.lines
    assert seen.of(key) == [] and _finished(root, key) == 0
    again, seen_again = RecordingRunner(), Seen()
    gw2 = _start(root, gateways, again, seen_again)
    assert gw2.wait_outcome(key, timeout=10)["status"] == "ambiguous"  # it started: never run again
    await_condition(lambda: seen_again.of(key) == ["ambiguous"], timeout=10, message="the one outcome told")
    assert again.entered == [] and Counter(t.delivery_id for t in runner.entered) == {key: 1}


def test_a_refused_outcome_record_is_written_again_once_the_journal_takes_records_again(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_root(tmp_path)
    runner, seen = RecordingRunner(), Seen()
    gw = _start(root, gateways, runner, seen)
    assert gw._journal is not None
    refusing = Refusing(monkeypatch, gw._journal)
    with LogCapture("INFO") as logs:
        key = gw.message_agent(sender="alice", target="bob", message="hello")["delivery_id"]
        await_condition(lambda: logs.matching("refused the outcome record", key) or logs.matching("append failed"),
                        timeout=15, message="the Dispatcher handled the refusal")
        assert seen.of(key) == []
        refusing.stop()  # the retry timer writes it: then it is published, once
        assert gw.wait_outcome(key, timeout=30)["status"] == "replied"
    await_condition(lambda: seen.of(key) == ["replied"], timeout=10, message="the subscriber told once")
    assert _finished(root, key) == 1


def test_a_lost_journal_on_a_full_disk_at_stop_still_gives_each_acked_dm_exactly_one_outcome(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Review: the journal directory replaced by a symlink (no fresh file can be made: the stop settles the queued
    # DMs ``cancelled`` instead of keeping them) and the disk full at the stop: the cancelled outcomes' records
    # (and the running turn's ambiguous one) failed, so the stop withheld them, "settled by the next start" from a
    # journal no start finds: acked DMs with no outcome at all.
    root = make_root(tmp_path)
    release = threading.Event()
    runner, seen = RecordingRunner(held_on("blocker", release)), Seen()
    gw = _start(root, gateways, runner, seen)
    assert gw._journal is not None
    blocker = gw.message_agent(sender="alice", target="bob", message="blocker")["delivery_id"]
    runner.wait_entered(1)
    queued = [gw.message_agent(sender="alice", target="bob", message=f"queued {n}")["delivery_id"] for n in range(3)]
    directory = _lose_journal(root, tmp_path)
    with LogCapture("INFO") as logs:
        DiskFull(monkeypatch, gw._journal, trigger=b"")  # every write from now on fails
        try:
            gw.stop(timeout=0.3)
        finally:
            release.set()
        statuses = [gw.wait_outcome(key, timeout=5)["status"] for key in [blocker, *queued]]
        assert statuses == ["ambiguous", "failed", "failed", "failed"], statuses
        assert logs.matching("published without", *queued), logs.lines
    acked = [blocker, *queued]
    await_condition(lambda: all(seen.of(key) for key in acked), timeout=10, message="every outcome told")
    assert {key: len(seen.of(key)) for key in acked} == dict.fromkeys(acked, 1), "exactly one outcome each"
    directory.unlink()
    again, seen_again = RecordingRunner(), Seen()
    gw2 = _start(root, gateways, again, seen_again)
    assert not any(gw2.recovered.get(k) for k in ("reoffered", "ambiguous", "redelivered")), gw2.recovered
    assert again.entered == [] and all(seen_again.of(key) == [] for key in acked)


def _woken(runners: list[RecordingRunner], key: str) -> int:
    """How many turns of the wake of DM ``key`` the runners ran."""
    return sum(1 for runner in runners for turn in runner.entered if turn.delivery_id == wake_id(key))


def test_a_dms_delivered_record_never_lands_without_its_wakes_accepted_record(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Review: the wake's ``accepted`` record and its DM's ``delivered`` record were appended one after the other,
    # so a commit could take the first alone; that commit failing (a full disk) while the next one landed left the
    # DM delivered with no wake on disk: a crash then, before the wake ran, lost it for good (the next start sees
    # the outcome delivered and wakes nobody). Now both go in one batch: both land, or neither does and the next
    # start re-publishes the outcome, which wakes the sender then.
    root = make_root(tmp_path)
    runner = RecordingRunner()
    gw = _start(root, gateways, runner, Seen(), config=WAKE_ON)
    journal = gw._journal
    assert journal is not None
    append = journal.append
    disk = DiskFull(monkeypatch, journal, trigger=b'"origin":"wake"', once=True)  # for the wake's record's write

    def append_then_commit(record: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        batch = append(record, *args, **kwargs)
        if record.get("t") == "accepted" and record["d"].get("origin") == "wake":
            batch.done.wait(10)  # a commit takes the open batch right after the wake's record (one schedule)
        return batch

    monkeypatch.setattr(journal, "append", append_then_commit)
    dm = gw.message_agent(sender="alice", target="bob", message="hello")["delivery_id"]
    assert gw.wait_outcome(dm, timeout=10)["status"] == "replied"
    await_condition(lambda: disk.hits, timeout=10, message="the wake's record hit the full disk")
    gw.stop()
    monkeypatch.undo()
    records = [r for path in (root / "bot_relay" / "journal").glob("j-*.log")
               for r in parse_lines(path.read_bytes().splitlines()) if r is not None]
    delivered = any(r["t"] == "delivered" and r["id"] == dm for r in records)
    woken = any(r["t"] == "accepted" and r["id"] == wake_id(dm) for r in records)
    assert woken or not delivered, "the DM is marked delivered with no wake on disk: a crash now loses the wake"
    again = RecordingRunner()
    gw2 = _start(root, gateways, again, Seen(), config=WAKE_ON)
    gw2.wait_outcome(wake_id(dm), timeout=10)
    assert _woken([runner, again], dm) == 1, "the sender is woken exactly once, across the restart"


def test_a_wake_whose_batch_failed_once_is_written_again_and_run_in_this_run_woken_once_overall(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Review: one failed write of the batch carrying a wake (its accepted record and its DM's delivered record)
    # meant no wake for the rest of the run: it was dropped for the next start, while the disk was fine again a
    # moment later and nothing wrote the batch again (not a timer, not the next commit). Now the batch is held
    # and written again as a held outcome record is, and the wake runs once it landed: once overall.
    root = make_root(tmp_path)
    runner = RecordingRunner()
    gw = _start(root, gateways, runner, Seen(), config=WAKE_ON)
    assert gw._journal is not None
    disk = DiskFull(monkeypatch, gw._journal, trigger=b'"origin":"wake"', once=True)  # for one write: the wake's batch
    with LogCapture("INFO") as logs:
        dm = gw.message_agent(sender="alice", target="bob", message="hello")["delivery_id"]
        assert gw.wait_outcome(dm, timeout=10)["status"] == "replied"
        await_condition(lambda: disk.hits, timeout=10, message="the wake's batch hit the full disk")
        assert gw.wait_outcome(wake_id(dm), timeout=30)["status"] == "replied", "woken in this run"
        assert logs.matching("cannot be written", "wakes not run"), logs.lines
        assert not logs.matching("could not be journaled"), "never given up"
    assert _woken([runner], dm) == 1
    gw.stop()
    monkeypatch.undo()
    again = RecordingRunner()
    gw2 = _start(root, gateways, again, Seen(), config=WAKE_ON)
    assert gw2.wait_outcome(wake_id(dm), timeout=10)["status"] == "replied"  # known from the journal
    assert gw2.recovered["reoffered"] == gw2.recovered["redelivered"] == 0, gw2.recovered
    gw2.stop()
    assert _woken([runner, again], dm) == 1, "the sender is woken exactly once, across the restart"


def test_a_wake_whose_started_record_failed_once_runs_once_when_the_disk_has_room(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Chaos review: 101 replied DMs never woke their sender: the wake's started record hit the full disk and the
    # wake failed runtime_offline ("waking @a failed … NOT delivered"), with nothing to resend it. Now it is
    # queued again and its profile held until the journal writes again: it runs once, in this run.
    root = make_root(tmp_path)
    release = threading.Event()
    runner = RecordingRunner(held_on("hello", release))
    gw = _start(root, gateways, runner, Seen(), config=WAKE_ON)
    assert gw._journal is not None
    with LogCapture("INFO") as logs:
        dm = gw.message_agent(sender="alice", target="bob", message="hello")["delivery_id"]
        disk = DiskFull(monkeypatch, gw._journal, trigger=f'"t":"started","id":"{wake_id(dm)}"'.encode(), once=True)
        release.set()
        assert gw.wait_outcome(dm, timeout=10)["status"] == "replied"
        assert gw.wait_outcome(wake_id(dm), timeout=30)["status"] == "replied", "woken in this run"
        assert disk.hits == 1, "the wake's started record failed once"
        assert logs.matching("cannot be written", "held back"), logs.lines
        assert not logs.matching("waking @alice failed"), logs.lines
    assert _woken([runner], dm) == 1
    gw.stop()
    monkeypatch.undo()
    again = RecordingRunner()
    gw2 = _start(root, gateways, again, Seen(), config=WAKE_ON)
    assert gw2.wait_outcome(wake_id(dm), timeout=10)["status"] == "replied"  # known from the journal
    gw2.stop()
    assert _woken([runner, again], dm) == 1, "the sender is woken exactly once, across the restart"


def test_a_wake_whose_batch_a_stop_finds_unwritten_is_woken_once_by_the_next_start(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The held wake's batch never lands before the stop (the disk stays full): the stop gives it up, the DM
    # stays undelivered in the journal, and the next start publishes its outcome again and wakes the sender once.
    root = make_root(tmp_path)
    runner = RecordingRunner()
    gw = _start(root, gateways, runner, Seen(), config=WAKE_ON)
    assert gw._journal is not None
    disk = DiskFull(monkeypatch, gw._journal, trigger=b'"origin":"wake"')
    with LogCapture("INFO") as logs:
        dm = gw.message_agent(sender="alice", target="bob", message="hello")["delivery_id"]
        assert gw.wait_outcome(dm, timeout=10)["status"] == "replied"
        await_condition(lambda: logs.matching("cannot be written", "wakes not run"), timeout=10,
                        message="the wake's batch failed and is held")
        gw.stop()
    disk.free()
    assert _woken([runner], dm) == 0, "never run before its batch is on disk"
    again = RecordingRunner()
    gw2 = _start(root, gateways, again, Seen(), config=WAKE_ON)
    assert gw2.wait_outcome(wake_id(dm), timeout=30)["status"] == "replied"
    gw2.stop()
    assert _woken([runner, again], dm) == 1, "the sender is woken exactly once, by the next start"


def test_a_relayed_dms_wake_the_journal_refuses_outright_is_written_again_then_the_relay_forgets_it(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Review: a wake's batch the journal refused outright (stopped, closed) was dropped, and the relayed DM it
    # woke the sender of stayed registered for the relay to forget once the wake landed, which never came: an
    # entry per such DM, and the relay's record kept for the next start. Now the batch is held like a failed
    # one, written again once the journal takes records, the wake run, and then the relay forgets its record.
    root, paths = _relay_root(tmp_path)
    runner = RecordingRunner()
    gw = _start(root, gateways, runner, Seen(), config=WAKE_ON, **RELAYED)
    journal = gw._journal
    assert journal is not None
    together = journal.append_together
    refused: list[str] = []

    def refuse_the_wake_once(records: list[dict[str, Any]], *args: Any, **kwargs: Any) -> Any:
        if not refused and any(r.get("t") == "accepted" and r["d"].get("origin") == "wake" for r in records):
            refused.append(records[0]["id"])
            raise StoreError(0, "the delivery journal is not running")
        return together(records, *args, **kwargs)

    monkeypatch.setattr(journal, "append_together", refuse_the_wake_once)
    key = gw.message_agent(sender="alice", target="moxie", message="ping")["delivery_id"]
    sent = paths.relay.id_file(paths.sent, key)
    rf.write_reply(paths.relay, rp.make_reply(key, reply="pong", now=time.time()))
    assert gw.wait_outcome(key, timeout=10)["reply"] == "pong"
    assert gw.wait_outcome(wake_id(key), timeout=30)["status"] == "replied", "woken in this run"
    assert refused == [wake_id(key)]
    await_condition(lambda: not sent.exists(), timeout=30, message="the wake on disk: the relay forgets its record")
    assert _woken([runner], key) == 1
    durability = vars(journal)["listener"].__self__  # the listener is the Dispatcher's JournalDurability._landed
    assert not durability._with_wake and not durability._wakes and not durability._held_wakes


def test_a_relayed_outcome_is_published_only_once_its_record_is_on_disk_one_outcome_across_a_restart(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Review: a relayed DM's outcome was published as it arrived, before its records were on disk; a stop with
    # the disk still full kept the relay's record (right: the journal lacked the outcome), so the next start
    # settled the DM from it again and published the same reply a second time.
    with LogCapture("INFO") as logs:
        root, gw, _, seen, disk, key = _relayed_held_on_a_full_disk(tmp_path, gateways, monkeypatch, logs)
        gw.stop()
        assert logs.matching("NOT published", key), logs.lines
    disk.free()
    assert seen.of(key) == []
    seen_again = Seen()
    gw2 = _start(root, gateways, RecordingRunner(), seen_again, **RELAYED)
    assert gw2.wait_outcome(key, timeout=10)["reply"] == "pong"  # from the relay's record, kept for it
    await_condition(lambda: seen_again.of(key) == ["replied"], timeout=10, message="the one outcome told")
    sent = _sent(root, key)
    await_condition(lambda: not sent.exists(), timeout=10, message="on disk now: the relay's record goes")
    assert seen.of(key) + seen_again.of(key) == ["replied"], "one outcome overall"


def test_a_relayed_outcome_a_stop_cannot_write_to_a_lost_journal_is_withheld_for_the_relays_record(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stop's rule (OutcomeFlow._withhold): an outcome whose record a lost journal cannot take is published all
    # the same, as without a journal, unless the relay keeps a record a next start settles the DM from: a relayed
    # DM's. Published at this stop too, the next start would settle it from that record again: two outcomes.
    with LogCapture("INFO") as logs:
        root, gw, _, seen, disk, key = _relayed_held_on_a_full_disk(tmp_path, gateways, monkeypatch, logs)
        directory = _lose_journal(root, tmp_path)
        gw.stop()
        assert logs.matching("NOT published", key), logs.lines
        assert not logs.matching("published without", key), "the relay's record settles it at the next start"
    disk.free()
    directory.unlink()
    assert seen.of(key) == []
    seen_again = Seen()
    gw2 = _start(root, gateways, RecordingRunner(), seen_again, **RELAYED)
    assert gw2.wait_outcome(key, timeout=10)["reply"] == "pong"  # from the relay's record, kept for it
    await_condition(lambda: seen_again.of(key) == ["replied"], timeout=10, message="the one outcome told")
    assert seen.of(key) + seen_again.of(key) == ["replied"], "one outcome overall"
