"""The relay hub: plays the Desktop for several local Hermes roots.

``hermes-actors relay --root A --root B`` pushes each root the others' roster
(``online: true`` from a gateway's heartbeat, else unknown; only the rows of its
own roots: a row of another connection, the Desktop's, is kept, its ``online`` only while
that writer's last write is fresh), drains
every outbox (claim by rename onto this hub's shelf ``hubclaims/s-<token>/`` — two
hubs never both win), hands each envelope to the target root's ``inbox/`` and then
files it in ``claimed/`` (one for a connection it does not relay goes back into its
``outbox/``, unanswered, for the relay that serves it, until its TTL: then the hub answers it
``queued_expired``), and copies the target's
``delivered/`` record back into the sender root's ``replies/`` (first write wins).
All of it on filesystem events, with the periodic rescan as the fallback. A hub killed between a claim and the
post leaves the envelope on its shelf; the next hub adopts it and finishes the
post unless the target already has it. An envelope still in the ``inbox/`` of a
root where no gateway of ours beats (a seed gateway never reads it) once its
sender root's TTL ran out is taken back by rename (onto ``hubclaims/expiring/``)
and answered ``queued_expired``: its sender's own expiry only sees its outbox.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from loguru import logger

from actors import FileAppeared, FileRemoved, FsBridge, Rescan, Scheduler, TimerHandle, TypedActor, handles
from hermes_actors.core import outcomes
from hermes_actors.core.clipping import shown
from hermes_actors.core.config import load_config, parse_redis_config
from hermes_actors.core.ids import id_of_file_name
from hermes_actors.core.names import checked_connection_id
from hermes_actors.errors import HostileFileError, StoreError, UnfinishedFileError, ValidationError
from hermes_actors.faults import crashpoint
from hermes_actors.messages import InboxDeadline, RosterPush
from hermes_actors.ops.delivery_log import delivery_line
from hermes_actors.ops.main_thread_wait import MainThreadWait
from hermes_actors.ops.stop_signals import StopSignals
from hermes_actors.records import RemoteAgent
from hermes_actors.relay.drain import (
    Expired,
    Quarantined,
    ToDeliver,
    drain_envelope,
    expiry_deadline,
    past_deadline,
    settle_claimed,
)
from hermes_actors.relay.strays import ensure_relay_directories, puts_back, quarantine_misnamed, quarantine_strays
from hermes_actors.store import relay_files as rf
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.hermes_root import discover_profiles, existing_root
from hermes_actors.store.relay_dirfd import open_relay_dir, relay_dir, remove_below, rename_between
from hermes_actors.store.relay_heartbeat import gateway_alive
from hermes_actors.store.relay_inbox import (
    InboxPaths,
    already_posted,
    inbox_ttl,
    post_to_inbox,
    read_delivered,
    read_inbox_envelope,
    return_to_inbox,
)
from hermes_actors.store.relay_quarantine import quarantine
from hermes_actors.store.relay_roster import roster_row_dict
from hermes_actors.store.relay_shelf import Shelf
from hermes_actors.store.yaml_file import warned_while_failing

__all__ = ["HubActor", "HubRoot", "run_hub"]

ROSTER_REFRESH_SECONDS = 60.0  # rewrite unchanged rosters this often so they stay fresh (< 600 s)
ROSTER_MERGE_TRIES = 2  # a roster rewritten by another writer between the hub's read and its write is merged again
# The only directories whose new files the hub acts on (outbox/ → drain, delivered/ → forward): the rest
# of bot_relay/ (the gateways' shelves and marks, our own claims) never wakes it.
HUB_WATCHED = ("outbox", "delivered")
HANDED_KEEP = 10_000  # envelopes handed over and awaiting their reply, remembered for the log line (bounded)
# hubclaims/expiring/s-<token>/: the shelves where the hub holds an envelope it took from a root's inbox/ past its
# sender's TTL until its queued_expired reply is written (a directory, not a shelf: hubclaims/ adoption skips it)
EXPIRING_SHELVES = rp.EXPIRING_SHELVES
# An inbox deadline fires this long after the envelope's expiry time: it is expired only once its wait EXCEEDS the TTL
DEADLINE_SLACK_SECONDS = 0.05


@dataclass(frozen=True)
class HubRoot:
    """One root the hub relays for, known by its connection id."""

    name: str
    root: Path
    paths: InboxPaths
    ttl: float
    label: str = ""  # how senders on the other roots see it (its bot_mode.connection_label; "": its name)

    @classmethod
    def make(cls, name: str, root: Path) -> HubRoot:
        checked_connection_id(name)
        existing_root(root)
        # a relay directory left swapped for a symlink or a file is put back first, as a gateway's start does
        # (else one root's swapped delivered/ refused the hub's start for every root)
        paths = InboxPaths.from_root(root)
        ensure_relay_directories(paths)
        config = load_config(root)
        label = parse_redis_config(config.raw)[0].connection_label  # the transport settings' label, Redis's too
        return cls(name, root, paths, config.envelope_ttl_seconds, label or name)


def roster_for(target: HubRoot, roots: list[HubRoot], alive: dict[str, bool]) -> list[dict[str, Any]]:
    """The rows ``target`` sees: every other root's profiles.

    ``online: true`` when a gateway of ours beats on that root; otherwise the flag
    is left out (unknown), never ``false``: a root served by a seed-version gateway
    writes no heartbeat, and a false "offline" would make it unreachable (senders
    refuse ``runtime_offline``), while unknown enqueues and the TTL bounds the wait.

    Args:
        target: the root the rows are for.
        roots: every root of the hub.
        alive: root name → whether a gateway of ours beats there.

    Returns:
        The roster rows.

    Raises:
        OSError: a profile's files could not be read for a reason that says nothing about them (out of file
            descriptors, say: :func:`~hermes_actors.store.hermes_root.discover_profiles`).
    """
    rows: list[dict[str, Any]] = []
    for other in roots:
        if other.name == target.name:
            continue
        for p in discover_profiles(other.root):
            row: dict[str, Any] = {
                "profile": p.profile, "handle": p.handle, "connection_id": other.name,
                "connection_label": other.label or other.name, "title": p.title or p.display_name,
                "description": p.description,
            }
            if alive[other.name]:
                row["online"] = True
            rows.append(row)
    return rows


def merged_roster(existing: list[RemoteAgent], ours: list[dict[str, Any]],
                  served: Collection[str], *, others_age: float | None) -> list[dict[str, Any]]:
    """Pure: the rows the hub writes into a root's ``roster.json``: its own, and every other writer's.

    The hub vouches only for the connections it relays: a row of another connection (the Desktop's, serving
    the same root) is no agent of its to drop, and dropping it made that agent unknown to the root's senders
    ("no teammate named …") and the DMs queued for it look undeliverable. Nor is it the hub's to keep fresh:
    its rewrites reset the file's mtime, so such a row keeps its ``online`` flag only while its writer's own
    last write is fresh (:data:`~hermes_actors.store.relay_protocol.ROSTER_FRESH_SECONDS`); past that it is
    kept without it (liveness unknown), as the stale file would have read (before, a Desktop gone for hours
    stayed ``online: true``).

    Args:
        existing: the rows the root's ``roster.json`` has now (read and normalized).
        ours: the hub's rows for the root (:func:`roster_for`).
        served: the connection ids the hub relays: their rows in ``existing`` are replaced by ``ours``.
        others_age: seconds since another writer last wrote the file (:func:`others_wrote_at`); None: unknown.

    Returns:
        The rows of the other connections (without ``online`` once their writer's write is stale), then the hub's.
    """
    fresh = others_age is not None and others_age <= rp.ROSTER_FRESH_SECONDS
    kept = [roster_row_dict(agent if fresh else replace(agent, online=None))
            for agent in existing if agent.connection_id not in served]
    return kept + ours


def others_wrote_at(seen: rf.RosterIdentity | None, ours: rf.RosterIdentity | None,
                    before: float | None) -> float | None:
    """Pure: when another writer (the Desktop) last wrote a root's ``roster.json``, as far as the hub can tell.

    A file that is not the one the hub last wrote there was written by someone else, at its mtime; the hub's own
    rewrite says nothing new about the others' rows it kept.

    Args:
        seen: the identity of the file read now (:func:`~hermes_actors.store.relay_files.read_roster_version`);
            None: no file.
        ours: the identity of the file the hub last wrote there; None: none yet.
        before: what this said at the previous push; None: nothing known.

    Returns:
        The other writer's last write time (epoch seconds), or ``before`` when the file is the hub's own (or gone).
    """
    if seen is None or seen == ours:
        return before
    return seen[2] / 1e9  # its mtime (ns)


def _who_puts_back(paths: InboxPaths, directory: Path) -> str:
    """What the hub's refusal of ``directory`` says about its fix: only what the put-back really fixes is promised.

    Args:
        paths: the root's relay layout.
        directory: the relay directory the hub could not open.

    Returns:
        One sentence for the log line.
    """
    if puts_back(paths, directory):
        return ("The root's gateway puts a real directory back at its next rescan; with none of ours running there, "
                "the hub does")
    return ("Nothing puts it back (another user's directory, or a bot_relay/ that is itself a symlink, a file or "
            "another user's, is never moved): make it a real directory of the user running the hub and the "
            "gateways again (move the symlink or file aside, or chown it)")


def _ends(source: HubRoot, envelope: dict[str, Any]) -> tuple[str, str]:
    """Pure: the sender and the target a relayed DM's log line names (``@alice@alpha``, ``@bob@mini``)."""
    return f"@{envelope['from_handle']}@{source.name}", f"@{envelope['target_handle']}@{envelope['target_connection']}"


class HubActor(TypedActor):
    """Owns the hub's routing between roots."""

    def __init__(self, roots: list[HubRoot], *, scheduler: Scheduler, roster_seconds: float = 2.0) -> None:
        super().__init__()
        self.roots = roots
        self.by_name = {r.name: r for r in roots}
        self.by_base = {r.paths.relay.base: r for r in roots}
        self.timers = self.own_timers(scheduler)
        self.roster_seconds = roster_seconds
        self.last_roster: dict[str, tuple[Any, float]] = {}
        # per root, the identity of the roster.json the hub last wrote, and when another writer last wrote it
        # (its rows are kept with their online flag only while that is fresh: merged_roster)
        self.roster_written: dict[str, rf.RosterIdentity | None] = {}
        self.others_at: dict[str, float | None] = {}
        self.counters = {"drained": 0, "forwarded": 0, "expired": 0, "refused": 0, "resumed": 0}
        self.shelves = {r.name: Shelf(r.paths.hubclaims, within=r.paths.relay.root) for r in roots}
        self.claiming: dict[str, InboxPaths] = {}  # each root's layout with ``claimed`` = our shelf there
        self.expiring = {r.name: Shelf(r.paths.hubclaims / EXPIRING_SHELVES, within=r.paths.relay.root)
                         for r in roots}
        self.taking: dict[str, InboxPaths] = {}  # each root's layout with ``taken`` = our expiring shelf there
        # (root, envelope id) → the timer of an envelope waiting in that root's inbox/ where no gateway of ours
        # takes it (None: it has no deadline to keep: TTL off, unreadable, or its sender is no root of ours)
        self.inbox_deadlines: dict[tuple[str, str], TimerHandle | None] = {}
        # envelope id → (sender, target, created_at): what the reply's log line names (never the text)
        self.handed: OrderedDict[str, tuple[str, str, float]] = OrderedDict()
        self.refused: set[Path] = set()  # relay directories found swapped for a symlink (or not ours): logged once
        # per root, the relay directories the put-back could not make (quarantine_strays logs each once)
        self.unfixable: dict[str, set[Path]] = {r.name: set() for r in roots}
        # per root, the envelopes of its outbox/ for a connection this hub does not relay, put back there for the
        # relay that serves it (the Desktop), with their expiry deadline (None: never): not claimed again before
        # it (then answered queued_expired: a seed sender has no expiry of its own), forgotten once gone
        self.elsewhere: dict[str, dict[str, float | None]] = {r.name: {} for r in roots}

    def on_start(self) -> None:
        for root in self.roots:
            shelf = self.shelves[root.name].open()
            self.claiming[root.name] = replace(root.paths, relay=replace(root.paths.relay, claimed=shelf))
            self.taking[root.name] = root.paths.on_shelf(self.expiring[root.name].open())
        self._finish_dead_claims()
        self._finish_dead_expiries()
        # The first push is told by run_hub once the watches are up: a sender that sees the
        # roster must never be able to queue an envelope the hub is not yet watching for.
        self.timers.every(self.roster_seconds, RosterPush())

    def on_stop(self) -> None:
        for shelf in (*self.shelves.values(), *self.expiring.values()):
            shelf.close()

    def _finish_dead_claims(self) -> None:
        """A hub killed between its claim and the inbox post left envelopes on its shelf: finish them."""
        for source in self.roots:
            adopted = self.shelves[source.name].adopt()
            for envelope_id in (*adopted.ids, *adopted.legacy):
                path = self.claiming[source.name].relay.claimed / f"{envelope_id}.json"
                try:
                    with relay_dir(source.paths.relay.base, path.parent) as shelf_fd:  # our shelf, never followed
                        envelope = rf.read_envelope(path, dir_fd=shelf_fd)
                except FileNotFoundError:
                    continue
                except (OSError, ValidationError) as exc:
                    quarantine(source.paths.relay, path, str(exc))
                    continue
                target = self.by_name.get(envelope["target_connection"])
                try:
                    posted = target is not None and already_posted(source.paths, target.paths, envelope_id)
                except HostileFileError as exc:  # cannot tell whether it got there: the next hub start looks again
                    logger.error("hub: the claim {} of {} stays on our shelf: {}", envelope_id, source.name, exc)
                    continue
                if not posted:
                    if not self._route(source, envelope):
                        continue  # back in its outbox/, for the relay that serves its connection
                    self.counters["resumed"] += 1
                self._file_claim(source, envelope_id)
            if adopted.ids or adopted.legacy:
                logger.info("hub: finished {} claim(s) a stopped hub left on {}", len(adopted.ids) +
                            len(adopted.legacy), source.name)

    def _file_claim(self, source: HubRoot, envelope_id: str) -> None:
        """The envelope was handed on (or answered): move it from our shelf to ``claimed/``, as the seed keeps it."""
        shelf = self.claiming[source.name].relay.claimed
        try:
            rename_between(source.paths.relay.base, shelf, source.paths.relay.claimed, f"{envelope_id}.json")
        except (OSError, ValidationError) as exc:
            logger.warning("hub: could not file the claim {} of {}: {}", envelope_id, source.name, exc)

    @handles(RosterPush)
    def _on_push(self, msg: RosterPush) -> None:
        self._push_rosters()

    def _push_rosters(self) -> None:
        alive = {r.name: gateway_alive(r.paths) for r in self.roots}
        now = time.time()
        failing = (StoreError, OSError, ValidationError)  # a hostile (symlinked) directory included
        for root in self.roots:
            # reading the other roots' profiles fails too (out of file descriptors, say): that root keeps the
            # roster pushed before, it is said once while it lasts, and the next push tries again
            with warned_while_failing(f"hub roster push to {root.paths.relay.base}", failing,
                                      f"hub: roster push to {root.name} failed"):  # once while it lasts
                self._push_roster(root, roster_for(root, self.roots, alive), now)

    def _push_roster(self, root: HubRoot, ours: list[dict[str, Any]], now: float) -> None:
        """Merge ``ours`` into ``root``'s ``roster.json`` and write it when it changed (or to keep it fresh).

        Read again (once) when another writer replaced the file between the read and the write: its push was
        lost under the hub's otherwise.

        Raises:
            StoreError, OSError, ValidationError: the write failed (the caller says it once while it lasts).
        """
        roster = root.paths.relay.roster
        for _try in range(ROSTER_MERGE_TRIES):
            existing, _age, seen = rf.read_roster_version(root.paths.relay, now=now)
            others_at = others_wrote_at(seen, self.roster_written.get(root.name), self.others_at.get(root.name))
            others_age = None if others_at is None else now - others_at
            rows = merged_roster(existing, ours, self.by_name, others_age=others_age)
            if rf.roster_identity(roster) == seen:
                break  # nobody wrote it since the read
        self.others_at[root.name] = others_at
        previous = self.last_roster.get(root.name)
        ours_still = seen is not None and seen == self.roster_written.get(root.name)
        if ours_still:  # our file: rewritten when its rows change, and to keep it fresh
            due = not (previous and previous[0] == rows and now - previous[1] < ROSTER_REFRESH_SECONDS)
        else:  # another writer's (the Desktop's, a hub over other roots): only when it lacks or misstates our rows;
            # rewriting it at every push made two hubs sharing a root replace each other's file every 2 s
            due = seen is None or rows != [roster_row_dict(agent) for agent in existing]
        if due:
            rf.write_roster(root.paths.relay, rows, now=now)
            self.last_roster[root.name] = (rows, now)
            self.roster_written[root.name] = rf.roster_identity(roster)

    def _drain(self, source: HubRoot, envelope_id: str) -> None:
        now = time.time()
        left = self.elsewhere[source.name]
        if envelope_id in left and not past_deadline(left[envelope_id], now):
            return  # for a connection we do not relay: left to the relay that serves it until its TTL
        result = drain_envelope(self.claiming[source.name], "outbox", envelope_id, ttl=source.ttl, now=now)
        if isinstance(result, Expired):
            self._reply(source, result.reply)
            self.counters["expired"] += 1
            self._log(envelope_id, *_ends(source, result.envelope), result.reply, None)
        elif isinstance(result, ToDeliver):
            crashpoint("hub-after-claim-before-post")
            if not self._route(source, result.envelope):
                return  # back in its outbox/, for the relay that serves its connection
        else:
            if isinstance(result, Quarantined) and result.reply is not None:  # its sender is told: NOT delivered
                self.counters["refused"] += 1
                if self._reply(source, result.reply) is not None:
                    self._log(envelope_id, f"?@{source.name}", "?", result.reply, None)
            return  # another drainer won the rename, or the file was quarantined
        self._file_claim(source, envelope_id)

    def _route(self, source: HubRoot, envelope: dict[str, Any]) -> bool:
        """Hand a claimed envelope to its target's ``inbox/``, or answer why not.

        Args:
            source: the root whose outbox/ it was claimed from (it is on our shelf there).
            envelope: the claimed envelope.

        Returns:
            True when it was handed on or answered (its claim is filed next); False when its connection is
            none of this hub's: it is put back into the outbox/ (:meth:`_leave_for_its_relay`), never answered.
        """
        envelope_id = envelope["id"]
        sender, to = _ends(source, envelope)
        created = float(envelope["created_at"]) or None  # 0: a seed envelope without one (its age is the mtime's)
        target = self.by_name.get(envelope["target_connection"])
        if target is None:
            self._leave_for_its_relay(source, envelope)
            return False
        try:
            post_to_inbox(target.paths, envelope, source.name, sender_ttl=source.ttl)  # the TTL that expires it
            self.counters["drained"] += 1
            self.handed[envelope_id] = (sender, to, created or time.time())
            if len(self.handed) > HANDED_KEEP:
                self.handed.popitem(last=False)
        except (StoreError, OSError, ValidationError) as exc:
            text = f"the relay could not hand the message to {target.name}: {exc}. It was NOT delivered."
            # the target's relay directory unusable now (full, swapped, not ours): resending later may work;
            # an envelope that does not validate will not
            broken = isinstance(exc, ValidationError) and not isinstance(exc, HostileFileError)
            reply = rp.make_reply(envelope_id, error=text, reason="unknown" if broken else "runtime_offline",
                                  now=time.time())
            self._reply(source, reply)
            self._log(envelope_id, sender, to, reply, created)
        return True

    def _leave_for_its_relay(self, source: HubRoot, envelope: dict[str, Any]) -> None:
        """Put an envelope for a connection this hub does not relay back into ``source``'s outbox/, unanswered.

        Another relay serving the root (the Desktop, or a hub over other roots) may know that connection: a
        ``runtime_offline`` "NOT delivered" here failed a DM it would deliver (the first reply wins). Left in the
        outbox/, it is delivered by that relay, or answered ``queued_expired`` once past its TTL: by its sender's
        own expiry (a gateway of ours), by that relay's drain, or by this hub, which claims it again only then
        (:attr:`elsewhere`; a seed sender has no expiry of its own, so nobody answered it while the hub ran).
        """
        envelope_id, conn = envelope["id"], envelope["target_connection"]
        sender, to = _ends(source, envelope)
        shelved = self.claiming[source.name].relay.claimed / f"{envelope_id}.json"
        try:
            mtime: float | None = os.lstat(shelved).st_mtime  # a rename keeps it: ages one without created_at
        except OSError:
            mtime = None
        # unknown age (no created_at, no mtime): expired at once, as drain_envelope would find it
        self.elsewhere[source.name][envelope_id] = expiry_deadline(envelope, ttl=source.ttl, mtime=mtime)
        try:
            moved = rename_between(source.paths.relay.base, self.claiming[source.name].relay.claimed,
                                   source.paths.relay.outbox, f"{envelope_id}.json")
        except (OSError, ValidationError) as exc:  # HostileFileError included: the next hub start puts it back
            logger.error("hub: could not put {} (for connection '{}') back into the outbox/ of {}: {}; it stays on "
                         "our shelf until the next hub start", envelope_id, conn, source.name, exc)
            return
        if moved:
            logger.info("hub: delivery {} {} → {} left in the outbox/ of {}: this hub relays only for {}, so it "
                        "waits there for the relay that serves '{}' (or its sender's TTL)", envelope_id, sender, to,
                        source.name, ", ".join(self.by_name), conn)

    @staticmethod
    def _log(envelope_id: str, sender: str, target: str, reply: dict[str, Any], created_at: float | None) -> None:
        """The one INFO line of a relayed DM (never its text): its status as the sender reads it, and the reason."""
        outcome = outcomes.from_relay_reply(envelope_id, target, str(reply.get("reply") or ""),
                                            str(reply.get("error") or ""), str(reply.get("reason") or ""))
        latency = None if created_at is None else time.time() - float(created_at)
        logger.info("hub: {}", delivery_line(envelope_id, sender, target, outcome.status, outcome.reason, latency))

    @contextmanager
    def _relay_dir(self, root: HubRoot, directory: Path) -> Iterator[int | None]:
        """``directory`` of ``root`` opened from its ``bot_relay/`` without following a symlink at any step.

        Yields None when it cannot be used: missing (its gateway, or our put-back, makes it again), or
        swapped for a symlink, a file or another user's directory (or below a ``bot_relay/`` that is): that
        is logged once, not at every pass, saying who fixes it, and nothing in it is read, removed or moved
        until it is a real directory of ours again.
        """
        try:
            fd = open_relay_dir(root.paths.relay.base, directory)
        except FileNotFoundError:
            yield None
            return
        except (OSError, HostileFileError) as exc:
            if directory not in self.refused:
                self.refused.add(directory)
                logger.error("hub: {} of {} cannot be used, nothing is taken from it: {}. {}", directory, root.name,
                             exc, _who_puts_back(root.paths, directory))
            yield None
            return
        if directory in self.refused:
            self.refused.discard(directory)
            logger.info("hub: {} of {} is a usable directory again", directory, root.name)
        try:
            yield fd
        finally:
            os.close(fd)

    def _forward(self, holder: HubRoot, envelope_id: str, delivered: int) -> None:
        """Copy ``delivered/<id>.json`` (read through ``delivered``, its directory's descriptor) to the sender.

        A record still empty or not JSON yet that changed within the write grace is left alone and read again at
        its close-write event or the next rescan (:func:`~hermes_actors.store.safe_read.may_be_unfinished`).
        """
        path = holder.paths.delivered / f"{envelope_id}.json"
        try:
            record, reply_connection = read_delivered(path, dir_fd=delivered, unfinished_at=time.time())
        except FileNotFoundError:
            return
        except UnfinishedFileError as exc:
            logger.debug("hub: {}; read again once it is written", exc)
            return
        except ValidationError as exc:
            quarantine(holder.paths.relay, path, str(exc))
            return
        except OSError as exc:  # transient: the file stays in delivered/ and the next rescan retries
            logger.warning("hub: could not read {}: {}", path, exc)
            return
        source = self.by_name.get(reply_connection)
        if source is None:
            quarantine(holder.paths.relay, path, f"reply for unknown connection {reply_connection!r}")
            return
        written = self._reply(source, record)
        if written is None:
            return  # the write failed: keep the record in delivered/ so the next rescan retries it
        if written:
            self.counters["forwarded"] += 1
            sender, to, created_at = self.handed.pop(envelope_id, (f"?@{reply_connection}", f"?@{holder.name}", None))
            self._log(envelope_id, sender, to, record, created_at)
        try:
            os.unlink(path.name, dir_fd=delivered)
        except FileNotFoundError:
            pass
        except OSError as exc:  # a directory planted under its name: the next rescan quarantines it
            logger.warning("hub: could not remove {}: {}", path, exc)

    def _reply(self, source: HubRoot, record: dict[str, Any]) -> bool | None:
        """Write a reply into ``source``'s replies/: True written, False one was there, None failed."""
        try:
            return rf.write_reply(source.paths.relay, record)
        except (StoreError, OSError, ValidationError) as exc:
            logger.error("hub: reply {} to {} failed: {}", record.get("id"), source.name, exc)
            return None

    # ── envelopes left in an inbox/ no gateway of ours takes: the sender's TTL bounds their wait ───────

    def _watch_inbox(self, target: HubRoot) -> None:
        """Keep a deadline timer for each envelope in ``target``'s ``inbox/``; forget those gone from it.

        Args:
            target: a root where no gateway of ours beats (a seed gateway never reads ``inbox/``).
        """
        inbox = target.paths.inbox
        with self._relay_dir(target, inbox) as fd:
            if fd is None:
                return
            listed = set(rf.list_ids(inbox, dir_fd=fd))
            for envelope_id in sorted(listed - {e for name, e in self.inbox_deadlines if name == target.name}):
                self.inbox_deadlines[(target.name, envelope_id)] = self._deadline_timer(target, envelope_id, fd)
        for key in [k for k in self.inbox_deadlines if k[0] == target.name and k[1] not in listed]:
            timer = self.inbox_deadlines.pop(key)  # taken meanwhile (by a gateway, or answered)
            if timer is not None:
                timer.cancel()

    def _deadline_timer(self, target: HubRoot, envelope_id: str, inbox: int) -> TimerHandle | None:
        """A timer telling us when the envelope in ``target``'s ``inbox/`` (descriptor ``inbox``) expires."""
        looked = self._look_in_inbox(target, envelope_id, inbox)
        if looked is None:
            return None
        delay = max(0.0, looked[1] - time.time()) + DEADLINE_SLACK_SECONDS
        return self.timers.after(delay, InboxDeadline(target.name, envelope_id))

    def _look_in_inbox(self, target: HubRoot, envelope_id: str, inbox: int) -> tuple[HubRoot, float] | None:
        """Read an envelope in ``target``'s ``inbox/`` without taking it: its sender's root and expiry time.

        Args:
            target: the root whose ``inbox/`` holds it.
            envelope_id: the envelope.
            inbox: ``inbox/`` opened from ``bot_relay/`` without following a symlink.

        Returns:
            (the sender's root, when its sender's TTL runs out), or None: gone, unreadable (left for the
            gateway that takes it, which quarantines it), its sender no root of this hub, or expiry off.
        """
        name = f"{envelope_id}.json"
        try:
            envelope, reply_connection = read_inbox_envelope(target.paths.inbox / name, dir_fd=inbox)
            mtime = os.stat(name, dir_fd=inbox, follow_symlinks=False).st_mtime
        except (OSError, ValidationError):  # FileNotFoundError (taken meanwhile) and HostileFileError included
            return None
        source = self.by_name.get(reply_connection)
        if source is None:
            return None
        deadline = expiry_deadline(envelope, ttl=inbox_ttl(envelope, source.ttl), mtime=mtime)
        return None if deadline is None else (source, deadline)

    @handles(InboxDeadline)
    def _on_inbox_deadline(self, msg: InboxDeadline) -> None:
        """An envelope's sender TTL ran out: answer it ``queued_expired`` if it still waits in the inbox/."""
        key = (msg.connection, msg.envelope_id)
        self.inbox_deadlines.pop(key, None)
        target = self.by_name.get(msg.connection)
        if target is None:
            return
        with self._relay_dir(target, target.paths.inbox) as fd:
            looked = None if fd is None else self._look_in_inbox(target, msg.envelope_id, fd)
        if looked is None:
            return  # taken meanwhile (the rename decided: its taker answers it), or nothing we can answer
        source, deadline = looked
        if time.time() <= deadline:  # the timer runs on the monotonic clock, the TTL on the wall clock: wait on
            self.inbox_deadlines[key] = self.timers.after(deadline - time.time() + DEADLINE_SLACK_SECONDS, msg)
            return
        # The take decides, as a gateway's does: whoever renames it out of inbox/ first owns it, so a gateway
        # taking it at this moment runs it and we answer nothing, or we answer it and no gateway ever sees it.
        result = drain_envelope(self.taking[target.name], "inbox", msg.envelope_id, ttl=source.ttl, now=time.time())
        if isinstance(result, Expired | ToDeliver):
            self._settle_taken(target, result)

    def _settle_taken(self, target: HubRoot, result: Expired | ToDeliver) -> None:
        """Answer an envelope we took from ``target``'s ``inbox/`` ``queued_expired``, or put it back there.

        The reply goes straight into its sender's ``replies/``; the envelope leaves our shelf only once that
        is written (else the next hub start answers it). One found fresh after all (its file replaced, the
        clock set back) goes back into ``inbox/`` for its taker.
        """
        envelope_id = result.envelope["id"]
        source = self.by_name.get(result.reply_connection)
        paths = self.taking[target.name]
        if isinstance(result, ToDeliver) or source is None:
            try:
                return_to_inbox(paths, envelope_id)
            except (OSError, ValidationError) as exc:
                logger.warning("hub: could not put {} back into the inbox/ of {}: {}", envelope_id, target.name, exc)
            return
        written = self._reply(source, result.reply)
        if written is None:
            return  # kept on our shelf: the next hub start answers it
        self.counters["expired"] += 1
        self.handed.pop(envelope_id, None)
        created = float(result.envelope["created_at"]) or None
        self._log(envelope_id, *_ends(source, result.envelope), result.reply, created)
        try:  # through our checked shelf: a shelf swapped for a symlink is refused, never followed
            remove_below(target.paths.relay.root, paths.relay.id_file(paths.taken, envelope_id))
        except (OSError, ValidationError) as exc:  # answered all the same; the next hub start finds it answered
            logger.warning("hub: could not take {} off our shelf on {}: {}", envelope_id, target.name, exc)

    def _finish_dead_expiries(self) -> None:
        """A hub killed after taking an envelope from an inbox/ to expire it left it on its shelf: answer it."""
        for target in self.roots:
            adopted = self.expiring[target.name].adopt()
            paths = self.taking[target.name]
            for envelope_id in (*adopted.ids, *adopted.legacy):
                path = paths.taken / f"{envelope_id}.json"
                try:  # its sender's TTL decides, as when it was taken; the file is read again by the settle below
                    with relay_dir(target.paths.relay.base, paths.taken) as shelf:
                        reply_connection = read_inbox_envelope(path, dir_fd=shelf)[1]
                except (OSError, ValidationError):
                    reply_connection = ""  # the settle quarantines what cannot be read
                source = self.by_name.get(reply_connection)
                result = settle_claimed(paths, "inbox", path, ttl=source.ttl if source else 0, now=time.time())
                if isinstance(result, Expired | ToDeliver):
                    self._settle_taken(target, result)
            if adopted.ids or adopted.legacy:
                logger.info("hub: finished {} expiry take(s) a stopped hub left on {}", len(adopted.ids) +
                            len(adopted.legacy), target.name)

    @handles(FileAppeared)
    def _on_file(self, msg: FileAppeared) -> None:
        directory = msg.path.parent
        root = self.by_base.get(directory.parent)
        envelope_id = id_of_file_name(msg.path.name)
        if root is None or envelope_id is None:
            return
        if directory == root.paths.relay.outbox:
            self._drain(root, envelope_id)  # the claim renames through directory descriptors
        elif directory == root.paths.delivered:
            with self._relay_dir(root, directory) as delivered:
                if delivered is not None:
                    self._forward(root, envelope_id, delivered)

    @handles(FileRemoved)
    def _on_removed(self, msg: FileRemoved) -> None:
        return None

    @handles(Rescan)
    def _on_rescan(self, msg: Rescan) -> None:
        for root in self.roots:  # one root's trouble stops none of the others, nor the hub
            # StoreError, HostileFileError included
            with warned_while_failing(f"hub rescan of {root.paths.relay.base}", (OSError, ValidationError),
                                      f"hub: the rescan of {root.name} ({root.paths.relay.base}) failed",
                                      "The hub goes on with the other roots and tries again at the next rescan; if "
                                      "this lasts, check that the directory and everything in it belong to the user "
                                      "running the hub"):
                self._rescan_root(root)

    def _rescan_root(self, root: HubRoot) -> None:
        """Clean ``root`` up when no gateway of ours does, drain its outbox/ and forward its delivered/."""
        if not gateway_alive(root.paths):
            # Nobody else puts back a relay directory swapped for a symlink (or removed) on this root (a
            # gateway of ours does it at its rescans; a seed gateway never): the hub does, by the same rule.
            quarantine_strays(root.paths, unfixable=self.unfixable[root.name])
            # Nobody else expires what waits in its inbox/ either (a seed gateway never reads it; the sender's
            # own expiry only sees its outbox/, which the hub emptied): the hub keeps each envelope's deadline.
            self._watch_inbox(root)
        outbox = root.paths.relay.outbox
        # the outbox's reader moves aside what no listing takes (an uppercase id, a name too long), as a gateway
        # does in its inbox/: left there, it stayed unseen, with no log line
        quarantine_misnamed(root.paths, outbox)
        with self._relay_dir(root, outbox) as fd:
            queued = [] if fd is None else rf.list_ids(outbox, oldest_first=True, dir_fd=fd)
        left = self.elsewhere[root.name]
        self.elsewhere[root.name] = {i: left[i] for i in queued if i in left}  # forget those taken meanwhile
        for envelope_id in queued:
            self._drain(root, envelope_id)
        with self._relay_dir(root, root.paths.delivered) as delivered:
            if delivered is not None:
                for envelope_id in rf.list_ids(root.paths.delivered, dir_fd=delivered):
                    self._forward(root, envelope_id, delivered)


def _checked_roots(roots: list[Path], names: list[str] | None) -> list[str]:
    """Refuse what the hub cannot run on, for every root before any is changed (:meth:`HubRoot.make` makes their
    relay directories: a refusal of the last root left them made in the first ones).

    Args:
        roots: the ``--root`` values.
        names: the ``--name`` values (None: each root's folder name).

    Returns:
        Each root's connection id, in order.

    Raises:
        ValueError: the ``names`` do not match the ``roots``, a root is given twice, a name is no connection
            id (naming its ``--root`` and ``--name``), two roots would get one connection id, or a root is not a
            Hermes root.
        FileNotFoundError: a root does not exist.
    """
    if names is not None and len(names) != len(roots):
        raise ValueError(f"got {len(names)} --name for {len(roots)} --root; give one per root or none")
    resolved = [Path(r).resolve() for r in roots]
    twice = sorted({str(r) for r in resolved if resolved.count(r) > 1})
    if twice:
        raise ValueError(f"the same root is given twice: {', '.join(twice)}; give each root once")
    taken = names or [r.name for r in roots]
    for name, root in zip(taken, roots, strict=True):
        _check_hub_name(name, root, given=names is not None)
        existing_root(root)
    clashing = sorted({name for name in taken if taken.count(name) > 1})
    if clashing:
        how = ("each --name must differ" if names is not None
               else "their folder names collide: give each root a --name")
        raise ValueError(f"connection ids must be unique, and {', '.join(clashing)} names several roots: {how}")
    return taken


def _check_hub_name(name: str, root: Path, *, given: bool) -> None:
    """Refuse a root's connection id that is none (:func:`checked_connection_id`), naming the root and ``--name``.

    Args:
        name: the connection id.
        root: its ``--root``.
        given: it is a ``--name`` (else the root's folder name: ``''`` for ``--root .``).

    Raises:
        ValueError: it is no connection id.
    """
    try:
        checked_connection_id(name)
    except ValueError as exc:
        if given:
            raise ValueError(f"--name {shown(name)} for --root {root}: {exc}") from None
        raise ValueError(f"--root {root}: {exc}; without --name a root's connection id is its folder name: give "
                         "each --root a --name, in the same order") from None


@contextmanager
def _relaying(hub_roots: list[HubRoot], scheduler: Scheduler, rescan_seconds: float) -> Iterator[None]:
    """The hub's actor and its watches over ``hub_roots`` while the block runs (none for no roots).

    Args:
        hub_roots: the roots to relay between (empty: nothing is started).
        scheduler: the timers' scheduler.
        rescan_seconds: the watches' rescan period.
    """
    if not hub_roots:
        yield
        return
    hub = HubActor.start(hub_roots, scheduler=scheduler)
    bridges = [
        FsBridge(r.paths.relay.base, hub, scheduler=scheduler, rescan_seconds=rescan_seconds,
                 subdirs=HUB_WATCHED).start()
        for r in hub_roots
    ]
    hub.tell(RosterPush())
    try:
        yield
    finally:
        for bridge in bridges:
            bridge.stop()
        hub.stop(block=True, timeout=10)


def run_hub(
    roots: list[Path], *, names: list[str] | None = None, rescan_seconds: float = 2.0,
    stop: threading.Event | None = None, quiet: bool = False,
) -> int:
    """Run the hub until SIGINT, SIGTERM or SIGHUP (or ``stop`` is set). Returns the exit code.

    Unless ``quiet`` it says so on stdout as it starts (``relay hub running for alpha, mini``), warns on
    stderr when it has a single root, and says ``relay hub stopped`` on stderr once it stopped, as ``serve``
    says ``gateway stopped``. A single root is relayed nothing and left untouched: no roster is written (it
    emptied the root's ``roster.json``, the Desktop's), no outbox/ drained (it failed every queued DM), no
    directory made; it only waits for the stop.

    Raises:
        ValueError: the ``names`` do not match the ``roots``, a root is given twice, a name is no connection id,
            two roots would get one connection id, or a root is not a Hermes root: each root is checked before
            any is changed (:func:`_checked_roots`).
        FileNotFoundError: a root does not exist (nothing changed either).
    """
    taken = _checked_roots(roots, names)
    # one root: nobody to relay to, so nothing of it is touched (not even its relay directories made)
    hub_roots = [HubRoot.make(name, root) for name, root in zip(taken, roots, strict=True)] if len(taken) > 1 else []
    # SIGINT, SIGTERM and SIGHUP set stop, from before the start to the end of the stop (one rule with serve's)
    signals = StopSignals(stop=stop)
    with signals.routed(), Scheduler() as scheduler, MainThreadWait() as waits, \
            _relaying(hub_roots, scheduler, rescan_seconds):
        if not quiet:
            print(f"relay hub running for {', '.join(taken)}", flush=True)
            if not hub_roots:  # it runs all the same (as before), and leaves the root alone
                print(f"warning: a relay hub joins two or more roots; with only {roots[0]} it relays "
                      "nothing (give each root to relay with its own --root)", file=sys.stderr, flush=True)
        waits.until_set(signals.stop)  # a signal handed to a watcher's thread wakes this wait too
    if not quiet:
        print("relay hub stopped", file=sys.stderr, flush=True)
    return 0
