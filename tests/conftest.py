"""Shared fixtures. The library disables its loggers at import; tests enable them
so log lines (refusals, quarantines) can be asserted and show up on failure."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
from loguru import logger
from roots import LogCapture

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
def logs() -> Iterator[LogCapture]:
    """Log lines at WARNING and above during the test (``logs.lines``, ``logs.matching(...)``)."""
    with LogCapture("WARNING") as capture:
        yield capture


@pytest.fixture
def warnings(logs: LogCapture) -> list[str]:
    """The text of every log line at WARNING and above during the test (a live list)."""
    return logs.lines


@pytest.fixture
def log_records() -> Iterator[list[Any]]:
    """Every loguru record (a dict: ``r["message"]``, ``r["level"]``) at DEBUG and above during the test."""
    with LogCapture("DEBUG") as capture:
        yield capture.records


@pytest.fixture
def stop_all_actors() -> Iterator[None]:
    """Stop every pykka actor still running after the test (the actors/ tests start bare actors)."""
    yield
    pykka.ActorRegistry.stop_all(timeout=5)


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

