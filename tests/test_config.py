"""Tests for config loading, merging and coercion."""

from __future__ import annotations

import copy
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from roots import LogCapture, RecordingRunner, make_root, start_gateway

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.core import config as c
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.yaml_file import warned_while_failing

# ── deep_merge ──────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("base", "over", "expected"),
    [
        ({}, {}, {}),
        ({"a": 1}, {}, {"a": 1}),
        ({}, {"a": 1}, {"a": 1}),
        ({"a": 1}, {"a": 2}, {"a": 2}),
        ({"a": {"x": 1, "y": 2}}, {"a": {"y": 3, "z": 4}}, {"a": {"x": 1, "y": 3, "z": 4}}),
        ({"a": {"b": {"c": 1, "d": 2}}}, {"a": {"b": {"d": 5}}}, {"a": {"b": {"c": 1, "d": 5}}}),
        ({"a": {"x": 1}}, {"a": 7}, {"a": 7}),
        ({"a": 7}, {"a": {"x": 1}}, {"a": {"x": 1}}),
        ({"a": [1, 2]}, {"a": [3]}, {"a": [3]}),
        ({"a": {"x": 1}}, {"a": None}, {"a": None}),
    ],
)
def test_deep_merge(base: dict[str, Any], over: dict[str, Any], expected: dict[str, Any]) -> None:
    base_before, over_before = copy.deepcopy(base), copy.deepcopy(over)
    assert c.deep_merge(base, over) == expected
    assert base == base_before
    assert over == over_before


def test_deep_merge_result_shares_no_nested_state() -> None:
    base = {"a": {"x": [1]}}
    over = {"b": {"y": [2]}}
    merged = c.deep_merge(base, over)
    merged["a"]["x"].append(9)
    merged["b"]["y"].append(9)
    assert base == {"a": {"x": [1]}}
    assert over == {"b": {"y": [2]}}


# ── load_yaml_file ──────────────────────────────────────────────────────────


def test_missing_file_is_empty_without_warning(tmp_path: Path, warnings: list[str]) -> None:
    assert c.load_yaml_file(tmp_path / "nope.yaml") == {}
    assert warnings == []


# Nine levels of ten aliases: a 600-byte file standing for 10**9 strings (cheap to parse: the loader shares them).
BILLION_LAUGHS = "l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 10)}]\n" for n in range(1, 9)
) + "display_name: *l8\nbot_mode: {max_hops: *l8}\n"


# Each mapping merges the one before (<<: *prev): 1,000 small lines that build 500,000 entries, quadratically.
MERGE_CHAIN = "l0: &l0 {k0: 0}\n" + "".join(f"l{n}: &l{n} {{<<: *l{n - 1}, k{n}: 0}}\n" for n in range(1, 1000))


@pytest.mark.parametrize(("value", "size"), [
    (5, 1),
    ([], 1),
    ({}, 1),
    ({"a": [1, 2], "b": {"c": None}}, 9),  # the mapping, 2 keys, [1, 2] (3), {"c": None} (3)
    ({"x": (shared := [1, 2]), "y": shared}, 9),  # a shared part counts each time it appears
    ([[1] * 10] * 10, 1 + 10 * 11),
], ids=["scalar", "empty-list", "empty-map", "nested", "shared", "list-of-lists"])
def test_expanded_size_counts_every_appearance(value: Any, size: int) -> None:
    from hermes_actors.store.yaml_file import expanded_size

    assert expanded_size(value) == size
    assert expanded_size(value, limit=size) == size
    if isinstance(value, dict | list):  # one below the count: refused
        assert expanded_size(value, limit=size - 1) is None


def test_expanded_size_refuses_a_recursive_structure() -> None:
    from hermes_actors.store.yaml_file import expanded_size

    loop: list[Any] = []
    loop.append(loop)
    assert expanded_size({"a": loop}) is None


