"""The durable delivery journal: parsing, folding, adoption, compaction, write failures."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pykka
import pytest
from loguru import logger
from roots import LogCapture, make_root, start_gateway

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.core import outcomes
from hermes_actors.errors import HostileFileError, StoreError
from hermes_actors.local.durability import outcome_records
from hermes_actors.local.sending import outcome_future
from hermes_actors.ops.journal_view import read_journals
from hermes_actors.store.journal import Journal
from hermes_actors.store.journal_file import JournalFile
from hermes_actors.store.journal_records import (
    DeliveryState,
    JournalFolded,
    delivery_origin,
    encode_record,
    fold_lines,
    fold_records,
    parse_lines,
    state_records,
)
from hermes_actors.store.journal_state import JournalState


def _id(n: int) -> str:
    return f"{n:032x}"


def _delivery(key: str, target: str = "bob") -> dict[str, Any]:
    return {
        "delivery_id": key, "sender": "default", "sender_handle": "hermes", "target": target,
        "target_handle": target, "content": f"Message from 🤖 default (@hermes): {key}", "author": {},
        "hop": 1, "accepted_at": 1.0, "origin": "local", "label": f"@{target}",
    }


def _outcome(key: str, reply: str = "done") -> dict[str, Any]:
    return {"delivery_id": key, "status": "replied", "reply": reply, "error": "", "reason": "",
            "retryable": False, "from": "@bob", "text": f"Reply from @bob: {reply}"}


def _lines(*records: dict[str, Any]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


def _parsed(lines: list[bytes]) -> tuple[list[dict[str, Any]], int]:
    decoded = list(parse_lines(lines))
    return [r for r in decoded if r is not None], decoded.count(None)


def _file_records(path: Path) -> list[dict[str, Any]]:
    records, bad = _parsed(path.read_bytes().splitlines())
    assert bad == 0, f"{path} has {bad} corrupt line(s)"
    return records


def _on_a_thread(name: str, call: Any) -> None:
    """Run ``call()`` on a thread named ``name`` (not the main one) and wait for it; re-raise what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), f"{name} never returned"
    if raised:
        raise raised[0]


def _journal_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("j-*.log"))


# ── pure parts ──────────────────────────────────────────────────────────────


def test_parse_lines_skips_torn_and_foreign_lines() -> None:
    good = orjson.dumps({"t": "accepted", "id": _id(1), "d": _delivery(_id(1))})
    lines = [
        good,
        b'{"t":"started","id":"' + _id(1)[:10].encode(),  # torn by a crash mid-write
        b"",
        b"   ",
        b'{"t":"exploded","id":"x"}',  # unknown kind
        b'{"t":"accepted"}',  # no id
        b"[1, 2, 3]",  # not a record
        b"\xff\xfe garbage",
        orjson.dumps({"t": "started", "id": "../../../tmp/pwn", "attempt": 1}),  # an id that would name a path
        orjson.dumps({"t": "started", "id": _id(0xABC).upper()}),  # not a delivery id either
        orjson.dumps({"t": "delivered", "id": _id(1)}),
    ]
    records, bad = _parsed(lines)
    assert [r["t"] for r in records] == ["accepted", "delivered"]
    assert bad == 7


def test_parse_lines_reads_zero_bytes_as_line_breaks() -> None:
    first = orjson.dumps({"t": "accepted", "id": _id(1), "d": _delivery(_id(1))})
    second = orjson.dumps({"t": "delivered", "id": _id(1)})
    lines = [
        first + b"\n",
        b"\0" * 4096,  # the zeros a killed gateway allocated ahead and never trimmed
        b"\0" * 100 + second + b"\n",  # a power cut left zeros where lazy records had not landed
        b'{"t":"started","id":"torn' + b"\0" * 50,  # torn mid-write, then zeros
    ]
    records, bad = _parsed(lines)
    assert records == [orjson.loads(first), orjson.loads(second)]
    assert bad == 1, "only the torn record is corrupt; zeros are nothing"


def test_how_a_turn_ran_is_folded_last_one_wins_and_survives_compaction() -> None:
    """A ``started`` record's ``via`` words a turn a killed host left (recovery.plan_recovery): the last one
    counts (a warm turn that fell back to the CLI), a foreign value or none leaves it unknown (older journals),
    and compaction, which rebuilds the file from the folded state, keeps it."""
    a, b, c = _id(1), _id(2), _id(3)
    records: list[dict[str, Any]] = []
    for key in (a, b, c):
        records += [{"t": "accepted", "id": key, "d": _delivery(key)}, {"t": "started", "id": key, "attempt": 1}]
    records += [{"t": "started", "id": a, "attempt": 1, "via": "warm"},
                {"t": "started", "id": a, "attempt": 1, "via": "cli"},
                {"t": "started", "id": b, "attempt": 1, "via": "telepathy"}]
    folded = fold_records(records)
    assert [folded.states[key].via for key in (a, b, c)] == ["cli", None, None]
    assert all(folded.states[key].started == 1 for key in (a, b, c))
    state = JournalState()
    state.take_over(folded, keep=10)
    rebuilt = fold_records(record for record in parse_lines(state.lines()) if record is not None)
    assert [rebuilt.states[key].via for key in (a, b, c)] == ["cli", None, None]


@pytest.mark.parametrize(("records", "origin"), [
    ([{"t": "accepted", "id": _id(1), "d": {**_delivery(_id(1)), "origin": "wake"}}], "wake"),
    ([{"t": "accepted", "id": _id(1), "d": {k: v for k, v in _delivery(_id(1)).items() if k != "origin"}}],
     "local"),  # an accepted record naming no origin: a Delivery's default
    ([{"t": "finished", "id": _id(1), "o": _outcome(_id(1)), "origin": "wake"}], "wake"),  # rewritten
    ([{"t": "finished", "id": _id(1), "o": _outcome(_id(1))}], None),  # rewritten by an older version
    ([{"t": "finished", "id": _id(1), "o": _outcome(_id(1)), "origin": "../x"}], None),  # foreign value
    ([{"t": "finished", "id": _id(1), "o": _outcome(_id(1)), "origin": "wake"},
      {"t": "finished", "id": _id(1), "o": _outcome(_id(1)), "origin": "local"}], "wake"),  # the first outcome's
], ids=["accepted", "accepted-without-origin", "finished", "finished-older", "finished-foreign", "first-wins"])
def test_delivery_origin_reads_the_accepted_record_else_the_rewritten_finished_one(
    records: list[dict[str, Any]], origin: str | None
) -> None:
    assert delivery_origin(fold_records(records).states[_id(1)]) == origin


def test_a_delivered_wake_stays_a_wake_once_compaction_or_adoption_rewrote_the_journal() -> None:
    """Review (opsfix): compaction and adoption rewrote a delivered outcome as ``finished`` + ``delivered`` only,
    losing its ``accepted`` record's origin, so ``status`` from the files counted every wake turn's outcome as a
    settled DM once a later start had rewritten the journal. The rewritten ``finished`` record keeps the origin."""
    dm, wake = _id(1), _id(2)
    batches = [[{"t": "accepted", "id": key, "d": {**_delivery(key), "origin": origin}},
                {"t": "started", "id": key, "attempt": 1},
                {"t": "finished", "id": key, "o": _outcome(key)}, {"t": "delivered", "id": key}]
               for key, origin in ((dm, "local"), (wake, "wake"))]
    state = JournalState()
    for batch in batches:
        state.track(batch, keep=10)
    compacted = fold_records(r for r in parse_lines(state.lines()) if r is not None)
    assert {key: delivery_origin(s) for key, s in compacted.states.items()} == {dm: "local", wake: "wake"}
    assert all(s.delivery is None and s.delivered for s in compacted.states.values())  # the delivery is not kept
    adopter = JournalState()  # the next start adopts the compacted file, then compacts its own
    taken = fold_records(r for r in parse_lines(adopter.take_over(compacted, keep=10)) if r is not None)
    again = fold_records(r for r in parse_lines(adopter.lines()) if r is not None)
    for folded in (taken, again):
        assert {key: delivery_origin(s) for key, s in folded.states.items()} == {dm: "local", wake: "wake"}
        assert {key: s.outcome for key, s in folded.states.items()} == {dm: _outcome(dm), wake: _outcome(wake)}


def test_a_via_record_for_a_delivery_the_fold_does_not_track_is_ignored() -> None:
    """Review (diffrev12) of 8e39b3a: a ``started … via`` record could land after its DM's ``finished`` and
    ``delivered`` records (a warm attempt that outlived turn_timeout_seconds, then fell back to the CLI). Folded, it
    made a delivery of nothing: kept by every compaction, named at a stop as an acked DM without an outcome.
    The live state, an older journal holding that late line, and one holding the lone line a compaction wrote
    back from it all fold clean; a via record for a tracked delivery still counts."""
    a, b = _id(1), _id(2)
    accepted, started = {"t": "accepted", "id": a, "d": _delivery(a)}, {"t": "started", "id": a, "attempt": 1}
    warm, cli = {**started, "via": "warm"}, {**started, "via": "cli"}
    finished, delivered = {"t": "finished", "id": a, "o": _outcome(a)}, {"t": "delivered", "id": a}
    state = JournalState()
    for batch in ([accepted, started], [warm], [finished], [delivered], [cli]):  # as the commits fold them
        state.track(batch, keep=10)
    assert state.folded.states == {}
    assert list(state.recent) == [a]
    assert [r["t"] for r in parse_lines(state.lines())] == ["finished", "delivered"]  # what compaction writes

    older = JournalFolded()
    assert fold_lines(_lines(accepted, started, warm, finished, delivered, cli).splitlines(keepends=True),
                      older) == 0
    assert older.live() == {} and older.states[a].outcome == _outcome(a)
    lone = JournalFolded()
    assert fold_lines([_lines({"t": "started", "id": b, "attempt": 1, "via": "cli"})], lone) == 0
    assert lone.states == {} and lone.corrupt_lines == 0
    assert fold_records([accepted, started, cli]).states[a].via == "cli"


def test_a_turn_that_outlived_its_timeout_journals_no_via_after_its_outcome(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Review (diffrev12) of 8e39b3a, via_after_finished.py: a turn noted ``warm``, outlived turn_timeout_seconds,
    then noted ``cli`` (WarmOrCliRunner falling back): its ``started … via`` record landed after the DM's
    ``finished`` and ``delivered``. The turn's recorder writes nothing once its outcome is reported (its gate was
    given up on). The journal's reader reads the file clean while the gateway runs (its allocated zeros)."""
    timed_out, noted = threading.Event(), threading.Event()

    def run(turn: Any) -> str:
        turn.note_via("warm")
        timed_out.wait(30)  # the warm attempt, past turn_timeout_seconds
        turn.note_via("cli")  # WarmOrCliRunner._cli_turn, after a warm failure that never delivered
        noted.set()
        return "late"

    root = make_root(tmp_path)
    gw = start_gateway(gateways, root, run, config={"bot_mode": {"turn_timeout_seconds": 1}}, durable=True)
    try:
        key = gw.message_agent(sender="alice", target="bob", message="hi")["delivery_id"]
        assert gw.wait_outcome(key, timeout=30)["reason"] == "delivery_timeout"
    finally:
        timed_out.set()
    assert noted.wait(30)
    (path,) = (root / "bot_relay" / "journal").glob("j-*.log")
    records = [r for r in _file_records(path) if r["id"] == key]
    assert [r.get("via") for r in records if r["t"] == "started"] == [None, "warm"], records


