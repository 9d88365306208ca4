"""The Redis Streams transport, pure half: settings, key names, records, decisions.

Nothing here talks to Redis or reads the clock; the actor in
:mod:`hermes_actors.transports.redis.actor` does the I/O. Records are the file
relay's envelope and reply records (``store.relay_protocol``), serialized
with orjson into one stream field each.

Keys (``<p>`` is ``bot_mode.redis_prefix``, default ``hermes:bot``):

- ``<p>:in:<connection>``      stream of envelopes addressed to a connection
- ``<p>:replies:<connection>`` stream of replies to a connection's envelopes
- ``<p>:sent:<connection>``    hash envelope id → meta of our envelopes awaiting a reply
- ``<p>:claim:<id>``           who took an envelope's turn (a consumer name) or ``expired``
- ``<p>:done:<id>``            the reply of an envelope was written (dedupe)
- ``<p>:roster:<connection>``  hash profile → roster row
- ``<p>:alive:<connection>``   heartbeat key with expiry
- ``<p>:consumer:<consumer>``  one gateway process's heartbeat (is a claim holder alive?)
"""

from __future__ import annotations

import os
import random
import socket
import string
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import orjson

from hermes_actors.core.clipping import shown
from hermes_actors.core.config import parse_redis_config
from hermes_actors.errors import ValidationError
from hermes_actors.messages import ProfileInfo, RemoteAgent
from hermes_actors.store.relay_protocol import HANDLE_RE, UNCONFIRMED, parse_envelope, parse_reply
from hermes_actors.store.relay_roster import normalize_roster_row, roster_row_dict

__all__ = [
    "EXPIRED_CLAIM",
    "GROUP",
    "HEARTBEAT_TTL_MIN_SECONDS",
    "UNCONFIRMED_DIR",
    "KnownRoster",
    "RedisKeys",
    "RedisSettings",
    "consumer_name",
    "decode_envelope_entry",
    "decode_reply_entry",
    "encode_envelope_entry",
    "encode_reply_entry",
    "host_label",
    "is_wrong_type",
    "local_roster_rows",
    "mask_url",
    "parse_remote_rows",
    "read_remote_answers",
    "redis_settings",
    "redis_url_from_config",
    "redis_url_problem",
    "remembered_rosters",
    "roster_expiry",
    "server_address",
]

GROUP = "hermes"  # the consumer group name, on every stream (groups are per stream)
EXPIRED_CLAIM = "expired"  # the claim value the sender sets when it expired its own envelope
UNCONFIRMED_DIR = UNCONFIRMED  # under bot_relay/: the sends Redis did not answer, until it does (outbound)
DONE_KEEP_SECONDS = 24 * 3600  # dedupe memory (at least 2 × the envelope TTL)
ROSTER_KEEP_SECONDS = 24 * 3600  # a connection gone for good drops out of the roster after this
# A heartbeat never expires sooner: a loaded 2-core machine can stall a process for seconds.
HEARTBEAT_TTL_MIN_SECONDS = 5.0
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")  # as redis-py takes them (the "://" included)
_MAX_DB_INDEX = 2**31 - 1  # SELECT reads its index as a C int


def redis_url_from_config(raw: dict[str, Any], env: dict[str, str] | None = None) -> str | None:
    """The Redis URL selected by ``bot_mode.transport`` (None: the file relay).

    ``transport`` is ``redis://…`` / ``rediss://…`` / ``unix://…``, or ``redis`` to
    take the URL from ``REDIS_URL``; anything else (missing, ``file``) keeps the
    file relay.

    Raises:
        ValueError: ``transport: redis`` but ``REDIS_URL`` is unset, an unknown scheme, or a URL
            :func:`redis_url_problem` refuses (named: ``bot_mode.transport`` or ``REDIS_URL``).
    """
    env = dict(os.environ) if env is None else env
    section = raw.get("bot_mode") if isinstance(raw, dict) else None
    transport = section.get("transport") if isinstance(section, dict) else None
    if transport is None or (isinstance(transport, str) and transport.strip().lower() in ("", "file", "relay")):
        return None
    text, named = str(transport).strip(), "bot_mode.transport"
    if text.lower() == "redis":
        url = env.get("REDIS_URL", "").strip()
        if not url:
            raise ValueError("bot_mode.transport is 'redis' but REDIS_URL is not set")
        text, named = url, "REDIS_URL (bot_mode.transport: redis)"
    if not text.lower().startswith(REDIS_SCHEMES):
        raise ValueError(f"{named} {mask_url(text)!r} is neither 'file' nor a redis:// or rediss:// URL")
    problem = redis_url_problem(text)
    if problem is not None:
        raise ValueError(f"{named} {mask_url(text)!r} {problem}")
    return text


