"""Tests for the bot_relay protocol: pure rules (tables) and file I/O."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from roots import LogCapture

from hermes_actors.core.json_depth import MAX_WRITABLE_DEPTH, nests_deeper_than
from hermes_actors.errors import HostileFileError, StoreError, ValidationError
from hermes_actors.messages import RemoteAgent
from hermes_actors.store import relay_files as rf
from hermes_actors.store.relay_files import (
    claim_envelope,
    enqueue_envelope,
    list_ids,
    read_envelope,
    read_reply,
    read_roster,
    read_roster_version,
    roster_identity,
    sweep_stale,
    write_reply,
    write_roster,
)
from hermes_actors.store.relay_paths import RelayPaths
from hermes_actors.store.relay_protocol import (
    ENVELOPE_KEYS,
    REPLY_KEYS,
    STALE_AFTER_SECONDS,
    created_time,
    expired_error_text,
    expires_at,
    is_expired,
    make_envelope,
    make_reply,
    parse_envelope,
    parse_reply,
)
from hermes_actors.store.relay_quarantine import quarantine
from hermes_actors.store.relay_roster import (
    liveness,
    normalize_roster,
    normalize_roster_row,
    offline_error_text,
    parse_roster_payload,
    remote_target_forms,
    resolve_remote_target,
    roster_row_dict,
    roster_row_problem,
    target_aliases,
)

IS_ROOT = os.geteuid() == 0
NOW = 1_700_000_000.0
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def agent(profile: str, handle: str, conn: str, online: bool | None = None, label: str = "") -> RemoteAgent:
    return RemoteAgent(profile=profile, handle=handle, connection_id=conn, connection_label=label, online=online)


@pytest.fixture()
def paths(tmp_path: Path) -> RelayPaths:
    return RelayPaths.from_root(tmp_path).ensure()


# ── normalization ───────────────────────────────────────────────────────────

BASE = {"profile": "bob", "connection_id": "mini"}


def row(**kw: Any) -> dict[str, Any]:
    return {**BASE, **kw}


NORMALIZE_CASES: list[tuple[str, Any, RemoteAgent | None]] = [
    ("minimal", row(), agent("bob", "bob", "mini")),
    ("handle kept", row(handle="robert"), agent("bob", "robert", "mini")),
    ("handle @ stripped", row(handle="@robert"), agent("bob", "robert", "mini")),
    ("handle @@ stripped", row(handle=" @@robert "), agent("bob", "robert", "mini")),
    ("empty handle -> profile", row(handle=""), agent("bob", "bob", "mini")),
    ("handle only @ -> profile", row(handle="@"), agent("bob", "bob", "mini")),
    ("default -> hermes", {"profile": "default", "connection_id": "c1"}, agent("default", "hermes", "c1")),
    (
        "default explicit handle",
        {"profile": "default", "handle": "h", "connection_id": "c"},
        agent("default", "h", "c"),
    ),
    ("whitespace stripped", {"profile": " bob ", "connection_id": " mini "}, agent("bob", "bob", "mini")),
    ("non-str coerced", {"profile": 42, "connection_id": "c"}, agent("42", "42", "c")),
    ("64-char handle ok", row(handle="a" * 64), agent("bob", "a" * 64, "mini")),
    ("online true", row(online=True), agent("bob", "bob", "mini", online=True)),
    ("online false", row(online=False), agent("bob", "bob", "mini", online=False)),
    ("online str dropped", row(online="false"), agent("bob", "bob", "mini")),
    ("online int dropped", row(online=1), agent("bob", "bob", "mini")),
    ("online null dropped", row(online=None), agent("bob", "bob", "mini")),
    ("not a dict: list", [BASE], None),
    ("not a dict: str", "bob@mini", None),
    ("not a dict: None", None, None),
    ("missing profile", {"connection_id": "mini"}, None),
    ("missing connection", {"profile": "bob"}, None),
    ("blank profile", row(profile="   "), None),
    ("traversal profile", row(profile="../x"), None),
    ("traversal handle", row(handle="../x"), None),
    ("slash connection", row(connection_id="a/b"), None),
    ("space in handle", row(handle="a b"), None),
    ("newline in handle", row(handle="a\nb"), None),
    ("leading dash", row(handle="-x"), None),
    ("leading underscore", row(profile="_x"), None),
    ("65-char handle", row(handle="a" * 65), None),
    ("unicode handle", row(handle="bób"), None),
    ("quote injection", row(connection_id="x'; rm -rf /"), None),
]


@pytest.mark.parametrize(("name", "raw", "expected"), NORMALIZE_CASES, ids=[c[0] for c in NORMALIZE_CASES])
def test_normalize_roster_row(name: str, raw: Any, expected: RemoteAgent | None) -> None:
    assert normalize_roster_row(raw) == expected


@pytest.mark.parametrize(("name", "raw", "expected"), NORMALIZE_CASES, ids=[c[0] for c in NORMALIZE_CASES])
def test_roster_row_problem_names_exactly_the_refused_rows(name: str, raw: Any, expected: RemoteAgent | None) -> None:
    assert (roster_row_problem(raw) is None) == (expected is not None)


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("connection_label", "  " + "L" * 100, "L" * 80),
        ("connection_label", "Mac Mini", "Mac Mini"),
        ("title", "T" * 130 + "  ", "T" * 120),
        ("title", None, ""),
        ("description", "  a\n\tb   c  ", "a b c"),
        ("description", "word " * 50, ("word " * 32)[:160]),
        ("description", 7, "7"),
    ],
)
def test_normalize_text_fields(field: str, value: Any, expected: str) -> None:
    got = normalize_roster_row(row(**{field: value}))
    assert got is not None
    assert getattr(got, field) == expected


@pytest.mark.parametrize(
    ("a", "expected"),
    [
        (
            agent("bob", "b", "c", label="L"),
            {"profile": "bob", "handle": "b", "connection_id": "c", "connection_label": "L", "title": "",
             "description": ""},
        ),
        (
            agent("bob", "b", "c", online=False),
            {"profile": "bob", "handle": "b", "connection_id": "c", "connection_label": "", "title": "",
             "description": "", "online": False},
        ),
    ],
)
def test_roster_row_dict(a: RemoteAgent, expected: dict[str, Any]) -> None:
    assert roster_row_dict(a) == expected
    assert normalize_roster_row(roster_row_dict(a)) == a


def test_normalize_roster_dedupes_first_wins_and_sorts() -> None:
    rows = [
        {"profile": "zed", "connection_id": "b"},
        {"profile": "bob", "connection_id": "b", "title": "first"},
        {"profile": "bob", "connection_id": "b", "title": "second"},
        {"profile": "bob", "connection_id": "a"},
        {"profile": "../bad", "connection_id": "a"},
        "junk",
    ]
    got = normalize_roster(rows)
    assert [(a.connection_id, a.profile) for a in got] == [("a", "bob"), ("b", "bob"), ("b", "zed")]
    assert got[1].title == "first"


@pytest.mark.parametrize(
    ("data", "count"),
    [
        ({"updated_at": 1, "agents": [BASE, {"profile": "x", "connection_id": "y"}]}, 2),
        ({"agents": "nope"}, 0),
        ({"agents": None}, 0),
        ({}, 0),
        ([BASE], 0),
        ("agents", 0),
        (None, 0),
    ],
)
def test_parse_roster_payload(data: Any, count: int) -> None:
    assert len(parse_roster_payload(data)) == count


# ── resolution and forms ────────────────────────────────────────────────────

A = agent("bob", "bob", "mini")
B = agent("bob", "bob", "studio")
C = agent("writer", "moxie", "mini")
D = agent("default", "hermes", "studio")
ROSTER = [A, B, C, D]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("moxie", C),
        ("@Moxie", C),
        ("  moxie  ", C),
        ("writer", C),
        ("WRITER", C),
        ("bob", "ambiguous"),
        ("@bob", "ambiguous"),
        ("bob@mini", A),
        ("BOB@MINI", A),
        ("@bob@studio", B),
        ("bob @ studio", B),
        ("moxie@mini", C),
        ("moxie@studio", None),
        ("bob@nowhere", None),
        ("bob@", None),
        ("@", None),
        ("@mini", None),
        ("", None),
        ("   ", None),
        ("ghost", None),
        ("hermes", D),
        ("default@studio", D),
    ],
)
def test_resolve_remote_target(raw: str, expected: Any) -> None:
    assert resolve_remote_target(raw, ROSTER) == expected


def test_resolve_same_name_twice_on_one_connection_is_ambiguous() -> None:
    roster = [agent("bob", "robert", "mini"), agent("robert", "rob", "mini")]
    assert resolve_remote_target("robert@mini", roster) == "ambiguous"
    assert resolve_remote_target("rob", roster) == roster[1]


@pytest.mark.parametrize(
    ("roster", "taken", "expected"),
    [
        (ROSTER, frozenset(), ["bob@mini", "bob@studio", "moxie", "hermes"]),
        (ROSTER, {"hermes"}, ["bob@mini", "bob@studio", "moxie", "hermes@studio"]),
        (ROSTER, {"MOXIE"}, ["bob@mini", "bob@studio", "moxie@mini", "hermes"]),
        ([A], set(), ["bob"]),
        ([A], {"bob"}, ["bob@mini"]),
        # another agent's profile equals this handle: the bare form would be ambiguous
        ([C, agent("x", "writer", "studio")], set(), ["moxie", "writer@studio"]),
        ([], {"x"}, []),
    ],
)
def test_remote_target_forms(roster: list[RemoteAgent], taken: set[str], expected: list[str]) -> None:
    forms = remote_target_forms(roster, taken)
    assert forms == expected
    for form, a in zip(forms, roster, strict=True):
        assert resolve_remote_target(form, roster) == a


@pytest.mark.parametrize(("a", "expected"), [(A, {"bob"}), (C, {"moxie", "writer"}), (D, {"hermes", "default"})])
def test_target_aliases(a: RemoteAgent, expected: set[str]) -> None:
    assert target_aliases(a) == expected


# ── liveness ────────────────────────────────────────────────────────────────

OTHER = agent("zed", "zed", "mini", online=True)


@pytest.mark.parametrize(
    ("roster", "age", "expected"),
    [
        ([agent("bob", "bob", "mini", online=True)], 10.0, True),
        ([agent("bob", "bob", "mini", online=False)], 10.0, False),
        ([agent("bob", "bob", "mini")], 10.0, None),
        ([OTHER], 10.0, False),  # absent from a fresh roster
        ([agent("bob", "x", "studio", online=True)], 10.0, False),  # same profile, other connection
        ([OTHER], 600.0, False),  # exactly at the freshness limit: still fresh
        ([OTHER], 600.5, None),  # stale
        ([agent("bob", "bob", "mini", online=False)], 3600.0, None),  # stale beats offline
        ([], 10.0, None),  # empty
        ([agent("bob", "bob", "mini", online=False)], None, None),  # no roster file
        (normalize_roster([row(online="false")]), 10.0, None),  # non-bool flag dropped
        (normalize_roster([row(online=False)]), 10.0, False),
    ],
)
def test_liveness(roster: list[RemoteAgent], age: float | None, expected: bool | None) -> None:
    target = agent("bob", "bob", "mini", online=True)  # the caller's copy of the flag is irrelevant
    assert liveness(target, roster, age) is expected


@pytest.mark.parametrize(
    ("a", "expected"),
    [
        (
            agent("bob", "robert", "mini", label="Mac Mini"),
            "@robert on Mac Mini is offline right now — the message was NOT queued. "
            "Try again once that machine reconnects to the Desktop.",
        ),
        (
            agent("bob", "robert", "mini"),
            "@robert on mini is offline right now — the message was NOT queued. "
            "Try again once that machine reconnects to the Desktop.",
        ),
    ],
)
def test_offline_error_text(a: RemoteAgent, expected: str) -> None:
    assert offline_error_text(a) == expected


# ── envelopes ───────────────────────────────────────────────────────────────

EID = "0123456789abcdef0123456789abcdef"


def envelope(**kw: Any) -> dict[str, Any]:
    base = make_envelope(
        target=C, message="hello", sender_profile="default", sender_handle="hermes", now=NOW + 0.9, envelope_id=EID
    )
    base.update(kw)
    return base


def test_make_envelope_shape() -> None:
    env = make_envelope(target=C, message="hi", sender_profile="alice", sender_handle="al", now=NOW + 0.7)
    assert tuple(env) == ENVELOPE_KEYS
    assert len(env["id"]) == 32 and int(env["id"], 16) >= 0 and uuid.UUID(hex=env["id"]).version == 4
    assert env == {
        "id": env["id"],
        "created_at": int(NOW),
        "from_profile": "alice",
        "from_handle": "al",
        "target_connection": "mini",
        "target_profile": "writer",
        "target_handle": "moxie",
        "message": "hi",
    }
    assert isinstance(env["created_at"], int)


def test_make_envelope_ids_are_unique_and_extra_kept() -> None:
    a = make_envelope(target=C, message="m", sender_profile="p", sender_handle="h", now=NOW, extra={"hop": 3})
    b = make_envelope(target=C, message="m", sender_profile="p", sender_handle="h", now=NOW)
    assert a["id"] != b["id"]
    assert a["hop"] == 3 and "hop" not in b
    assert parse_envelope(a)["hop"] == 3


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"extra": {"message": "override"}}, "override core keys"),
        ({"sender_profile": "a b"}, "from_profile"),
        ({"sender_handle": "../x"}, "from_handle"),
        ({"envelope_id": "XYZ"}, "invalid envelope id"),
        ({"message": "x" * 32001}, "too long"),
    ],
)
def test_make_envelope_refuses(kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"target": C, "message": "m", "sender_profile": "p", "sender_handle": "h", "now": NOW}
    args.update(kwargs)
    with pytest.raises(ValidationError, match=match):
        make_envelope(**args)


def test_parse_envelope_round_trip_through_json() -> None:
    env = envelope(hop=2)
    assert parse_envelope(orjson.loads(orjson.dumps(env)), file_id=EID) == env
    assert parse_envelope(envelope(message="x" * 32000))["message"] == "x" * 32000
    assert parse_envelope(envelope(created_at=NOW + 0.25))["created_at"] == NOW + 0.25


def _nested(depth: int) -> Any:
    """A list nesting ``depth`` lists (itself included)."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(("value", "limit", "deeper"), [
    (5, 0, False), ("x", 0, False), ({}, 0, True), ({}, 1, False), ([[]], 1, True), ([[]], 2, False),
    ({"a": {"b": [1, 2]}}, 3, False), ({"a": {"b": [1, 2]}}, 2, True), ({"a": 1, "b": [[{"c": {}}]]}, 5, False),
    ({"a": 1, "b": [[{"c": {}}]]}, 4, True), (_nested(5000), 4999, True), (_nested(5000), 5000, False),
])
def test_nests_deeper_than_counts_objects_and_arrays(value: Any, limit: int, deeper: bool) -> None:
    assert nests_deeper_than(value, limit) is deeper


