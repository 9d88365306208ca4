"""``/metrics``: the gateway's delivery metrics in Prometheus text format, on a private registry.

Two kinds of metric:

* counted as events arrive (``Gateway.subscribe(details=True, rooms=True)``): deliveries by
  status and reason, the acceptance-to-outcome latency histogram, and the
  messages posted in group rooms (``kind: "room"`` events, never counted as deliveries);
* read at each scrape from the gateway: accepted/refused (by reason)/settled, pending, the
  per-profile in-flight and queued gauges, the relay's and the journal's counters,
  the rooms by state.

The registry is this object's own (never prometheus_client's global one), so two
gateways in one process never share or clash over series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["LATENCY_BUCKETS", "METRIC_NAMES", "REDIS_METRICS", "RELAY_DIRS", "ROOM_STATES", "DeliveryMetrics",
           "profile_gauges", "relay_files", "relay_samples", "room_states"]

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0)
ROOM_STATES = ("idle", "busy", "needs_you")
RELAY_DIRS = ("outbox", "claimed", "replies", "inbox", "taken", "quarantine")
_RELAY_GAUGES = frozenset({"waiting", "inbound", "unconfirmed"})  # relay stats that go up and down; the rest only count

METRIC_NAMES = {  # name → help (docs/operations.md lists these; tests check every one is served)
    "hermes_actors_deliveries_total": "Deliveries sent from this gateway that settled, by status and reason.",
    "hermes_actors_delivery_latency_seconds": "Seconds from a delivery's acceptance to its outcome.",
    "hermes_actors_up": "1 while the gateway runs.",
    "hermes_actors_accepted_total": "DMs accepted (local, relay and peer).",
    "hermes_actors_refused_total": "DMs refused at send time (each refusal answered to a sender), by reason.",
    "hermes_actors_settled_total": "Deliveries that reached their final outcome.",
    "hermes_actors_pending": "Accepted deliveries without an outcome yet (queued or running).",
    "hermes_actors_in_flight": "Deliveries in flight to each local profile (running or queued).",
    "hermes_actors_queued": "Deliveries queued for each local profile (in flight, not running yet).",
    "hermes_actors_relay_up": "1 while the relay actor is alive.",
    "hermes_actors_redis_up": "1 while the Redis transport reaches Redis, 0 while it is unreachable (Redis only).",
    "hermes_actors_relay_events_total": "Relay counters by event (sent, replies, expired, timeouts, drained, ...).",
    "hermes_actors_relay_waiting": "Relay envelopes of ours waiting for a reply.",
    "hermes_actors_relay_files": "Files in each relay directory (outbox, claimed, replies, inbox, taken, quarantine).",
    "hermes_actors_journal_records_total": "Records appended to the delivery journal.",
    "hermes_actors_journal_fsyncs_total": "Group commits (fsyncs) of the delivery journal.",
    "hermes_actors_subscriber_errors_total": "Outcome subscriber callbacks that raised.",
    "hermes_actors_rooms": "Group rooms by state (idle, busy, needs_you).",
    "hermes_actors_room_messages_total": "Messages posted in group rooms, by status (said, failed, interrupted).",
}

REDIS_METRICS = frozenset({"hermes_actors_redis_up"})  # served only by a gateway on the Redis transport


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def profile_gauges(status: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """Pure: each local profile's (in-flight, queued) from a ``live_status`` dict.

    Args:
        status: ``live_status(gateway)``; ``profiles`` rows name a ``profile`` (else ``handle``) and may
            carry ``in_flight`` (its accepted DMs without an outcome, running or queued) and ``queued``;
            without ``in_flight`` the ``in_flight`` rows naming it (``profile``, else ``target``) are counted.

    Returns:
        profile → (deliveries in flight to it, of which queued); every listed profile appears.
    """
    names: dict[str, str] = {}  # profile or handle → profile
    queued: dict[str, int] = {}
    given: dict[str, int] = {}
    for row in status.get("profiles") or ():
        profile = str(row.get("profile") or row.get("handle") or "")
        if not profile:
            continue
        names[profile] = profile
        if row.get("handle"):
            names[str(row["handle"])] = profile
        queued[profile] = _count(row.get("queued")) or 0
        flying = _count(row.get("in_flight"))
        if flying is not None:
            given[profile] = flying
    counted = dict.fromkeys(queued, 0)
    for row in status.get("in_flight") or ():
        known = names.get(str(row.get("profile") or row.get("target") or "").lstrip("@"))
        if known is not None:
            counted[known] += 1
    return {p: (given.get(p, counted[p]), queued[p]) for p in sorted(queued)}


def room_states(status: Mapping[str, Any]) -> dict[str, int]:
    """Pure: how many rooms a ``live_status`` dict shows in each state.

    Args:
        status: ``live_status(gateway)`` (its ``rooms`` rows; none when the key is missing).

    Returns:
        {state: rooms}; idle, busy and needs_you always (0 when none), any other state seen too.
    """
    counts = dict.fromkeys(ROOM_STATES, 0)
    for room in status.get("rooms") or ():
        state = str(room.get("state") or "unknown")
        counts[state] = counts.get(state, 0) + 1
    return counts


def relay_files(relay: Mapping[str, Any]) -> dict[str, int]:
    """Pure: the relay directory counts a ``live_status`` relay dict carries (missing or unknown ones left out).

    Args:
        relay: ``live_status(gateway)["relay"]``.

    Returns:
        {directory: entries} for outbox, claimed, replies, inbox, taken and quarantine.
    """
    counts = {name: _count(relay.get(name)) for name in RELAY_DIRS}
    return {name: n for name, n in counts.items() if n is not None}


def relay_samples(relay: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """Pure: split the relay's numeric stats into (counters by event, gauges by name).

    Args:
        relay: ``Gateway.stats()["relay"]`` (file or Redis relay).

    Returns:
        ({event: count}, {gauge: value}); booleans and non-numbers are left out.
    """
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    for key, value in relay.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        (gauges if key in _RELAY_GAUGES else counters)[str(key)] = float(value)
    return counters, gauges


class _GatewayCollector:
    """Reads the gateway's counters and status at each scrape (a prometheus_client collector)."""

    def __init__(self, stats: Callable[[], dict[str, Any]], status: Callable[[], dict[str, Any]]) -> None:
        self.stats = stats
        self.status = status

    def collect(self) -> Iterable[Metric]:
        try:
            stats, status = self.stats(), self.status()
        except (RuntimeError, TimeoutError):  # not running (stopping, stopped, an actor gone): say so only
            yield GaugeMetricFamily("hermes_actors_up", METRIC_NAMES["hermes_actors_up"], value=0)
            return
        yield GaugeMetricFamily("hermes_actors_up", METRIC_NAMES["hermes_actors_up"], value=1)
        yield from _counters(stats)
        in_flight = GaugeMetricFamily("hermes_actors_in_flight", METRIC_NAMES["hermes_actors_in_flight"],
                                      labels=["profile"])
        queued = GaugeMetricFamily("hermes_actors_queued", METRIC_NAMES["hermes_actors_queued"], labels=["profile"])
        for profile, (flying, waiting) in profile_gauges(status).items():
            in_flight.add_metric([profile], flying)
            queued.add_metric([profile], waiting)
        yield in_flight
        yield queued
        rooms = GaugeMetricFamily("hermes_actors_rooms", METRIC_NAMES["hermes_actors_rooms"], labels=["state"])
        for state, count in room_states(status).items():
            rooms.add_metric([state], count)
        yield rooms
        if "relay_alive" in stats:
            yield from _relay(bool(stats["relay_alive"]), stats.get("relay") or {})
        files = GaugeMetricFamily("hermes_actors_relay_files", METRIC_NAMES["hermes_actors_relay_files"],
                                  labels=["dir"])
        relay = status.get("relay")
        for directory, count in relay_files(relay if isinstance(relay, Mapping) else {}).items():
            files.add_metric([directory], count)
        yield files


