"""Outcome look-ups in a root's journal files: each file folded once, then only what was appended.

Regression (chaos review kq.py, finding 5): ``Gateway.wait_outcome(id)`` of an id the gateway
does not hold folded every journal file of the root anew at each call (35–57 ms on a 4 MB
journal; a gateway with a 6.4 MB journal spent 6.5 min of CPU on such look-ups), and so did each
poll of ``hermes-actors outcome --wait``. The reads are counted here, never timed.
"""

from __future__ import annotations

import os
import random
import re
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from roots import RecordingRunner, make_root, send_dm

from hermes_actors import Gateway
from hermes_actors.cli import ops_commands
from hermes_actors.cli.main import main
from hermes_actors.local.outcome_book import SETTLED_KEEP
from hermes_actors.ops.journal_index import JournalIndex, journal_dir
from hermes_actors.ops.journal_view import find_outcome, read_journals
from hermes_actors.records import RemoteAgent
from hermes_actors.store.journal import Journal
from hermes_actors.store.journal_file import JournalFile
from hermes_actors.store.journal_records import DeliveryState, fold_records, state_records
from hermes_actors.store.journal_state import JournalState
from hermes_actors.store.relay_files import enqueue_envelope
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.store.relay_protocol import make_envelope

# ── helpers ─────────────────────────────────────────────────────────────────


def _id(n: int) -> str:
    return f"{n:032x}"


def _delivery(key: str) -> dict[str, Any]:
    return {
        "delivery_id": key, "sender": "alice", "sender_handle": "alice", "target": "bob", "target_handle": "bob",
        "content": f"Message from 🤖 alice (@alice): {key} " + "x" * 300, "author": {}, "hop": 1,
        "accepted_at": 1.0, "origin": "local", "label": "@bob",
    }


def _outcome(key: str, reply: str = "done") -> dict[str, Any]:
    return {"delivery_id": key, "status": "replied", "reply": reply, "error": "", "reason": "",
            "retryable": False, "from": "@bob", "text": f"Reply from @bob: {reply}"}


def _line(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record) + b"\n"


def _accepted(key: str) -> bytes:
    return _line({"t": "accepted", "id": key, "d": _delivery(key)})


def _settled(key: str, reply: str = "done") -> list[bytes]:
    """The lines of a DM accepted, run, answered and delivered."""
    return [_accepted(key), _line({"t": "started", "id": key, "attempt": 1}),
            _line({"t": "finished", "id": key, "o": _outcome(key, reply)}), _line({"t": "delivered", "id": key})]


def _journal(root: Path, name: str = "a") -> JournalFile:
    """A gateway's journal file on ``root`` (allocated ahead and appended to as a gateway's is), open."""
    directory = journal_dir(root)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    journal = JournalFile(directory / f"j-{name}.log", fsync=False)
    journal.open()
    return journal


def _settled_journal(root: Path, count: int, first: int = 1) -> list[str]:
    """A dead gateway's closed journal of ``count`` settled DMs; their ids."""
    journal = _journal(root, "dead")
    keys = [_id(n) for n in range(first, first + count)]
    journal.write([line for key in keys for line in _settled(key)], flush=False)
    journal.close()
    return keys


_JOURNAL_NAME = re.compile(r"/j-[^/]*\.log")


