"""The built-in offline demo: four bots with roles, and a runner that plays them.

``DemoRunner`` is deterministic and needs no model: each demo bot answers in
character; the coordinator sometimes DMs a teammate from inside its turn
(through ``turn.message_agent``, so the conversation guard applies); the
reviewer stays silent on FYIs. Unknown profiles get a generic answer.

In a group room (a turn in a ``Group: <name>`` session) each bot answers a new
message from the user once, in character, and passes otherwise; the coordinator,
once it has read the reviewer, asks ``@user`` whether to go ahead.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from hermes_actors.core.names import profile_home
from hermes_actors.messages import Turn

__all__ = ["DEMO_BOTS", "DemoBot", "DemoRunner", "create_demo_root", "message_body"]

_PREFIX_RE = re.compile(r"^Message from .*? \(@[^)]*\): ", re.DOTALL)


@dataclass(frozen=True)
class DemoBot:
    """One demo bot: folder id, display name, role title, description, turn time."""

    profile: str
    display_name: str
    title: str
    description: str
    turn_seconds: float = 0.0


DEMO_BOTS: tuple[DemoBot, ...] = (
    DemoBot("default", "Hermes", "Coordinator", "Plans the work and hands pieces to teammates."),
    DemoBot("scout", "Scout", "Researcher", "Finds sources and checks facts."),
    DemoBot("scribe", "Scribe", "Writer", "Drafts and edits prose.", turn_seconds=0.25),
    DemoBot("critic", "Critic", "Reviewer", "Reviews drafts; silent on FYIs."),
)

_LINES = {
    "Coordinator": [
        "Noted — I'll fold that into the plan.",
        "Good. Next step is on the board.",
        "Thanks, tracking it.",
    ],
    "Researcher": [
        "Three sources agree on this; one outlier from 2019.",
        "I checked: the claim holds for the EU market, not the US.",
        "Found two primary sources; links are in my notes.",
    ],
    "Writer": ["Draft ready: two paragraphs, plain tone.", "Tightened it to 120 words.", "Rewrote the intro."],
    "Reviewer": ["Looks solid; one unclear sentence in para 2.", "Approve with a nit: define 'churn'.", "Needs data."],
    "Analyst": ["Q3 churn is 4.1%, down from 4.6%.", "The cohort table is in the shared sheet.", "Numbers attached."],
}


# What a bot says to a request that names its subject (first match wins); else a line of its role.
_ANSWERS = {
    "Writer": (("shorten", "Shortened para 2 to three sentences."), ("intro", "Draft ready: a two-paragraph intro, "
               "plain tone."), ("title", "Title: \"Why EU churn fell in Q3\"."), ("number", "Added the EU numbers "
               "to para 1, with sources.")),
}


def message_body(content: str) -> str:
    """The DM text without the ``Message from 🤖 …: `` signature."""
    return _PREFIX_RE.sub("", content, count=1)


def create_demo_root(root: Path, bots: tuple[DemoBot, ...] = DEMO_BOTS) -> Path:
    """Write a managed Hermes root with the demo bots' profile.yaml files.

    Returns:
        ``root``.
    """
    root.mkdir(parents=True, exist_ok=True)
    for bot in bots:
        home = profile_home(root, bot.profile)
        home.mkdir(parents=True, exist_ok=True)
        meta = {
            "display_name": bot.display_name,
            "description": bot.description,
            "ui_meta": {"hermes-bots": {"title": bot.title}},
        }
        (home / "profile.yaml").write_text(yaml.safe_dump(meta, sort_keys=True), encoding="utf-8")
    return root


class DemoRunner:
    """Plays the demo bots. Deterministic: the same DM gets the same answer.

    Args:
        bots: the cast.
        delays: override turn time per profile (seconds); None keeps the cast's.
    """

    def __init__(self, bots: tuple[DemoBot, ...] = DEMO_BOTS, *, delays: dict[str, float] | None = None) -> None:
        self.bots = {b.profile: b for b in bots}
        self.delays = dict(delays or {})

    def run_turn(self, turn: Turn) -> str:
        """Answer ``turn`` in character."""
        bot = self.bots.get(turn.profile)
        delay = self.delays.get(turn.profile, bot.turn_seconds if bot else 0.0)
        if delay > 0:
            time.sleep(delay)  # stands in for model latency
        if turn.session.startswith("Group: "):
            return self._room_turn(bot, turn)
        body = message_body(turn.content)
        if bot is None:
            return f"@{turn.handle or turn.profile} got your message: {body[:80]}"
        if bot.title == "Reviewer" and body.lower().startswith("fyi"):
            return "[SILENT]"
        if bot.title == "Coordinator" and "plan" in body.lower() and turn.hop < 2:
            ack = turn.message_agent("scout", f"Please research this for the plan: {body[:200]}")
            sent = "asked @scout to research it" if ack.get("status") == "queued" else "could not reach @scout"
            return f"On it — I {sent}; I'll share the plan once the research is in."
        for keyword, answer in _ANSWERS.get(bot.title, ()):
            if keyword in body.lower():
                return answer
        lines = _LINES.get(bot.title, _LINES["Coordinator"])
        pick = int(hashlib.sha256(body.encode()).hexdigest(), 16) % len(lines)
        return lines[pick]

    def _room_turn(self, bot: DemoBot | None, turn: Turn) -> str:
        """One group-room turn: the news is every line between the header and the footer."""
        news = turn.content.splitlines()[1:-1]
        if bot is None:
            return "[SILENT]"
        from_user = [line.removeprefix("user: ") for line in news if line.startswith("user: ")]
        reviewer = next((b.profile for b in self.bots.values() if b.title == "Reviewer"), "")
        if bot.title == "Coordinator" and not from_user and any(line.startswith(f"@{reviewer}:") for line in news):
            return "@user the team is done and the review is in: shall we publish?"
        if not from_user:
            return "[SILENT]"
        lines = _LINES.get(bot.title, _LINES["Coordinator"])
        pick = int(hashlib.sha256(from_user[-1].encode()).hexdigest(), 16) % len(lines)
        return lines[pick]
