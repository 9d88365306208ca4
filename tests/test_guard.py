"""Table tests of the conversation guard's pure checks (``core/guard.py``, DESIGN 4.5): the hop limit, the
per-pair rate over the last minute (and its window's edge), and the unordered pair."""

from __future__ import annotations

from collections import deque

import pytest

from hermes_actors.core.guard import PAIR_WINDOW_SECONDS, check_hops, check_pair_rate, pair_key
from hermes_actors.core.reasons import LOOP_GUARD


@pytest.mark.parametrize(
    ("hop", "max_hops", "refused"),
    [
        (1, 8, False),
        (8, 8, False),  # the last hop allowed
        (9, 8, True),  # one past the limit
        (2, 1, True),
        (10**6, 0, False),  # 0: no limit
        (10**6, -1, False),
    ],
)
def test_check_hops(hop: int, max_hops: int, refused: bool) -> None:
    refusal = check_hops(hop, max_hops)
    assert (refusal is not None) == refused
    if refusal is not None:
        assert refusal.reason == LOOP_GUARD
        assert f"hop {hop} of a bot-to-bot chain (limit {max_hops})" in refusal.error
        assert "NOT sent" in refusal.error


NOW = 1000.0


@pytest.mark.parametrize(
    ("ages", "limit", "hop", "refused", "kept"),
    [
        ([1.0] * 29, 30, 2, False, 29),  # one below the limit
        ([1.0] * 30, 30, 2, True, 30),  # at the limit, from inside a turn
        ([1.0] * 30, 30, 5, True, 30),
        ([1.0] * 30, 30, 1, False, 30),  # hop 1: a person or program driving the gateway is not rate-limited
        ([1.0] * 30, 0, 2, False, 30),  # 0: no limit
        ([PAIR_WINDOW_SECONDS] * 30, 30, 2, True, 30),  # exactly a minute old: still in the window
        ([PAIR_WINDOW_SECONDS + 0.001] * 30, 30, 2, False, 0),  # just older: trimmed, so not counted
        ([PAIR_WINDOW_SECONDS + 1] * 10 + [1.0] * 20, 30, 2, False, 20),  # the old ones are trimmed, oldest first
        ([PAIR_WINDOW_SECONDS + 1] * 30, 30, 1, False, 0),  # trimmed whatever the hop (the caller then appends)
    ],
)
def test_check_pair_rate(ages: list[float], limit: int, hop: int, refused: bool, kept: int) -> None:
    history = deque(NOW - age for age in ages)
    refusal = check_pair_rate(history, NOW, limit, hop)
    assert (refusal is not None) == refused
    assert len(history) == kept, "the history keeps the last minute's sends, and only those"
    assert all(NOW - t <= PAIR_WINDOW_SECONDS for t in history)
    if refusal is not None:
        assert refusal.reason == LOOP_GUARD
        assert f"exchanged {kept} DMs in the last minute (limit {limit})" in refusal.error
        assert "NOT sent" in refusal.error


@pytest.mark.parametrize(("a", "b"), [("alice", "bob"), ("bob", "alice"), ("bob", "bob")])
def test_pair_key_is_the_same_both_ways(a: str, b: str) -> None:
    assert pair_key(a, b) == pair_key(b, a) == tuple(sorted((a, b)))
