"""FsBridge: inotify (or watchdog) events become FileAppeared (FileRemoved when asked); temp names are
skipped; only the named subdirectories are watched when given, never through a symlink; a dead watcher is
restarted with a Rescan, a directory that comes back is watched again; paused drops events but not rescans."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
from watchdog.observers import Observer

from actors import FileAppeared, FileRemoved, FsBridge, ManualScheduler, Rescan, Scheduler, inotify
from actors.fsbridge import default_ignore
from actors.inotify import AVAILABLE as INOTIFY
from actors.testkit import Probe, ProbeLog, await_condition

needs_inotify = pytest.mark.skipif(not INOTIFY, reason="inotify is Linux only")
WATCHERS = [pytest.param(None, id="inotify", marks=needs_inotify), pytest.param(Observer, id="watchdog")]


@pytest.fixture
def probe() -> Iterator[tuple[pykka.ActorRef[Any], ProbeLog]]:
    ref, actor = Probe.spawn()
    yield ref, actor
    ref.stop()


@pytest.fixture
def scheduler() -> Iterator[Scheduler]:
    with Scheduler() as s:
        yield s


def appeared(actor: ProbeLog) -> list[Path]:
    return [m.path for m in actor.records(FileAppeared)]


def wait_appeared(actor: ProbeLog, path: Path, timeout: float = 5.0) -> None:
    await_condition(lambda: path in appeared(actor), timeout=timeout, message=f"FileAppeared({path})")


@pytest.mark.parametrize("factory", WATCHERS)
def test_created_and_moved_in_files_appear_and_temp_names_do_not(
    factory: Any, tmp_path: Path, probe: tuple[pykka.ActorRef[Any], ProbeLog], scheduler: Scheduler
) -> None:
    ref, actor = probe
    watched = tmp_path / "watched"
    (watched / "replies").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    with FsBridge(watched, ref, scheduler=scheduler, rescan_seconds=0, removals=True, observer_factory=factory):
        actor.expect(Rescan)  # the start rescan
        created = watched / "replies" / "a.json"
        created.write_text("{}")
        wait_appeared(actor, created)

        # The seed's atomic write: a hidden temp file in the same directory, then a rename.
        temp = watched / "replies" / ".x.tmp"
        temp.write_text("{}")
        renamed = watched / "replies" / "b.json"
        os.replace(temp, renamed)
        wait_appeared(actor, renamed)

        moved_in = outside / "c.json"
        moved_in.write_text("{}")
        target = watched / "replies" / "c.json"
        os.rename(moved_in, target)  # from an unwatched directory
        wait_appeared(actor, target)

        for name in ("d.json.part", "e~", "f.tmp", ".hidden"):
            (watched / "replies" / name).write_text("{}")
        sentinel = watched / "replies" / "z.json"
        sentinel.write_text("{}")
        wait_appeared(actor, sentinel)  # events arrive in order: anything before it was already reported

        created.unlink()
        await_condition(lambda: created in [m.path for m in actor.records(FileRemoved)], timeout=5,
                        message="FileRemoved(a.json)")
    names = [p.name for p in appeared(actor)]
    assert not [n for n in names if default_ignore(n)], names
    assert names.count("b.json") == 1 and names.count("c.json") == 1
    assert [m.reason for m in actor.records(Rescan)] == ["start"]  # rescan_seconds=0: no periodic rescans


@pytest.mark.parametrize("factory", WATCHERS)
def test_a_file_written_in_place_appears_again_once_closed_after_the_write(
    factory: Any, tmp_path: Path, probe: tuple[pykka.ActorRef[Any], ProbeLog], scheduler: Scheduler
) -> None:
    """Regression (outside review, t30): a writer that creates ``replies/<id>.json`` (O_CREAT|O_EXCL) and writes
    it 50 ms later was reported once, at its creation, while still empty; the relay read it then, and nothing
    told it to look again. Its close after the write is reported too now (FileAppeared again): the reader sees it
    complete. An atomic writer's rename still appears once (the first test)."""
    ref, actor = probe
    (tmp_path / "replies").mkdir()
    with FsBridge(tmp_path, ref, scheduler=scheduler, rescan_seconds=0, subdirs=("replies",),
                  observer_factory=factory):
        actor.expect(Rescan)
        path = tmp_path / "replies" / "a.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            wait_appeared(actor, path)  # created, still empty
            assert appeared(actor) == [path]
            os.write(fd, b"{}")
        finally:
            os.close(fd)
        await_condition(lambda: appeared(actor) == [path, path], timeout=5, message="FileAppeared again at the close")


