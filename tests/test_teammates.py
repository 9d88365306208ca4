"""The teammate roster in a Bot Chat turn's system message (hermes 0.19 has no Bot Mode prompt)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hermes_actors.hermes.teammates import HEADING, MAX_LISTED, TeammateCache, teammates_text, with_teammates
from hermes_actors.records import ProfileInfo


def info(profile: str, display: str = "", title: str = "", description: str = "") -> ProfileInfo:
    handle = "hermes" if profile == "default" else profile
    return ProfileInfo(profile, handle, Path("/r") / profile, display or profile, title, description)


def test_teammates_text_lists_everyone_but_me_with_names_and_roles() -> None:
    text = teammates_text("bob", [info("default"), info("alice", "Alice Liddell", "Researcher", "finds  papers\n"),
                                  info("bob", "Bob"), info("carol", "carol", description="reviews code")])
    assert text.splitlines() == [
        HEADING,
        "Other agents you can message with the message_agent tool (target: the name after '@'). "
        "Their replies reach you later, as new messages in this chat.",
        "- @hermes",
        "- @alice (Alice Liddell) — Researcher: finds papers",
        "- @carol — reviews code",
    ]


def test_teammates_text_is_empty_alone_and_counts_past_the_cap() -> None:
    assert teammates_text("bob", [info("bob")]) == ""
    many = [info(f"p{i:04d}") for i in range(MAX_LISTED + 5)]
    lines = teammates_text("p0000", many).splitlines()
    assert lines[2] == "- @p0001" and len(lines) == 2 + MAX_LISTED + 1
    assert lines[-1] == "- … and 4 more (a message_agent refusal lists every name)"
    long_role = teammates_text("x", [info("y", title="t" * 500)]).splitlines()[-1]
    assert long_role.endswith("…") and len(long_role) < 200


SYSTEM = {"role": "system", "content": "You are bob."}
USER = {"role": "user", "content": "Message from 🤖 alice (@alice): hi"}


@pytest.mark.parametrize(("request_", "changed"), [
    ({"model": "m", "messages": [SYSTEM, USER]}, True),
    ({"model": "m", "messages": [USER]}, False),  # no system message to add to
    ({"model": "m", "messages": [{"role": "system", "content": [{"type": "text", "text": "x"}]}, USER]}, False),
    ({"model": "m", "messages": [{"role": "system", "content": f"x\n\n{HEADING}\n- @a"}, USER]}, False),  # once
    ({"model": "m", "input": "responses API"}, False),
    ({"model": "m", "messages": []}, False),
])
def test_with_teammates(request_: dict[str, object], changed: bool) -> None:
    out = with_teammates(request_, f"{HEADING}\n- @alice")
    if not changed:
        assert out is None
        return
    assert out is not None and out["model"] == "m"
    assert out["messages"] == [{"role": "system", "content": f"You are bob.\n\n{HEADING}\n- @alice"}, USER]
    assert request_["messages"] == [SYSTEM, USER]  # the caller's request is not changed in place


def test_the_cache_reads_the_root_again_only_after_its_ttl() -> None:
    reads: list[Path] = []
    now = [100.0]

    def read(root: Path) -> list[ProfileInfo]:
        reads.append(root)
        return [info("alice"), info("bob")] if len(reads) == 1 else [info("alice"), info("bob"), info("dave")]

    cache = TeammateCache(read, ttl=30, clock=lambda: now[0])
    first = cache.text(Path("/r"), "bob")
    assert "@alice" in first and cache.text(Path("/r"), "bob") == first and len(reads) == 1
    now[0] += 31
    assert "@dave" in cache.text(Path("/r"), "bob") and len(reads) == 2