def test_fold_lines_folds_as_it_reads_and_counts_corrupt_lines() -> None:
    a, b = _id(1), _id(2)
    read: list[int] = []

    def lines() -> Any:  # a generator: what fold_lines folds must not need the whole file at once
        for n, line in enumerate([
            orjson.dumps({"t": "accepted", "id": a, "d": _delivery(a)}),
            b"torn",
            None,  # a line read_lines refused as too long
            orjson.dumps({"t": "finished", "id": a, "o": _outcome(a)}),
            orjson.dumps({"t": "accepted", "id": b, "d": _delivery(b)}),
        ]):
            read.append(n)
            yield line

    folded = JournalFolded(corrupt_lines=1)
    assert fold_lines(lines(), folded) == 2
    assert folded.corrupt_lines == 3 and read == [0, 1, 2, 3, 4]
    assert folded.states[a].outcome == _outcome(a) and folded.states[b].delivery == _delivery(b)


def test_fold_records_first_outcome_wins_and_tracks_the_lifecycle() -> None:
    a, b = _id(1), _id(2)
    folded = fold_records([
        {"t": "accepted", "id": a, "d": _delivery(a)},
        {"t": "started", "id": a, "attempt": 1},
        {"t": "finished", "id": a, "o": _outcome(a, "first")},
        {"t": "finished", "id": a, "o": _outcome(a, "second")},
        {"t": "started", "id": a, "attempt": 2},
        {"t": "accepted", "id": b, "d": _delivery(b)},
        {"t": "delivered", "id": a},
    ])
    sa, sb = folded.states[a], folded.states[b]
    assert sa.outcome is not None and sa.outcome["reply"] == "first"
    assert sa.started == 2 and sa.delivered
    assert sb.delivery == _delivery(b) and sb.started == 0 and sb.outcome is None and not sb.delivered
    assert set(folded.live()) == {b}


# ── adoption ────────────────────────────────────────────────────────────────


def test_a_dead_gateways_journal_is_adopted_and_removed(tmp_path: Path, warnings: list[str]) -> None:
    directory = tmp_path / "journal"
    directory.mkdir(mode=0o700)
    queued, running, finished, done = _id(1), _id(2), _id(3), _id(4)
    dead = directory / "j-deadbeefdeadbeefdeadbeefdeadbeef.log"
    dead.write_bytes(
        _lines(
            {"t": "accepted", "id": queued, "d": _delivery(queued)},
            {"t": "accepted", "id": running, "d": _delivery(running)},
            {"t": "started", "id": running, "attempt": 1},
            {"t": "accepted", "id": finished, "d": _delivery(finished)},
            {"t": "started", "id": finished, "attempt": 1},
            {"t": "finished", "id": finished, "o": _outcome(finished)},
            {"t": "accepted", "id": done, "d": _delivery(done)},
            {"t": "finished", "id": done, "o": _outcome(done, "old news")},
            {"t": "delivered", "id": done},
        )
        + b'{"t":"accepted","id":"torn'  # the dead gateway was killed mid-write
    )
    dead.chmod(0o600)
    original = dead.read_bytes()
    journal = Journal(directory, fsync=False)
    adopted = journal.start()
    try:
        assert set(adopted.states) == {queued, running, finished, done}
        assert adopted.corrupt_lines == 1
        assert set(adopted.live()) == {queued, running, finished}
        assert not dead.exists(), "the adopted file must leave the journal directory"
        # Unreadable lines: the file is kept aside (what was lost can be looked up), and said so.
        [kept] = (tmp_path / "quarantine").iterdir()
        assert kept.name.startswith(dead.name) and kept.read_bytes() == original
        assert any("1 unreadable line(s)" in w and "cannot be re-offered" in w for w in warnings), warnings
        assert _journal_files(directory) == [journal.path]
        mine = fold_records(_file_records(journal.path))
        assert mine.states[queued].delivery == _delivery(queued) and not mine.states[queued].started
        assert mine.states[running].started == 1 and mine.states[running].outcome is None
        assert mine.states[finished].outcome == _outcome(finished) and not mine.states[finished].delivered
        assert mine.states[done].delivered and mine.states[done].outcome == _outcome(done, "old news")
    finally:
        journal.stop()
    # And the next gateway adopts the adopter's file (it is dead now), with the same live state.
    again = Journal(directory, fsync=False)
    try:
        assert set(again.start().live()) == {queued, running, finished}
    finally:
        again.stop()


def test_a_symlinked_journal_is_never_followed_and_refuses_the_start_naming_it(tmp_path: Path) -> None:
    """A ``j-*.log`` symlink was skipped with no log line, then (later) with a WARNING telling to remove it: the
    records it points at were dropped either way. It refuses the start now, never followed, and no file is made
    (``tests/test_journal_swapped_files.py`` has the rest)."""
    directory = tmp_path / "journal"
    directory.mkdir(mode=0o700)
    outside = tmp_path / "outside.log"
    key = _id(5)
    outside.write_bytes(_lines({"t": "accepted", "id": key, "d": _delivery(key)}))
    outside.chmod(0o600)
    before = outside.read_bytes()
    link = directory / "j-0123456789abcdef0123456789abcdef.log"
    link.symlink_to(outside)
    journal = Journal(directory, fsync=False)
    with pytest.raises(HostileFileError) as info:
        journal.start()
    journal.stop()
    assert str(info.value).startswith(f"journal file {link} is a symlink (to {outside}), never followed"), info.value
    # the screen does not claim "nothing was changed": a start may have made the relay's directories before it
    assert str(info.value).endswith("the next start re-offers the DMs journaled in it"), info.value
    assert link.is_symlink() and outside.read_bytes() == before
    assert sorted(directory.iterdir()) == [link]