@pytest.mark.parametrize(("text", "lines"), [
    ("a: 1\nb: [2, 3]\n", []),
    ("# written by hermes\na: 1\n", [1]),
    ("model:\n  default: gpt-4o   # keep: the model we pay for\n  provider: openai  # do not change\n", [2, 3]),
    ("display_name: Alice  # her public name\n", [1]),
    ("a: b #\n", [1]),
    ("a: &x 1  # anchored\nb: *x\n", [1]),
    ("a: [1,  # in a flow list\n  2]\nb: {c: 1} # after a flow map\n", [1, 3]),
    ("a:\n  - x # an item's\n  - y\n", [2]),
    ("a: |  # a block scalar's header\n  text # is text\n  # so is this\n# not this\n", [1, 4]),
    ("a: >-\n  folded # text\n", []),
    ('a: "x # y"\n', []),
    ("a: 'x # y'\n", []),
    ("url: https://example.com/docs#setup\n", []),
    ("a: b#c\n", []),
    ('key: "quoted # not a comment"  # a comment\n', [1]),
    ("\ufeff# after a BOM\na: 1\n", [1]),
    ('a: "never closed\n# x\n', [2]),  # malformed: every line with a "#"
], ids=["none", "whole-line", "end-of-line", "profile", "empty-comment", "after-anchor", "flow", "list-item",
        "block-scalar", "folded-scalar", "double-quoted", "single-quoted", "url-fragment", "hash-in-word",
        "quoted-then-comment", "bom", "malformed"])
def test_comment_lines_finds_the_comments_a_rewrite_drops(text: str, lines: list[int]) -> None:
    from hermes_actors.store.yaml_file import comment_lines

    assert comment_lines(text) == lines


@pytest.mark.parametrize(("content", "expected"), [("", {}), ("# only a comment\n", {}), ("a: 1\n", {"a": 1})])
def test_valid_or_empty_file(tmp_path: Path, warnings: list[str], content: str, expected: dict[str, Any]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(content)
    assert c.load_yaml_file(path) == expected
    assert warnings == []


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("a: [1, 2\n", "malformed"),
        ("a: b: c\n", "malformed"),
        ("- 1\n- 2\n", "list"),
        ("just a string\n", "str"),
        ("42\n", "int"),
        (BILLION_LAUGHS, "more than 100000 values once its YAML aliases are expanded"),
        ("a: &a [*a]\n", "an alias that contains itself"),
        (MERGE_CHAIN, "more than 100000 values once its YAML aliases are expanded"),
    ],
    ids=["unclosed", "nested-mapping", "list", "str", "int", "billion-laughs", "recursive-alias", "merge-chain"],
)
def test_bad_yaml_warns_and_is_empty(tmp_path: Path, warnings: list[str], content: str, needle: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(content)
    assert c.load_yaml_file(path) == {}
    assert len(warnings) == 1
    assert str(path) in warnings[0]
    assert needle in warnings[0]


def test_invalid_utf8_warns(tmp_path: Path, warnings: list[str]) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"a: \xff\xfe\n")
    assert c.load_yaml_file(path) == {}
    assert len(warnings) == 1 and str(path) in warnings[0]


def test_huge_file_refused(tmp_path: Path, warnings: list[str]) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("a: 1\n" + "#" * c.MAX_CONFIG_BYTES)
    assert c.load_yaml_file(path) == {}
    assert len(warnings) == 1
    assert str(path) in warnings[0] and "too big" in warnings[0]


def test_file_at_limit_accepted(tmp_path: Path, warnings: list[str]) -> None:
    path = tmp_path / "config.yaml"
    head = "a: 1\n"
    path.write_text(head + "#" * (c.MAX_CONFIG_BYTES - len(head)))
    assert c.load_yaml_file(path) == {"a": 1}
    assert warnings == []


@pytest.mark.parametrize("dangling", [False, True])
def test_symlink_refused(tmp_path: Path, warnings: list[str], dangling: bool) -> None:
    real = tmp_path / "real.yaml"
    if not dangling:
        real.write_text("a: 1\n")
    link = tmp_path / "config.yaml"
    link.symlink_to(real)
    assert c.load_yaml_file(link) == {}
    assert len(warnings) == 1
    assert str(link) in warnings[0] and "symlink" in warnings[0]


