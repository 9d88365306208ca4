"""The CLI's pure renderers: one human line per refusal or outcome, exit codes, clipping at word boundaries."""

from __future__ import annotations

import json
import shlex

import pytest

from hermes_actors.cli.render import (
    ack_line,
    answer_exit_code,
    ascii_json,
    clip,
    json_text,
    not_managed_note,
    outcome_exit_code,
    outcome_line,
    refusal_line,
    status_text,
)
from hermes_actors.core import outcomes
from hermes_actors.ops.status import STATUS_KEYS


@pytest.mark.parametrize(
    ("text", "width", "expected"),
    [
        ("short", 10, "short"),
        ("another delivery turn is already running for profile", 30, "another delivery turn is…"),
        ("a\nb  c", 10, "a b c"),
        ("x" * 20, 8, "xxxxxxx…"),  # one long word: cut inside it, there is no boundary
        ("cut after the comma, here", 22, "cut after the comma…"),
    ],
)
def test_clip(text: str, width: int, expected: str) -> None:
    assert clip(text, width) == expected
    assert len(clip(text, width)) <= width


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ({"error": "No teammate named 'nobody' on this install, on a connected machine, or on a registered peer. "
                   "Pick a name from the roster (roles are listed in your system prompt).", "reason": "unknown",
          "teammates": ["scout", "scribe"], "peers": []},
         "refused [unknown]: no teammate named 'nobody' — teammates: @scout, @scribe"),
        # a huge name, as core.targets cuts it: still one short line (regression: the CLI fuzz)
        ({"error": "No teammate named 'aaaa…' (100,005 characters) on this install, on a connected machine, or on a "
                   "registered peer. Pick a name from the roster (roles are listed in your system prompt).",
          "reason": "unknown", "teammates": ["scout"], "peers": []},
         "refused [unknown]: no teammate named 'aaaa…' (100,005 characters) — teammates: @scout"),
        ({"error": "You can't message yourself. Pick a teammate from the roster.", "reason": "unknown"},
         "refused [unknown]: You can't message yourself"),
        ({"error": "target_busy: the queue is full.", "reason": "target_busy", "teammates": [], "peers": ["mini"]},
         "refused [target_busy]: the queue is full — teammates: none; peers: mini"),
        ({"error": "This install is not Bot-Mode-managed (no bot roster); message_agent is unavailable. Do not retry.",
          "reason": "unknown"},
         "refused [unknown]: This install is not Bot-Mode-managed (no bot roster); message_agent is unavailable"),
        ({"error": "message is required — compose what you want to say to that agent.", "reason": "unknown"},
         "refused [unknown]: message is required"),
    ],
)
def test_refusal_line(answer: dict[str, object], expected: str) -> None:
    assert refusal_line(answer) == expected
    assert answer_exit_code(answer) == 1


def test_outcome_lines_and_exit_codes() -> None:
    busy = outcomes.failed("a" * 32, "@scribe", outcomes.busy_text("scribe", 0.5), "target_busy").as_dict()
    assert outcome_line(busy).startswith("failed [target_busy] @scribe: another delivery turn is already running")
    assert outcome_exit_code(busy) == 1
    replied = outcomes.from_reply("a" * 32, "@bob", "hi").as_dict()
    assert (outcome_line(replied), outcome_exit_code(replied)) == ("Reply from @bob: hi", 0)
    silent = outcomes.from_reply("a" * 32, "@bob", "").as_dict()
    assert outcome_exit_code(silent) == 0
    vague = outcomes.ambiguous("a" * 32, "@bob", "The host died.").as_dict()
    assert outcome_line(vague).startswith("ambiguous [unknown] @bob: The host died.")
    assert outcome_exit_code(vague) == 1
    assert outcome_exit_code({"status": "pending", "delivery_id": "x"}) == 1
    assert outcome_exit_code({"status": "unknown", "delivery_id": "x"}) == 1
    assert outcome_exit_code({"error": "no host"}) == 1


def test_ack_line_names_the_lookup_command() -> None:
    ack = {"status": "queued", "delivery_id": "b" * 32, "to": "@bob"}
    assert ack_line(ack, "/r") == f"queued for @bob: delivery {'b' * 32} (hermes-actors outcome --root /r {'b' * 32})"
    assert answer_exit_code(ack) == 0


def test_printed_commands_quote_a_root_with_a_space() -> None:
    """Regression (review diffrev12): the commands these lines name were built unquoted, so a root with a space gave
    a command the shell splits (``--root /srv/my`` and a stray ``hermes``). Each word is quoted now."""
    root, key = "/srv/my hermes", "b" * 32
    assert ack_line({"status": "queued", "delivery_id": key, "to": "@bob"}, root) == (
        f"queued for @bob: delivery {key} (hermes-actors outcome --root '/srv/my hermes' {key})")
    assert not_managed_note(root).endswith("fix: hermes-actors enable --root '/srv/my hermes'")
    status = {key: None for key in STATUS_KEYS} | {
        "root": root, "running": False, "managed": False, "profiles": [], "in_flight": [], "counters": {},
        "relay": {"transport": "file", "outbox": 0, "peers": []}, "problems": [],
    }
    text = status_text(status)
    assert "(start one: hermes-actors serve --root '/srv/my hermes')" in text, text
    fix = next(line for line in text.splitlines() if "not Bot-Mode-managed" in line).split("fix: ", 1)[1]
    assert shlex.split(fix) == ["hermes-actors", "enable", "--root", root]


