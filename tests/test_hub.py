"""The relay hub (plays the Desktop for local roots): rosters, draining, forwarding, refusals."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from crash_procs import SIGNAL_ANOTHER_THREAD
from hostile_files import IS_ROOT, place
from relay_helpers import hub_thread, remote_row, seed_envelope, seed_write_json, write_roster_file
from roots import LogCapture, RecordingRunner, body_of, make_root, start_gateway

from actors import FileAppeared, FsBridge, Scheduler
from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.relay.hub import HubActor, HubRoot, run_hub
from hermes_actors.store import relay_files as rf
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.relay_inbox import InboxPaths


@pytest.fixture
def two_roots(tmp_path: Path) -> tuple[Path, Path]:
    return make_root(tmp_path, {"alice": {}}, name="alpha"), make_root(tmp_path, {"moxie": {}}, name="mini")


def roster_rows(root: Path) -> list[dict[str, object]]:
    path = root / "bot_relay" / "roster.json"
    if not path.exists():
        return []
    return list(json.loads(path.read_text(encoding="utf-8"))["agents"])


def reply_of(root: Path, envelope_id: str) -> dict[str, object] | None:
    path = root / "bot_relay" / "replies" / f"{envelope_id}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def test_rosters_list_the_other_roots_with_online_from_heartbeats(two_roots: tuple[Path, Path]) -> None:
    alpha, mini = two_roots
    with hub_thread({"alpha": alpha, "mini": mini}):
        await_condition(lambda: roster_rows(alpha) and roster_rows(mini), timeout=10, message="both rosters")
        rows = {(r["connection_id"], r["profile"]): r for r in roster_rows(alpha)}
        assert set(rows) == {("mini", "default"), ("mini", "moxie")}
        # No gateway of ours beats on mini: unknown (no flag), never a false "offline" (a seed gateway may serve it).
        assert "online" not in rows[("mini", "moxie")]
        assert rows[("mini", "default")]["handle"] == "hermes"
        assert {r["connection_id"] for r in roster_rows(mini)} == {"alpha"}
        with Gateway(mini, runner=RecordingRunner(), connection_id="mini"):
            await_condition(
                lambda: any(r["profile"] == "moxie" and r.get("online") is True for r in roster_rows(alpha)),
                timeout=10, message="moxie online once mini's gateway beats",
            )
        # A gateway that stops cleanly withdraws its heartbeat: unknown again at the next push.
        await_condition(
            lambda: any(r["profile"] == "moxie" and "online" not in r for r in roster_rows(alpha)),
            timeout=10, message="moxie unknown after mini's gateway stopped",
        )


def test_a_root_served_by_a_seed_gateway_is_not_advertised_offline_and_stays_reachable(
    two_roots: tuple[Path, Path],
) -> None:
    """issue 14 item 5: a seed gateway writes no heartbeat; "offline" would make its agents unreachable."""
    alpha, mini = two_roots
    with hub_thread({"alpha": alpha, "mini": mini}), Gateway(alpha, runner=RecordingRunner(),
                                                             connection_id="alpha") as gw:
        await_condition(lambda: any(r["handle"] == "moxie" for r in gw.roster()), timeout=10)
        assert [r["online"] for r in gw.roster() if r["handle"] == "moxie"] == [None]  # unknown
        ack = gw.message_agent(sender="alice", target="moxie", message="hello")
        assert ack["status"] == "queued", ack  # fail open, as the seed does: the TTL bounds the wait
        await_condition(lambda: rf.list_ids(mini / "bot_relay" / "inbox") == [ack["delivery_id"]], timeout=10,
                        message="the envelope posted to mini's inbox")


def test_an_expired_envelope_gets_an_error_reply(two_roots: tuple[Path, Path]) -> None:
    alpha, mini = two_roots
    rec = RecordingRunner()
    with (LogCapture("INFO") as logs, Gateway(mini, runner=rec, connection_id="mini"),
          hub_thread({"alpha": alpha, "mini": mini})):
        await_condition((alpha / "bot_relay" / "roster.json").exists, timeout=10)
        expired = seed_envelope(target_connection="mini", target_profile="moxie", created_at=time.time() - 5000)
        fresh = seed_envelope(target_connection="mini", target_profile="moxie")
        for env in (expired, fresh):
            seed_write_json(alpha / "bot_relay" / "outbox" / f"{env['id']}.json", env, prefix=".env-")
        for env in (expired, fresh):
            await_condition(lambda e=env: reply_of(alpha, e["id"]), timeout=10, message=f"reply to {env['id']}")
    expired_reply = reply_of(alpha, expired["id"])
    assert expired_reply is not None and expired_reply["reason"] == "queued_expired"
    assert str(expired_reply["error"]).startswith("queued message to @moxie on mini expired after 900s")
    assert [t.delivery_id for t in rec.entered] == [fresh["id"]]  # the expired envelope never reached the target
    # the hub's one line per DM names both ends of an expired one too (it said "alpha: ? → ?")
    assert len(logs.matching(f"hub: delivery {expired['id']} @alice@alpha → @moxie@mini: failed [queued_expired]")) == 1


def test_forwarding_keeps_the_first_reply_and_quarantines_a_hostile_record(two_roots: tuple[Path, Path]) -> None:
    alpha, mini = two_roots
    paths_a, paths_m = InboxPaths.from_root(alpha).ensure(), InboxPaths.from_root(mini).ensure()
    early = uuid.uuid4().hex
    rf.write_reply(paths_a.relay, rp.make_reply(early, error="expired first", reason="queued_expired", now=time.time()))
    late = {"id": early, "at": 1, "reply": "late reply", "error": "", "reason": "", "reply_connection": "alpha"}
    seed_write_json(paths_m.delivered / f"{early}.json", late)
    hostile = uuid.uuid4().hex
    seed_write_json(paths_m.delivered / f"{hostile}.json", {"id": hostile, "reply_connection": "no such conn!"})
    with LogCapture() as logs, hub_thread({"alpha": alpha, "mini": mini}):
        await_condition(lambda: not (paths_m.delivered / f"{early}.json").exists(), timeout=10)
        await_condition(lambda: logs.matching("quarantined", hostile), timeout=10, message="hostile record logged")
    kept = reply_of(alpha, early)
    assert kept is not None
    assert (kept["reply"], kept["error"], kept["reason"]) == ("", "expired first", "queued_expired")
    assert reply_of(alpha, hostile) is None
    assert list((paths_m.relay.quarantine).glob(f"{hostile}.json.*.quarantined"))


def test_a_paused_hub_bridge_still_drains_and_forwards_on_rescans(two_roots: tuple[Path, Path]) -> None:
    alpha, mini = two_roots
    rec = RecordingRunner()
    roots = [HubRoot.make("alpha", alpha), HubRoot.make("mini", mini)]
    with Gateway(mini, runner=rec, connection_id="mini"), Scheduler() as scheduler:
        hub = HubActor.start(roots, scheduler=scheduler)
        bridges = [FsBridge(r.paths.relay.base, hub, scheduler=scheduler, rescan_seconds=0.2) for r in roots]
        for bridge in bridges:
            bridge.paused = True
            bridge.start()
        try:
            envs = [seed_envelope(target_connection="mini", target_profile="moxie") for _ in range(5)]
            for env in envs:
                seed_write_json(alpha / "bot_relay" / "outbox" / f"{env['id']}.json", env, prefix=".env-")
            for env in envs:
                await_condition(lambda e=env: reply_of(alpha, e["id"]), timeout=10, message="reply via rescans")
        finally:
            for bridge in bridges:
                bridge.stop()
            hub.stop()
    assert sorted(t.delivery_id for t in rec.entered) == sorted(e["id"] for e in envs)


def test_run_hub_validates_its_arguments(tmp_path: Path, two_roots: tuple[Path, Path]) -> None:
    alpha, mini = two_roots
    with pytest.raises(ValueError, match="--name"):
        run_hub([alpha, mini], names=["alpha"])
    with pytest.raises(ValueError, match="unique, and same names several roots: each --name must differ"):
        run_hub([alpha, mini], names=["same", "same"])
    with pytest.raises(ValueError, match="the same root is given twice"):  # not a folder-name collision
        run_hub([alpha, alpha / "." ])
    twin = tmp_path / "elsewhere" / alpha.name
    twin.mkdir(parents=True)
    with pytest.raises(ValueError, match="does not look like a Hermes root"):  # an empty directory
        run_hub([alpha, twin])
    (twin / "config.yaml").write_text("{}\n", encoding="utf-8")
    with pytest.raises(ValueError, match="their folder names collide: give each root a --name"):
        run_hub([alpha, twin])
    with pytest.raises(ValueError, match="connection id"):
        run_hub([alpha, mini], names=["bad name", "mini"])
    with pytest.raises(FileNotFoundError):
        run_hub([alpha, tmp_path / "missing"], names=["alpha", "mini"])


@pytest.mark.parametrize(("last", "names", "raises"), [
    ("missing", None, FileNotFoundError),
    ("not a root", None, ValueError),
    ("mini", ["alpha", "bad name"], ValueError),
    ("mini", ["same", "same"], ValueError),
], ids=["missing root", "not a root", "bad --name", "one name twice"])
def test_run_hub_checks_every_root_before_it_changes_any(
    tmp_path: Path, two_roots: tuple[Path, Path], last: str, names: list[str] | None, raises: type[Exception]
) -> None:
    """Regression (CLI review): `relay --root $R4 --root /tmp/nonexistent` exited 2 having made bot_relay/ and
    .bot_relay_tmp/ in $R4 already (each root was made ready in turn, the last one refused)."""
    alpha, mini = two_roots
    (tmp_path / "not a root").mkdir()
    before = sorted(os.listdir(alpha)), sorted(os.listdir(mini))
    with pytest.raises(raises):
        run_hub([alpha, mini if last == "mini" else tmp_path / last], names=names, quiet=True)
    assert (sorted(os.listdir(alpha)), sorted(os.listdir(mini))) == before
    assert "bot_relay" not in before[0] + before[1]


def test_a_socket_in_delivered_is_quarantined_and_the_hub_keeps_forwarding(two_roots: tuple[Path, Path]) -> None:
    alpha, mini = two_roots
    paths_m = InboxPaths.from_root(mini).ensure()
    InboxPaths.from_root(alpha).ensure()
    socket_id = uuid.uuid4().hex
    os.mknod(paths_m.delivered / f"{socket_id}.json", stat.S_IFSOCK | 0o600)  # open() fails with ENXIO
    with LogCapture() as logs, hub_thread({"alpha": alpha, "mini": mini}):
        await_condition(lambda: logs.matching("quarantined", socket_id), timeout=10, message="socket quarantined")
        good = uuid.uuid4().hex
        seed_write_json(paths_m.delivered / f"{good}.json",
                        {"id": good, "at": 1, "reply": "fine", "error": "", "reason": "", "reply_connection": "alpha"})
        await_condition(lambda: reply_of(alpha, good), timeout=10, message="a later record still forwarded")


def test_a_failed_reply_write_keeps_the_delivered_record_for_the_next_rescan(
    two_roots: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    alpha, mini = two_roots
    paths_a, paths_m = InboxPaths.from_root(alpha).ensure(), InboxPaths.from_root(mini).ensure()
    envelope_id = uuid.uuid4().hex
    real_link = os.link
    failing = {"on": True}

    replies_ino = os.stat(paths_a.relay.replies).st_ino

    def link(src: object, dst: object, *args: object, **kwargs: object) -> None:
        dst_dir_fd = kwargs.get("dst_dir_fd")  # writes link relative to the directory they opened
        into = os.fstat(dst_dir_fd).st_ino if isinstance(dst_dir_fd, int) else os.stat(os.path.dirname(str(dst))).st_ino
        if failing["on"] and into == replies_ino:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_link(src, dst, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "link", link)
    record = {"id": envelope_id, "at": 1, "reply": "the answer", "error": "", "reason": "", "reply_connection": "alpha"}
    seed_write_json(paths_m.delivered / f"{envelope_id}.json", record)
    with LogCapture() as logs, hub_thread({"alpha": alpha, "mini": mini}, rescan_seconds=0.2):
        await_condition(
            lambda: logs.matching("reply", envelope_id, "failed"), timeout=10, message="write failure logged"
        )
        assert (paths_m.delivered / f"{envelope_id}.json").exists()  # not thrown away
        failing["on"] = False  # the disk has room again: the next rescan forwards it
        await_condition(lambda: reply_of(alpha, envelope_id) is not None, timeout=10, message="forwarded on retry")
    kept = reply_of(alpha, envelope_id)
    assert kept is not None and kept["reply"] == "the answer"
    assert not (paths_m.delivered / f"{envelope_id}.json").exists()


def test_the_hub_forwards_envelopes_found_together_oldest_first(two_roots: tuple[Path, Path]) -> None:
    """An outbox that filled while no hub ran is drained in the order it was written, not by the random ids."""
    alpha, mini = two_roots
    outbox = InboxPaths.from_root(alpha).ensure().relay.outbox
    envelopes = [seed_envelope(target_connection="mini", target_profile="moxie", message=f"step {n}",
                               envelope_id=envelope_id)
                 for n, envelope_id in enumerate(sorted((uuid.uuid4().hex for _ in range(4)), reverse=True))]
    for n, env in enumerate(envelopes):  # written oldest first: the id order is the reverse
        seed_write_json(outbox / f"{env['id']}.json", env, prefix=".env-")
        os.utime(outbox / f"{env['id']}.json", (1_700_000_000 + n, 1_700_000_000 + n))
    rec = RecordingRunner()
    # mini takes what the hub posts as its file events arrive, in posting order; its rescan would sort
    # posts of one clock tick (equal mtimes) by id, so none runs here
    config = {"bot_mode": {"rescan_seconds": 3600}}
    with Gateway(mini, runner=rec, connection_id="mini", config=config), hub_thread({"alpha": alpha, "mini": mini}):
        for env in envelopes:
            await_condition(lambda e=env: reply_of(alpha, e["id"]), timeout=10, message=f"reply to {env['id']}")
    assert [body_of(t.content) for t in rec.entered] == ["step 0", "step 1", "step 2", "step 3"]


def test_a_reply_over_a_mebibyte_crosses_the_relay_whole(two_roots: tuple[Path, Path]) -> None:
    """Regression: the hub quarantined a 1.5 MB delivered record (the 1 MiB cap of every relay file), and the
    sender, whose DM had run, got delivery_timeout 900 s later."""
    alpha, mini = two_roots
    big = "B" * 1_500_000 + "\x01" * 100_000  # control characters: JSON escapes each into 6 bytes
    with hub_thread({"alpha": alpha, "mini": mini}), \
            Gateway(mini, runner=RecordingRunner(lambda turn: big), connection_id="mini"), \
            Gateway(alpha, runner=RecordingRunner(), connection_id="alpha") as gw:
        await_condition(lambda: any(r["handle"] == "moxie" for r in gw.roster()), timeout=20)
        ack = gw.message_agent(sender="alice", target="moxie@mini", message="the long answer, please")
        assert ack["status"] == "queued", ack
        outcome = gw.wait_outcome(ack["delivery_id"], timeout=60)
    assert outcome["status"] == "replied" and outcome["reply"] == big, (outcome["status"], len(outcome["reply"]))
    assert not list((mini / "bot_relay" / "quarantine").glob("*")) and not list(
        (alpha / "bot_relay" / "quarantine").glob("*"))


def test_a_roots_connection_label_is_how_the_other_roots_see_it(tmp_path: Path) -> None:
    """Regression: the hub wrote every row's connection_label as the root's connection id, so a configured
    bot_mode.connection_label ("@dave on Mini") never reached senders over the file relay."""
    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    mini = make_root(tmp_path, {"moxie": {}}, name="mini", config={"bot_mode": {"connection_label": "Mini"}})
    with hub_thread({"alpha": alpha, "mini": mini}):
        await_condition(lambda: roster_rows(alpha) and roster_rows(mini), timeout=10, message="both rosters")
        assert {r["connection_label"] for r in roster_rows(alpha)} == {"Mini"}
        assert {r["connection_label"] for r in roster_rows(mini)} == {"alpha"}  # none configured: its id


def test_a_dm_the_hub_cannot_hand_to_a_root_whose_bot_relay_was_swapped_is_not_delivered_and_retryable(
    two_roots: tuple[Path, Path],
) -> None:
    """The reason was ``unknown`` (not retryable) though nothing ran: resending once that root is fixed is safe."""
    alpha, mini = two_roots
    with hub_thread({"alpha": alpha, "mini": mini}), \
            Gateway(alpha, runner=RecordingRunner(), connection_id="alpha") as gw:
        await_condition(lambda: any(r["handle"] == "moxie" for r in gw.roster()), timeout=20, message="the roster")
        elsewhere = mini.parent / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        (mini / "bot_relay").rename(mini.parent / "bot_relay.moved")
        (mini / "bot_relay").symlink_to(elsewhere, target_is_directory=True)
        ack = gw.message_agent(sender="alice", target="moxie@mini", message="are you there?")
        assert ack["status"] == "queued", ack
        out = gw.wait_outcome(ack["delivery_id"], timeout=30)
    assert (out["status"], out["reason"], out["retryable"]) == ("failed", "runtime_offline", True), out
    assert "NOT delivered" in out["error"] and list(elsewhere.iterdir()) == []


def _hostile_outside(directory: Path) -> dict[str, str]:
    """Three files a swapped ``delivered/`` points the hub at: a valid record, garbage, an unknown connection."""
    directory.mkdir()
    a, b, c = (uuid.uuid4().hex for _ in range(3))
    files = {
        f"{a}.json": json.dumps({"id": a, "at": 1, "reply": "victim A", "error": "", "reason": "",
                                 "reply_connection": "alpha"}),
        f"{b}.json": "victim B: not json",
        f"{c}.json": json.dumps({"id": c, "at": 1, "reply": "victim C", "reply_connection": "zzz"}),
    }
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
        os.chmod(directory / name, 0o600)
    return files


def test_the_hub_never_follows_a_delivered_swapped_for_a_symlink(two_roots: tuple[Path, Path]) -> None:
    """Regression: with mini's gateway paused and mini's delivered/ swapped for a symlink to a directory outside
    the root, the hub forwarded the valid record it found there to alpha, deleted it, and moved the other two
    files from outside the root into mini's quarantine. Now nothing there is read, removed or moved, the refusal
    is logged once (not at every pass), and with no gateway of ours beating on mini the hub puts a real
    directory back by the gateway's own rule (quarantine_strays)."""
    from actors import Rescan
    from hermes_actors.store.relay_heartbeat import remove_heartbeat, write_heartbeat

    alpha, mini = two_roots
    paths_m = InboxPaths.from_root(mini).ensure()
    outside = mini.parent / "outside"
    files = _hostile_outside(outside)
    roots = [HubRoot.make("alpha", alpha), HubRoot.make("mini", mini)]
    with LogCapture("INFO") as logs, Scheduler() as scheduler:
        hub = HubActor.start(roots, scheduler=scheduler)
        try:
            os.rmdir(paths_m.delivered)
            paths_m.delivered.symlink_to(outside, target_is_directory=True)
            for _ in range(3):  # three passes, driven here: no timing involved
                write_heartbeat(paths_m, "mini", now=time.time())  # a (paused) gateway of ours: it puts dirs back
                hub.ask(Rescan("manual"), timeout=30)
                for name in files:  # the file event a watch may still report for the old directory
                    hub.ask(FileAppeared(paths_m.delivered / name), timeout=30)
            assert {p.name: p.read_text(encoding="utf-8") for p in outside.iterdir()} == files
            assert list((alpha / "bot_relay" / "replies").iterdir()) == []
            assert not [p for p in paths_m.relay.quarantine.iterdir() if p.name[:37] in files]
            assert len(logs.matching("hub:", "delivered", "mini", "cannot be used")) == 1, logs.lines
            remove_heartbeat(paths_m)  # no gateway of ours on mini any more: the hub puts delivered/ back
            hub.ask(Rescan("manual"), timeout=30)
        finally:
            hub.stop()
    assert paths_m.delivered.is_dir() and not paths_m.delivered.is_symlink()
    [link] = paths_m.relay.quarantine.glob("delivered.*.quarantined")
    assert link.is_symlink()  # the link itself moved aside; what it pointed at was never touched
    assert {p.name: p.read_text(encoding="utf-8") for p in outside.iterdir()} == files
    assert logs.matching("hub:", "delivered", "usable directory again"), logs.lines


