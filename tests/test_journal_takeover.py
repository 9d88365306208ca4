"""A running gateway takes over the journal of a gateway on its root that stopped or died beside it.

Regression (acceptance run on the real hermes 0.19, 3/3): with ``hermes gateway run`` (or ``serve``) hosting the
actors, README's Python snippet (an embedded ``Gateway``: alice → bob, ``wait_outcome``, leave the ``with`` block)
left alice's wake ``accepted`` in its own journal; the running host never ran it (its ``status`` showed nothing in
flight), only the next process to start on the root did (80 s later at a ``--replace`` restart; never without
one). Same for a gateway killed -9 beside a running host: its acked DMs waited for a restart. The running
gateway now adopts such a journal at its relay rescan, by the start's rules (``relay/journal_takeover.py``).
Rescans run when a test says (``rescan_seconds: 300``, :func:`rescan`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from crash_procs import journal_ids, run_child, turns_logged
from roots import LogCapture, RecordingRunner, make_root, rescan, start_gateway

from actors import ask
from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.core.acks import delivery_record
from hermes_actors.core.ids import new_delivery_id
from hermes_actors.core.wake import wake_id
from hermes_actors.messages import Delivery, Recover
from hermes_actors.relay.journal_takeover import relayed_fates, relayed_outcomes
from hermes_actors.store.journal_records import DeliveryState
from hermes_actors.store.turnlock import turn_lock_path

CONFIG = {"bot_mode": {"wake_sender": True, "rescan_seconds": 300}}  # rescans run when the test says


def journals(root: Path) -> list[Path]:
    return sorted((root / "bot_relay" / "journal").glob("j-*.log"))


def hold_flock(root: Path, profile: str) -> int:
    """Hold ``profile``'s turn lock (as a turn of another process would): its turns cannot begin meanwhile."""
    lock = turn_lock_path(root, profile)
    lock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    held = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)
    return held


def restart_runs_nothing(root: Path, *settled: str) -> None:
    """One more start on the root: nothing is run or re-offered again, and each of ``settled`` is known."""
    runner = RecordingRunner()
    with Gateway(root, runner=runner, config=CONFIG) as gw:
        assert (gw.recovered.get("reoffered", 0), gw.recovered.get("ambiguous", 0)) == (0, 0), gw.recovered
        for key in settled:
            assert gw.wait_outcome(key, timeout=10)["status"] == "replied"
    assert runner.entered == []


