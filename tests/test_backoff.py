"""The one doubling back-off (core/backoff.py): table tests of its pauses and of its refusals."""

from __future__ import annotations

from itertools import islice

import pytest

from hermes_actors.core.backoff import doubling, pause_after


@pytest.mark.parametrize(("first", "most", "pauses"), [
    (0.01, 0.5, [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.5, 0.5]),
    (0.25, 8.0, [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]),
    (1.0, 1.0, [1.0] * 8),  # a cap equal to the first pause: a constant wait
    (0.001, 0.05, [0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.05, 0.05]),
])
def test_doubling_doubles_from_first_up_to_most(first: float, most: float, pauses: list[float]) -> None:
    assert list(islice(doubling(first, most), len(pauses))) == pytest.approx(pauses)


@pytest.mark.parametrize(("failures", "pause"), [
    (-3, 0.01), (0, 0.01), (1, 0.01), (2, 0.02), (3, 0.04), (6, 0.32), (7, 0.5), (10**9, 0.5),
])
def test_pause_after_is_the_nth_pause_never_zero_and_bounded(failures: int, pause: float) -> None:
    assert pause_after(failures, 0.01, 0.5) == pytest.approx(pause)


def test_pause_after_agrees_with_doubling() -> None:
    pauses = list(islice(doubling(0.05, 3.0), 12))
    assert [pause_after(n, 0.05, 3.0) for n in range(1, 13)] == pytest.approx(pauses)


@pytest.mark.parametrize(("first", "most", "named"), [
    (0.0, 1.0, "first pause must be positive, not 0.0"),
    (-1.0, 1.0, "first pause must be positive, not -1.0"),
    (float("nan"), 1.0, "first pause must be positive, not nan"),
    (2.0, 1.0, "longest pause (1.0) must be at least its first (2.0)"),
])
def test_a_back_off_that_would_spin_or_shrink_is_refused_by_name(first: float, most: float, named: str) -> None:
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        doubling(first, most)
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        pause_after(1, first, most)