def test_directory_is_refused(tmp_path: Path, warnings: list[str]) -> None:
    path = tmp_path / "config.yaml"
    path.mkdir()
    assert c.load_yaml_file(path) == {}
    assert len(warnings) == 1 and str(path) in warnings[0]


# ── warned_while_failing ────────────────────────────────────────────────────

DISK_FULL, GONE, NOT_OURS = OSError("disk full"), FileNotFoundError("gone"), ValueError("not ours")


@pytest.mark.parametrize(("steps", "expected"), [
    pytest.param([None, None], [], id="working-says-nothing"),
    pytest.param([DISK_FULL] * 3, ["w failed: OSError: disk full"], id="once-while-it-lasts"),
    pytest.param([DISK_FULL, None, DISK_FULL], ["w failed: OSError: disk full"] * 2, id="again-once-it-came-back"),
    pytest.param([DISK_FULL, GONE, GONE], ["w failed: OSError: disk full", "w failed: FileNotFoundError: gone"],
                 id="a-new-failure-is-said"),
    pytest.param([DISK_FULL, NOT_OURS, DISK_FULL], ["w failed: OSError: disk full"], id="other-errors-pass-through"),
])
def test_warned_while_failing_logs_a_failure_once_while_it_lasts(
    warnings: list[str], steps: list[Exception | None], expected: list[str]
) -> None:
    """One line when a step starts failing, none while it fails the same way, one again after it worked;
    an exception outside ``errors`` propagates and leaves the memory as it was."""
    what = f"test step {uuid.uuid4().hex}"  # the memory is per process: a key of this test's own
    for error in steps:
        went_on = False
        try:
            with warned_while_failing(what, (OSError,), "w failed"):
                if error is not None:
                    raise error
                went_on = True
        except ValueError as exc:
            assert exc is NOT_OURS  # not swallowed
            continue
        assert went_on is (error is None)  # a failure skips the rest of the block, and the caller goes on
    assert warnings == expected


def test_warned_while_failing_says_what_happens_now(warnings: list[str]) -> None:
    with warned_while_failing(f"test step {uuid.uuid4().hex}", (OSError,), "relay: x failed", "Tried again soon"):
        raise PermissionError("denied")
    assert warnings == ["relay: x failed: PermissionError: denied. Tried again soon"]


# ── BotModeConfig ───────────────────────────────────────────────────────────


def test_defaults() -> None:
    cfg = c.BotModeConfig.from_dict({})
    assert cfg.turn_wait_seconds == 120
    assert cfg.envelope_ttl_seconds == 900
    assert cfg.reply_wait_seconds == 900
    assert cfg.max_hops == 8
    assert cfg.max_pair_rate == 30
    assert cfg.max_queued == 256
    assert cfg.turn_timeout_seconds == 600
    assert cfg.idle_stop_seconds == 60
    assert cfg.rescan_seconds == 2.0
    assert cfg.peers == ()
    assert cfg.expiry_enabled is True
    assert cfg.wake_sender == "auto"
    assert cfg.wake_retry_seconds == 5.0


@pytest.mark.parametrize(
    ("raw", "mode"),
    [(True, "true"), (False, "false"), ("auto", "auto"), (" TRUE ", "true"), ("off", "false"), ("yes", "true"),
     ("maybe", "auto"), (3, "auto"), (None, "auto")],
)
def test_wake_sender_values(raw: object, mode: str) -> None:
    assert c.BotModeConfig.from_dict({"bot_mode": {"wake_sender": raw}}).wake_sender == mode


