"""Validation refusals and target resolution: the seed's exact texts and reasons.

Each refusal is checked twice: through the public ``Gateway.message_agent``
and directly on the pure ``targets.plan_send``. The reason of a refusal is the
classification of its text, as the seed does; for these texts that is
``unknown`` (written out literally below, not recomputed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from roots import RecordingRunner, make_root

from hermes_actors import Gateway
from hermes_actors.core.config import load_config
from hermes_actors.core.targets import (
    HEADER_NAME_MAX_CHARS,
    MESSAGE_MAX_CHARS,
    LocalRoute,
    PeerRoute,
    Refusal,
    RelayRoute,
    consults_remote_roster,
    header_name,
    plan_send,
)
from hermes_actors.local.roster import make_snapshot
from hermes_actors.messages import RemoteAgent, RosterSnapshot
from hermes_actors.store.hermes_root import discover_profiles

PROFILES: dict[str, dict[str, Any]] = {
    "alice": {"title": "Researcher", "display_name": "Alice"},
    "bob": {"title": "Builder"},
    "carol": {"title": "Critic", "description": "Reviews drafts."},
    "scribe": {"title": "Writer", "display_name": "Dr. Foo"},
    "twin1": {"title": "Helper", "display_name": "Twin"},
    "twin2": {"title": "Helper", "display_name": "Twin"},
}
CONFIG = {"bot_peers": {"spark": {"url": "http://spark.invalid"}}}
ALL_HANDLES = ["hermes", "alice", "bob", "carol", "scribe", "twin1", "twin2"]
PEERS = ["spark"]


def roster_for(me: str | None) -> dict[str, Any]:
    """The teammates/peers keys of a roster refusal sent by ``me``."""
    return {"teammates": [h for h in ALL_HANDLES if h != me], "peers": PEERS}


NOT_BOT_CHAT = (
    "message_agent is only available in a Bot Mode 'Bot Chat' session. This session is not one; do not retry."
)
NOT_MANAGED = "This install is not Bot-Mode-managed (no bot roster); message_agent is unavailable. Do not retry."
MESSAGE_REQUIRED = "message is required — compose what you want to say to that agent."
TOO_LONG = (
    "message too long (16001 chars > 16000). Send the essentials; share large content as a file path instead."
)
TARGET_REQUIRED = "target is required."
YOURSELF = "You can't message yourself. Pick a teammate from the roster."


BAD_TEXT = (
    "{what} is not valid text: it contains an unpaired surrogate ('{char}' at character {at}) that cannot be "
    "encoded as UTF-8. Send plain UTF-8 text."
)


def not_text(type_name: str) -> str:
    return f"message must be text (a string), not {type_name}. Compose it as plain text."


def no_teammate(name: str) -> str:
    return (
        f"No teammate named '{name}' on this install, on a connected machine, or on a registered peer. "
        "Pick a name from the roster (roles are listed in your system prompt)."
    )


class StrIsBob:
    """Not text, though its str() names a teammate: never taken for that name."""

    def __str__(self) -> str:
        return "bob"


class Name(str):
    """A str subclass: text, taken as it is."""


def target_not_text(type_name: str) -> str:
    return f"Invalid target: it must be a name (text), not {type_name}."


def sender_not_text(type_name: str) -> str:
    return f"sender must be the sending profile's name (text), not {type_name}."


def sender_with_a_line_break(sender: str) -> str:
    return (f"Invalid sender {sender!r}: a profile name has no control characters or line breaks; pass the name "
            "alone (a folder id or handle: 1-64 letters, digits, '_' or '-').")


# (id, kwargs for message_agent / plan_send, expected refusal dict)
REFUSALS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "not-bot-chat",
        {"sender": "alice", "target": "bob", "message": "hi", "session": "Telegram"},
        {"error": NOT_BOT_CHAT, "reason": "unknown"},
    ),
    (
        "no-session-title",
        {"sender": "alice", "target": "bob", "message": "hi", "session": ""},
        {"error": NOT_BOT_CHAT, "reason": "unknown"},
    ),
    (
        "message-empty",
        {"sender": "alice", "target": "bob", "message": ""},
        {"error": MESSAGE_REQUIRED, "reason": "unknown"},
    ),
    (
        "message-whitespace",
        {"sender": "alice", "target": "bob", "message": "  \n\t  "},
        {"error": MESSAGE_REQUIRED, "reason": "unknown"},
    ),
    (
        "message-too-long",
        {"sender": "alice", "target": "bob", "message": "x" * 16001},
        {"error": TOO_LONG, "reason": "unknown"},
    ),
    (
        "target-empty",
        {"sender": "alice", "target": "", "message": "hi"},
        {"error": TARGET_REQUIRED, "reason": "unknown", **roster_for("alice")},
    ),
    (
        "target-whitespace-at",
        {"sender": "alice", "target": "  @ ", "message": "hi"},
        {"error": TARGET_REQUIRED, "reason": "unknown", **roster_for("alice")},
    ),
    (
        "invalid-target",
        {"sender": "alice", "target": "a b/c!", "message": "hi"},
        {"error": "Invalid target: 'a b/c!'.", "reason": "unknown", **roster_for("alice")},
    ),
    (
        "yourself",
        {"sender": "alice", "target": "alice", "message": "hi"},
        {"error": YOURSELF, "reason": "unknown"},
    ),
    (
        "yourself-other-case",
        {"sender": "alice", "target": "@ALICE", "message": "hi"},
        {"error": YOURSELF, "reason": "unknown"},
    ),
    (
        "yourself-by-display-name",
        {"sender": "scribe", "target": "Dr. Foo", "message": "hi"},
        {"error": YOURSELF, "reason": "unknown"},
    ),
    (
        "yourself-hermes-from-default",
        {"sender": "default", "target": "hermes", "message": "hi"},
        {"error": YOURSELF, "reason": "unknown"},
    ),
    (
        "yourself-default-from-hermes",
        {"sender": "hermes", "target": "default", "message": "hi"},
        {"error": YOURSELF, "reason": "unknown"},
    ),
    (
        "no-teammate",
        {"sender": "alice", "target": "zed", "message": "hi"},
        {"error": no_teammate("zed"), "reason": "unknown", **roster_for("alice")},
    ),
    (
        "ambiguous-friendly-name",
        {"sender": "alice", "target": "Twin", "message": "hi"},
        {"error": no_teammate("Twin"), "reason": "unknown", **roster_for("alice")},
    ),
    (
        "unknown-peer",
        {"sender": "alice", "target": "x/y", "message": "hi"},
        {"error": "No registered peer named 'x'.", "reason": "unknown", **roster_for("alice")},
    ),
    # Text that only slugs to a friendly name ("Alice" → alice, "Dr. Foo" → dr-foo) names nobody: the typed
    # target is matched as typed, so NUL, bidi overrides, zero-width characters and str() of a list are refused.
    *[
        (
            f"junk-around-a-friendly-name-{i}",
            {"sender": "bob", "target": target, "message": "hi"},
            {"error": f"Invalid target: {str(target).strip()!r}.", "reason": "unknown", **roster_for("bob")},
        )
        for i, target in enumerate(
            ["alice\x00", "\u202ealice", "alice\u200b", "(alice)", "Dr. Foo\x00", "dr foo"]
        )
    ],
    # A target that is not text is refused by its type, never str()-ed into a name: Path("bob") and an object
    # whose str() is "bob" reached bob, 5 was "No teammate named '5'", ["alice"] was "Invalid target: \"['alice']\"".
    *[
        (
            f"target-not-text-{type(target).__name__}",
            {"sender": "bob", "target": target, "message": "hi"},
            {"error": target_not_text(type(target).__name__), "reason": "unknown", **roster_for("bob")},
        )
        for target in [Path("alice"), StrIsBob(), 5, True, b"alice", ["alice"], ("alice",)]
    ],
    (
        "target-lone-surrogate",
        {"sender": "alice", "target": "\ud800@mini", "message": "hi"},
        {"error": BAD_TEXT.format(what="target", char="\\ud800", at=0), "reason": "unknown", **roster_for("alice")},
    ),
    (
        "message-lone-surrogate",
        {"sender": "alice", "target": "bob", "message": "hi \udfff"},
        {"error": BAD_TEXT.format(what="message", char="\\udfff", at=3), "reason": "unknown"},
    ),
    *[
        (
            f"message-not-text-{type(message).__name__}",
            {"sender": "alice", "target": "bob", "message": message},
            {"error": not_text(type(message).__name__), "reason": "unknown"},
        )
        for message in [5, 0, b"hi", {"text": "hi"}, ["hi"], True]
    ],
    (
        "unknown-sender",
        {"sender": "nobody", "target": "bob", "message": "hi"},
        {
            "error": "Unknown sender 'nobody': no profile with that name on this install.",
            "reason": "unknown",
            **roster_for(None),
        },
    ),
    *[
        (
            f"no-sender-{sender!r}",
            {"sender": sender, "target": "bob", "message": "hi"},
            {"error": "sender is required: the name of the profile that sends the DM.", "reason": "unknown",
             **roster_for(None)},
        )
        for sender in [None, "", "   "]
    ],
    # A sender that is not text is refused even when its str() names a profile (Path("alice") was accepted).
    *[
        (
            f"sender-not-text-{type(sender).__name__}",
            {"sender": sender, "target": "bob", "message": "hi"},
            {"error": sender_not_text(type(sender).__name__), "reason": "unknown", **roster_for(None)},
        )
        for sender in [5, Path("alice"), b"alice"]
    ],
    # No profile name holds a control character or line break: "alice\n" and "alice\t" were taken for alice.
    *[
        (
            f"sender-with-a-line-break-{i}",
            {"sender": sender, "target": "bob", "message": "hi"},
            {"error": sender_with_a_line_break(sender), "reason": "unknown", **roster_for(None)},
        )
        for i, sender in enumerate(["alice\n", "alice\t", "alice\r\n", "\nalice", "ali\x00ce", "alice\u2028",
                                    "alice\x85", "\n"])
    ],
]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_root(tmp_path_factory.mktemp("targets"), PROFILES, config=CONFIG)


@pytest.fixture(scope="module")
def snapshot(root: Path) -> RosterSnapshot:
    return make_snapshot(discover_profiles(root), peers=load_config(root).peers)


@pytest.fixture(scope="module")
def runner() -> RecordingRunner:
    return RecordingRunner()


@pytest.fixture(scope="module")
def gateway(root: Path, runner: RecordingRunner) -> Iterator[Gateway]:
    with Gateway(root, runner=runner) as gw:
        yield gw


# ── refusals ────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(("kwargs", "expected"), [(k, e) for _, k, e in REFUSALS], ids=[i for i, _, _ in REFUSALS])
def test_refusal_through_gateway(gateway: Gateway, runner: RecordingRunner, kwargs: dict[str, Any],
                                 expected: dict[str, Any]) -> None:
    before = len(runner.entered)
    assert gateway.message_agent(**kwargs) == expected
    assert len(runner.entered) == before


@pytest.mark.parametrize(("kwargs", "expected"), [(k, e) for _, k, e in REFUSALS], ids=[i for i, _, _ in REFUSALS])
def test_refusal_from_plan_send(snapshot: RosterSnapshot, kwargs: dict[str, Any], expected: dict[str, Any]) -> None:
    route = plan_send(snapshot, **kwargs)
    assert isinstance(route, Refusal)
    assert route.as_dict() == expected


HUGE = "a" * 100_000


def cut(length: str) -> str:
    """How core.clipping.shown names a long run of 'a': its first 59, and its length."""
    return "'" + "a" * 59 + f"…' ({length} characters)"


CUT = cut("100,000")

# (id, kwargs for plan_send, Redis unreachable?, expected refusal text): a bot's 100 KB value in each refusal
# that names it
HUGE_REFUSALS: list[tuple[str, dict[str, Any], bool, str]] = [
    ("unknown-sender", {"sender": HUGE, "target": "bob", "message": "hi"}, False,
     f"Unknown sender {CUT}: no profile with that name on this install."),
    ("invalid-target", {"sender": "alice", "target": HUGE, "message": "hi"}, False, f"Invalid target: {CUT}."),
    ("no-teammate", {"sender": "alice", "target": HUGE + "@mini", "message": "hi"}, False,
     no_teammate("").replace("''", cut("100,005"))),
    ("redis-unreachable", {"sender": "alice", "target": HUGE + "@mini", "message": "hi"}, True,
     f"Could not queue the message for {cut('100,005')}: Redis at 127.0.0.1:6379 is unreachable, so it was NOT queued. "
     "Retry once Redis is back."),
]


@pytest.mark.parametrize(("kwargs", "unreachable", "expected"), [(k, u, e) for _, k, u, e in HUGE_REFUSALS],
                         ids=[i for i, _, _, _ in HUGE_REFUSALS])
def test_a_huge_value_is_named_cut_with_its_length_not_repeated_whole(
    snapshot: RosterSnapshot, kwargs: dict[str, Any], unreachable: bool, expected: str
) -> None:
    """Regression (CLI fuzz): a 100,000-character sender or target came back whole in the refusal the bot
    reads (`Invalid target: 'aaaa…<100,000 of them>'.`), and on the terminal of `hermes-actors send`."""
    if unreachable:
        snapshot = dataclasses.replace(snapshot, remote_unreachable="127.0.0.1:6379")
    route = plan_send(snapshot, **kwargs)
    assert isinstance(route, Refusal)
    assert route.error == expected
    assert len(route.error) < 400


@pytest.mark.parametrize("length", [64, 200])
def test_a_value_up_to_the_bound_is_named_whole_as_the_seed_does(snapshot: RosterSnapshot, length: int) -> None:
    target = "!" * length  # no handle's shape: 'Invalid target'
    route = plan_send(snapshot, sender="alice", target=target, message="hi")
    assert isinstance(route, Refusal)
    assert route.error == f"Invalid target: {target!r}."


def test_unmanaged_install_is_refused(tmp_path: Path) -> None:
    root = make_root(tmp_path, {"alice": {}, "bob": {}}, managed=False)
    expected = {"error": NOT_MANAGED, "reason": "unknown"}
    snap = make_snapshot(discover_profiles(root))
    assert not snap.managed
    route = plan_send(snap, sender="alice", target="bob", message="hi")
    assert isinstance(route, Refusal) and route.as_dict() == expected
    runner = RecordingRunner()
    with Gateway(root, runner=runner) as gw:
        assert gw.message_agent(sender="alice", target="bob", message="hi") == expected
    assert runner.entered == []


def test_one_managed_profile_makes_the_install_managed(tmp_path: Path) -> None:
    root = make_root(tmp_path, {"alice": {}, "bob": {"managed": True, "title": "Builder"}}, managed=False)
    route = plan_send(make_snapshot(discover_profiles(root)), sender="alice", target="bob", message="hi")
    assert isinstance(route, LocalRoute) and route.target.profile == "bob"


def test_exactly_max_chars_is_accepted(gateway: Gateway, snapshot: RosterSnapshot, runner: RecordingRunner) -> None:
    body = "y" * 16000
    route = plan_send(snapshot, sender="alice", target="bob", message=body)
    assert isinstance(route, LocalRoute)
    # the limit applies to the stripped body
    assert isinstance(plan_send(snapshot, sender="alice", target="bob", message=f"  {body}\n"), LocalRoute)
    ack = gateway.message_agent(sender="alice", target="bob", message=body)
    assert ack["status"] == "queued"
    out = gateway.wait_outcome(ack["delivery_id"], timeout=10)
    assert out["status"] == "replied"
    turn = next(t for t in runner.entered if t.delivery_id == ack["delivery_id"])
    assert turn.content == f"Message from 🤖 Alice (@alice): {body}"


# ── resolution ──────────────────────────────────────────────────────────────

RESOLVES: list[tuple[str, str, str, str]] = [
    # (sender, target as typed, folder id, label)
    ("alice", "bob", "bob", "@bob"),
    ("alice", "BOB", "bob", "@bob"),
    ("alice", "@Bob", "bob", "@bob"),
    ("alice", "  bob  ", "bob", "@bob"),
    ("alice", "hermes", "default", "@hermes"),
    ("alice", "HERMES", "default", "@hermes"),
    ("alice", "default", "default", "@hermes"),
    ("hermes", "bob", "bob", "@bob"),
    ("alice", "Dr. Foo", "scribe", "@scribe"),
    ("alice", "dr. foo", "scribe", "@scribe"),
    ("alice", "@dr-foo", "scribe", "@scribe"),
    ("alice", "dr-foo", "scribe", "@scribe"),
    ("bob", "Alice", "alice", "@alice"),
    ("alice", "Writer", "scribe", "@scribe"),
    ("alice", "Critic", "carol", "@carol"),
]


@pytest.mark.parametrize(("sender", "target", "folder", "label"), RESOLVES)
def test_resolution_from_plan_send(snapshot: RosterSnapshot, sender: str, target: str, folder: str,
                                   label: str) -> None:
    route = plan_send(snapshot, sender=sender, target=target, message=" hello ")
    assert isinstance(route, LocalRoute)
    assert route.target.profile == folder
    assert route.label == label
    me = snapshot.index["default" if sender == "hermes" else sender]
    assert route.content == f"Message from 🤖 {me.display_name} (@{me.handle}): hello"
    assert route.author == {"id": f"bot:{me.profile}", "name": me.handle, "is_bot": True}


@pytest.mark.parametrize(("sender", "target", "folder", "label"), RESOLVES)
def test_resolution_through_gateway(gateway: Gateway, runner: RecordingRunner, sender: str, target: str,
                                    folder: str, label: str) -> None:
    ack = gateway.message_agent(sender=sender, target=target, message="hello")
    assert ack["status"] == "queued" and ack["to"] == label
    out = gateway.wait_outcome(ack["delivery_id"], timeout=10)
    assert out["status"] == "replied" and out["from"] == label
    turn = next(t for t in runner.entered if t.delivery_id == ack["delivery_id"])
    assert turn.profile == folder
    assert turn.handle == ("hermes" if folder == "default" else folder)
    assert turn.sender == ("default" if sender == "hermes" else sender)


def test_a_str_subclass_is_text_for_the_sender_and_the_target(snapshot: RosterSnapshot) -> None:
    route = plan_send(snapshot, sender=Name("alice"), target=Name("@Bob"), message="hi")
    assert isinstance(route, LocalRoute)
    assert (route.sender.profile, route.target.profile) == ("alice", "bob")


def test_a_sender_with_spaces_around_or_an_at_is_still_its_profile(snapshot: RosterSnapshot) -> None:
    # only control characters and line breaks are refused: spaces, a leading @ and the case are read as before
    for sender in (" alice ", "@alice", "ALICE"):
        route = plan_send(snapshot, sender=sender, target="bob", message="hi")
        assert isinstance(route, LocalRoute) and route.sender.profile == "alice", sender


def test_registered_peer_routes_to_the_peer(snapshot: RosterSnapshot) -> None:
    named = plan_send(snapshot, sender="alice", target="spark/researcher", message="hi")
    assert isinstance(named, PeerRoute) and (named.peer, named.agent) == ("spark", "researcher")
    assert named.label == "@researcher on peer 'spark'"
    bare = plan_send(snapshot, sender="alice", target="Spark", message="hi")
    assert isinstance(bare, PeerRoute) and (bare.peer, bare.agent) == ("spark", None)



# (id, target, what plan_send answers, whether the remote roster decided it)
REMOTE_DECIDED: list[tuple[str, str, type, bool]] = [
    ("local", "bob", LocalRoute, False),
    ("local-friendly-name", "Dr. Foo", LocalRoute, False),
    ("peer", "spark/researcher", PeerRoute, False),
    ("relay-bare-handle", "dave", RelayRoute, True),
    ("relay-at-connection", "dave@mini", RelayRoute, True),
    ("offline", "olga", Refusal, True),
    ("ambiguous", "moxie", Refusal, True),
    ("unknown-name", "n3", Refusal, True),
    ("unknown-at-connection", "n3@mini", Refusal, True),
    ("yourself", "alice", Refusal, True),
    ("invalid-target", "../x", Refusal, False),
    ("no-target", "", Refusal, False),
]


@pytest.mark.parametrize(("target", "kind", "decided"), [(t, k, d) for _, t, k, d in REMOTE_DECIDED],
                         ids=[i for i, _, _, _ in REMOTE_DECIDED])
def test_whether_the_remote_roster_decided_a_plan(snapshot: RosterSnapshot, target: str, kind: type,
                                                  decided: bool) -> None:
    """Regression (rosterfresh): only a DM the remote roster decides may wait for roster.json to be re-read."""
    remote = (RemoteAgent("dave", "dave", "mini", online=True), RemoteAgent("olga", "olga", "mini", online=False),
              RemoteAgent("moxie", "moxie", "mini"), RemoteAgent("moxie", "moxie", "maxi"))
    with_remote = dataclasses.replace(snapshot, remote=remote, remote_mtime=1000.0)
    planned = plan_send(with_remote, sender="alice", target=target, message="hi", now=1001.0)
    assert isinstance(planned, kind), planned
    assert consults_remote_roster(planned) is decided
    for message in ("", "x" * 16001):  # refused before any target is looked at
        assert consults_remote_roster(plan_send(with_remote, sender="alice", target=target, message=message)) is False


@pytest.mark.parametrize(
    ("profile", "origin", "expected"),
    [("alice", "", "bot:alice"), ("alice", "mini", "bot:mini/alice"), ("alice", "  ", "bot:alice"),
     ("bob", " studio ", "bot:studio/bob")],
)
def test_bot_author_id_names_the_senders_install_when_it_is_another(profile: str, origin: str, expected: str) -> None:
    from hermes_actors.core.authors import bot_author, bot_author_id

    assert bot_author_id(profile, origin) == expected
    assert bot_author(profile, "handle", origin) == {"id": expected, "name": "handle", "is_bot": True}


def test_local_origin_is_the_cleaned_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    from hermes_actors.core import authors

    monkeypatch.setattr(authors.socket, "gethostname", lambda: " box/7\x00\n" + "h" * 300)
    assert authors.local_origin() == "box7" + "h" * 195  # controls dropped, capped at 200, then the slash
    monkeypatch.setattr(authors.socket, "gethostname", lambda: "studio.lan")
    assert authors.local_origin() == "studio.lan"

    def broken() -> str:
        raise OSError("no hostname")

    monkeypatch.setattr(authors.socket, "gethostname", broken)
    assert authors.local_origin() == ""


def test_plan_send_builds_no_function_per_call() -> None:
    # Every DM is planned here, on its sender's thread. A refusal helper nested in plan_send was a new function
    # (and cells for what it closed over) per DM, refused or not: about 0.6 µs of every DM's 3 µs plan
    # (bench/limits.md). The refusal texts and their teammates/peers are checked above.
    code = plan_send.__code__
    assert code.co_cellvars == ()
    assert not [const for const in code.co_consts if isinstance(const, type(code))]


# ── the DM header ───────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("name", "shown_as"),
    [
        ("Dr. Foo", "Dr. Foo"),
        ("", ""),
        ("Dr.  Foo", "Dr.  Foo"),  # a short name is shown exactly as the roster has it
        ("a" * HEADER_NAME_MAX_CHARS, "a" * HEADER_NAME_MAX_CHARS),
        ("a" * (HEADER_NAME_MAX_CHARS + 1), "a" * (HEADER_NAME_MAX_CHARS - 1) + "…"),
        ("🤖" * 40_000, "🤖" * (HEADER_NAME_MAX_CHARS - 1) + "…"),
        ("word " * 100, ("word " * 23).rstrip() + "…"),  # cut at a word
    ],
)
def test_header_name(name: str, shown_as: str) -> None:
    assert header_name(name) == shown_as
    assert len(header_name(name)) <= HEADER_NAME_MAX_CHARS


def test_a_huge_display_name_leaves_the_dm_within_what_a_turn_may_carry(tmp_path: Path) -> None:
    """Regression (configfix): alice's display_name of 40,000 emoji made a 9-character DM 160,038 bytes: acked,
    then failed ``unknown`` "the message to @bob is 160038 bytes; … at most 102400 bytes — shorten it" on the
    hermes CLI, blaming the message. The header now shows the name cut (:func:`header_name`): the longest
    message, from the longest handle, fits."""
    from hermes_actors.hermes.cli_runner import MAX_ARGV_TEXT_BYTES

    handle = "a" * 64  # the longest a handle may be
    root = make_root(tmp_path, {handle: {"display_name": "🤖" * 40_000}, "bob": {}})
    snap = make_snapshot(discover_profiles(root))
    for message in ("hi there!", "🤖" * MESSAGE_MAX_CHARS):
        route = plan_send(snap, sender=handle, target="bob", message=message)
        assert isinstance(route, LocalRoute), route
        assert route.content == f"Message from 🤖 {'🤖' * (HEADER_NAME_MAX_CHARS - 1)}… (@{handle}): {message}"
        assert len(route.content.encode("utf-8")) <= MAX_ARGV_TEXT_BYTES
