"""Shared fixtures. The library disables its loggers at import; tests enable them
so log lines (refusals, quarantines) can be asserted and show up on failure."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from loguru import logger

import hermes_actors  # noqa: F401  (imports first, so its logger.disable runs before we enable)


@pytest.fixture(autouse=True)
def _enable_library_logs() -> Iterator[None]:
    logger.enable("hermes_actors")
    logger.enable("actors")
    yield
    logger.disable("hermes_actors")
    logger.disable("actors")


def pytest_configure(config: pytest.Config) -> None:
    logger.remove()
    logger.add(sys.stderr, level="WARNING")


from redis_fixture import redis_server  # noqa: E402, F401  (the real redis-server fixture for tests/test_redis_*.py)
