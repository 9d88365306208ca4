"""User code can never stop the actors, and every failure on a turn's path ends in one prompt outcome.

Faults are injected through public seams only: a runner, a live owner or a
subscriber that raises; ``LiveMailbox.transition`` or the Dispatcher's turn
builder monkeypatched to raise. Every scenario keeps a second, unrelated
Gateway in the same process and checks it still serves DMs afterwards.
``turn_timeout_seconds`` stays at its default (600 s), so an outcome that only
comes from the turn timer makes ``wait_outcome(timeout=10)`` fail.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from roots import (
    CRASHING_REPLY,
    LogCapture,
    RecordingRunner,
    body_of,
    crash_on_reply,
    make_root,
    send_dm,
    start_gateway,
)

from actors.testkit import await_condition
from hermes_actors import Gateway, TurnFailed
from hermes_actors.core import outcomes
from hermes_actors.core.targets import PeerRoute
from hermes_actors.errors import StoreError
from hermes_actors.local.dispatcher import DispatcherActor
from hermes_actors.local.live_handoff import LiveMailbox
from hermes_actors.local.profile_outcomes import turn_escaped
from hermes_actors.local.runners import CallableRunner
from hermes_actors.local.turns import describe_error, never_ran, turn_failed
from hermes_actors.messages import Delivery, Outcome, Turn

WAIT = 10.0


def bystander(tmp_path: Path, gateways: list[Gateway]) -> Gateway:
    """A second, unrelated Gateway in the same process."""
    return start_gateway(gateways, make_root(tmp_path, name="bystander-root"), RecordingRunner())


def assert_serves(gw: Gateway, message: str) -> None:
    out = gw.wait_outcome(send_dm(gw, message, target="carol"), timeout=WAIT)
    assert out["status"] == "replied" and out["reply"].endswith(message), out


class Owner:
    """A live Bot Chat owner recording the bodies it was handed."""

    def __init__(self, behave: Any = None) -> None:
        self.bodies: list[str] = []
        self.behave = behave or (lambda turn: f"owner: {body_of(turn.content)}")

    def run_turn(self, turn: Turn) -> str:
        self.bodies.append(body_of(turn.content))
        return str(self.behave(turn))


USER_STOPS = [SystemExit(3), KeyboardInterrupt(), GeneratorExit()]
USER_STOP_IDS = ["SystemExit", "KeyboardInterrupt", "GeneratorExit"]


# ── item 2: subscribers ─────────────────────────────────────────────────────


@pytest.mark.parametrize("error", USER_STOPS, ids=USER_STOP_IDS)
def test_a_subscriber_raising_base_exceptions_stops_no_actor(
    error: BaseException, tmp_path: Path, gateways: list[Gateway]
) -> None:
    other = bystander(tmp_path, gateways)
    gate = threading.Event()
    other_rec = RecordingRunner(lambda turn: "late" if gate.wait(WAIT) else "gate never opened")
    other_pending = start_gateway(gateways, make_root(tmp_path, name="pending-root"), other_rec)
    pending_id = send_dm(other_pending, "held")
    other_rec.wait_entered(1, timeout=WAIT)  # a wait_outcome on another gateway is in flight meanwhile
    pending_answer: list[dict[str, Any]] = []
    waiter = threading.Thread(target=lambda: pending_answer.append(other_pending.wait_outcome(pending_id, WAIT * 2)))
    waiter.start()

    gw = start_gateway(gateways, make_root(tmp_path), RecordingRunner())
    raised = threading.Event()
    seen: list[str] = []

    def hostile(outcome: dict[str, Any]) -> None:
        raised.set()
        raise error

    gw.subscribe(hostile)
    gw.subscribe(lambda outcome: seen.append(outcome["delivery_id"]))
    first = send_dm(gw, "one")
    assert raised.wait(WAIT)
    second = send_dm(gw, "two")
    assert gw.wait_outcome(first, timeout=WAIT)["reply"] == "ok: one"
    assert gw.wait_outcome(second, timeout=WAIT)["reply"] == "ok: two"
    await_condition(lambda: seen == [first, second], timeout=WAIT, message="the second subscriber saw both")
    await_condition(lambda: gw.stats()["subscriber_errors"] == 2, timeout=WAIT, message="both raises counted")
    assert_serves(other, "still here")
    gate.set()
    waiter.join(WAIT * 2)
    assert [o["reply"] for o in pending_answer] == ["late"]


# ── item 2: runners and owners ──────────────────────────────────────────────


@pytest.mark.parametrize("error", USER_STOPS, ids=USER_STOP_IDS)
def test_a_runner_raising_base_exceptions_fails_its_dm_at_once(
    error: BaseException, tmp_path: Path, gateways: list[Gateway]
) -> None:
    other = bystander(tmp_path, gateways)

    def behave(turn: Turn) -> str:
        if body_of(turn.content) == "explode":
            raise error
        return f"ok: {body_of(turn.content)}"

    rec = RecordingRunner(behave)
    gw = start_gateway(gateways, make_root(tmp_path), rec)
    bad, good = send_dm(gw, "explode"), send_dm(gw, "next")
    out = gw.wait_outcome(bad, timeout=WAIT)
    assert out["status"] == "failed" and out["reason"] == "unknown" and out["retryable"] is False, out
    assert type(error).__name__ in out["error"], out
    assert gw.wait_outcome(good, timeout=WAIT)["reply"] == "ok: next"
    assert rec.bodies() == ["explode", "next"]  # no automatic retry of a runner that asked to stop
    assert_serves(other, "unaffected")


@pytest.mark.parametrize("error", USER_STOPS, ids=USER_STOP_IDS)
def test_a_live_owner_raising_base_exceptions_is_ambiguous_at_once(
    error: BaseException, tmp_path: Path, gateways: list[Gateway]
) -> None:
    other = bystander(tmp_path, gateways)
    root = make_root(tmp_path)

    def behave(turn: Turn) -> str:
        if body_of(turn.content) == "explode":
            raise error
        return f"owner: {body_of(turn.content)}"

    owner, rec = Owner(behave), RecordingRunner()
    gw = start_gateway(gateways, root, rec)
    gw.attach_live_owner("bob", owner)
    bad, good = send_dm(gw, "explode"), send_dm(gw, "next")
    out = gw.wait_outcome(bad, timeout=WAIT)
    assert out["status"] == "ambiguous" and out["retryable"] is False and "do not resend" in out["text"], out
    assert gw.wait_outcome(good, timeout=WAIT)["reply"] == "owner: next"
    assert owner.bodies == ["explode", "next"] and rec.entered == []
    record = LiveMailbox(root / "profiles" / "bob").read(bad)
    assert record is not None and record["status"] == "ambiguous"
    assert_serves(other, "unaffected")


class ExitingReply:
    """A reply object whose ``__str__`` raises a BaseException (were it converted, that would run)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __str__(self) -> str:
        raise self.error