def test_a_wake_the_readme_snippet_left_unrun_is_run_once_by_the_host_running_beside_it(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """A host runs on the root; README's snippet (an embedded Gateway with wakes on) sends alice → bob, waits for
    the outcome and leaves its ``with`` block before alice's wake could begin (her turn lock is held meanwhile).
    The host adopts the snippet's journal at its next rescan and runs the wake once; before, it never did."""
    root = make_root(tmp_path)
    host_runner = RecordingRunner()
    host = start_gateway(gateways, root, host_runner, config=CONFIG)
    snippet_runner = RecordingRunner()
    held = hold_flock(root, "alice")
    try:
        with Gateway(root, runner=snippet_runner, config=CONFIG) as gw:
            ack = gw.message_agent(sender="alice", target="bob", message="hi")
            assert gw.wait_outcome(ack["delivery_id"], timeout=30)["status"] == "replied"
    finally:
        os.close(held)  # the flock goes with it
    assert [t.profile for t in snippet_runner.entered] == ["bob"]  # the wake never began there
    wake = wake_id(ack["delivery_id"])
    assert len(journals(root)) == 2  # the host's and the snippet's, its wake in it
    with LogCapture("INFO") as logs:
        rescan(host)
        await_condition(lambda: [t.delivery_id for t in host_runner.entered] == [wake], timeout=30,
                        message="the host ran alice's wake")
        assert host.wait_outcome(wake, timeout=30)["status"] == "replied"
    (line,) = logs.matching("recovery: adopted the journal")
    assert "1 re-offered, 0 ambiguous, 0 outcomes re-delivered" in line, line
    rescan(host)  # a later rescan adopts nothing again
    host.stop(timeout=10)
    (turn,) = host_runner.entered
    assert (turn.profile, turn.content.startswith("Reply from @bob: ")) == ("alice", True)
    restart_runs_nothing(root, wake)


def test_a_dm_a_gateway_killed_beside_a_running_one_had_acked_is_run_once_by_the_running_one(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """A gateway in a child process acks hermes → bob and is SIGKILLed before the turn began; a gateway running
    on the root re-offers the DM at its next rescan and runs it once (before: only a restart did)."""
    root = make_root(tmp_path)
    runner = RecordingRunner()
    host = start_gateway(gateways, root, runner, config=CONFIG)
    child = run_child(root, "send", crash_at="after-ack-before-turn")
    assert child.killed, f"the child was not SIGKILLed (rc={child.returncode}): {child.stderr[-2000:]}"
    (key,) = journal_ids(root)
    assert child.of("ack")[0]["delivery_id"] == key
    rescan(host)
    await_condition(lambda: [t.delivery_id for t in runner.entered] == [key], timeout=30,
                    message="the running gateway ran the killed one's DM")
    assert host.wait_outcome(key, timeout=30)["status"] == "replied"
    rescan(host)
    host.stop(timeout=10)
    assert [t.delivery_id for t in runner.entered] == [key] and turns_logged(root) == []
    restart_runs_nothing(root, key)


def test_a_gateway_that_stopped_cleanly_with_everything_settled_leaves_its_journal_to_the_next_start(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Nothing unfinished: the running gateway leaves the stopped one's file where it is (its outcomes stay there
    for ``wait_outcome`` and ``hermes-actors outcome``) and says nothing; it reads it once, not at each rescan."""
    root = make_root(tmp_path)
    config = {"bot_mode": {"rescan_seconds": 300}}
    host = start_gateway(gateways, root, RecordingRunner(), config=config)
    with Gateway(root, runner=RecordingRunner(), config=config) as gw:
        key = gw.message_agent(sender="alice", target="bob", message="hi")["delivery_id"]
        assert gw.wait_outcome(key, timeout=30)["status"] == "replied"
    before = journals(root)
    assert len(before) == 2
    with LogCapture("INFO") as logs:
        rescan(host)
        rescan(host)
    assert journals(root) == before and logs.matching("recovery:") == []
    assert host.wait_outcome(key, timeout=10)["status"] == "replied"


def _plant_dead_journal(root: Path, records: list[dict[str, Any]]) -> Path:
    """A journal nobody holds (its gateway died), put in place whole (renamed in)."""
    directory = root / "bot_relay" / "journal"
    name = f"j-{new_delivery_id()}.log"
    fresh = directory / f".{name}.new"
    fresh.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    fresh.chmod(0o600)
    fresh.rename(directory / name)
    return directory / name


@pytest.mark.parametrize("starting", [False, True], ids=["two-running", "two-running-and-a-start"])
def test_running_gateways_and_a_starting_one_adopt_a_dead_journal_once(
    tmp_path: Path, gateways: list[Gateway], starting: bool
) -> None:
    """Gateways A and C run; a dead gateway's journal holding an acked, never-started DM appears; A and C rescan
    at once (while D starts on the root, with ``starting``): exactly one of them adopts it (its flock) and the DM
    runs once."""
    root = make_root(tmp_path)
    runners = [RecordingRunner() for _ in range(3)]
    config = {"bot_mode": {"rescan_seconds": 300}}  # nobody woken: the DM's turn is the one turn
    a = start_gateway(gateways, root, runners[0], config=config)
    c = start_gateway(gateways, root, runners[1], config=config)
    dm = Delivery(new_delivery_id(), "alice", "alice", "bob", "bob", "Message from 🤖 Alice (@alice): ping", hop=1,
                  label="@bob")
    dead = _plant_dead_journal(root, [{"t": "accepted", "id": dm.delivery_id, "d": delivery_record(dm)}])
    running = [a, c]
    if starting:
        d = Gateway(root, runner=runners[2], config=config)
        gateways.append(d)
        start = threading.Thread(target=d.start)
        start.start()
    rescan(a, c)
    if starting:
        start.join(60)
        running.append(d)
    await_condition(lambda: sum(len(r.entered) for r in runners) == 1, timeout=30, message="the DM ran")
    assert not dead.exists()  # adopted: nobody can adopt it again
    rescan(*running)
    for gw in running:
        gw.stop(timeout=10)
    assert [t.delivery_id for r in runners for t in r.entered] == [dm.delivery_id]
    restart_runs_nothing(root, dm.delivery_id)


@pytest.mark.parametrize(("state", "relayed"), [
    (DeliveryState(outcome={"status": "replied"}), True),  # a relayed DM: finished, no acceptance, not delivered
    (DeliveryState(outcome={"status": "replied"}, delivered=True), False),  # reported already
    (DeliveryState(delivery={"x": 1}, outcome={"status": "replied"}), False),  # a local DM or wake: its acceptance
    (DeliveryState(outcome={"status": "replied"}, unreadable_acceptance=True), False),  # damage: recovery names it
    (DeliveryState(), False),  # a torn record: nothing was acked
])
def test_relayed_outcomes_are_the_journaled_outcomes_without_an_acceptance_not_yet_delivered(
    state: DeliveryState, relayed: bool
) -> None:
    assert relayed_outcomes({"a" * 32: state}) == (["a" * 32] if relayed else [])


@pytest.mark.parametrize(("recorded", "consumed", "resumed", "fate"), [
    (True, False, False, "waiting"),  # its sent/ record's holder reports it (maybe another gateway)
    (True, True, False, "waiting"),  # the record first: its taker marks it consumed before it clears the record
    (True, False, True, "ours"),  # our relay resumed it at this start: published here as before (or found reported)
    (False, True, False, "reported"),  # reported and forgotten: marked delivered, not published
    (False, True, True, "reported"),
    (False, False, False, "ours"),  # no relay holds it: published here, once
])
def test_relayed_fates_leave_to_the_relay_what_it_holds_and_mark_what_it_reported(
    recorded: bool, consumed: bool, resumed: bool, fate: str
) -> None:
    key = "a" * 32
    waiting, reported = relayed_fates([key], recorded={key} if recorded else set(),
                                      consumed={key} if consumed else set(), resumed={key} if resumed else set())
    assert (waiting, reported) == ({"waiting": ({key}, set()), "reported": (set(), {key}),
                                    "ours": (set(), set())}[fate])


def _never_started_dm() -> Delivery:
    return Delivery(new_delivery_id(), "alice", "alice", "bob", "bob", "Message from 🤖 Alice (@alice): ping", hop=1,
                    label="@bob")


@pytest.mark.parametrize("stays", ["quarantine", "unlink"])
def test_a_dead_journal_that_cannot_be_retired_is_adopted_once_and_its_dm_runs_once(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch, stays: str
) -> None:
    """Review: an adopted dead journal that could be neither quarantined (a damaged line; ``quarantine/`` of another
    user) nor removed (``unlink`` refused) stayed, was adopted again at every rescan and its never-started DM ran
    again each time (6 runs in 10.5 s at the default rescan). Now this gateway never adopts it again: one adoption,
    one run, one outcome; and it keeps the file's flock while it runs, so a second running gateway does not adopt
    it either (a later review: it did, and ran the DM a second time, 3/3)."""
    from hermes_actors.store import relay_quarantine

    root = make_root(tmp_path)
    runner, beside = RecordingRunner(), RecordingRunner()
    host = start_gateway(gateways, root, runner, config={"bot_mode": {"rescan_seconds": 300}})
    other = start_gateway(gateways, root, beside, config={"bot_mode": {"rescan_seconds": 300}})
    published: list[str] = []
    host.subscribe(lambda outcome: published.append(outcome["delivery_id"]))
    other.subscribe(lambda outcome: published.append(outcome["delivery_id"]))
    dm = _never_started_dm()
    records = [{"t": "accepted", "id": dm.delivery_id, "d": delivery_record(dm)}]
    dead = _plant_dead_journal(root, records)
    if stays == "quarantine":
        dead.write_bytes(dead.read_bytes() + b"{torn\n")  # one unreadable line: quarantined instead of removed
        monkeypatch.setattr(relay_quarantine, "quarantine_into", lambda *args, **kwargs: None)  # (it logs why)
    else:
        real_unlink = os.unlink

        def unlink(path: Any, *args: Any, **kwargs: Any) -> None:  # by name, relative to journal/'s descriptor
            if Path(path).name == dead.name:
                raise PermissionError(1, "Operation not permitted", str(path))
            real_unlink(path, *args, **kwargs)

        monkeypatch.setattr(os, "unlink", unlink)
    with LogCapture("INFO") as logs:
        for _ in range(3):
            rescan(host)
        # asked after the rescans' tells to the Dispatcher: each Recover they sent was handled before it answers
        assert host.wait_outcome(dm.delivery_id, timeout=30)["status"] == "replied"
        for _ in range(2):
            rescan(other)
        # a poll asks its Dispatcher: a Recover its rescans sent (and its log line) would be handled first
        other.wait_outcome(dm.delivery_id, timeout=0)
    assert dead.exists()
    assert len(logs.matching("recovery: adopted the journal", dead.name)) == 1, logs.lines
    assert len(logs.matching("no gateway adopts it again while this one runs", dead.name)) == 1, logs.lines
    other.stop(timeout=10)
    host.stop(timeout=10)
    assert [t.delivery_id for t in runner.entered] == [dm.delivery_id]
    assert beside.entered == []
    assert published == [dm.delivery_id]


@pytest.mark.parametrize("where", ["settled", "pending"])
def test_a_recover_of_a_dm_this_run_has_pending_or_settled_runs_nothing_again(
    tmp_path: Path, gateways: list[Gateway], where: str
) -> None:
    """Belt and braces for a journal adopted twice: a re-offer skips an id this run already has pending (its turn
    waits for bob's turn lock) or settled; the DM runs once."""
    root = make_root(tmp_path)
    runner = RecordingRunner()
    host = start_gateway(gateways, root, runner, config={"bot_mode": {"rescan_seconds": 300}})
    dm = _never_started_dm()
    records = [{"t": "accepted", "id": dm.delivery_id, "d": delivery_record(dm)}]
    _plant_dead_journal(root, records)
    held = hold_flock(root, "bob") if where == "pending" else None
    try:
        rescan(host)
        if held is None:
            assert host.wait_outcome(dm.delivery_id, timeout=30)["status"] == "replied"
        states = {dm.delivery_id: DeliveryState(delivery=delivery_record(dm))}
        assert host._system is not None
        counts = ask(host._system.dispatcher, Recover(states, adopted_from=("j-again.log",)), timeout=30)
        assert counts["reoffered"] == 0, counts
    finally:
        if held is not None:
            os.close(held)
    assert host.wait_outcome(dm.delivery_id, timeout=30)["status"] == "replied"
    host.stop(timeout=10)
    assert [t.delivery_id for t in runner.entered] == [dm.delivery_id]


def test_a_dm_settled_here_that_an_adopted_journal_holds_again_is_not_left_live_in_our_journal(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Review adoptleft: a journal holding, never started, a DM this run has settled already (a journal adopted a
    second time) was not re-offered, but its ``accepted`` record was made live again in our journal: once our
    bounded table of delivered outcomes dropped the DM, compaction kept only that record, and the next start (or an
    adoption of our file) offered it again: the DM ran twice. What an adopted file says of an id this run knows
    is not acted on and leaves nothing live in our journal now."""
    root = make_root(tmp_path)
    runner = RecordingRunner()
    host = start_gateway(gateways, root, runner, config={"bot_mode": {"rescan_seconds": 300}})
    dm = _never_started_dm()
    records = [{"t": "accepted", "id": dm.delivery_id, "d": delivery_record(dm)}]
    _plant_dead_journal(root, records)
    rescan(host)
    assert host.wait_outcome(dm.delivery_id, timeout=30)["status"] == "replied"
    assert host._system is not None and host._system.journal is not None
    journal = host._system.journal
    await_condition(lambda: dm.delivery_id not in journal._state.folded.states, timeout=30,
                    message="the DM's delivered record landed")
    _plant_dead_journal(root, records)  # the same DM again, never started
    with LogCapture("WARNING") as logs:
        rescan(host)
        host.wait_outcome(dm.delivery_id, timeout=0)  # asked after the rescan's Recover: handled before it answers
    assert logs.matching("already pending or settled in this run are not acted on again", dm.delivery_id)
    await_condition(lambda: dm.delivery_id not in journal._state.folded.states, timeout=30,
                    message="the adopted copy left our journal's live state")
    host.stop(timeout=10)
    runner_after = RecordingRunner()
    with Gateway(root, runner=runner_after, config={"bot_mode": {"rescan_seconds": 300}}) as gw:
        assert gw.recovered.get("reoffered", 0) == 0, gw.recovered
    assert runner_after.entered == []
    assert [t.delivery_id for t in runner.entered] == [dm.delivery_id]


def test_a_dm_is_acked_while_a_running_gateway_reads_a_dead_journal(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review: adoption held the journal's write turn while reading and folding a big dead file (207 MB: acks
    stalled 1.6 s). The dead files are read without the turn now: a DM is acked while the read is held up."""
    from hermes_actors.store import journal_adoption

    root = make_root(tmp_path)
    runner = RecordingRunner()
    host = start_gateway(gateways, root, runner, config={"bot_mode": {"rescan_seconds": 300}})
    dm = _never_started_dm()
    _plant_dead_journal(root, [{"t": "accepted", "id": dm.delivery_id, "d": delivery_record(dm)}])
    reading, release = threading.Event(), threading.Event()
    real_read = journal_adoption.read_lines

    def held_read(stream: Any) -> Any:
        reading.set()
        assert release.wait(60)
        return real_read(stream)

    monkeypatch.setattr(journal_adoption, "read_lines", held_read)
    scan = threading.Thread(target=rescan, args=(host,))
    scan.start()
    acked: list[dict[str, Any]] = []
    try:
        assert reading.wait(30), "the rescan never read the dead journal"
        send = threading.Thread(target=lambda: acked.append(host.message_agent(sender="alice", target="carol",
                                                                               message="hi")))
        send.start()
        send.join(20)  # a deadline: before, the ack waited for the whole adoption
        assert acked and "delivery_id" in acked[0], acked
    finally:
        release.set()
        scan.join(60)
    assert host.wait_outcome(dm.delivery_id, timeout=30)["status"] == "replied"
    assert host.wait_outcome(acked[0]["delivery_id"], timeout=30)["status"] == "replied"


def test_a_running_adoption_that_cannot_write_says_so_once_per_spell(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review: a failing adoption write (a full disk) logged ERROR at every rescan. Now once per spell (the journal
    writes' spell), and once at INFO when it lands again; the DM then runs once."""
    from hermes_actors.store.journal_file import JournalFile

    root = make_root(tmp_path)
    runner = RecordingRunner()
    host = start_gateway(gateways, root, runner, config={"bot_mode": {"rescan_seconds": 300}})
    dm = _never_started_dm()
    full = True
    real_write = JournalFile.write

    def write(self: JournalFile, lines: list[bytes], **kwargs: Any) -> Any:
        if full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, lines, **kwargs)

    monkeypatch.setattr(JournalFile, "write", write)
    dead = _plant_dead_journal(root, [{"t": "accepted", "id": dm.delivery_id, "d": delivery_record(dm)}])
    with LogCapture("INFO") as logs:
        for _ in range(3):
            rescan(host)
        assert dead.exists()
        errors = [r["message"] for r in logs.records if r["level"].name == "ERROR"]
        assert len(errors) == 1 and "could not adopt the journal(s)" in errors[0], errors
        full = False
        rescan(host)
        assert host.wait_outcome(dm.delivery_id, timeout=30)["status"] == "replied"
        rescan(host)
    assert len(logs.matching("takes records again (3 failed write(s) before)")) == 1, logs.lines
    assert not dead.exists()
    host.stop(timeout=10)
    assert [t.delivery_id for t in runner.entered] == [dm.delivery_id]


def test_the_adopted_journal_is_recovered_even_when_the_relays_takeover_raises(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review: a raise in the relay's takeover (``shelf.adopt``) after the journal's adoption left the adopted DMs
    untold to the Dispatcher while their dead file was gone: nothing ran them until a restart. Recover is told
    anyway now."""
    from hermes_actors.store.relay_shelf import Shelf

    root = make_root(tmp_path)
    runner = RecordingRunner()
    host = start_gateway(gateways, root, runner, config={"bot_mode": {"rescan_seconds": 300}})
    dm = _never_started_dm()

    def broken(self: Shelf, **kwargs: Any) -> Any:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(Shelf, "adopt", broken)
    dead = _plant_dead_journal(root, [{"t": "accepted", "id": dm.delivery_id, "d": delivery_record(dm)}])
    rescan(host)
    assert not dead.exists()
    assert host.wait_outcome(dm.delivery_id, timeout=30)["status"] == "replied"
    host.stop(timeout=10)
    assert [t.delivery_id for t in runner.entered] == [dm.delivery_id]