def _counters(stats: Mapping[str, Any]) -> Iterator[Metric]:
    if "refused" in stats:
        yield _refused(stats.get("refused_by_reason") or {})
    for key, name in (("accepted", "hermes_actors_accepted_total"), ("settled", "hermes_actors_settled_total"),
                      ("journal_records", "hermes_actors_journal_records_total"),
                      ("journal_fsyncs", "hermes_actors_journal_fsyncs_total"),
                      ("subscriber_errors", "hermes_actors_subscriber_errors_total")):
        if key in stats:
            yield CounterMetricFamily(name, METRIC_NAMES[name], value=stats[key])
    if "pending" in stats:
        yield GaugeMetricFamily("hermes_actors_pending", METRIC_NAMES["hermes_actors_pending"], value=stats["pending"])


def _refused(by_reason: Mapping[str, Any]) -> Metric:
    """The refusals answered to senders, one sample per reason (their sum is ``stats()["refused"]``)."""
    refused = CounterMetricFamily("hermes_actors_refused_total", METRIC_NAMES["hermes_actors_refused_total"],
                                  labels=["reason"])
    for reason, count in sorted(by_reason.items()):
        if _count(count) is not None:
            refused.add_metric([str(reason) or "none"], count)
    return refused


def _relay(alive: bool, relay: Mapping[str, Any]) -> Iterator[Metric]:
    yield GaugeMetricFamily("hermes_actors_relay_up", METRIC_NAMES["hermes_actors_relay_up"], value=int(alive))
    reachable = relay.get("reachable")
    if isinstance(reachable, bool):  # only the Redis transport says (the file relay has no link to lose)
        yield GaugeMetricFamily("hermes_actors_redis_up", METRIC_NAMES["hermes_actors_redis_up"], value=int(reachable))
    counters, gauges = relay_samples(relay)
    events = CounterMetricFamily("hermes_actors_relay_events_total", METRIC_NAMES["hermes_actors_relay_events_total"],
                                 labels=["event"])
    for event, value in sorted(counters.items()):
        events.add_metric([event], value)
    yield events
    for name, value in sorted(gauges.items()):
        help_text = METRIC_NAMES.get(f"hermes_actors_relay_{name}", f"Relay gauge {name}.")
        yield GaugeMetricFamily(f"hermes_actors_relay_{name}", help_text, value=value)


