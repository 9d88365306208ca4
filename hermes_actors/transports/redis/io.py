"""The Redis Streams transport, threads half: clients, the reader thread, the turn claim.

- :func:`require_redis`: the ``[redis]`` extra is installed, or a one-line error.
- :func:`make_client`: a redis-py client that fails fast (1 s to connect, 3 s for an answer, one
  reconnect retry, none after a timeout).
- :class:`StreamReader`: the dedicated thread that runs the blocking
  ``XREADGROUP`` on our inbox and replies streams and tells the actor each
  batch; it reconnects with bounded exponential backoff (max 5 s).
- :class:`StartProbe`: what the start's lease claim found, handed to the transport's start, so a Redis that
  does not answer costs the start one answer timeout, not one per call.
- :func:`stop_threads`: the stop of the transport's threads (the reader, the heartbeat): each is told first,
  then all are waited for against one deadline (:func:`stop_wait_seconds`), so a Redis that does not answer
  costs the stop one wait, not one per thread.
- :class:`ClaimGuard`: wraps the turn runner; before a relayed-in envelope's
  turn runs it claims ``<p>:claim:<id>`` with ``SET NX``, so a reclaimed entry
  never runs a second turn (and a turn the sender already expired never runs).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import pykka
from loguru import logger

from hermes_actors.errors import TransportError, TurnFailed
from hermes_actors.local.runners import TurnRunner
from hermes_actors.messages import RedisEntries, Turn
from hermes_actors.store.relay_protocol import expired_error_text
from hermes_actors.transports.redis.store import (
    DONE_KEEP_SECONDS,
    EXPIRED_CLAIM,
    GROUP,
    RedisKeys,
    RedisSettings,
    consumer_name,
    is_redis_unreachable,
)

__all__ = [
    "ANSWER_TIMEOUT_SECONDS",
    "BACKOFF_MAX_SECONDS",
    "CONNECT_TIMEOUT_SECONDS",
    "STOP_WAIT_MAX_SECONDS",
    "ClaimGuard",
    "InboxRoom",
    "RedisThread",
    "StartProbe",
    "StreamReader",
    "ensure_groups",
    "hand_back_text",
    "join_until",
    "make_client",
    "require_redis",
    "stop_threads",
    "stop_wait_seconds",
    "wrong_type_text",
]

BACKOFF_MAX_SECONDS = 5.0
READ_COUNT = 100
#: How long a connection may take (one not made in a second is an outage).
CONNECT_TIMEOUT_SECONDS = 1.0
#: How long a command waits for its answer, once: a Redis that accepts connections and never answers (a hung
#: server, a dead route behind a proxy) held the transport actor 6 s per command (3 s, retried after the
#: timeout), its ticks piled up, and stats, /metrics, /status and the host's status hung 30 s and failed. Not
#: shorter: a Redis syncing its AOF on a busy disk may take a second to answer a write, and a send that timed
#: out here is acked unconfirmed (Redis may still apply it) and checked once Redis answers again.
ANSWER_TIMEOUT_SECONDS = 3.0
#: The most a stop waits for the transport's threads, all together: a reader blocked on a healthy Redis with a
#: long BLOCK is not waited for past it (what it reads then stays pending in the group for the next process).
STOP_WAIT_MAX_SECONDS = 5.0


def require_redis() -> None:
    """Check that redis-py is installed.

    Raises:
        TransportError: it is not (the ``[redis]`` extra was not installed); the text says how to install it.
    """
    try:
        import redis  # noqa: F401
    except ImportError as exc:
        raise TransportError("the Redis transport needs the redis package, which is not installed: "
                             "pip install 'hermes-actors[redis]'") from exc


def make_client(url: str, *, socket_timeout: float = ANSWER_TIMEOUT_SECONDS,
                connect_timeout: float = CONNECT_TIMEOUT_SECONDS) -> Any:
    """A client that fails fast when Redis is down or does not answer.

    Args:
        url: the Redis URL (its own ``socket_timeout=`` query option, if any, wins).
        socket_timeout: how long a command waits for its answer (:data:`ANSWER_TIMEOUT_SECONDS`: the
            blocking reader passes its BLOCK time more).
        connect_timeout: how long a connection may take (:data:`CONNECT_TIMEOUT_SECONDS`).

    Returns:
        A redis-py client that retries a command once on a new connection when its connection was found
        dropped (a Redis restarted), never after a timeout: that only doubled each wait on a Redis that
        does not answer.
    """
    import redis
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.retry import Retry

    return redis.Redis.from_url(
        url, socket_connect_timeout=connect_timeout, socket_timeout=socket_timeout,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
    )


class StartProbe:
    """What the start's first Redis call, the lease claim (on the gateway's start thread), found: handed to the
    transport actor's start, whose own calls (the check of the replies kept in start marks, the first beat, the
    first probe) then go on only while its link is not down.

    Against a Redis that accepts connections and never answers each of those calls waited its own answer
    timeout, one after the other: the start took 9 s. Now the first call that finds Redis unreachable (after its
    one wait) decides for the whole start: the later calls are not made, and the transport starts down (its tick
    probes Redis, its heartbeat thread beats, as after any outage). Not a wall-clock deadline: the start's work
    between the claim and the transport (the journal's recovery, the actors' starts) would eat it, and a Redis
    that answered the claim would be taken for unreachable.
    """

    def __init__(self) -> None:
        self.error: BaseException | None = None  # why Redis was found unreachable (None: it was not)

    def unreachable(self, exc: BaseException) -> None:
        """The call found Redis unreachable (``exc``); the first one found is kept."""
        if self.error is None:
            self.error = exc


def ensure_groups(client: Any, streams: list[str]) -> list[str]:
    """Create our consumer group on each stream (from the start, so nothing queued before is missed).

    A key that holds another type than a stream (a string, a hash: set by hand or by another
    program) is left alone and named in the answer, so the caller can go on with the other stream.

    Args:
        client: a redis-py client.
        streams: the stream keys.

    Returns:
        The streams whose key holds a value of another type (Redis answered ``WRONGTYPE``).

    Raises:
        redis.exceptions.RedisError: any other failure (Redis unreachable, a denied command).
    """
    from redis.exceptions import ResponseError

    wrong: list[str] = []
    for stream in streams:
        try:
            client.xgroup_create(stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "WRONGTYPE" in str(exc):
                wrong.append(stream)
            elif "BUSYGROUP" not in str(exc):
                raise
    return wrong


def wrong_type_text(key: str, *, inbox: bool) -> str:
    """Pure: the ERROR logged once when one of our streams' keys holds another type than a stream.

    Args:
        key: the key.
        inbox: it is our inbox (else our replies stream).

    Returns:
        What is not read, what still is, and what to do.
    """
    lost = ("none of the DMs sent to this connection are read (senders are refused until it is fixed); the "
            "replies to its own DMs still are" if inbox else
            "none of the replies to this gateway's DMs are read (past reply_wait_seconds they end "
            "delivery_timeout); the DMs sent to it still run")
    return (f"redis: {key} holds a value that is not a stream, so {lost}. Delete it (redis-cli DEL {key}): "
            "hermes-actors keeps only a stream there; it is read again once it is a stream or gone")


class InboxRoom:
    """How many inbox entries the reader may take now, so that no more than the bound are ever held.

    The bound (``max_queued``) less the envelopes in flight and the entries read but not
    yet handled by the actor (the flights count them only once the actor has): checked
    before each read only, the flights let a read take a hundred entries past the bound,
    which the target's full queue then failed ``target_busy`` (acked DMs the docs say wait
    in Redis). Zero while ``closed`` (our connection's lease is another process's).

    Shared by the reader thread (:meth:`free`, :meth:`taken`) and the actor (:meth:`handled`).

    Args:
        limit: the bound.
        in_flight: how many envelopes the actor holds (read on the reader's thread).
        closed: True while no inbox entry may be read at all.
        stopping: True once it is closed because the gateway stops (not because the lease was lost).
    """

    def __init__(self, limit: int, in_flight: Callable[[], int], *, closed: Callable[[], bool] = lambda: False,
                 stopping: Callable[[], bool] = lambda: False) -> None:
        self.limit = limit
        self.in_flight = in_flight
        self.closed = closed
        self.stopping = stopping
        self._unhandled = 0
        self._lock = threading.Lock()

    def free(self) -> int:
        """Entries that may be read now (0: read the replies stream only)."""
        if self.closed():
            return 0
        with self._lock:
            return max(0, self.limit - self.in_flight() - self._unhandled)

    def taken(self, count: int) -> None:
        """The reader read ``count`` inbox entries and tells them to the actor."""
        with self._lock:
            self._unhandled += count

    def handled(self, count: int) -> None:
        """The actor handled ``count`` entries the reader read (the flights count what they became)."""
        with self._lock:
            self._unhandled = max(0, self._unhandled - count)


def hand_back_text(count: int, *, stopping: bool) -> str:
    """Pure: the log line of inbox entries a read took as the inbox closed, handed back to the stream.

    Args:
        count: how many.
        stopping: the inbox closed for a stop of this gateway (an INFO); else our connection id's lease was
            lost to another process (a WARNING).

    Returns:
        The line.
    """
    if stopping:
        return (f"redis: {count} inbox entr(ies) a read took as this gateway stopped were handed back to the stream "
                "for the connection's next start")
    return (f"redis: {count} inbox entr(ies) read as our connection id's lease was lost were handed back to the "
            "stream for the process that holds it")


def _batches(response: Any) -> list[tuple[str, list[tuple[str, dict[Any, Any]]]]]:
    """XREADGROUP's answer (RESP2 list or RESP3 dict) as (stream, [(id, fields)])."""
    items = response.items() if isinstance(response, dict) else (response or [])
    out = []
    for stream, entries in items:
        name = stream.decode() if isinstance(stream, bytes) else str(stream)
        rows = []
        for entry_id, fields in entries or []:
            if fields is None:
                continue
            rows.append((entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id), dict(fields)))
        out.append((name, rows))
    return out