@pytest.mark.parametrize("error", USER_STOPS, ids=USER_STOP_IDS)
def test_a_reply_whose_str_raises_base_exceptions_fails_its_dm_and_is_never_converted(
    error: BaseException, tmp_path: Path, gateways: list[Gateway]
) -> None:
    """It crashed the ProfileActor converting it (the DM ``ambiguous``); a reply that is not a str is now refused
    where the runner returned it, as every runner's is, and its ``__str__`` never runs."""
    other = bystander(tmp_path, gateways)
    bodies: list[str] = []

    class Runner:
        def run_turn(self, turn: Turn) -> Any:
            bodies.append(body_of(turn.content))
            return ExitingReply(error) if body_of(turn.content) == "poison" else f"fine: {body_of(turn.content)}"

    gw = start_gateway(gateways, make_root(tmp_path), Runner())
    poison = send_dm(gw, "poison")
    out = gw.wait_outcome(poison, timeout=WAIT)
    assert (out["status"], out["reason"]) == ("failed", "unknown"), out
    assert out["error"].endswith("returned ExitingReply, expected str"), out
    assert gw.wait_outcome(send_dm(gw, "next"), timeout=WAIT)["reply"] == "fine: next"
    assert bodies == ["poison", "next"]
    assert gw.stats()["profile_starts"] == 1  # no crash, no restart
    assert_serves(other, "unaffected")


