"""The pure wake-up decisions (hermes_actors.core.wake): table tests."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hermes_actors.core import outcomes
from hermes_actors.core.acks import delivery_from_record, delivery_record
from hermes_actors.core.recovery import plan_recovery
from hermes_actors.core.wake import (
    WAKE_ORIGIN,
    WAKE_RETRY_MOST,
    exempt_from_queue_bounds,
    is_wake,
    parse_wake_mode,
    wake_delivery,
    wake_enabled,
    wake_failure_text,
    wake_for,
    wake_id,
    wake_lock_wait,
    wake_result,
    wake_retry_delay,
    wake_retry_delivery,
    wake_retry_id,
    wake_retryable,
    wake_text,
    wake_turn_time_left,
)
from hermes_actors.messages import Delivery
from hermes_actors.store.journal_records import DeliveryState

ROOT = Path("/srv/hermes")

DM = Delivery(
    delivery_id="a" * 32,
    sender="alice",
    sender_handle="alice",
    target="bob",
    target_handle="bob",
    content="Message from 🤖 Alice (@alice): hi",
    hop=3,
    label="@bob",
)
REPLIED = outcomes.from_reply(DM.delivery_id, "@bob", "hello alice")
LOCAL = frozenset({"default", "alice", "bob"})


@pytest.mark.parametrize(
    ("mode", "runner_is_hermes", "enabled"),
    [
        ("auto", True, True),
        ("auto", False, False),
        ("true", False, True),
        ("true", True, True),
        ("false", True, False),
        ("false", False, False),
    ],
)
def test_wake_enabled(mode: str, runner_is_hermes: bool, enabled: bool) -> None:
    assert wake_enabled(mode, runner_is_hermes) is enabled


@pytest.mark.parametrize(
    ("raw", "mode"),
    [(True, "true"), (False, "false"), ("Auto", "auto"), ("on", "true"), ("0", "false"), ("", None), (1, None)],
)
def test_parse_wake_mode(raw: object, mode: str | None) -> None:
    assert parse_wake_mode(raw) == mode


# case → (delivery, outcome, mode, runner_is_hermes, wakes)
CASES = {
    "a local DM, switch on": (DM, REPLIED, "true", False, True),
    "auto with the real Hermes": (DM, REPLIED, "auto", True, True),
    "auto with a custom runner": (DM, REPLIED, "auto", False, False),
    "switch off": (DM, REPLIED, "false", True, False),
    "a failure wakes too": (DM, outcomes.failed(DM.delivery_id, "@bob", "boom", "unknown"), "true", False, True),
    "a relayed-in DM: its sender is remote": (replace(DM, origin="relay"), REPLIED, "true", True, False),
    "a wake's own outcome: no echo": (replace(DM, origin=WAKE_ORIGIN), REPLIED, "true", True, False),
    "a sender not on this root": (replace(DM, sender="zed"), REPLIED, "true", True, False),
    "a resumed relay placeholder": (replace(DM, sender=""), REPLIED, "true", True, False),
    "an unknown delivery": (None, REPLIED, "true", True, False),
    "an outcome without text": (DM, replace(REPLIED, text="  "), "true", True, False),
    "a re-offered DM after a restart": (replace(DM, origin="recovered"), REPLIED, "true", False, True),
    # the accepting gateway's decision, journaled with the DM, wins over the settling gateway's mode
    "accepted to wake, settled where waking is off": (replace(DM, wake=True), REPLIED, "false", False, True),
    "accepted not to wake, settled where waking is on": (replace(DM, wake=False), REPLIED, "true", True, False),
    "accepted to wake, its sender gone from the root": (replace(DM, wake=True, sender="zed"), REPLIED, "false",
                                                        False, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_wake_for(case: str) -> None:
    delivery, outcome, mode, runner_is_hermes, wakes = CASES[case]
    request = wake_for(outcome, delivery, mode=mode, runner_is_hermes=runner_is_hermes, local_profiles=LOCAL, root=ROOT)
    assert (request is not None) is wakes
    if request is not None:
        assert request.profile == "alice" and request.text == outcome.text
        assert request.hop == 3 and request.wake_id == wake_id(DM.delivery_id)


def test_the_wake_delivery_carries_exactly_the_outcome_text_and_the_hop() -> None:
    request = wake_for(REPLIED, DM, mode="true", runner_is_hermes=False, local_profiles=LOCAL, root=ROOT)
    assert request is not None
    wake = wake_delivery(request, now=12.0)
    assert wake.content == "Reply from @bob: hello alice" == REPLIED.text
    assert (wake.target, wake.target_handle, wake.hop, wake.origin) == ("alice", "alice", 3, WAKE_ORIGIN)
    assert wake.delivery_id == wake_id(DM.delivery_id) != DM.delivery_id
    assert is_wake(wake) and not is_wake(DM) and not is_wake(None)


def test_wake_ids_are_stable_and_distinct() -> None:
    assert wake_id("a" * 32) == wake_id("a" * 32)
    assert wake_id("a" * 32) != wake_id("b" * 32)
    assert len(wake_id("x")) == 32 and int(wake_id("x"), 16) >= 0 and wake_id("x") == wake_id("x").lower()


def test_a_reoffered_wake_stays_a_wake_and_a_started_one_is_not_rerun() -> None:
    request = wake_for(REPLIED, DM, mode="true", runner_is_hermes=False, local_profiles=LOCAL, root=ROOT)
    assert request is not None
    record = wake_delivery(request, now=1.0)
    never_started = DeliveryState(delivery=delivery_record(record))
    plan = plan_recovery({record.delivery_id: never_started})
    assert [d.origin for d in plan.reoffer] == [WAKE_ORIGIN]
    started = DeliveryState(delivery=delivery_record(record), started=1)
    plan = plan_recovery({record.delivery_id: started})
    assert plan.reoffer == [] and [d.delivery_id for d, _ in plan.ambiguous] == [record.delivery_id]


@pytest.mark.parametrize(
    ("kind", "started", "idempotent", "reached", "expected"),
    [
        # a wake a dead host started whose text never reached its bot's session never ran: offered again
        # (before, it was ambiguous and lost for good: the bot never learnt the outcome)
        ("wake", 1, False, False, "reoffer"),
        ("wake", 1, False, True, "ambiguous"),  # its text is there: it may have run, never twice
        ("wake", 1, False, None, "ambiguous"),  # no runner hook: cannot tell
        ("wake", 0, False, None, "reoffer"),  # never started
        ("wake", 1, True, None, "reoffer"),  # an idempotent runner re-runs it anyway
        # a DM is never re-offered on the hook's word: its sender is told ambiguous and decides
        ("dm", 1, False, False, "ambiguous"),
        ("dm", 1, False, True, "ambiguous"),
    ],
)
def test_a_started_wake_is_reoffered_only_when_it_provably_never_reached_its_bot(
    kind: str, started: int, idempotent: bool, reached: bool | None, expected: str
) -> None:
    from hermes_actors.core.acks import delivery_record

    request = wake_for(REPLIED, DM, mode="true", runner_is_hermes=False, local_profiles=LOCAL, root=ROOT)
    assert request is not None
    delivery = wake_delivery(request, now=1.0) if kind == "wake" else DM
    asked: list[str] = []

    def never_reached(d: Delivery) -> bool:
        asked.append(d.delivery_id)
        return not reached

    plan = plan_recovery({delivery.delivery_id: DeliveryState(delivery=delivery_record(delivery), started=started)},
                         idempotent_runner=idempotent, never_reached=None if reached is None else never_reached)
    got = ["reoffer" for _ in plan.reoffer] + [o.status for _, o in plan.ambiguous]
    assert got == [expected]
    if expected == "reoffer":
        assert plan.reoffer[0] == delivery and plan.reoffer[0].origin == delivery.origin  # a wake stays a wake
    assert asked == ([delivery.delivery_id] if kind == "wake" and started and not idempotent and reached is not None
                     else [])  # only a started wake's bot is looked at


@pytest.mark.parametrize(
    ("text", "limit", "kept"),
    [
        ("short", 10, "short"),
        ("x" * 10, 10, "x" * 10),  # exactly at the limit: whole
        ("x" * 11, 10, "x" * 10),
        ("é" * 6, 11, "é" * 5),  # 12 bytes: never half a character
    ],
)
def test_wake_text_cuts_past_the_limit_with_a_note(text: str, limit: int, kept: str) -> None:
    out = wake_text(text, "d" * 32, Path("/srv/hermes root"), limit=limit)
    if kept == text:
        assert out == text
    else:
        assert out == (f"{kept}\n\n[cut here: the whole text is {len(text):,} characters; "
                       f"`hermes-actors outcome --root '/srv/hermes root' {'d' * 32}` prints it]")


def test_a_cut_wake_fits_both_hermes_paths_note_included() -> None:
    """The CLI takes 100 KiB on its command line; the API server keeps 65,536 characters and drops the rest
    without a word (the note would be lost): an ASCII reply is the case that needs the lower cap."""
    out = wake_text("Reply from @bob: " + "x" * 200_000, "d" * 32, ROOT)
    assert len(out) <= 65_536 and len(out.encode()) <= 100 * 1024
    assert out.endswith("prints it]")


@pytest.mark.parametrize(("turn_wait", "turn_timeout", "waits"), [(0.0, 600.0, 600.0), (120.0, 600.0, 600.0),
                                                                   (900.0, 600.0, 900.0), (0.0, 1.0, 1.0)])
def test_a_wakes_flock_wait_lasts_as_long_as_a_turn_may_hold_the_flock(
    turn_wait: float, turn_timeout: float, waits: float
) -> None:
    """Nobody resends a wake: it waits for the flock as long as another process's turn may hold it, whatever a
    DM's wait (turn_wait_seconds 0 included), or longer when turn_wait_seconds is."""
    assert wake_lock_wait(turn_wait, turn_timeout) == waits