def test_the_writable_depth_is_what_orjson_writes() -> None:
    """The rule's limit is orjson's own: a value nested that deep is written, one level more is refused."""
    orjson.dumps(_nested(MAX_WRITABLE_DEPTH))
    with pytest.raises(TypeError, match="Recursion limit"):
        orjson.dumps(_nested(MAX_WRITABLE_DEPTH + 1))


def test_an_envelope_nested_deeper_than_the_relay_can_write_is_malformed() -> None:
    """Regression (hostile-files review): an extra key nested 300 deep was read as a sound envelope and failed at
    each write (the hub's post to the target's inbox/), answered as a temporary fault; it is malformed."""
    fine = {**envelope(), "x": _nested(MAX_WRITABLE_DEPTH - 1)}  # the envelope object makes it MAX deep
    assert parse_envelope(orjson.loads(orjson.dumps(fine)))["x"] == fine["x"]
    with pytest.raises(ValidationError, match=f"more than {MAX_WRITABLE_DEPTH} levels deep"):
        parse_envelope({**envelope(), "x": _nested(MAX_WRITABLE_DEPTH)})
    with pytest.raises(ValidationError, match="levels deep"):
        parse_envelope({**envelope(), "x": _nested(300)})


@pytest.mark.parametrize(("raw", "read"), [
    ("1796595038", 1796595038), (" 1796595038 ", 1796595038), ("1796595038.5", 1796595038.5), ("", 0),
    ("0", "0"),  # epoch 0 (the seed's float("0")): as the number 0 it would read as unknown
])
def test_a_numeric_string_created_at_is_read_as_the_seed_reads_it(raw: str, read: float) -> None:
    """Regression (seed-interop review, s3): the seed reads ``float(env.get("created_at") or mtime)``, so a numeric
    string is a valid creation time there; we quarantined the envelope (unanswered). One parse rule now
    (``parse_created_at``): the envelope carries the number, and its age counts from it."""
    parsed = parse_envelope(envelope(created_at=raw))
    assert parsed["created_at"] == read and type(parsed["created_at"]) is type(read)
    assert not is_expired(parse_envelope(envelope(created_at=str(int(NOW) - 10))), 900, NOW)
    assert is_expired(parse_envelope(envelope(created_at=str(int(NOW) - 1000))), 900, NOW)


