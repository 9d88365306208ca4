"""Smoke test of the benchmark harness: it runs, and its result file is complete.

Tiny counts (``HERMES_BENCH_TINY=1``); no timing assertions — the numbers of a
loaded CI machine mean nothing, only the shape of the output is checked.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bench.baseline import wait_reply_file
from bench.harness import main, run_bench
from bench.registry import REGISTRY
from bench.report import render_markdown, render_table, write_docs

METRIC_KEYS = {"n", "throughput_per_s", "p50_ms", "p95_ms", "p99_ms", "max_ms"}


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _check_metrics(metrics: dict[str, Any]) -> None:
    assert set(metrics) >= METRIC_KEYS, metrics
    for key in METRIC_KEYS:
        assert _positive(metrics[key]), (key, metrics[key])
    assert isinstance(metrics["n"], int)
    assert metrics["p50_ms"] <= metrics["p95_ms"] <= metrics["p99_ms"] <= metrics["max_ms"]


def test_quick_local_roundtrip_writes_a_complete_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HERMES_BENCH_TINY", "1")
    docs = tmp_path / "docs"
    result = run_bench(True, ["local-roundtrip"], tmp_path / "out", progress=False, docs_dir=docs)

    files = sorted((tmp_path / "out").glob("*.json"))
    assert len(files) == 1
    assert files[0].stem.endswith("Z")
    on_disk = json.loads(files[0].read_text(encoding="utf-8"))
    assert on_disk == result
    assert set(on_disk) == {"machine", "scenarios"}

    machine = on_disk["machine"]
    for key in ("cpu_count", "platform", "python", "pykka", "watchdog", "orjson"):
        assert machine.get(key), key
    assert "hostname" not in machine and "node" not in machine

    assert set(on_disk["scenarios"]) == {"local-roundtrip"}
    entry = on_disk["scenarios"]["local-roundtrip"]
    assert set(entry) == {"ours", "baseline", "ratio"}
    _check_metrics(entry["ours"])
    _check_metrics(entry["baseline"])
    assert set(entry["ratio"]) == {"p50", "throughput"}
    assert all(_positive(v) for v in entry["ratio"].values())

    assert "local-roundtrip" in capsys.readouterr().out  # the table was printed
    assert not docs.exists()  # a --quick run never rewrites docs/benchmarks.md


def test_cli_entry_accepts_the_documented_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMES_BENCH_TINY", "1")
    assert main(["--quick", "--scenario", "local-roundtrip", "--out", str(tmp_path), "--no-progress"]) == 0
    assert len(list(tmp_path.glob("*.json"))) == 1
    with pytest.raises(SystemExit):
        main(["--scenario", "no-such-scenario", "--out", str(tmp_path)])


def test_registry_lists_the_local_scenarios() -> None:
    assert {"local-roundtrip", "local-throughput", "fan-in", "scale"} <= set(REGISTRY)


def test_report_renders_markdown_and_docs(tmp_path: Path) -> None:
    metrics = {"n": 10, "throughput_per_s": 5.0, "p50_ms": 1.0, "p95_ms": 2.0, "p99_ms": 3.0, "max_ms": 4.0}
    result = {
        "machine": {"cpu_count": 2, "python": "3.11"},
        "scenarios": {
            "local-roundtrip": {"ours": metrics, "baseline": metrics, "ratio": {"p50": 1.0, "throughput": 1.0}},
            "scale": {"ours": {**metrics, "rss_mb": 50.0, "threads": 9}, "baseline": None, "ratio": None},
        },
    }
    assert "scale" in render_table(result) and "peak RSS" in render_table(result)
    page = render_markdown(result)
    assert "| local-roundtrip |" in page and "benchmarks.png" in page and "side by side" in page
    plot = tmp_path / "plot.png"
    plot.write_bytes(b"\x89PNG")
    written = write_docs(result, plot, tmp_path / "docs")
    assert written.read_text(encoding="utf-8").startswith("# Benchmarks")
    assert (tmp_path / "docs" / "benchmarks.png").read_bytes() == b"\x89PNG"


def test_baseline_reply_waiter_polls_the_reply_file(tmp_path: Path) -> None:
    reply = tmp_path / "replies" / ("a" * 32 + ".json")
    reply.parent.mkdir()
    assert wait_reply_file(reply, 0.01) is None

    def write_later() -> None:
        time.sleep(0.05)
        reply.write_text(json.dumps({"id": "a" * 32, "reply": "ok"}), encoding="utf-8")

    writer = threading.Thread(target=write_later)
    writer.start()
    assert wait_reply_file(reply, 5) == {"id": "a" * 32, "reply": "ok"}
    writer.join()


def test_the_polling_room_model_follows_the_room_rules() -> None:
    from bench.baseline.room import PollingRoom

    assert "room-settle" in REGISTRY
    turns: list[str] = []

    def turn(member: str, news: list[tuple[str, str]]) -> str:
        turns.append(member)
        return "@m2 ok" if member == "m0" and any(a == "user" for a, _ in news) else "[SILENT]"

    with PollingRoom(["m0", "m1", "m2", "m3"], turn, poll_s=0.01) as room:
        room.send("@m0 status?")
        assert room.wait_idle(10)
        # round 1: m0 (mentioned) replies mentioning m2; round 2: m2 passes; the silent round settles
        assert room.transcript == [("user", "@m0 status?"), ("m0", "@m2 ok")]
        assert turns == ["m0", "m2"]