@pytest.mark.parametrize("factory", WATCHERS)
def test_removals_are_reported_only_when_asked(
    factory: Any, tmp_path: Path, probe: tuple[pykka.ActorRef[Any], ProbeLog], scheduler: Scheduler
) -> None:
    ref, actor = probe
    gone = tmp_path / "gone.json"
    gone.write_text("{}")
    moved = tmp_path / "moved.json"
    moved.write_text("{}")
    with FsBridge(tmp_path, ref, scheduler=scheduler, rescan_seconds=0, observer_factory=factory):
        actor.expect(Rescan)
        gone.unlink()
        os.rename(moved, tmp_path / "moved-again.json")
        sentinel = tmp_path / "z.json"
        sentinel.write_text("{}")
        wait_appeared(actor, sentinel)  # in order: the removal and the move were handled before it
    assert actor.records(FileRemoved) == []
    assert tmp_path / "moved-again.json" in appeared(actor)


@needs_inotify
def test_only_the_named_subdirectories_are_watched_and_a_symlinked_one_is_not_followed(
    tmp_path: Path, probe: tuple[pykka.ActorRef[Any], ProbeLog], scheduler: Scheduler
) -> None:
    ref, actor = probe
    for name in ("inbox", "sent", "elsewhere"):
        (tmp_path / name).mkdir()
    (tmp_path / "replies").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with FsBridge(tmp_path, ref, scheduler=scheduler, rescan_seconds=0, subdirs=("inbox", "replies")) as bridge:
        actor.expect(Rescan)
        assert isinstance(bridge._observer, inotify.InotifyWatcher)
        assert bridge._observer.watched() == {tmp_path, tmp_path / "inbox"}
        (tmp_path / "sent" / "a.json").write_text("{}")
        (tmp_path / "elsewhere" / "b.json").write_text("{}")  # what the symlinked replies/ points at
        top = tmp_path / "roster.json"
        top.write_text("{}")
        sentinel = tmp_path / "inbox" / "z.json"
        sentinel.write_text("{}")
        wait_appeared(actor, sentinel)
    assert list(dict.fromkeys(appeared(actor))) == [top, sentinel]  # each written in place: created, then closed


@needs_inotify
def test_a_watched_directory_that_comes_back_is_watched_again_with_a_rescan(
    tmp_path: Path, probe: tuple[pykka.ActorRef[Any], ProbeLog], scheduler: Scheduler
) -> None:
    ref, actor = probe
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    with FsBridge(tmp_path, ref, scheduler=scheduler, rescan_seconds=0, subdirs=("inbox", "late")) as bridge:
        actor.expect(Rescan)
        watcher = bridge._observer
        assert isinstance(watcher, inotify.InotifyWatcher)
        os.rename(inbox, tmp_path / "inbox-old")  # moved away: its watch is dropped
        await_condition(lambda: inbox not in watcher.watched(), timeout=5, message="the moved inbox unwatched")
        inbox.mkdir()  # a new inbox/ appears at the watched name: watched at once, and a rescan for its files
        await_condition(lambda: inbox in watcher.watched(), timeout=5, message="the new inbox watched")
        (tmp_path / "late").mkdir()  # named but missing at start
        await_condition(lambda: tmp_path / "late" in watcher.watched(), timeout=5, message="late/ watched")
        os.rmdir(tmp_path / "late")
        await_condition(lambda: tmp_path / "late" not in watcher.watched(), timeout=5, message="late/ dropped")
        assert bridge.check_health() is True  # nothing to restore: late/ is missing
        (tmp_path / "late").mkdir()
        await_condition(lambda: tmp_path / "late" in watcher.watched(), timeout=5, message="late/ again")
        after = inbox / "after.json"
        after.write_text("{}")
        wait_appeared(actor, after)
    assert [m.reason for m in actor.records(Rescan)][1:] == ["new-directory"] * 3
    assert (tmp_path / "inbox-old") not in appeared(actor)


