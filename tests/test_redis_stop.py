"""Stopping the Redis transport: its two threads (the stream reader, the heartbeat) are told first and waited for
together, against one deadline.

Regression (archrev): against a Redis that accepts connections and never answers, ``Gateway.stop()`` took 6.2 s,
the docs said "a couple" of seconds: the stop joined the reader (up to 5 s, on a read that waits BLOCK + 3 s)
and only then told the heartbeat, whose stop waited for the lock a beat blocked on Redis held, then joined it
(up to 5 s) and removed its keys (3 s more on a black hole): the sum of the waits, not the longest.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from redis_fixture import RedisServer
from roots import LogCapture, RecordingRunner, make_root

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.transports.redis import actor as redis_actor
from hermes_actors.transports.redis import heartbeat as heartbeat_module
from hermes_actors.transports.redis.heartbeat import Heartbeat
from hermes_actors.transports.redis.io import ANSWER_TIMEOUT_SECONDS, CONNECT_TIMEOUT_SECONDS
from hermes_actors.transports.redis.store import RedisKeys, consumer_name, redis_settings

KEYS = RedisKeys()


class _FakeThread:
    """A transport thread that records what its stop asked of it."""

    def __init__(self, name: str, log: list[tuple[Any, ...]], *, ends: bool = True) -> None:
        self.name = name
        self.log = log
        self.ends = ends

    def signal_stop(self) -> None:
        self.log.append(("signal", self.name))

    def finish(self, deadline: float) -> bool:
        self.log.append(("finish", self.name, deadline))
        return self.ends


@pytest.mark.parametrize(("ends", "all_ended"), [
    ((True, True), True),
    ((False, True), False),  # the first still in a Redis call at the deadline: the second is still finished
    ((True, False), False),
])
def test_a_stop_tells_every_thread_before_waiting_on_any_and_waits_against_one_deadline(
    ends: tuple[bool, bool], all_ended: bool
) -> None:
    from hermes_actors.transports.redis.io import stop_threads  # here: the stop tests below run on any version

    log: list[tuple[Any, ...]] = []
    threads = [_FakeThread("heartbeat", log, ends=ends[0]), _FakeThread("reader", log, ends=ends[1])]
    assert stop_threads(threads, 3.2, clock=lambda: 100.0) is all_ended
    assert log == [("signal", "heartbeat"), ("signal", "reader"),
                   ("finish", "heartbeat", 103.2), ("finish", "reader", 103.2)]


@pytest.mark.parametrize(("block_ms", "wait"), [
    (200, 0.2 + ANSWER_TIMEOUT_SECONDS),  # the default BLOCK: a read under way ends within BLOCK + one answer wait
    (1, 0.001 + ANSWER_TIMEOUT_SECONDS),
    (1800, 1.8 + ANSWER_TIMEOUT_SECONDS),
    (2000, 5.0),  # a long BLOCK is not waited for past the bound (what its read takes stays pending)
    (60000, 5.0),
])
def test_the_stop_waits_for_the_longest_call_under_way_within_a_bound(block_ms: int, wait: float) -> None:
    from hermes_actors.transports.redis.io import STOP_WAIT_MAX_SECONDS, stop_wait_seconds

    assert STOP_WAIT_MAX_SECONDS == 5.0
    assert stop_wait_seconds(block_ms) == pytest.approx(wait)


@pytest.mark.redis
def test_the_heartbeats_key_removal_waits_no_longer_than_what_is_left_of_the_stop(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The removal is a Redis call of its own: it gets the stop's deadline, not one more answer timeout; with
    nothing left it is not tried (the keys expire). A Redis that answers has them removed."""
    settings = redis_settings({"bot_mode": {"redis_heartbeat_seconds": 600}}, redis_server.url)  # beat() only
    client = redis_server.client()
    timeouts: list[tuple[float, float]] = []
    real_make_client = heartbeat_module.make_client

    def recording_make_client(url: str, **kwargs: Any) -> Any:
        timeouts.append((kwargs.get("socket_timeout", ANSWER_TIMEOUT_SECONDS),
                         kwargs.get("connect_timeout", CONNECT_TIMEOUT_SECONDS)))
        return real_make_client(url, **kwargs)

    monkeypatch.setattr(heartbeat_module, "make_client", recording_make_client)
    beat = Heartbeat(settings, KEYS, "mini", consumer_name()).start()
    beat.signal_stop()
    beat.finish(time.monotonic() - 1.0)  # the deadline passed: nothing is asked of Redis
    assert client.get(KEYS.alive("mini")) is not None, "left to expire"
    assert len(timeouts) == 1  # the beats' own client only

    for deadline_in, removal_timeouts in ((30.0, (ANSWER_TIMEOUT_SECONDS, CONNECT_TIMEOUT_SECONDS)),
                                          (2.0, (2.0, CONNECT_TIMEOUT_SECONDS))):
        beat = Heartbeat(settings, KEYS, f"mini-{deadline_in:g}", consumer_name()).start()
        beat.signal_stop()
        assert beat.finish(time.monotonic() + deadline_in) is True
        socket_timeout, connect_timeout = timeouts[-1]
        # one answer timeout at most, and never past the stop's deadline
        assert 0 < socket_timeout <= removal_timeouts[0] and 0 < connect_timeout <= removal_timeouts[1]
        assert client.get(KEYS.alive(f"mini-{deadline_in:g}")) is None, "removed: Redis answered"
        assert client.get(KEYS.consumer_alive(beat.consumer)) is None


