"""What a root's Bot Mode is doing: the ``status`` view, from a running gateway or from the files.

:func:`live_status` asks a running :class:`~hermes_actors.gateway.Gateway` (its
``stats()`` and ``roster()``); :func:`file_status` reads the root's files when no
gateway answers. Both return the same shape (``source`` says which)::

    {
      "source": "gateway" | "files",
      "root": "/path/to/root",
      "running": True | False,            # a gateway answers for the root
      "gateway": {"pid", "connection_id", "started_at", "uptime_seconds", "transport"} | None,
      "processes": [{"pid", "connection_id", "age_seconds"}],   # fresh gateway heartbeats
      "profiles": [{"profile", "handle", "title", "managed", "state", "queued", "in_flight", "live_owner"}],
      "in_flight": [{"delivery_id", "sender", "target", "profile", "route", "age_seconds", "started"}],
                                          # sender: its handle (core.outcomes.shown_sender), target: its label,
                                          # profile: the local one that runs it ("" for routes relay and peer)
      "counters": {"accepted", "refused", "settled", "pending", "by_status", "by_reason", "by_outcome"},
      "relay": {"transport", "outbox", "claimed", "replies", "inbox", "taken", "quarantine", "unconfirmed",
                "roster", "roster_age_seconds", "remote_agents", "reachable", "peers", "peers_in_flight", "alive",
                "stats"},                 # peers_in_flight: DMs handed to bot_peers peers without an outcome
      "managed": True | False,
      "problems": ["..."],
      "rooms": [{"name", "room_id", "members", "state", "messages", "last_activity", "idle_seconds"}],
    }

``rooms`` is there only from a running gateway that has group rooms (``state`` is
``idle``, ``busy`` or ``needs_you``; ``messages`` counts every transcript entry
posted; ``last_activity`` is the newest one's time, else the room's creation).

``state`` is ``idle``, ``running`` (a DM is in its turn; ``queued`` more wait), ``busy`` (the hermes
gateway still runs an earlier turn of the bot that this gateway gave up on, a timed-out warm turn or one
lost in a stopping gateway: its DMs fail ``target_busy`` until that turn ends; ``queued`` counts the DMs
in flight to it) or, from the files, ``offline`` (``queued`` then counts the journaled DMs waiting for
the next start). ``by_outcome`` is ``{status: {reason: count}}``; ``by_status`` and ``by_reason``
are its sums. A value the source cannot know is None.

The remote roster is read where the root's transport keeps it
(:func:`~hermes_actors.ops.remote_roster.read_remote_roster`): ``roster`` names it (the
``roster.json`` path or the masked Redis URL); ``reachable`` is None on the file relay, else
whether Redis answered (the reading, and a running gateway's own link); when it did not,
``problems`` says so, naming the URL and the fix.
"""

from __future__ import annotations

import os
import stat
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hermes_actors.core.config import load_config
from hermes_actors.core.outcomes import shown_sender
from hermes_actors.core.shell import shell_command
from hermes_actors.core.wake import WAKE_ORIGIN, shown_route
from hermes_actors.hermes.warm_or_cli import turns_in_hermes
from hermes_actors.local.delivery_stats import in_flight_counts
from hermes_actors.messages import PEER_ORIGIN, REDIS_ORIGIN, RELAY_ORIGIN
from hermes_actors.ops.doctor_checks import check_redis
from hermes_actors.ops.journal_view import read_journals
from hermes_actors.ops.remote_roster import RemoteRoster, read_remote_roster
from hermes_actors.relay.strays import start_refusal
from hermes_actors.store.hermes_root import discover_profiles, existing_root, install_is_managed
from hermes_actors.store.journal_records import delivery_origin
from hermes_actors.store.os_errors import advised, resource_failure
from hermes_actors.store.relay_dirfd import refusal_below
from hermes_actors.store.relay_files import list_ids
from hermes_actors.store.relay_heartbeat import live_heartbeats
from hermes_actors.store.relay_inbox import InboxPaths
from hermes_actors.store.relay_shelf import count_on_shelves
from hermes_actors.transports.redis.store import UNCONFIRMED_DIR

if TYPE_CHECKING:
    from hermes_actors.gateway import Gateway