def test_defaults_dict_shape() -> None:
    assert c.DEFAULTS["bot_mode"] == {
        "turn_wait_seconds": 120, "envelope_ttl_seconds": 900, "reply_wait_seconds": 900, "max_hops": 8,
        "max_pair_rate": 30, "max_queued": 256, "max_notify_backlog": 100000, "turn_timeout_seconds": 600,
        "idle_stop_seconds": 60, "rescan_seconds": 2.0, "wake_sender": "auto", "wake_retry_seconds": 5.0,
    }
    assert c.DEFAULTS["bot_peers"] == {}


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("turn_wait_seconds", 0.3, 0.3),
        ("reply_wait_seconds", "0.5", 0.5),  # a text, for a key the seed reads, is said (configfix)
        ("turn_wait_seconds", 0, 0.0),
        ("turn_wait_seconds", 5, 5.0),
        ("envelope_ttl_seconds", 0, 0.0),
        ("envelope_ttl_seconds", -1, -1.0),
        ("envelope_ttl_seconds", 1800.0, 1800.0),  # 1.5 is read as 1 by the file relay: said (configfix)
        ("reply_wait_seconds", 2.25, 2.25),
        ("max_hops", 3, 3),
        ("max_hops", 3.0, 3),
        ("max_hops", "4", 4),
        ("max_pair_rate", 1, 1),
        ("max_queued", 10, 10),
        ("turn_timeout_seconds", 0.1, 0.1),
        ("idle_stop_seconds", 0, 0.0),
        ("rescan_seconds", 0.05, 0.05),
    ],
)
def test_good_values_coerced(key: str, value: Any, expected: float, warnings: list[str]) -> None:
    cfg = c.BotModeConfig.from_dict({"bot_mode": {key: value}})
    got = getattr(cfg, key)
    assert got == pytest.approx(expected)
    assert type(got) is type(expected)
    assert warnings == []


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("turn_wait_seconds", "abc"),
        ("turn_wait_seconds", None),
        ("turn_wait_seconds", [1]),
        ("turn_wait_seconds", 10**400),  # float() overflows: the seed's default too
        ("envelope_ttl_seconds", "soon"),
        ("envelope_ttl_seconds", "60.5"),  # int() refuses it: the seed's default too
        ("envelope_ttl_seconds", float("inf")),
        ("envelope_ttl_seconds", float("nan")),
        ("reply_wait_seconds", -0.5),
        ("max_hops", 0),
        ("max_hops", 2.5),
        ("max_hops", "many"),
        ("max_pair_rate", -3),
        ("max_queued", 0),
        ("turn_timeout_seconds", 0),
        ("idle_stop_seconds", -1),
        ("rescan_seconds", 0),
        ("rescan_seconds", {"a": 1}),
    ],
)
def test_bad_values_fall_back_with_warning(key: str, value: Any, warnings: list[str]) -> None:
    cfg = c.BotModeConfig.from_dict({"bot_mode": {key: value}})
    assert getattr(cfg, key) == c.DEFAULTS["bot_mode"][key]
    assert len(warnings) == 1 and key in warnings[0]


def _seed_ttl(value: Any) -> int:
    """The seed's bot_relay._envelope_ttl_seconds on one config value, as written there."""
    try:
        if value is not None:
            return int(value)
    except Exception:
        pass
    return 900


def _seed_wait(value: Any) -> float:
    """The seed's bot_relay.turn_wait_seconds on one config value, as written there."""
    try:
        if value is not None:
            return max(0.0, float(value))
    except Exception:
        pass
    return 120.0


