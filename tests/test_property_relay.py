"""Property tests: roster row normalization and envelope/reply parsing (untrusted relay input).

Arbitrary JSON-ish values never raise anything but ``ValidationError``;
what is accepted satisfies the grammar and round-trips.
"""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from hermes_actors.core.ids import DELIVERY_ID_RE
from hermes_actors.core.names import HANDLE_RE
from hermes_actors.errors import ValidationError
from hermes_actors.messages import RemoteAgent
from hermes_actors.store.relay_protocol import (
    MAX_ENVELOPE_MESSAGE_CHARS,
    make_envelope,
    make_reply,
    parse_envelope,
    parse_reply,
)
from hermes_actors.store.relay_roster import normalize_roster, normalize_roster_row, roster_row_dict

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30)
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
name_like = st.one_of(
    st.from_regex(HANDLE_RE, fullmatch=True),
    st.text(max_size=70),
    st.sampled_from(["../x", "/etc/passwd", "a\x00b", "a" * 65, "a" * 64, "@bob", " bob ", "default", "", "-x",
                     "bob\n", "a" * 32 + "\n"]),
    json_scalars,
)
ROW_KEYS = ["profile", "handle", "connection_id", "connection_label", "title", "description", "online"]
rows = st.one_of(
    json_values,
    st.fixed_dictionaries({}, optional={k: st.one_of(name_like, json_values) for k in ROW_KEYS}),
    st.fixed_dictionaries(
        {"profile": name_like, "connection_id": name_like},
        optional={"handle": name_like, "connection_label": st.text(max_size=120), "title": st.text(max_size=200),
                  "description": st.text(max_size=300), "online": json_scalars, "extra": json_values},
    ),
)


@settings(max_examples=200, deadline=None)
@given(row=rows)
def test_roster_rows_never_raise_and_accepted_rows_obey_the_grammar(row: Any) -> None:
    agent = normalize_roster_row(row)
    if agent is None:
        return
    assert isinstance(agent, RemoteAgent)
    for name in (agent.profile, agent.handle, agent.connection_id):
        assert HANDLE_RE.fullmatch(name), name
        assert "/" not in name and "\x00" not in name and ".." not in name and len(name) <= 64
    assert len(agent.connection_label) <= 80 and len(agent.title) <= 120 and len(agent.description) <= 160
    assert agent.description.rstrip() == " ".join(agent.description.split())
    assert agent.online is None or isinstance(agent.online, bool)
    # The seed strips, then truncates: a cut may end in whitespace, which the next pass strips. From
    # the second pass on, the on-disk row is a fixed point of normalization.
    second = normalize_roster_row(roster_row_dict(agent))
    assert second is not None
    third = normalize_roster_row(roster_row_dict(second))
    assert third == second
    assert roster_row_dict(third) == roster_row_dict(second)


def normalize_roster_rows_again(agents: Any) -> Any:
    return normalize_roster([roster_row_dict(a) for a in agents])


@settings(max_examples=200, deadline=None)
@given(agents=st.one_of(json_values, st.lists(rows, max_size=6)))
def test_whole_rosters_normalize_to_a_fixed_point(agents: Any) -> None:
    # The seed strips and *then* truncates titles and labels, so a cut that ends in whitespace is
    # stripped once more on the next pass: the fixed point is reached after at most two passes.
    first = normalize_roster(normalize_roster_rows_again(normalize_roster(agents)))
    assert normalize_roster_rows_again(first) == first
    keys = [(a.connection_id, a.profile) for a in first]
    assert keys == sorted(set(keys))


envelope_fields = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.just(uuid.uuid4().hex), st.uuids().map(lambda u: u.hex), name_like),
        "created_at": st.one_of(st.integers(), st.floats(allow_nan=True, allow_infinity=True), json_scalars),
        "from_profile": name_like, "from_handle": name_like, "target_connection": name_like,
        "target_profile": name_like, "target_handle": name_like,
        "message": st.one_of(st.text(max_size=50), json_values),
        "hop": json_values,
    },
)


@settings(max_examples=200, deadline=None)
@given(data=st.one_of(json_values, envelope_fields), file_id=st.one_of(st.none(), name_like.filter(
    lambda v: isinstance(v, str))))
@example(data={"id": "a" * 32 + "\n", "created_at": 1, "from_profile": "a", "from_handle": "a",
               "target_connection": "b", "target_profile": "b", "target_handle": "b", "message": ""}, file_id=None)