@pytest.mark.parametrize(("now", "began_at", "left"), [
    (100.0, 95.0, 5.0),     # began 5 s after its start (armed at 90, timeout 10): the rest of its 10 s
    (100.0, 90.0, 0.0),     # began at once: timed out at turn_timeout_seconds, not a flock wait later
    (100.0, None, 20.0),    # still waiting for the flock: until its wait ends (90 + 30)
    (120.0, None, 0.0),     # its wait is over and it never began
    (125.0, 119.0, 4.0),    # got the flock at the end of its wait: the whole timeout from then
])
def test_a_wakes_turn_timer_counts_turn_timeout_from_when_its_turn_began(
    now: float, began_at: float | None, left: float
) -> None:
    """Review (diffrev12): a wake's timer ran its whole flock wait plus turn_timeout_seconds, even for a wake
    that got the flock at once. It has turn_timeout_seconds from when its turn began (here: started at 90,
    turn_timeout 10, flock wait until 120)."""
    assert wake_turn_time_left(now, began_at, 120.0, 10.0) == pytest.approx(left)


@pytest.mark.parametrize(("status", "reason", "retried"), [
    ("failed", "target_busy", True),  # another process held the bot's flock for the whole wait
    ("failed", "runtime_offline", True),
    ("failed", "provider_rate_limit", True),
    ("failed", "provider_server_error", True),
    ("failed", "cancelled", False),  # a stop's: its own rule (journaled, the next start runs it)
    ("failed", "delivery_timeout", False),  # it may have run
    ("failed", "unknown", False),
    ("failed", "context_overflow", False),
    ("ambiguous", "target_busy", False),  # may have run: never twice
    ("ambiguous", "", False),
    ("replied", "", False),
    ("silent", "", False),
])
def test_only_a_wake_that_failed_retryable_and_was_not_cancelled_is_tried_again(
    status: str, reason: str, retried: bool
) -> None:
    assert wake_retryable(status, reason) is retried