def test_status_text_of_an_unmanaged_idle_root() -> None:
    status = {key: None for key in STATUS_KEYS} | {
        "root": "/r", "running": False, "managed": False, "profiles": [], "in_flight": [], "counters": {},
        "relay": {"transport": "file", "outbox": 0, "peers": []}, "problems": ["1 corrupt journal line(s) skipped"],
    }
    text = status_text(status)
    assert "gateway: none serves /r" in text
    assert "fix: hermes-actors enable --root /r" in text
    assert "problem: 1 corrupt journal line(s) skipped" in text


def test_status_text_labels_claimed_and_replies_as_files_kept_until_the_sweep() -> None:
    """Regression (soak review): ``claimed 2326, replies 2326`` next to ``in flight: 0`` read as DMs stuck in the
    relay; those directories keep envelopes already handed on and replies already written until the 6 h sweep."""
    relay = {"transport": "file", "outbox": 0, "claimed": 2326, "replies": 2326, "inbox": 1, "taken": 0,
             "quarantine": 0, "roster_age_seconds": None, "remote_agents": 0}
    status = {"root": "/r", "running": False, "relay": relay, "in_flight": [], "counters": {}}
    [line] = [line for line in status_text(status).splitlines() if line.startswith("relay: ")]
    assert line == ("relay: file; outbox 0, inbox 1, taken 0, quarantine 0; "
                    "kept until the 6 h sweep: claimed 2326, replies 2326; no relay roster")
    none_there = {**relay, **dict.fromkeys(("outbox", "claimed", "replies", "inbox", "taken", "quarantine"))}
    assert "relay: file; no relay directories; no relay roster" in status_text({**status, "relay": none_there})


def test_status_text_shows_the_unconfirmed_redis_sends() -> None:
    """Regression (review): the sends a Redis stall left unconfirmed (``bot_relay/unconfirmed/``) were counted
    nowhere in ``status``; they are shown with what waits (left out while that directory was never made)."""
    relay = {"transport": "redis", "outbox": 0, "inbox": 0, "taken": 0, "quarantine": 0, "unconfirmed": 2,
             "roster_age_seconds": None, "remote_agents": 0}
    status = {"root": "/r", "running": False, "relay": relay, "in_flight": [], "counters": {}}
    [line] = [line for line in status_text(status).splitlines() if line.startswith("relay: ")]
    assert line.startswith("relay: redis; outbox 0, inbox 0, taken 0, quarantine 0, unconfirmed 2; "), line
    never = {**relay, "unconfirmed": None}
    [line] = [line for line in status_text({**status, "relay": never}).splitlines() if line.startswith("relay: ")]
    assert "unconfirmed" not in line


@pytest.mark.parametrize(("value", "expected"), [
    ({"a": "plain ü"}, '{"a":"plain ü"}'),
    ({"path": "j-\udcff\udcfe.log"}, '{"path":"j-\\\\udcff\\\\udcfe.log"}'),  # an undecodable byte of a name
    ({"k\udcff": ["x", "\ud800", 1, None]}, '{"k\\\\udcff":["x","\\\\ud800",1,null]}'),  # keys, lists, lone ones
    (["\U0001f600"], '["\U0001f600"]'),  # a real character outside the BMP is kept
])
def test_json_text_escapes_only_lone_surrogates(value: object, expected: str) -> None:
    assert json_text(value) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ('{"a": "Zo\u00eb"}', '{"a": "Zo\\u00eb"}'),
    ('{"a": "\u2603"}', '{"a": "\\u2603"}'),
    ('{"a": "\U0001f600"}', '{"a": "\\ud83d\\ude00"}'),  # beyond the BMP: a surrogate pair, as JSON says it
    ('{\n  "\u00e9": [\n    1\n  ]\n}', '{\n  "\\u00e9": [\n    1\n  ]\n}'),  # indentation kept
    ('{"a": "plain"}', '{"a": "plain"}'),
])
def test_ascii_json_escapes_non_ascii_as_json_does(text: str, expected: str) -> None:
    assert ascii_json(text) == expected
    assert json.loads(ascii_json(text)) == json.loads(text)


def test_json_text_indents_as_before() -> None:
    assert json_text({"a": [1]}, indent=True) == '{\n  "a": [\n    1\n  ]\n}'
    assert json_text({"a": "\udcff"}, indent=True) == '{\n  "a": "\\\\udcff"\n}'


def test_json_text_escapes_what_its_default_makes_of_a_value_too() -> None:
    """Regression (diff review of cliedges): with ``default=str``, a value JSON cannot say whose text holds a lone
    surrogate (a ``Path`` of a non-UTF-8 name, an exception naming one) still raised TypeError: only the value's own
    strings were escaped. Now ``default``'s output is escaped by the same rule."""
    from pathlib import Path

    from hermes_actors.cli.render import json_text

    text = json_text({"p": Path("/tmp/\udcff"), "e": ValueError("x\udcff")}, default=str)
    assert json.loads(text) == {"p": "/tmp/\\udcff", "e": "x\\udcff"}