@example(data={"id": "a" * 32, "created_at": 1, "from_profile": "alice\n", "from_handle": "a",
               "target_connection": "b", "target_profile": "b", "target_handle": "b", "message": ""}, file_id=None)
def test_parse_envelope_only_raises_validation_error(data: Any, file_id: str | None) -> None:
    try:
        env = parse_envelope(data, file_id=file_id)
    except ValidationError:
        return
    assert DELIVERY_ID_RE.fullmatch(env["id"]) and (file_id is None or env["id"] == file_id)
    for key in ("from_profile", "from_handle", "target_connection", "target_profile", "target_handle"):
        assert HANDLE_RE.fullmatch(env[key])
    assert isinstance(env["message"], str) and len(env["message"]) <= MAX_ENVELOPE_MESSAGE_CHARS
    assert parse_envelope(env) == env  # accepted input is a fixed point


handles = st.from_regex(HANDLE_RE, fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(profile=handles, handle=handles, conn=handles, sender=handles, sender_handle=handles,
       message=st.text(max_size=200), now=st.floats(min_value=0, max_value=4e9),
       hop=st.integers(min_value=1, max_value=50))
def test_make_then_parse_envelope_round_trips(profile: str, handle: str, conn: str, sender: str,
                                              sender_handle: str, message: str, now: float, hop: int) -> None:
    target = RemoteAgent(profile=profile, handle=handle, connection_id=conn)
    env = make_envelope(target=target, message=message, sender_profile=sender, sender_handle=sender_handle,
                        now=now, extra={"hop": hop})
    assert parse_envelope(env, file_id=env["id"]) == env
    assert env["created_at"] == int(now) and env["hop"] == hop


@settings(max_examples=200, deadline=None)
@given(bad=name_like.filter(lambda v: not (isinstance(v, str) and HANDLE_RE.match(v))))
def test_make_envelope_refuses_a_bad_name_with_a_validation_error(bad: Any) -> None:
    target = RemoteAgent(profile="moxie", handle="moxie", connection_id="mini")
    try:
        make_envelope(target=target, message="hi", sender_profile=bad, sender_handle="alice", now=1.0)
    except ValidationError:
        return
    raise AssertionError(f"accepted sender_profile {bad!r}")


reply_fields = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.uuids().map(lambda u: u.hex), name_like),
        "at": st.one_of(st.integers(), st.floats(allow_nan=True, allow_infinity=True), json_scalars),
        "reply": st.one_of(st.text(max_size=40), json_values),
        "error": st.one_of(st.text(max_size=40), json_values),
        "reason": st.one_of(st.text(max_size=20), json_values),
        "extra": json_values,
    },
)


@settings(max_examples=200, deadline=None)
@given(data=st.one_of(json_values, reply_fields))
@example(data={"id": "b" * 32 + "\n", "at": 0})
def test_parse_reply_only_raises_validation_error(data: Any) -> None:
    try:
        rec = parse_reply(data)
    except ValidationError:
        return
    assert set(rec) == {"id", "at", "reply", "error", "reason"}
    assert DELIVERY_ID_RE.fullmatch(rec["id"])
    assert all(isinstance(rec[k], str) for k in ("reply", "error", "reason"))
    assert parse_reply(rec) == rec


@settings(max_examples=200, deadline=None)
@given(envelope_id=st.uuids().map(lambda u: u.hex), reply=st.one_of(st.none(), st.text(max_size=60)),
       error=st.one_of(st.none(), st.text(max_size=60)), reason=st.one_of(st.none(), st.text(max_size=20)),
       now=st.floats(min_value=0, max_value=4e9))
def test_make_then_parse_reply_round_trips(envelope_id: str, reply: str | None, error: str | None,
                                           reason: str | None, now: float) -> None:
    rec = make_reply(envelope_id, reply=reply or "", error=error or "", reason=reason or "", now=now)
    assert parse_reply(rec, file_id=envelope_id) == rec


@settings(max_examples=200, deadline=None)
@given(envelope_id=name_like.filter(lambda v: not (isinstance(v, str) and DELIVERY_ID_RE.match(v))))
def test_make_reply_refuses_bad_ids(envelope_id: Any) -> None:
    try:
        make_reply(envelope_id, reply="x", now=1.0)
    except ValidationError:
        return
    raise AssertionError(f"accepted reply id {envelope_id!r}")