def redis_url_problem(url: str) -> str | None:
    """Pure: why a Redis URL cannot be used (None: it can), checked before anything connects.

    The one rule for ``bot_mode.transport``, ``REDIS_URL`` and ``--redis``: a ``redis://``, ``rediss://`` or
    ``unix://`` URL (the ``://`` included, as redis-py wants it), a host name without spaces, a port from 1 to
    65535, and a database index (``/N``, or ``?db=N``) that is a whole number; a ``unix://`` URL names its
    socket. redis-py would refuse some of these only at the first connection, in words that name no option
    ("Port out of range 0-65535"), and would silently use database 0 for ``/abc``.

    Args:
        url: the URL as configured (credentials included; they are never part of the answer).

    Returns:
        A phrase to follow the masked URL in a message (``is not …`` / ``has …``), or None.
    """
    if not url.lower().startswith(REDIS_SCHEMES):
        return "is not a redis://, rediss:// or unix:// URL"
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        return f"is not a valid URL ({exc}; an IPv6 host goes in brackets: redis://[::1]:6379/0)"
    try:
        port = parts.port
    except ValueError:
        port_text = parts.netloc.rpartition("@")[2].rpartition(":")[2]  # after the credentials: never logged
        return (f"has port {shown(port_text)}: a port is a whole number from 1 to 65535 "
                "(e.g. redis://127.0.0.1:6379/0)")
    query = dict(item.partition("=")[::2] for item in parts.query.split("&") if item)
    if parts.scheme.lower() == "unix":
        if not parts.path:
            return "names no socket (unix:///path/to/redis.sock)"
    else:
        host = parts.hostname or ""
        if any(c.isspace() or not c.isprintable() for c in host):
            return f"has host {host!r}: a host name has no spaces (e.g. redis://127.0.0.1:6379/0)"
        if port == 0:
            return "has port 0: a port is a whole number from 1 to 65535 (e.g. redis://127.0.0.1:6379/0)"
        index = parts.path.replace("/", "")
        if index and "db" not in query and not _is_db_index(index):
            return (f"has database index {shown(index)}: the /N at its end is a database number (e.g. "
                    "redis://127.0.0.1:6379/0)")
    if "db" in query and not _is_db_index(query["db"]):
        return f"has database index {shown(query['db'])} (db=): a database is a whole number (e.g. db=0)"
    return None


def _is_db_index(text: str) -> bool:
    """Pure: ``text`` is a database index Redis can select: ASCII digits ('²' is a digit ``int()`` refuses), at
    most :data:`_MAX_DB_INDEX` (SELECT reads a C int; 100,000 digits would pass ``isdigit`` and fail the
    client's ``int()`` at the first connection, past Python's limit on digits)."""
    digits = text.lstrip("0")
    return text.isascii() and text.isdigit() and len(digits) <= len(str(_MAX_DB_INDEX)) \
        and int(digits or "0") <= _MAX_DB_INDEX