# Every kind of created_at a writer may leave, by the seed's reading: falsy is unknown, anything else is float() of it
SEED_CREATED_AT = [None, 0, 0.0, -0.0, "", "0", "0.0", "-0", " 0 ", "00", "1796595038", "1_796_595_038", "1e3", "-5",
                   -5, int(NOW) - 10, NOW - 1000.5, str(int(NOW) - 10)]


@pytest.mark.parametrize("raw", SEED_CREATED_AT, ids=repr)
def test_an_envelopes_age_is_read_exactly_as_the_seeds_expression_reads_it(raw: Any) -> None:
    """Regression (review diffrev11 of the numeric-string reading, created_zero.py): ``"0"``, ``"0.0"`` and ``"-0"``
    were folded into the number 0, which reads as unknown (aged from the file's mtime), while the seed's
    ``float(env.get("created_at") or path.stat().st_mtime)`` takes a non-empty string as a number: epoch 0, so a
    seed gateway expired the DM and ours delivered it. Unknown now stays apart from epoch 0, here and once the
    parsed envelope is written on (the hub posts it to the target's ``inbox/``) and read again."""
    mtime = NOW - 100
    seed_created = float(raw or mtime)  # the seed, bot_relay._expire_if_stale
    parsed = parse_envelope(envelope(created_at=raw))
    assert created_time(parsed["created_at"]) == (float(raw) if raw else None)
    for ttl in (50, 900, 10**9):
        assert expires_at(parsed, ttl, fallback_created=mtime) == seed_created + ttl
        assert is_expired(parsed, ttl, NOW, fallback_created=mtime) is (NOW - seed_created > ttl)
    posted = parse_envelope(json.loads(json.dumps(parsed)))
    assert created_time(posted["created_at"]) == created_time(parsed["created_at"])