@pytest.mark.parametrize(
    ("value", "ttl", "wait", "ttl_warns", "wait_warns"),
    [
        (60, 60.0, 60.0, False, False),
        (60.9, 60.9, 60.9, True, False),  # the file relay int()s it where it expires: 60, as the seed (said)
        ("60", 60.0, 60.0, True, True),  # a text read as a number: said
        ("60.5", 900.0, 60.5, True, True),  # the seed's int("60.5") raises: its default
        (0, 0.0, 0.0, False, False),
        (-5, -5.0, 0.0, False, True),  # a negative wait is 0 for the seed (before: the default 120, a warning)
        (0.5, 0.5, 0.5, True, False),  # the file relay's int(): 0, no expiry (said)
        (True, 1.0, 1.0, True, True),  # a bool is 1 for the seed (before: the defaults)
        (False, 0.0, 0.0, True, True),
        (None, 900.0, 120.0, True, True),
        ("abc", 900.0, 120.0, True, True),
        (float("nan"), 900.0, 0.0, True, True),  # int(nan) raises; max(0.0, nan) is 0.0
        (float("inf"), 900.0, 604800.0, True, True),  # the seed waits forever: a week, the longest we wait
        (1e20, 315360000.0, 604800.0, True, True),  # the seed's TTL never expires: 10 years, never in practice
        pytest.param(10**400, 315360000.0, 120.0, True, True, id="10**400"),  # float() overflows: the seed's default
        ("1_000", 1000.0, 1000.0, True, True),
    ],
)
def test_the_keys_the_seed_reads_are_read_as_the_seed_reads_them(
    value: Any, ttl: float, wait: float, ttl_warns: bool, wait_warns: bool
) -> None:
    """Regression (seed-interop review): one config.yaml read by a seed process and by ours on the same root gave
    two behaviours: envelope_ttl_seconds "60.5" was 60.5 s here and 900 s for the seed, True 900 here and 1
    there, 1e20 900 here and "never" there; turn_wait_seconds -5 was 120 here and 0 there, True 120 here and 1
    there. Each is now read by the seed's expression (int(val); max(0.0, float(val))); only a value past our
    range, which the seed would honour, is clamped to it (a TTL of 10 years, a wait of a week: never reached in
    practice). An odd value still warns, naming the key (a fraction the file relay drops and a text read as a
    number too: configfix)."""
    cfg, problems = c.parse_config({"bot_mode": {"envelope_ttl_seconds": value, "turn_wait_seconds": value}})
    assert (cfg.envelope_ttl_seconds, cfg.turn_wait_seconds) == (ttl, wait)
    assert type(cfg.envelope_ttl_seconds) is float and type(cfg.turn_wait_seconds) is float
    assert ttl_warns == any("envelope_ttl_seconds" in p for p in problems), problems
    assert wait_warns == any("turn_wait_seconds" in p for p in problems), problems
    # what each side does with it: the file relay expires at int() of the TTL (relay_protocol.seed_ttl)
    seed_ttl, seed_wait = _seed_ttl(value), _seed_wait(value)
    assert rp.seed_ttl(cfg.envelope_ttl_seconds) == seed_ttl or seed_ttl > c.YEARS_10
    assert cfg.turn_wait_seconds == seed_wait or seed_wait > c.WEEK


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        # Regression (uxbatch): what a wait read as 0 does was not said
        ("turn_wait_seconds", -5, "config: bot_mode.turn_wait_seconds=-5 is read as 0.0, as the seed reads it "
                                  "(`max(0, float(value))`): no wait, so a DM behind another turn of its bot (this "
                                  "gateway's, or another process's holding the bot's lock) fails target_busy at "
                                  "once, NOT delivered"),
        ("turn_wait_seconds", False, "config: bot_mode.turn_wait_seconds=False is read as 0.0, as the seed reads it "
                                     "(`max(0, float(value))`): no wait, so a DM behind another turn of its bot "
                                     "(this gateway's, or another process's holding the bot's lock) fails "
                                     "target_busy at once, NOT delivered"),
        ("turn_wait_seconds", True, "config: bot_mode.turn_wait_seconds=True is read as 1.0, as the seed reads it "
                                    "(`max(0, float(value))`)"),
        ("envelope_ttl_seconds", True, "config: bot_mode.envelope_ttl_seconds=True is read as 1.0, as the seed "
                                       "reads it (`int(value)`)"),
        ("envelope_ttl_seconds", "60.5", "config: bot_mode.envelope_ttl_seconds='60.5' is not a number the seed's "
                                         "`int(value)` reads; using default 900.0, as the seed does"),
        ("envelope_ttl_seconds", 1e20, "config: bot_mode.envelope_ttl_seconds=1e+20 is above 315360000, 10 years: "
                                       "never reached in practice; using 315360000.0"),
        ("turn_wait_seconds", 1e20, "config: bot_mode.turn_wait_seconds=1e+20 is above 604800, a week: longer than "
                                    "any turn waits in practice; using 604800.0"),
    ],
)
def test_an_odd_value_of_a_key_the_seed_reads_says_how_it_is_read(key: str, value: Any, said: str) -> None:
    assert c.parse_config({"bot_mode": {key: value}})[1] == [said]


