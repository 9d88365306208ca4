"""The settled-outcome table: compact, bounded, and every read an equal outcome dict.

The Dispatcher remembers up to ``SETTLED_KEEP`` settled outcomes for
``wait_outcome``; they are stored packed (``pack_outcome``) and rebuilt on read
(``unpack_outcome``), so what a reader gets must be the very dict that was
settled: same keys in the same order, same values and types.
"""

from __future__ import annotations

import inspect
import sys
import typing
from collections.abc import Callable
from typing import Any

import pykka
import pytest

from hermes_actors.core import outcomes
from hermes_actors.facade.outcomes import OutcomeWaits
from hermes_actors.local.outcome_book import (
    COMPRESS_OVER,
    GENERATIONS,
    KeptOutcomes,
    OutcomeBook,
    SettledOutcomes,
    pack_outcome,
    unpack_outcome,
)

KEY = "a" * 32

OUTCOMES = {
    "replied": outcomes.from_reply(KEY, "@bob", "pong"),
    "silent": outcomes.from_reply(KEY, "@bob", ""),
    "failed": outcomes.failed(KEY, "@bob", "No agent 'bob'.", "unknown"),
    "ambiguous": outcomes.ambiguous(KEY, "@bob", "The turn process died."),
    "cancelled": outcomes.cancelled(KEY, "@bob"),
    "unicode": outcomes.from_reply(KEY, "@bøb", "héllo 🌍 \x00 \ud800 end"),
}


def _key(i: int) -> str:
    return f"{i:032x}"


@pytest.mark.parametrize("kind", sorted(OUTCOMES))
def test_every_kind_of_outcome_comes_back_as_an_equal_dict_in_the_same_key_order(kind: str) -> None:
    record = OUTCOMES[kind].as_dict()
    packed = pack_outcome(KEY, record)
    assert isinstance(packed, bytes)
    back = unpack_outcome(KEY, packed)
    assert list(back.items()) == list(record.items())
    assert type(back["retryable"]) is bool


def test_a_packed_outcome_is_smaller_than_its_text_and_leaves_the_delivery_id_out() -> None:
    packed = pack_outcome(KEY, OUTCOMES["replied"].as_dict())
    assert isinstance(packed, bytes) and KEY.encode() not in packed
    assert len(packed) < len(OUTCOMES["replied"].text) + 40


def test_a_long_reply_is_stored_compressed_and_comes_back_whole() -> None:
    reply = "the same long paragraph again. " * 200
    record = outcomes.from_reply(KEY, "@bob", reply).as_dict()
    packed = pack_outcome(KEY, record)
    assert isinstance(packed, bytes) and len(packed) < COMPRESS_OVER < len(reply)
    assert unpack_outcome(KEY, packed) == record


@pytest.mark.parametrize("record", [
    {"status": "old"},  # remembered from a journal: any shape
    {**OUTCOMES["replied"].as_dict(), "delivery_id": "b" * 32},  # stored under another id
    {"status": "replied", "delivery_id": KEY, "reply": "x", "error": "", "reason": "", "retryable": False,
     "from": "@bob", "text": "t"},  # the outcome's keys in another order
    {"delivery_id": KEY, "status": "failed", "nested": {"n": [1, 2.5, None, True]}},
])
def test_any_other_dict_comes_back_equal_with_its_own_keys(record: dict[str, Any]) -> None:
    back = unpack_outcome(KEY, pack_outcome(KEY, record))
    assert list(back.items()) == list(record.items())


def test_a_dict_marshal_cannot_store_is_kept_as_it_is() -> None:
    record = {"delivery_id": KEY, "status": "replied", "odd": object()}
    assert pack_outcome(KEY, record) is record
    assert unpack_outcome(KEY, record) is record


def test_every_read_is_a_new_dict_so_a_reader_cannot_change_the_next_readers_outcome() -> None:
    book = OutcomeBook()
    record = OUTCOMES["replied"].as_dict()
    book.settle(KEY, dict(record))
    first = book.record(KEY)
    assert first == record
    first["reply"] = "changed by a reader"
    assert book.record(KEY) == record
    future: pykka.ThreadingFuture[dict[str, Any]] = pykka.ThreadingFuture()
    book.wait(KEY, future)
    assert future.get(timeout=0) == record
    stopped = OutcomeWaits()  # what a stopped gateway reads
    stopped.keep(book.export(), replace=True)
    kept = stopped.final(KEY)
    assert kept == record
    kept["reply"] = "changed by a reader"
    assert stopped.final(KEY) == record