@needs_inotify
def test_the_health_check_restores_a_watch_the_event_missed(
    tmp_path: Path, probe: tuple[pykka.ActorRef[Any], ProbeLog], scheduler: Scheduler
) -> None:
    ref, actor = probe
    with FsBridge(tmp_path, ref, scheduler=scheduler, rescan_seconds=0, subdirs=("inbox",)) as bridge:
        actor.expect(Rescan)
        watcher = bridge._observer
        assert isinstance(watcher, inotify.InotifyWatcher)
        with watcher._lock:
            watcher._paths.clear()  # every watch forgotten: the inbox/ created next has no event for us
        (tmp_path / "inbox").mkdir()
        assert bridge.check_health() is True
        assert watcher.watched() >= {tmp_path / "inbox"}
        # The root's own kernel watch still sees inbox/ appear, so its "new-directory" rescan may come
        # before or after the health check's: wait for the health check's, in whichever order.
        await_condition(lambda: "watch-restored" in [m.reason for m in actor.records(Rescan)], timeout=5,
                        message="the health check's rescan")
        assert {m.reason for m in actor.records(Rescan)[1:]} <= {"watch-restored", "new-directory"}


@pytest.mark.parametrize("factory", WATCHERS)
def test_a_killed_observer_is_restarted_and_a_rescan_is_told(
    factory: Any, tmp_path: Path, probe: tuple[pykka.ActorRef[Any], ProbeLog], scheduler: Scheduler
) -> None:
    ref, actor = probe
    with FsBridge(tmp_path, ref, scheduler=scheduler, rescan_seconds=0, observer_factory=factory) as bridge:
        actor.expect(Rescan)
        assert bridge.check_health() is True and bridge.restarts == 0
        dead = bridge._observer
        assert dead is not None
        dead.stop()
        dead.join(timeout=5)
        assert not dead.is_alive()

        assert bridge.check_health() is False
        assert bridge.restarts == 1 and bridge._observer is not dead and bridge._observer is not None
        actor.expect(Rescan, count=2)
        assert [m.reason for m in actor.records(Rescan)] == ["start", "observer-restarted"]
        after = tmp_path / "after.json"
        after.write_text("{}")
        wait_appeared(actor, after)  # the new observer reports events again
        assert bridge.check_health() is True and bridge.restarts == 1


@pytest.mark.parametrize("factory", WATCHERS[:1])  # our inotify watcher (watchdog watches a file without complaint)
def test_a_watcher_whose_root_became_a_file_is_tried_again_without_raising(
    factory: Any, tmp_path: Path, probe: tuple[pykka.ActorRef[Any], ProbeLog], scheduler: Scheduler
) -> None:
    """Regression (review): with the watched root replaced by a file, restarting its dead watcher raised out of
    the periodic check, which then never told its Rescan (and logged a traceback at every period)."""
    ref, actor = probe
    root = tmp_path / "watched"
    root.mkdir()
    with FsBridge(root, ref, scheduler=scheduler, rescan_seconds=0, observer_factory=factory) as bridge:
        actor.expect(Rescan)
        dead = bridge._observer
        assert dead is not None
        dead.stop()
        dead.join(timeout=5)
        root.rename(tmp_path / "aside")
        root.write_text("not a directory")
        assert bridge.check_health() is False  # no exception: the caller goes on
        assert bridge.check_health() is False and bridge.restarts == 0
        root.unlink()
        (tmp_path / "aside").rename(root)
        assert bridge.check_health() is False and bridge.restarts == 1  # a directory again: restarted
        after = root / "after.json"
        after.write_text("{}")
        wait_appeared(actor, after)


def test_the_periodic_health_check_restarts_a_dead_observer(
    tmp_path: Path, probe: tuple[pykka.ActorRef[Any], ProbeLog], scheduler: Scheduler
) -> None:
    ref, actor = probe
    with FsBridge(tmp_path, ref, scheduler=scheduler, rescan_seconds=0.05) as bridge:
        dead = bridge._observer
        assert dead is not None
        dead.stop()
        dead.join(timeout=5)
        await_condition(lambda: bridge.restarts == 1, timeout=5, message="the periodic check restarted it")
        await_condition(lambda: "observer-restarted" in [m.reason for m in actor.records(Rescan)], timeout=5)
        after = tmp_path / "after.json"
        after.write_text("{}")
        wait_appeared(actor, after)