_MISSING = object()


def _without(key: str) -> dict[str, Any]:
    env = envelope()
    del env[key]
    return env


ENVELOPE_FAILURES: list[tuple[str, Any, str | None, str]] = [
    ("list", [envelope()], None, "not a JSON object"),
    ("null", None, None, "not a JSON object"),
    ("no id", _without("id"), None, "invalid envelope id"),
    ("upper id", envelope(id=EID.upper()), None, "invalid envelope id"),
    ("short id", envelope(id=EID[:-1]), None, "invalid envelope id"),
    ("int id", envelope(id=12), None, "invalid envelope id"),
    ("file id mismatch", envelope(), "f" * 32, "does not match its file name"),
    ("str created_at", envelope(created_at="soon"), None, "created_at"),
    ("nan str created_at", envelope(created_at="nan"), None, "created_at"),
    ("inf str created_at", envelope(created_at="1e400"), None, "created_at"),
    ("list created_at", envelope(created_at=[1700000000]), None, "created_at"),
    ("bool created_at", envelope(created_at=True), None, "created_at"),
    ("nan created_at", envelope(created_at=float("nan")), None, "created_at"),
    ("inf created_at", envelope(created_at=float("inf")), None, "created_at"),
    ("message int", envelope(message=5), None, "'message' is not a string"),
    ("message missing", _without("message"), None, "'message' is not a string"),
    ("message too long", envelope(message="x" * 32001), None, "too long"),
]
# A present hop is held to the one rule of both transports (core.hops.is_hop): the file relay used to run
# these as hop 1 where the Redis transport dropped them.
for _hop in ("abc", -5, 1.5, None, 1e40, True, 1001):
    ENVELOPE_FAILURES.append((f"hop={_hop!r}", envelope(hop=_hop), None, "'hop' is not an integer from 0 to 1000"))
for _field in ("from_profile", "from_handle", "target_connection", "target_profile", "target_handle"):
    for _bad in ("../x", "", "a b", 5, None):
        ENVELOPE_FAILURES.append((f"{_field}={_bad!r}", envelope(**{_field: _bad}), None, _field))
    ENVELOPE_FAILURES.append((f"{_field} missing", _without(_field), None, _field))


@pytest.mark.parametrize(
    ("name", "data", "file_id", "match"), ENVELOPE_FAILURES, ids=[c[0] for c in ENVELOPE_FAILURES]
)
def test_parse_envelope_refuses(name: str, data: Any, file_id: str | None, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        parse_envelope(data, file_id=file_id)


# ── replies ─────────────────────────────────────────────────────────────────


def test_make_reply_shape() -> None:
    rep = make_reply(EID, reply="yo", now=NOW + 0.5)
    assert tuple(rep) == REPLY_KEYS
    assert rep == {"id": EID, "at": int(NOW), "reply": "yo", "error": "", "reason": ""}
    err = make_reply(EID, error="boom", reason="unknown", now=NOW)
    assert (err["reply"], err["error"], err["reason"]) == ("", "boom", "unknown")
    assert parse_reply(orjson.loads(orjson.dumps(err)), file_id=EID) == err


@pytest.mark.parametrize("bad_id", ["", "x" * 32, EID.upper(), EID + "0", "../" + EID])
def test_make_reply_refuses_bad_id(bad_id: str) -> None:
    with pytest.raises(ValidationError, match="invalid envelope id"):
        make_reply(bad_id, now=NOW)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"id": EID}, {"id": EID, "at": 0, "reply": "", "error": "", "reason": ""}),
        ({"id": EID, "at": 5.5, "reply": None, "error": "e"}, {"id": EID, "at": 5.5, "reply": "", "error": "e",
                                                                "reason": ""}),
        ({"id": EID, "at": 1, "reply": "r", "error": "", "reason": "", "extra": 1},
         {"id": EID, "at": 1, "reply": "r", "error": "", "reason": ""}),
        # read as the seed's waiter reads them (it reads only error, reason and reply): before, each was refused
        # and quarantined, and the sender got delivery_timeout although the reply had arrived
        ({"id": EID, "at": "2026-12-06T22:00:00Z", "reply": "ok"}, {"id": EID, "at": 0, "reply": "ok", "error": "",
                                                                    "reason": ""}),
        ({"id": EID, "at": True}, {"id": EID, "at": 0, "reply": "", "error": "", "reason": ""}),
        ({"id": EID, "at": float("nan")}, {"id": EID, "at": 0, "reply": "", "error": "", "reason": ""}),
        ({"id": EID, "reply": 42}, {"id": EID, "at": 0, "reply": "42", "error": "", "reason": ""}),
        ({"id": EID, "reply": 2.5}, {"id": EID, "at": 0, "reply": "2.5", "error": "", "reason": ""}),
        ({"id": EID, "reply": 0}, {"id": EID, "at": 0, "reply": "", "error": "", "reason": ""}),  # seed: empty
        ({"at": 1, "reply": "ok"}, {"id": EID, "at": 1, "reply": "ok", "error": "", "reason": ""}),
        ({"id": None, "reply": "ok"}, {"id": EID, "at": 0, "reply": "ok", "error": "", "reason": ""}),
    ],
)
def test_parse_reply_lenient(data: dict[str, Any], expected: dict[str, Any]) -> None:
    assert parse_reply(data, file_id=EID) == expected