def mask_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (safe to log), even one that does not parse.

    An unparseable URL (an unclosed IPv6 bracket: ``redis://u:pw@[::1``) is shown in the message that
    refuses it: whatever precedes its last ``@`` is masked whole, since where its password ends is unknown.
    """
    head, sep, query = url.partition("?")
    try:
        parts = urlsplit(url)
    except ValueError:  # the URL being refused: it is masked all the same, never an error of its own
        scheme, colon_slashes, rest = head.partition("://")
        if "@" in rest:
            head = f"{scheme}{colon_slashes}***@{rest.rpartition('@')[2]}"
    else:
        if parts.password is not None:
            masked = f"{parts.username or ''}:***@{parts.netloc.rpartition('@')[2]}"
            head = head.replace(parts.netloc, masked, 1)
    if "password=" in query:
        query = "&".join("password=***" if item.startswith("password=") else item for item in query.split("&"))
    return head + sep + query


def certificate_fix(masked_url: str) -> str:
    """Pure: what to change in a Redis URL whose server's TLS certificate did not verify (the start's error and
    doctor's fix both say it).

    Args:
        masked_url: the URL as :func:`mask_url` shows it.
    """
    if "ssl_ca_certs=" in masked_url:
        return ("the CA the URL names (ssl_ca_certs) did not sign it, or the certificate is not for this host name: "
                "name the right CA, or connect by the name the certificate carries")
    joint = "&" if "?" in masked_url else "?"
    return f"name the CA that signed it in the URL ({masked_url}{joint}ssl_ca_certs=/path/to/ca.pem)"


def server_address(url: str) -> str:
    """``host:port`` of a Redis URL (for messages; never the credentials)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    return f"{parts.hostname or 'localhost'}:{parts.port or 6379}"


@dataclass(frozen=True)
class RedisSettings:
    """The ``bot_mode.redis_*`` settings (declared, with defaults and bounds, in ``core.config.RedisConfig``)."""

    url: str
    claim_idle_seconds: float
    max_stream_len: int
    heartbeat_seconds: float
    prefix: str
    block_ms: int
    connection_label: str

    @property
    def address(self) -> str:
        return server_address(self.url)

    @property
    def masked_url(self) -> str:
        return mask_url(self.url)

    @property
    def heartbeat_ttl_seconds(self) -> float:
        """How long one heartbeat keeps us online: three periods, never under ``HEARTBEAT_TTL_MIN_SECONDS``.

        A scheduling stall of a loaded machine (a second or so) is not an outage.
        """
        return max(3 * self.heartbeat_seconds, HEARTBEAT_TTL_MIN_SECONDS)

    @property
    def tick_seconds(self) -> float:
        """How often the actor runs its periodic work (heartbeat, touch, reclaim, retries)."""
        return max(0.05, min(self.heartbeat_seconds, self.claim_idle_seconds / 3.0, 1.0))


def redis_settings(raw: dict[str, Any], url: str) -> RedisSettings:
    """Pure: the typed settings from the raw config (bad values fall back to the defaults).

    ``load_config`` has already warned about bad values; this reads them again silently.
    """
    config, _problems = parse_redis_config(raw)
    return RedisSettings(
        url=url,
        claim_idle_seconds=config.redis_claim_idle_seconds,
        max_stream_len=config.redis_max_stream_len,
        heartbeat_seconds=config.redis_heartbeat_seconds,
        prefix=config.redis_prefix,
        block_ms=config.redis_block_ms,
        connection_label=config.connection_label,
    )


@dataclass(frozen=True)
class RedisKeys:
    """Key names under one prefix."""

    prefix: str = "hermes:bot"

    def inbox(self, connection: str) -> str:
        return f"{self.prefix}:in:{connection}"

    def replies(self, connection: str) -> str:
        return f"{self.prefix}:replies:{connection}"

    def sent(self, connection: str) -> str:
        return f"{self.prefix}:sent:{connection}"

    def claim(self, envelope_id: str) -> str:
        return f"{self.prefix}:claim:{envelope_id}"

    def done(self, envelope_id: str) -> str:
        return f"{self.prefix}:done:{envelope_id}"

    def roster(self, connection: str) -> str:
        return f"{self.prefix}:roster:{connection}"

    def alive(self, connection: str) -> str:
        return f"{self.prefix}:alive:{connection}"

    def consumer_alive(self, consumer: str) -> str:
        return f"{self.prefix}:consumer:{consumer}"

    @property
    def roster_pattern(self) -> str:
        return f"{self.prefix}:roster:*"

    def roster_connection(self, key: str) -> str | None:
        """The connection of a roster key (None when it is not one or the name is invalid)."""
        head = f"{self.prefix}:roster:"
        if not key.startswith(head):
            return None
        conn = key[len(head):]
        return conn if HANDLE_RE.match(conn) else None


def host_label() -> str:
    """This host's name as consumer names carry it (``[A-Za-z0-9_.-]``, at most 64 chars)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname())[:64] or "host"


def consumer_name(pid: int | None = None) -> str:
    """``<hostname>-<pid>-<random>``: unique per gateway process (and per start)."""
    tail = "".join(random.choices(string.ascii_lowercase + string.digits, k=8))
    return f"{host_label()}-{os.getpid() if pid is None else pid}-{tail}"


# ── records ─────────────────────────────────────────────────────────────────


def _text(fields: dict[Any, Any], key: str) -> bytes:
    value = fields.get(key.encode(), fields.get(key))
    if isinstance(value, str):
        return value.encode()
    if not isinstance(value, bytes):
        raise ValidationError(f"stream entry has no {key!r} field")
    return value


def encode_envelope_entry(envelope: dict[str, Any], reply_to: str) -> dict[str, bytes]:
    """The stream fields of an envelope: the orjson envelope and the sender's connection."""
    return {"envelope": orjson.dumps(envelope), "reply_to": reply_to.encode()}


def decode_envelope_entry(fields: dict[Any, Any]) -> tuple[dict[str, Any], str]:
    """(envelope, reply connection) of an inbox entry.

    The envelope is checked by :func:`parse_envelope`, its ``hop`` included (anyone who can write the
    stream can hand-write an envelope, and the hop feeds the loop guard).

    Raises:
        ValidationError: a missing field, bad JSON, a bad envelope, hop or reply connection.
    """
    try:
        data = orjson.loads(_text(fields, "envelope"))
    except orjson.JSONDecodeError as exc:
        raise ValidationError(f"envelope is not JSON: {exc}") from exc
    envelope = parse_envelope(data)
    reply_to = _text(fields, "reply_to").decode("utf-8", "replace")
    if not HANDLE_RE.match(reply_to):
        raise ValidationError(f"invalid reply connection: {reply_to!r}")
    return envelope, reply_to


def encode_reply_entry(record: dict[str, Any]) -> dict[str, bytes]:
    """The stream fields of a reply record."""
    return {"reply": orjson.dumps(record)}


def decode_reply_entry(fields: dict[Any, Any]) -> dict[str, Any]:
    """The reply record of a replies entry.

    Raises:
        ValidationError: a missing field, bad JSON or a bad record.
    """
    try:
        data = orjson.loads(_text(fields, "reply"))
    except orjson.JSONDecodeError as exc:
        raise ValidationError(f"reply is not JSON: {exc}") from exc
    return parse_reply(data)


def sent_meta(envelope: dict[str, Any], label: str, wake: bool | None = None) -> bytes:
    """What ``<p>:sent:<me>`` keeps of an envelope awaiting its reply (for a restart)."""
    keys = ("created_at", "from_profile", "from_handle", "target_handle", "target_connection")
    # The hop too: a restart wakes the sending profile with the outcome (its loop guard needs the hop), if the
    # gateway that acked the DM decided it wakes (``wake``; absent: the gateway that settles it decides).
    meta = {"label": label, "hop": envelope.get("hop", 0), **{k: envelope[k] for k in keys}}
    if wake is not None:
        meta["wake"] = wake
    return orjson.dumps(meta)


def parse_sent_meta(value: bytes) -> dict[str, Any] | None:
    """The meta back (None when unreadable)."""
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("label"), str):
        return None
    created = data.get("created_at")
    if not isinstance(created, int | float) or isinstance(created, bool):
        return None
    return data