def test_paused_drops_events_but_periodic_rescans_continue(
    tmp_path: Path, probe: tuple[pykka.ActorRef[Any], ProbeLog], scheduler: Scheduler
) -> None:
    ref, actor = probe
    with FsBridge(tmp_path, ref, scheduler=scheduler, rescan_seconds=0.1) as bridge:
        actor.expect(Rescan)
        bridge.paused = True
        dropped = tmp_path / "dropped.json"
        dropped.write_text("{}")
        periodic_before = len([m for m in actor.records(Rescan) if m.reason == "periodic"])
        await_condition(
            lambda: len([m for m in actor.records(Rescan) if m.reason == "periodic"]) >= periodic_before + 2,
            timeout=5, message="two periodic rescans while paused",
        )
        bridge.paused = False
        seen = tmp_path / "seen.json"
        seen.write_text("{}")
        wait_appeared(actor, seen)
    assert dropped not in appeared(actor)


def test_start_refuses_a_missing_root_and_stop_is_idempotent(
    tmp_path: Path, probe: tuple[pykka.ActorRef[Any], ProbeLog], scheduler: Scheduler
) -> None:
    ref, _ = probe
    with pytest.raises(FileNotFoundError):
        FsBridge(tmp_path / "missing", ref, scheduler=scheduler).start()
    bridge = FsBridge(tmp_path, ref, scheduler=scheduler, rescan_seconds=0.05).start()
    bridge.stop()
    bridge.stop()
    assert bridge._observer is None


def test_a_dead_target_stops_the_periodic_rescan(tmp_path: Path, scheduler: Scheduler) -> None:
    ref, _ = Probe.spawn()
    bridge = FsBridge(tmp_path, ref, scheduler=scheduler, rescan_seconds=0.05).start()
    timers = list(bridge._timers)  # the periodic rescan and the start's second look
    assert timers
    ref.stop()
    # the periodic rescan's tell found the target dead: the bridge stopped itself, its watcher and its timers
    await_condition(lambda: bridge._observer is None, timeout=5, message="the bridge stopped itself")
    assert all(timer.cancelled for timer in timers), "a rescan timer still fires for the dead target"


# ── user code and failed starts never leave a watcher dead or leaked (review actorsfix2) ──


class _Watchers:
    """The watcher threads of one bridge: watchdog observers its factory made, or the inotify thread of ``root``."""

    def __init__(self, factory: Any, root: Path) -> None:
        self.root = root
        self.made: list[Any] = []
        self.factory = None if factory is None else self._make

    def _make(self) -> Any:
        observer = Observer()
        self.made.append(observer)
        return observer

    def alive(self) -> list[Any]:
        if self.factory is not None:
            return [o for o in self.made if o.is_alive()]
        return [t for t in threading.enumerate() if t.name == f"inotify-{self.root.name}"]


def _inotify_fds() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
        except OSError:
            pass
    return count


@pytest.mark.parametrize("factory", WATCHERS)
def test_an_ignore_filter_that_raises_is_logged_and_the_watcher_goes_on(
    factory: Any, tmp_path: Path, probe: tuple[pykka.ActorRef[Any], ProbeLog], scheduler: Scheduler,
    log_records: list[Any],
) -> None:
    """Regression (review, finding 6): a raising filter killed the watcher thread, and with rescan_seconds=0 no
    health check ever restarted it: every later file event was lost while the bridge looked started."""
    ref, actor = probe
    raised = threading.Event()

    def ignore(name: str) -> bool:
        if name == "poison" and not raised.is_set():
            raised.set()
            raise UnicodeError("filter bug on an odd name")
        return default_ignore(name)

    with FsBridge(tmp_path, ref, scheduler=scheduler, rescan_seconds=0, ignore=ignore, observer_factory=factory):
        actor.expect(Rescan)
        (tmp_path / "poison").write_text("x")
        assert raised.wait(5)
        after = tmp_path / "after.json"
        after.write_text("{}")
        wait_appeared(actor, after)
    assert any("UnicodeError" in r["message"] and r["level"].name == "ERROR" for r in log_records)