def test_a_killed_gateways_zeros_past_its_last_record_are_not_corrupt_lines(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    directory = root / "bot_relay" / "journal"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    queued = _id(1)
    dead = directory / "j-deadbeefdeadbeefdeadbeefdeadbeef.log"
    # What a SIGKILLed gateway leaves: its records, then the rest of the space it allocated ahead.
    zeros = b"\0" * JournalFile.reserve_bytes
    dead.write_bytes(_lines({"t": "accepted", "id": queued, "d": _delivery(queued)}) + zeros)
    dead.chmod(0o600)
    folded, problems = read_journals(root)  # the ops view reads it as it is
    assert problems == [] and folded.corrupt_lines == 0
    assert set(folded.live()) == {queued}
    journal = Journal(directory, fsync=False)
    adopted = journal.start()
    try:
        assert adopted.corrupt_lines == 0 and set(adopted.live()) == {queued}
    finally:
        journal.stop()
    assert [r["id"] for r in _file_records(journal.path)] == [queued]


HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_journal_flocked_by_a_live_process_is_not_adopted(tmp_path: Path) -> None:
    directory = tmp_path / "journal"
    directory.mkdir(mode=0o700)
    key = _id(7)
    alive = directory / "j-0123456789abcdef0123456789abcdef.log"
    alive.write_bytes(_lines({"t": "accepted", "id": key, "d": _delivery(key)}))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(alive)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        journal = Journal(directory, fsync=False)
        adopted = journal.start()
        try:
            assert adopted.states == {}, "a living gateway's journal must not be adopted"
            assert alive.exists()
            assert key not in fold_records(_file_records(journal.path)).states
        finally:
            journal.stop()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()  # the holder exits: its lock goes with it
        holder.wait(timeout=10)
    later = Journal(directory, fsync=False)
    try:
        assert set(later.start().live()) == {key}, "once its owner is dead the journal is adopted"
        assert not alive.exists()
    finally:
        later.stop()


# ── compaction ──────────────────────────────────────────────────────────────


def test_compaction_keeps_live_records_and_recent_outcomes(tmp_path: Path) -> None:
    directory = tmp_path / "journal"
    journal = Journal(directory, fsync=True)
    journal.compact_after = 20
    journal.keep_delivered = 5
    journal.start()
    live_queued, live_started = _id(1000), _id(1001)
    try:
        journal.append_durably({"t": "accepted", "id": live_queued, "d": _delivery(live_queued)})
        journal.append_durably({"t": "accepted", "id": live_started, "d": _delivery(live_started)})
        journal.append_durably({"t": "started", "id": live_started, "attempt": 1})
        for n in range(40):
            key = _id(n)
            journal.append_durably({"t": "accepted", "id": key, "d": _delivery(key)})
            journal.append_durably({"t": "started", "id": key, "attempt": 1})
            journal.append_durably({"t": "finished", "id": key, "o": _outcome(key, f"r{n}")})
            journal.append_durably({"t": "delivered", "id": key})
        assert journal.compactions >= 5
        lines = journal.path.read_bytes().splitlines()
        assert len(lines) <= journal.compact_after + 4, "the file stays bounded"
        # The compacted file is still ours: another journal on the same directory does not take it.
        rival = Journal(directory, fsync=False)
        assert rival.start().states == {}
        rival.stop()
        rival.path.unlink(missing_ok=True)
    finally:
        journal.stop()
    folded = fold_records(_file_records(journal.path))
    assert folded.states[live_queued].delivery == _delivery(live_queued)
    assert folded.states[live_started].started == 1 and folded.states[live_started].outcome is None
    assert set(folded.live()) == {live_queued, live_started}
    delivered = [k for k, s in folded.states.items() if s.delivered]
    assert _id(39) in delivered and folded.states[_id(39)].outcome == _outcome(_id(39), "r39")
    assert all(_id(n) not in folded.states for n in range(25)), "old delivered outcomes were compacted away"
    assert all(folded.states[k].outcome is not None for k in delivered)


def test_a_lazy_record_is_written_at_once_and_flushed_by_the_next_batch_or_stop(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal", fsync=True)
    journal.start()
    spy = WriteSpy(journal)
    first, second = _id(1), _id(2)
    try:
        # Appended by an actor's thread, as the Dispatcher does (the main thread never writes: it leaves it
        # to the writer thread, see test_the_main_thread_never_commits_so_an_interrupt_there_breaks_nothing).
        _on_a_thread("dispatcher", lambda: journal.append({"t": "delivered", "id": first}, lazy=True))
        # No commit was running: that thread wrote it, the writer thread was not woken for it.
        assert spy.writes == [("dispatcher", 1)]
        assert _file_records(journal.path) == [{"t": "delivered", "id": first}], "written at once"
        assert journal.fsyncs == 0, "a batch of lazy records only must not flush"
        journal.append_durably({"t": "accepted", "id": second, "d": _delivery(second)})
        assert journal.fsyncs == 1, "the next waited-for batch flushes (the lazy record with it)"
        journal.append({"t": "delivered", "id": second}, lazy=True)
        await_condition(lambda: journal.records == 3, timeout=10, message="the second lazy record was not written")
        assert journal.fsyncs == 1
    finally:
        journal.stop()
    assert journal.fsyncs == 2, "stop flushes lazy records written since the last flush"
    assert [r["t"] for r in _file_records(journal.path)] == ["delivered", "accepted", "delivered"]


def test_a_lazy_record_with_a_token_is_not_lazy(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal", fsync=True)
    landed: list[list[Any]] = []
    journal.listener = lambda tokens, error: landed.append(list(tokens))
    journal.start()
    try:
        journal.append({"t": "delivered", "id": _id(1)}, token="t1", lazy=True)
        await_condition(lambda: landed == [["t1"]], timeout=10, message="the token never landed")
        assert journal.fsyncs == 1, "a token means someone waits for the flush"
    finally:
        journal.stop()
    assert journal.fsyncs == 1, "nothing unflushed was left for stop"


def test_drain_returns_once_every_appended_record_landed_and_its_listener_was_told(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal", fsync=True)
    inside, release = threading.Event(), threading.Event()
    landed: list[list[Any]] = []

    def listener(tokens: list[Any], error: BaseException | None) -> None:
        inside.set()
        assert release.wait(10)  # the commit cannot end while its listener runs
        landed.append(list(tokens))

    journal.listener = listener
    journal.start()
    try:
        assert journal.drain(timeout=0), "nothing appended: nothing to wait for"
        journal.append({"t": "delivered", "id": _id(1)}, token="t1")
        assert inside.wait(10)
        assert not journal.drain(timeout=0.05), "its listener is still running: the commit has not ended"
        release.set()
        assert journal.drain(timeout=10)
        assert landed == [["t1"]]  # told before drain returned
    finally:
        release.set()
        journal.stop()


# ── the file is allocated ahead ─────────────────────────────────────────────


def test_the_file_is_allocated_ahead_and_cut_back_to_its_records_at_stop(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal", fsync=True)
    journal.start()
    records = [{"t": "accepted", "id": _id(n), "d": _delivery(_id(n))} for n in range(3)]
    try:
        for record in records:
            journal.append_durably(record)
        size = journal.path.stat().st_size
        assert size >= JournalFile.reserve_bytes, f"{size} bytes: the file was not allocated ahead"
        data = journal.path.read_bytes()
        assert data.startswith(_lines(*records)) and data[len(_lines(*records)):].strip(b"\0") == b""
    finally:
        journal.stop()
    assert journal.path.read_bytes() == _lines(*records), "stop cuts the zeros off"


def test_stop_cuts_back_what_a_failed_allocation_added(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_fallocate = os.posix_fallocate

    def partly(fd: int, offset: int, length: int) -> None:  # ext4 may extend the file, then run out of space
        real_fallocate(fd, offset, length // 2)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", partly)
    journal = Journal(tmp_path / "journal", fsync=True)
    journal.start()
    record = {"t": "started", "id": _id(1), "attempt": 1}
    try:
        journal.append_durably(record)
    finally:
        journal.stop()
    assert journal.path.read_bytes() == _lines(record)


def test_a_filesystem_that_cannot_allocate_ahead_gets_a_file_that_grows_per_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def no_fallocate(fd: int, offset: int, length: int) -> None:
        calls.append(length)
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "posix_fallocate", no_fallocate)
    journal = Journal(tmp_path / "journal", fsync=True)
    journal.start()
    records = [{"t": "started", "id": _id(n), "attempt": 1} for n in range(3)]
    try:
        for record in records:
            journal.append_durably(record)
        assert journal.path.read_bytes() == _lines(*records)
        assert len(calls) == 1, "a filesystem that refused once is not asked again for this file"
    finally:
        journal.stop()
    assert journal.path.read_bytes() == _lines(*records)


# ── who commits: a waiting caller leads, the writer thread compacts ─────────


class WriteSpy:
    """Wraps a journal's ``_write_now``: records (thread name, lines) per write; ``gate`` can hold the first."""

    def __init__(self, journal: Journal, *, hold_first: bool = False) -> None:
        self.writes: list[tuple[str, int]] = []
        self.entered = threading.Event()
        self.gate = threading.Event()
        if not hold_first:
            self.gate.set()
        self._real = journal._write_now
        journal._write_now = self  # type: ignore[method-assign]

    def __call__(self, lines: list[bytes], *, flush: bool = True) -> None:
        self.writes.append((threading.current_thread().name, len(lines)))
        self.entered.set()
        assert self.gate.wait(60), "the test never opened the gate"
        self._real(lines, flush=flush)


class Appenders:
    """Callers of ``append_durably`` on their own threads (a ``started`` record of id ``n`` each); what they raised."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []

    def start(self, n: int, name: str | None = None, timeout: float = 30.0) -> None:
        def append() -> None:
            try:
                self.journal.append_durably({"t": "started", "id": _id(n), "attempt": 1}, timeout=timeout)
            except BaseException as exc:
                self.errors.append(exc)

        thread = threading.Thread(target=append, name=name)
        self.threads.append(thread)
        thread.start()

    def join(self) -> None:
        """Wait for every caller; none may still be waiting or have failed."""
        for thread in self.threads:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in self.threads), "a caller never returned"
        assert not self.errors, self.errors


def _a_stalled_commit(journal: Journal) -> tuple[WriteSpy, Appenders]:
    """Start ``journal`` with a caller's commit of record 1 held in its write (``spy.gate`` lets it go)."""
    journal.start()
    spy = WriteSpy(journal, hold_first=True)
    callers = Appenders(journal)
    callers.start(1)
    assert spy.entered.wait(30), "the first commit never started"
    return spy, callers


def test_a_caller_that_finds_no_commit_running_commits_its_record_on_its_own_thread(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal", fsync=True)
    journal.start()
    spy = WriteSpy(journal)
    try:
        caller = threading.Thread(target=journal.append_durably, args=({"t": "started", "id": _id(1), "attempt": 1},),
                                  name="the-caller")
        caller.start()
        caller.join(timeout=30)
        assert not caller.is_alive()
        assert spy.writes == [("the-caller", 1)], "no hand-off to the writer thread and back"
        assert journal.fsyncs == 1 and _file_records(journal.path)[0]["id"] == _id(1)
    finally:
        journal.stop()


def test_callers_arriving_during_a_commit_share_the_next_one(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal", fsync=True)
    journal.start()
    spy = WriteSpy(journal, hold_first=True)
    callers = Appenders(journal)
    try:
        callers.start(0, name="leader")
        assert spy.entered.wait(30), "the first caller never started its commit"
        for n in (1, 2, 3):
            callers.start(n, name=f"caller-{n}")
        await_condition(lambda: len(journal._batch.items) == 3, timeout=30, message="the others never queued")
        spy.gate.set()
        callers.join()
        assert [lines for _, lines in spy.writes] == [1, 3], spy.writes
        # The first caller that queued behind the commit commits the next batch itself as the turn frees:
        # no hand-off to the writer thread and back.
        assert spy.writes[1][0] in {"caller-1", "caller-2", "caller-3"}, spy.writes
        assert journal.fsyncs == 2, "four waited-for records, two syncs"
    finally:
        journal.stop()
    assert sorted(r["id"] for r in _file_records(journal.path)) == [_id(n) for n in range(4)]


def test_a_due_compaction_runs_on_the_writer_thread_before_the_next_caller_commits(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal", fsync=False)
    journal.compact_after = 6
    compacted_on: list[str] = []
    real_compact = journal._compact

    def compact() -> None:
        compacted_on.append(threading.current_thread().name)
        real_compact()

    journal._compact = compact  # type: ignore[method-assign]
    journal.start()
    try:
        for n in range(30):
            key = _id(n)
            journal.append_durably({"t": "accepted", "id": key, "d": _delivery(key)})
            journal.append_durably({"t": "delivered", "id": key})
            assert journal._lines_in_file <= journal.compact_after + 2, "a caller never outran a due compaction"
    finally:
        journal.stop()
    assert compacted_on and set(compacted_on) == {"journal-writer"}, compacted_on
    # Each compacted file is written from its start and allocated ahead again: the records appended
    # after the last swap follow it exactly, and stop cuts its zeros off.
    assert b"\0" not in journal.path.read_bytes()
    assert _file_records(journal.path)[-1] == {"t": "delivered", "id": _id(29)}


def test_stop_lets_a_leading_caller_finish_its_commit(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal", fsync=True)
    spy, callers = _a_stalled_commit(journal)
    stopper = threading.Thread(target=journal.stop)
    stopper.start()
    await_condition(lambda: not journal.running, timeout=30, message="stop never began")
    spy.gate.set()
    callers.join()
    stopper.join(timeout=30)
    assert not stopper.is_alive()
    assert _file_records(journal.path) == [{"t": "started", "id": _id(1), "attempt": 1}]


# ── a commit that fails or stalls: nobody is told a record landed that did not, or the reverse ──


def test_a_commit_failing_with_any_error_fails_its_waiters_and_the_writer_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal(tmp_path / "journal", fsync=False)
    landed: list[tuple[list[Any], BaseException | None]] = []
    journal.listener = lambda tokens, error: landed.append((list(tokens), error))
    journal.start()
    real_write_now = journal._write_now
    failures = [RuntimeError("a bug in the write path"), RuntimeError("again, on the writer thread")]

    def write_now(lines: list[bytes], *, flush: bool = True) -> None:
        if failures:
            raise failures.pop(0)
        real_write_now(lines, flush=flush)

    monkeypatch.setattr(journal, "_write_now", write_now)
    try:
        with pytest.raises(StoreError, match="a bug in the write path"):
            journal.append_durably({"t": "started", "id": _id(1), "attempt": 1})  # the caller's own commit
        journal.append({"t": "started", "id": _id(2), "attempt": 1}, token="t2")  # the writer thread's
        await_condition(lambda: len(landed) == 1, timeout=10, message="the failed batch was never reported")
        assert landed[0][0] == ["t2"] and isinstance(landed[0][1], RuntimeError), landed
        journal.append({"t": "started", "id": _id(3), "attempt": 1}, token="t3")
        await_condition(lambda: len(landed) == 2, timeout=10, message="the writer thread stopped committing")
        assert landed[1] == (["t3"], None)
    finally:
        journal.stop()
    assert [r["id"] for r in _file_records(journal.path)] == [_id(3)]


def test_a_caller_that_gives_up_waiting_withdraws_its_record(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal", fsync=True)
    spy, callers = _a_stalled_commit(journal)
    try:
        # The commit in front is stalled: no commit takes the next record within its caller's deadline.
        with pytest.raises(StoreError, match=re.escape("did not confirm a write within 0.2s")):
            journal.append_durably({"t": "accepted", "id": _id(2), "d": _delivery(_id(2))}, timeout=0.2)
    finally:
        spy.gate.set()
        callers.join()
        journal.stop()
    assert [r["id"] for r in _file_records(journal.path)] == [_id(1)], "the refused record was never written"
    assert [lines for _, lines in spy.writes] == [1], "no commit was left to write it"


def test_when_the_first_waiting_caller_gives_up_the_writer_thread_commits_the_others(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal", fsync=True)
    spy, callers = _a_stalled_commit(journal)
    patient = Appenders(journal)
    try:
        impatient = Appenders(journal)
        impatient.start(2, timeout=2.0)  # it queues first: the batch's leader
        await_condition(lambda: len(journal._batch.items) == 1, timeout=30, message="the first waiter never queued")
        patient.start(3)  # queued in the same batch, waiting for its commit (30 s)
        await_condition(lambda: len(journal._batch.items) == 2, timeout=30, message="the second waiter never queued")
        assert journal._batch.leader, "the first waiter gave up before the second queued (a 2 s margin)"
        (thread,) = impatient.threads
        thread.join(timeout=30)
        assert not thread.is_alive() and len(impatient.errors) == 1, impatient.errors
        assert isinstance(impatient.errors[0], StoreError) and "did not confirm" in str(impatient.errors[0])
        assert [item[0]["id"] for item in journal._batch.items] == [_id(3)], "the leader withdrew only its own record"
        spy.gate.set()
        callers.join()
        patient.join()
    finally:
        spy.gate.set()
        journal.stop()
    assert [r["id"] for r in _file_records(journal.path)] == [_id(1), _id(3)]
    assert spy.writes[1][0] == "journal-writer", spy.writes


def test_records_whose_sync_failed_are_taken_back_out_of_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal(tmp_path / "journal", fsync=True)
    journal.start()
    real_fdatasync = os.fdatasync
    failures = [OSError(errno.EIO, "Input/output error")]

    def fdatasync(fd: int) -> None:
        if failures:
            raise failures.pop(0)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    try:
        with pytest.raises(StoreError, match="Input/output error"):
            journal.append_durably({"t": "accepted", "id": _id(1), "d": _delivery(_id(1))})
        assert journal.path.stat().st_size == 0, "a refused record must not be found by the next start"
        journal.append_durably({"t": "accepted", "id": _id(2), "d": _delivery(_id(2))})
    finally:
        journal.stop()
    assert [r["id"] for r in _file_records(journal.path)] == [_id(2)]


def test_a_stop_that_gives_up_on_a_stalled_commit_leaves_the_file_to_it(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal", fsync=False)
    journal.stop_wait = 0.2
    spy, callers = _a_stalled_commit(journal)
    callers.start(2)
    await_condition(lambda: len(journal._batch.items) == 1, timeout=30, message="the second record never queued")
    journal.stop()  # gives up on the stalled commit: the file must stay open under it
    assert journal._file.fd is not None
    spy.gate.set()
    callers.join()
    assert journal._thread is not None
    journal._thread.join(timeout=30)
    assert journal._file.fd is None, "the last commit closed the file once it ended"
    assert sorted(r["id"] for r in _file_records(journal.path)) == [_id(1), _id(2)]


def test_a_record_queued_before_stop_lands_before_the_file_closes(tmp_path: Path) -> None:
    # Regression (review of the leading-caller commit): stop gave up joining the writer, then saw the
    # stalled commit end and closed the file while record 2's caller was committing it: acked but missing,
    # or refused but in the file. Stop now waits for what was queued before it.
    for _ in range(10):  # the old race lost about one run in five
        journal = Journal(tmp_path / f"journal-{_}", fsync=True)
        journal.stop_wait = 30.0  # what stop waits for once it gave up joining the writer
        spy, callers = _a_stalled_commit(journal)
        callers.start(2)
        await_condition(lambda j=journal: len(j._batch.items) == 1, timeout=30, message="record 2 never queued")
        writer = journal._thread
        assert writer is not None
        gave_up_joining = threading.Event()
        real_join = writer.join

        def join(timeout: float | None = None, gave_up: threading.Event = gave_up_joining,
                 real: Any = real_join) -> None:
            real(0.01)  # the writer waits behind the stalled commit: stop gives up joining it at once
            gave_up.set()

        writer.join = join  # type: ignore[method-assign]
        stopper = threading.Thread(target=journal.stop)
        stopper.start()
        assert gave_up_joining.wait(30), "stop never gave up joining the writer"  # it waits for the turn now
        spy.gate.set()
        callers.join()  # both callers were told their record landed
        stopper.join(timeout=30)
        assert not stopper.is_alive()
        if journal._thread is not None:
            journal._thread.join(timeout=30)
        assert journal._file.fd is None
        assert sorted(r["id"] for r in _file_records(journal.path)) == [_id(1), _id(2)]


def test_a_caller_that_queues_while_start_adopts_commits_as_soon_as_adoption_ends(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal", fsync=False)
    adopting, release = threading.Event(), threading.Event()
    real_adopt = journal._adopt

    def adopt() -> Any:
        adopting.set()
        assert release.wait(30)
        return real_adopt()

    journal._adopt = adopt  # type: ignore[method-assign]
    starter = threading.Thread(target=journal.start)
    starter.start()
    assert adopting.wait(30)
    done = threading.Event()

    def append() -> None:
        journal.append_durably({"t": "started", "id": _id(1), "attempt": 1}, timeout=120)
        done.set()

    caller = threading.Thread(target=append)
    caller.start()
    await_condition(lambda: len(journal._batch.items) == 1, timeout=30, message="the caller never queued")
    release.set()
    starter.join(timeout=30)
    try:
        # Woken as adoption freed the turn, not at its own 120 s deadline.
        assert done.wait(30), "the caller was not woken when adoption ended"
    finally:
        caller.join(timeout=150)
        journal.stop()
    assert [r["id"] for r in _file_records(journal.path)] == [_id(1)]


def test_a_leader_interrupted_while_waiting_leaves_its_batch_to_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal(tmp_path / "journal", fsync=False)
    landed: list[list[Any]] = []
    journal.listener = lambda tokens, error: landed.append(list(tokens))
    spy, callers = _a_stalled_commit(journal)
    real_wait = journal._cond.wait

    def interrupted(timeout: float | None = None) -> bool:
        if threading.current_thread().name == "impatient":
            raise KeyboardInterrupt
        return real_wait(timeout)

    monkeypatch.setattr(journal._cond, "wait", interrupted)
    leader = Appenders(journal)
    leader.start(2, name="impatient")
    (thread,) = leader.threads
    thread.join(timeout=30)
    assert [type(e) for e in leader.errors] == [KeyboardInterrupt]
    try:
        journal.append({"t": "started", "id": _id(3), "attempt": 1}, token="t3")  # queued with record 2
        spy.gate.set()
        callers.join()
        await_condition(lambda: landed == [["t3"]], timeout=30, message="the batch of a gone leader was never written")
        journal.append_durably({"t": "started", "id": _id(4), "attempt": 1}, timeout=30)
    finally:
        spy.gate.set()
        journal.stop()
    assert [r["id"] for r in _file_records(journal.path)] == [_id(1), _id(2), _id(3), _id(4)]


# ── write failures ──────────────────────────────────────────────────────────


def test_enospc_refuses_the_dm_and_leaves_no_torn_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_root(tmp_path)
    gw = Gateway(root, runner=lambda turn: "fine").start()
    journal = gw._journal
    assert journal is not None
    real_write = os.pwrite
    armed = {"on": False, "calls": 0}
    failed_data: list[bytes] = []

    def write(fd: int, data: Any, offset: int) -> int:
        if armed["on"] and fd == journal._file.fd:
            armed["calls"] += 1
            if armed["calls"] == 1:  # the first half lands, then the disk is full
                half = bytes(data)[: len(data) // 2]
                failed_data.append(bytes(data))
                return real_write(fd, half, offset)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data, offset)

    try:
        before = gw.message_agent(sender="alice", target="bob", message="before")
        assert gw.wait_outcome(before["delivery_id"], timeout=10)["status"] == "replied"
        # Its lazy "delivered" record is on disk too: the failing batch holds only the new DM.
        await_condition(lambda: journal.records >= 4, timeout=10, message="4 records of the first DM written")
        monkeypatch.setattr(os, "pwrite", write)
        armed["on"] = True
        refused = gw.message_agent(sender="alice", target="bob", message="while the disk is full")
        armed["on"] = False
        assert "delivery_id" not in refused, f"a DM that was not journaled must not be acked: {refused}"
        assert refused.get("status") != "queued"
        assert "NOT queued" in refused["error"] and "No space left" in refused["error"], refused
        assert refused["reason"] == "runtime_offline"
        assert failed_data, "the journal write was attempted"
        (lost_id,) = set(re.findall(rb'"t":"accepted","id":"([0-9a-f]{32})"', failed_data[0]))
        after = gw.message_agent(sender="alice", target="bob", message="after")
        assert gw.wait_outcome(after["delivery_id"], timeout=10)["status"] == "replied"
        with pytest.raises(KeyError):
            gw.wait_outcome(lost_id.decode(), timeout=1)
    finally:
        gw.stop()
    (path,) = _journal_files(root / "bot_relay" / "journal")
    data = path.read_bytes()
    assert data.endswith(b"\n")
    records = _file_records(path)  # no torn line was left behind
    assert lost_id.decode() not in {r["id"] for r in records}
    again = Gateway(root, runner=lambda turn: "fine").start()
    try:
        assert again.recovered.get("reoffered", 0) == 0 and again.recovered.get("ambiguous", 0) == 0
        assert again.wait_outcome(after["delivery_id"], timeout=5)["status"] == "replied"
        with pytest.raises(KeyError):
            again.wait_outcome(lost_id.decode(), timeout=1)
    finally:
        again.stop()


def test_a_full_disk_is_said_once_at_error_each_later_failed_write_at_debug_and_its_end_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Chaos review: a full disk under a gateway with DMs flowing logged "journal write failed …" at ERROR ~780
    # times in 1.2 s, one per failed commit. Now the spell's first failed write is said once at ERROR, naming the
    # file and what to do, each later one at DEBUG, and the write that lands again says the end once (INFO); the
    # next failure begins a new spell, said again.
    journal = Journal(tmp_path / "journal")
    journal.start()
    real = os.pwrite
    full = threading.Event()
    full.set()

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if full.is_set() and fd == journal._file.fd:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data, offset)

    said: list[tuple[str, str]] = []
    sink = logger.add(lambda m: said.append((m.record["level"].name, m.record["message"])), level="DEBUG",
                      filter="hermes_actors.store.journal")
    monkeypatch.setattr(os, "pwrite", pwrite)
    try:
        for n in range(40):
            with pytest.raises(StoreError):
                journal.append_durably({"t": "accepted", "id": _id(n), "d": _delivery(_id(n))})
        full.clear()
        journal.append_durably({"t": "accepted", "id": _id(40), "d": _delivery(_id(40))})
        full.set()
        with pytest.raises(StoreError):
            journal.append_durably({"t": "accepted", "id": _id(41), "d": _delivery(_id(41))})
    finally:
        full.clear()
        logger.remove(sink)
        journal.stop()
    failed = [(level, text) for level, text in said if "journal write failed" in text]
    assert [level for level, _ in failed] == ["ERROR"] + ["DEBUG"] * 39 + ["ERROR"], failed
    assert str(journal.path) in failed[0][1] and "(ENOSPC); free space on its filesystem" in failed[0][1]
    ends = [(level, text) for level, text in said if "takes records again" in text]
    assert ends == [("INFO", f"the delivery journal {journal.path} takes records again (40 failed write(s) before)")]


def test_a_compaction_that_does_not_fit_is_said_once_and_tried_again_only_after_more_lines_or_a_write_spell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Review of e33086d: on a nearly full disk (appends fit, a whole compacted file does not) every commit past
    # compact_after retried the compaction, writing and removing a whole temp file, and logged "journal
    # compaction failed: [Errno 28] ..." at ERROR each time (38 ERRORs for 40 DMs), naming no file. Now the
    # spell's first failure is one ERROR naming the file and what to do, later ones DEBUG; the next try waits
    # until the file grew by another compact_after lines, or until a failed write's spell ended (space came
    # back); the compaction that lands again says the end once (INFO).
    journal = Journal(tmp_path / "journal")
    journal.compact_after = 10
    journal.start()
    real_replace, real_pwrite = journal._file.replace_with, os.pwrite
    tried_at: list[int] = []  # our file's lines at each compaction attempt
    compaction_fits, write_fits = threading.Event(), threading.Event()
    write_fits.set()

    def replace_with(lines: list[bytes], *, fresh_dir: bool = False) -> None:
        tried_at.append(journal._lines_in_file)
        if not compaction_fits.is_set():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_replace(lines, fresh_dir=fresh_dir)

    def pwrite(fd: int, data: Any, offset: int) -> int:
        if not write_fits.is_set() and fd == journal._file.fd:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_pwrite(fd, data, offset)

    said: list[tuple[str, str]] = []
    sink = logger.add(lambda m: said.append((m.record["level"].name, m.record["message"])), level="DEBUG",
                      filter="hermes_actors.store.journal")
    monkeypatch.setattr(journal._file, "replace_with", replace_with)
    monkeypatch.setattr(os, "pwrite", pwrite)
    n = 0

    def append() -> None:  # one record, one line, one commit (on the writer thread: this is the main thread)
        nonlocal n
        journal.append_durably({"t": "accepted", "id": _id(n), "d": _delivery(_id(n))})
        n += 1

    try:
        for _ in range(40):
            append()
        assert tried_at == [11, 22, 33], tried_at  # before: at every commit past 10 lines, 30 tries
        write_fits.clear()  # a full disk for a moment: one write fails, the next lands (space came back)
        with pytest.raises(StoreError):
            append()
        write_fits.set()
        append()
        assert tried_at == [11, 22, 33, 41], tried_at  # the write spell's end lifted the back-off
        compaction_fits.set()
        for _ in range(11):
            append()
        assert tried_at[-1] == 52 and journal.compactions == 1, tried_at
    finally:
        write_fits.set()
        logger.remove(sink)
        journal.stop()
    compacting = [(level, text) for level, text in said if text.startswith("journal compaction failed")]
    assert [level for level, _ in compacting] == ["ERROR"] + ["DEBUG"] * 3, compacting  # before: an ERROR each
    first = compacting[0][1]
    assert f"cannot compact {journal.path}: No space left on device (ENOSPC); free space on its filesystem" in first
    assert "tried again after another 10 line(s)" in first
    ends = [(level, text) for level, text in said if "compacted again" in text]
    assert ends == [("INFO", f"the delivery journal {journal.path} is compacted again (4 failed compaction(s) before)")]


def test_a_commits_delivered_records_are_appended_before_its_waiters_are_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Dispatcher appends the lazy ``delivered`` records of a commit (writing them itself when no
    # commit runs) before it answers the waiters: a sender that goes on to send then finds the journal
    # free instead of racing the Dispatcher for it.
    release = threading.Event()
    gw = Gateway(make_root(tmp_path), runner=lambda turn: "fine" if release.wait(30) else "late").start()
    journal, dispatcher = gw._journal, gw._system.dispatcher if gw._system else None
    assert journal is not None and dispatcher is not None
    waiters: dict[str, pykka.ThreadingFuture[dict[str, Any]]] = {}
    order: dict[str, str] = {}
    real_append = journal.append

    def append(record: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        waiter = waiters.get(record["id"]) if record.get("t") == "delivered" else None
        if waiter is not None:  # on the Dispatcher's thread: has it answered the waiter already?
            try:
                waiter.get(timeout=0)
                order[record["id"]] = "answered, then appended"
            except pykka.Timeout:
                order[record["id"]] = "appended, then answered"
        return real_append(record, *args, **kwargs)

    monkeypatch.setattr(journal, "append", append)
    try:
        key = gw.message_agent(sender="alice", target="bob", message="hi")["delivery_id"]
        waiters[key] = outcome_future(dispatcher, key)  # registered while the turn still runs
        release.set()
        assert waiters[key].get(timeout=30)["status"] == "replied"
        await_condition(lambda: key in order, timeout=30, message="the delivered record was never appended")
        assert order[key] == "appended, then answered"
    finally:
        release.set()
        gw.stop()


# ── two gateways starting at once on one root ───────────────────────────────


def test_a_dead_journal_is_adopted_by_one_starting_gateway_only(tmp_path: Path) -> None:
    """B starts while A is between reading a dead journal and removing it: only one may adopt it."""
    directory = tmp_path / "journal"
    directory.mkdir(mode=0o700)
    key = _id(42)
    dead = directory / "j-deaddeaddeaddeaddeaddeaddeaddead.log"
    dead.write_bytes(_lines({"t": "accepted", "id": key, "d": _delivery(key)}))
    dead.chmod(0o600)
    a, b = Journal(directory, fsync=False), Journal(directory, fsync=False)
    real_write_now = a._write_now
    b_adopted: list[Any] = []

    def write_now(lines: list[bytes]) -> None:
        if not b_adopted:
            b_adopted.append(b.start())  # B's start lands inside A's adoption
        real_write_now(lines)

    a._write_now = write_now  # type: ignore[method-assign]
    try:
        a_adopted = a.start()
        assert b_adopted, "B started during A's adoption"
        owners = [j for j, folded in ((a, a_adopted), (b, b_adopted[0])) if key in folded.live()]
        assert len(owners) == 1, f"the dead journal was adopted {len(owners)} times: its DMs would run twice"
    finally:
        a.stop()
        if b_adopted:
            b.stop()
    assert not dead.exists()


def test_a_starting_journal_is_never_adopted_before_it_is_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B adopts while A has created its file but not locked it yet: A's file must survive."""
    directory = tmp_path / "journal"
    directory.mkdir(mode=0o700)
    a, b = Journal(directory, fsync=False), Journal(directory, fsync=False)
    real_flock = fcntl.flock
    started: list[Journal] = []

    def flock(fd: int, op: int) -> None:
        if not started:  # A's first lock call, on the file it has just created
            started.append(b)
            b.start()
        real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    try:
        a.start()
        assert started, "B started while A was starting"
        key = _id(43)
        a.append_durably({"t": "accepted", "id": key, "d": _delivery(key)})
        assert a.path.exists(), "A's journal was removed by B while A was starting"
        assert key in fold_records(_file_records(a.path)).states
    finally:
        a.stop()
        if started:
            b.stop()


def test_delivery_record_is_every_field_with_its_own_author_copy() -> None:
    from dataclasses import asdict

    from hermes_actors.core.acks import delivery_from_record, delivery_record
    from hermes_actors.messages import Delivery

    delivery = Delivery("d" * 32, "alice", "alice", "bob", "bob", "hi", author={"id": "bot:alice", "is_bot": True},
                        hop=2, accepted_at=12.5, label="@bob")
    record = delivery_record(delivery)
    assert record == asdict(delivery)
    record["author"]["id"] = "changed"
    assert delivery.author["id"] == "bot:alice"  # the journal's record never aliases the live delivery
    assert delivery_from_record(delivery_record(delivery)) == delivery


def test_a_journal_record_of_the_wrong_shape_is_skipped_and_the_rest_recovered(tmp_path: Path) -> None:
    """A hostile or corrupt line of valid JSON once stopped every start on the root."""
    root = make_root(tmp_path)
    directory = root / "bot_relay" / "journal"
    directory.mkdir(mode=0o700, parents=True)
    good, odd_attempt, no_fields = _id(1), _id(2), _id(3)
    foreign = directory / "j-0123456789abcdef0123456789abcdef.log"
    foreign.write_bytes(_lines(
        {"t": "accepted", "id": good, "d": _delivery(good)},
        {"t": "accepted", "id": odd_attempt, "d": _delivery(odd_attempt)},
        {"t": "started", "id": odd_attempt, "attempt": "two"},
        {"t": "accepted", "id": no_fields, "d": {"delivery_id": no_fields}},
    ))
    foreign.chmod(0o600)
    ran: list[str] = []
    with Gateway(root, runner=lambda turn: ran.append(turn.delivery_id) or "fine") as gw:
        assert gw.wait_outcome(good, timeout=10)["status"] == "replied"
        assert gw.wait_outcome(odd_attempt, timeout=10)["status"] == "ambiguous"  # started once: never re-run
        with pytest.raises(KeyError):
            gw.wait_outcome(no_fields, timeout=0.5)  # skipped, and the warning names it
    assert ran == [good]


def test_a_journal_record_whose_id_is_no_delivery_id_is_an_unreadable_line_never_run(
    tmp_path: Path, logs: LogCapture
) -> None:
    """An ``accepted`` record with the id ``../../../../tmp/pwn`` ran, its runner got that string as
    ``turn.delivery_id``: such a record is now a damaged line of its journal, which is quarantined, loudly."""
    root = make_root(tmp_path)
    directory = root / "bot_relay" / "journal"
    directory.mkdir(mode=0o700, parents=True)
    good, bad = _id(60), "../../../../tmp/pwn"
    foreign = directory / "j-0123456789abcdef0123456789abcdef.log"
    foreign.write_bytes(_lines(
        {"t": "accepted", "id": good, "d": _delivery(good)},
        {"t": "accepted", "id": bad, "d": {**_delivery(bad), "delivery_id": bad}},
    ))
    foreign.chmod(0o600)
    ran: list[str] = []
    with Gateway(root, runner=lambda turn: ran.append(turn.delivery_id) or "fine") as gw:
        assert gw.wait_outcome(good, timeout=10)["status"] == "replied"
    assert ran == [good]
    assert logs.matching(str(foreign), "had 1 unreadable line(s)"), logs.lines
    assert not foreign.exists() and list((root / "bot_relay" / "quarantine").glob("j-*.quarantined"))


@pytest.mark.parametrize(("record_id", "fields"), [
    (_id(61), {"delivery_id": _id(62)}),  # the delivery's id is not the record's
    (_id(63), {"target": "../../etc", "target_handle": "../x"}),
    (_id(64), {"sender": "../../x", "sender_handle": "../x", "wake": True}),
    (_id(65), {"hop": "x"}),
    (_id(66), {"hop": -1}),
    (_id(67), {"content": {"a": 1}}),
    (_id(68), {"author": [1, 2]}),
    (_id(69), {"accepted_at": "yesterday"}),
    (_id(70), {"session": "../../x\n"}),
    (_id(77), {"session": "../../../etc"}),  # the hermes runner's `-c <title>`: any titled session
    (_id(78), {"session": "Group: team"}),  # a room's turns are never journaled
    (_id(79), {"session": ["Bot Chat"]}),
    (_id(71), {"origin": "relay-in"}),
    (_id(72), {"wake": 1}),
], ids=["id-mismatch", "target-dotdot", "sender-dotdot", "hop-text", "hop-negative", "content-object",
        "author-list", "accepted-at-text", "session-newline", "session-dotdot", "session-room-title",
        "session-list", "origin-unknown", "wake-int"])
def test_a_journaled_delivery_with_a_hostile_field_is_skipped_never_run(
    tmp_path: Path, logs: LogCapture, record_id: str, fields: dict[str, Any]
) -> None:
    """The id and fields of an ``accepted`` record were trusted on recovery: a record with the id
    ``../../../../tmp/pwn`` ran, and the runner got that string as ``turn.delivery_id``."""
    root = make_root(tmp_path)
    directory = root / "bot_relay" / "journal"
    directory.mkdir(mode=0o700, parents=True)
    good = _id(60)
    foreign = directory / "j-0123456789abcdef0123456789abcdef.log"
    foreign.write_bytes(_lines(
        {"t": "accepted", "id": good, "d": _delivery(good)},
        {"t": "accepted", "id": record_id, "d": {**_delivery(record_id), **fields}},
    ))
    foreign.chmod(0o600)
    ran: list[str] = []
    with Gateway(root, runner=lambda turn: ran.append(turn.delivery_id) or "fine") as gw:
        assert gw.wait_outcome(good, timeout=10)["status"] == "replied"
        assert gw.recovered.get("unreadable") == 1, gw.recovered
    assert ran == [good]
    assert logs.matching("recovery: 1 journaled DM(s) skipped", repr(record_id)), logs.lines


def test_an_accepted_record_without_a_delivery_object_is_named_in_the_warning_never_run(
    tmp_path: Path, logs: LogCapture
) -> None:
    """``"d": "hello"`` or no ``d`` at all was dropped with no log line, while the other bad records of the
    same journal were named in the recovery warning: a sender acked for that DM never learned it was lost."""
    root = make_root(tmp_path)
    directory = root / "bot_relay" / "journal"
    directory.mkdir(mode=0o700, parents=True)
    good, text_d, no_d, bad_target = _id(80), _id(81), _id(82), _id(83)
    foreign = directory / "j-0123456789abcdef0123456789abcdef.log"
    foreign.write_bytes(_lines(
        {"t": "accepted", "id": good, "d": _delivery(good)},
        {"t": "accepted", "id": text_d, "d": "hello"},
        {"t": "accepted", "id": no_d},
        {"t": "accepted", "id": bad_target, "d": _delivery(bad_target, target="../../x")},
    ))
    foreign.chmod(0o600)
    ran: list[str] = []
    with Gateway(root, runner=lambda turn: ran.append(turn.delivery_id) or "fine") as gw:
        assert gw.wait_outcome(good, timeout=10)["status"] == "replied"
        assert gw.recovered.get("unreadable") == 3, gw.recovered
    assert ran == [good]
    assert logs.matching("recovery: 3 journaled DM(s) skipped", repr(text_d), repr(no_d), repr(bad_target)), logs.lines
    # the two lines are damage: the file is kept in quarantine for whoever must find out what they were
    assert logs.matching(str(foreign), "had 2 unreadable line(s)"), logs.lines
    assert not foreign.exists() and list((root / "bot_relay" / "quarantine").glob("j-*.quarantined"))


def test_unreadable_deliveries_names_an_accepted_record_without_a_delivery_object() -> None:
    from hermes_actors.core.recovery import readable_states

    folded = JournalFolded()
    bad = fold_lines(_lines(
        {"t": "accepted", "id": _id(84), "d": ["x"]},
        {"t": "accepted", "id": _id(85)},
        {"t": "accepted", "id": _id(86), "d": _delivery(_id(86))},
        {"t": "finished", "id": _id(87), "o": _outcome(_id(87))},  # an outcome alone: nothing to name
    ).splitlines(), folded)
    assert bad == 2 and folded.corrupt_lines == 2
    readable, unreadable = readable_states(folded.states)
    assert unreadable == [_id(84), _id(85)]
    assert set(readable) == {_id(86), _id(87)}


def test_unreadable_deliveries_names_a_bad_id_without_an_accepted_record() -> None:
    """An outcome alone under a forged id would be re-published to the subscribers as it stands."""
    from hermes_actors.core.recovery import unreadable_deliveries
    from hermes_actors.store.journal_records import DeliveryState

    states = {"../x": DeliveryState(outcome=_outcome("../x")), _id(73): DeliveryState(outcome=_outcome(_id(73))),
              # delivered: recovery rebuilds nothing of it, so a bad delivery object there is no skipped DM
              _id(74): DeliveryState(delivery={"target": "../../x"}, outcome=_outcome(_id(74)), delivered=True)}
    assert unreadable_deliveries(states) == ["../x"]


def test_delivery_problem_accepts_what_the_live_path_journals() -> None:
    """Every kind of delivery a gateway journals passes (a room turn's blank sender, a wake's too)."""
    from hermes_actors.core.acks import delivery_problem, delivery_record
    from hermes_actors.messages import Delivery

    kinds = [
        Delivery(_id(74), "alice", "alice", "bob", "bob", "Message from alice: hi", hop=1, accepted_at=1.5, wake=True),
        Delivery(_id(75), "", "moxie on mini", "default", "hermes", "Reply from @moxie: ok", origin="wake",
                 label="@hermes"),
        Delivery(_id(76), "writer", "moxie", "bob", "bob", "relayed", author={"id": "bot:writer"}, hop=3,
                 accepted_at=10, origin="relay", label="@bob"),
    ]
    assert [delivery_problem(delivery_record(d), d.delivery_id) for d in kinds] == [None, None, None]


_LONGEST_HEADER = f"Message from 🤖 {'N' * 120} (@{'h' * 64}): "


@pytest.mark.parametrize(("origin", "handle", "content", "says"), [
    ("local", "h" * 64, _LONGEST_HEADER + "x" * 16000, None),  # the longest DM the live path journals
    ("local", "h" * 64, _LONGEST_HEADER + "x" * 16001, "content: message too long (16001 chars > 16000)"),
    ("recovered", "hermes", "Message from 🤖 default (@hermes): " + "x" * 16001, "message too long (16001 chars"),
    ("local", "hermes", "x" * 16000, None),
    ("local", "hermes", "x" * 16001, "message too long (16001 chars"),  # no header: held to the rule whole
    # a display name holding the header's tail: the header still ends at its last one, the body is not longer
    ("local", "alice", "Message from 🤖 me (@alice): x (@alice): " + "x" * 16000, None),
    ("local", "hermes", "Message from 🤖 default (@hermes): " + "x" * 5_000_000, "message too long (5000000 chars"),
    ("relay", "moxie", "x" * 32000, None),
    ("relay", "moxie", "x" * 32001, "content: the envelope's 'message' is too long (32001 > 32000 chars)"),
    ("wake", "hermes", "Reply from @bob: " + "x" * (60 * 1024), None),
    ("wake", "hermes", "x" * (80 * 1024 + 1), "wake text too long (81921 bytes > 81920)"),
])
def test_delivery_problem_holds_the_journaled_text_to_its_origins_length_rule(
    origin: str, handle: str, content: str, says: str | None
) -> None:
    """Regression (hostile-files review): a dead journal's `accepted` record with a 5 MB message was re-offered by
    `serve` and its turn ran with 5,000,037 characters, past the 16,000 every live DM is held to."""
    from hermes_actors.core.acks import delivery_problem

    record = {**_delivery(_id(90)), "sender_handle": handle, "content": content, "origin": origin}
    problem = delivery_problem(record, _id(90))
    assert (problem is None) if says is None else (problem is not None and says in problem), problem


def test_a_journaled_dm_longer_than_the_live_path_allows_is_skipped_loudly_never_run(
    tmp_path: Path, logs: LogCapture
) -> None:
    """Regression (hostile-files review): a dead journal j-….log with one `accepted` record for bob holding a
    5 MB message: the start re-offered it and the turn ran with 5,000,037 characters. It is refused now as the
    records with other bad fields are: skipped, named in the recovery warning, never run."""
    root = make_root(tmp_path)
    directory = root / "bot_relay" / "journal"
    directory.mkdir(mode=0o700, parents=True)
    good, huge = _id(91), _id(92)
    dead = directory / "j-0123456789abcdef0123456789abcdef.log"
    dead.write_bytes(_lines(
        {"t": "accepted", "id": huge, "d": {**_delivery(huge), "content": "Message from 🤖 default (@hermes): "
                                                                         + "x" * 5_000_000}},
        {"t": "accepted", "id": good, "d": _delivery(good)},
    ))
    dead.chmod(0o600)
    ran: list[tuple[str, int]] = []
    with Gateway(root, runner=lambda turn: ran.append((turn.delivery_id, len(turn.content))) or "fine") as gw:
        assert gw.wait_outcome(good, timeout=10)["status"] == "replied"
        assert gw.recovered.get("unreadable") == 1, gw.recovered
    assert [key for key, _ in ran] == [good]
    assert logs.matching("recovery: 1 journaled DM(s) skipped", repr(huge)), logs.lines


def test_a_journal_is_compacted_once_it_grew_by_compact_after_bytes_however_few_its_lines(tmp_path: Path) -> None:
    """Lines alone bound no size (each may hold up to 64 MiB): a file is compacted once it grew by
    ``compact_after_bytes`` too, so a gateway's own file stays under the size past which a start refuses a journal
    (MAX_JOURNAL_BYTES). Before, 50,000 lines of large outcomes could grow it to many GiB."""
    journal = Journal(tmp_path / "journal", fsync=False)
    journal.compact_after_bytes = 64 << 10
    journal.start()
    try:
        for n in range(40):  # 120 lines of ~4 KiB, far under compact_after (50,000 lines)
            key = _id(n)
            journal.append_durably({"t": "accepted", "id": key, "d": {**_delivery(key), "content": "x" * 4096}})
            journal.append_durably({"t": "finished", "id": key, "o": _outcome(key, "r" * 64)})
            journal.append_durably({"t": "delivered", "id": key})
        await_condition(lambda: journal.compactions >= 1, timeout=30)
    finally:
        journal.stop()
    assert len(journal.path.read_bytes().rstrip(b"\0")) < 128 << 10  # ~490 KiB appended in all
    folded = fold_records(_file_records(journal.path))
    assert all(folded.states[_id(n)].delivered for n in range(40))  # every outcome still kept (small)


def test_a_file_written_whole_keeps_of_each_bin_only_the_newest_outcomes_that_fit_its_budget() -> None:
    """Delivered outcomes are kept only for wait_outcome after a restart: 10,000 of 4 MiB replies would carry a
    compacted file past MAX_JOURNAL_BYTES, which a start refuses. The oldest that do not fit are left out."""
    from hermes_actors.store.journal_records import KEPT_OUTCOMES_BYTES
    from hermes_actors.store.journal_state import _newest_within

    kept = [(_id(n), DeliveryState(outcome=_outcome(_id(n), "r" * 1000), delivered=True)) for n in range(5)]
    one = sum(len(encode_record(r)) for r in state_records(_id(0), kept[0][1]))
    lines = _newest_within(kept, budget=3 * one)
    assert [orjson.loads(line)["id"] for line in lines] == [_id(n) for n in (2, 2, 3, 3, 4, 4)]
    assert _newest_within(kept, budget=one - 1) == []
    assert len(_newest_within(kept)) == 10 and KEPT_OUTCOMES_BYTES == 64 << 20


def test_compaction_stays_in_the_journal_directory_when_its_parent_is_swapped_for_a_symlink(tmp_path: Path) -> None:
    """Its temp and rename went by path: a bot_relay/ swapped meanwhile received the compacted journal."""
    import shutil

    base = tmp_path / "bot_relay"
    journal = Journal(base / "journal", fsync=False)
    journal.compact_after = 20
    journal.keep_delivered = 5
    journal.start()
    name = journal.path.name
    real = tmp_path / "real"
    elsewhere = tmp_path / "elsewhere"
    try:
        journal.append_durably({"t": "accepted", "id": _id(1), "d": _delivery(_id(1))})
        base.rename(real)  # the real directory moves away (our open directory goes with it) ...
        shutil.copytree(real, elsewhere)  # ... and a look-alike takes its place behind a symlink
        (elsewhere / "journal" / name).unlink()
        base.symlink_to(elsewhere, target_is_directory=True)
        for n in range(10, 30):
            key = _id(n)
            journal.append_durably({"t": "accepted", "id": key, "d": _delivery(key)})
            journal.append_durably({"t": "finished", "id": key, "o": _outcome(key, "r")})
            journal.append_durably({"t": "delivered", "id": key})
        assert journal.compactions >= 1
    finally:
        journal.stop()
    assert sorted(p.name for p in (elsewhere / "journal").iterdir()) == []  # nothing written through the link
    folded = fold_records(_file_records(real / "journal" / name))
    assert folded.states[_id(1)].delivery == _delivery(_id(1))


def test_a_damaged_record_in_the_middle_is_skipped_loudly_and_the_rest_adopted(
    tmp_path: Path, warnings: list[str]
) -> None:
    directory = tmp_path / "journal"
    directory.mkdir(mode=0o700)
    first, damaged, last = _id(1), _id(2), _id(3)
    dead = directory / "j-deadbeefdeadbeefdeadbeefdeadbeef.log"
    good = _lines({"t": "accepted", "id": damaged, "d": _delivery(damaged)})
    dead.write_bytes(
        _lines({"t": "accepted", "id": first, "d": _delivery(first)})
        + good.replace(b'{"t"', b'{Xt"', 1)  # one flipped byte
        + _lines({"t": "accepted", "id": last, "d": _delivery(last)})
    )
    dead.chmod(0o600)
    journal = Journal(directory, fsync=False)
    try:
        adopted = journal.start()
        assert set(adopted.live()) == {first, last} and adopted.corrupt_lines == 1
    finally:
        journal.stop()
    assert not dead.exists()
    assert len(list((tmp_path / "quarantine").iterdir())) == 1
    assert any(dead.name in w and "unreadable" in w for w in warnings), warnings


def test_a_journal_line_longer_than_the_limit_is_read_in_bounded_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hostile journal of one endless line costs bounded reads, never the whole file in memory."""
    import hermes_actors.store.journal_adoption as journal_adoption
    import hermes_actors.store.journal_records as journal_records

    monkeypatch.setattr(journal_records, "MAX_LINE_BYTES", 1024)
    directory = tmp_path / "journal"
    directory.mkdir(mode=0o700)
    kept = _id(7)
    dead = directory / "j-deadbeefdeadbeefdeadbeefdeadbeef.log"
    dead.write_bytes(b"x" * 50_000 + b"\n" + _lines({"t": "accepted", "id": kept, "d": _delivery(kept)}))
    dead.chmod(0o600)
    reads: list[int] = []
    real_read_lines = journal_records.read_lines

    def counting(stream: Any) -> Any:
        for line in real_read_lines(stream):
            reads.append(0 if line is None else len(line))
            yield line

    monkeypatch.setattr(journal_adoption, "read_lines", counting)  # where adoption reads dead journals
    journal = Journal(directory, fsync=False)
    try:
        adopted = journal.start()
        assert set(adopted.live()) == {kept} and adopted.corrupt_lines == 1
    finally:
        journal.stop()
    assert reads[0] == 0 and max(reads) <= 1024  # the long line came back as "refused", never whole


# ── interrupts: an exception of the caller's own (a signal handler's KeyboardInterrupt) breaks nothing ──


class _Interrupts:
    """A SIGUSR1 handler raising KeyboardInterrupt in the main thread (restored by ``close``).

    Args:
        once: raise at the first signal only (later ones do nothing), for :meth:`interrupt_main_until_raised`.
    """

    def __init__(self, *, once: bool = False) -> None:
        self.once = once
        self.raised = threading.Event()
        self.previous = signal.signal(signal.SIGUSR1, self._raise)

    def _raise(self, signum: int, frame: Any) -> None:
        if self.once and self.raised.is_set():
            return
        self.raised.set()
        raise KeyboardInterrupt

    @staticmethod
    def interrupt_main() -> None:
        """Deliver SIGUSR1 to the main thread: its handler runs there at once (inside whatever it waits in)."""
        ident = threading.main_thread().ident
        assert ident is not None
        signal.pthread_kill(ident, signal.SIGUSR1)

    def interrupt_main_until_raised(self, timeout: float = 30.0) -> None:
        """Signal the main thread until its handler has raised (with ``once``).

        A signal that lands just before the main thread blocks in a lock's wait runs its handler only when
        that wait ends (no EINTR: it came before the wait): the next signal interrupts the wait, and the
        handler of the first runs then.
        """
        deadline = time.monotonic() + timeout
        while not self.raised.wait(0.05):
            assert time.monotonic() < deadline, "the main thread's handler never ran"
            self.interrupt_main()

    def close(self) -> None:
        signal.signal(signal.SIGUSR1, self.previous)


def _accepted(n: int) -> dict[str, Any]:
    return {"t": "accepted", "id": _id(n), "d": _delivery(_id(n))}


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs signal.pthread_kill")
def test_the_main_thread_never_commits_so_an_interrupt_there_breaks_nothing(tmp_path: Path) -> None:
    # Regression (review of the embedding API): the main thread led the group commit of its own DM, so
    # a KeyboardInterrupt delivered there landed inside the commit (EBADF on every later commit, a
    # stop 50 s over its time). Now the writer commits; the interrupt ends the caller's wait only.
    journal = Journal(tmp_path / "journal", fsync=True)
    journal.start()
    interrupts = _Interrupts(once=True)
    spy = WriteSpy(journal, hold_first=True)
    fates: list[BaseException | None] = []
    told = threading.Event()

    def fate(error: BaseException | None) -> None:
        fates.append(error)
        told.set()

    def interrupt_once_the_commit_holds_it() -> None:
        assert spy.entered.wait(30), "no commit took the record"
        interrupts.interrupt_main_until_raised()

    kicker = threading.Thread(target=interrupt_once_the_commit_holds_it)
    kicker.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            journal.append_durably(_accepted(1), timeout=60, on_interrupt=fate)
        assert not told.is_set(), "told before its commit ended"
        spy.gate.set()
        assert told.wait(30), "the interrupted caller's record was never given its fate"
        assert fates == [None], "a commit held it: it landed"
        journal.append_durably(_accepted(2), timeout=30)  # the journal works on, for the main thread too
        _on_a_thread("leader", lambda: journal.append_durably(_accepted(3), timeout=30))
    finally:
        kicker.join(timeout=30)
        spy.gate.set()
        interrupts.close()
        journal.stop()
    assert {name for name, _ in spy.writes[:2]} == {"journal-writer"}, spy.writes
    assert spy.writes[2] == ("leader", 1), "an actor's thread still commits its own record"
    assert [r["id"] for r in _file_records(journal.path)] == [_id(1), _id(2), _id(3)]


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs signal.pthread_kill")
def test_a_handlers_send_as_the_main_threads_stop_is_handed_over_is_journaled_but_never_committed_there(
    tmp_path: Path,
) -> None:
    # The one production caller left on the main thread (Journal.append_durably): the main thread's stop()
    # closes the gateway's call thread as it hands the stop over (facade/off_main.py), and until the stop
    # begins the gateway still runs, so a signal handler's message_agent meanwhile runs on the main thread
    # itself and journals its acceptance there. The writer thread commits it, never the main thread.
    gw = Gateway(make_root(tmp_path), runner=lambda turn: "ok").start()
    journal = gw._journal
    assert journal is not None
    main = threading.main_thread()
    appended_on: list[str] = []
    written_by: list[str] = []
    real_append, real_write = journal.append_durably, journal._write_now

    def append_durably(record: dict[str, Any], timeout: float = 30.0, **kwargs: Any) -> None:
        appended_on.append(threading.current_thread().name)
        real_append(record, timeout, **kwargs)

    def write_now(lines: list[bytes], *, flush: bool = True) -> None:
        if any(b'"t":"accepted"' in line for line in lines):
            written_by.append(threading.current_thread().name)
        real_write(lines, flush=flush)

    journal.append_durably = append_durably  # type: ignore[method-assign]
    journal._write_now = write_now  # type: ignore[method-assign]
    began: list[bool] = []
    sent: list[dict[str, Any] | BaseException] = []
    handled = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        if began:  # a later signal of the kicker's, while this handler runs: one send
            return
        began.append(True)
        try:
            sent.append(gw.message_agent(sender="alice", target="bob", message="from the handler"))
        except BaseException as exc:  # asserted below
            sent.append(exc)
        handled.set()

    real_begin = gw._lifecycle.begin_stop

    def begin_stop() -> bool:  # on the call thread: the main thread waits for this stop, the call thread closed
        deadline = time.monotonic() + 30
        while not handled.wait(0.05):  # again until it ran: one that lands before the main thread's wait waits
            assert time.monotonic() < deadline, "the main thread's handler never ran"
            assert main.ident is not None
            signal.pthread_kill(main.ident, signal.SIGUSR1)
        return real_begin()

    gw._lifecycle.begin_stop = begin_stop  # type: ignore[method-assign]
    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        gw.stop(10)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    (ack,) = sent
    assert isinstance(ack, dict) and "delivery_id" in ack, ack
    assert appended_on[0] == main.name, "the handler's send journaled its acceptance on the main thread"
    assert written_by and main.name not in written_by, written_by
    assert ack["delivery_id"] in {r["id"] for r in _file_records(journal.path)}


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs signal.pthread_kill")
def test_a_send_from_a_signal_handler_during_the_main_threads_own_send_does_not_wait_on_itself(
    tmp_path: Path,
) -> None:
    # Regression (review): the handler ran inside the commit its own interrupted frame led and waited
    # for that commit until its timeout (30 s per handler call). Asserted as who committed what, not as how
    # long the handler waited: the writer thread commits both records, so the handler's send waits on a
    # commit that runs (one the main thread led could not go on until the handler returned: the handler's
    # send would end with the timeout's error, not land).
    journal = Journal(tmp_path / "journal", fsync=True)
    journal.start()
    handled: list[BaseException | None] = []

    def handler(signum: int, frame: Any) -> None:
        try:
            journal.append_durably(_accepted(2), timeout=20)
            handled.append(None)
        except BaseException as exc:
            handled.append(exc)

    previous = signal.signal(signal.SIGUSR1, handler)
    real = journal._write_now
    committed_by: list[str] = []

    def write_now(lines: list[bytes], *, flush: bool = True) -> None:
        committed_by.append(threading.current_thread().name)
        if len(committed_by) == 1:  # the first commit: the main thread's record
            _Interrupts.interrupt_main()
        real(lines, flush=flush)

    journal._write_now = write_now  # type: ignore[method-assign]
    try:
        journal.append_durably(_accepted(1), timeout=30)
    finally:
        signal.signal(signal.SIGUSR1, previous)
        journal.stop()
    assert handled == [None], handled
    assert committed_by and set(committed_by) == {"journal-writer"}, f"committed by {committed_by}"
    assert sorted(r["id"] for r in _file_records(journal.path)) == [_id(1), _id(2)]


def test_a_send_from_a_signal_handler_that_interrupted_the_journal_itself_is_refused_at_once(
    tmp_path: Path,
) -> None:
    # The handler runs while its thread holds the journal's lock: the writer could never take its record
    # (it needs that lock), so it would wait its whole timeout. It is refused at once, nothing queued.
    journal = Journal(tmp_path / "journal", fsync=False)
    journal.start()
    handled: list[BaseException | None] = []

    def handler(signum: int, frame: Any) -> None:
        try:
            journal.append_durably(_accepted(2), timeout=30)
            handled.append(None)
        except BaseException as exc:
            handled.append(exc)

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        with journal._cond:  # where the main thread's own send was when the signal came
            signal.raise_signal(signal.SIGUSR1)
        journal.append_durably(_accepted(3), timeout=30)
    finally:
        signal.signal(signal.SIGUSR1, previous)
        journal.stop()
    # The refusal itself, not how soon it came, proves the send did not wait: it is raised before anything is
    # queued, and a send that had queued and waited would end with the timeout's error ("did not confirm").
    assert len(handled) == 1 and isinstance(handled[0], StoreError), handled
    assert "signal handler" in str(handled[0]) and "nothing was queued" in str(handled[0]), handled[0]
    assert [r["id"] for r in _file_records(journal.path)] == [_id(3)]


@pytest.mark.parametrize("point", ["fdatasync", "fstat"])
def test_a_commit_interrupted_in_its_leader_tells_every_waiter_the_truth_and_the_journal_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    # A BaseException raised inside a leading caller's commit: at the sync (the batch is refused and cut
    # back) or at the check of the file's path after the write (the batch landed). Either way the leader
    # alone gets the exception, the batch's other waiter the batch's true result, later commits work,
    # and a compaction keeps every record a waiter was told landed.
    journal = Journal(tmp_path / "journal", fsync=True)
    spy, callers = _a_stalled_commit(journal)
    real = getattr(os, point)
    armed = [True]

    def interrupted(*args: Any) -> Any:
        if armed[0] and threading.current_thread().name == "leader":
            armed[0] = False
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(os, point, interrupted)
    leader, other = Appenders(journal), Appenders(journal)
    outcome: dict[str, BaseException | None] = {}
    try:
        leader.start(2, name="leader")
        await_condition(lambda: journal._batch.leader, timeout=30, message="the leader never queued")
        other.start(3, name="other")
        await_condition(lambda: len(journal._batch.items) == 2, timeout=30, message="the other never queued")
        spy.gate.set()
        callers.join()
        for name, appenders in (("leader", leader), ("other", other)):
            (thread,) = appenders.threads
            thread.join(timeout=30)
            assert not thread.is_alive(), f"{name} never returned"
            outcome[name] = appenders.errors[0] if appenders.errors else None
        assert isinstance(outcome["leader"], KeyboardInterrupt), outcome
        journal.compact_after = 0  # the writer's next commit rewrites the file from the live state
        _on_a_thread("next", lambda: journal.append_durably(_accepted(4), timeout=30))
        journal.append_durably(_accepted(5), timeout=30)
        await_condition(lambda: journal.compactions > 0, timeout=30, message="no compaction ran")
    finally:
        spy.gate.set()
        journal.stop()
    ids = [r["id"] for r in _file_records(journal.path)]
    if point == "fdatasync":
        assert isinstance(outcome["other"], StoreError), outcome
        assert _id(2) not in ids and _id(3) not in ids, "a refused batch must not be found by a start"
    else:
        assert outcome["other"] is None, outcome
        assert _id(3) in ids, "acked, then lost at compaction"
    assert _id(1) in ids and _id(4) in ids and _id(5) in ids, ids


def test_a_compaction_whose_write_falls_short_still_swaps_in_every_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write may write less than asked, to a regular file too (a disk filling up part-way, a file size limit).
    The compaction (and the rewrite of a lost file) wrote the new file with one ``os.write``: a short one swapped in
    a torn file, its last record cut and the ones after it gone, and the journal counted them as written. Every
    write of the journal's now goes on until all of it is written (or raises, and the old file stays)."""
    directory = tmp_path / "journal"
    directory.mkdir(mode=0o700)
    journal_file = JournalFile(directory / "j-1.log", fsync=False)
    journal_file.open()
    records = [{"t": "accepted", "id": _id(n), "d": _delivery(_id(n))} for n in range(5)]
    lines = [orjson.dumps(record) + b"\n" for record in records]
    real_write, real_pwrite = os.write, os.pwrite

    def short(data: Any) -> Any:
        return memoryview(data)[:7]  # at most 7 bytes a call, as a filling disk may take

    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, short(data) if fd > 2 else data))
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: real_pwrite(fd, short(data), offset))
    try:
        journal_file.write(lines[:2], flush=False)
        journal_file.replace_with(lines)  # what compaction writes: the whole live state
        journal_file.write([orjson.dumps({"t": "delivered", "id": _id(0)}) + b"\n"], flush=False)
    finally:
        monkeypatch.undo()
        journal_file.close()
    assert _file_records(journal_file.path) == [*records, {"t": "delivered", "id": _id(0)}]


def test_a_journal_file_closed_by_an_interrupted_close_is_never_closed_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "journal"
    directory.mkdir(mode=0o700)
    journal_file = JournalFile(directory / "j-1.log", fsync=False)
    journal_file.open()
    closed: list[int] = []
    real_close = os.close

    def close(fd: int) -> None:
        closed.append(fd)
        real_close(fd)
        if len(closed) == 1:
            raise KeyboardInterrupt  # right after the file's descriptor was closed

    monkeypatch.setattr(os, "close", close)
    with pytest.raises(KeyboardInterrupt):
        journal_file.close()
    journal_file.close()  # the stop goes on: only what is still open is closed
    monkeypatch.undo()
    assert len(closed) == len(set(closed)) == 2, f"a descriptor closed twice: {closed}"
    assert journal_file.fd is None


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs signal.pthread_kill")
def test_a_send_interrupted_after_its_acceptance_was_committed_still_runs_and_the_gateway_goes_on(
    tmp_path: Path,
) -> None:
    # The caller never got the ack, but its acceptance is journaled: the DM runs now (not only at the next
    # start), and the gateway, its journal and its stop work on (docs/reliability.md, "Failure paths").
    ran: list[str] = []
    gw = Gateway(make_root(tmp_path), runner=lambda turn: ran.append(turn.content) or "ok").start()
    journal = gw._journal
    assert journal is not None
    interrupts = _Interrupts()
    real = journal._write_now
    armed = [True]

    def write_now(lines: list[bytes], *, flush: bool = True) -> None:
        if armed[0] and any(b'"t":"accepted"' in line for line in lines):
            armed[0] = False
            _Interrupts.interrupt_main()  # the sender is interrupted while its acceptance is being written
        real(lines, flush=flush)

    journal._write_now = write_now  # type: ignore[method-assign]
    drained: list[bool] = []
    real_drain = journal.drain

    def drain(timeout: float) -> bool:
        done = real_drain(timeout)
        drained.append(done)
        return done

    journal.drain = drain  # type: ignore[method-assign]
    writer = journal._thread
    assert writer is not None
    writer_ended: list[bool] = []
    real_join = writer.join

    def join(timeout: float | None = None) -> None:
        real_join(timeout)
        writer_ended.append(not writer.is_alive())

    writer.join = join  # type: ignore[method-assign]
    try:
        with pytest.raises(KeyboardInterrupt):
            gw.message_agent(sender="alice", target="bob", message="interrupted")
        ack = gw.message_agent(sender="alice", target="bob", message="next")
        assert gw.wait_outcome(ack["delivery_id"], 30)["status"] == "replied"
        await_condition(lambda: sorted(text.rsplit(": ", 1)[-1] for text in ran) == ["interrupted", "next"], timeout=30,
                        message=f"the interrupted, journaled DM never ran: {ran}")
    finally:
        interrupts.close()
        gw.stop(10)
    # Each wait of the stop on the journal ended because the journal was done, not because its time ran out (a
    # journal left broken: its last commits never drain, its writer never ends, a commit is left running).
    assert drained == [True], "the stop's drain ran out of time on a journal left broken"
    assert writer_ended == [True], "the stop's join of the journal's writer ran out of time"
    assert journal._file.fd is None, "the journal's stop gave up on a commit still running"


def _unretired_dead_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A dead gateway's journal (one never-started DM) that adoption can neither remove nor move aside.

    Returns:
        The journal directory and the dead file.
    """
    directory = tmp_path / "bot_relay" / "journal"
    directory.mkdir(parents=True, mode=0o700)
    dead = directory / f"j-{_id(99)}.log"
    dead.write_bytes(_lines({"t": "accepted", "id": _id(1), "d": _delivery(_id(1))}))
    real_unlink = os.unlink

    def unlink(path: Any, *args: Any, **kwargs: Any) -> None:  # by name, relative to journal/'s descriptor
        if Path(path).name == dead.name:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(path))
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    return directory, dead


def _flock_free(path: Path) -> bool:
    """Whether another open file (another gateway's) could take ``path``'s flock now."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_a_stop_that_leaves_a_running_commit_to_close_the_file_frees_the_unretired_files_when_it_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review adoptleft: an adopted file that could not be retired keeps our flock while we run; its descriptor was
    closed by ``stop`` only when no commit was running, never when the stop left the running commit to close the
    file, so its flock stayed with the process for good (no gateway on the root adopted it again). It goes now with
    our file, whoever closes it."""
    directory, dead = _unretired_dead_journal(tmp_path, monkeypatch)
    journal = Journal(directory, fsync=False)
    journal.stop_wait = 0.2  # the stop's give-up deadline, not a synchronization
    assert journal.start().states.keys() == {_id(1)}
    assert not _flock_free(dead)  # held while we run
    writing, release = threading.Event(), threading.Event()
    real_write = journal._file.write

    def held_write(lines: list[bytes], *, flush: bool = True) -> None:
        writing.set()
        assert release.wait(60)
        real_write(lines, flush=flush)

    monkeypatch.setattr(journal._file, "write", held_write)
    appender = threading.Thread(target=journal.append_durably,
                                args=({"t": "started", "id": _id(1), "attempt": 1},))
    appender.start()
    try:
        assert writing.wait(30), "no commit began"
        with LogCapture("ERROR") as logs:
            journal.stop()  # gives up on the running commit: it closes the file when it ends
        assert logs.matching("a journal commit is still running after"), logs.lines
        assert not _flock_free(dead)  # nothing is closed under a running commit
    finally:
        release.set()
        appender.join(30)
    await_condition(lambda: journal._file.fd is None, timeout=30, message="the file was closed after the commit")
    assert _flock_free(dead)
    assert journal._held_files == []


def test_a_failed_journal_start_frees_the_unretired_files_it_adopted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review adoptleft: a start that failed after its adoption kept our file and the unretired files' flocks open
    with nobody to close them (the journal never ran, so no stop closes them). The failed start closes them."""
    from hermes_actors.store import journal as journal_module

    directory, dead = _unretired_dead_journal(tmp_path, monkeypatch)

    class NoThread(threading.Thread):
        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    monkeypatch.setattr(journal_module.threading, "Thread", NoThread)
    journal = Journal(directory, fsync=False)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        journal.start()
    assert _flock_free(dead)
    assert journal._file.fd is None and journal._held_files == []


def test_a_stop_that_gives_up_on_a_running_adoption_has_the_file_and_the_held_ones_closed_once_it_hands_the_turn_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review followfix suspected that a stop giving up while a running adoption (``adopt_dead``, the relay's thread)
    held the write turn left our file and the unretired files' descriptors (their flocks) open for the life of the
    process: the adoption hands the turn back without looking at ``_close_after_commit``. It does not: the hand-back
    wakes the writer thread (the stop is due work), which closes them. This keeps it so."""
    directory, dead = _unretired_dead_journal(tmp_path, monkeypatch)
    journal = Journal(directory, fsync=False)
    journal.stop_wait = 0.2  # the stop's give-up deadline, not a synchronization
    assert journal.start().states.keys() == {_id(1)}
    assert not _flock_free(dead)  # held while we run
    second = directory / f"j-{_id(98)}.log"  # another gateway's, dead since our start: adopted at a rescan
    second.write_bytes(_lines({"t": "accepted", "id": _id(2), "d": _delivery(_id(2))}))
    adopting, release = threading.Event(), threading.Event()
    real_adopt = journal._adopt_running

    def held_adopt(dead_journals: Any) -> JournalFolded | None:
        adopting.set()
        assert release.wait(60)
        return real_adopt(dead_journals)

    monkeypatch.setattr(journal, "_adopt_running", held_adopt)
    adopted: list[JournalFolded | None] = []
    relay = threading.Thread(target=lambda: adopted.append(journal.adopt_dead()), name="relay")
    relay.start()
    try:
        assert adopting.wait(30), "no adoption began"
        with LogCapture("ERROR") as logs:
            journal.stop()  # gives up on the adoption holding the turn: the file closes when it hands it back
        assert logs.matching("a journal commit is still running after"), logs.lines
        assert not _flock_free(dead)  # nothing is closed under the adoption
    finally:
        release.set()
        relay.join(30)
    assert not relay.is_alive()
    # the writer thread closes our file, then the held ones: wait for all of it (the flock is free only after)
    await_condition(lambda: journal._file.fd is None and journal._held_files == [] and _flock_free(dead),
                    timeout=30, message="the file and the held ones were closed after the adoption")


@pytest.mark.parametrize(
    ("kind", "records"),
    [
        ("finished", [{"t": "finished"}]),
        ("forget", [{"t": "finished"}]),
        ("kept", [{"t": "finished"}, {"t": "delivered"}]),  # a peer DM's: published already
        ("relayed-in", [{"t": "finished", "origin": "relay"}, {"t": "delivered"}]),  # answered through the relay
    ],
)
def test_outcome_records_of_each_token_kind(kind: str, records: list[dict[str, Any]]) -> None:
    key = "c" * 32
    outcome = outcomes.from_reply(key, "@bob", "hi")
    written = outcome_records(kind, outcome)
    assert [{k: v for k, v in r.items() if k in ("t", "origin")} for r in written] == records
    assert all(r["id"] == key for r in written) and written[0]["o"] == outcome.as_dict()
    state = fold_records(written).states[key]  # a relayed-in DM's outcome reads back as one, even with no accepted
    assert delivery_origin(state) == ("relay" if kind == "relayed-in" else None)