_BUSY = ("target_busy: another delivery turn is already running for profile 'a1' — queued behind it for ~41s "
         "without it finishing. The message was NOT delivered; retry shortly.")


@pytest.mark.parametrize(("reason", "error", "says", "never"), [
    # chaos5: a wake attempt refused target_busy logged the DM's text: the wrong holder, ~41s counted from the
    # wake's creation, and "retry shortly" to nobody
    ("target_busy", _BUSY, "turn lock stayed held for the whole wait", ("retry shortly", "~41s", "already running")),
    ("runtime_offline", "hermes is offline; NOT delivered", "hermes is offline; NOT delivered", ()),
    ("provider_rate_limit", "rate limited", "rate limited", ()),
    ("", "", "", ()),
])
def test_a_failed_wake_attempt_is_logged_with_what_holds_it_not_a_dms_resend_advice(
    reason: str, error: str, says: str, never: tuple[str, ...]
) -> None:
    text = wake_failure_text(reason, error)
    assert says in text
    assert not any(words in text for words in never), text


_MAY_HAVE_RUN = ("It is not run again: a wake that may have run never runs twice, so the bot may or may not have this "
                 "outcome in its Bot Chat.")


@pytest.mark.parametrize(("status", "reason", "error", "text"), [
    # acceptance on hermes 0.19: a wake a killed serve had started, its orphaned CLI process finishing it
    ("ambiguous", "unknown", "The gateway stopped or crashed during the turn. The message may have been delivered — "
                             "do not resend.", f"The gateway stopped or crashed during the turn. {_MAY_HAVE_RUN}"),
    ("ambiguous", "runtime_offline", "the connection to the hermes API server at 127.0.0.1:8642 was lost during "
     "@alice's Bot Chat turn (reset). The message may have been delivered — do not resend.",
     f"the connection to the hermes API server at 127.0.0.1:8642 was lost during @alice's Bot Chat turn (reset). "
     f"{_MAY_HAVE_RUN}"),
    ("failed", "delivery_timeout", "The turn of @alice did not finish within 5s; it may still complete, but a later "
                                   "answer is not passed on, so do not resend blindly.",
     f"The turn of @alice did not finish within 5s; it may still complete, but a later answer is not passed on. "
     f"{_MAY_HAVE_RUN}"),
    ("failed", "delivery_timeout", "the turn timed out", f"the turn timed out. {_MAY_HAVE_RUN}"),
    ("ambiguous", "unknown", "", _MAY_HAVE_RUN),
    ("failed", "unknown", "boom", "boom"),  # a plain failure: its own text
], ids=["ambiguous-restart", "ambiguous-warm", "timed-out", "timed-out-bare", "ambiguous-empty", "failed"])
def test_a_wake_that_may_have_run_is_logged_with_a_wakes_words_not_a_dms(
    status: str, reason: str, error: str, text: str
) -> None:
    assert wake_failure_text(reason, error, status) == text