@pytest.fixture
def journal_reads(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Bytes read so far from journal files (``j-*.log``): through a stream ``os.fdopen`` gives, ``os.pread`` or
    ``os.read``, whichever a reader of the journals uses."""
    read = [0]

    def journal(fd: int) -> bool:
        try:
            return _JOURNAL_NAME.search(os.readlink(f"/proc/self/fd/{fd}")) is not None
        except OSError:
            return False

    class Counted:
        def __init__(self, stream: Any) -> None:
            self._stream = stream

        def __enter__(self) -> Counted:
            self._stream.__enter__()
            return self

        def __exit__(self, *exc: object) -> Any:
            return self._stream.__exit__(*exc)

        def __iter__(self) -> Iterator[bytes]:
            for line in self._stream:
                read[0] += len(line)
                yield line

        def __getattr__(self, name: str) -> Any:
            attribute = getattr(self._stream, name)
            if name not in ("read", "readline", "readlines", "read1"):
                return attribute

            def counted(*args: Any) -> Any:
                data = attribute(*args)
                read[0] += len(data) if name != "readlines" else sum(map(len, data))
                return data
            return counted

    real_fdopen, real_pread, real_read = os.fdopen, os.pread, os.read

    def fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
        stream = real_fdopen(fd, *args, **kwargs)
        return Counted(stream) if journal(fd) else stream

    def pread(fd: int, size: int, offset: int) -> bytes:
        data = real_pread(fd, size, offset)
        read[0] += len(data) if journal(fd) else 0
        return data

    def read_fd(fd: int, size: int) -> bytes:
        data = real_read(fd, size)
        read[0] += len(data) if journal(fd) else 0
        return data

    monkeypatch.setattr(os, "fdopen", fdopen)
    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(os, "read", read_fd)
    return lambda: read[0]


# ── the look-ups ────────────────────────────────────────────────────────────


def test_a_second_look_up_by_a_stopped_gateway_reads_no_journal_again(
        tmp_path: Path, journal_reads: Callable[[], int]) -> None:
    """Before the fix each ``wait_outcome`` of an id the gateway did not hold read every journal whole again."""
    root = make_root(tmp_path)
    keys = _settled_journal(root, 300)
    size = sum(path.stat().st_size for path in journal_dir(root).glob("j-*.log"))
    gw = Gateway(root, runner=RecordingRunner())  # never started: the root's files answer
    before = journal_reads()
    with pytest.raises(KeyError, match="outcomes are kept for the last 10,000 deliveries"):
        gw.wait_outcome(_id(10_000), timeout=0)
    first = journal_reads() - before
    assert first >= size  # the journal, read once

    for _ in range(3):
        before = journal_reads()
        with pytest.raises(KeyError, match="outcomes are kept for the last 10,000 deliveries"):
            gw.wait_outcome(_id(10_001), timeout=0)
        assert gw.wait_outcome(keys[7], timeout=0) == _outcome(keys[7])
        again = journal_reads() - before
        assert again <= 2 * (4096 + 1), f"two look-ups re-read {again} bytes of a {size}-byte journal"


def test_a_running_gateway_looks_an_id_it_never_issued_up_in_the_journals_once(
        tmp_path: Path, journal_reads: Callable[[], int]) -> None:
    """The running gateway asks the root's journals for an id its Dispatcher does not know (another gateway on
    the root may have journaled it): the chaos review's final gateway spent minutes re-reading its own."""
    root = make_root(tmp_path)
    _settled_journal(root, 300)  # adopted at start: the outcomes are copied into the gateway's own file
    with Gateway(root, runner=RecordingRunner(), fsync=False) as gw:
        with pytest.raises(KeyError, match="this gateway holds no outcome for it and no journal on"):
            gw.wait_outcome(_id(10_000), timeout=0)
        size = sum(path.stat().st_size for path in journal_dir(root).glob("j-*.log"))
        for _ in range(3):
            before = journal_reads()
            with pytest.raises(KeyError, match="this gateway holds no outcome for it and no journal on"):
                gw.wait_outcome(_id(10_001), timeout=0)
            again = journal_reads() - before
            assert again <= 4096 + 1, f"a look-up re-read {again} bytes of a {size}-byte journal"


