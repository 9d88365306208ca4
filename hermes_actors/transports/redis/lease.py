"""One process per connection id: the lease on ``<p>:alive:<connection>``.

The alive key says "connection X is online" and its value names the consumer
(``<host>-<pid>-<random>``) of the process that serves X. Two processes on one
connection id would share its inbox and reply streams: replies then sit pending
on the wrong consumer, and the first one to exit deletes the other's alive key
(issue 14). So the key is a lease:

- :func:`claim_connection` (at :meth:`Gateway.start`, before any actor runs)
  takes it with ``SET NX``, or refuses with :class:`TransportError` naming the
  live holder. A holder on this host whose pid is gone (killed -9) is taken over
  at once; elsewhere a dead holder's lease lapses after the heartbeat expiry.
- the heartbeat thread refreshes it only while the value is still ours or free
  (:data:`REFRESH_LUA`), taking over a dead holder of this host by the same rule
  (a start while Redis was down could not), and a clean stop deletes it only if
  it is ours (:data:`RELEASE_LUA`). A beat takes over only a holder that is also
  provably not refreshing: its lease ran below half its expiry
  (:func:`overdue_below_ms`). A pid that does not run here does not prove a holder
  dead: a live gateway in another pid namespace (a container sharing this host's
  name) looks dead from here, and without that guard the two took the lease from
  each other at every beat, each reading the inbox in turn, without an ERROR.

The decisions are pure functions (:func:`parse_consumer`, :func:`is_stale_here`,
:func:`overdue_below_ms`); :func:`take_lease` applies them to a lease script's answer
(the start's and the heartbeat's, one rule), :func:`claim_connection` does the start's I/O.
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import urlsplit

from loguru import logger

from hermes_actors.errors import TransportError
from hermes_actors.store.processes import pid_alive
from hermes_actors.transports.redis.io import StartProbe, make_client
from hermes_actors.transports.redis.link import as_text
from hermes_actors.transports.redis.store import (
    RedisKeys,
    RedisSettings,
    certificate_fix,
    host_label,
    is_redis_unreachable,
)

__all__ = [
    "ACQUIRE_LUA",
    "REFRESH_LUA",
    "RELEASE_LUA",
    "auth_error_text",
    "claim_connection",
    "is_auth_error",
    "is_stale_here",
    "overdue_below_ms",
    "parse_consumer",
    "refused_start_text",
    "take_lease",
]

#: The lease scripts' one rule (Lua): the lease may be ours when it is free, ours already, or held by the stale
#: holder named in ARGV[3] whose lease has run below ARGV[4] ms (a holder refreshing it never has; '' for no bound).
_MAY_TAKE = """(v == false or v == ARGV[1] or (ARGV[3] ~= '' and v == ARGV[3]
  and (ARGV[4] == '' or redis.call('PTTL', KEYS[1]) < tonumber(ARGV[4]))))"""

#: KEYS: alive key; ARGV: our consumer, expiry ms, a stale holder we may replace ('' for none), the remaining ms its
#: lease must have run below ('' for any). Returns {1, ours} when the lease is ours now, {0, holder} when another
#: holds it.
ACQUIRE_LUA = f"""
local v = redis.call('GET', KEYS[1])
if {_MAY_TAKE} then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {{1, ARGV[1]}}
end
return {{0, v}}
"""

#: KEYS: alive key, consumer key; ARGV: as :data:`ACQUIRE_LUA`'s. Refreshes both keys while the lease is ours
#: (or free, or held by the stale holder named and run down below the bound); returns as :data:`ACQUIRE_LUA` does.
REFRESH_LUA = f"""
local v = redis.call('GET', KEYS[1])
if not {_MAY_TAKE} then return {{0, v}} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return {{1, ARGV[1]}}
"""

#: KEYS: alive key, consumer key; ARGV: our consumer. Deletes the alive key only when it is ours.
RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
redis.call('DEL', KEYS[2])
return 1
"""