class DeliveryMetrics:
    """The metrics of one gateway.

    Args:
        stats: returns ``Gateway.stats()`` (raises RuntimeError when the gateway is not running).
        status: returns ``live_status(gateway)``.
    """

    def __init__(self, stats: Callable[[], dict[str, Any]], status: Callable[[], dict[str, Any]]) -> None:
        self.registry = CollectorRegistry()  # prometheus_client's metrics lock themselves: no lock here, so a
        # slow scrape (it asks the actors) never holds up observe() on its subscription's notifier thread
        self.deliveries = Counter("hermes_actors_deliveries", METRIC_NAMES["hermes_actors_deliveries_total"],
                                  ["status", "reason"], registry=self.registry)
        self.latency = Histogram("hermes_actors_delivery_latency_seconds",
                                 METRIC_NAMES["hermes_actors_delivery_latency_seconds"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.room_messages = Counter("hermes_actors_room_messages", METRIC_NAMES["hermes_actors_room_messages_total"],
                                     ["status"], registry=self.registry)
        self.registry.register(_GatewayCollector(stats, status))

    def observe(self, outcome: Mapping[str, Any]) -> None:
        """Count one outcome or room event (a ``subscribe(details=True, rooms=True)`` dict).

        Args:
            outcome: a DM outcome: its ``status``, ``reason`` ("" is shown as ``none``) and ``latency_seconds``
                (None: not timed); or a ``kind: "room"`` event: a posted ``message`` counts by its ``status``.
        """
        if outcome.get("kind") == "room":
            message = outcome.get("message")
            if outcome.get("event") == "message" and isinstance(message, Mapping):
                self.room_messages.labels(str(message.get("status") or "unknown")).inc()
            return
        self.deliveries.labels(str(outcome.get("status") or "unknown"), str(outcome.get("reason") or "none")).inc()
        latency = outcome.get("latency_seconds")
        if isinstance(latency, int | float) and not isinstance(latency, bool):
            self.latency.observe(float(latency))

    def render(self) -> bytes:
        """The exposition text (Prometheus text format 0.0.4-compatible)."""
        return generate_latest(self.registry)