@pytest.mark.parametrize(
    ("data", "file_id", "match"),
    [
        ([], None, "not a JSON object"),
        ("reply", None, "not a JSON object"),
        ({"reply": "r"}, None, "invalid envelope id"),
        ({"id": "nope"}, None, "invalid envelope id"),
        ({"id": EID}, "e" * 32, "does not match"),
        ({"id": "", "reply": "r"}, EID, "invalid envelope id"),  # an id there, not the file's: never replaced
        ({"reply": "r"}, "nope", "invalid envelope id"),  # no id in the body and none in the name
        ({"id": EID, "reply": True}, None, "'reply'"),
        ({"id": EID, "reply": ["x"]}, None, "'reply'"),
        ({"id": EID, "error": 5}, None, "'error'"),  # the seed's waiter crashes on it: no reply to read
        ({"id": EID, "error": ["x"]}, None, "'error'"),
        ({"id": EID, "reason": 5}, None, "'reason'"),
        ({"id": EID, "reason": {}}, None, "'reason'"),
    ],
)
def test_parse_reply_refuses(data: Any, file_id: str | None, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        parse_reply(data, file_id=file_id)


# ── expiry ──────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("ttl", "expected"),
    [
        (900, "queued message to @moxie on mini expired after 900s waiting for the Desktop to drain it — "
              "it was NOT delivered. Resend once the Desktop reconnects."),
        (0.5, "queued message to @moxie on mini expired after 0.5s waiting for the Desktop to drain it — "
              "it was NOT delivered. Resend once the Desktop reconnects."),
        (900.0, "queued message to @moxie on mini expired after 900s waiting for the Desktop to drain it — "
                "it was NOT delivered. Resend once the Desktop reconnects."),
    ],
)
def test_expired_error_text(ttl: float, expected: str) -> None:
    assert expired_error_text("moxie", "mini", ttl) == expected


@pytest.mark.parametrize(
    ("env", "ttl", "now", "fallback", "expected"),
    [
        ({"created_at": 100}, 900, 100 + 899, None, False),
        ({"created_at": 100}, 900, 100 + 900, None, False),  # exactly at the TTL: not yet
        ({"created_at": 100}, 900, 100 + 901, None, True),
        ({"created_at": 100}, 0.5, 100.6, None, True),
        ({"created_at": 100}, 0, 10**9, None, False),  # ttl 0 disables
        ({"created_at": 100}, -1, 10**9, None, False),  # negative disables
        ({}, 900, 1000, 500, False),  # mtime fallback, fresh
        ({"created_at": 0}, 900, 2000, 500, True),  # 0 means unknown → fallback, old
        ({"created_at": "x"}, 900, 1000, None, True),  # unknown age is never delivered late
        ({}, 0, 1000, None, False),
    ],
)
def test_is_expired(env: dict[str, Any], ttl: float, now: float, fallback: float | None, expected: bool) -> None:
    assert is_expired(env, ttl, now, fallback_created=fallback) is expected


# ── paths ───────────────────────────────────────────────────────────────────


def test_relay_paths_layout_and_ensure(tmp_path: Path) -> None:
    p = RelayPaths.from_root(str(tmp_path))
    base = tmp_path / "bot_relay"
    assert (p.base, p.outbox, p.claimed, p.replies) == (base, base / "outbox", base / "claimed", base / "replies")
    assert (p.locks, p.tmp, p.quarantine, p.roster) == (
        base / "locks", tmp_path / ".bot_relay_tmp", base / "quarantine", base / "roster.json"
    )
    assert not base.exists()
    assert p.ensure() is p
    for d in p.directories():
        assert d.is_dir() and stat.S_IMODE(os.lstat(d).st_mode) == 0o700


def test_relay_paths_refuse_symlinked_base(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "bot_relay").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    p = RelayPaths.from_root(tmp_path)
    with pytest.raises(HostileFileError, match="symlink"):
        p.ensure()
    with pytest.raises(HostileFileError):
        write_roster(p, [BASE], now=NOW)
    assert list((tmp_path / "elsewhere").iterdir()) == []


# ── roster I/O ──────────────────────────────────────────────────────────────


def test_write_and_read_roster(paths: RelayPaths) -> None:
    rows = [row(online=True, title="t"), {"profile": "a", "connection_id": "z"}, row(title="dup"), {"profile": "-"}]
    assert write_roster(paths, rows, now=NOW + 0.4) == 2
    raw = paths.roster.read_bytes()
    doc = json.loads(raw)
    assert doc["updated_at"] == int(NOW)
    assert [r["profile"] for r in doc["agents"]] == ["bob", "a"]  # sorted by (connection_id, profile)
    assert list(doc["agents"][0]) == sorted(doc["agents"][0])  # sorted keys
    assert list(doc) == ["agents", "updated_at"]
    assert stat.S_IMODE(os.lstat(paths.roster).st_mode) == 0o600
    assert list(paths.tmp.iterdir()) == []
    mtime = os.lstat(paths.roster).st_mtime
    agents, age = read_roster(paths, now=mtime + 42)
    assert agents == normalize_roster(rows)
    assert age == pytest.approx(42)
    assert liveness(agents[0], agents, age) is True


def test_read_roster_missing(paths: RelayPaths) -> None:
    assert read_roster(paths) == ([], None)


def test_the_roster_identity_is_the_one_read_and_changes_with_each_rewrite(paths: RelayPaths) -> None:
    """Regression (rosterfresh): a DM's sender compares roster.json's identity now with the one its roster was
    read from; each rewrite (atomic, or in place to another size) must change it, a read must not."""
    assert roster_identity(paths.roster) is None
    assert read_roster_version(paths) == ([], None, None)
    write_roster(paths, [row(online=True)], now=NOW)
    first = roster_identity(paths.roster)
    assert first is not None
    agents, _age, identity = read_roster_version(paths)
    assert identity == first == roster_identity(paths.roster)
    assert [a.profile for a in agents] == ["bob"]
    write_roster(paths, [row(online=True)], now=NOW)  # the same rows again, atomically: a new inode
    second = roster_identity(paths.roster)
    assert second not in (None, first)
    paths.roster.write_text(json.dumps({"agents": [row(online=False)], "pad": "x"}))  # in place, another size
    assert roster_identity(paths.roster) not in (None, second)
    paths.roster.unlink()
    assert roster_identity(paths.roster) is None