def stop_wait_seconds(block_ms: int) -> float:
    """Pure: how long a stop waits for the transport's threads, all together.

    The longest call one of them may be in when the stop comes: the reader's blocking read (its BLOCK time
    and then :data:`ANSWER_TIMEOUT_SECONDS`); the heartbeat's beat and its key removal wait one answer timeout
    each, and the removal gets what is left of the same wait. At most :data:`STOP_WAIT_MAX_SECONDS`.

    Args:
        block_ms: the reader's BLOCK time (``bot_mode.redis_block_ms``).

    Returns:
        Seconds.
    """
    return min(STOP_WAIT_MAX_SECONDS, block_ms / 1000 + ANSWER_TIMEOUT_SECONDS)


def join_until(thread: threading.Thread | None, deadline: float, *,
               clock: Callable[[], float] = time.monotonic) -> bool:
    """Wait for ``thread`` to end, until ``deadline`` at most.

    Args:
        thread: the thread (None, or the calling thread itself: nothing to wait for).
        deadline: a ``clock`` time.
        clock: monotonic seconds.

    Returns:
        Whether the thread has ended (True for None and for the calling thread).
    """
    if thread is None or thread is threading.current_thread():
        return True
    thread.join(timeout=max(0.0, deadline - clock()))
    return not thread.is_alive()


