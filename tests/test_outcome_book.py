"""The Dispatcher's OutcomeBook: each delivery id in exactly one state, waiters answered once."""

from __future__ import annotations

from typing import Any

import pykka
import pytest

from hermes_actors.local.outcome_book import Answers, DeliveryState, OutcomeBook, Pending, answer, unpack_outcome
from hermes_actors.messages import Delivery

KEY = "a" * 32


def _entry(key: str = KEY, *, journaled: bool = False) -> Pending:
    return Pending(Delivery(key, "alice", "alice", "bob", "bob", "hi", label="@bob"), "local", journaled=journaled)


def _record(status: str = "replied") -> dict[str, str]:
    return {"delivery_id": KEY, "status": status}


def test_the_states_of_one_delivery_in_order() -> None:
    book = OutcomeBook()
    assert book.state(KEY) is DeliveryState.UNKNOWN
    book.add(KEY, _entry())
    assert book.state(KEY) is DeliveryState.PENDING and book.pending_count() == 1
    book.journaling(KEY, _record())
    assert book.state(KEY) is DeliveryState.JOURNALING and book.has_outcome(KEY) and book.pending_count() == 0
    assert book.settle(KEY, _record()) is None  # its pending entry left when it started journaling
    assert book.state(KEY) is DeliveryState.SETTLED and book.record(KEY) == _record()


def test_settle_hands_back_a_pending_entry_still_held() -> None:
    book = OutcomeBook()
    entry = _entry()
    book.add(KEY, entry)
    assert book.settle(KEY, _record()) is entry
    assert book.entry(KEY) is None


def _book_with(setup: str) -> OutcomeBook:
    """A book holding ``KEY`` in the state ``setup`` names: pending, journaling or settled."""
    book = OutcomeBook()
    book.add(KEY, _entry())
    if setup in ("journaling", "settled"):
        book.journaling(KEY, _record())
    if setup == "settled":
        book.settle(KEY, _record())
    return book


@pytest.mark.parametrize(
    ("setup", "answered_at_once"),
    [
        ("pending", False),
        ("journaling", False),  # the outcome exists but is not durable yet: the waiter waits for it
        ("settled", True),
    ],
)
def test_a_waiter_gets_the_outcome_only_once_it_is_published(setup: str, answered_at_once: bool) -> None:
    book = _book_with(setup)
    future: pykka.ThreadingFuture[dict[str, Any]] = pykka.ThreadingFuture()
    book.wait(KEY, future)
    if answered_at_once:
        assert future.get(timeout=0) == _record()
        return
    with pytest.raises(pykka.Timeout):
        future.get(timeout=0)
    book.settle(KEY, _record("failed"))
    assert future.get(timeout=0) == _record("failed")


def test_waiting_for_an_unknown_id_is_a_key_error_naming_it() -> None:
    with pytest.raises(KeyError, match=KEY):
        OutcomeBook().wait(KEY, pykka.ThreadingFuture())


@pytest.mark.parametrize(("setup", "published"), [("pending", False), ("journaling", False), ("settled", True)])
def test_published_is_the_outcome_once_it_is_settled_and_none_before(setup: str, published: bool) -> None:
    book = _book_with(setup)
    assert book.published(KEY) == (_record() if published else None)
    with pytest.raises(KeyError, match="b" * 32):
        book.published("b" * 32)


def test_settle_can_leave_the_waiters_answers_to_its_caller() -> None:
    book = OutcomeBook()
    book.add(KEY, _entry())
    future: pykka.ThreadingFuture[dict[str, Any]] = pykka.ThreadingFuture()
    book.wait(KEY, future)
    answers: Answers = []
    book.settle(KEY, _record(), answers)
    assert book.state(KEY) is DeliveryState.SETTLED
    with pytest.raises(pykka.Timeout):
        future.get(timeout=0)  # not yet: the caller answers once it has written what comes first
    answer(answers)
    assert future.get(timeout=0) == _record()


def test_the_oldest_settled_outcomes_are_forgotten_beyond_keep() -> None:
    book = OutcomeBook(keep=2)
    keys = [c * 32 for c in "abc"]
    for key in keys:
        book.settle(key, {"delivery_id": key})
    assert [book.state(k) for k in keys] == [DeliveryState.UNKNOWN, DeliveryState.SETTLED, DeliveryState.SETTLED]


def test_export_holds_the_published_outcomes_only_and_remember_never_overrides_a_live_one() -> None:
    book = OutcomeBook()
    book.add("b" * 32, _entry("b" * 32))
    book.journaling(KEY, _record())  # its record is not on disk yet: unpublished, not handed over
    book.settle("c" * 32, {"delivery_id": "c" * 32})
    book.remember({"b" * 32: {"status": "old"}, "d" * 32: {"status": "old"}})
    assert set(book.export()) == {"c" * 32, "d" * 32}
    assert book.state("b" * 32) is DeliveryState.PENDING


def test_a_journaling_outcome_keeps_its_delivery_until_it_is_published() -> None:
    book = OutcomeBook()
    entry = _entry(journaled=True)
    book.add(KEY, entry)
    assert book.delivery(KEY) is entry.delivery
    book.journaling(KEY, _record(), entry.delivery)  # the subscribers' details still name its sender
    assert book.delivery(KEY) is entry.delivery and book.record(KEY) == _record()
    book.settle(KEY, _record())
    assert book.delivery(KEY) is None
    assert {key: unpack_outcome(key, kept) for key, kept in book.export().items()} == {KEY: _record()}


class GatewayStopped(Exception):
    pass


@pytest.mark.parametrize("deferred", [False, True], ids=["settled-inline", "answered-after-the-commit"])
def test_a_waiter_its_stopped_gateway_answered_already_does_not_crash_the_settling(deferred: bool) -> None:
    """OutcomeWaits.end (facade/outcomes.py) answers its waiters' futures at stop; a Dispatcher still running
    after a stop that was not clean then settles the DM: the second answer is dropped, and the other waiters still
    get theirs."""
    book = _book_with("pending")
    answered, other = pykka.ThreadingFuture[dict[str, Any]](), pykka.ThreadingFuture[dict[str, Any]]()
    book.wait(KEY, answered)
    book.wait(KEY, other)
    answered.set_exception(exc_info=(GatewayStopped, GatewayStopped(), None))
    answers: Answers = []
    book.settle(KEY, _record(), answers if deferred else None)
    answer(answers)
    with pytest.raises(GatewayStopped):
        answered.get(timeout=0)
    assert other.get(timeout=0) == _record()