def test_a_restarted_gateway_says_an_outcome_it_no_longer_holds_may_be_older_than_the_ones_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (chaos review relay33): a restarted gateway asked for a DM its root had acked and settled long
    before said "this gateway did not issue it": false, the journals carry only (at least) the last 10,000 delivered
    outcomes from one start to the next. The error now says the id was never acked here or is older than the
    outcomes kept, and both bounds."""
    root = make_root(tmp_path)
    with Gateway(root, runner=RecordingRunner(), fsync=False) as gw:
        old = send_dm(gw, "long ago")
        assert gw.wait_outcome(old, timeout=30)["status"] == "replied"
        for n in range(3):  # later outcomes push it out of what a start carries on (2 here, 10,000 for real)
            assert gw.wait_outcome(send_dm(gw, f"later {n}"), timeout=30)["status"] == "replied"
    kept = Journal.keep_delivered  # what the message names
    monkeypatch.setattr(Journal, "keep_delivered", 2)
    with Gateway(root, runner=RecordingRunner(), fsync=False):
        pass  # knows every outcome of the file it adopts, but carries only the last 2 into its own
    with Gateway(root, runner=RecordingRunner(), fsync=False) as gw, pytest.raises(KeyError) as raised:
        gw.wait_outcome(old, timeout=0)
    said = str(raised.value)
    assert "did not issue" not in said, said
    assert f"no journal on {root} does: it was never acked on this root, or its outcome is older than the ones " \
           f"kept (at least the last {kept:,} delivered, in the journal across restarts; at least the last " \
           f"{SETTLED_KEEP:,}, in this gateway's memory while it runs)" in said, said


def _relayed_in(key: str) -> list[dict[str, Any]]:
    """The records of a relayed-in DM run and answered: started (with its accepted, origin relay), then its
    outcome with its delivered record (``turn_launch.RelayedInStart``, ``OutcomeFlow._keep_relayed_in``)."""
    return [{"t": "accepted", "id": key, "d": {**_delivery(key), "origin": "relay"}},
            {"t": "started", "id": key, "attempt": 1},
            {"t": "finished", "id": key, "o": _outcome(key), "origin": "relay"}, {"t": "delivered", "id": key}]


def _local(key: str) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in _settled(key)]


# order → the DMs settled, in that order (l: a local DM, r: a relayed-in one)
BUDGET_ORDERS = {
    "local-first": "lllrrr",
    "relay-first": "rrrlll",
    "interleaved": "lrlrlr",
}


@pytest.mark.parametrize("order", list(BUDGET_ORDERS))
@pytest.mark.parametrize("how", ["compaction", "adoption"])
def test_relayed_in_outcomes_and_local_ones_are_kept_each_within_a_bound_of_their_own(order: str, how: str) -> None:
    """Review (diff review of 01453af): relayed-in DMs' outcomes shared the kept-outcome budget with local DMs': on a
    host that mostly receives relayed DMs, local outcomes were pushed out (``wait_outcome`` → KeyError after
    restarts) though "at least the last 10,000 delivered" local ones are promised. Now each kind has a bound of
    its own (2 here): what compaction writes and what an adoption carries on keep the last 2 of each kind."""
    keys = {kind: [] for kind in "lr"}  # type: dict[str, list[str]]
    batches = []
    for n, kind in enumerate(BUDGET_ORDERS[order], start=1):
        keys[kind].append(_id(n))
        batches.append((_local if kind == "l" else _relayed_in)(_id(n)))
    state = JournalState()
    if how == "compaction":
        for batch in batches:
            state.track(batch, keep=2)
        lines = state.lines()
    else:
        lines = state.take_over(fold_records([record for batch in batches for record in batch]), keep=2)
    kept = fold_records([orjson.loads(line) for line in lines]).states
    assert sorted(kept) == sorted(keys["l"][-2:] + keys["r"][-2:]), f"{order}: {sorted(kept)} kept"
    assert all(state.delivered for state in kept.values())


@pytest.mark.parametrize("order", ["local-first", "relay-first"])
def test_a_host_that_receives_relayed_dms_still_answers_its_own_senders_outcomes_after_restarts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, order: str) -> None:
    """Review (diff review of 01453af), the gateway's side: with the journal's bound shrunk to 3, three local DMs and
    three relayed-in ones (the Desktop's ``relay_deliver``), in either order, then two restarts (the first carries
    only what the bound keeps into its file). Before, whichever kind came first was pushed out: ``wait_outcome``
    of the local DMs was a KeyError, or a retried envelope was answered from nothing. Now both are answered."""
    monkeypatch.setattr(Journal, "keep_delivered", 3)
    root = make_root(tmp_path)
    rec = RecordingRunner(lambda turn: f"reply to {turn.delivery_id}")
    target = RemoteAgent(profile="bob", handle="bob", connection_id="mini")
    envelopes = [make_envelope(target=target, message=f"r{n}", sender_profile="zed", sender_handle="zed",
                               now=time.time()) for n in range(3)]
    local: dict[str, dict[str, Any]] = {}
    relayed: dict[str, dict[str, str]] = {}
    with Gateway(root, runner=rec, fsync=False, connection_id="mini") as gw:
        def send_local() -> None:
            for n in range(3):
                key = send_dm(gw, f"l{n}")
                local[key] = gw.wait_outcome(key, timeout=30)

        def deliver() -> None:
            for env in envelopes:
                relayed[env["id"]] = gw.relay_deliver(dict(env), timeout=30)

        for step in ((send_local, deliver) if order == "local-first" else (deliver, send_local)):
            step()
    with Gateway(root, runner=rec, fsync=False, connection_id="mini"):
        pass  # carries only what the bound keeps into its own file
    ran = len(rec.entered)
    with Gateway(root, runner=rec, fsync=False, connection_id="mini") as gw:
        assert {key: gw.wait_outcome(key, timeout=0) for key in local} == local
        assert {env["id"]: gw.relay_deliver(dict(env), timeout=30) for env in envelopes} == relayed
    assert len(rec.entered) == ran, "a retried envelope ran its turn again"


def test_only_what_a_live_gateway_appended_is_read_and_its_records_are_found(
        tmp_path: Path, journal_reads: Callable[[], int]) -> None:
    root = make_root(tmp_path)
    journal = _journal(root)  # a running gateway's file: records land in the zeros it allocated ahead
    earlier = [_id(n) for n in range(1, 1001)]
    journal.write([line for key in earlier for line in _settled(key)], flush=False)
    index = JournalIndex()
    late = _id(5000)
    assert find_outcome(root, late, index=index)["status"] == "unknown"

    journal.write([_accepted(late)], flush=False)
    before = journal_reads()
    assert find_outcome(root, late, index=index) == {
        "status": "pending", "delivery_id": late, "error": "accepted; it has not started, no outcome yet"}
    appended = journal_reads() - before
    journal.write(_settled(late, "late")[1:], flush=False)
    assert find_outcome(root, late, index=index) == _outcome(late, "late")
    assert find_outcome(root, earlier[0], index=index) == _outcome(earlier[0])
    # what was read is what was appended, and the zeros allocated ahead after it: never the records before it
    assert appended < JournalFile.reserve_bytes + 2 * 4097 < journal.end - len(_accepted(late))
    journal.close()


def test_a_compacted_or_cut_back_journal_is_read_anew(tmp_path: Path) -> None:
    """Compaction swaps another file in under the same name; a failed write is cut back and the next one
    written where it was: what the index read before must not stay."""
    root = make_root(tmp_path)
    journal = _journal(root)
    old, kept = _id(1), _id(2)
    journal.write(_settled(old) + _settled(kept), flush=False)
    index = JournalIndex()
    assert find_outcome(root, old, index=index) == _outcome(old)

    journal.replace_with(_settled(kept)[2:])  # compacted: the old outcome dropped, the kept one stays
    assert find_outcome(root, old, index=index)["status"] == "unknown"
    assert find_outcome(root, kept, index=index) == _outcome(kept)

    cut, written = _id(3), _id(4)  # same length: the refused batch's place is taken by the next one
    before = journal.end
    journal.write([_accepted(cut)], flush=False)
    assert find_outcome(root, cut, index=index)["status"] == "pending"
    journal.cut_back(before)  # its write failed: its callers were told it was NOT recorded
    journal.write([_accepted(written)], flush=False)
    assert find_outcome(root, cut, index=index)["status"] == "unknown"
    assert find_outcome(root, written, index=index)["status"] == "pending"
    for key in (old, kept, cut, written):
        assert find_outcome(root, key, index=index) == find_outcome(root, key)
    journal.close()


def test_a_last_record_seen_without_its_newline_then_cut_back_leaves_no_trace(tmp_path: Path) -> None:
    """A look-up that catches a record without its newline (a write under way, or a short one) must not keep it:
    when that write fails, the journal cuts it back and writes the real record where it was (JournalFile.write's
    failure path). Before the fix the index kept the phantom outcome for good (the first outcome wins) and never
    read that place again (the bytes before it were unchanged); a whole-file read answered pending, then REAL."""
    root = make_root(tmp_path)
    journal = _journal(root)
    key = _id(9)
    journal.write([_accepted(key), _line({"t": "started", "id": key, "attempt": 1})], flush=False)
    index = JournalIndex()

    def same_as_whole_read(expected: str) -> None:
        assert index.state(root, key)[0] == read_journals(root)[0].states.get(key)
        answer = find_outcome(root, key, index=index)
        assert answer == find_outcome(root, key)
        assert answer.get("reply", answer.get("error")) == expected

    same_as_whole_read("accepted; its turn began, no outcome yet")
    base = journal.end
    assert journal.fd is not None
    os.pwrite(journal.fd, _line({"t": "finished", "id": key, "o": _outcome(key, "PHANTOM")})[:-1], base)
    same_as_whole_read("PHANTOM")  # as a whole-file fold counts a last record without its newline
    journal.cut_back(base)  # the write failed: its callers were told it was NOT recorded
    same_as_whole_read("accepted; its turn began, no outcome yet")
    journal.write([_line({"t": "finished", "id": key, "o": _outcome(key, "REAL")})], flush=False)
    same_as_whole_read("REAL")
    journal.write([_line({"t": "delivered", "id": key})], flush=False)
    same_as_whole_read("REAL")
    journal.close()


def _states(root: Path, index: JournalIndex, keys: list[str]) -> dict[str, DeliveryState | None]:
    return {key: index.state(root, key)[0] for key in keys}


def test_the_index_answers_as_a_fold_of_every_file_whatever_was_written_when(tmp_path: Path) -> None:
    """Files seen at every point of their writing (torn lines, the zeros allocated ahead, a last record without
    its newline, a power cut's zeros between records, one id in two files as while a start adopts a dead
    gateway's file): each look-up answers as a fold of all the files read whole at that moment."""
    root = make_root(tmp_path)
    directory = journal_dir(root)
    directory.mkdir(parents=True, mode=0o700)
    keys = [_id(n) for n in range(1, 7)]
    shared = keys[0]
    first = b"".join([
        *_settled(keys[1]), _accepted(shared), _line({"t": "started", "id": shared, "attempt": 2, "via": "warm"}),
        _line({"t": "finished", "id": shared, "o": _outcome(shared, "first")}),
        b"\0" * 300,  # a power cut's zeros where lazy records had not landed
        *_settled(keys[2])[:2], _line({"t": "started", "id": keys[3], "attempt": 1})[:-1],  # no "\n" after it
    ])
    # Zeros between records are a power cut's: that file is no gateway's any more, and never grows past them
    # (a writer appends after its last record). It is seen whole from the line after them on.
    holes = first.index(b"\0" * 300)
    after_hole = first.index(b"\n", holes) + 1
    second = b"".join([
        _line({"t": "accepted", "id": shared}),  # unreadable: no delivery object
        _line({"t": "started", "id": shared, "attempt": 1, "via": "cli", "live": True}),
        _line({"t": "finished", "id": shared, "o": _outcome(shared, "second")}),  # the first outcome wins
        *_settled(keys[4]), _accepted(keys[5]), _line({"t": "delivered", "id": shared}),
    ])
    shuffle = random.Random(5)
    index = JournalIndex()
    for padded in (False, True):  # written past the end of the file, or into zeros allocated ahead
        for path in directory.glob("j-*.log"):
            path.unlink()
        whole_length = len(first) + len(second)
        ends = {at + 1 for at, byte in enumerate(first + second) if byte == ord("\n")}  # each line's end, ±1
        allowed = {cut for cut in range(1, whole_length + 1) if not holes <= cut < after_hole}
        near_ends = {end + shift for end in ends for shift in (-1, 0, 1)}
        picked = set(shuffle.sample(sorted(allowed), 60)) | (allowed & near_ends)
        for cut in [*sorted(picked), whole_length]:
            for name, data, shown in (("j-1.log", first, cut), ("j-2.log", second, cut - len(first))):
                if shown <= 0:
                    continue
                path = directory / name
                if not path.exists():
                    path.write_bytes(b"\0" * (len(data) + 4096) if padded else b"")
                with path.open("r+b") as stream:
                    stream.write(data[:shown])
            whole = read_journals(root)[0].states
            assert _states(root, index, keys) == {key: whole.get(key) for key in keys}, (padded, cut)
    assert index.state(root, shared)[0] == DeliveryState(
        delivery=_delivery(shared), started=2, outcome=_outcome(shared, "first"), delivered=True,
        unreadable_acceptance=True, live=True, via="cli")


def test_a_damaged_file_and_its_adopters_copy_answer_as_a_fold_of_the_whole_root(tmp_path: Path) -> None:
    """The one layout a writer makes with a ``started``+``via`` record first for an id an earlier file tracks:
    adoption copies a state without a readable delivery as a lone ``started`` record, while the damaged file it
    came from is still in the directory (before its quarantine, or if that move failed). The index folds each
    file on its own (that record is dropped in the copy's file) and still answers as a whole-root fold does."""
    root = make_root(tmp_path)
    directory = journal_dir(root)
    directory.mkdir(parents=True, mode=0o700)
    key = _id(9)
    damaged = [_line({"t": "accepted", "id": key}), _line({"t": "started", "id": key, "attempt": 2, "via": "warm"})]
    adopted = JournalState()
    adopted.take_over(fold_records(orjson.loads(line) for line in damaged), keep=10)
    copy = adopted.lines()
    assert [orjson.loads(line)["t"] for line in copy] == ["started"]  # no accepted: a late via in its own file
    for damaged_name, copy_name in (("j-a.log", "j-b.log"), ("j-b.log", "j-a.log")):
        for path in directory.glob("j-*.log"):
            path.unlink()
        (directory / damaged_name).write_bytes(b"".join(damaged))
        (directory / copy_name).write_bytes(b"".join(copy))
        assert JournalIndex().state(root, key)[0] == read_journals(root)[0].states[key]
        assert find_outcome(root, key, index=JournalIndex()) == find_outcome(root, key)


def test_a_state_folds_back_from_its_records() -> None:
    """``state_records`` is what compaction writes and how one id's states in several files are combined."""
    key = _id(9)
    states = [
        DeliveryState(),
        DeliveryState(delivery=_delivery(key)),
        DeliveryState(delivery=_delivery(key), started=3, live=True, via="warm"),
        DeliveryState(started=1, outcome=_outcome(key), delivered=True, unreadable_acceptance=True),
        DeliveryState(outcome=_outcome(key), delivered=True),
    ]
    for state in states[1:]:
        assert fold_records(state_records(key, state)).states[key] == state
    assert state_records(key, states[0]) == []


def test_a_relayed_dm_waiting_for_its_reply_is_found_without_listing_the_relay_directories(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``claimed/`` keeps every envelope the relay took for hours (15,872 on a chaos run's root): listing it
    took 13 ms a look-up. The entry's own name is looked up instead."""
    root = make_root(tmp_path)
    paths = InboxPaths.from_root(root).ensure()
    dave = RemoteAgent(profile="dave", handle="dave", connection_id="conn-mini", connection_label="Mini")
    envelope = make_envelope(target=dave, message="hi", sender_profile="alice", sender_handle="alice", now=1.0)
    key = envelope["id"]
    enqueue_envelope(paths.relay, envelope)
    relay_dirs = {paths.relay.outbox, paths.relay.claimed}
    real_listdir = os.listdir

    def listdir(path: Any = ".") -> list[str]:
        assert Path(str(path)) not in relay_dirs, f"{path} was listed for one id"
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    waiting = {"status": "pending", "delivery_id": key, "error": "relayed; waiting for the reply"}
    assert find_outcome(root, key) == waiting
    os.rename(paths.relay.outbox / f"{key}.json", paths.relay.claimed / f"{key}.json")
    assert find_outcome(root, key) == waiting
    (paths.relay.claimed / f"{key}.json").unlink()
    assert find_outcome(root, key)["status"] == "unknown"


def test_outcome_wait_polls_read_only_what_was_appended(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, journal_reads: Callable[[], int],
        capsys: pytest.CaptureFixture[str]) -> None:
    """``hermes-actors outcome --wait`` polls the files while no host runs: before, each poll read every journal
    whole. The command's clock is a fake one that its pauses move on, so the polls are counted, not timed."""
    root = make_root(tmp_path)
    _settled_journal(root, 300)
    journal = _journal(root)
    key = _id(5000)
    journal.write([_accepted(key)], flush=False)
    size = sum(path.stat().st_size for path in journal_dir(root).glob("j-*.log"))
    now = [0.0]
    polls = [0]
    real_lookup = ops_commands._lookup

    def lookup(*args: Any) -> dict[str, Any]:
        polls[0] += 1
        return real_lookup(*args)

    def sleep(seconds: float) -> None:
        now[0] += max(seconds, 0.1)

    monkeypatch.setattr(ops_commands, "time", types.SimpleNamespace(monotonic=lambda: now[0], sleep=sleep))
    monkeypatch.setattr(ops_commands, "_lookup", lookup)
    before = journal_reads()
    assert main(["outcome", "--root", str(root), key, "--wait", "3"]) == 1
    assert capsys.readouterr().out == f"pending: delivery {key} has no outcome yet\n"
    assert polls[0] >= 6
    read = journal_reads() - before
    assert read < size + polls[0] * 2 * (4096 + 1), f"{polls[0]} polls read {read} bytes of {size}-byte journals"
    journal.close()