class RedisThread(Protocol):
    """A thread of the transport as its stop sees it (:class:`StreamReader`, the heartbeat)."""

    def signal_stop(self) -> None:
        """Tell the thread to end after the call under way; returns at once."""

    def finish(self, deadline: float) -> bool:
        """Wait for the thread to end (and do what is left to do) until ``deadline``; whether it ended."""


def stop_threads(threads: Sequence[RedisThread], wait: float, *, clock: Callable[[], float] = time.monotonic) -> bool:
    """Stop the transport's threads at the cost of the slowest, not of the sum.

    Each is told first, so all end their Redis calls together; then each is waited for against one deadline
    (``wait`` from now), in the order given: the first gets the most of it.

    Args:
        threads: the threads.
        wait: seconds for all of them together (:func:`stop_wait_seconds`).
        clock: monotonic seconds.

    Returns:
        Whether every thread ended in time (one still in a Redis call is left to end on its own).
    """
    for thread in threads:
        thread.signal_stop()
    deadline = clock() + wait
    ended = [thread.finish(deadline) for thread in threads]  # each is finished, even after one that did not end
    return all(ended)


class StreamReader:
    """The blocking reader of one connection's inbox and replies streams.

    Args:
        settings: URL, block time.
        keys: key names.
        connection: our connection id.
        consumer: our consumer name.
        target: the actor told :class:`RedisEntries`.
        room: how many inbox entries a read may take (none: no bound); with no room the
            inbox is not read, replies still are.
    """

    def __init__(
        self,
        settings: RedisSettings,
        keys: RedisKeys,
        connection: str,
        consumer: str,
        target: pykka.ActorRef[Any],
        *,
        room: InboxRoom | None = None,
    ) -> None:
        self.settings = settings
        self.inbox = keys.inbox(connection)
        self.replies = keys.replies(connection)
        self.consumer = consumer
        self.target = target
        self.room = room
        self.reconnects = 0
        self.wrong_type: set[str] = set()  # our stream keys that hold another type: not read until fixed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> StreamReader:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"redis-reader-{self.consumer}", daemon=True)
        self._thread.start()
        return self

    def signal_stop(self) -> None:
        """Tell the thread to end once the read under way returns; returns at once."""
        self._stop.set()

    def finish(self, deadline: float) -> bool:
        """Wait for the thread to end, until ``deadline`` (monotonic) at most.

        A read under way returns within its BLOCK time on a Redis that answers, else after one answer timeout
        more. A thread still reading at the deadline ends on its own: what its read returns then cannot be told
        to the stopped actor, and stays pending in the group (unacked) for the connection's next process.

        Args:
            deadline: a ``time.monotonic()`` time.

        Returns:
            Whether the thread has ended.
        """
        thread, self._thread = self._thread, None
        ended = join_until(thread, deadline)
        if not ended:
            logger.debug("redis: the reader is still in a Redis call at the stop; it ends on its own")
        return ended

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the thread alone (the transport stops it with the heartbeat: :func:`stop_threads`).

        Args:
            timeout: seconds to wait for it (default :func:`stop_wait_seconds` of its BLOCK time).

        Returns:
            Whether the thread has ended.
        """
        wait = stop_wait_seconds(self.settings.block_ms) if timeout is None else timeout
        return stop_threads([self], wait)

    def _run(self) -> None:
        from redis.exceptions import RedisError, ResponseError

        client: Any = None
        backoff = 0.1
        down_since: str | None = None
        check_all = False
        while not self._stop.is_set():
            try:
                if client is None:
                    # a blocking read's answer comes after BLOCK: it may wait that long more than any command
                    client = make_client(self.settings.url,
                                         socket_timeout=self.settings.block_ms / 1000 + ANSWER_TIMEOUT_SECONDS)
                    self._wrong_types(ensure_groups(client, [self.inbox, self.replies]))
                    if down_since is not None:
                        self.reconnects += 1
                        logger.info("redis: reader reconnected to {}", self.settings.address)
                        down_since = None
                elif self.wrong_type or check_all:  # which is bad now? (a key deleted gets its stream back)
                    self._wrong_types(ensure_groups(client, [self.inbox, self.replies] if check_all
                                                    else sorted(self.wrong_type)))
                    check_all = False
                free = READ_COUNT if self.room is None else min(READ_COUNT, self.room.free())
                # One XREADGROUP fails whole when one of its keys holds another type: read only the usable ones.
                streams = {s: ">" for s in (self.inbox, self.replies) if s not in self.wrong_type
                           and (s != self.inbox or free > 0)}
                if not streams:  # nothing to read now: look again after one BLOCK period
                    self._stop.wait(self.settings.block_ms / 1000)
                    continue
                count = free if self.inbox in streams else READ_COUNT
                response = client.xreadgroup(GROUP, self.consumer, streams, count=count, block=self.settings.block_ms)
                backoff = 0.1
                replies = self._tell(response, client)
                if count < READ_COUNT and replies == count:
                    # COUNT is per stream: the inbox's room held the replies back, and more may wait; take them at
                    # full rate (only then: a steady loop is one round trip)
                    self._tell(client.xreadgroup(GROUP, self.consumer, {self.replies: ">"}, count=READ_COUNT))
            except pykka.ActorDeadError:
                break
            except ResponseError as exc:
                if "NOGROUP" in str(exc) or "UNBLOCKED" in str(exc):  # the stream was deleted (also while we
                    # blocked on it), or Redis restarted without its data: a new client makes stream and group again
                    client = self._drop(client)
                    continue
                if "WRONGTYPE" in str(exc):  # a key replaced since its check: find it (logged then), read the other
                    check_all = True
                else:
                    logger.error("redis: XREADGROUP failed: {}", exc)
                self._stop.wait(backoff)
                backoff = min(BACKOFF_MAX_SECONDS, backoff * 2)
            except (RedisError, OSError) as exc:
                if down_since is None:
                    down_since = str(exc)
                    logger.warning("redis: {} is unreachable ({}); reconnecting with backoff",
                                   self.settings.address, exc)
                client = self._drop(client)
                self._stop.wait(backoff)
                backoff = min(BACKOFF_MAX_SECONDS, backoff * 2)
        self._drop(client)

    def _wrong_types(self, wrong: list[str]) -> bool:
        """Keep which of our stream keys hold another type; log each once as it turns bad and as it is fixed.

        Args:
            wrong: the keys :func:`ensure_groups` found of another type (of those it checked).

        Returns:
            Whether a key newly turned bad.
        """
        newly = [key for key in wrong if key not in self.wrong_type]
        for key in newly:
            logger.error(wrong_type_text(key, inbox=key == self.inbox))
        fixed = [key for key in self.wrong_type if key not in wrong]
        for key in fixed:
            logger.info("redis: {} is a stream again; reading it", key)
        self.wrong_type = set(wrong)
        return bool(newly)

    def _tell(self, response: Any, client: Any = None) -> int:
        """Tell the actor each stream's entries of one XREADGROUP answer (inbox entries count against the room).

        Inbox entries a read already blocking took after our connection id's lease was lost are
        handed back to the stream (``client`` given) for the process that holds it.

        Args:
            response: the XREADGROUP answer.
            client: the client to hand inbox entries back with (None: never handed back).

        Returns:
            How many replies entries the answer held.
        """
        replies = 0
        for stream, entries in _batches(response):
            if stream == self.replies:
                replies += len(entries)
            if entries:
                kind = "in" if stream == self.inbox else "replies"
                if kind == "in" and self.room is not None:
                    if client is not None and self.room.closed():
                        self._hand_back(client, entries)
                        continue
                    self.room.taken(len(entries))
                self.target.tell(RedisEntries(kind, tuple(entries), read=True))
        return replies

    def _hand_back(self, client: Any, entries: list[tuple[str, dict[Any, Any]]]) -> None:
        """Queue copies of ``entries`` at the inbox's end and drop ours, in one transaction.

        A duplicate can never run twice (the turn claim), and nothing is dropped before its copy is queued.
        """
        pipe = client.pipeline(transaction=True)
        for entry_id, fields in entries:
            pipe.xadd(self.inbox, fields)
            pipe.xack(self.inbox, GROUP, entry_id)
            pipe.xdel(self.inbox, entry_id)
        pipe.execute()
        stopping = self.room is not None and self.room.stopping()
        logger.log("INFO" if stopping else "WARNING", hand_back_text(len(entries), stopping=stopping))

    @staticmethod
    def _drop(client: Any) -> None:
        if client is not None:
            try:
                client.close()
            except Exception:  # closing a dead connection may raise anything
                pass
        return None


class _GuardedRunner:
    """A runner that claims relayed-in turns before running them; everything else passes through."""

    def __init__(self, inner: TurnRunner, guard: ClaimGuard) -> None:
        self.inner = inner
        self.guard = guard
        self.__wrapped__ = inner  # a reply that is not a str names the runner the user gave (runners.runner_name)

    def run_turn(self, turn: Turn) -> str:
        self.guard.claim(turn.delivery_id)
        return self.inner.run_turn(turn)

    def __repr__(self) -> str:  # logs name the runner the user gave
        return repr(self.inner)

    def __getattr__(self, name: str) -> Any:  # idempotent, release, ...
        return getattr(self.inner, name)


class ClaimGuard:
    """The atomic "who runs this envelope's turn" decision, shared by the actor and the turn workers.

    The actor ``admit``s an envelope id before handing it to the Dispatcher;
    the runner wrapper then claims it (``SET <p>:claim:<id> <consumer> NX``)
    just before the turn runs. A claim held by another consumer, or the
    sender's ``expired`` mark, means the turn must not run.
    """

    def __init__(self, settings: RedisSettings, *, ttl: float = 900.0, consumer: str | None = None,
                 claim_wait_seconds: float = 10.0) -> None:
        self.settings = settings
        self.claim_wait_seconds = claim_wait_seconds
        self.ttl = int(ttl) if float(ttl).is_integer() else ttl
        self.keys = RedisKeys(settings.prefix)
        self.consumer = consumer or consumer_name()
        self._client: Any = None
        self._lock = threading.Lock()
        self._admitted: dict[str, tuple[str, str]] = {}  # envelope id → (target handle, target connection)
        self._mine: set[str] = set()
        self._verdicts: dict[str, str] = {}  # envelope id → "lost" | "expired"

    def wrap(self, runner: TurnRunner) -> TurnRunner:
        return _GuardedRunner(runner, self)

    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = make_client(self.settings.url)
            return self._client

    def admit(self, envelope_id: str, handle: str, connection: str) -> None:
        with self._lock:
            self._admitted[envelope_id] = (handle, connection)

    def forget(self, envelope_id: str) -> None:
        with self._lock:
            self._admitted.pop(envelope_id, None)
            self._mine.discard(envelope_id)
            self._verdicts.pop(envelope_id, None)

    def verdict(self, envelope_id: str) -> str | None:
        """``lost`` (another consumer runs it), ``expired`` (the sender expired it) or None."""
        with self._lock:
            return self._verdicts.get(envelope_id)

    def claim(self, envelope_id: str) -> None:
        """Claim the turn of ``envelope_id`` (no-op for local deliveries and for a retry attempt).

        Raises:
            TurnFailed: Redis is unreachable (the turn did NOT run), the sender
                expired the envelope, or another consumer already took it.
        """
        with self._lock:
            target = self._admitted.get(envelope_id)
            if target is None or envelope_id in self._mine:
                return
        key = self.keys.claim(envelope_id)
        deadline = time.monotonic() + self.claim_wait_seconds
        pause = 0.1
        while True:  # a short outage only delays the turn; a long one fails it (NOT run, retryable)
            try:
                won = self.client.set(key, self.consumer, nx=True, ex=DONE_KEEP_SECONDS)
                holder = None if won else self.client.get(key)
                break
            except Exception as exc:
                if not is_redis_unreachable(exc):
                    raise
                if time.monotonic() + pause >= deadline:
                    raise TurnFailed(
                        f"Redis at {self.settings.address} is unreachable, so the turn could not be claimed; it did "
                        "NOT run. Retry shortly.",
                        reason="runtime_offline",
                    ) from exc
                time.sleep(pause)
                pause = min(BACKOFF_MAX_SECONDS, pause * 2)
        holder_text = holder.decode() if isinstance(holder, bytes) else holder
        if won or holder_text == self.consumer:
            with self._lock:
                self._mine.add(envelope_id)
            return
        with self._lock:
            self._verdicts[envelope_id] = "expired" if holder_text == EXPIRED_CLAIM else "lost"
        if holder_text == EXPIRED_CLAIM:
            raise TurnFailed(expired_error_text(target[0], target[1], self.ttl, via="redis"), reason="queued_expired")
        raise TurnFailed(f"this envelope's turn was already taken by {holder_text}; not running it twice.",
                         reason="unknown")

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                pass