@pytest.mark.parametrize("how", ["file", "symlink to a file"])
def test_a_root_whose_bot_relay_is_no_directory_stops_none_of_the_others(tmp_path: Path, how: str) -> None:
    """Regression: with one root's ``bot_relay/`` a file (or a symlink to one), the clean-up's NotADirectoryError
    ended the unsupervised HubActor at its next rescan: no root was relayed any more. Now that root is refused
    (logged once while it lasts) and the others keep relaying."""
    from actors import Rescan

    broken = make_root(tmp_path, {"zed": {}}, name="broken")
    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    roots = [HubRoot.make("broken", broken), HubRoot.make("alpha", alpha), HubRoot.make("mini", mini)]
    envelopes = [seed_envelope(target_connection="mini", target_profile="moxie") for _ in range(3)]
    with LogCapture("INFO") as logs, Scheduler() as scheduler:
        hub = HubActor.start(roots, scheduler=scheduler)
        try:
            hub.ask(Rescan("manual"), timeout=30)  # started, with its shelves: the swap comes while it runs
            (broken / "bot_relay").rename(tmp_path / "bot_relay.aside")
            if how == "file":
                (broken / "bot_relay").write_text("not a directory", encoding="utf-8")
            else:
                (tmp_path / "a-file").write_text("x", encoding="utf-8")
                (broken / "bot_relay").symlink_to(tmp_path / "a-file")
            for env in envelopes:  # one per pass: each is taken by the rescan after the broken root's
                seed_write_json(alpha / "bot_relay" / "outbox" / f"{env['id']}.json", env)
                hub.ask(Rescan("manual"), timeout=30)
        finally:
            hub.stop()
    assert sorted(rf.list_ids(mini / "bot_relay" / "inbox")) == sorted(e["id"] for e in envelopes)
    assert len(logs.matching("bot_relay cannot be used")) == 1, logs.lines
    assert len(logs.matching("hub:", "outbox of broken", "cannot be used")) == 1, logs.lines
    assert (broken / "bot_relay").is_symlink() == (how != "file")  # never moved: the user's to fix


