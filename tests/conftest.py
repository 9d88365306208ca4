"""Shared fixtures. The library disables its loggers at import; tests enable them
so log lines (refusals, quarantines) can be asserted and show up on failure."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from loguru import logger

import hermes_actors  # noqa: F401  (imports first, so its logger.disable runs before we enable)
from hermes_actors import Gateway

pytest_plugins = ["redis_fixture", "hermes_fixtures"]  # real redis-server; real hermes CLI + fake model


@pytest.fixture(autouse=True)
def _enable_library_logs() -> Iterator[None]:
    logger.enable("hermes_actors")
    logger.enable("actors")
    yield
    logger.disable("hermes_actors")
    logger.disable("actors")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A managed Hermes root with the default profiles of ``tests/roots.py``."""
    from roots import make_root

    return make_root(tmp_path)


@pytest.fixture
def gateways() -> Iterator[list[Gateway]]:
    """Gateways a test started; stopped (newest first) at teardown even when the test failed."""
    started: list[Gateway] = []
    yield started
    for gw in reversed(started):
        gw.stop(timeout=5)


def pytest_configure(config: pytest.Config) -> None:
    logger.remove()
    logger.add(sys.stderr, level="WARNING")