def parse_consumer(name: str) -> tuple[str, int] | None:
    """Pure: ``(host, pid)`` of a consumer name ``<host>-<pid>-<random>`` (None when it is not one).

    The host may itself contain ``-``, so the name is read from the right.
    """
    head, sep, tail = name.rpartition("-")
    if not sep or not tail:
        return None
    host, sep, pid = head.rpartition("-")
    if not sep or not host or not pid.isdigit():
        return None
    return host, int(pid)


def is_stale_here(holder: str, host: str, pid_alive: Any) -> bool:
    """Pure: whether ``holder`` is a process of this ``host`` that no longer runs.

    Args:
        holder: the consumer name stored in the lease.
        host: this host's name, as :func:`~hermes_actors.transports.redis.store.consumer_name` writes it.
        pid_alive: ``pid_alive(pid) -> bool``.
    """
    parsed = parse_consumer(holder)
    return parsed is not None and parsed[0] == host and not pid_alive(parsed[1])


def overdue_below_ms(expiry_ms: int) -> int:
    """Pure: the remaining time under which a lease of ``expiry_ms`` was provably not refreshed lately.

    A live holder refreshes its lease every beat, a third of the expiry at most
    (:attr:`~hermes_actors.transports.redis.store.RedisSettings.heartbeat_ttl_seconds`), so its lease never runs
    below two thirds of it; one that ran below half missed at least one and a half beats. Gateways on one
    connection id with other heartbeat settings never take the lease from each other by turns either: a live
    holder is taken over only if its expiry is under three quarters of ours, and then it cannot take ours back.

    Args:
        expiry_ms: the lease's expiry (our heartbeat expiry, in ms).

    Returns:
        The bound, in ms (at least 1).
    """
    return max(1, expiry_ms // 2)


def is_auth_error(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing our credentials (``WRONGPASS``, ``NOAUTH``), not an outage."""
    try:
        from redis.exceptions import AuthenticationError, AuthenticationWrongNumberOfArgsError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, AuthenticationError | AuthenticationWrongNumberOfArgsError)


def is_certificate_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a TLS certificate that did not verify: a setting to fix,
    which no retry cures (redis-py raises it as a ``ConnectionError``, like an outage)."""
    seen: BaseException | None = exc
    for _ in range(8):  # the chain redis-py builds is short; never loop on a cyclic one
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def certificate_error_text(settings: RedisSettings, exc: BaseException) -> str:
    """The start error for a server certificate that did not verify, with what to fix in the URL."""
    return (f"Redis at {settings.address}: its TLS certificate did not verify ({exc}). "
            f"Fix: {certificate_fix(settings.masked_url)}; nothing was started.")


def auth_error_text(settings: RedisSettings, exc: BaseException) -> str:
    """The start error for refused credentials (the URL's password is never shown).

    Without a password in the URL the cause is said plainly: redis-py's own words for it are about its
    ``HELLO`` handshake, not about the password.
    """
    parts = urlsplit(settings.url)
    has_password = parts.password is not None or "password=" in parts.query
    why = exc if has_password else "it requires a password and the URL names none"
    return (f"Redis at {settings.address} refused our credentials ({why}). Fix the user/password in the Redis URL "
            f"({settings.masked_url}, e.g. redis://:PASSWORD@host:port/0) and start again; nothing was started.")


def refused_start_text(settings: RedisSettings, exc: BaseException) -> str:
    """The start error for any other command error of the lease's first command, with the fix when it is known.

    A database index the server does not have (``SELECT``: "DB index is out of range") is the URL's to fix.
    """
    fix = ""
    if "DB index is out of range" in str(exc):
        fix = (f" This server has no such database: fix the database index in the Redis URL ({settings.masked_url}: "
               "the /N at its end, or ?db=N); a server has databases 0 to 15 unless its 'databases' setting says "
               "more.")
    return f"Redis at {settings.address} refused the start ({exc}).{fix} Nothing was started."


def take_lease(script: Any, keys: list[str], connection: str, consumer: str, expiry_ms: int, *,
               overdue_below: int | None = None) -> tuple[bool, str]:
    """Run a lease script for ``consumer``; a holder on this host whose process is gone is taken over.

    The one rule of both the start (:func:`claim_connection`) and the heartbeat: a gateway that started
    while Redis was down finds its killed predecessor's lease only at a beat, and must take it then too.
    The heartbeat also asks that the holder be provably not refreshing (``overdue_below``): a pid that does
    not run here may be a live gateway's in another pid namespace.

    Args:
        script: a registered :data:`ACQUIRE_LUA` or :data:`REFRESH_LUA` (same arguments, same answer).
        keys: the script's keys (the alive key first).
        connection: our connection id (for the log line).
        consumer: our consumer name.
        expiry_ms: the lease's expiry.
        overdue_below: take over a dead-looking holder only once its lease has run below this many ms
            (:func:`overdue_below_ms`; checked in the script, so a refresh in between keeps it); None: at once.

    Returns:
        ``(True, consumer)`` when the lease is ours now, else ``(False, holder)``: a live process holds it
        (or one of another host, whose pid says nothing here, or one whose pid does not run here but whose
        lease has not run down to ``overdue_below``).

    Raises:
        Exception: what the script's Redis call raised (the caller tells an outage from a refusal).
    """
    ok, holder = script(keys=keys, args=[consumer, expiry_ms, "", ""])
    holder_text = str(as_text(holder))
    if not ok and is_stale_here(holder_text, host_label(), pid_alive):
        bound = "" if overdue_below is None else overdue_below
        # only if it still holds it (and, with a bound, has not refreshed it since)
        ok, holder = script(keys=keys, args=[consumer, expiry_ms, holder_text, bound])
        if ok:
            logger.info("redis: connection {} was held by {}, whose process is gone; taking it over",
                        connection, holder_text)
        holder_text = str(as_text(holder))
    return bool(ok), holder_text


def claim_connection(settings: RedisSettings, connection: str, consumer: str, *, client: Any = None,
                     probe: StartProbe | None = None) -> bool:
    """Take the lease of ``connection`` for ``consumer`` before the transport starts.

    Args:
        settings: URL and heartbeat expiry.
        connection: this gateway's connection id.
        consumer: this process's consumer name.
        client: a redis-py client to use (default: a new one, closed here).
        probe: the start's :class:`~hermes_actors.transports.redis.io.StartProbe`, told when Redis is
            unreachable (the transport's start then asks it nothing more).

    Returns:
        True when the lease is ours; False when Redis is unreachable now (the start goes
        on: DMs to other machines are refused as unreachable until it is back, and the
        heartbeat takes the lease then, if it is free or its holder is a dead process of
        this host, by :func:`take_lease` as here).

    Raises:
        TransportError: Redis refused our credentials, or another live process serves
            ``connection`` (the message names it and says what to do).
    """
    own = client is None
    client = make_client(settings.url) if own else client
    keys = RedisKeys(settings.prefix)
    expiry_ms = max(1, round(settings.heartbeat_ttl_seconds * 1000))
    try:
        ok, holder_text = take_lease(client.register_script(ACQUIRE_LUA), [keys.alive(connection)], connection,
                                     consumer, expiry_ms)
    except Exception as exc:
        if is_auth_error(exc):
            raise TransportError(auth_error_text(settings, exc)) from exc
        if is_certificate_error(exc):
            raise TransportError(certificate_error_text(settings, exc)) from exc
        if is_redis_unreachable(exc):
            logger.warning("redis: {} is unreachable at start ({}); will retry", settings.address, exc)
            if probe is not None:
                probe.unreachable(exc)
            return False
        raise TransportError(refused_start_text(settings, exc)) from exc
    finally:
        if own:
            client.close()
    if not ok:
        raise TransportError(
            f"connection id {connection!r} is already served by another live process ({holder_text}) on Redis at "
            f"{settings.address}. Stop that process or give this gateway its own connection id (--connection-id, "
            f"bot_mode.connection_id); if that process is gone, its lease lapses within "
            f"{settings.heartbeat_ttl_seconds:g}s. Nothing was started.")
    return True