__all__ = [
    "STATUS_KEYS", "busy_in_hermes", "file_status", "live_status", "relay_dir_counts", "relay_start_problems",
    "roster_fields", "transport_problems",
]
_RELAY_COUNTS = ("outbox", "claimed", "replies", "inbox", "taken", "quarantine", "unconfirmed")

STATUS_KEYS = ("running", "profiles", "in_flight", "counters", "relay")


# ── pure pieces ─────────────────────────────────────────────────────────────


def outcome_counters(by_outcome: dict[str, dict[str, int]]) -> dict[str, Any]:
    """Pure: ``by_outcome`` ({status: {reason: n}}) with its per-status and per-reason sums.

    Args:
        by_outcome: settled deliveries counted by status, then reason ("" when none).

    Returns:
        ``{"by_outcome", "by_status", "by_reason"}``; reasons of "" are left out of ``by_reason``.
    """
    by_status: Counter[str] = Counter()
    by_reason: Counter[str] = Counter()
    for status, reasons in by_outcome.items():
        for reason, count in reasons.items():
            by_status[status] += count
            if reason:
                by_reason[reason] += count
    return {
        "by_outcome": {s: dict(r) for s, r in sorted(by_outcome.items())},
        "by_status": dict(sorted(by_status.items())),
        "by_reason": dict(sorted(by_reason.items())),
    }