def _hostile_roster(kind: str, p: RelayPaths) -> None:
    good = json.dumps({"agents": [BASE]})
    if kind == "symlink":
        real = p.base / "real.json"
        real.write_text(good)
        os.chmod(real, 0o600)
        p.roster.symlink_to(real)
        return
    text = {
        "huge": json.dumps({"agents": [BASE], "pad": "x" * (1 << 20)}),
        "corrupt": '{"agents": [',
        "array": json.dumps([BASE]),
    }.get(kind, good)
    p.roster.write_text(text)
    os.chmod(p.roster, 0o660 if kind == "group-writable" else 0o600)
    if kind == "wrong-owner":
        os.chown(p.roster, 65534, -1)


ROSTER_HOSTILE = [
    "symlink",
    "huge",
    "corrupt",
    "array",
    "group-writable",
    pytest.param("wrong-owner", marks=pytest.mark.skipif(not IS_ROOT, reason="needs root")),
]


@pytest.mark.parametrize("kind", ROSTER_HOSTILE)
def test_read_roster_hostile_is_empty_and_unknown(paths: RelayPaths, kind: str, warnings: list[str]) -> None:
    _hostile_roster(kind, paths)
    agents, age, identity = read_roster_version(paths, now=os.lstat(paths.roster).st_mtime + 1)
    assert agents == []
    assert age == pytest.approx(1)
    assert identity == roster_identity(paths.roster) is not None  # a symlink's own: a re-read is not asked again
    assert liveness(agent("bob", "bob", "mini"), agents, age) is None
    if kind != "array":  # a valid JSON array is simply not a roster: no warning needed
        assert any("ignoring relay roster" in w for w in warnings)


def _write_roster_file(p: RelayPaths, rows: list[Any], mtime: float) -> None:
    p.roster.write_text(json.dumps({"agents": rows, "updated_at": "x"}))
    os.chmod(p.roster, 0o600)
    os.utime(p.roster, (mtime, mtime))


def test_refused_roster_rows_are_named_in_one_warning_per_version_of_the_file(
    paths: RelayPaths, logs: LogCapture
) -> None:
    """Rows of the wrong types were dropped silently: every DM to ``dave@mini`` was then refused ``no teammate
    named 'dave@mini'`` with nothing naming the cause. The roster is re-read at every reload: one warning per
    version of the file, not one per read. Rows are numbered from 1, as a person counts them (regression, docs
    review: they were numbered from 0, so the warning's ``row 2`` was the file's third row)."""
    hostile = [{"connection_id": 5, "handle": ["x"], "profile": None, "online": "yes"}, "str",
               {"connection_id": "mini", "handle": "../x", "profile": "x"}, {"profile": "dave", "connection_id": 5,
                                                                             "handle": ["x"]}]
    _write_roster_file(paths, [*hostile, {"profile": "carol", "connection_id": "mini"}], NOW)
    for _ in range(5):
        agents, _age = read_roster(paths, now=NOW + 1)
        assert [a.profile for a in agents] == ["carol"]
    [line] = logs.matching(str(paths.roster), "4 row(s) refused")
    assert "row 1: no profile" in line and "row 2: a str, not an object" in line, line
    assert "row 3: handle '../x' is not a name" in line and "row 4: handle \"['x']\" is not a name" in line, line
    _write_roster_file(paths, [{"profile": "../y", "connection_id": "mini"}], NOW + 5)  # a new version: news
    read_roster(paths, now=NOW + 6)
    read_roster(paths, now=NOW + 6)
    assert len(logs.matching(str(paths.roster), "refused")) == 2, logs.lines
    assert "row 1: profile '../y' is not a name" in logs.lines[-1]


def test_a_hostile_roster_is_warned_about_once_not_at_every_read(paths: RelayPaths, logs: LogCapture) -> None:
    """A corrupt roster's warning repeated at every reload (every 0.6 s on a running gateway)."""
    _hostile_roster("corrupt", paths)
    for _ in range(5):
        assert read_roster(paths)[0] == []
    assert len(logs.matching("ignoring relay roster", str(paths.roster))) == 1, logs.lines
    paths.roster.unlink()
    assert read_roster(paths) == ([], None)
    _hostile_roster("corrupt", paths)  # back after it was gone: said again
    read_roster(paths)
    assert len(logs.matching("ignoring relay roster", str(paths.roster))) == 2, logs.lines


# ── envelope I/O ────────────────────────────────────────────────────────────


def test_enqueue_claim_read(paths: RelayPaths) -> None:
    env = envelope(hop=1)
    out = enqueue_envelope(paths, env)
    assert out == paths.outbox / f"{EID}.json"
    assert os.listdir(paths.outbox) == [f"{EID}.json"]
    assert os.listdir(paths.tmp) == []
    assert stat.S_IMODE(os.lstat(out).st_mode) == 0o600
    assert list_ids(paths.outbox) == [EID]
    claimed = claim_envelope(paths, EID)
    assert claimed == paths.claimed / f"{EID}.json"
    assert list_ids(paths.outbox) == []
    assert read_envelope(claimed) == env
    assert claim_envelope(paths, EID) is None


def test_enqueue_invalid_writes_nothing(paths: RelayPaths) -> None:
    with pytest.raises(ValidationError, match="target_handle"):
        enqueue_envelope(paths, envelope(target_handle="../../etc"))
    assert os.listdir(paths.outbox) == [] and os.listdir(paths.tmp) == []


@pytest.mark.parametrize("bad", ["../" + EID, EID.upper(), "x", ""])
def test_claim_refuses_bad_ids(paths: RelayPaths, bad: str) -> None:
    with pytest.raises(ValidationError):
        claim_envelope(paths, bad)


def test_read_envelope_refuses_mismatched_name(paths: RelayPaths) -> None:
    other = "f" * 32
    path = paths.outbox / f"{other}.json"
    path.write_text(json.dumps(envelope()))
    os.chmod(path, 0o600)
    with pytest.raises(ValidationError, match="does not match"):
        read_envelope(path)
    with pytest.raises(ValidationError, match="not an envelope file name"):
        read_envelope(paths.outbox / "x.json")


def test_claim_symlink_is_quarantined(paths: RelayPaths, tmp_path: Path, warnings: list[str]) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text("{}")
    (paths.outbox / f"{EID}.json").symlink_to(secret)
    assert claim_envelope(paths, EID) is None
    assert os.listdir(paths.claimed) == []
    moved = list(paths.quarantine.iterdir())
    assert len(moved) == 1 and moved[0].is_symlink() and moved[0].name.startswith(f"{EID}.json.")
    assert secret.read_text() == "{}"
    assert any("not a regular file" in w for w in warnings)


