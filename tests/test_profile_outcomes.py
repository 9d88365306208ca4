"""Table tests of the ProfileActor's pure outcome decisions (``local/profile_outcomes.py``)."""

from __future__ import annotations

import pytest

from hermes_actors.local.profile_outcomes import kept_at_stop, timed_out_outcome
from hermes_actors.messages import ROOM_ORIGIN, Delivery
from hermes_actors.records import Origin


def _delivery(origin: Origin = "local") -> Delivery:
    return Delivery("d" * 32, "alice", "alice", "bob", "bob", "hi", origin=origin, label="@bob")


@pytest.mark.parametrize(
    ("origin", "keep_journaled", "kept"),
    [
        ("local", True, True),
        ("wake", True, True),
        ("local", False, False),
        ("relay", True, False),  # not in this root's journal: its relay keeps the envelope
        (ROOM_ORIGIN, True, False),  # the room's file records it
    ],
)
def test_kept_at_stop(origin: Origin, keep_journaled: bool, kept: bool) -> None:
    assert kept_at_stop(_delivery(origin), keep_journaled=keep_journaled) is kept


@pytest.mark.parametrize(
    ("began", "live", "reason", "words"),
    [
        (True, True, "delivery_timeout", "was stopped; it may have been partly done"),
        # a warm or in-process turn goes on, yet what it answers then is dropped: the text must not promise it
        (True, False, "delivery_timeout", "it may still complete, but a later answer is not passed on, so do not"),
        (False, False, "target_busy", "bob"),
        (False, True, "target_busy", "bob"),  # never began: no process of it can be live
    ],
)
def test_timed_out_outcome(began: bool, live: bool, reason: str, words: str) -> None:
    outcome = timed_out_outcome(_delivery(), profile="bob", seconds=1.5, began=began, live=live)
    assert (outcome.status, outcome.reason) == ("failed", reason)
    assert words in outcome.error
    if began:
        assert "1.5s" in outcome.error and "do not resend blindly" in outcome.error