def profile_rows(
    profiles: list[dict[str, Any]], per_profile: dict[str, int], live_owners: set[str], *, live: bool,
    busy: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """Pure: one status row per local profile.

    Args:
        profiles: ``{"profile", "handle", "title", "managed"}`` per local profile.
        per_profile: in-flight deliveries per profile (running + queued).
        live_owners: profiles with a live Bot Chat owner attached.
        live: a gateway answers (else every profile is ``offline``).
        busy: profiles whose earlier turn hermes still runs (:func:`busy_in_hermes`).

    Returns:
        The rows, in the order given.
    """
    rows = []
    for p in profiles:
        n = per_profile.get(p["profile"], 0)
        if live and p["profile"] in busy:
            state, queued = "busy", n  # every DM to it waits on (and is refused by) that earlier turn
        elif live:
            state, queued = ("running", n - 1) if n else ("idle", 0)
        else:
            state, queued = "offline", n
        rows.append({**p, "state": state, "queued": queued, "in_flight": n, "live_owner": p["profile"] in live_owners})
    return rows


def busy_in_hermes(before: dict[str, str], after: dict[str, str], in_flight: set[str]) -> frozenset[str]:
    """Pure: the bots whose DMs fail ``target_busy`` because hermes still runs an earlier turn of theirs.

    The runner is asked before and after the gateway's stats: a turn seen both times with the same delivery,
    which is not among the deliveries in flight, is one this gateway gave up on (timed out, or lost), still
    running in the hermes gateway; a turn that is a DM's in flight is that DM's own (the bot is ``running``).

    Args:
        before: :func:`~hermes_actors.hermes.warm_or_cli.turns_in_hermes` before the stats were taken.
        after: the same, after.
        in_flight: the ids of the deliveries in flight in the stats.

    Returns:
        The profiles.
    """
    return frozenset(p for p, d in before.items() if after.get(p) == d and d not in in_flight)


def room_rows(rooms: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """Pure: ``list_rooms()`` rows as the status shows them: ``idle_seconds`` since ``last_activity`` added, by name.

    Args:
        rooms: ``Gateway.list_rooms()``.
        now: the current time.

    Returns:
        ``{name, room_id, members, state, messages, last_activity, idle_seconds}`` per room.
    """
    out = []
    for room in rooms:
        last = room.get("last_activity")
        idle = round(max(0.0, now - last), 3) if isinstance(last, int | float) else None
        out.append({"name": room.get("name"), "room_id": room.get("room_id"),
                    "members": list(room.get("members") or ()), "state": room.get("state"),
                    "messages": room.get("messages"), "last_activity": last, "idle_seconds": idle})
    out.sort(key=lambda r: str(r["name"]).lower())
    return out


def in_flight_rows(rows: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """Pure: in-flight rows (with ``accepted_at``) as the status shows them: ``age_seconds`` instead, oldest first."""
    out = []
    for row in rows:
        accepted = row.get("accepted_at")
        age = max(0.0, now - accepted) if isinstance(accepted, int | float) else None
        item = {k: v for k, v in row.items() if k != "accepted_at"}
        item["age_seconds"] = None if age is None else round(age, 3)
        out.append(item)
    out.sort(key=lambda r: -(r["age_seconds"] or 0.0))
    return out


# ── what the files say ──────────────────────────────────────────────────────


def _count(directory: Path, *, ids_only: bool = True, shelves: bool = False) -> int | None:
    """Entries of a relay directory (None when it is missing or not a directory of ours).

    ``shelves``: the envelopes on the processes' shelves under it count too (``taken/s-<token>/``).
    """
    try:
        info = os.lstat(directory)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        return None
    if shelves:
        return count_on_shelves(directory)
    if ids_only:
        return len(list_ids(directory))
    try:
        return sum(1 for name in os.listdir(directory) if not name.startswith("."))
    except OSError:
        return None


def relay_dir_counts(root: Path) -> dict[str, Any]:
    """Counts of the root's relay directories (all None under a ``bot_relay/`` that is refused). Never raises."""
    inbox = InboxPaths.from_root(root)
    paths = inbox.relay
    if refusal_below(paths.root, paths.base) is not None:  # a swapped bot_relay/ leads elsewhere: nothing is counted
        return dict.fromkeys(_RELAY_COUNTS)
    return {
        "outbox": _count(paths.outbox),
        "claimed": _count(paths.claimed),
        "replies": _count(paths.replies),
        "inbox": _count(inbox.inbox),
        "taken": _count(inbox.taken, shelves=True),
        "quarantine": _count(paths.quarantine, ids_only=False),
        "unconfirmed": _count(paths.base / UNCONFIRMED_DIR),  # Redis sends acked, not yet answered (None: none kept)
    }


def relay_start_problems(root: Path) -> list[str]:
    """The status's problem line when a start would refuse the root's relay directories (doctor's block).

    The start's own rule (:func:`~hermes_actors.relay.strays.start_refusal`, with ``journal/``: ``serve`` runs
    durable), as ``doctor``'s "relay directories" check says it: ``bot_relay/`` itself a symlink, a file or
    another user's, another user's directory in it, a swapped ``hubclaims/`` or ``journal/``.

    Args:
        root: the Hermes root.

    Returns:
        One line naming the directory and what to do; none when a start may go on.
    """
    paths = InboxPaths.from_root(root)
    refusal = start_refusal(paths, needs=(paths.journal,))
    return [] if refusal is None else [f"relay directories: {refusal}"]


def roster_fields(roster: RemoteRoster, reachable: bool | None = None) -> dict[str, Any]:
    """Pure: what the status says of the remote roster, read where the root's transport keeps it.

    Args:
        roster: :func:`~hermes_actors.ops.remote_roster.read_remote_roster` of the root.
        reachable: whether the running gateway's Redis transport reaches Redis now (None: no gateway says).

    Returns:
        ``{"roster", "roster_age_seconds", "remote_agents", "reachable"}``: ``roster`` is what was read (the
        ``roster.json`` path or the masked Redis URL); ``reachable`` is None on the file relay, else False
        when either the reading or the gateway could not reach Redis.
    """
    age = roster.age_seconds
    up = (roster.error is None and reachable is not False) if roster.transport == "redis" else None
    return {"roster": roster.where, "roster_age_seconds": None if age is None else round(max(0.0, age), 3),
            "remote_agents": len(roster.agents), "reachable": up}


def transport_problems(root: Path, roster: RemoteRoster, reachable: bool | None = None) -> list[str]:
    """Pure: the status's problem line when the root's Redis transport does not answer (doctor's wording).

    Args:
        root: the Hermes root (named in the doctor command of the fix).
        roster: the reading of the remote roster.
        reachable: whether the running gateway's transport reaches Redis now (None: no gateway says).

    Returns:
        One line naming the URL, what it means and the fix; none when Redis answers (or on the file relay).
    """
    if roster.transport != "redis" or (roster.error is None and reachable is not False):
        return []
    check = check_redis(roster.where, roster.error or "the gateway's transport cannot reach it (it retries)")
    return [f"Redis transport: {check.detail} — DMs to and from other machines are refused (NOT queued) until it "
            f"answers, and their agents are shown offline; fix: {check.fix} (then: "
            f"{shell_command('hermes-actors', 'doctor', '--root', root)})"]


def heartbeats(root: Path, now: float) -> list[dict[str, Any]]:
    """The gateway processes whose heartbeat (``bot_relay/gateways/<pid>.json``) is fresh and alive."""
    return [{"pid": int(beat["pid"]), "connection_id": str(beat.get("connection_id") or "") or None,
             "age_seconds": round(max(0.0, now - float(beat["at"])), 3)}
            for beat in live_heartbeats(InboxPaths.from_root(root), now=now)]


def _profile_dicts(root: Path) -> list[dict[str, Any]]:
    return [{"profile": p.profile, "handle": p.handle, "title": p.title, "managed": p.managed}
            for p in discover_profiles(root)]


def _transport(raw: dict[str, Any]) -> str:
    from hermes_actors.transports.redis.store import redis_url_from_config

    try:
        return "file" if redis_url_from_config(raw) is None else "redis"
    except ValueError:
        return "invalid"


def _journaled_route(origin: str | None) -> str:
    """Pure: the route of a DM a journal holds without an outcome, by its origin: ``relay-in`` (relayed in),
    ``peer`` (handed to the ``bot_peers`` transport: it has no local profile), ``relay`` (sent over Redis),
    else ``local``."""
    if origin == RELAY_ORIGIN:
        return "relay-in"
    if origin == REDIS_ORIGIN:
        return "relay"
    return "peer" if origin == PEER_ORIGIN else "local"

def file_status(root: str | Path, *, now: float | None = None) -> dict[str, Any]:
    """The status of ``root`` read from its files (no gateway answers). Never raises for a readable root.

    In-flight deliveries are the journaled ones without an outcome; counters count
    the outcomes the journals still hold (``accepted`` and ``refused`` are None).

    Args:
        root: the Hermes root.
        now: the current time (default ``time.time()``).

    Returns:
        The status dict (see the module docstring), ``running`` False.

    Raises:
        FileNotFoundError: ``root`` is not a directory.
    """
    root = existing_root(root)
    now = time.time() if now is None else now
    config = load_config(root)
    folded, problems = read_journals(root)
    if folded.corrupt_lines:
        problems.append(f"{folded.corrupt_lines} corrupt journal line(s) skipped")
    pending: list[dict[str, Any]] = []
    by_outcome: dict[str, dict[str, int]] = {}
    for key, state in folded.states.items():
        origin = delivery_origin(state)  # a rewritten journal keeps it on the finished record
        if state.outcome is not None:
            # a wake turn's outcome is nobody's DM outcome, and a relayed-in DM's went back to its sender's
            # connection through the relay (journaled for a retry of its envelope): the live counters skip both too
            if origin in (WAKE_ORIGIN, RELAY_ORIGIN):
                continue
            status, reason = str(state.outcome.get("status", "")), str(state.outcome.get("reason") or "")
            by_outcome.setdefault(status, {}).setdefault(reason, 0)
            by_outcome[status][reason] += 1
        elif state.delivery is not None:
            d = state.delivery
            profile = str(d.get("target") or "")
            sender = shown_sender(str(d.get("sender") or ""), str(d.get("sender_handle") or ""))
            pending.append({"delivery_id": key, "sender": sender, "target": d.get("label") or profile,
                            "profile": profile,
                            "route": shown_route(_journaled_route(origin), str(origin)),
                            "accepted_at": d.get("accepted_at"),
                            "started": state.started > 0})
    per_profile, to_peers = in_flight_counts((row["profile"], row["route"]) for row in pending)
    profiles = _profile_dicts(root)
    settled = sum(sum(r.values()) for r in by_outcome.values())
    roster = read_remote_roster(root, config.raw, now=now)
    return {
        "source": "files",
        "root": str(root),
        "running": False,
        "gateway": None,
        "processes": heartbeats(root, now),
        "profiles": profile_rows(profiles, per_profile, set(), live=False),
        "in_flight": in_flight_rows(pending, now),
        "counters": {"accepted": None, "refused": None, "settled": settled,
                     "pending": sum(1 for row in pending if row["route"] != "wake"),
                     **outcome_counters(by_outcome)},
        "relay": {"transport": _transport(config.raw), **relay_dir_counts(root), **roster_fields(roster),
                  "peers": list(config.peers), "peers_in_flight": to_peers, "alive": None, "stats": None},
        "managed": install_is_managed(discover_profiles(root)),
        "problems": relay_start_problems(root) + problems + transport_problems(root, roster),
    }


# ── what a running gateway says ─────────────────────────────────────────────


def live_status(gateway: Gateway, *, now: float | None = None) -> dict[str, Any]:
    """The status of a running gateway: its counters, profiles, in-flight deliveries and relay.

    Args:
        gateway: a running gateway (in this process).
        now: the current time (default ``time.time()``).

    Returns:
        The status dict (see the module docstring), ``running`` True.

    Raises:
        RuntimeError: the gateway is not running.
    """
    now = time.time() if now is None else now
    runner = getattr(gateway, "runner", None)
    running_before = turns_in_hermes(runner)
    stats = gateway.stats()
    running_after = turns_in_hermes(runner)
    rows = gateway.roster()
    root = gateway.root
    deliveries = stats.get("deliveries") or {}
    flying = {str(row.get("delivery_id")) for row in deliveries.get("in_flight") or ()}
    busy = busy_in_hermes(running_before, running_after, flying)
    started_at = getattr(gateway, "started_at", None)
    config = gateway.config
    raw = config.raw if config is not None else {}
    problems: list[str] = []
    try:
        local = discover_profiles(root)
        managed: dict[str, bool | None] = {p.profile: p.managed for p in local}
        unknown: bool | None = False
        install_managed: bool | None = install_is_managed(local)
    except OSError as exc:  # out of file descriptors, say: the page and /metrics go on, the flags unknown
        short = resource_failure(exc)
        if short is None:
            raise
        managed, unknown, install_managed = {}, None, None
        problems.append(f"the profiles' files could not be read: {short}: {advised(exc)}")
    profiles = [{"profile": r["profile"], "handle": r["handle"], "title": r["title"],
                 "managed": managed.get(r["profile"], unknown)}
                for r in rows if r["connection_id"] is None]
    counters = {key: stats.get(key) for key in ("accepted", "refused", "settled", "pending")}
    counters.update(outcome_counters(deliveries.get("by_outcome") or {}))
    for key in ("notified", "notify_skipped", "subscriber_errors", "journal_fsyncs", "journal_records", "wakes_sent",
                "wakes_retried", "wakes_failed"):
        if key in stats:
            counters[key] = stats[key]
    # the roster where the gateway's transport keeps it, and whether its Redis link is up now
    roster = read_remote_roster(root, raw, connection_id=gateway.connection_id, now=now)
    relay_stats = stats.get("relay")
    reachable = relay_stats.get("reachable") if isinstance(relay_stats, dict) else None
    try:
        rooms = room_rows(gateway.list_rooms(), now)
    except RuntimeError as exc:  # the room directory is refused, or another process drives the rooms
        rooms = []
        problems.append(str(exc))
    status: dict[str, Any] = {
        "source": "gateway",
        "root": str(root),
        "running": True,
        "gateway": {
            "pid": os.getpid(),
            "connection_id": gateway.connection_id,
            "started_at": started_at,
            "uptime_seconds": None if started_at is None else round(max(0.0, now - started_at), 3),
            "transport": _transport(raw),
            "active_profiles": stats.get("active_profiles"),
            "worker_threads": stats.get("worker_threads"),
        },
        "processes": heartbeats(root, now),
        "profiles": profile_rows(profiles, deliveries.get("per_profile") or {},
                                 set(deliveries.get("live_owners") or ()), live=True, busy=busy),
        "in_flight": in_flight_rows(list(deliveries.get("in_flight") or ()), now),
        "counters": counters,
        "relay": {"transport": _transport(raw), **relay_dir_counts(root), **roster_fields(roster, reachable),
                  "peers": list(config.peers) if config is not None else [],
                  "peers_in_flight": deliveries.get("peers_in_flight"),
                  "alive": stats.get("relay_alive"), "stats": stats.get("relay")},
        "managed": install_managed,
        "problems": problems + transport_problems(root, roster, reachable),
    }
    if rooms:
        status["rooms"] = rooms
    return status
