"""The scenario registry: adding a benchmark is one decorated function.

    @scenario("relay-roundtrip", "one DM through the file relay, sequential")
    def relay_roundtrip(ctx: BenchContext) -> ScenarioResult:
        ...measure ours (and the baseline, or leave it None)...
        return ScenarioResult(ours=summarize(...), baseline=summarize(...))

A scenario gets a :class:`BenchContext` (mode, count scaling, a private work
directory, the progress bar) and returns metrics dicts built with
:func:`bench.measure.summarize` — or ``ScenarioResult.skip(reason)`` when it
cannot run on this machine. Scenarios run in registration order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.progress import Progress

__all__ = ["REGISTRY", "BenchContext", "Scenario", "ScenarioResult", "scenario"]


@dataclass(frozen=True)
class BenchContext:
    """What a scenario run gets.

    Attributes:
        quick: the ``--quick`` mode (small counts, < 60 s for everything).
        scale: a multiplier on every count (``HERMES_BENCH_TINY=1`` shrinks it for tests).
        workdir: an empty directory private to this scenario (roots go here).
        progress: the progress bar to report to.
        sustained_s: how long the ``sustained`` scenario holds its load (None: its default).
    """

    quick: bool
    scale: float
    workdir: Path
    progress: Progress
    sustained_s: float | None = None

    def count(self, quick: int, full: int, minimum: int = 1) -> int:
        """The count for this mode, scaled, never below ``minimum``."""
        return max(minimum, round((quick if self.quick else full) * self.scale))


@dataclass(frozen=True)
class ScenarioResult:
    """A scenario's metrics: ours always, the baseline when it is modelled.

    ``samples`` holds the raw per-DM latencies in seconds under ``"ours"`` /
    ``"baseline"`` for the CDF plot; they are not written to the JSON.
    ``skipped`` is set (and the metrics are empty) when the scenario could not
    run here, e.g. a missing ``redis-server``: see :meth:`skip`.
    """

    ours: dict[str, Any]
    baseline: dict[str, Any] | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)
    skipped: str | None = None

    @classmethod
    def skip(cls, reason: str) -> ScenarioResult:
        """The result of a scenario that did not run: ``reason`` goes to the table and the JSON."""
        return cls(ours={}, skipped=reason)


ScenarioFn = Callable[[BenchContext], ScenarioResult]


@dataclass(frozen=True)
class Scenario:
    """A registered scenario."""

    name: str
    description: str
    fn: ScenarioFn


REGISTRY: dict[str, Scenario] = {}


def scenario(name: str, description: str) -> Callable[[ScenarioFn], ScenarioFn]:
    """Register ``fn`` as the scenario ``name``.

    Raises:
        ValueError: the name is already registered.
    """

    def register(fn: ScenarioFn) -> ScenarioFn:
        if name in REGISTRY:
            raise ValueError(f"benchmark scenario {name!r} is registered twice")
        REGISTRY[name] = Scenario(name, description, fn)
        return fn

    return register