@pytest.mark.parametrize(("status", "reason", "shown"), [
    ("ambiguous", "unknown", "ambiguous"), ("ambiguous", "runtime_offline", "ambiguous"),
    ("failed", "delivery_timeout", "delivery_timeout"), ("failed", "", "failed"), ("cancelled", "", "cancelled"),
])
def test_a_wakes_log_line_names_an_ambiguous_one_so(status: str, reason: str, shown: str) -> None:
    assert wake_result(status, reason) == shown


@pytest.mark.parametrize(("now", "delay"), [
    (1000.0, 5.0),  # failed at once: the shortest wait
    (1003.0, 5.0),
    (1005.0, 5.0),
    (1010.0, 10.0),  # then the time since it was created: it doubles, 5, 10, 20, 40 s after creation
    (1020.0, 20.0),
    (1040.0, 40.0),
    (1080.0, WAKE_RETRY_MOST),  # at most a minute
    (1600.0, WAKE_RETRY_MOST),
    (1880.0, 20.0),  # the last attempt waits at most until the window closes (900 s after creation)
    (1900.0, None),  # the window closed: given up
    (2500.0, None),
])
def test_a_failed_wakes_next_attempt_backs_off_until_its_window_closes(now: float, delay: float | None) -> None:
    assert wake_retry_delay(now, created_at=1000.0, window=900.0, first=5.0) == delay


@pytest.mark.parametrize(("first", "now", "window", "delay"), [
    (120.0, 1000.0, 900.0, 120.0),  # a wake_retry_seconds over a minute is the wait throughout
    (120.0, 1500.0, 900.0, 120.0),
    (0.05, 1000.0, 900.0, 0.05),
    (5.0, 1000.0, 0.0, None),  # reply_wait_seconds 0: never tried again
    (5.0, 999.0, 900.0, 5.0),  # a clock that went back: the shortest wait, never a negative one
])
def test_the_retry_delay_follows_the_settings(first: float, now: float, window: float, delay: float | None) -> None:
    assert wake_retry_delay(now, created_at=1000.0, window=window, first=first) == delay


def test_a_wakes_next_attempt_is_a_wake_of_its_own_with_a_derived_id_and_the_wakes_creation_time() -> None:
    request = wake_for(REPLIED, DM, mode="true", runner_is_hermes=False, local_profiles=LOCAL, root=ROOT)
    assert request is not None
    first = wake_delivery(request, now=12.0)
    second = wake_retry_delivery(first)
    third = wake_retry_delivery(second)
    ids = [DM.delivery_id, first.delivery_id, second.delivery_id, third.delivery_id]
    assert len(set(ids)) == 4  # never the DM's, nor an earlier attempt's
    assert second.delivery_id == wake_retry_id(first.delivery_id) == wake_retry_delivery(first).delivery_id
    assert wake_retry_id(first.delivery_id) != wake_id(first.delivery_id)  # not the wake of a DM of that id
    for attempt in (second, third):
        assert is_wake(attempt) and exempt_from_queue_bounds(attempt)
        assert replace(attempt, delivery_id=first.delivery_id) == first  # the same turn, created at 12.0
        assert delivery_from_record(delivery_record(attempt), attempt.delivery_id) == attempt  # journaled as it is
    plan = plan_recovery({second.delivery_id: DeliveryState(delivery=delivery_record(second))})
    assert plan.reoffer == [second]  # a restart re-offers an attempt that never started, as a wake
    started = DeliveryState(delivery=delivery_record(second), started=1)
    assert plan_recovery({second.delivery_id: started}).reoffer == []  # one that started is never run twice