class RawRunner:
    """A runner object whose ``run_turn`` returns ``value`` as it is for the DM ``raw`` (else a reply)."""

    def __init__(self, value: Any, *, blocking: bool) -> None:
        self.value = value
        self.blocking = blocking
        self.bodies: list[str] = []

    def run_turn(self, turn: Turn) -> Any:
        self.bodies.append(body_of(turn.content))
        return self.value if body_of(turn.content) == "raw" else f"fine: {body_of(turn.content)}"


@pytest.mark.parametrize("value", [None, 5, b"hi", {"reply": "x"}], ids=["None", "int", "bytes", "dict"])
@pytest.mark.parametrize(("form", "blocking"), [
    ("object", True), ("object", False), ("callable", True), ("callable", False),
], ids=["object-worker", "object-inline", "callable-worker", "callable-inline"])
def test_a_runner_returning_no_str_fails_naming_it_whatever_kind_of_runner_it_is(
    tmp_path: Path, gateways: list[Gateway], value: Any, form: str, blocking: bool
) -> None:
    """Regression (review): a runner object's ``run_turn`` result was never checked (a plain callable's was):
    None failed with an empty error, 5 replied '5', b"hi" replied "b'hi'". Every runner's reply is checked
    where it returns now (``turns.attempt_turn``): ``failed``, naming the runner and what it returned, on a
    worker or inline (``blocking = False``) alike; the profile serves its next DM."""
    raw = RawRunner(value, blocking=blocking)
    runner: Any = raw if form == "object" else CallableRunner(raw.run_turn, blocking=blocking)
    gw = start_gateway(gateways, make_root(tmp_path), runner)
    out = gw.wait_outcome(send_dm(gw, "raw"), timeout=WAIT)
    named = "RawRunner" if form == "object" else "RawRunner.run_turn"  # the qualified name, never the repr
    assert (out["status"], out["reason"], out["retryable"], out["reply"]) == ("failed", "unknown", False, ""), out
    assert out["error"] == f"runner {named} returned {type(value).__name__}, expected str", out
    assert gw.wait_outcome(send_dm(gw, "next"), timeout=WAIT)["reply"] == "fine: next"
    assert raw.bodies == ["raw", "next"]  # not retried


class RateLimitedBot:
    """A runner whose repr holds a secret, a 5 KB prompt and ``rate_limit``; it returns None (no content)."""

    def __init__(self) -> None:
        self.api_key = "sk-live-SECRET123"
        self.system_prompt = "x" * 5000
        self.rate_limit = 5
        self.bodies: list[str] = []

    def run_turn(self, turn: Turn) -> Any:
        self.bodies.append(body_of(turn.content))
        return None

    def __repr__(self) -> str:  # as a dataclass's
        return f"RateLimitedBot(api_key={self.api_key!r}, system_prompt={self.system_prompt!r}, rate_limit=5)"