@pytest.mark.redis
def test_the_transport_stops_while_its_reader_and_heartbeat_are_both_still_waiting_for_redis(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both threads are held in a Redis call (as a Redis that never answers holds them): the transport's stop
    tells both and gives up on both at one deadline. Before, it waited for the reader, then for the lock the
    heartbeat's beat held: the transport never stopped while the beat waited, and the gateway's stop gave up on
    it after 10 s (WARNING `… did not stop within 10s`)."""
    import redis

    armed, release = threading.Event(), threading.Event()
    reader_waits, beat_waits = threading.Event(), threading.Event()
    real_xreadgroup = redis.Redis.xreadgroup
    real_take_lease = heartbeat_module.take_lease

    def held_xreadgroup(self: Any, *args: Any, **kwargs: Any) -> Any:
        if armed.is_set() and kwargs.get("block") is not None:  # the reader's blocking read
            reader_waits.set()
            release.wait(60)
            return []
        return real_xreadgroup(self, *args, **kwargs)

    def held_take_lease(*args: Any, **kwargs: Any) -> Any:
        if armed.is_set() and threading.current_thread().name.startswith("redis-heartbeat-"):
            beat_waits.set()
            release.wait(60)
        return real_take_lease(*args, **kwargs)

    monkeypatch.setattr(redis.Redis, "xreadgroup", held_xreadgroup)
    monkeypatch.setattr(heartbeat_module, "take_lease", held_take_lease)
    monkeypatch.setattr(redis_actor, "stop_wait_seconds", lambda block_ms: 0.5, raising=False)  # a short test
    root = make_root(tmp_path, {"alice": {}, "bob": {}}, name="alpha")
    before = set(_redis_threads())  # another test's reader may still be ending
    gw = Gateway(root, runner=RecordingRunner(), durable=False, connection_id="alpha",
                 config={"bot_mode": {"transport": redis_server.url, "redis_heartbeat_seconds": 0.2}}).start()
    try:
        ours = [t for t in _redis_threads() if t not in before]
        assert len(ours) == 2, ours
        armed.set()
        assert reader_waits.wait(30) and beat_waits.wait(30), "both threads waiting for Redis"
        with LogCapture("WARNING") as logs:
            gw.stop()
        assert logs.matching("did not stop within") == [], logs.lines  # the transport's stop ended
        assert all(t.is_alive() for t in ours), "both were still waiting for Redis when it ended"
    finally:
        release.set()
        gw.stop()
    await_condition(lambda: not any(t.is_alive() for t in ours), timeout=20, interval=0.05,
                    message="the reader and the heartbeat ended once their calls returned (both were told)")


def _redis_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(("redis-reader-", "redis-heartbeat-"))]

