"""Where a root's remote roster is, and what it says: the one reading ``status``, ``doctor`` and ``roster`` share.

The transport the root is configured with (``bot_mode.transport``) decides where it is:

- the file relay: ``bot_relay/roster.json`` (the relay hub writes it), the running gateways'
  heartbeats (``bot_relay/gateways/<pid>.json``, each naming its connection id and the names the
  hub routed to it) and the envelopes still waiting in ``inbox/``;
- Redis: the ``<p>:roster:<connection>`` hashes and ``<p>:alive:<connection>`` keys, read as the
  transport reads them (:func:`~hermes_actors.transports.redis.store.read_remote_answers`); this
  root's gateway announces its connection id by holding ``<p>:alive:<connection>``.

Reading a file never raises; reading Redis never raises either: an unreachable Redis (or one that
refuses our credentials) is said in :attr:`RemoteRoster.error`, to be judged by
:func:`~hermes_actors.ops.doctor_checks.check_redis` (one wording for doctor and status).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hermes_actors.core.config import parse_redis_config
from hermes_actors.core.ids import id_of_file_name
from hermes_actors.core.names import HANDLE_RE
from hermes_actors.errors import ValidationError
from hermes_actors.local.roster import make_snapshot, roster_rows
from hermes_actors.messages import ProfileInfo, RemoteAgent
from hermes_actors.store.atomic import read_json_file
from hermes_actors.store.relay_dirfd import refusal_below
from hermes_actors.store.relay_files import read_roster
from hermes_actors.store.relay_heartbeat import live_heartbeats
from hermes_actors.store.relay_inbox import InboxPaths

__all__ = ["RemoteRoster", "read_remote_roster", "roster_rows_read"]

_MAX_ROUTED_NAMES = 16  # names read from one heartbeat (a gateway writes at most 8)
_MAX_INBOX_READ = 50  # envelopes of inbox/ read for their target_connection


@dataclass(frozen=True)
class RemoteRoster:
    """The remote roster of a root, as its configured transport holds it.

    Attributes:
        transport: ``file``, ``redis``, or ``invalid`` (``bot_mode.transport`` names neither).
        where: what was read: the path of ``roster.json``, or the Redis URL with its password masked.
        agents: the other connections' agents (this root's own connection left out on Redis).
        age_seconds: how old the roster is (None: there is none, or Redis could not be read).
        own: the connection ids this root's running gateways announce.
        remote: the connection ids the roster lists (the other roots).
        routed_as: the names the relay hub routed to this root as (file relay only).
        error: why Redis could not be read (None: it was, or the file relay).
    """

    transport: str
    where: str
    agents: tuple[RemoteAgent, ...] = ()
    age_seconds: float | None = None
    own: frozenset[str] = frozenset()
    remote: frozenset[str] = frozenset()
    routed_as: frozenset[str] = field(default_factory=frozenset)
    error: str | None = None


def read_remote_roster(
    root: Path, raw: dict[str, Any], *, connection_id: str | None = None, now: float | None = None,
) -> RemoteRoster:
    """Read the remote roster from the transport ``raw`` (the root's config) selects. Never raises.

    On Redis each command waits for its answer as the transport's do
    (:data:`~hermes_actors.transports.redis.io.ANSWER_TIMEOUT_SECONDS`, 1 s to connect): a Redis that is down
    refuses at once, one that accepts connections and never answers costs one wait (the first command fails
    and ends the reading).

    Args:
        root: the Hermes root.
        raw: the root's config (``load_config(root, overrides).raw``, or a running gateway's ``config.raw``).
        connection_id: this root's connection id on Redis (default: ``bot_mode.connection_id``).
        now: the current time (default ``time.time()``).

    Returns:
        The reading.
    """
    from hermes_actors.transports.redis.store import mask_url, redis_url_from_config

    now = time.time() if now is None else now
    try:
        url = redis_url_from_config(raw)
    except ValueError as exc:
        return RemoteRoster("invalid", str(exc))
    if url is None:
        return _file_roster(root, now)
    me = connection_id or parse_redis_config(raw)[0].connection_id or None
    return _redis_roster(url, mask_url(url), raw, me, now)


def roster_rows_read(profiles: Iterable[ProfileInfo], reading: RemoteRoster, *, now: float) -> list[dict[str, Any]]:
    """Pure: the ``Gateway.roster()`` rows of a root no gateway serves, from its profiles and its remote roster.

    The rows a gateway started on the root would list, without starting one (which would take the root's
    journaled DMs and, on Redis, its connection's lease and inbox): the local profiles, online, then the
    remote agents with the liveness a gateway gives them (:func:`~hermes_actors.local.roster.roster_rows`).

    Args:
        profiles: the root's profiles (``discover_profiles(root)``).
        reading: its remote roster (:func:`read_remote_roster`).
        now: the current time (``time.time()``).

    Returns:
        The rows, local profiles first.
    """
    mtime = None if reading.age_seconds is None else now - reading.age_seconds
    snapshot = make_snapshot(profiles, remote=reading.agents, remote_mtime=mtime)
    if reading.transport == "redis" and reading.error is not None:  # its agents are refused, NOT queued: offline
        snapshot = replace(snapshot, remote_unreachable=reading.where)
    return roster_rows(snapshot, now=now)


def _file_roster(root: Path, now: float) -> RemoteRoster:
    """The file relay's roster, the running gateways' connection ids and the names the hub routed here as.

    The names come from each running gateway's heartbeat (the ``target_connection`` of what its relay was
    handed lately: a running gateway empties ``inbox/`` at once) and from the envelopes still waiting in
    ``inbox/``. Only live gateways count: a killed one's heartbeat file stays until housekeeping removes it.
    (``taken/`` holds only the running gateways' shelves, whose envelopes their heartbeats name already.)
    Nothing is read under a ``bot_relay/`` that is a symlink, a file or another uid's: no roster.
    """
    inbox = InboxPaths.from_root(root)
    if refusal_below(inbox.relay.root, inbox.relay.base) is not None:  # a swapped bot_relay/ holds another root's
        return RemoteRoster("file", str(inbox.relay.roster))
    own: set[str] = set()
    routed: set[str] = set()
    for beat in live_heartbeats(inbox, now=now):
        if beat.get("connection_id"):
            own.add(str(beat["connection_id"]))
        names = beat.get("routed_as")
        if isinstance(names, list):
            routed.update(n for n in names[:_MAX_ROUTED_NAMES] if isinstance(n, str) and HANDLE_RE.match(n))
    agents, age = read_roster(inbox.relay, now=now)
    try:
        names = sorted(os.listdir(inbox.inbox))[:_MAX_INBOX_READ]
    except OSError:
        names = []
    for name in names:
        if id_of_file_name(name) is None:
            continue
        try:
            record = read_json_file(inbox.inbox / name)
        except (OSError, ValidationError):
            continue
        if isinstance(record, dict) and isinstance(record.get("target_connection"), str):
            routed.add(record["target_connection"])
    return RemoteRoster("file", str(inbox.relay.roster), tuple(agents),
                        None if age is None else max(0.0, age), frozenset(own),
                        frozenset(a.connection_id for a in agents), frozenset(routed))


def _redis_roster(url: str, masked: str, raw: dict[str, Any], me: str | None, now: float) -> RemoteRoster:
    """Every connection's roster on Redis, as the transport reads it; ``me``'s own is not a remote one."""
    from hermes_actors.transports.redis.io import make_client
    from hermes_actors.transports.redis.link import as_text
    from hermes_actors.transports.redis.store import RedisKeys, read_remote_answers

    keys = RedisKeys(parse_redis_config(raw)[0].redis_prefix)
    try:
        client = make_client(url)
    except Exception as exc:  # the [redis] extra missing, a URL redis-py refuses: doctor names the fix
        return RemoteRoster("redis", masked, error=f"{type(exc).__name__}: {exc}")
    try:
        client.ping()  # first: an unreachable Redis is named as such, not by the SCAN that would fail next
        found = (keys.roster_connection(as_text(key) or "") for key in client.scan_iter(match=keys.roster_pattern,
                                                                                          count=1000))
        connections = sorted({conn for conn in found if conn is not None and conn != me})
        pipe = client.pipeline(transaction=False)
        for conn in connections:
            pipe.hgetall(keys.roster(conn))
            pipe.type(keys.alive(conn))
            pipe.pttl(keys.roster(conn))
        answers = pipe.execute(raise_on_error=False) if connections else []
        # our lease: held (a string naming the consumer) while a gateway of this connection id runs
        own = frozenset({me}) if me and as_text(client.type(keys.alive(me))) == "string" else frozenset()
    except Exception as exc:  # redis-py's errors and the OSErrors under them: what doctor's check judges
        return RemoteRoster("redis", masked, error=f"{type(exc).__name__}: {exc}")
    finally:
        client.close()
    rosters, _problems = read_remote_answers(keys, connections, answers, now)  # a running gateway logs those
    agents = tuple(sorted((row for known in rosters.values() for row in known.rows),
                          key=lambda r: (r.connection_id, r.profile)))
    return RemoteRoster("redis", masked, agents, 0.0, own, frozenset(rosters))
