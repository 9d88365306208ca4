"""Filesystem bridge: file events become typed messages for one actor.

Report created and moved-in files as :class:`FileAppeared`, and again once closed
after a write (a file created, then written in place, is complete only then; an
atomic writer's rename makes no second event), removed ones as
:class:`FileRemoved` only when asked; skip temp names, and send
:class:`Rescan` at start and periodically: inotify can overflow and drop
events without anyone hearing of it, so the listing is the truth and events
only make things fast. If the watcher thread dies, the next health check
restarts it and asks for a rescan (the health check runs with the periodic
rescan: with ``rescan_seconds=0``, never). The ``ignore`` filter is the caller's
code: whatever it raises is logged, that event is dropped, and the watcher
thread goes on.

On Linux the events come from :class:`actors.inotify.InotifyWatcher` (one
thread, only the asked-for events, only the named subdirectories when given);
elsewhere from a watchdog observer on the root, recursively.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pykka
from loguru import logger
from watchdog.events import (
    DirCreatedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

from actors import inotify
from actors.messages import FileAppeared, FileRemoved, Rescan
from actors.timers import Scheduler, TimerHandle

__all__ = ["FsBridge", "default_ignore"]

STARTUP_RESCAN_SECONDS = 0.25


def default_ignore(name: str) -> bool:
    """Temp and hidden names (``.x``, ``*.tmp``, ``*.part``, ``*~``) are never reported."""
    return name.startswith(".") or name.endswith((".tmp", ".part", "~"))


class _Handler(FileSystemEventHandler):
    def __init__(self, bridge: FsBridge) -> None:
        self.bridge = bridge

    def dispatch(self, event: FileSystemEvent) -> None:
        try:
            super().dispatch(event)
        except BaseException as error:  # the ignore filter's (user code): an error would end the observer thread
            logger.opt(exception=error).error("file watcher for {}: handling the event for {} failed: {!r}",
                                              self.bridge.root, _str(event.src_path), error)

    def on_created(self, event: FileSystemEvent) -> None:
        if not event.is_directory:
            self.bridge._report(FileAppeared, Path(_str(event.src_path)))

    def on_closed(self, event: FileSystemEvent) -> None:  # closed after a write: written in place, complete now
        if not event.is_directory:
            self.bridge._report(FileAppeared, Path(_str(event.src_path)))

    def on_moved(self, event: FileSystemEvent) -> None:
        if not event.is_directory:
            if self.bridge.removals:
                self.bridge._report(FileRemoved, Path(_str(event.src_path)))
            self.bridge._report(FileAppeared, Path(_str(event.dest_path)))

    def on_deleted(self, event: FileSystemEvent) -> None:
        if not event.is_directory and self.bridge.removals:
            self.bridge._report(FileRemoved, Path(_str(event.src_path)))


def _str(path: str | bytes) -> str:
    return path.decode() if isinstance(path, bytes) else path


class FsBridge:
    """Feeds one actor with file events under ``root`` and periodic rescans.

    Args:
        root: the directory watched recursively (it must exist).
        target: the actor told FileAppeared / FileRemoved / Rescan.
        scheduler: drives the periodic rescan and the observer health check.
        rescan_seconds: the reconcile period (0 disables the periodic rescan;
            the start rescan still happens).
        ignore: a name filter; True means "do not report".
        subdirs: watch only ``root`` and these subdirectories of it (names),
            not every directory below ``root`` (inotify only; watchdog watches
            recursively and the actor ignores what it does not act on).
        removals: also report :class:`FileRemoved` (off: removals are not even
            asked of the kernel).
        observer_factory: use a watchdog observer built by this instead of
            inotify (also where inotify is not available).
    """

    def __init__(
        self,
        root: Path,
        target: pykka.ActorRef[Any],
        *,
        scheduler: Scheduler,
        rescan_seconds: float = 2.0,
        ignore: Callable[[str], bool] = default_ignore,
        subdirs: Sequence[str] | None = None,
        removals: bool = False,
        observer_factory: Callable[[], BaseObserver] | None = None,
    ) -> None:
        self.root = Path(root)
        self.target = target
        self.scheduler = scheduler
        self.rescan_seconds = rescan_seconds
        self.ignore = ignore
        self.subdirs = None if subdirs is None else tuple(subdirs)
        self.removals = removals
        if observer_factory is None and not inotify.AVAILABLE:
            observer_factory = Observer
        self.observer_factory = observer_factory
        self._observer: BaseObserver | inotify.InotifyWatcher | None = None
        self._timers: list[TimerHandle] = []
        self._lock = threading.Lock()  # start/stop/health-check may come from different threads
        self.paused = False  # tests: drop events on the floor, as an overflowing inotify would
        self.restarts = 0
        self._restart_failing = False  # a restart failed (logged once until one works)

    def start(self) -> FsBridge:
        """Start watching, then ask for the start rescan. Returns self.

        Idempotent: a started bridge is left as it is. A start that fails leaves nothing
        running (no watcher thread, no timer).

        Raises:
            FileNotFoundError: ``root`` does not exist.
            pykka.ActorDeadError: the target actor is dead.
        """
        if not self.root.is_dir():
            raise FileNotFoundError(f"cannot watch {self.root}: not a directory")
        try:
            with self._lock:
                if self._observer is not None:
                    return self
                self._start_observer()
                if self.rescan_seconds > 0:
                    self._timers.append(self.scheduler.every(self.rescan_seconds, self._periodic))
                # watchdog may add its watches on its own thread after start() returns: a file that
                # lands in that window has no event, so a second look follows shortly.
                self._timers.append(self.scheduler.after(STARTUP_RESCAN_SECONDS, self.target, Rescan("start")))
            self.target.tell(Rescan("start"))
        except BaseException:
            self.stop()
            raise
        return self

    def _start_observer(self) -> None:
        if self.observer_factory is None:
            watcher = inotify.InotifyWatcher(
                self.root, subdirs=self.subdirs, on_appeared=lambda path: self._report(FileAppeared, path),
                on_removed=(lambda path: self._report(FileRemoved, path)) if self.removals else None,
                on_lost=self._lost,
            )
            try:
                watcher.start()
            except BaseException:  # its thread did not start (no threads left): its descriptors are closed here
                watcher.stop()
                raise
            self._observer = watcher
            return
        observer = self.observer_factory()
        # Only the events we act on: the inotify mask shrinks with the filter, so a write no
        # longer wakes the observer for open/modify noise (a close after a write is reported: see on_closed).
        observer.schedule(
            _Handler(self),
            str(self.root),
            recursive=True,
            event_filter=[FileCreatedEvent, FileMovedEvent, FileClosedEvent, FileDeletedEvent, DirCreatedEvent,
                          DirMovedEvent],
        )
        observer.daemon = True
        observer.start()
        self._observer = observer

    def _lost(self, reason: str) -> None:
        """Events may have been missed (the kernel queue overflowed, a directory appeared): rescan."""
        try:
            self.target.tell(Rescan(reason))
        except pykka.ActorDeadError:
            pass  # the actor is gone; stop() will follow

    def _periodic(self) -> None:
        try:
            self.check_health()
            self.target.tell(Rescan("periodic"))
        except pykka.ActorDeadError:
            self.stop()

    def check_health(self) -> bool:
        """Restart a dead watcher thread (and ask for a rescan). Returns True if it was alive.

        A live inotify watcher whose directories came back (deleted, recreated) watches
        them again, and a rescan is asked for what landed there meanwhile.

        Returns:
            True when the watcher was alive (or the bridge is not started).

        Raises:
            pykka.ActorDeadError: the target actor is dead (told the rescan after a restart).
        """
        with self._lock:
            observer = self._observer
            if isinstance(observer, inotify.InotifyWatcher) and observer.is_alive():
                if observer.restore():
                    self._lost("watch-restored")
                return True
            if observer is None or observer.is_alive():
                return True
            if not self._restart_failing:
                logger.warning("file watcher for {} died; restarting it", self.root)
            try:
                self._start_observer()
            # the root is gone or no directory now (OSError), or no thread can be started (RuntimeError): the
            # rescans go on, and so do the tries
            except (OSError, RuntimeError) as exc:
                if not self._restart_failing:
                    logger.error("file watcher for {} cannot be restarted: {}; the periodic rescan stands in until "
                                 "it is a directory again", self.root, exc)
                self._restart_failing = True
                return False
            if self._restart_failing:
                logger.info("file watcher for {} restarted", self.root)
            self._restart_failing = False
            self.restarts += 1
        self.target.tell(Rescan("observer-restarted"))
        return False

    def stop(self) -> None:
        """Stop the timers and the observer; idempotent."""
        with self._lock:
            for timer in self._timers:
                timer.cancel()
            self._timers.clear()
            observer, self._observer = self._observer, None
        if observer is not None:
            observer.stop()
            if observer is not threading.current_thread():
                observer.join(timeout=5)

    def _report(self, kind: type[FileAppeared] | type[FileRemoved], path: Path) -> None:
        if self.paused:
            return
        if self.ignore(path.name):
            return
        try:
            self.target.tell(kind(path))
        except pykka.ActorDeadError:
            pass  # the actor is gone; stop() will follow

    def __enter__(self) -> FsBridge:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