def test_claim_race_threads_exactly_one_wins(paths: RelayPaths) -> None:
    ids = [uuid.uuid4().hex for _ in range(40)]
    for i in ids:
        enqueue_envelope(paths, envelope(id=i))
    n = 8
    barrier = threading.Barrier(n)
    wins: dict[str, list[int]] = {i: [] for i in ids}
    lock = threading.Lock()

    def drain(worker: int) -> None:
        barrier.wait()
        for i in ids:
            if claim_envelope(paths, i) is not None:
                with lock:
                    wins[i].append(worker)

    threads = [threading.Thread(target=drain, args=(w,)) for w in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(len(w) == 1 for w in wins.values()), wins
    assert list_ids(paths.claimed) == sorted(ids)


CLAIMER = textwrap.dedent(
    """
    import json, sys
    from hermes_actors.store.relay_files import claim_envelope
    from hermes_actors.store.relay_paths import RelayPaths
    paths = RelayPaths.from_root(sys.argv[1])
    ids = sys.argv[2].split(",")
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps([i for i in ids if claim_envelope(paths, i) is not None]), flush=True)
    """
)


def test_claim_race_processes_exactly_one_wins(paths: RelayPaths) -> None:
    ids = [uuid.uuid4().hex for _ in range(200)]
    for i in ids:
        enqueue_envelope(paths, envelope(id=i))
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, str(paths.base.parent), ",".join(ids)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )
        for _ in range(2)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    won = [set(json.loads(p.communicate(timeout=60)[0])) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert won[0].isdisjoint(won[1])
    assert won[0] | won[1] == set(ids)


# ── reply I/O ───────────────────────────────────────────────────────────────


def test_first_reply_wins(paths: RelayPaths) -> None:
    assert read_reply(paths, EID) is None
    first = make_reply(EID, reply="first", now=NOW)
    assert write_reply(paths, first) is True
    assert write_reply(paths, make_reply(EID, error="late", reason="queued_expired", now=NOW + 1)) is False
    assert read_reply(paths, EID) == first
    assert os.listdir(paths.tmp) == []
    assert stat.S_IMODE(os.lstat(paths.replies / f"{EID}.json").st_mode) == 0o600


def test_reply_race_threads_exactly_one_wins(paths: RelayPaths) -> None:
    n = 8
    barrier = threading.Barrier(n)
    results: list[tuple[int, bool]] = []

    def send(i: int) -> None:
        barrier.wait()
        results.append((i, write_reply(paths, make_reply(EID, reply=f"r{i}", now=NOW))))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, ok in results if ok]
    assert len(winners) == 1
    stored = read_reply(paths, EID)
    assert stored is not None and stored["reply"] == f"r{winners[0]}"


def test_write_reply_invalid_writes_nothing(paths: RelayPaths) -> None:
    with pytest.raises(ValidationError):
        write_reply(paths, {"id": "../../x", "reply": "r"})
    with pytest.raises(ValidationError):
        write_reply(paths, {"id": EID, "error": 5})
    assert os.listdir(paths.replies) == []


def test_write_reply_store_failure(paths: RelayPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "link", full)
    with pytest.raises(StoreError, match="ENOSPC"):
        write_reply(paths, make_reply(EID, reply="r", now=NOW))
    monkeypatch.undo()
    assert os.listdir(paths.tmp) == [] and os.listdir(paths.replies) == []


def _put(path: Path, text: str, mode: int = 0o600) -> None:
    path.write_text(text)
    os.chmod(path, mode)


def _symlink_to_sibling(path: Path) -> None:
    _put(path.with_name("x"), "{}")
    path.symlink_to(path.with_name("x"))


@pytest.mark.parametrize(
    ("make", "exc", "match"),
    [
        (lambda p: _put(p, "{nope"), HostileFileError, "not valid JSON"),
        (lambda p: _put(p, json.dumps(make_reply(EID, now=NOW)), 0o622), HostileFileError, "writable"),
        (_symlink_to_sibling, HostileFileError, "symlink"),
        (lambda p: _put(p, json.dumps([1])), ValidationError, "not a JSON object"),
        (lambda p: _put(p, json.dumps(make_reply("a" * 32, now=NOW))), ValidationError, "does not match"),
    ],
    ids=["corrupt", "group-writable", "symlink", "array", "wrong id"],
)
def test_read_reply_refuses(
    paths: RelayPaths, make: Callable[[Path], Any], exc: type[Exception], match: str
) -> None:
    make(paths.replies / f"{EID}.json")
    with pytest.raises(exc, match=match):
        read_reply(paths, EID)


# ── quarantine / sweep / list ───────────────────────────────────────────────


def test_quarantine_regular_and_missing(paths: RelayPaths, warnings: list[str]) -> None:
    bad = paths.replies / f"{EID}.json"
    _put(bad, "{nope")
    dest = quarantine(paths, bad, "corrupt JSON")
    assert dest is not None and dest.parent == paths.quarantine
    assert not bad.exists() and dest.read_text() == "{nope"
    assert any("corrupt JSON" in w for w in warnings)
    assert quarantine(paths, bad, "again") is None
    _put(bad, "{x")
    second = quarantine(paths, bad, "again")
    assert second is not None and second != dest