_TTL_ZERO = ("that DISABLES envelope expiry on the file relay: an envelope nobody drains is never answered "
             "`queued_expired`")


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (0.5, f"is read as 0, as the seed reads it (`int(value)`): {_TTL_ZERO}; the Redis transport, which no seed "
              "reads, keeps 0.5"),
        (0.9, f"is read as 0, as the seed reads it (`int(value)`): {_TTL_ZERO}; the Redis transport, which no seed "
              "reads, keeps 0.9"),
        (900.7, "is read as 900, as the seed reads it (`int(value)`); the Redis transport, which no seed reads, "
                "keeps 900.7"),
        ("60", "is read as 60.0, as the seed reads it (`int(value)`)"),
        (900, None),
        (900.0, None),
        (0, None),  # written as 0: disabled as written
        (-5, None),  # ≤ 0 disables, as written
    ],
)
def test_an_envelope_ttl_not_read_as_written_is_said(value: Any, said: str | None) -> None:
    """Regression (configfix): a TTL the file relay does not apply as written was read silently: 0.5 and 0.9
    disabled expiry (the seed's int()), 900.7 expired at 900 s, "60" was read as 60, and neither the host's log
    nor doctor's "config keys" said so (a DM whose sender got delivery_timeout was delivered 37 s later)."""
    problems = c.parse_config({"bot_mode": {"envelope_ttl_seconds": value}})[1]
    assert problems == ([] if said is None else [f"config: bot_mode.envelope_ttl_seconds={value!r} {said}"])


@pytest.mark.parametrize(("ttl", "enabled"), [(900, True), (0.5, True), (0, False), (-5, False)])
def test_expiry_enabled(ttl: float, enabled: bool) -> None:
    assert c.BotModeConfig.from_dict({"bot_mode": {"envelope_ttl_seconds": ttl}}).expiry_enabled is enabled


@pytest.mark.parametrize("section", ["nope", [1, 2], 5])
def test_non_dict_bot_mode_uses_defaults(section: Any, warnings: list[str]) -> None:
    cfg = c.BotModeConfig.from_dict({"bot_mode": section})
    assert cfg.max_hops == 8 and cfg.turn_wait_seconds == 120
    assert len(warnings) == 1 and "bot_mode" in warnings[0]


@pytest.mark.parametrize(
    ("peers", "expected", "n_warnings"),
    [
        (None, (), 0),
        ({}, (), 0),
        ([], (), 0),
        ({"Mini": {"url": "x"}, "lab": {}}, ("mini", "lab"), 0),
        (["mini", "LAB"], ("mini", "lab"), 0),
        ([{"name": "Mini"}, {"name": "lab", "url": "y"}], ("mini", "lab"), 0),
        (["mini", "Mini"], ("mini",), 0),
        (["ok", "bad name", "-dash", "", 5, {"url": "no name"}], ("ok",), 5),
        (["a" * 64, "a" * 65], ("a" * 64,), 1),
        ("mini", (), 1),
    ],
)
def test_peers(peers: Any, expected: tuple[str, ...], n_warnings: int, warnings: list[str]) -> None:
    assert c.BotModeConfig.from_dict({"bot_peers": peers}).peers == expected
    assert len(warnings) == n_warnings