def test_a_runner_returning_none_is_named_without_its_repr_and_never_retried(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Regression (review): the error held the runner's whole repr (its API key, 5 KB of prompt) and its reason was
    classified from it: ``rate_limit`` made it ``provider_rate_limit``, retryable, and the turn ran twice."""
    bot = RateLimitedBot()
    gw = start_gateway(gateways, make_root(tmp_path), bot)
    out = gw.wait_outcome(send_dm(gw, "hello"), timeout=WAIT)
    assert (out["status"], out["reason"], out["retryable"]) == ("failed", "unknown", False), out
    assert out["error"] == "runner RateLimitedBot returned NoneType, expected str", out
    assert bot.bodies == ["hello"]


# ── item 3: failures outside the runner ─────────────────────────────────────


def test_a_store_error_moving_the_live_mailbox_to_claimed_fails_the_dm_at_once_retryable(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    other = bystander(tmp_path, gateways)
    root = make_root(tmp_path)
    real_transition = LiveMailbox.transition
    broken = threading.Event()
    broken.set()

    def transition(self: LiveMailbox, key: str, state: str, **fields: str) -> dict[str, Any]:
        if state == "claimed" and broken.is_set():
            raise StoreError("disk on fire")
        return real_transition(self, key, state, **fields)

    monkeypatch.setattr(LiveMailbox, "transition", transition)
    owner, rec = Owner(), RecordingRunner()
    gw = start_gateway(gateways, root, rec)
    gw.attach_live_owner("bob", owner)
    bad = send_dm(gw, "lost?")
    out = gw.wait_outcome(bad, timeout=WAIT)
    assert out["status"] == "failed" and out["retryable"] is True, out
    assert "disk on fire" in out["error"] and "NOT delivered" in out["error"], out
    assert owner.bodies == [] and rec.entered == []
    record = LiveMailbox(root / "profiles" / "bob").read(bad)
    assert record is not None and record["status"] == "failed"  # a replay reports the failure, never runs it
    broken.clear()
    assert gw.wait_outcome(send_dm(gw, "after"), timeout=WAIT)["reply"] == "owner: after"
    assert_serves(other, "unaffected")


@pytest.mark.parametrize("with_owner", [False, True], ids=["runner", "live-owner"])
def test_building_the_turn_raising_fails_the_dm_at_once_retryable(
    with_owner: bool, tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    other = bystander(tmp_path, gateways)
    real_make_turn = DispatcherActor._make_turn

    def make_turn(self: DispatcherActor, delivery: Delivery, lock_fd: int | None = None) -> Turn:
        if body_of(delivery.content) == "unbuildable":
            raise RuntimeError("turn builder broke")
        return real_make_turn(self, delivery, lock_fd)

    monkeypatch.setattr(DispatcherActor, "_make_turn", make_turn)
    owner, rec = Owner(), RecordingRunner()
    gw = start_gateway(gateways, make_root(tmp_path), rec)
    if with_owner:
        gw.attach_live_owner("bob", owner)
    bad, good = send_dm(gw, "unbuildable"), send_dm(gw, "fine")
    out = gw.wait_outcome(bad, timeout=WAIT)
    assert out["status"] == "failed" and out["retryable"] is True, out
    assert "turn builder broke" in out["error"] and "NOT delivered" in out["error"], out
    reply = gw.wait_outcome(good, timeout=WAIT)["reply"]
    assert reply == ("owner: fine" if with_owner else "ok: fine")
    assert (owner.bodies, rec.bodies()) == ((["fine"], []) if with_owner else ([], ["fine"]))
    assert_serves(other, "unaffected")


class RaisingPeerTransport:
    """A ``bot_peers`` transport that raises instead of returning an outcome."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.calls = 0

    def deliver(self, delivery: Delivery, route: PeerRoute) -> Outcome:
        self.calls += 1
        raise self.error


@pytest.mark.parametrize("error", [OSError("exec format error"), SystemExit(2)], ids=["OSError", "SystemExit"])
def test_a_raising_peer_transport_settles_the_peer_dm_at_once(
    error: BaseException, tmp_path: Path, gateways: list[Gateway]
) -> None:
    other = bystander(tmp_path, gateways)
    transport = RaisingPeerTransport(error)
    gw = start_gateway(gateways, make_root(tmp_path), RecordingRunner(), {"bot_peers": {"mini": {}}},
                       peer_transport=transport)
    out = gw.wait_outcome(send_dm(gw, "to the peer", target="mini/bob"), timeout=WAIT)
    assert out["status"] == "ambiguous" and out["retryable"] is False, out
    assert type(error).__name__ in out["error"] and transport.calls == 1
    assert_serves(gw, "local still fine")
    assert_serves(other, "unaffected")


class BlockingPeerTransport:
    """A ``bot_peers`` transport whose delivery is under way until the test releases it."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def deliver(self, delivery: Delivery, route: PeerRoute) -> Outcome:
        self.started.set()
        self.release.wait(WAIT)
        return outcomes.from_reply(delivery.delivery_id, route.label, "too late")


def test_a_peer_dm_under_way_when_the_gateway_stops_is_journaled_ambiguous(tmp_path: Path) -> None:
    """Regression: a peer DM still under way at stop was published ambiguous but never journaled: after the
    restart, wait_outcome and `hermes-actors outcome` said the acked DM was unknown."""
    from hermes_actors.ops.journal_view import find_outcome

    root = make_root(tmp_path)
    transport = BlockingPeerTransport()
    try:
        with LogCapture("INFO") as logs:
            with Gateway(root, runner=RecordingRunner(), config={"bot_peers": {"mini": {}}},
                         peer_transport=transport) as gw:
                key = send_dm(gw, "to the peer", target="mini/bob")
                assert transport.started.wait(WAIT)
                gw.stop(timeout=0.2)  # the peer's answer comes only once the stop returned: it ends under way
            transport.release.set()  # the late answer: dropped with one INFO line, not an ERROR with a traceback
            await_condition(lambda: logs.matching(key, "came after the gateway stopped"), timeout=WAIT,
                            message="the late peer outcome's log line")
        assert not [r for r in logs.records if r["level"].no >= 40], [r["message"] for r in logs.records][-3:]
        assert find_outcome(root, key)["status"] == "ambiguous"  # from the files, the host gone
        with Gateway(root, runner=RecordingRunner(), config={"bot_peers": {"mini": {}}}) as again:
            out = again.wait_outcome(key, timeout=WAIT)
        assert out["status"] == "ambiguous" and out["retryable"] is False, out
    finally:
        transport.release.set()


def test_a_peer_dm_under_way_at_a_kill_9_is_on_disk_from_its_ack_and_the_next_start_settles_it_ambiguous(
    tmp_path: Path,
) -> None:
    """Regression (acklost ``peerkill.py``, 20/20): a durable gateway acked a peer DM ``queued`` with nothing
    journaled (its ``finished`` record came only with its outcome), so a ``kill -9`` while the transport
    delivered it left no trace: after the restart ``wait_outcome`` raised ``KeyError`` ("never acked on this
    root") and ``hermes-actors outcome`` said unknown. Now its ``accepted`` record is on disk before the ack;
    the next start settles it ``ambiguous`` (the transport had it), never sends it again.

    The kill is the journal's files as they are while the transport still delivers: copied to a fresh root,
    which is what a ``kill -9`` at that moment leaves (the record was fsync'd before the ack)."""
    import shutil

    from hermes_actors.ops.journal_view import find_outcome

    root, crashed = make_root(tmp_path / "live"), make_root(tmp_path / "crashed")
    transport = BlockingPeerTransport()
    try:
        with Gateway(root, runner=RecordingRunner(), config={"bot_peers": {"mini": {}}},
                     peer_transport=transport) as gw:
            key = send_dm(gw, "to the peer", target="mini/bob")
            assert transport.started.wait(WAIT)
            shutil.copytree(root / "bot_relay" / "journal", crashed / "bot_relay" / "journal")
            gw.stop(timeout=0.2)
        assert find_outcome(crashed, key)["status"] == "pending", find_outcome(crashed, key)
        again_transport = BlockingPeerTransport()
        again_transport.release.set()
        with Gateway(crashed, runner=RecordingRunner(), config={"bot_peers": {"mini": {}}},
                     peer_transport=again_transport) as again:
            out = again.wait_outcome(key, timeout=WAIT)
            assert again.recovered["ambiguous"] == 1, again.recovered
        assert (out["status"], out["retryable"]) == ("ambiguous", False), out
        assert "peer transport" in out["error"], out
        assert not again_transport.started.is_set()  # never sent a second time
        assert find_outcome(crashed, key)["status"] == "ambiguous"
    finally:
        transport.release.set()


@pytest.mark.parametrize("stopping", [False, True])
def test_a_peer_dm_is_handed_to_its_transport_once_accepted_unless_the_stop_began(stopping: bool) -> None:
    """A peer DM's acceptance lands (its ``accepted`` record on disk, in durable mode; at once without a journal)
    and it goes to the transport, booked; one whose acceptance lands once the stop began is settled ``cancelled``
    (NOT delivered) and never handed over: the stop counted the peer DMs under way before it landed, so handed
    over it would have been settled ``cancelled`` while its transport delivered it."""
    from hermes_actors.local.durability import NoDurability
    from hermes_actors.local.outcome_book import OutcomeBook
    from hermes_actors.local.remote_sends import RemoteSends

    submitted: list[str] = []
    settled: list[Outcome] = []
    book = OutcomeBook()
    sends = RemoteSends(dispatcher=None, relay=None, book=book, counters={"accepted": 0},  # type: ignore[arg-type]
                        peer_submit=lambda delivery, route, report: submitted.append(delivery.delivery_id),
                        durability=NoDurability(), settle=settled.append, stopping=lambda: stopping)
    delivery = Delivery("d" * 32, "alice", "alice", "", "", "hi", label="@bob on peer 'mini'")
    ack = sends.to_peer(PeerRoute(None, "mini", "bob", "hi", {}), delivery)  # type: ignore[arg-type]
    assert isinstance(ack, dict) and ack["status"] == "queued", ack
    entry = book.entry(delivery.delivery_id)
    assert entry is not None and entry.route == "peer" and entry.delivery.origin == "peer"
    if stopping:
        assert submitted == [] and [(o.status, o.reason) for o in settled] == [("failed", "cancelled")], settled
    else:
        assert submitted == [delivery.delivery_id] and settled == []


# ── the pure decisions ──────────────────────────────────────────────────────


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.parametrize(("error", "text"), [
    (SystemExit(3), "SystemExit: 3"),
    (SystemExit(), "SystemExit"),
    (KeyboardInterrupt(), "KeyboardInterrupt"),
    (GeneratorExit(), "GeneratorExit"),
    (StoreError("disk on fire"), "StoreError: disk on fire"),
    (UnprintableError(), "UnprintableError"),
])
def test_describe_error(error: BaseException, text: str) -> None:
    assert describe_error(error) == text


@pytest.mark.parametrize(("step", "error", "expected"), [
    ("taking the turn lock", OSError("EBADF"), "Taking the turn lock failed (OSError: EBADF); the DM was NOT "
                                               "delivered. Resend shortly."),
    ("building the turn", RuntimeError("429 too many requests"), "Building the turn failed (RuntimeError: 429 too "
                                                                 "many requests); the DM was NOT delivered. "
                                                                 "Resend shortly."),
    ("recording the turn durably", "ENOSPC", "Recording the turn durably failed (ENOSPC); the DM was NOT delivered. "
                                             "Resend shortly."),
])
def test_never_ran_is_retryable_runtime_offline_whatever_the_text(step: str, error: Any, expected: str) -> None:
    result = never_ran("d" * 32, step, error)
    assert (result.reply, result.error, result.reason, result.ambiguous) == (None, expected, "runtime_offline", False)


@pytest.mark.parametrize(("error", "expected"), [
    (TurnFailed("quota gone", reason="provider_quota_limit"), ("quota gone", "provider_quota_limit", False)),
    (TurnFailed("busy", reason=" TARGET_BUSY "), ("busy", "target_busy", False)),
    (TurnFailed("boom", reason="Bogus_Reason"), ("boom", "unknown", False)),
    (TurnFailed("429 Too Many Requests"), ("429 Too Many Requests", "provider_rate_limit", False)),
    (TurnFailed(""), ("turn failed", "unknown", False)),
    (TurnFailed("lost after sending: 503", ambiguous=True), ("lost after sending: 503", "provider_server_error", True)),
], ids=["typed", "padded-reason", "reason-outside-the-vocabulary", "classified", "no-text", "ambiguous"])
def test_turn_failed_is_one_rule_for_runners_and_owners(error: TurnFailed, expected: tuple[str, str, bool]) -> None:
    result = turn_failed("d" * 32, error)
    assert result.reply is None and (result.error, result.reason, result.ambiguous) == expected


def test_an_escaped_turn_error_is_ambiguous() -> None:
    result = turn_escaped("d" * 32, ValueError("bug"))
    assert (result.reply, result.reason, result.ambiguous) == (None, "unknown", True)
    assert "ValueError: bug" in result.error


# ── item 4: the live owner survives a supervised restart ────────────────────


def test_the_live_owner_stays_attached_across_a_profile_actor_restart(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    other = bystander(tmp_path, gateways)
    crash_on_reply(monkeypatch)
    entered, release = threading.Event(), threading.Event()
    runner_bodies: list[str] = []

    class Runner:
        def run_turn(self, turn: Turn) -> str:
            runner_bodies.append(body_of(turn.content))
            entered.set()
            assert release.wait(WAIT)
            return CRASHING_REPLY

    owner = Owner()
    gw = start_gateway(gateways, make_root(tmp_path), Runner())
    try:
        poison = send_dm(gw, "poison")  # runs on the runner: no owner yet
        assert entered.wait(WAIT)
        gw.attach_live_owner("bob", owner)  # told to the ProfileActor before the poison's result
    finally:
        release.set()
    assert gw.wait_outcome(poison, timeout=WAIT)["status"] == "ambiguous"  # the actor crashed settling it
    after = send_dm(gw, "after the restart")
    assert gw.wait_outcome(after, timeout=WAIT)["reply"] == "owner: after the restart"
    assert owner.bodies == ["after the restart"] and runner_bodies == ["poison"]
    assert gw.stats()["profile_starts"] == 1  # the same child, restarted by its supervisor
    assert_serves(other, "unaffected")


# ── text no file can hold ───────────────────────────────────────────────────


class _LoneSurrogateError(Exception):
    def __str__(self) -> str:
        return "bad \udcff byte"


@pytest.mark.parametrize("behave, field, expected", [
    (lambda turn: "cut emoji \ud83d", "reply", "cut emoji \ufffd"),
    (lambda turn: "pair \ud83d\ude00 kept", "reply", "pair 😀 kept"),
    (lambda turn: (_ for _ in ()).throw(ValueError("boom \ud800")), "error", "\ufffd"),
    (lambda turn: (_ for _ in ()).throw(_LoneSurrogateError()), "error", "bad \ufffd byte"),
], ids=["lone-in-reply", "pair-in-reply", "lone-in-exception", "lone-in-str"])
@pytest.mark.parametrize("durable", [True, False], ids=["durable", "in-memory"])
def test_a_reply_or_error_with_a_lone_surrogate_is_made_valid_and_the_gateway_serves_on(
    tmp_path: Path, gateways: list[Gateway], behave: Any, field: str, expected: str, durable: bool
) -> None:
    """A model's reply cut mid-emoji (valid JSON, a lone surrogate once parsed) once crashed the Dispatcher."""
    def runner(turn: Turn) -> str:
        return str(behave(turn)) if "first" in turn.content else f"ok: {body_of(turn.content)}"

    gw = start_gateway(gateways, make_root(tmp_path), RecordingRunner(runner), durable=durable)
    out = gw.wait_outcome(send_dm(gw, "first"), timeout=WAIT)
    assert expected in out[field], out
    out["text"].encode("utf-8")  # every text of the outcome is valid now
    assert_serves(gw, "second")


def test_a_peer_dm_through_a_hermes_without_a_peer_command_fails_not_delivered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """hermes-agent 0.19 has no `peer` command: a bot_peers DM through the CLI transport failed `unknown` with
    2,000 characters of argparse usage; it now says why, and that nothing was sent (`runtime_offline`)."""
    from hermes_fixtures import locate_hermes_cli

    from hermes_actors.transports.peer_cli import PeerCliTransport

    cli = locate_hermes_cli()
    if cli is None:
        pytest.skip("no hermes CLI: set HERMES_ACTORS_HERMES_CLI or install hermes-actors[hermes]")
    root = make_root(tmp_path)
    monkeypatch.setenv("HERMES_HOME", str(root))  # the transport's process inherits our environment
    monkeypatch.setenv("HOME", str(tmp_path))
    with Gateway(root, runner=RecordingRunner(), config={"bot_peers": {"spark": {}}},
                 peer_transport=PeerCliTransport(cli=cli, timeout=120)) as gw:
        out = gw.wait_outcome(send_dm(gw, "anyone there?", target="spark"), timeout=150)
    assert (out["status"], out["reason"], out["retryable"]) == ("failed", "runtime_offline", True), out
    assert "has no `peer` command" in out["error"] and "NOT delivered" in out["error"]
    assert "usage:" not in out["error"]