def test_quarantine_moves_symlink_itself(paths: RelayPaths, tmp_path: Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("keep")
    link = paths.outbox / f"{EID}.json"
    link.symlink_to(target)
    dest = quarantine(paths, link, "symlink")
    assert dest is not None and dest.is_symlink() and os.readlink(dest) == str(target)
    assert not os.path.lexists(link)
    assert target.read_text() == "keep"


def test_sweep_stale(paths: RelayPaths, tmp_path: Path) -> None:
    cutoff = NOW - STALE_AFTER_SECONDS
    old, young, edge = cutoff - 1, cutoff + 1, cutoff
    expected_gone: list[Path] = []
    kept: list[Path] = []
    for d in (paths.claimed, paths.replies, paths.outbox, paths.tmp):
        for name, mtime in (("old.json", old), ("young.json", young), ("edge.json", edge), (".x.tmp", old)):
            f = d / name
            _put(f, "{}")
            os.utime(f, (mtime, mtime))
            (expected_gone if mtime < cutoff else kept).append(f)
    outside = tmp_path / "outside.json"
    _put(outside, "{}")
    os.utime(outside, (old, old))
    link = paths.replies / "link.json"
    link.symlink_to(outside)
    os.utime(link, (old, old), follow_symlinks=False)
    q = paths.quarantine / "q.json"
    _put(q, "{}")
    os.utime(q, (old, old))
    subdir = paths.claimed / "sub"
    subdir.mkdir()
    os.utime(subdir, (old, old))

    assert sweep_stale(paths, now=NOW) == len(expected_gone) == 8
    assert not any(os.path.lexists(f) for f in expected_gone)
    assert all(f.exists() for f in kept)
    assert os.path.islink(link) and outside.exists() and q.exists() and subdir.is_dir()
    assert sweep_stale(paths, now=NOW) == 0


def test_sweep_missing_dirs(tmp_path: Path) -> None:
    assert sweep_stale(RelayPaths.from_root(tmp_path), now=NOW) == 0


def test_list_ids(paths: RelayPaths, tmp_path: Path) -> None:
    ids = sorted(uuid.uuid4().hex for _ in range(3))
    names = [f"{i}.json" for i in ids] + [
        f"{ids[0].upper()}.json", f".{ids[0]}.json.abc.tmp", f"{ids[0]}.json.bak", "roster.json",
        f"{ids[0][:-1]}.json", f"{ids[0]}0.json",
    ]
    for n in names:
        _put(paths.outbox / n, "{}")
    assert list_ids(paths.outbox) == ids
    assert list_ids(tmp_path / "missing") == []


# ── compatibility with the seed ─────────────────────────────────────────────


def _seed_dump(path: Path, payload: Any) -> None:
    """Write like the seed does: json.dump, ensure_ascii=False, default separators."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, ensure_ascii=False)
    os.chmod(path, 0o600)


def test_seed_written_files_parse(paths: RelayPaths) -> None:
    env = {
        "id": EID, "created_at": 1700000000, "from_profile": "default", "from_handle": "hermes",
        "target_connection": "mini", "target_profile": "writer", "target_handle": "moxie", "message": "héllo 🤖",
    }
    _seed_dump(paths.outbox / f"{EID}.json", env)
    claimed = claim_envelope(paths, EID)
    assert claimed is not None and read_envelope(claimed) == env
    rep = {"id": EID, "at": 1700000001, "reply": "", "error": "boom", "reason": "provider_rate_limit"}
    _seed_dump(paths.replies / f"{EID}.json", rep)
    assert read_reply(paths, EID) == rep
    roster = {"updated_at": 1700000000, "agents": [{"connection_id": "mini", "connection_label": "Mini",
              "description": "", "handle": "moxie", "online": True, "profile": "writer", "title": ""}]}
    _seed_dump(paths.roster, roster)
    agents, _ = read_roster(paths)
    assert [roster_row_dict(a) for a in agents] == roster["agents"]


def test_our_files_read_like_the_seed(paths: RelayPaths) -> None:
    env = make_envelope(target=C, message="hé", sender_profile="default", sender_handle="hermes", now=NOW)
    with open(enqueue_envelope(paths, env), encoding="utf-8") as f:
        assert json.load(f) == env
    write_reply(paths, make_reply(env["id"], error="nope", reason="unknown", now=NOW))
    with open(paths.replies / f"{env['id']}.json", encoding="utf-8") as f:
        d = json.load(f)
    assert set(d) == set(REPLY_KEYS) and d.get("error") == "nope" and str(d.get("reason")) == "unknown"
    write_roster(paths, [row(online=False)], now=NOW)
    with open(paths.roster, encoding="utf-8") as f:
        doc = json.load(f)
    assert doc == {"updated_at": int(NOW), "agents": [
        {"connection_id": "mini", "connection_label": "", "description": "", "handle": "bob", "online": False,
         "profile": "bob", "title": ""}]}


def test_relay_files_exports_only_its_io_and_defines_what_it_exports() -> None:
    # The pure rules are imported from relay_protocol / relay_roster, never re-exported here.
    for name in rf.__all__:
        assert getattr(rf, name).__module__ == rf.__name__, name


# ── the started mark of a relayed-in turn ───────────────────────────────────


@pytest.mark.parametrize("fsync", [True, False])
def test_the_started_mark_is_written_before_the_turn_and_flushed_only_when_asked(
    fsync: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hermes_actors.store import atomic
    from hermes_actors.store.relay_inbox import InboxPaths
    from hermes_actors.store.relay_marks import TurnStartMarks, was_started

    paths = InboxPaths.from_root(tmp_path).ensure()
    flushed: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: (flushed.append(fd), real_fsync(fd))[1])
    envelope_id = uuid.uuid4().hex
    marks = TurnStartMarks(tmp_path, fsync=fsync)
    marks.append_durably({"t": "finished", "id": envelope_id})  # not a start: nothing written
    assert not was_started(paths, envelope_id)
    marks.append_durably({"t": "started", "id": envelope_id})
    assert was_started(paths, envelope_id)
    assert json.loads((paths.started / f"{envelope_id}.json").read_text())["id"] == envelope_id
    assert len(flushed) == (1 if fsync else 0)
    assert list(paths.relay.tmp.iterdir()) == [] and not (paths.relay.base / "tmp").exists()


def test_a_refused_started_mark_is_a_store_error_so_the_turn_never_runs(tmp_path: Path) -> None:
    from hermes_actors.store.relay_inbox import InboxPaths
    from hermes_actors.store.relay_marks import TurnStartMarks, was_started

    paths = InboxPaths.from_root(tmp_path).ensure()
    outside = tmp_path / "outside"
    outside.mkdir()
    paths.relay.tmp.rmdir()
    paths.relay.tmp.symlink_to(outside, target_is_directory=True)
    envelope_id = uuid.uuid4().hex
    with pytest.raises(StoreError, match="refused"):
        TurnStartMarks(tmp_path).append_durably({"t": "started", "id": envelope_id})
    assert not was_started(paths, envelope_id) and list(outside.iterdir()) == []
