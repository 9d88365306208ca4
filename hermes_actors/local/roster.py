"""RosterActor: the one owner of "who exists" on this install.

It discovers profiles and config from the Hermes root, builds an immutable
:class:`RosterSnapshot` (with O(1) lookup maps) and publishes it to its
subscribers (the Dispatcher) whenever it changes. Others never read
``profiles/`` or ``config.yaml`` themselves.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pykka
from loguru import logger

from actors import Scheduler, TypedActor, handles
from hermes_actors.core.config import BotModeConfig, changed_settings, load_config
from hermes_actors.messages import (
    GetSnapshot,
    ProfileInfo,
    Reload,
    RemoteAgent,
    RemoteRosterHint,
    RemoteRows,
    RosterChanged,
    RosterSnapshot,
    RosterTick,
    Subscribe,
)
from hermes_actors.store.hermes_root import alias_forms, discover_profiles, install_is_managed
from hermes_actors.store.os_errors import advised, resource_failure
from hermes_actors.store.relay_files import RosterIdentity, read_roster_version
from hermes_actors.store.relay_paths import RelayPaths
from hermes_actors.store.relay_roster import liveness
from hermes_actors.store.yaml_file import warn_once

__all__ = ["RosterActor", "make_snapshot", "roster_rows"]

REMOTE_REPUBLISH_SECONDS = 60.0  # pushed rows unchanged: republish their freshness this often (fresh = 600 s)


def make_snapshot(
    profiles: Iterable[ProfileInfo],
    *,
    peers: Iterable[str] = (),
    remote: Iterable[RemoteAgent] = (),
    remote_mtime: float | None = None,
    remote_identity: RosterIdentity | None = None,
    version: int = 0,
) -> RosterSnapshot:
    """Pure: build a snapshot with its lookup maps."""
    profiles = tuple(profiles)
    index = {p.profile.lower(): p for p in profiles}
    aliases: dict[str, set[str]] = {}
    for p in profiles:
        names = {p.title}
        if p.display_name != p.profile:
            names.add(p.display_name)
        for name in names:
            for form in alias_forms(name):
                aliases.setdefault(form, set()).add(p.profile)
    return RosterSnapshot(
        profiles=profiles,
        peers=tuple(peers),
        remote=tuple(remote),
        remote_mtime=remote_mtime,
        remote_identity=remote_identity,
        managed=install_is_managed(profiles),
        version=version,
        index=index,
        aliases={k: frozenset(v) for k, v in aliases.items()},
    )


def remote_age(snapshot: RosterSnapshot, now: float) -> float | None:
    """Pure: how old the relay roster is at ``now`` (None: no roster file)."""
    return None if snapshot.remote_mtime is None else max(0.0, now - snapshot.remote_mtime)


def roster_rows(snapshot: RosterSnapshot, *, now: float | None = None) -> list[dict[str, Any]]:
    """Pure: the public ``Gateway.roster()`` rows (DESIGN section 3)."""
    rows: list[dict[str, Any]] = [
        {
            "profile": p.profile,
            "handle": p.handle,
            "display_name": p.display_name,
            "title": p.title,
            "description": p.description,
            "connection_id": None,
            "online": True,
        }
        for p in snapshot.profiles
    ]
    remote = list(snapshot.remote)
    age = remote_age(snapshot, time.time() if now is None else now)
    for r in remote:
        rows.append(
            {
                "profile": r.profile,
                "handle": r.handle,
                "display_name": r.title or r.handle,
                "title": r.title,
                "description": r.description,
                "connection_id": r.connection_id,
                # while Redis is unreachable the rows are the last ones read, and a DM to any of them is refused
                # (NOT queued): offline, whatever they said then
                "online": False if snapshot.remote_unreachable else liveness(r, remote, age),
            }
        )
    return rows


def _signature(root: Path) -> tuple[float, ...]:
    """Cheap change detector: mtimes of the profiles dir, the root's YAML files and each profile's ``profile.yaml``.

    A profile's own ``profile.yaml`` counts: ``enable`` (or a hand edit) marks a profile
    managed or renames it there, and a running host must see it without a restart. One
    ``stat`` per profile each rescan, relative to one descriptor of ``profiles/`` so the
    kernel does not walk the root's path again for each (10,000 profiles: ~20 ms of CPU
    every 2 s on the benchmark's VM; ~35 ms with full paths).
    """
    out: list[float] = []
    for path in (root / "profiles", root / "config.yaml", root / "profile.yaml"):
        try:
            out.append(os.stat(path).st_mtime)
        except OSError:
            out.append(-1.0)
    try:
        fd = os.open(root / "profiles", os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return tuple(out)
    try:
        for name in sorted(os.listdir(fd)):
            try:
                out.append(os.stat(f"{name}/profile.yaml", dir_fd=fd, follow_symlinks=False).st_mtime)
            except OSError:
                out.append(-1.0)
    except OSError:
        pass  # profiles/ unreadable mid-scan: what was read still says whether anything changed
    finally:
        os.close(fd)
    return tuple(out)


class RosterActor(TypedActor):
    """Owns the local roster; publishes :class:`RosterChanged`.

    Args:
        root: the Hermes root.
        config: config overrides (deep-merged over ``config.yaml``).
        scheduler: for the periodic change check.
        rescan_seconds: how often to look for profile changes (0: never).
        cannot_run: why the gateway's runner cannot run a profile's turns (None: it can); such a
            profile is left off the roster, so a DM to it is refused before any ack.
    """

    def __init__(
        self, root: Path, *, overrides: dict[str, Any] | None, scheduler: Scheduler, rescan_seconds: float = 2.0,
        cannot_run: Callable[[str], str | None] | None = None,
    ) -> None:
        super().__init__()
        self.root = root
        self.cannot_run = cannot_run
        self.overrides = overrides
        self.timers = self.own_timers(scheduler)
        self.rescan_seconds = rescan_seconds
        self.subscribers: list[pykka.ActorRef[Any]] = []
        self.version = 0
        self.signature: tuple[float, ...] = ()
        self.config: BotModeConfig = BotModeConfig()  # _load reads config.yaml (once per load, not twice)
        self.pending: list[str] = []  # settings changed on disk since the start (warned once per change)
        self.paths = RelayPaths.from_root(root)
        self.pushed_remote: tuple[list[RemoteAgent], float] | None = None  # set by RemoteRows (Redis transport)
        self.snapshot = self._load()

    def on_start(self) -> None:
        if self.rescan_seconds > 0:
            self.timers.every(self.rescan_seconds, RosterTick())

    def _load(self) -> RosterSnapshot:
        self.signature = _signature(self.root)
        config = load_config(self.root, self.overrides)
        if self.version:  # a reload: only peers (and who exists) apply live; the rest at the host's next start
            changed = changed_settings(self.config, config)
            if changed and changed != self.pending:
                logger.warning(
                    "config.yaml changed {}: it applies when this host restarts (hermes-actors serve, or the hermes "
                    "gateway hosting the actors); until then the values it started with stay in effect",
                    ", ".join(changed),
                )
            self.pending = changed
            config = replace(self.config, peers=config.peers)
        self.config = config
        self.version += 1
        profiles = self._runnable(discover_profiles(self.root))
        remote, mtime, identity = self._read_remote()
        snapshot = make_snapshot(profiles, peers=self.config.peers, remote=remote, remote_mtime=mtime,
                                 remote_identity=identity, version=self.version)
        if self.pushed_remote is not None:  # a transport's roster (set only once the first snapshot exists)
            # keep what the transport said of itself: a reload is no news about Redis
            snapshot = replace(snapshot, remote_via="redis", remote_unreachable=self.snapshot.remote_unreachable)
        return snapshot

    def _runnable(self, profiles: list[ProfileInfo]) -> list[ProfileInfo]:
        """The profiles whose turns the runner can run; the others are named in a warning (at each load)."""
        if self.cannot_run is None:
            return profiles
        kept = []
        for info in profiles:
            why = self.cannot_run(info.profile)
            if why is None:
                kept.append(info)
            else:
                logger.warning("profile {} is left off the roster: {}", info.profile, why)
        return kept

    def _read_remote(self) -> tuple[list[RemoteAgent], float | None, RosterIdentity | None]:
        """The relay roster (normalized, untrusted input), its mtime and the identity of the file read."""
        if self.pushed_remote is not None:  # a transport owns the remote roster: roster.json is not read
            rows, mtime = self.pushed_remote
            return rows, mtime, None
        now = time.time()
        rows, age, identity = read_roster_version(self.paths, now=now)
        return rows, None if age is None else now - age, identity

    def _publish(self) -> None:
        for ref in list(self.subscribers):
            try:
                ref.tell(RosterChanged(self.snapshot))
            except pykka.ActorDeadError:
                self.subscribers.remove(ref)

    @handles(Subscribe)
    def _on_subscribe(self, msg: Subscribe) -> RosterSnapshot:
        self.subscribers.append(msg.ref)
        return self.snapshot

    @handles(GetSnapshot)
    def _on_get(self, msg: GetSnapshot) -> RosterSnapshot:
        return self.snapshot

    @handles(Reload)
    def _on_reload(self, msg: Reload) -> RosterSnapshot:
        before = self.snapshot
        try:
            self.snapshot = self._load()
        except Exception as exc:  # a file no check foresaw must not end the roster (and every DM with it)
            short = resource_failure(exc)
            if short is not None:
                # out of file descriptors, say: no sign that a profile went, so none is dropped; the next tick
                # reloads (the signature is forgotten), and it is said once while it lasts
                self.signature = ()
                warn_once(f"roster reload {self.root}", [
                    f"roster reload of {self.root} failed: {short}: {advised(exc)}. The roster read before stays "
                    f"in effect ({len(before.profiles)} profiles); it is reloaded once its files can be read"])
                return before
            # _load took the new signature first: the next rescan tries again only once a file changes
            logger.opt(exception=True).error("roster reload failed; the roster read before stays in effect")
            return before
        warn_once(f"roster reload {self.root}", [])
        if _local_view(before) != _local_view(self.snapshot):
            logger.info("roster reloaded: {} profiles", len(self.snapshot.profiles))
            self._publish()
        elif _remote_view(before) != _remote_view(self.snapshot):
            # roster.json is re-read by a reload too: the hint its file event sends then finds nothing new,
            # so a change of liveness read here is published here, or the Dispatcher would never see it
            self._publish()
        return self.snapshot

    @handles(RosterTick)
    def _on_tick(self, msg: RosterTick) -> None:
        if _signature(self.root) != self.signature:
            self._on_reload(Reload())
        else:
            self._on_remote_hint(RemoteRosterHint())

    @handles(RemoteRosterHint)
    def _on_remote_hint(self, msg: RemoteRosterHint) -> None:
        """roster.json may have changed: re-read it and publish when it did.

        Told by the file relay (the file's event, its rescan); asked by a DM's sender that found the
        file rewritten since the snapshot it has (``local/sending.py``: ``fresh_remote_roster``): the
        subscribers are told before the answer, so that DM, asked of the Dispatcher next, is planned
        with the file as it is now.
        """
        remote, mtime, identity = self._read_remote()
        current = self.snapshot
        if (tuple(remote), mtime, identity) == (current.remote, current.remote_mtime, current.remote_identity):
            return
        self.snapshot = replace(current, remote=tuple(remote), remote_mtime=mtime, remote_identity=identity,
                                version=current.version + 1)
        self.version = self.snapshot.version
        self._publish()

    @handles(RemoteRows)
    def _on_remote_rows(self, msg: RemoteRows) -> None:
        """A transport (Redis) pushed the remote roster: it replaces roster.json's from now on."""
        current = self.snapshot
        fresh_enough = current.remote_mtime is not None and msg.mtime - current.remote_mtime < REMOTE_REPUBLISH_SECONDS
        same = tuple(msg.rows) == current.remote and msg.unreachable == current.remote_unreachable
        if same and fresh_enough and self.pushed_remote is not None:
            return  # same rows, and the published freshness is recent: no need to wake the subscribers
        self.pushed_remote = (list(msg.rows), msg.mtime)
        mtime = current.remote_mtime if msg.unreachable and current.remote_mtime is not None else msg.mtime
        self.snapshot = replace(current, remote=tuple(msg.rows), remote_mtime=mtime, remote_identity=None,
                                remote_unreachable=msg.unreachable, remote_via="redis", version=current.version + 1)
        self.version = self.snapshot.version
        self._publish()


def _local_view(snapshot: RosterSnapshot) -> tuple[Any, ...]:
    """Pure: what a profile reload may change about this root's own bots."""
    return snapshot.profiles, snapshot.peers, snapshot.managed


def _remote_view(snapshot: RosterSnapshot) -> tuple[Any, ...]:
    """Pure: what ``roster.json`` (or a transport) says of other connections' agents, and which file said it."""
    return snapshot.remote, snapshot.remote_mtime, snapshot.remote_unreachable, snapshot.remote_identity