def test_raw_is_kept_and_config_is_frozen() -> None:
    src = {"bot_mode": {"max_hops": 3}, "other": {"k": 1}}
    cfg = c.BotModeConfig.from_dict(src)
    assert cfg.raw == src
    src["other"]["k"] = 2
    assert cfg.raw["other"]["k"] == 1
    with pytest.raises(AttributeError):
        cfg.max_hops = 4  # type: ignore[misc]


# ── load_config ─────────────────────────────────────────────────────────────


def test_load_config_without_file(tmp_path: Path) -> None:
    cfg = c.load_config(tmp_path)
    assert cfg == c.BotModeConfig.from_dict(c.DEFAULTS)
    assert cfg.raw["bot_mode"]["max_hops"] == 8


def test_load_config_layers(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(
        "bot_mode:\n  turn_wait_seconds: 5\n  max_hops: 4\nbot_peers:\n  mini: {url: 'http://x'}\nother: 1\n"
    )
    cfg = c.load_config(tmp_path, {"bot_mode": {"turn_wait_seconds": 0.3}})
    assert cfg.turn_wait_seconds == 0.3  # override wins
    assert cfg.max_hops == 4  # file wins over defaults
    assert cfg.max_queued == 256  # default kept
    assert cfg.peers == ("mini",)
    assert cfg.raw["other"] == 1


def test_load_config_malformed_file_uses_defaults(tmp_path: Path, warnings: list[str]) -> None:
    (tmp_path / "config.yaml").write_text("bot_mode: [\n")
    cfg = c.load_config(tmp_path, {"bot_mode": {"max_hops": 2}})
    assert cfg.max_hops == 2
    assert cfg.turn_wait_seconds == 120
    assert len(warnings) == 1 and "config.yaml" in warnings[0]


def test_load_config_does_not_mutate_defaults(tmp_path: Path) -> None:
    before = copy.deepcopy(c.DEFAULTS)
    c.load_config(tmp_path, {"bot_mode": {"max_hops": 1}, "bot_peers": {"x": {}}})
    assert before == c.DEFAULTS


# ── changes on disk while a host runs ───────────────────────────────────────


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        ({}, []),
        ({"max_hops": 2}, ["bot_mode.max_hops 8 → 2"]),
        ({"max_hops": 2, "wake_sender": True}, ["bot_mode.max_hops 8 → 2", "bot_mode.wake_sender 'auto' → 'true'"]),
        ({"redis_prefix": "team:b"}, ["bot_mode.redis_prefix 'hermes:bot' → 'team:b'"]),
    ],
)
def test_changed_settings_names_each_setting_that_differs(after: dict[str, Any], expected: list[str]) -> None:
    before, _ = c.parse_config({})
    assert c.changed_settings(before, c.parse_config({"bot_mode": after})[0]) == expected