def test_a_stopping_gateway_gets_the_outcomes_as_stored_and_rebuilds_only_the_one_asked_for() -> None:
    """Regression (soak review): export() rebuilt every settled outcome into a plain dict at once, each long reply
    held twice (``reply`` and ``text``): 832 MB in a stopped gateway whose Dispatcher held them in 61 MB."""
    book = OutcomeBook()
    reply = "the same long paragraph again. " * 2000
    long_one = outcomes.from_reply(KEY, "@bob", reply).as_dict()
    odd = {"delivery_id": "b" * 32, "status": "replied", "odd": object()}  # marshal cannot pack it
    book.settle(KEY, dict(long_one))
    book.settle("b" * 32, odd)
    exported = book.export()
    assert isinstance(exported[KEY], bytes) and len(exported[KEY]) < len(reply) // 20  # packed, compressed
    stopped = OutcomeWaits()
    stopped.keep(exported, replace=True)
    assert stopped.final(KEY) == long_one
    kept_odd = stopped.final("b" * 32)
    assert kept_odd == odd and kept_odd is not odd  # kept as its dict, read as a copy


def _annotation(function: Any, name: str) -> Any:
    """``function``'s annotation of ``name`` ("return" for its result), evaluated in its module (whose names only a
    type checker imports, the ``TYPE_CHECKING`` ones, are not evaluated)."""
    signature = inspect.signature(function)
    text = signature.return_annotation if name == "return" else signature.parameters[name].annotation
    return eval(text, vars(sys.modules[function.__module__]))


def test_the_outcomes_handed_over_at_stop_are_typed_as_what_export_returns() -> None:
    """Regression (review): the outcomes a stopping or failed Dispatcher hands over (``OutcomeBook.export``: packed,
    bytes or a dict marshal cannot dump) were annotated ``dict[str, dict[str, Any]]`` on their way (the stop in
    ``facade.shutdown`` and ``system``, the failure hooks in ``facade.failure`` and ``system``): every one names
    the same type, the alias ``KeptOutcomes``, that ``export`` returns."""
    from hermes_actors.facade.failure import DispatcherFailure
    from hermes_actors.facade.shutdown import Stopped, shut_down
    from hermes_actors.system import ActorSystem

    packed = dict[str, bytes | dict[str, Any]]
    assert KeptOutcomes == packed
    assert _annotation(OutcomeBook.export, "return") == packed
    assert _annotation(shut_down, "return") is Stopped  # the outcomes, and an interrupt a stop callback raised
    assert typing.get_type_hints(Stopped)["final"] == packed
    assert _annotation(ActorSystem.shut_down, "return") is Stopped
    assert _annotation(DispatcherFailure.failed_with, "final") == packed
    assert _annotation(ActorSystem.start, "on_failure") == Callable[[BaseException | None, packed], None] | None


def test_the_table_stays_bounded_after_many_times_keep_outcomes_and_keeps_the_newest() -> None:
    keep = 80
    table = SettledOutcomes(keep)
    total = 20 * keep
    for i in range(total):
        table.put(_key(i), {"delivery_id": _key(i), "status": "replied"})
    assert keep <= len(table) <= keep + keep // GENERATIONS
    assert all(_key(i) in table for i in range(total - keep, total))  # the newest keep are all there
    assert not any(_key(i) in table for i in range(total - 2 * keep))  # the old ones are gone
    assert len(dict(table.items())) == len(table)
    assert [key for key, _ in table.items()] == [_key(i) for i in range(total - len(table), total)]  # oldest first


def test_a_rewritten_outcome_reads_as_its_newest_and_is_counted_once() -> None:
    table = SettledOutcomes(16)
    table.put(KEY, {"status": "first"})
    table.put(KEY, {"status": "second"})  # same generation
    assert len(table) == 1 and table.get(KEY) == {"status": "second"}
    for i in range(5):
        table.put(_key(i + 1), {"status": "filler"})  # KEY's generation (2 entries each) is sealed
    table.put(KEY, {"status": "third"})  # a later generation
    assert table.get(KEY) == {"status": "third"} and dict(table.items())[KEY] == {"status": "third"}


def test_outcomes_remembered_from_a_journal_are_bounded_by_keep_too() -> None:
    book = OutcomeBook(keep=8)
    book.remember({_key(i): {"status": "old"} for i in range(100)})
    kept = book.export()
    assert 8 <= len(kept) <= 9 and _key(99) in kept and _key(0) not in kept


@pytest.mark.parametrize("made", [
    outcomes.from_reply("e" * 32, "@bob", "hello"),
    outcomes.from_reply("e" * 32, "@bob", ""),
    outcomes.failed("e" * 32, "@bob", "HTTP 429 Too Many Requests", "provider_rate_limit"),
    outcomes.ambiguous("e" * 32, "@bob", "The receiving gateway stopped or crashed during the turn."),
], ids=["replied", "silent", "failed", "ambiguous"])
def test_an_outcome_crosses_the_file_relay_with_its_status(made: Any) -> None:
    """Regression: an ambiguous turn on the receiving side arrived as failed [unknown] (the seed's reply
    format has no status field)."""
    from hermes_actors.relay.relay_actor import reply_from_outcome

    record = reply_from_outcome(made)
    assert set(record) == {"reply", "error", "reason"}  # the seed's format: nothing added
    back = outcomes.from_relay_reply(made.delivery_id, "@bob on mini", record["reply"], record["error"],
                                     record["reason"])
    assert (back.status, back.reason, back.retryable) == (made.status, made.reason, made.retryable)
    assert back.error == made.error and back.text == made.text.replace("@bob", "@bob on mini", 1)


