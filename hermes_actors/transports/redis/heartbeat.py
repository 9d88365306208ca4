"""The liveness heartbeat of one gateway process on Redis, on its own thread.

The heartbeat says "this process is alive"; it used to be written by the
transport actor's periodic tick, so a burst of traffic in the actor's mailbox
delayed it past its expiry and peers refused DMs as "offline … NOT queued"
(issue 11, item 9). Here it never waits behind traffic: a small thread with its
own client refreshes ``<p>:alive:<connection>`` and ``<p>:consumer:<consumer>``
every ``redis_heartbeat_seconds``, for as long as the actor lives. The roster
rows (slow-changing, long expiry) stay with the actor.

The alive key is also the connection's lease (:mod:`~hermes_actors.transports.redis.lease`):
a beat refreshes it only while it is ours (or free), and a clean stop deletes it only if it is ours,
so a second process on our connection id can never delete or steal it. A holder on this host whose
process is gone is taken over by a beat as by the start (:func:`~hermes_actors.transports.redis.lease.take_lease`):
a gateway started while Redis was down meets its killed predecessor's lease only then. A beat also asks
that the holder's lease ran below half its expiry (it stopped refreshing it): a live gateway in another pid
namespace on this host name looks dead from here, and is then told as a second process (ERROR), never taken
over at each beat.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from loguru import logger

from hermes_actors.store.processes import pid_alive
from hermes_actors.transports.redis.io import (
    ANSWER_TIMEOUT_SECONDS,
    CONNECT_TIMEOUT_SECONDS,
    join_until,
    make_client,
)
from hermes_actors.transports.redis.lease import (
    REFRESH_LUA,
    RELEASE_LUA,
    is_stale_here,
    overdue_below_ms,
    take_lease,
)
from hermes_actors.transports.redis.link import as_text
from hermes_actors.transports.redis.store import (
    RedisKeys,
    RedisSettings,
    host_label,
    is_redis_unreachable,
    is_wrong_type,
)

__all__ = ["Heartbeat"]


class Heartbeat:
    """Refreshes this process's liveness keys from a dedicated thread.

    Args:
        settings: URL, heartbeat period and expiry.
        keys: key names.
        connection: our connection id.
        consumer: our consumer name (the value of the connection's alive key).
        owner_alive: False once the transport actor is gone (the thread then stops
            beating, so a dead actor never looks online).
        clock: monotonic seconds (tests pass their own), to time how long the lease has been another's.

    Counters (read by tests and stats): ``beats`` written, ``failures``; ``lease_lost`` is True
    while another consumer holds our connection's lease (we are then not online under it);
    ``lease_ours`` is True once a beat found the lease ours, until one finds it another's (only then is the
    connection's inbox read or reclaimed: a start that made no beat, Redis being unreachable, has checked
    nothing); ``alive_key_foreign`` while our alive key holds another kind of value than a heartbeat.
    """

    def __init__(self, settings: RedisSettings, keys: RedisKeys, connection: str, consumer: str, *,
                 owner_alive: Callable[[], bool] = lambda: True, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.connection = connection
        self.alive_key = keys.alive(connection)
        self.consumer_key = keys.consumer_alive(consumer)
        self.consumer = consumer
        self.owner_alive = owner_alive
        self.beats = 0
        self.failures = 0
        self.lease_lost = False
        self.lease_ours = False  # no beat has found the lease ours yet
        self.clock = clock
        self._lost_since = 0.0  # when (clock) the lease was last lost
        self._told: str | None = None  # what this loss was logged as ("warning", "error"), once each
        self.alive_key_foreign = False  # our alive key holds another kind of value (logged once while it does)
        self._lock = threading.Lock()  # a beat never lands after stop() deleted the keys
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self._refresh: Any = None
        self._unreachable: BaseException | None = None  # why the last beat found Redis unreachable (None: it did not)
        self.start_error: BaseException | None = None  # why the first beat, on the starting thread, found it so

    def start(self, *, beat_now: bool = True) -> Heartbeat:
        """Beat now (on this thread: the caller starts online), then every period on the heartbeat thread.

        Only a beat that finds the lease ours sets :attr:`lease_ours`, which lets the inbox be read.

        Args:
            beat_now: beat on this thread first (False: Redis was found unreachable a moment ago, so the start
                does not wait for it again; the thread beats at once instead, and until a beat finds the lease
                ours, :attr:`lease_ours` is False). A first beat that finds Redis unreachable leaves why in
                :attr:`start_error`.

        Returns:
            This heartbeat.
        """
        self._client = make_client(self.settings.url)
        self._refresh = self._client.register_script(REFRESH_LUA)
        if beat_now:
            self.beat()
            self.start_error = self._unreachable  # read before the thread starts: its own beats change it
        first_in = self.settings.heartbeat_seconds if beat_now else 0.0
        self._thread = threading.Thread(target=self._run, args=(first_in,), name=f"redis-heartbeat-{self.consumer}",
                                        daemon=True)
        self._thread.start()
        return self

    def beat(self) -> bool:
        """Write both keys with the heartbeat expiry; True when Redis took them."""
        expiry_ms = max(1, round(self.settings.heartbeat_ttl_seconds * 1000))
        with self._lock:
            if self._stopped.is_set() or not self.owner_alive():
                return False
            try:
                ours, holder = take_lease(self._refresh, [self.alive_key, self.consumer_key], self.connection,
                                          self.consumer, expiry_ms, overdue_below=overdue_below_ms(expiry_ms))
            except Exception as exc:  # the actor's tick logs outages; here only count them
                self.failures += 1
                self._unreachable = exc if is_redis_unreachable(exc) else None
                if is_wrong_type(exc):
                    self._foreign_alive_key(expiry_ms)
                elif not is_redis_unreachable(exc):
                    logger.error("redis: heartbeat failed: {}", exc)
                return False
            self._unreachable = None
            if not ours:
                self.failures += 1
                if not self.lease_lost:
                    self._lost_since = self.clock()
                self.lease_ours, self.lease_lost = False, True  # set before it is told: readers check it
                self._tell_lost(holder, self.clock() - self._lost_since)
                return False
            self.lease_ours = True  # the inbox may be read and reclaimed from now on
            if self.lease_lost:  # the holder's lease lapsed (or it stopped): the ERROR above is over
                self.lease_lost, self._told = False, None
                logger.info("redis: {} is this gateway's lease again: it is online under it and reads its inbox "
                            "again", self.alive_key)
            if self.alive_key_foreign:
                self.alive_key_foreign = False
                logger.info("redis: {} is this gateway's heartbeat again: peers see it online", self.alive_key)
            self.beats += 1
            return True

    def _tell_lost(self, holder: str, lost_for: float) -> None:
        """Say why we are not online under our connection id, once per loss (and once more if it turns out worse).

        A holder whose pid does not run on this host and that refreshed its lease lately is either a process
        killed a moment ago (a beat takes its lease over once half of it ran out: within the expiry) or a live
        gateway in another pid namespace sharing this host name: a WARNING first, and the ERROR of a second
        process once it held the lease for a whole expiry since, which a dead one's lease never does.

        Args:
            holder: who holds the lease.
            lost_for: seconds since the lease was lost.
        """
        if self._told == "error":
            return
        looks_dead = is_stale_here(holder, host_label(), pid_alive)
        if looks_dead and lost_for < self.settings.heartbeat_ttl_seconds:
            if self._told is None:
                self._told = "warning"
                logger.warning("redis: {} is held by {}, whose pid does not run on this host but which refreshed "
                               "the lease lately: a process killed a moment ago (its lease is taken over once half "
                               "of it ran out, within {:g}s) or a live gateway in another pid namespace sharing "
                               "this host name; this one reads none of its inbox meanwhile", self.alive_key,
                               holder, self.settings.heartbeat_ttl_seconds)
            return
        self._told = "error"
        why = ("; its pid does not run on this host, yet it keeps refreshing the lease: a gateway in another pid "
               "namespace, such as a container sharing this host name" if looks_dead else "")
        logger.error("redis: {} is held by another process, {} (a second gateway on our connection id{}); this one "
                     "is not online under it and reads none of its inbox — stop one of them", self.alive_key, holder,
                     why)

    def _foreign_alive_key(self, expiry_ms: int) -> None:
        """Our alive key holds another kind of value (something else wrote it): say so once, with the fix.

        Peers show a connection whose alive key is not a string offline. This process still runs (it reads
        its inbox, no second process holds the lease), so its consumer key is refreshed alone: the turns it
        claimed must not look like a dead process's.
        """
        try:
            self._client.set(self.consumer_key, "1", px=expiry_ms)
            kind = as_text(self._client.type(self.alive_key))
        except Exception as exc:
            logger.debug("redis: could not refresh {}: {}", self.consumer_key, exc)
            kind = "value of another kind"
        if not self.alive_key_foreign:
            self.alive_key_foreign = True
            logger.error("redis: {} holds a {}, not this gateway's heartbeat (something else wrote it): peers see "
                         "this connection offline and refuse its DMs; delete the key (redis-cli DEL {}) and the "
                         "next beat writes it again", self.alive_key, kind, self.alive_key)

    def _run(self, first_in: float) -> None:
        period = self.settings.heartbeat_seconds
        next_beat = time.monotonic() + first_in
        while not self._stopped.wait(max(0.0, next_beat - time.monotonic())):
            if not self.owner_alive():
                return
            self.beat()
            next_beat = max(next_beat + period, time.monotonic())  # no burst of catch-up beats after a stall

    def signal_stop(self) -> None:
        """Stop beating: no beat begins after this; one under way ends on its own. Returns at once.

        Not under the beat's lock: a beat waiting on a Redis that does not answer holds it, and the stop
        must tell the other threads meanwhile (:func:`~hermes_actors.transports.redis.io.stop_threads`).
        """
        self._stopped.set()

    def finish(self, deadline: float, *, delete: bool = True) -> bool:
        """Wait for the thread to end, then (``delete``) remove both keys so peers see us offline at once.

        All within ``deadline``: a beat under way ends first (the keys are never removed before a beat that
        would write them again), then the removal waits for its answer no longer than what is left. A Redis that
        answers in time has the keys removed; one that does not (down, a black hole) leaves them to expire
        (``heartbeat_ttl_seconds``).

        Args:
            deadline: a ``time.monotonic()`` time.
            delete: remove the keys (a clean stop), or leave them to expire.

        Returns:
            Whether the thread has ended.
        """
        thread, self._thread = self._thread, None
        ended = join_until(thread, deadline)
        client, self._client = self._client, None
        if client is None:
            return ended
        try:
            if delete:
                self._release(deadline)
        finally:
            client.close()
        return ended

    def _release(self, deadline: float) -> None:
        """Remove both keys by ``deadline``, the alive key only if it is still ours (never another process's lease).

        Args:
            deadline: a ``time.monotonic()`` time; the removal waits for Redis no longer.
        """
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):  # held by a beat under way
            logger.debug("redis: a beat was still waiting for Redis at the stop; the heartbeat expires on its own")
            return
        try:
            left = min(ANSWER_TIMEOUT_SECONDS, deadline - time.monotonic())
            if left <= 0:
                logger.debug("redis: no time was left at the stop to remove the heartbeat; it expires on its own")
                return
            client = make_client(self.settings.url, socket_timeout=left,
                                 connect_timeout=min(CONNECT_TIMEOUT_SECONDS, left))
            try:
                client.register_script(RELEASE_LUA)(keys=[self.alive_key, self.consumer_key], args=[self.consumer])
            except Exception as exc:
                logger.debug("redis: could not remove the heartbeat at stop: {}", exc)
            finally:
                client.close()
        finally:
            self._lock.release()

    def stop(self, *, delete: bool = True, wait: float = ANSWER_TIMEOUT_SECONDS) -> bool:
        """Stop the heartbeat alone (the transport stops it with the reader: its ``stop_threads``).

        Args:
            delete: remove the keys (a clean stop), or leave them to expire.
            wait: seconds for the beat under way and the removal together.

        Returns:
            Whether the thread has ended.
        """
        self.signal_stop()
        return self.finish(time.monotonic() + wait, delete=delete)
