"""Tests for the one-declaration config: derived defaults and docs, unknown keys, warnings said once."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from roots import RecordingRunner, start_gateway

from hermes_actors import Gateway
from hermes_actors.core import config as c
from hermes_actors.core.hops import MAX_HOP
from hermes_actors.core.settings import coerce, setting, settings_of
from hermes_actors.transports.redis.store import redis_settings

DOCS = Path(__file__).resolve().parent.parent / "docs" / "operations.md"


def _spec(key: str) -> c.Setting:
    return next(s for s in c.SETTINGS if s.key == key)


# ── derived from the declaration ────────────────────────────────────────────


def test_docs_table_matches_the_declaration() -> None:
    lines = DOCS.read_text(encoding="utf-8").splitlines()
    start = lines.index("| key | type | default | meaning |")
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    documented = "\n".join(lines[start:end])
    assert documented == c.docs_table(), (
        "docs/operations.md's configuration table differs from hermes_actors/core/config.py; regenerate it with "
        "python -c 'from hermes_actors.core.config import docs_table; print(docs_table())'"
    )


def test_every_setting_has_one_table_row_and_a_doc() -> None:
    table = c.docs_table()
    for spec in c.SETTINGS:
        assert table.count(f"| `{spec.path}` |") == 1
        assert spec.doc.strip() and "\n" not in spec.doc


def test_defaults_are_the_declared_defaults() -> None:
    typed = c.BotModeConfig()
    for spec in c.CORE_SETTINGS:
        assert c.DEFAULTS["bot_mode"][spec.key] == spec.default == getattr(typed, spec.key)
    assert set(c.DEFAULTS["bot_mode"]) == {s.key for s in c.CORE_SETTINGS}
    assert c.BotModeConfig.from_dict({}) == typed


def test_kinds_come_from_the_annotations() -> None:
    kinds = {s.key: s.kind for s in c.SETTINGS}
    assert kinds["turn_wait_seconds"] == "float"
    assert kinds["max_hops"] == "int"
    assert kinds["redis_prefix"] == "text"
    assert {f.name for f in dataclasses.fields(c.BotModeConfig)} - {s.key for s in c.CORE_SETTINGS} == {
        "peers", "redis", "raw"}


def test_a_setting_needs_a_known_annotation() -> None:
    @dataclasses.dataclass
    class Bad:
        when: bytes = setting(1.0, "bytes is no setting type")

    with pytest.raises(TypeError, match=r"Bad\.when"):
        settings_of(Bad, "bot_mode")


def test_a_setting_takes_one_bound() -> None:
    with pytest.raises(ValueError, match="not both"):
        setting(1.0, "doc", at_least=0, above=0)
    with pytest.raises(ValueError, match="clamp_above needs at_most"):
        setting(1, "doc", at_least=1, clamp_above="the most there is")


@pytest.mark.parametrize(
    ("key", "text"),
    [("turn_wait_seconds", "number ≥ 0, ≤ 604800 (a larger one is taken as 604800), read as the seed reads it: "
                           "`max(0, float(value))`"),
     ("turn_timeout_seconds", "number > 0, ≤ 604800"),
     ("envelope_ttl_seconds", "number ≤ 315360000 (a larger one is taken as 315360000), read as the seed reads it: "
                              "`int(value)`"),
     ("max_hops", "integer ≥ 1, ≤ 1000 (a larger one is taken as 1000)"),
     ("redis_claim_idle_seconds", "number ≥ 0.01, ≤ 86400"), ("redis_prefix", "text"),
     ("connection_label", "text (≤ 80 characters)")],
)
def test_type_text(key: str, text: str) -> None:
    assert _spec(key).type_text == text


# ── coercion of the transport keys (the numeric rules are in test_config.py) ─


@pytest.mark.parametrize(
    ("key", "value", "expected", "problem"),
    [
        ("transport", None, "file", None),
        ("transport", "  redis://h  ", "redis://h", None),
        ("transport", "", "file", None),
        ("transport", ["redis://h"], "file", "bot_mode.transport=['redis://h'] is not valid text"),
        ("transport", True, "file", "bot_mode.transport=True is not valid text"),
        ("redis_prefix", 7, "7", None),
        ("redis_prefix", "   ", "hermes:bot", None),
        ("connection_label", "Mini", "Mini", None),
        ("connection_label", "x" * 81, "x" * 80, "bot_mode.connection_label is longer than 80 characters"),
        ("redis_max_stream_len", 1, 1, None),
        ("redis_max_stream_len", -1, 100_000,
         "bot_mode.redis_max_stream_len=-1 is out of range (it must be ≥ 1, ≤ 100000000); using default 100000"),
        ("redis_claim_idle_seconds", "soon", 60.0, "bot_mode.redis_claim_idle_seconds='soon' is not a valid float"),
        ("redis_heartbeat_seconds", 0.01, 5.0, "bot_mode.redis_heartbeat_seconds=0.01 is out of range (it must be "
                                               "≥ 0.05, ≤ 3600)"),
        ("redis_block_ms", 10**12, 200, "bot_mode.redis_block_ms=1000000000000 is out of range (it must be ≥ 1, "
                                        "≤ 60000)"),
    ],
)
def test_coerce_text_and_redis(key: str, value: Any, expected: Any, problem: str | None) -> None:
    got, said = coerce(_spec(key), value)
    assert got == expected and type(got) is type(expected)
    if problem is None:
        assert said is None
    else:
        assert said is not None and problem in said


def test_redis_settings_read_the_declaration() -> None:
    s = redis_settings({"bot_mode": {"redis_prefix": "team:a", "redis_block_ms": 50, "connection_label": " Mini "}},
                       "redis://h")
    assert (s.url, s.prefix, s.block_ms, s.connection_label) == ("redis://h", "team:a", 50, "Mini")
    defaults = c.RedisConfig()
    d = redis_settings({}, "redis://h")
    assert (d.claim_idle_seconds, d.max_stream_len, d.heartbeat_seconds, d.prefix, d.block_ms, d.connection_label) == (
        defaults.redis_claim_idle_seconds, defaults.redis_max_stream_len, defaults.redis_heartbeat_seconds,
        defaults.redis_prefix, defaults.redis_block_ms, defaults.connection_label)


def test_parse_config_reports_without_logging(warnings: list[str]) -> None:
    cfg, problems = c.parse_config({"bot_mode": {"max_hops": 0, "redis_block_ms": "x"}, "bot_peers": "mini"})
    assert cfg.max_hops == 8 and cfg.redis.redis_block_ms == 200 and cfg.peers == ()
    assert len(problems) == 3
    assert any("bot_mode.max_hops=0" in p for p in problems)
    assert any("bot_mode.redis_block_ms='x'" in p for p in problems)
    assert any("bot_peers" in p for p in problems)
    assert warnings == []


def test_from_dict_logs_transport_problems(warnings: list[str]) -> None:
    cfg = c.BotModeConfig.from_dict({"bot_mode": {"redis_max_stream_len": 2.5}})
    assert cfg.redis.redis_max_stream_len == 100_000
    assert len(warnings) == 1 and "redis_max_stream_len=2.5" in warnings[0]


# ── unknown keys ────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({}, []),
        (None, []),
        ("bot_mode: 1", []),
        ({"bot_mode": None}, []),
        ({"bot_mode": [1, 2]}, []),
        ({"bot_mode": {"turn_wait_seconds": 1, "transport": "file", "connection_label": "x"}}, []),
        ({"bot_mode": {"turn_wait_secs": 1}}, [("bot_mode.turn_wait_secs", "bot_mode.turn_wait_seconds")]),
        ({"bot_mode": {"max_hop": 1}}, [("bot_mode.max_hop", "bot_mode.max_hops")]),
        ({"bot_mode": {"redis_prefx": "a"}}, [("bot_mode.redis_prefx", "bot_mode.redis_prefix")]),
        ({"bot_mode": {"zzz": 1}}, [("bot_mode.zzz", None)]),
        ({"bot_mode": {3: 1}}, [("bot_mode.3", None)]),
        ({"bot_mode": {"b_typo": 1, "a_typo": 2}}, [("bot_mode.b_typo", None), ("bot_mode.a_typo", None)]),
        # Hermes's own sections and the fields of bot_peers entries are not ours to check
        ({"model": {"turn_wait_secs": 1}, "platforms": {"x": 1}, "bot_peers": {"mini": {"urll": "x"}}}, []),
        ({"bot_peers": ["mini", {"name": "lab", "whatever": 1}]}, []),
        # a misspelt section of ours would be ignored whole: named, with ours (regression: doctor said "ok")
        ({"bot-mode": {"turn_wait_seconds": 5}, "botmode": {"max_hops": 2}}, [("bot-mode", "bot_mode"),
                                                                              ("botmode", "bot_mode")]),
        ({"bot_modes": {}, "model": {}, "toolsets": [], "memory": {}}, [("bot_modes", "bot_mode")]),
        ({"BOT_MODE": {}, "bot_peer": {"mini": {}}}, [("BOT_MODE", "bot_mode"), ("bot_peer", "bot_peers")]),
    ],
)
def test_unknown_keys(raw: Any, expected: list[tuple[str, str | None]]) -> None:
    assert c.unknown_keys(raw) == expected


@pytest.mark.parametrize(
    ("key", "suggestion", "text"),
    [
        ("bot_mode.turn_wait_secs", "bot_mode.turn_wait_seconds",
         "config.yaml: unknown key bot_mode.turn_wait_secs (did you mean bot_mode.turn_wait_seconds?)"),
        ("bot_mode.zzz", None, "config.yaml: unknown key bot_mode.zzz"),
    ],
)
def test_unknown_key_text(key: str, suggestion: str | None, text: str) -> None:
    assert c.unknown_key_text("config.yaml", key, suggestion) == text


# ── warnings said once ──────────────────────────────────────────────────────


def test_unknown_key_warned_once_over_repeated_loads(tmp_path: Path, warnings: list[str]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("bot_mode:\n  turn_wait_secs: 5\n  max_hops: 0\nmodel:\n  name: x\n")
    for _ in range(3):  # the CLI, the gateway and the roster each load it
        cfg = c.load_config(tmp_path)
        assert cfg.turn_wait_seconds == 120 and cfg.max_hops == 8
    assert warnings == [
        f"{path}: unknown key bot_mode.turn_wait_secs (did you mean bot_mode.turn_wait_seconds?)",
        f"{path}: bot_mode.max_hops=0 is out of range (it must be ≥ 1, ≤ 1000); using default 8",
    ]


def test_a_problem_comes_back_after_the_file_was_fixed(tmp_path: Path, warnings: list[str]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("bot_mode:\n  max_hop: 3\n")
    c.load_config(tmp_path)
    path.write_text("bot_mode:\n  max_hop: 3\n  idle_stop_secs: 1\n")  # a second typo: only it is new
    c.load_config(tmp_path)
    path.write_text("bot_mode:\n  max_hops: 3\n")  # fixed
    assert c.load_config(tmp_path).max_hops == 3
    path.write_text("bot_mode:\n  max_hop: 3\n")  # broken again: said again
    c.load_config(tmp_path)
    unknown = [w for w in warnings if "unknown key" in w]
    assert unknown == [
        f"{path}: unknown key bot_mode.max_hop (did you mean bot_mode.max_hops?)",
        f"{path}: unknown key bot_mode.idle_stop_secs (did you mean bot_mode.idle_stop_seconds?)",
        f"{path}: unknown key bot_mode.max_hop (did you mean bot_mode.max_hops?)",
    ]


def test_malformed_file_warned_once(tmp_path: Path, warnings: list[str]) -> None:
    (tmp_path / "config.yaml").write_text("bot_mode: [\n")
    c.load_config(tmp_path)
    c.load_config(tmp_path)
    assert len(warnings) == 1 and "malformed" in warnings[0]


def test_unknown_override_key_is_named_as_override(tmp_path: Path, warnings: list[str]) -> None:
    c.load_config(tmp_path, {"bot_mode": {"max_queue": 3}})
    assert warnings == ["config override: unknown key bot_mode.max_queue (did you mean bot_mode.max_queued?)"]


def test_gateway_start_warns_once(root: Path, gateways: list[Gateway], warnings: list[str]) -> None:
    (root / "config.yaml").write_text("bot_mode:\n  turn_wait_secs: 5\n  rescan_seconds: 0\n")
    start_gateway(gateways, root, RecordingRunner())
    unknown = [w for w in warnings if "turn_wait_secs" in w]
    bad = [w for w in warnings if "rescan_seconds=0" in w]
    assert unknown == [
        f"{root / 'config.yaml'}: unknown key bot_mode.turn_wait_secs (did you mean bot_mode.turn_wait_seconds?)"]
    assert len(bad) == 1


# ── ranges and where a problem was written (ops review) ─────────────────────


@pytest.mark.parametrize(("key", "value", "must"), [
    ("rescan_seconds", 1e-9, "≥ 0.05, ≤ 3600"),
    ("reply_wait_seconds", 1e300, "≥ 0, ≤ 604800"),
    ("idle_stop_seconds", -1, "≥ 0, ≤ 604800"),
    ("max_queued", 10**12, "≥ 1, ≤ 1000000"),
    ("redis_block_ms", 10**12, "≥ 1, ≤ 60000"),
    ("idle_stop_seconds", float("inf"), "≥ 0, ≤ 604800"),
    ("turn_timeout_seconds", float("nan"), "> 0, ≤ 604800"),
])
def test_an_absurd_value_is_refused_naming_file_key_value_and_range(
    tmp_path: Path, warnings: list[str], monkeypatch: pytest.MonkeyPatch, key: str, value: Any, must: str
) -> None:
    """Regression (ops review): a rescan_seconds of 1e-9, waits of 1e300, a max_hops of 10**30 were accepted
    silently, and a bad value's warning named no file. It is refused (the default is used, as for any bad value)
    with a warning naming the config file by its absolute path, the key, the value and the accepted range."""
    (tmp_path / "config.yaml").write_text(f"bot_mode:\n  {key}: {value!r}\n".replace("nan", ".nan")
                                          .replace("inf", ".inf"))
    monkeypatch.chdir(tmp_path)  # a relative root still gets the file named in full
    cfg = c.load_config(Path("."))
    spec = _spec(key)
    got = getattr(cfg.redis if spec in c.REDIS_SETTINGS else cfg, key)
    assert got == spec.default
    (warning,) = warnings
    assert warning.startswith(f"{tmp_path / 'config.yaml'}: bot_mode.{key}=") and f"(it must be {must})" in warning, \
        warning
    assert warning.endswith(f"using default {spec.default}")


def test_max_hops_stops_at_the_deepest_hop_a_dm_can_carry(tmp_path: Path, warnings: list[str]) -> None:
    """Regression (ops review): max_hops took up to 10000 while a hop a relayed envelope or a submit request
    carries is at most MAX_HOP (1000): a limit between them was accepted, yet a DM past 1000 was refused anyway
    (``check_relay_hop``, the submit protocol). The range is the hop rule's, read from ``core.hops``.

    Regression (review): capping the range sent a value between 1001 and 10000, accepted before, to the default 8,
    so a config that meant "deep" refused conversations deeper than 8 hops. A value above MAX_HOP is now taken as
    MAX_HOP, with a warning saying so; one below 1 or not an integer still falls back to the default."""
    assert _spec("max_hops").maximum == MAX_HOP
    path = tmp_path / "config.yaml"
    for deep in (MAX_HOP + 1, 5000, 10**30):
        warnings.clear()
        path.write_text(f"bot_mode:\n  max_hops: {deep}\n")
        assert c.load_config(tmp_path).max_hops == MAX_HOP
        assert warnings == [f"{path}: bot_mode.max_hops={deep} is above {MAX_HOP}, the deepest hop a DM can carry; "
                            f"using {MAX_HOP}"]
    warnings.clear()
    path.write_text(f"bot_mode:\n  max_hops: {MAX_HOP}\n")
    assert c.load_config(tmp_path).max_hops == MAX_HOP
    assert warnings == []
    for bad, said in ((0, "is out of range"), (2.5, "is not a valid int")):
        warnings.clear()
        path.write_text(f"bot_mode:\n  max_hops: {bad}\n")
        assert c.load_config(tmp_path).max_hops == 8
        assert warnings == [f"{path}: bot_mode.max_hops={bad} {said} (it must be ≥ 1, ≤ 1000); using default 8"], \
            warnings


def test_only_a_setting_that_asks_for_it_clamps_a_value_above_its_range() -> None:
    """The clamp is declared beside the range (``clamp_above``), one rule: another setting past its maximum
    still falls back to its default."""
    assert [s.key for s in c.SETTINGS if s.clamp_above] == ["turn_wait_seconds", "envelope_ttl_seconds", "max_hops"]
    assert coerce(_spec("max_hops"), 5000) == (
        MAX_HOP, f"bot_mode.max_hops=5000 is above {MAX_HOP}, the deepest hop a DM can carry; using {MAX_HOP}")
    assert coerce(_spec("max_queued"), 10**7)[0] == 256


def test_an_envelope_ttl_of_a_month_is_taken_as_the_seed_takes_it(tmp_path: Path, warnings: list[str]) -> None:
    """Regression (review): a TTL above a week was refused and the 900 s default used, while a seed process on the
    same root honours it (the seed takes any whole number): envelopes meant to wait 30 days expired in 15 minutes."""
    (tmp_path / "config.yaml").write_text("bot_mode:\n  envelope_ttl_seconds: 2592000\n")
    assert c.load_config(tmp_path).envelope_ttl_seconds == 2592000
    assert warnings == []


def test_a_bad_override_is_named_as_the_override(tmp_path: Path, warnings: list[str]) -> None:
    (tmp_path / "config.yaml").write_text("bot_mode:\n  max_hops: 0\n  max_queued: 3\n")
    cfg = c.load_config(tmp_path, {"bot_mode": {"max_queued": 0}, "bot_peers": "mini"})
    assert cfg.max_hops == 8 and cfg.max_queued == 256
    assert sorted(warnings) == sorted([
        f"{tmp_path / 'config.yaml'}: bot_mode.max_hops=0 is out of range (it must be ≥ 1, ≤ 1000); using default 8",
        "config override: bot_mode.max_queued=0 is out of range (it must be ≥ 1, ≤ 1000000); using default 256",
        "config override: bot_peers is a str, not a mapping or list; ignoring it",
    ])


def test_every_number_has_a_sane_range() -> None:
    for spec in c.SETTINGS:
        if spec.kind != "text":
            assert spec.maximum is not None, f"{spec.path} declares no upper bound"


@pytest.mark.parametrize("key", ["max_queued", "max_hops", "rescan_seconds"])
def test_an_integer_too_large_for_a_float_falls_back_to_the_default_with_a_warning(
    tmp_path: Path, warnings: list[str], key: str
) -> None:
    """Regression (review): `max_queued: 1` followed by 400 zeros raised OverflowError out of load_config, so the
    Gateway did not start at all ("Loading never crashes the gateway"). It is a bad value like any other now."""
    path = tmp_path / "config.yaml"
    path.write_text(f"bot_mode:\n  {key}: 1{'0' * 400}\n")
    spec = _spec(key)
    assert getattr(c.load_config(tmp_path), key) == spec.default
    (warning,) = warnings
    assert warning.startswith(f"{path}: bot_mode.{key}=") and warning.endswith(f"using default {spec.default}")