# ── roster ──────────────────────────────────────────────────────────────────


def local_roster_rows(profiles: tuple[ProfileInfo, ...], connection: str, label: str = "") -> dict[str, bytes]:
    """Our roster hash: profile → orjson row (the seed's roster row format, no online flag)."""
    out: dict[str, bytes] = {}
    for p in profiles:
        agent = normalize_roster_row({
            "profile": p.profile, "handle": p.handle, "connection_id": connection,
            "connection_label": label, "title": p.title, "description": p.description,
        })
        if agent is not None:
            out[agent.profile] = orjson.dumps(roster_row_dict(agent))
    return out


def parse_remote_rows(connection: str, hash_value: dict[Any, Any], online: bool) -> list[RemoteAgent]:
    """The rows of one connection's roster hash (untrusted), with ``online`` from its heartbeat.

    A row claiming another connection than its key is dropped: a gateway
    publishes only for itself.
    """
    rows: list[RemoteAgent] = []
    for value in hash_value.values():
        try:
            data = orjson.loads(value)
        except (orjson.JSONDecodeError, TypeError):
            continue
        if not isinstance(data, dict):
            continue
        agent = normalize_roster_row({**data, "online": online})
        if agent is not None and agent.connection_id == connection:
            rows.append(agent)
    return rows


@dataclass(frozen=True)
class KnownRoster:
    """One connection's roster as the remote roster shows it.

    Attributes:
        rows: its rows (offline once ``remembered``).
        expires_at: wall-clock time its roster key expires (or would have: a remembered roster is dropped then,
            as the key would have been had Redis kept it).
        remembered: Redis lost the key (restarted empty, flushed) and its gateway has not published it again:
            the rows are the last ones read.
    """

    rows: tuple[RemoteAgent, ...]
    expires_at: float
    remembered: bool = False


