"""Fixtures for tests against the real hermes-agent CLI and the fake model (tests/fake_model.py).

The CLI is found via ``HERMES_ACTORS_HERMES_CLI``, then ``<sys.prefix>/bin/hermes``,
then PATH; tests that need it skip with the reason when none is found.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fake_model import FakeModel, hermes_env, make_offline_root


def locate_hermes_cli() -> str | None:
    """The hermes CLI for tests, or None."""
    explicit = os.environ.get("HERMES_ACTORS_HERMES_CLI")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    sibling = Path(sys.prefix) / "bin" / "hermes"
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    return shutil.which("hermes")


@pytest.fixture(scope="session")
def hermes_cli() -> str:
    """The real hermes CLI (skips the test when none is installed)."""
    found = locate_hermes_cli()
    if found is None:
        pytest.skip("no hermes CLI: set HERMES_ACTORS_HERMES_CLI or install hermes-actors[hermes]")
    return found


@pytest.fixture
def fake_model() -> Iterator[FakeModel]:
    """A started fake model (default script: ``fake reply to: <text>``)."""
    model = FakeModel().start()
    yield model
    model.stop()


@dataclass
class OfflineRoot:
    """An offline hermes root with alice and bob, and the environment to run hermes in it."""

    root: Path
    env: dict[str, str]

    def home(self, profile: str) -> Path:
        return self.root if profile == "default" else self.root / "profiles" / profile


@pytest.fixture
def offline_root(tmp_path: Path, fake_model: FakeModel) -> OfflineRoot:
    """A hermes root pointing at ``fake_model`` with profiles alice and bob."""
    root = make_offline_root(tmp_path / "hermes", fake_model.base_url, ["alice", "bob"])
    scratch_home = tmp_path / "home"
    scratch_home.mkdir()
    return OfflineRoot(root, hermes_env(root, scratch_home))


def bot_chat_messages(home: Path, *, active_only: bool = False) -> list[tuple[str, str]]:
    """(role, content) of the Bot Chat's messages; ``active_only`` leaves out the rewound (soft-deleted) ones."""
    conn = sqlite3.connect(home / "state.db")
    try:
        return [(str(role), str(content)) for role, content in conn.execute(
            "SELECT m.role, m.content FROM messages m JOIN sessions s ON s.id = m.session_id "
            "WHERE s.title = 'Bot Chat'" + (" AND m.active = 1" if active_only else "") + " ORDER BY m.id")]
    finally:
        conn.close()