@pytest.mark.parametrize("factory", WATCHERS)
def test_a_start_against_a_dead_target_raises_and_leaves_no_watcher_running(
    factory: Any, tmp_path: Path, scheduler: Scheduler
) -> None:
    """Regression (review, finding 7): the start's tell raised ActorDeadError after the watcher started, which
    then ran on (a thread and 3 descriptors per try) with no bridge handle to stop it."""
    dead, _ = Probe.spawn()
    dead.stop()
    root = tmp_path / "deadtarget"
    root.mkdir()
    watchers = _Watchers(factory, root)
    bridge = FsBridge(root, dead, scheduler=scheduler, rescan_seconds=0, observer_factory=watchers.factory)
    with pytest.raises(pykka.ActorDeadError):
        bridge.start()
    assert watchers.alive() == []  # stopped and joined before start() raised (an inotify thread closes its fds)
    assert all(not observer.emitters for observer in watchers.made)  # a watchdog observer's emitters (and fds) went
    assert scheduler.pending() == 0


@pytest.mark.parametrize("factory", WATCHERS)
def test_a_second_start_changes_nothing_and_stop_leaves_nothing_running(
    factory: Any, tmp_path: Path, probe: tuple[pykka.ActorRef[Any], ProbeLog], scheduler: Scheduler
) -> None:
    """Regression (review, finding 7): a second start() started a second watcher and timers; stop() ended one."""
    ref, _ = probe
    root = tmp_path / "twice"
    root.mkdir()
    watchers = _Watchers(factory, root)
    bridge = FsBridge(root, ref, scheduler=scheduler, rescan_seconds=1, observer_factory=watchers.factory)
    bridge.start()
    assert len(watchers.alive()) == 1
    timers = scheduler.pending()
    assert bridge.start() is bridge
    assert len(watchers.alive()) == 1 and scheduler.pending() == timers
    bridge.stop()
    await_condition(lambda: not watchers.alive(), message="every watcher to end")
    assert scheduler.pending() == 0


_STARTED: list[inotify.InotifyWatcher] = []


def _no_thread_left(self: threading.Thread) -> None:
    if isinstance(self, inotify.InotifyWatcher):
        _STARTED.append(self)
    raise RuntimeError("can't start new thread")


@needs_inotify
def test_a_watcher_whose_thread_cannot_start_closes_its_descriptors(
    tmp_path: Path, probe: tuple[pykka.ActorRef[Any], ProbeLog], scheduler: Scheduler,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression (review diffrev31, finding 2): a watcher whose thread could not be started (no threads left)
    kept its inotify descriptor and wake pipe open: 3 descriptors per failed start() or restart."""
    ref, _ = probe
    _STARTED.clear()
    monkeypatch.setattr(inotify.InotifyWatcher, "start", _no_thread_left)
    for _ in range(5):
        with pytest.raises(RuntimeError):
            FsBridge(tmp_path, ref, scheduler=scheduler, rescan_seconds=0).start()
    # each watcher's own descriptors (not the process's count: other tests' watchers may come and go meanwhile)
    assert len(_STARTED) == 5
    assert all((w._fd, w._wake_r, w._wake_w) == (-1, -1, -1) for w in _STARTED), "a watcher kept its descriptors"


@needs_inotify
def test_the_periodic_rescan_goes_on_while_a_dead_watcher_cannot_be_restarted(
    tmp_path: Path, probe: tuple[pykka.ActorRef[Any], ProbeLog], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression (review diffrev31, finding 1): a dead watcher whose restart raised RuntimeError (no thread could
    be started) made every periodic tick skip its rescan, so files landing meanwhile were not seen until a restart
    worked; the restart's failure is now what an OSError's is: the rescans go on, and so do the tries."""
    ref, actor = probe
    manual = ManualScheduler()
    bridge = FsBridge(tmp_path, ref, scheduler=manual, rescan_seconds=1)
    bridge.start()
    try:
        actor.expect(Rescan)  # the start rescan
        watcher = bridge._observer
        assert isinstance(watcher, inotify.InotifyWatcher)
        watcher.stop()
        watcher.join(5)
        assert not watcher.is_alive()
        monkeypatch.setattr(inotify.InotifyWatcher, "start", _no_thread_left)
        before = len([m for m in actor.records(Rescan) if m.reason == "periodic"])
        for _ in range(3):
            manual.advance(1.0)
        await_condition(lambda: len([m for m in actor.records(Rescan) if m.reason == "periodic"]) >= before + 3,
                        message="a periodic rescan at each tick")
        assert bridge.check_health() is False  # still dead, still trying
    finally:
        monkeypatch.undo()
        bridge.stop()