def test_a_redis_reply_marked_ambiguous_stays_ambiguous() -> None:
    back = outcomes.from_relay_reply("e" * 32, "@dave on mini", "", "The gateway died before it replied.",
                                     "ambiguous")
    assert (back.status, back.reason, back.retryable) == ("ambiguous", "unknown", False)


@pytest.mark.parametrize(
    ("text", "cut"),
    [("é" * 100, False), ("é" * 101, True), ("x" * 201, True), ("🙂" * 60, True), ("", False)],
)
def test_a_text_past_the_outcome_limit_is_cut_with_a_note_within_the_limit(text: str, cut: bool) -> None:
    out = outcomes.cut_text(text, limit=200)
    assert (out != text) is cut
    assert len(out.encode()) <= 200
    assert outcomes.cut_text(out, limit=200) == out, "cutting twice changes nothing"
    if cut:
        kept, _, note = out.partition("\n\n")
        assert text.startswith(kept) and kept  # whole characters only, never half of one
        assert note == f"[cut here: the text was {len(text)} characters; an outcome carries at most 200 bytes]"


def test_every_outcome_text_is_bounded_reply_and_error_alike() -> None:
    huge = "y" * (outcomes.TEXT_MAX_BYTES + 10)
    replied = outcomes.from_reply(KEY, "@bob", huge).as_dict()
    failed = outcomes.failed(KEY, "@bob", huge, "unknown").as_dict()
    unclear = outcomes.ambiguous(KEY, "@bob", huge).as_dict()
    assert len(replied["reply"].encode()) <= outcomes.TEXT_MAX_BYTES
    for made in (replied, failed, unclear):
        assert len(made["text"].encode()) <= outcomes.TEXT_MAX_BYTES + 200  # the label and the framing words
        assert len(made["error"].encode()) <= outcomes.TEXT_MAX_BYTES + 200


def test_a_huge_ambiguous_error_stays_ambiguous_across_the_file_relay() -> None:
    """Regression: the tail "do not resend" was added after the cut, so the relay's own cut took it off and the
    sender read a plain failure."""
    from hermes_actors.store.relay_protocol import make_reply

    unclear = outcomes.ambiguous(KEY, "@dave on mini", "z" * (outcomes.TEXT_MAX_BYTES + 10))
    assert len(unclear.error.encode()) <= outcomes.TEXT_MAX_BYTES and unclear.error.endswith(outcomes.AMBIGUOUS_TAIL)
    reply = make_reply(KEY, error=unclear.error, reason=unclear.reason, now=1.0)
    back = outcomes.from_relay_reply(KEY, "@dave on mini", reply["reply"], reply["error"], reply["reason"])
    assert back.status == "ambiguous" and back.retryable is False


@pytest.mark.parametrize(("why", "sentence"), [
    ("lost (Remote end closed connection without response)", "lost (Remote end closed connection without response)."),
    ("The turn was still running when the gateway stopped.", "The turn was still running when the gateway stopped."),
    ("did it run?", "did it run?"),
    ("it stopped!", "it stopped!"),
    ("it was cut…", "it was cut…"),
    ("(the gateway stopped.)", "(the gateway stopped.)"),
    ('hermes said "stopped."', 'hermes said "stopped."'),
    ("timed out after 5s ", "timed out after 5s."),
    ("version 1.2", "version 1.2."),
    ("", ""),
    ("  ", ""),
])
def test_as_sentence_adds_a_full_stop_only_where_none_ends_the_text(why: str, sentence: str) -> None:
    assert outcomes.as_sentence(why) == sentence
    assert outcomes.as_sentence(sentence) == sentence, "a sentence stays as it is"


def test_an_ambiguous_why_without_a_full_stop_and_the_tail_read_as_two_sentences() -> None:
    """Regression (acceptance on hermes 0.19): a warm turn cut off by Ctrl-C of `hermes gateway run` was reported
    "… (Remote end closed connection without response) The message may have been delivered — do not resend."."""
    why = ("the connection to the hermes API server at 127.0.0.1:8642 was lost during @bob's Bot Chat turn "
           "(Remote end closed connection without response)")
    made = outcomes.ambiguous(KEY, "@bob", why, "runtime_offline")
    assert made.error == f"{why}. The message may have been delivered — do not resend."
    assert made.text == f"Delivery to @bob is ambiguous: {made.error}"
    stopped = outcomes.ambiguous(KEY, "@bob", "The gateway stopped or crashed during the turn.")
    assert stopped.error == ("The gateway stopped or crashed during the turn. The message may have been delivered — "
                             "do not resend.")