def test_a_setting_changed_while_the_host_runs_is_announced_and_applies_at_the_next_start(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    root = make_root(tmp_path, config={"bot_mode": {"max_hops": 8}})
    with LogCapture() as logs:
        gw = start_gateway(gateways, root, RecordingRunner())
        (root / "config.yaml").write_text("bot_mode:\n  max_hops: 2\n", encoding="utf-8")
        os.utime(root / "config.yaml", (1_000_000_000, 1_000_000_000))  # a new mtime, whatever the clock's grain
        await_condition(lambda: logs.matching("bot_mode.max_hops 8 → 2", "applies when this host restarts"),
                        timeout=30, message="the roster's rescan announced the change")
    assert gw.message_agent(sender="alice", target="bob", message="deep", hop=3)["status"] == "queued"
    gw.stop(timeout=10)
    restarted = start_gateway(gateways, root, RecordingRunner())
    refusal = restarted.message_agent(sender="alice", target="bob", message="deep", hop=3)
    assert refusal["reason"] == "loop_guard" and "(limit 2)" in refusal["error"]


@pytest.mark.parametrize("content", [BILLION_LAUGHS, MERGE_CHAIN], ids=["billion-laughs", "merge-chain"])
def test_a_document_over_the_limit_is_never_built(
    tmp_path: Path, warnings: list[str], content: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Building is what expands aliases and merges (quadratic for a merge chain): it must not start."""
    import yaml as pyyaml

    def never(self: Any, node: Any) -> Any:
        raise AssertionError("the over-limit document was built")

    monkeypatch.setattr(pyyaml.constructor.BaseConstructor, "construct_document", never)
    path = tmp_path / "config.yaml"
    path.write_text(content)
    assert c.load_yaml_file(path) == {}
    assert len(warnings) == 1 and "more than 100000 values" in warnings[0]


# ── nesting depth ───────────────────────────────────────────────────────────

# Each anchor nests the one before inside ten more levels: 20 short lines that expand to 200 levels.
ALIAS_DEPTH_CHAIN = "a0: &a0 [x]\n" + "".join(f"a{n}: &a{n} {'[' * 10}*a{n - 1}{']' * 10}\n" for n in range(1, 20))


@pytest.mark.parametrize(
    ("content", "refused"),
    [
        ("x: " + "[" * 1000 + "]" * 1000 + "\n", True),  # the review's 2 KB file: deepcopy raised RecursionError
        ("x: " + "[" * 100_000 + "]" * 100_000 + "\n", True),  # libyaml's composer crashed the process (SIGSEGV)
        ("- " * 100_000 + "x\n", True),  # block style nests as deep
        (ALIAS_DEPTH_CHAIN, True),
        ("x: " + "[" * 63 + "]" * 63 + "\n", False),  # 64 levels with the top mapping: the most accepted
        ("x: " + "[" * 64 + "]" * 64 + "\n", True),
        ("a: &a {k: {v: [1]}}\nb: {<<: *a, c: *a}\nd: {<<: {<<: {<<: *a}}}\n", False),  # merges add no level
    ],
    ids=["1000", "100000", "block", "alias-chain", "64", "65", "merges"],
)
def test_a_document_nested_too_deep_is_refused_naming_the_file(
    tmp_path: Path, warnings: list[str], content: str, refused: bool
) -> None:
    """Regression (review): a 2 KB config.yaml of 1,000 nested brackets crashed the roster, the relay and the CLI
    with RecursionError (deep_merge's deepcopy), not naming the file; 100,000 crashed the process in libyaml."""
    path = tmp_path / "config.yaml"
    path.write_text(content)
    loaded = c.load_yaml_file(path)
    if refused:
        assert loaded == {}
        assert len(warnings) == 1 and str(path) in warnings[0] and "more than 64 levels" in warnings[0], warnings
        config = c.load_config(tmp_path)  # what serve, status, doctor and the roster do with it
        assert config.max_hops == 8
    else:
        assert loaded and warnings == []
        c.deep_merge(c.DEFAULTS, loaded)


def test_a_roster_reload_that_fails_keeps_the_roster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (review): an error in the roster's reload of config.yaml crashed the RosterActor unsupervised
    (and the relay after it): the failure is logged and the roster read before stays in effect."""
    from actors import Scheduler, ask
    from hermes_actors.local import roster as roster_module
    from hermes_actors.messages import GetSnapshot, Reload, RosterSnapshot

    root = make_root(tmp_path, {"alice": {}})
    with Scheduler() as scheduler, LogCapture("ERROR") as logs:
        roster = roster_module.RosterActor.start(root, overrides=None, scheduler=scheduler, rescan_seconds=0)
        try:
            before = ask(roster, GetSnapshot(), timeout=10, expect=RosterSnapshot)

            def broken(*args: Any, **kwargs: Any) -> Any:
                raise RecursionError("maximum recursion depth exceeded")

            monkeypatch.setattr(roster_module, "load_config", broken)
            assert ask(roster, Reload(), timeout=10) == before
            assert roster.is_alive()
            assert ask(roster, GetSnapshot(), timeout=10, expect=RosterSnapshot) == before
        finally:
            roster.stop()
    assert logs.matching("roster reload failed", "stays in effect"), logs.lines
