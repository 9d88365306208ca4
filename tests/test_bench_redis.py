"""The Redis benchmark scenario's skip path, and docs regeneration only on a full run of every scenario."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.scenarios.redis_roundtrip as redis_scenario
from bench.harness import run_bench
from bench.registry import REGISTRY
from bench.report import render_markdown, render_table


def test_redis_roundtrip_is_registered() -> None:
    assert "redis-roundtrip" in REGISTRY


def test_without_redis_server_the_scenario_is_skipped_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(redis_scenario, "redis_binary", lambda: None)
    result = run_bench(True, ["redis-roundtrip"], tmp_path / "out", progress=False, docs_dir=tmp_path / "docs")
    entry = result["scenarios"]["redis-roundtrip"]
    assert entry["ours"] is None and entry["baseline"] is None and entry["ratio"] is None
    assert "redis-server is not installed" in entry["skipped"]
    on_disk = json.loads(next((tmp_path / "out").glob("*.json")).read_text(encoding="utf-8"))
    assert on_disk == result
    table = render_table(result)
    assert "redis-roundtrip: skipped — redis-server is not installed" in table
    assert "skipped" in capsys.readouterr().out
    assert "redis-roundtrip: skipped" in render_markdown(result)


def test_a_full_mode_run_of_some_scenarios_does_not_rewrite_the_docs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HERMES_BENCH_TINY", "1")
    docs = tmp_path / "docs"
    run_bench(False, ["local-roundtrip"], tmp_path / "out", progress=False, docs_dir=docs)
    assert not docs.exists()
