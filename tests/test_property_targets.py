"""Property tests: target parsing/resolution and message validation (``targets.plan_send``).

Over arbitrary text, ``plan_send`` never raises, always answers a Refusal or a
route, and only ever routes to a profile of the roster (or a remote agent of
the relay roster, or a registered peer). Message bounds are exact.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from hermes_actors.core.names import HANDLE_RE
from hermes_actors.core.reasons import VOCABULARY
from hermes_actors.core.targets import (
    MESSAGE_MAX_CHARS,
    LocalRoute,
    PeerRoute,
    Refusal,
    RelayRoute,
    plan_send,
)
from hermes_actors.local.roster import make_snapshot
from hermes_actors.messages import ProfileInfo, RemoteAgent
from hermes_actors.store.hermes_root import alias_forms

HOME = Path("/nonexistent/hermes-root")
PROFILES = (
    ProfileInfo("default", "hermes", HOME, "Hermes", "Coordinator", managed=True),
    ProfileInfo("alice", "alice", HOME / "profiles/alice", "Alice Liddell", "Researcher", managed=True),
    ProfileInfo("bob", "bob", HOME / "profiles/bob", "bob", "Builder", "builds things", managed=True),
    ProfileInfo("carol", "carol", HOME / "profiles/carol", "Carol", "Critic", managed=True),
    ProfileInfo("dup-1", "dup-1", HOME / "profiles/dup-1", "Twin", "Twin", managed=True),
    ProfileInfo("dup-2", "dup-2", HOME / "profiles/dup-2", "Twin", "Twin", managed=True),
)
REMOTE = (
    RemoteAgent("moxie", "moxie", "mini", "Mini", "Builder", "", True),
    RemoteAgent("bob", "bob", "mini", "Mini", "", "", None),
    RemoteAgent("zed", "zed", "far", "", "", "", False),
)
PEERS = ("lab",)
NOW = 1_000_000.0
SNAPSHOT = make_snapshot(PROFILES, peers=PEERS, remote=REMOTE, remote_mtime=NOW - 5)
LOCAL_IDS = {p.profile for p in PROFILES}
REMOTE_KEYS = {(r.connection_id, r.profile) for r in REMOTE}
NAMES = ["alice", "bob", "carol", "hermes", "default", "moxie", "zed", "twin", "Alice Liddell", "researcher",
         "lab", "lab/moxie", "moxie@mini", "bob@mini", "zed@far", "nobody", "@bob", " BOB ", "dup-1"]
VALID_REASONS = set(VOCABULARY)

# Text that stresses the parser: any unicode (incl. surrogates are excluded by st.text), controls, NUL, paths.
hostile_text = st.one_of(
    st.text(max_size=80),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=80),
    st.text(alphabet="@/ .\\\x00\n\t\r-_aAbB0", max_size=40),
    st.sampled_from(NAMES),
    st.builds(lambda a, b: f"{a}{b}", st.sampled_from(NAMES), st.text(max_size=10)),
    st.sampled_from(["../x", "/etc/passwd", "a\x00b", "a" * 65, "a" * 64, "..", ".", "~", "bob/../alice"]),
)
anything = st.one_of(hostile_text, st.none(), st.integers(), st.floats(), st.booleans(), st.lists(st.integers()))


def _check(result: object) -> None:
    assert isinstance(result, Refusal | LocalRoute | RelayRoute | PeerRoute), result
    if isinstance(result, Refusal):
        assert isinstance(result.error, str) and result.error
        assert result.reason in VALID_REASONS, result.reason
        payload = result.as_dict()
        assert payload["error"] == result.error and payload["reason"] == result.reason
    elif isinstance(result, LocalRoute):
        assert result.target.profile in LOCAL_IDS
        assert result.target in PROFILES
        assert result.target.profile != result.sender.profile
    elif isinstance(result, RelayRoute):
        assert (result.target.connection_id, result.target.profile) in REMOTE_KEYS
        assert result.target.online is not False  # an offline agent is refused, never queued
    else:
        assert result.peer in PEERS


@settings(max_examples=200, deadline=None)
@given(sender=st.one_of(st.sampled_from(["alice", "hermes", "bob", "@carol"]), hostile_text),
       target=anything, message=anything)
@example(sender="alice", target="../x", message="hi")
@example(sender="alice", target="/etc/passwd", message="hi")
@example(sender="alice", target="a\x00b", message="hi")
@example(sender="alice", target="a" * 65, message="hi")
@example(sender="../alice", target="bob", message="hi")
def test_plan_send_never_raises_and_routes_only_into_the_roster(sender: str, target: object, message: object) -> None:
    _check(plan_send(SNAPSHOT, sender=sender, target=target, message=message, now=NOW))


def _names_of(info: ProfileInfo) -> set[str]:
    names = {info.profile.lower(), info.handle.lower()} | alias_forms(info.title)
    if info.display_name != info.profile:
        names |= alias_forms(info.display_name)
    return names | ({"hermes"} if info.profile == "default" else set())


@settings(max_examples=200, deadline=None)
@given(target=hostile_text)
@example(target="Critic\x00")  # slugs to carol's title "Critic", but is not it: refused
@example(target="\u202ecarol")
def test_a_local_route_is_always_a_name_of_that_profile(target: str) -> None:
    result = plan_send(SNAPSHOT, sender="alice", target=target, message="hi", now=NOW)
    _check(result)
    if isinstance(result, LocalRoute):
        raw = target.strip().lstrip("@").lower()
        assert raw in _names_of(result.target), (target, result.target)  # as typed, never slugified first
        # Never a friendly name two profiles share: "Twin" is ambiguous and must not pick one.
        assert result.target.profile not in {"dup-1", "dup-2"} or raw in {"dup-1", "dup-2"}


@settings(max_examples=200, deadline=None)
@given(body=st.text(min_size=1, max_size=40), pad=st.sampled_from(["", " ", "\n", "\t \n"]))
def test_messages_are_stripped_and_prefixed_exactly(body: str, pad: str) -> None:
    result = plan_send(SNAPSHOT, sender="alice", target="bob", message=f"{pad}{body}{pad}", now=NOW)
    stripped = body.strip()
    if not stripped:
        assert isinstance(result, Refusal) and result.error.startswith("message is required")
    else:
        assert isinstance(result, LocalRoute)
        assert result.content == f"Message from 🤖 Alice Liddell (@alice): {stripped}"


@settings(max_examples=200, deadline=None)
@given(n=st.integers(min_value=MESSAGE_MAX_CHARS - 3, max_value=MESSAGE_MAX_CHARS + 3),
       char=st.sampled_from(["x", "é", "🤖", "\x00", "\u200b", "中"]),
       pad=st.sampled_from(["", "   ", "\n\n"]))
def test_the_16000_char_limit_is_exact_after_strip(n: int, char: str, pad: str) -> None:
    result = plan_send(SNAPSHOT, sender="alice", target="bob", message=pad + char * n + pad, now=NOW)
    if n <= MESSAGE_MAX_CHARS:
        assert isinstance(result, LocalRoute), result
    else:
        assert isinstance(result, Refusal)
        assert result.error.startswith(f"message too long ({n} chars > {MESSAGE_MAX_CHARS})")


def test_the_exact_limit_boundaries() -> None:
    ok = plan_send(SNAPSHOT, sender="alice", target="bob", message=" " + "a" * 16000 + " ", now=NOW)
    too_long = plan_send(SNAPSHOT, sender="alice", target="bob", message="a" * 16001, now=NOW)
    assert isinstance(ok, LocalRoute)
    assert isinstance(too_long, Refusal) and "16001 chars > 16000" in too_long.error
    for empty in ("", " ", "\n\t ", None, "\u3000"):
        refused = plan_send(SNAPSHOT, sender="alice", target="bob", message=empty, now=NOW)
        assert isinstance(refused, Refusal) and refused.error.startswith("message is required"), empty


@settings(max_examples=200, deadline=None)
@given(target=st.text(min_size=1, max_size=70))
def test_targets_outside_the_handle_grammar_route_only_by_a_friendly_name(target: str) -> None:
    result = plan_send(SNAPSHOT, sender="alice", target=target, message="hi", now=NOW)
    _check(result)
    raw = target.strip().lstrip("@")
    if isinstance(result, LocalRoute) and not HANDLE_RE.match(raw):
        # Outside the grammar only a friendly-name form (title / display name or its slug) may resolve.
        friendly = alias_forms(result.target.title) | alias_forms(result.target.display_name)
        assert raw.lower() in friendly, (target, result.target)