def roster_expiry(now: float, pttl_ms: Any) -> float:
    """Pure: when a roster key expires, from its ``PTTL`` answer.

    Args:
        now: wall-clock time of the read.
        pttl_ms: milliseconds left; -1 (no expiry) or anything unreadable counts as ``ROSTER_KEEP_SECONDS``.
    """
    if isinstance(pttl_ms, int) and not isinstance(pttl_ms, bool) and pttl_ms >= 0:
        return now + pttl_ms / 1000
    return now + ROSTER_KEEP_SECONDS


def read_remote_answers(
    keys: RedisKeys, connections: list[str], answers: list[Any], now: float
) -> tuple[dict[str, KnownRoster], dict[str, str]]:
    """Pure: the remote roster from one pipeline's answers, skipping the keys of the wrong type.

    Args:
        keys: key names.
        connections: the connections read, in pipeline order.
        answers: per connection, the answers of ``HGETALL roster:<c>``, ``TYPE alive:<c>`` and
            ``PTTL roster:<c>``, as ``execute(raise_on_error=False)`` gives them (a command's error in its place).
        now: wall-clock time of the read.

    Returns:
        ``(rosters by connection, problems)``: a connection whose roster key is not a hash, or is gone
        since the scan found it, is left out (one foreign key under the prefix must not hide every other
        connection's roster); an alive key that is not a string is no gateway's heartbeat, so its connection
        is offline. ``problems`` maps each key of the wrong type to what is wrong and what to do (the caller
        logs it once while it lasts).
    """
    rosters: dict[str, KnownRoster] = {}
    problems: dict[str, str] = {}
    for i, conn in enumerate(connections):
        roster, kind, pttl = answers[3 * i:3 * i + 3]
        kind = kind.decode("utf-8", "replace") if isinstance(kind, bytes) else str(kind)
        if isinstance(roster, Exception) or not isinstance(roster, dict):
            key = keys.roster(conn)
            problems[key] = (f"{key} is not a roster hash ({roster}): connection {conn!r} is left off the remote "
                             f"roster until it is; delete the key (redis-cli DEL {key}), a running gateway of "
                             f"{conn!r} publishes its roster again")
            continue
        if kind not in ("string", "none"):
            key = keys.alive(conn)
            problems[key] = (f"{key} holds a {kind}, not a gateway's heartbeat: connection {conn!r} is shown "
                             f"offline until it is; delete the key (redis-cli DEL {key}), a running gateway of "
                             f"{conn!r} writes its heartbeat again at its next beat")
        if roster:  # Redis keeps no empty hash: {} is a key gone since the scan
            rows = tuple(parse_remote_rows(conn, roster, kind == "string"))
            rosters[conn] = KnownRoster(rows, roster_expiry(now, pttl))
    return rosters, problems


def remembered_rosters(
    known: dict[str, KnownRoster], present: AbstractSet[str], *, lost: bool, now: float
) -> dict[str, KnownRoster]:
    """Pure: the rosters kept on show, offline, though Redis has none for their connection now.

    Rosters that vanish together with our own were lost by Redis (restarted empty, flushed, failed over),
    not retired by their gateways: their agents still exist, so a DM to one is refused as offline ("… is
    offline right now — the message was NOT queued"), not as "No teammate named …", until their gateway
    publishes them again (within one heartbeat of its next roster tick) or their key would have expired
    (``ROSTER_KEEP_SECONDS`` after their gateway last kept it). As the file relay's ``roster.json`` keeps
    a machine that went away: its last rows stay listed, offline.

    Args:
        known: each connection's roster as the last read showed it (remembered ones included).
        present: the connections whose roster Redis has now.
        lost: our own roster key vanished since the last read (Redis lost its data).
        now: wall-clock time.

    Returns:
        The rosters to keep showing, marked remembered, their rows offline. One that vanished alone (its
        gateway deleted it, it expired) is not kept.
    """
    return {
        conn: KnownRoster(tuple(replace(row, online=False) for row in last.rows), last.expires_at, remembered=True)
        for conn, last in known.items()
        if conn not in present and last.expires_at > now and (lost or last.remembered)
    }


def is_redis_unreachable(exc: BaseException) -> bool:
    """Whether an exception from redis-py means "Redis is not reachable" (vs a command error)."""
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError
    except ImportError:  # pragma: no cover
        return isinstance(exc, OSError)
    return isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError)


def is_wrong_type(exc: BaseException) -> bool:
    """Whether a Redis command failed because a key holds the wrong kind of value (``WRONGTYPE``)."""
    return not is_redis_unreachable(exc) and "WRONGTYPE" in str(exc)