def test_an_os_error_in_one_roots_rescan_is_logged_once_and_the_others_are_relayed(
    two_roots: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever one root's rescan meets stops neither the (unsupervised) hub nor the other roots: it is logged
    once while it lasts, naming the root."""
    from actors import Rescan
    from hermes_actors.relay import hub as hub_module

    alpha, mini = two_roots
    roots = [HubRoot.make("alpha", alpha), HubRoot.make("mini", mini)]
    real = hub_module.gateway_alive

    def alive(paths: InboxPaths) -> bool:  # the first thing each root's rescan does
        if paths.relay.root == mini:
            raise PermissionError(13, "Permission denied", str(paths.heartbeat))
        return real(paths)

    env = seed_envelope(target_connection="mini", target_profile="moxie")
    seed_write_json(alpha / "bot_relay" / "outbox" / f"{env['id']}.json", env)
    with LogCapture() as logs, Scheduler() as scheduler:
        hub = HubActor.start(roots, scheduler=scheduler)
        try:
            monkeypatch.setattr(hub_module, "gateway_alive", alive)
            for _ in range(3):
                hub.ask(Rescan("manual"), timeout=30)
        finally:
            hub.stop()
    assert rf.list_ids(mini / "bot_relay" / "inbox") == [env["id"]]
    assert len(logs.matching("hub: the rescan of mini", "PermissionError", "goes on with the other roots")) == 1, \
        logs.lines


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_the_hubs_refusal_promises_a_put_back_only_where_there_is_one(two_roots: tuple[Path, Path]) -> None:
    """Regression: a relay directory of another user was logged as put back by the gateway or the hub, but the
    put-back only replaces symlinks and files (it never moves a real directory): it stayed refused for ever.
    Now that refusal says nobody puts it back and what to do; a symlink's still says who puts it back."""
    from actors import Rescan
    from hermes_actors.store.relay_heartbeat import write_heartbeat

    alpha, mini = two_roots
    paths_m = InboxPaths.from_root(mini).ensure()
    roots = [HubRoot.make("alpha", alpha), HubRoot.make("mini", mini)]
    os.chown(paths_m.delivered, 65534, 65534)
    os.rmdir(paths_m.relay.outbox)
    paths_m.relay.outbox.symlink_to(mini.parent, target_is_directory=True)
    write_heartbeat(paths_m, "mini", now=time.time())  # a (paused) gateway of ours: the hub leaves mini's tree
    with LogCapture("INFO") as logs, Scheduler() as scheduler:
        hub = HubActor.start(roots, scheduler=scheduler)
        try:
            hub.ask(Rescan("manual"), timeout=30)
        finally:
            hub.stop()
    [theirs] = logs.matching("hub:", "delivered of mini", "cannot be used")
    assert "owned by uid 65534" in theirs and "Nothing puts it back" in theirs and "chown" in theirs, theirs
    [link] = logs.matching("hub:", "outbox of mini", "cannot be used")
    assert "puts a real directory back" in link, link
    assert os.stat(paths_m.delivered).st_uid == 65534  # never moved: a real directory


def test_a_hub_start_puts_back_a_relay_directory_left_swapped_for_a_symlink(two_roots: tuple[Path, Path]) -> None:
    """Regression (review, kept_reply_kill9.py for the hub): a root whose ``delivered/`` was left swapped for a
    symlink refused the hub's start, for every root (``HostileFileError … delivered is a symlink or not a
    directory; refusing to use it``), although its rescan would put it back. The start now puts it back by the
    rescan's rule, as a gateway's start does: the link moved into ``quarantine/`` as is, what it points at
    untouched."""
    alpha, mini = two_roots
    paths_m = InboxPaths.from_root(mini).ensure()
    outside = mini.parent / "outside"
    files = _hostile_outside(outside)
    paths_m.delivered.rmdir()
    paths_m.delivered.symlink_to(outside, target_is_directory=True)
    roots = [HubRoot.make("alpha", alpha), HubRoot.make("mini", mini)]
    assert roots[1].paths.delivered.is_dir() and not roots[1].paths.delivered.is_symlink()
    [link] = paths_m.relay.quarantine.glob("delivered.*.quarantined")
    assert link.is_symlink()
    assert {p.name: p.read_text(encoding="utf-8") for p in outside.iterdir()} == files


HUB_SIGNALLED_ON_ANOTHER_THREAD = SIGNAL_ANOTHER_THREAD + r"""
import builtins
from pathlib import Path
from hermes_actors.relay.hub import run_hub

printed = []
real_print = print
def print(*args, **kwargs):
    real_print(*args, **kwargs)
    printed.append(" ".join(map(str, args)))
builtins.print = print

signal_another_thread(signal.SIGTERM, ready=lambda: any("relay hub running" in line for line in printed))
sys.exit(run_hub([Path(sys.argv[1]), Path(sys.argv[2])], names=["alpha", "mini"]))
"""


def test_the_hub_stops_on_a_signal_handed_to_another_thread_than_main(
    tmp_path: Path, two_roots: tuple[Path, Path]
) -> None:
    """Regression: the hub's main thread waited on an event; a SIGTERM the kernel handed to one of its
    watcher or actor threads ran no handler, and the hub went on running."""
    import subprocess
    import sys

    alpha, mini = two_roots
    script = tmp_path / "hub_signalled.py"
    script.write_text(HUB_SIGNALLED_ON_ANOTHER_THREAD, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.run([sys.executable, str(script), str(alpha), str(mini)], capture_output=True, text=True,
                          env=env, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert "relay hub running for alpha, mini" in proc.stdout
    # Regression (acceptance review): the SIGTERM stopped it without a word; serve says "gateway stopped"
    assert "relay hub stopped" in proc.stderr.splitlines(), proc.stderr
    assert "warning" not in proc.stderr  # two roots: nothing to warn of


def test_relay_stops_cleanly_on_sighup_as_on_sigterm(tmp_path: Path, two_roots: tuple[Path, Path]) -> None:
    """Regression (CLI fuzz review): the terminal closing (SIGHUP) killed `relay` (exit 129) without `relay hub
    stopped`, where serve stops cleanly on it; the hub takes serve's stop signals, SIGINT, SIGTERM and SIGHUP."""
    import signal
    import subprocess
    import sys

    alpha, mini = two_roots
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.Popen([sys.executable, "-m", "hermes_actors.cli.main", "relay", "--root", str(alpha),
                             "--root", str(mini)], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "relay hub running for alpha, mini"
        proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, (proc.returncode, err)
    assert "relay hub stopped" in err.splitlines(), err


def test_a_hub_of_one_root_warns_that_it_relays_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression (acceptance review): `relay --root A` alone ran and relayed nothing, without a word."""
    import threading

    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    stopped = threading.Event()
    stopped.set()  # it starts, says what it says, then stops at once
    codes: list[int] = []
    # on another thread: on the main one it would take pytest's SIGINT and SIGTERM handlers for its own
    hub = threading.Thread(target=lambda: codes.append(run_hub([alpha], stop=stopped)))
    hub.start()
    hub.join(60)
    assert codes == [0]
    out, err = capsys.readouterr()
    assert out.splitlines() == ["relay hub running for alpha"]
    assert err.splitlines() == [f"warning: a relay hub joins two or more roots; with only {alpha} it relays nothing "
                                "(give each root to relay with its own --root)", "relay hub stopped"]


def test_a_hub_of_one_root_leaves_its_roster_and_queued_dms_alone(tmp_path: Path) -> None:
    """Regression (review): `relay --root R` alone, "it relays nothing", rewrote R's roster.json (the Desktop's)
    with no rows, so its agents became "no teammate named …", and failed every DM queued in R's outbox/
    ``runtime_offline`` "connection 'mini' is not known to this relay": the Desktop serving R lost them. It now
    touches nothing: the roster, the outbox/ and the replies/ are as they were, and no hub directory is made."""
    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    roster = write_roster_file(alpha, [remote_row("dave", "mini"), remote_row("default", "mini", handle="hermes")])
    env = seed_envelope(target_connection="mini", target_profile="dave")
    seed_write_json(alpha / "bot_relay" / "outbox" / f"{env['id']}.json", env, prefix=".env-")
    before = roster.read_bytes(), roster.stat().st_mtime_ns
    stopped = threading.Event()
    stopped.set()  # it starts (a hub's start drains every outbox and pushes the rosters), then stops
    codes: list[int] = []
    hub = threading.Thread(target=lambda: codes.append(run_hub([alpha], stop=stopped, quiet=True)))
    hub.start()
    hub.join(60)
    assert codes == [0]
    assert (roster.read_bytes(), roster.stat().st_mtime_ns) == before
    assert rf.list_ids(alpha / "bot_relay" / "outbox") == [env["id"]]
    assert reply_of(alpha, env["id"]) is None
    assert not (alpha / "bot_relay" / "hubclaims").exists()


def test_a_dm_for_a_connection_the_hub_does_not_relay_waits_in_its_outbox_for_the_hub_that_does(
    tmp_path: Path,
) -> None:
    """Regression (review): a hub that did not know the DM's connection answered it ``runtime_offline`` "connection
    'mini' is not known to this relay; the message was NOT delivered.", though another relay serving the root (the
    Desktop) would deliver it. It now puts it back into the outbox/, unanswered and never claimed again, and a
    relay that knows the connection delivers it."""
    from actors import ManualScheduler, Rescan

    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    zeta = make_root(tmp_path, {"zed": {}}, name="zeta")
    env = seed_envelope(target_connection="mini", target_profile="moxie")
    outbox = alpha / "bot_relay" / "outbox"
    seed_write_json(outbox / f"{env['id']}.json", env, prefix=".env-")
    with LogCapture("INFO") as logs:
        hub = HubActor.start([HubRoot.make("alpha", alpha), HubRoot.make("zeta", zeta)], scheduler=ManualScheduler())
        try:
            hub.ask(Rescan("manual"), timeout=30)
            hub.ask(FileAppeared(outbox / f"{env['id']}.json"), timeout=30)  # its put-back's event
            hub.ask(Rescan("manual"), timeout=30)
        finally:
            hub.stop()
    assert rf.list_ids(outbox) == [env["id"]]
    assert reply_of(alpha, env["id"]) is None
    assert rf.list_ids(alpha / "bot_relay" / "claimed") == []
    assert len(logs.matching(f"hub: delivery {env['id']} @alice@alpha → @moxie@mini left in the outbox/ of alpha",
                             "relays only for alpha, zeta")) == 1  # claimed once, never again
    rec = RecordingRunner()
    with Gateway(mini, runner=rec, connection_id="mini"), hub_thread({"alpha": alpha, "mini": mini}):
        await_condition(lambda: reply_of(alpha, env["id"]), timeout=30, message="the reply through the mini hub")
    reply = reply_of(alpha, env["id"])
    assert reply is not None and reply["error"] == "" and reply["reply"], reply
    assert [t.delivery_id for t in rec.entered] == [env["id"]]


def test_a_hub_keeps_the_roster_rows_of_connections_it_does_not_relay(tmp_path: Path) -> None:
    """Regression (review): the hub rewrote a root's roster.json with only its own roots' rows, dropping the
    agents another relay (the Desktop) had pushed there: DMs to them were refused "no teammate named …"."""
    from actors import ManualScheduler
    from hermes_actors.messages import RosterPush

    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    write_roster_file(alpha, [remote_row("dave", "laptop", online=False), remote_row("gone", "mini")])
    hub = HubActor.start([HubRoot.make("alpha", alpha), HubRoot.make("mini", mini)], scheduler=ManualScheduler())
    try:
        hub.ask(RosterPush(), timeout=30)
    finally:
        hub.stop()
    rows = {(r["connection_id"], r["profile"]): r for r in roster_rows(alpha)}
    # the Desktop's row as it was; mini's rows are the hub's own (its stale "gone" replaced)
    assert set(rows) == {("laptop", "dave"), ("mini", "default"), ("mini", "moxie")}
    assert rows[("laptop", "dave")]["online"] is False


# ── a DM left in an inbox/ no gateway of ours takes (a seed-served root): the sender's TTL bounds its wait ──


def _ttl_roots(tmp_path: Path, ttl: float) -> tuple[Path, Path]:
    """alpha (the sender, with ``ttl``) and mini (the target, default TTL), no gateway of ours on either."""
    config = {"bot_mode": {"envelope_ttl_seconds": ttl}}
    return (make_root(tmp_path, {"alice": {}}, name="alpha", config=config),
            make_root(tmp_path, {"moxie": {}}, name="mini"))


def _posted(alpha: Path, mini: Path, *, age: float) -> dict[str, object]:
    """An envelope from alpha the hub posted to mini's inbox/ ``age`` seconds ago (as ``post_to_inbox`` does)."""
    from hermes_actors.store.relay_inbox import post_to_inbox

    env = seed_envelope(target_connection="mini", target_profile="moxie", created_at=time.time() - age)
    post_to_inbox(InboxPaths.from_root(mini).ensure(), env, "alpha")
    return env


def _held_by_the_hub(mini: Path) -> list[Path]:
    return [p for p in (mini / "bot_relay" / "hubclaims" / "expiring").rglob("*.json")]


def test_a_dm_waiting_in_an_inbox_no_gateway_of_ours_reads_is_answered_expired_at_the_senders_ttl(
    tmp_path: Path,
) -> None:
    """Regression (seed-interop review, s12b): the hub took the DM out of the sender's outbox/ (where the sender's
    own TTL expiry looks) into the inbox/ of a root no gateway of ours serves (a seed gateway never reads it), and
    nothing ever expired it there: the sender waited reply_wait_seconds and was told ``delivery_timeout`` "may
    still be delivered", though nothing would ever read that inbox. The hub now answers it ``queued_expired``,
    the seed's text with the sender root's TTL, once it waited past that TTL."""
    alpha, mini = _ttl_roots(tmp_path, 2)
    env = seed_envelope(target_connection="mini", target_profile="moxie")
    with LogCapture("INFO") as logs, hub_thread({"alpha": alpha, "mini": mini}, rescan_seconds=0.5):
        seed_write_json(alpha / "bot_relay" / "outbox" / f"{env['id']}.json", env, prefix=".env-")
        await_condition(lambda: reply_of(alpha, env["id"]), timeout=30, message="the expiry reply")
        await_condition(lambda: not _held_by_the_hub(mini), timeout=10, message="off the hub's shelf")
    reply = reply_of(alpha, env["id"])
    assert reply is not None and reply["reason"] == "queued_expired", reply
    assert reply["error"] == rp.expired_error_text("moxie", "mini", 2)
    assert int(reply["at"]) - int(env["created_at"]) >= 2  # not before the TTL ran out (both whole seconds)
    assert rf.list_ids(mini / "bot_relay" / "inbox") == []  # no late delivery by a gateway started later
    assert len(logs.matching(f"hub: delivery {env['id']} @alice@alpha → @moxie@mini: failed [queued_expired]")) == 1


def _manual_hub(alpha: Path, mini: Path) -> tuple[Any, Any]:
    from actors import ManualScheduler

    scheduler = ManualScheduler()
    return HubActor.start([HubRoot.make("alpha", alpha), HubRoot.make("mini", mini)], scheduler=scheduler), scheduler


def test_a_fresh_dm_in_such_an_inbox_is_left_for_its_taker_until_its_deadline(tmp_path: Path) -> None:
    from actors import FileRemoved, Rescan

    alpha, mini = _ttl_roots(tmp_path, 60)
    env = _posted(alpha, mini, age=0)
    hub, scheduler = _manual_hub(alpha, mini)
    try:
        hub.ask(Rescan("manual"), timeout=30)
        scheduler.advance(30)  # half its TTL: nothing is due
        hub.ask(FileRemoved(mini / "x"), timeout=30)  # every message told before this one is handled
        assert rf.list_ids(mini / "bot_relay" / "inbox") == [env["id"]]
        assert reply_of(alpha, env["id"]) is None
    finally:
        hub.stop()


def test_a_gateway_taking_the_dm_at_its_deadline_owns_it_and_the_hub_answers_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The race: the hub's deadline fires and a gateway takes the envelope at that very moment (between the
    hub's look into inbox/ and its own rename). The rename decides: the gateway owns it (its turn runs, its
    reply is the one), and the hub writes no queued_expired: a turn never runs AND is answered expired."""
    from actors import FileRemoved, Rescan
    from hermes_actors.relay import drain
    from hermes_actors.store.relay_shelf import Shelf

    alpha, mini = _ttl_roots(tmp_path, 2)
    env = _posted(alpha, mini, age=100)
    paths_m = InboxPaths.from_root(mini)
    gateway_shelf = Shelf(paths_m.taken_parent, within=mini)
    gateway = paths_m.on_shelf(gateway_shelf.open())
    real_take = drain.take_from_inbox
    takes: list[object] = []

    def gateway_first(paths: InboxPaths, envelope_id: str) -> Path | None:
        if paths.taken != gateway.taken and not takes:  # the hub's take: a gateway's rename lands just before it
            takes.append(real_take(gateway, envelope_id))
        return real_take(paths, envelope_id)

    monkeypatch.setattr(drain, "take_from_inbox", gateway_first)
    hub, scheduler = _manual_hub(alpha, mini)
    try:
        hub.ask(Rescan("manual"), timeout=30)
        assert scheduler.advance(1) >= 1  # the deadline (already past) fires
        hub.ask(FileRemoved(mini / "x"), timeout=30)
        counters = hub.proxy().counters.get(timeout=30)
    finally:
        hub.stop()
        gateway_shelf.close()
    assert takes == [gateway.taken / f"{env['id']}.json"]  # the gateway won the rename
    assert (gateway.taken / f"{env['id']}.json").exists()  # and holds it: its turn runs, its reply answers
    assert reply_of(alpha, env["id"]) is None
    assert counters["expired"] == 0
    assert not _held_by_the_hub(mini)


def test_the_hub_taking_the_dm_at_its_deadline_answers_it_once_and_no_gateway_finds_it(tmp_path: Path) -> None:
    from actors import FileRemoved, Rescan
    from hermes_actors.store.relay_inbox import take_from_inbox
    from hermes_actors.store.relay_shelf import Shelf

    alpha, mini = _ttl_roots(tmp_path, 2)
    env = _posted(alpha, mini, age=100)
    hub, scheduler = _manual_hub(alpha, mini)
    try:
        hub.ask(Rescan("manual"), timeout=30)
        hub.ask(Rescan("manual"), timeout=30)  # a second pass keeps one deadline, not two
        assert scheduler.advance(1) >= 1
        hub.ask(FileRemoved(mini / "x"), timeout=30)
        assert scheduler.advance(10) >= 0
        hub.ask(Rescan("manual"), timeout=30)
        counters = hub.proxy().counters.get(timeout=30)
    finally:
        hub.stop()
    reply = reply_of(alpha, env["id"])
    assert reply is not None and reply["reason"] == "queued_expired"
    assert reply["error"] == rp.expired_error_text("moxie", "mini", 2)
    assert counters["expired"] == 1
    shelf = Shelf(InboxPaths.from_root(mini).taken_parent, within=mini)
    late_gateway = InboxPaths.from_root(mini).on_shelf(shelf.open())
    try:
        assert take_from_inbox(late_gateway, env["id"]) is None  # gone from inbox/: no gateway ever runs it
    finally:
        shelf.close()
    assert not _held_by_the_hub(mini)


def test_a_hub_killed_after_taking_an_expired_dm_leaves_it_to_the_next_hub_which_answers_it(tmp_path: Path) -> None:
    from hermes_actors.store.relay_inbox import take_from_inbox
    from hermes_actors.store.relay_shelf import Shelf

    alpha, mini = _ttl_roots(tmp_path, 2)
    env = _posted(alpha, mini, age=100)
    paths_m = InboxPaths.from_root(mini)
    dead = Shelf(paths_m.hubclaims / "expiring", within=mini)  # the killed hub's shelf: its lock is released below
    assert take_from_inbox(paths_m.on_shelf(dead.open()), env["id"]) is not None
    dead.close()  # a shelf still holding an envelope stays, unlocked: the next hub adopts it
    hub, _ = _manual_hub(alpha, mini)
    hub.stop()
    reply = reply_of(alpha, env["id"])
    assert reply is not None and reply["reason"] == "queued_expired"
    assert not _held_by_the_hub(mini) and rf.list_ids(mini / "bot_relay" / "inbox") == []


def test_a_gateway_starting_while_the_hub_expires_its_inbox_gives_every_dm_exactly_one_outcome(
    tmp_path: Path,
) -> None:
    """The race for real: DMs whose sender TTL runs out around the moment our gateway starts on the target. Each
    is either run by the gateway (its reply is the turn's) or answered queued_expired by the hub (never run):
    never both, never neither."""
    alpha, mini = _ttl_roots(tmp_path, 3)
    envs = [_posted(alpha, mini, age=age) for age in (0, 1, 2, 2, 3, 3, 3, 4, 4, 5)]
    rec = RecordingRunner()
    with hub_thread({"alpha": alpha, "mini": mini}, rescan_seconds=0.2), \
            Gateway(mini, runner=rec, connection_id="mini"):
        for env in envs:
            await_condition(lambda e=env: reply_of(alpha, e["id"]), timeout=60, message=f"reply to {env['id']}")
    ran = [t.delivery_id for t in rec.entered]
    assert len(ran) == len(set(ran))
    for env in envs:
        reply = reply_of(alpha, env["id"])
        assert reply is not None
        assert (reply["reason"] == "queued_expired") == (env["id"] not in ran), (reply, ran)


def test_a_malformed_envelope_the_hub_quarantines_is_answered_not_delivered(two_roots: tuple[Path, Path]) -> None:
    """Regression (seed-interop review, s3): a seed-format envelope with hop 1001 (or "3", true, -1, 2.0) was
    quarantined by the hub with no reply: its sender waited reply_wait_seconds and was then told it "may still be
    delivered". The sender now gets an error reply at once (reason unknown) saying it was NOT delivered."""
    alpha, mini = two_roots
    bad = {**seed_envelope(target_connection="mini", target_profile="moxie"), "hop": 1001}
    with hub_thread({"alpha": alpha, "mini": mini}):
        seed_write_json(alpha / "bot_relay" / "outbox" / f"{bad['id']}.json", bad, prefix=".env-")
        await_condition(lambda: reply_of(alpha, bad["id"]), timeout=30, message="the error reply")
    reply = reply_of(alpha, bad["id"])
    assert reply is not None and reply["reason"] == "unknown" and reply["reply"] == ""
    assert "malformed" in str(reply["error"]) and "'hop'" in str(reply["error"]) and "NOT delivered" in str(
        reply["error"])
    assert rf.list_ids(mini / "bot_relay" / "inbox") == []
    assert list((alpha / "bot_relay" / "quarantine").glob(f"{bad['id']}.json.*.quarantined"))


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_an_envelope_nested_deeper_than_the_relay_can_write_is_malformed_not_a_temporary_fault(
    two_roots: tuple[Path, Path]
) -> None:
    """Regression (hostile-files review): an extra key nested 300 deep read fine but failed to write (orjson:
    "Recursion limit reached"), so the hub answered `runtime_offline` ("could not hand the message to mini … It
    was NOT delivered"), a temporary fault its sender may resend, and kept the envelope, never quarantined, though
    resending can never work. Its reader now refuses it as malformed: quarantined, answered `unknown`."""
    alpha, mini = two_roots
    deep = {**seed_envelope(target_connection="mini", target_profile="moxie"), "x": _nested(300)}
    with hub_thread({"alpha": alpha, "mini": mini}):
        seed_write_json(alpha / "bot_relay" / "outbox" / f"{deep['id']}.json", deep, prefix=".env-")
        await_condition(lambda: reply_of(alpha, deep["id"]), timeout=30, message="the error reply")
    reply = reply_of(alpha, deep["id"])
    assert reply is not None and reply["reason"] == "unknown" and reply["reply"] == "", reply
    assert "malformed" in str(reply["error"]) and "levels deep" in str(reply["error"]), reply
    assert "NOT delivered" in str(reply["error"])
    assert rf.list_ids(mini / "bot_relay" / "inbox") == []
    assert list((alpha / "bot_relay" / "quarantine").glob(f"{deep['id']}.json.*.quarantined"))


@pytest.mark.skipif(not IS_ROOT, reason="chown to another uid needs root")
def test_an_acked_dms_envelope_replaced_by_another_users_file_is_answered_not_delivered(
        tmp_path: Path, gateways: list[Gateway]) -> None:
    """Regression (hostile review, b5): an acked DM's ``outbox/<id>.json`` replaced by a file of another uid was
    quarantined by the hub without any answer: the sender waited ``reply_wait_seconds`` (900 s here) and ended
    ``delivery_timeout`` ("may still be delivered"). The hub answers it now as it answers a malformed envelope:
    failed ``unknown``, NOT delivered, the reason in the text, at once."""
    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    write_roster_file(alpha, [remote_row("moxie", "mini", online=True)])
    gw = start_gateway(gateways, alpha, connection_id="alpha", durable=False)  # no hub yet: the DM stays queued
    ack = gw.message_agent(sender="alice", target="moxie@mini", message="hello")
    assert ack.get("status") == "queued", ack
    key = ack["delivery_id"]
    outbox = alpha / "bot_relay" / "outbox"
    forged = {**json.loads((outbox / f"{key}.json").read_text(encoding="utf-8")), "message": "REPLACED"}
    place("other-uid", json.dumps(forged).encode(), outbox / f"{key}.json", tmp_path / "staging")
    with hub_thread({"alpha": alpha, "mini": mini}):
        outcome = gw.wait_outcome(key, timeout=30)
    assert (outcome["status"], outcome["reason"], outcome["retryable"]) == ("failed", "unknown", False), outcome
    assert "NOT delivered" in outcome["error"] and "is owned by uid 65534" in outcome["error"], outcome
    assert rf.list_ids(mini / "bot_relay" / "inbox") == []  # never handed on
    assert list((alpha / "bot_relay" / "quarantine").glob(f"{key}.json.*.quarantined"))


def test_an_unreadable_file_put_in_an_outbox_under_a_delivered_dms_id_never_beats_its_real_reply(
        tmp_path: Path, gateways: list[Gateway]) -> None:
    """Regression (review diffrev17, s6): alpha's DM runs on mini; meanwhile a file the hub refuses unread
    (group-writable: refused as another uid's file is) is put at alpha's ``outbox/<id>.json``. The hub answered it
    "NOT delivered", first in ``replies/``, so that won over mini's real reply: alice heard NOT delivered for a DM
    that ran (and could resend it). The DM is filed in ``claimed/``: the file is quarantined unanswered, and
    alpha's outcome is mini's real reply."""
    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    write_roster_file(alpha, [remote_row("moxie", "mini", online=True)])
    release = threading.Event()

    def slow(turn: Any) -> str:
        release.wait(30)
        return f"moxie did it: {body_of(turn.content)}"

    mini_runner = RecordingRunner(slow)
    start_gateway(gateways, mini, mini_runner, connection_id="mini", durable=False)
    gw = start_gateway(gateways, alpha, connection_id="alpha", durable=False)
    quarantined = alpha / "bot_relay" / "quarantine"
    try:
        with hub_thread({"alpha": alpha, "mini": mini}):
            key = gw.message_agent(sender="alice", target="moxie@mini", message="do the thing")["delivery_id"]
            await_condition(lambda: len(mini_runner.entered) == 1, timeout=30, message="mini runs the turn")
            place("group-writable", b"{}", alpha / "bot_relay" / "outbox" / f"{key}.json", tmp_path / "staging",
                  mode=0o664)
            await_condition(lambda: list(quarantined.glob(f"{key}.json.*")), timeout=30,
                            message="the hub quarantined the planted file")
            assert reply_of(alpha, key) is None  # not answered
            release.set()
            outcome = gw.wait_outcome(key, timeout=30)
    finally:
        release.set()
    assert (outcome["status"], outcome["reply"]) == ("replied", "moxie did it: do the thing"), outcome


def test_the_hub_quarantines_misnamed_files_in_an_outbox_as_a_gateway_does_in_its_inbox(
        two_roots: tuple[Path, Path]) -> None:
    """Regression (hostile review, b4): in ``outbox/`` an uppercase id (``949F8A41….json``) or a 237-character
    name stayed for good with no log line (every listing skips them), where the same names in ``inbox/`` are
    quarantined. The hub, the outbox's reader, moves them aside by the same rule at its rescan; the seed's
    hidden temp files are left alone."""
    alpha, mini = two_roots
    outbox = InboxPaths.from_root(alpha).ensure().relay.outbox
    key = uuid.uuid4().hex
    upper, long_name, temp = f"{key.upper()}.json", f"{key}{'a' * 200}.json", f".env-{key}.tmp"
    for name in (upper, long_name, temp):
        (outbox / name).write_text(json.dumps({**seed_envelope(target_connection="mini", target_profile="moxie"),
                                               "id": key}), encoding="utf-8")
        os.chmod(outbox / name, 0o600)

    def said(name: str) -> list[str]:
        return logs.matching(f"quarantined {outbox / name}", "not a <32 hex>.json regular file")

    with LogCapture() as logs, hub_thread({"alpha": alpha, "mini": mini}, rescan_seconds=0.5):
        # the line is logged once the file has moved: wait for both (checking the lines as the last file left
        # outbox/ raced its line: 1 CI run in many)
        await_condition(lambda: sorted(os.listdir(outbox)) == [temp] and all(said(n) for n in (upper, long_name)),
                        timeout=30, message="the misnamed files moved out of outbox/, each said")
        for name in (upper, long_name):
            assert len(said(name)) == 1, logs.lines
    quarantined = os.listdir(alpha / "bot_relay" / "quarantine")
    assert len([q for q in quarantined if q.startswith(upper)]) == 1, quarantined
    assert len([q for q in quarantined if q.startswith(key + "a")]) == 1, quarantined


# ── one TTL for an envelope in an inbox/: its sender root's, whoever takes it ─────────────────────────────


def _roots_with_ttls(tmp_path: Path, alpha_ttl: int, mini_ttl: int) -> tuple[Path, Path]:
    """alpha (the sender) and mini (the target), each with its own ``envelope_ttl_seconds``."""
    def ttl(seconds: int) -> dict[str, Any]:
        return {"bot_mode": {"envelope_ttl_seconds": seconds}}

    return (make_root(tmp_path, {"alice": {}}, name="alpha", config=ttl(alpha_ttl)),
            make_root(tmp_path, {"moxie": {}}, name="mini", config=ttl(mini_ttl)))


def test_the_hub_posts_a_dm_with_its_senders_ttl_and_the_gateway_taking_it_applies_that_one(tmp_path: Path) -> None:
    """Regression (review diffrev11 of bb85b7a): the hub expires a DM waiting in an inbox/ at its sender root's TTL
    (the seed checks a DM's age where it is claimed from its sender's outbox/, with the sender's config), but our
    gateway taking the same DM from that inbox/ applied its own root's TTL: two rules for one envelope. Here the
    sender allows an hour and the target 60 s: the 2-minute-old DM was answered expired by mini's gateway, which
    the hub would have delivered. The hub now writes the sender's TTL in the inbox record and the gateway applies it."""
    alpha, mini = _roots_with_ttls(tmp_path, 3600, 60)
    rec = RecordingRunner()
    env = seed_envelope(target_connection="mini", target_profile="moxie", created_at=time.time() - 120)
    with Gateway(mini, runner=rec, connection_id="mini"), hub_thread({"alpha": alpha, "mini": mini}):
        seed_write_json(alpha / "bot_relay" / "outbox" / f"{env['id']}.json", env, prefix=".env-")
        await_condition(lambda: reply_of(alpha, env["id"]), timeout=30, message="the reply")
    reply = reply_of(alpha, env["id"])
    assert reply is not None and reply["reason"] == "" and reply["error"] == "", reply
    assert [t.delivery_id for t in rec.entered] == [env["id"]]


@pytest.mark.parametrize("taker", ["gateway", "hub"])
def test_an_inbox_dm_past_its_senders_ttl_is_expired_with_that_ttl_by_the_gateway_and_the_hub_alike(
    tmp_path: Path, taker: str,
) -> None:
    """The other way round: the sender allows 60 s, the target an hour. A DM that waited 2 minutes in mini's inbox/
    is answered expired "after 60s" whoever takes it: the hub (no gateway of ours takes it) or mini's gateway
    (which delivered it, by its own hour)."""
    from actors import Rescan
    from hermes_actors.store.relay_inbox import post_to_inbox

    alpha, mini = _roots_with_ttls(tmp_path, 60, 3600)
    env = seed_envelope(target_connection="mini", target_profile="moxie", created_at=time.time() - 120)
    post_to_inbox(InboxPaths.from_root(mini).ensure(), env, "alpha", sender_ttl=HubRoot.make("alpha", alpha).ttl)
    rec = RecordingRunner()
    if taker == "gateway":
        with Gateway(mini, runner=rec, connection_id="mini"):
            delivered = mini / "bot_relay" / "delivered" / f"{env['id']}.json"
            await_condition(delivered.exists, timeout=30, message="mini's reply")
        reply = json.loads(delivered.read_text(encoding="utf-8"))
    else:
        hub, scheduler = _manual_hub(alpha, mini)
        try:
            hub.ask(Rescan("manual"), timeout=30)
            assert scheduler.advance(1) >= 1  # its deadline (past already) fires
            await_condition(lambda: reply_of(alpha, env["id"]), timeout=30, message="the hub's reply")
        finally:
            hub.stop()
        reply = reply_of(alpha, env["id"])
    assert reply is not None and reply["reason"] == "queued_expired", reply
    assert reply["error"] == rp.expired_error_text("moxie", "mini", 60)
    assert rec.entered == []


def test_a_dm_the_hub_moved_into_such_an_inbox_ends_queued_expired_with_equal_ttl_and_reply_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression (docs review docrev, hub_ttl_race): with the default budgets (envelope_ttl_seconds ==
    reply_wait_seconds) the sender's reply deadline found the TTL passed, could not expire the DM (the hub had moved
    it out of alpha's outbox/ into mini's inbox/) and reported ``delivery_timeout`` "may still be delivered"; the
    hub's ``queued_expired`` came a moment later (created_at + TTL + its slack) and was ignored, so the DM was never
    delivered though its sender was told it may be. The sender now waits a short grace for that answer.

    The hub's deadline counts from created_at, a whole second (int(now)), so it may beat the sender's by up to a
    second and hide the race; a 1 s slack puts it always after the sender's, as a hub slowed by its file event
    and its reply write on a loaded machine does (well within the grace)."""
    from hermes_actors.relay import hub as hub_module
    from hermes_actors.relay.outbound import EXPIRY_ANSWER_GRACE_SECONDS

    monkeypatch.setattr(hub_module, "DEADLINE_SLACK_SECONDS", 1.0)
    ttl = 3  # the hub moves the DM out of alpha's outbox/ long before (its file event; a 0.5 s rescan else)
    alpha = make_root(tmp_path, {"alice": {}}, name="alpha",
                      config={"bot_mode": {"envelope_ttl_seconds": ttl, "reply_wait_seconds": ttl}})
    mini = make_root(tmp_path, {"moxie": {}}, name="mini")  # no gateway of ours ever reads its inbox/
    with LogCapture("INFO") as logs, hub_thread({"alpha": alpha, "mini": mini}, rescan_seconds=0.5), \
            Gateway(alpha, runner=RecordingRunner(), connection_id="alpha") as gw:
        await_condition(lambda: any(r["handle"] == "moxie" for r in gw.roster()), timeout=20, message="the roster")
        ack = gw.message_agent(sender="alice", target="moxie@mini", message="anyone there?")
        assert ack["status"] == "queued", ack
        out = gw.wait_outcome(ack["delivery_id"], timeout=ttl + EXPIRY_ANSWER_GRACE_SECONDS + 30)
    assert (out["status"], out["reason"]) == ("failed", "queued_expired"), out
    assert out["error"] == rp.expired_error_text("moxie", "mini", ttl)
    # the hub answered it from mini's inbox/ (the sender could not: it had left alpha's outbox/)
    assert len(logs.matching(f"hub: delivery {ack['delivery_id']} @alice@alpha → @moxie@mini: failed "
                             "[queued_expired]")) == 1
    assert rf.list_ids(mini / "bot_relay" / "inbox") == [] and rf.list_ids(alpha / "bot_relay" / "outbox") == []


def _agent(profile: str, conn: str, online: bool | None = None) -> Any:
    from hermes_actors.records import RemoteAgent

    return RemoteAgent(profile=profile, handle=profile, connection_id=conn, online=online)


@pytest.mark.parametrize(("existing", "ours", "served", "expected"), [
    ([], [("moxie", "mini")], {"alpha", "mini"}, [("moxie", "mini")]),  # nobody else's rows: the hub's
    ([("dave", "laptop")], [("moxie", "mini")], {"alpha", "mini"}, [("dave", "laptop"), ("moxie", "mini")]),
    ([("gone", "mini")], [("moxie", "mini")], {"alpha", "mini"}, [("moxie", "mini")]),  # its own rows replaced
    ([("old", "alpha")], [], {"alpha", "mini"}, []),  # a row of the root's own connection: the hub's to write
    ([("dave", "laptop")], [], {"alpha", "mini"}, [("dave", "laptop")]),  # no rows of its own: the others stay
], ids=["none-kept", "other-kept", "own-replaced", "own-root-dropped", "others-only"])
def test_merged_roster_writes_the_hubs_rows_and_keeps_the_others(
    existing: list[tuple[str, str]], ours: list[tuple[str, str]], served: set[str], expected: list[tuple[str, str]],
) -> None:
    from hermes_actors.relay.hub import merged_roster

    rows = merged_roster([_agent(p, c) for p, c in existing], [remote_row(p, c) for p, c in ours], served,
                         others_age=0)
    assert [(r["profile"], r["connection_id"]) for r in rows] == expected


def test_merged_roster_keeps_another_writers_row_whole() -> None:
    from hermes_actors.relay.hub import merged_roster

    assert merged_roster([_agent("dave", "laptop", online=False)], [], {"alpha"}, others_age=0) == [
        {"profile": "dave", "handle": "dave", "connection_id": "laptop", "connection_label": "", "title": "",
         "description": "", "online": False}]


@pytest.mark.parametrize(("others_age", "online"), [
    (0.0, True),  # its writer just wrote it
    (600.0, True),  # fresh to the end of the window (liveness reads > 600 s as stale)
    (600.5, None),  # stale: kept, liveness unknown, as the stale file would read
    (5000.0, None),
    (None, None),  # nobody else's write known: never vouched for by the hub
], ids=["just-written", "window-end", "just-stale", "long-gone", "unknown"])
def test_merged_roster_keeps_another_writers_online_flag_only_while_its_write_is_fresh(
    others_age: float | None, online: bool | None,
) -> None:
    from hermes_actors.relay.hub import merged_roster

    rows = merged_roster([_agent("dave", "laptop", online=True)], [remote_row("moxie", "mini", online=True)],
                         {"alpha", "mini"}, others_age=others_age)
    assert [r.get("online") for r in rows] == [online, True]  # the hub's own rows are its to vouch for


@pytest.mark.parametrize(("seen", "ours", "before", "expected"), [
    (None, None, None, None),  # no file, nothing known
    (None, (1, 10, 5), 100.0, 100.0),  # file gone: what was known stays
    ((2, 10, 7_000_000_000), None, None, 7.0),  # not ours (none written yet): its writer's, at its mtime
    ((2, 10, 7_000_000_000), (1, 10, 5), 3.0, 7.0),  # replaced since our write: the other writer's new write
    ((1, 10, 5), (1, 10, 5), 3.0, 3.0),  # still the file we wrote: our rewrite says nothing of theirs
    ((1, 10, 5), (1, 10, 5), None, None),
], ids=["no-file", "gone", "first-read", "replaced", "ours", "ours-nothing-known"])
def test_others_wrote_at_tells_another_writers_roster_from_the_hubs_own(
    seen: tuple[int, int, int] | None, ours: tuple[int, int, int] | None, before: float | None,
    expected: float | None,
) -> None:
    from hermes_actors.relay.hub import others_wrote_at

    assert others_wrote_at(seen, ours, before) == expected


def _push_once(alpha: Path, mini: Path) -> None:
    from actors import ManualScheduler
    from hermes_actors.messages import RosterPush

    hub = HubActor.start([HubRoot.make("alpha", alpha), HubRoot.make("mini", mini)], scheduler=ManualScheduler())
    try:
        hub.ask(RosterPush(), timeout=30)
    finally:
        hub.stop()


def test_the_hub_does_not_keep_a_gone_desktops_rows_online_by_rewriting_the_roster(
    two_roots: tuple[Path, Path],
) -> None:
    """Regression (review diffrev3, r3): the hub kept another writer's rows as they were, ``online: true`` included,
    and its rewrites (at least every 60 s) reset the file's mtime: a Desktop gone for hours stayed fresh and online
    to the root's senders, where roster.json is fresh for 600 s by mtime. Its rows are now kept without the flag
    (liveness unknown) once their writer's last write is stale."""
    from hermes_actors.store.relay_roster import liveness

    alpha, mini = two_roots
    write_roster_file(alpha, [remote_row("dave", "laptop", online=True)], age_seconds=5000)  # the Desktop, gone
    _push_once(alpha, mini)
    agents, age = rf.read_roster(InboxPaths.from_root(alpha).relay)
    dave = [a for a in agents if a.connection_id == "laptop"]
    assert len(dave) == 1 and dave[0].online is None  # kept (still a teammate), liveness unknown
    assert liveness(dave[0], agents, age) is None
    assert [a.online for a in agents if a.connection_id == "mini"] == [None, None]  # no gateway beats on mini


def test_the_hub_keeps_a_fresh_desktop_rows_online_flag(two_roots: tuple[Path, Path]) -> None:
    alpha, mini = two_roots
    write_roster_file(alpha, [remote_row("dave", "laptop", online=True)], age_seconds=30)
    _push_once(alpha, mini)
    assert [r.get("online") for r in roster_rows(alpha) if r["connection_id"] == "laptop"] == [True]


def test_a_desktop_push_landing_between_the_hubs_read_and_write_is_not_lost(
    two_roots: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression (review diffrev3, r7): the hub's read-merge-write of roster.json overwrote a Desktop push that
    landed between its read and its write (here: dave went offline). The hub now reads and merges again when the
    file was replaced since its read."""
    alpha, mini = two_roots
    write_roster_file(alpha, [remote_row("dave", "laptop", online=True)])
    relay = InboxPaths.from_root(alpha).relay
    real_read = rf.read_roster_version
    pushed: list[int] = []

    def read_then_the_desktop_pushes(paths: Any, *, now: float | None = None) -> Any:
        out = real_read(paths, now=now)
        if paths == relay and not pushed:
            pushed.append(1)
            write_roster_file(alpha, [remote_row("dave", "laptop", online=False)])
        return out

    monkeypatch.setattr(rf, "read_roster_version", read_then_the_desktop_pushes)
    _push_once(alpha, mini)
    monkeypatch.undo()
    assert pushed
    assert [r.get("online") for r in roster_rows(alpha) if r["connection_id"] == "laptop"] == [False]
    assert {r["profile"] for r in roster_rows(alpha) if r["connection_id"] == "mini"} == {"default", "moxie"}


def test_a_desktop_push_without_the_hubs_rows_gets_them_back_at_the_next_push(two_roots: tuple[Path, Path]) -> None:
    """Regression: a push with unchanged rows was skipped for up to 60 s though the file was no longer the hub's:
    a Desktop rewriting roster.json with its own rows only left the hub's agents out of it ("no teammate named …")
    until the hub's next refresh. The hub now writes whenever the file is not the one it wrote."""
    from actors import ManualScheduler
    from hermes_actors.messages import RosterPush

    alpha, mini = two_roots
    write_roster_file(alpha, [remote_row("dave", "laptop", online=True)])
    hub = HubActor.start([HubRoot.make("alpha", alpha), HubRoot.make("mini", mini)], scheduler=ManualScheduler())
    try:
        hub.ask(RosterPush(), timeout=30)
        assert {r["connection_id"] for r in roster_rows(alpha)} == {"laptop", "mini"}
        write_roster_file(alpha, [remote_row("dave", "laptop", online=True)])  # the Desktop's push: its rows
        hub.ask(RosterPush(), timeout=30)
    finally:
        hub.stop()
    assert {(r["connection_id"], r["profile"]) for r in roster_rows(alpha)} == {
        ("laptop", "dave"), ("mini", "default"), ("mini", "moxie")}


def test_a_dm_the_hub_left_in_an_outbox_for_another_relay_is_answered_expired_at_its_ttl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression (review diffrev3, r2): the hub put a DM for a connection it does not relay back into the outbox/
    and never looked at it again while it ran: a seed sender has no expiry of its own, so nobody answered it at its
    TTL. The hub leaves it there until its TTL, then answers it ``queued_expired`` (drain_envelope's rule)."""
    from types import SimpleNamespace

    from actors import ManualScheduler, Rescan
    from hermes_actors.relay import hub as hub_module

    alpha, mini = _ttl_roots(tmp_path, 60)
    clock = [time.time()]
    monkeypatch.setattr(hub_module, "time", SimpleNamespace(time=lambda: clock[0]))  # the hub's clock only
    env = seed_envelope(target_connection="laptop", target_profile="dave", created_at=int(clock[0]) - 30)
    outbox = alpha / "bot_relay" / "outbox"
    seed_write_json(outbox / f"{env['id']}.json", env, prefix=".env-")
    with LogCapture("INFO") as logs:
        hub = HubActor.start([HubRoot.make("alpha", alpha), HubRoot.make("mini", mini)], scheduler=ManualScheduler())
        try:
            hub.ask(Rescan("manual"), timeout=30)
            hub.ask(FileAppeared(outbox / f"{env['id']}.json"), timeout=30)  # its put-back's event
            clock[0] = float(env["created_at"]) + 60  # at its deadline: not past it yet
            hub.ask(Rescan("manual"), timeout=30)
            assert rf.list_ids(outbox) == [env["id"]] and reply_of(alpha, env["id"]) is None
            assert len(logs.matching(f"hub: delivery {env['id']}", "left in the outbox/ of alpha")) == 1
            clock[0] = float(env["created_at"]) + 61  # past its TTL
            hub.ask(Rescan("manual"), timeout=30)
        finally:
            hub.stop()
    reply = reply_of(alpha, env["id"])
    assert reply is not None and reply["reason"] == "queued_expired", reply
    assert reply["error"] == rp.expired_error_text("dave", "laptop", 60)
    assert rf.list_ids(outbox) == [] and rf.list_ids(alpha / "bot_relay" / "claimed") == [env["id"]]
    assert len(logs.matching(f"hub: delivery {env['id']} @alice@alpha → @dave@laptop: failed [queued_expired]")) == 1
    assert len(logs.matching(f"hub: delivery {env['id']}", "left in the outbox/ of alpha")) == 1  # claimed once


def test_a_left_dm_that_never_expires_is_never_claimed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from actors import ManualScheduler, Rescan
    from hermes_actors.relay import hub as hub_module

    alpha, mini = _ttl_roots(tmp_path, 0)  # TTL off
    clock = [time.time()]
    monkeypatch.setattr(hub_module, "time", SimpleNamespace(time=lambda: clock[0]))
    env = seed_envelope(target_connection="laptop", target_profile="dave", created_at=int(clock[0]) - 5000)
    outbox = alpha / "bot_relay" / "outbox"
    seed_write_json(outbox / f"{env['id']}.json", env, prefix=".env-")
    with LogCapture("INFO") as logs:
        hub = HubActor.start([HubRoot.make("alpha", alpha), HubRoot.make("mini", mini)], scheduler=ManualScheduler())
        try:
            hub.ask(Rescan("manual"), timeout=30)
            clock[0] += 100_000
            hub.ask(Rescan("manual"), timeout=30)
        finally:
            hub.stop()
    assert rf.list_ids(outbox) == [env["id"]] and reply_of(alpha, env["id"]) is None
    assert len(logs.matching(f"hub: delivery {env['id']}", "left in the outbox/ of alpha")) == 1


def test_two_hubs_sharing_a_root_do_not_replace_each_others_roster_at_every_push(tmp_path: Path) -> None:
    """Regression (diff review of the roster-freshness fix): a hub rewrote a ``roster.json`` another writer had
    written at every push, so two hubs sharing a root (alpha+mini, alpha+beta) replaced each other's file on every
    2 s tick (20 rewrites in 20 pushes; 3 before that fix). Another writer's file is rewritten only when it lacks or
    misstates the hub's rows; both hubs' rows end up in it."""
    from actors import ManualScheduler
    from hermes_actors.messages import RosterPush

    alpha = make_root(tmp_path, {"alice": {}}, name="alpha")
    mini = make_root(tmp_path, {"moxie": {}}, name="mini")
    beta = make_root(tmp_path, {"bob": {}}, name="beta")
    hubs = [HubActor.start([HubRoot.make("alpha", alpha), HubRoot.make(name, other)], scheduler=ManualScheduler())
            for name, other in (("mini", mini), ("beta", beta))]
    roster = alpha / "bot_relay" / "roster.json"
    identities: list[tuple[int, int]] = []
    try:
        for _ in range(10):  # ten pushes of each hub with nothing changed, well inside the 60 s refresh
            for hub in hubs:
                hub.ask(RosterPush(), timeout=30)
                info = os.lstat(roster)
                if not identities or identities[-1] != (info.st_ino, info.st_mtime_ns):
                    identities.append((info.st_ino, info.st_mtime_ns))
    finally:
        for hub in hubs:
            hub.stop()
    assert len(identities) <= 3, identities
    connections = {row["connection_id"] for row in json.loads(roster.read_text())["agents"]}
    assert connections == {"mini", "beta"}
