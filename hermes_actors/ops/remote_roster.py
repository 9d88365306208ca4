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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hermes_actors.core.config import parse_redis_config
from hermes_actors.core.ids import id_of_file_name
from hermes_actors.core.names import HANDLE_RE
from hermes_actors.errors import ValidationError
from hermes_actors.messages import RemoteAgent
from hermes_actors.store.atomic import read_json_file
from hermes_actors.store.relay_files import read_roster
from hermes_actors.store.relay_heartbeat import live_heartbeats
from hermes_actors.store.relay_inbox import InboxPaths

__all__ = ["REDIS_READ_TIMEOUT", "RemoteRoster", "read_remote_roster"]

REDIS_READ_TIMEOUT = 3.0  # seconds for one Redis command of the reading (a down Redis refuses at once)
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
    timeout: float = REDIS_READ_TIMEOUT,
) -> RemoteRoster:
    """Read the remote roster from the transport ``raw`` (the root's config) selects. Never raises.

    Args:
        root: the Hermes root.
        raw: the root's config (``load_config(root, overrides).raw``, or a running gateway's ``config.raw``).
        connection_id: this root's connection id on Redis (default: ``bot_mode.connection_id``).
        now: the current time (default ``time.time()``).
        timeout: seconds for each Redis command.

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
    return _redis_roster(url, mask_url(url), raw, me, now, timeout)


def _file_roster(root: Path, now: float) -> RemoteRoster:
    """The file relay's roster, the running gateways' connection ids and the names the hub routed here as.

    The names come from each running gateway's heartbeat (the ``target_connection`` of what its relay was
    handed lately: a running gateway empties ``inbox/`` at once) and from the envelopes still waiting in
    ``inbox/``. Only live gateways count: a killed one's heartbeat file stays until housekeeping removes it.
    (``taken/`` holds only the running gateways' shelves, whose envelopes their heartbeats name already.)
    """
    inbox = InboxPaths.from_root(root)
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


def _redis_roster(url: str, masked: str, raw: dict[str, Any], me: str | None, now: float,
                  timeout: float) -> RemoteRoster:
    """Every connection's roster on Redis, as the transport reads it; ``me``'s own is not a remote one."""
    from hermes_actors.transports.redis.io import make_client
    from hermes_actors.transports.redis.link import as_text
    from hermes_actors.transports.redis.store import RedisKeys, read_remote_answers

    keys = RedisKeys(parse_redis_config(raw)[0].redis_prefix)
    try:
        client = make_client(url, socket_timeout=timeout)
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
