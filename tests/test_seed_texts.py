"""The model-facing texts the seed fixes word for word (seeds/bot_mode_dm.py.txt), pinned as golden copies.

A Hermes release with Bot Mode built in shows its bots these exact texts; a bot on
hermes-agent 0.19 with our plugin must read the same tool and the same ack.
"""

from __future__ import annotations

import time
from pathlib import Path

from roots import make_root

from hermes_actors import Gateway, message_agent_tool_schema

SEED_DESCRIPTION = (
    "Send a message to ANOTHER agent (teammate) on this install, or to an agent on a registered peer gateway. "
    "This is FIRE-AND-FORGET and asynchronous, like texting: it validates the target against the live roster, "
    "delivers your message into that agent's own Bot Chat with your attribution automatically prefixed, and "
    "returns immediately with a dispatch acknowledgement — status queued plus a delivery_id (the hand-off to a "
    "background delivery process, not a delivery receipt). It does NOT return their reply and you must not wait "
    "or poll for one — send it, finish your turn, and that process's completion notification wakes you with the "
    "outcome: their reply, or the delivery failure — unless the ack returns reply_delivery=\"poll\", in which "
    "case follow its process(action=\"wait\") instruction before ending the turn. COMPOSE the message yourself: "
    "write what YOU want to say to that agent (lead with the point; include the concrete ask or result). Never "
    "paste the user's words verbatim — paraphrase the actionable substance, and keep private 1:1 chat content "
    "private. Message one clearly relevant teammate when it genuinely helps the user's goal; don't fan out to "
    "several agents unless the user explicitly asked. Use the teammate roster in your system prompt (names + "
    "roles) to pick the right recipient; targets: a teammate name (e.g. 'researcher'), '<peer>/<agent>' for an "
    "agent on a registered peer gateway (e.g. 'spark/researcher', or just '<peer>' for the peer's main agent), "
    "or an agent on another connected machine from your roster (use '<handle>@<connection>' if the same handle "
    "exists on several)."
)


def test_the_tool_schema_is_the_seeds() -> None:
    schema = message_agent_tool_schema()
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == "message_agent"
    assert function["description"] == SEED_DESCRIPTION
    assert function["parameters"] == {
        "type": "object",
        "properties": {
            "target": {
                "type": "string",
                "description": "Who to message: a teammate profile name from your roster ('researcher', 'hermes' "
                               "for the default agent), or '<peer>' / '<peer>/<agent>' for a registered peer gateway.",
            },
            "message": {
                "type": "string",
                "description": "The message YOU composed for that agent (max 16000 chars). Do not include the "
                               "'Message from …' prefix — it is added automatically.",
            },
        },
        "required": ["target", "message"],
    }


def test_the_ack_detail_is_the_seeds(tmp_path: Path) -> None:
    root = make_root(tmp_path)
    with Gateway(root, runner=lambda turn: "ok") as gw:
        before = int(time.time())
        ack = gw.message_agent(sender="alice", target="bob", message="hi")
    assert set(ack) == {"status", "delivery_id", "to", "reply_delivery", "detail", "queued_at"}
    assert (ack["status"], ack["to"], ack["reply_delivery"]) == ("queued", "@bob", "notification")
    assert before <= ack["queued_at"] <= int(time.time())
    assert ack["detail"] == (
        "Message queued for @bob: this acknowledges the hand-off to a background delivery process, not a delivery "
        "receipt — do NOT wait or poll. Finish your turn now; that process's completion notification carries the "
        "delivery outcome — the reply (relay it then, attributed to that agent) or the delivery failure (report "
        "it; the message was NOT delivered)."
    )


def test_the_tool_result_text_is_serialized_as_the_seed_serializes_it(tmp_path: Path) -> None:
    """The seed returns ``json.dumps(payload)`` with its defaults: ``", "`` separators, non-ASCII escaped."""
    import json

    from hermes_actors import message_agent_tool

    root = make_root(tmp_path)
    with Gateway(root, runner=lambda turn: "ok") as gw:
        refused = message_agent_tool(gw, sender="alice", target="bob", message="  ")
        acked = message_agent_tool(gw, sender="alice", target="bob", message="hi")
    assert refused == (
        '{"error": "message is required \\u2014 compose what you want to say to that agent.", "reason": "unknown"}'
    )
    assert acked == json.dumps(json.loads(acked)) and acked.startswith('{"status": "queued", "delivery_id": "')


def test_a_dm_to_a_bot_with_a_live_owner_gets_the_seeds_live_ack(tmp_path: Path) -> None:
    """The seed's live branch: ``detail="Durably queued for the live Bot Chat owner. Do NOT wait or resend;
    finish your turn."``; the ordinary detail again once the owner is detached."""
    root = make_root(tmp_path)
    with Gateway(root, runner=lambda turn: "ok") as gw:
        gw.attach_live_owner("bob", lambda turn: "from the open window")
        live = gw.message_agent(sender="alice", target="bob", message="hi")
        other = gw.message_agent(sender="alice", target="carol", message="hi")
        assert gw.wait_outcome(live["delivery_id"], timeout=10)["reply"] == "from the open window"
        gw.detach_live_owner("bob")
        after = gw.message_agent(sender="alice", target="bob", message="again")
    assert (live["status"], live["to"], live["reply_delivery"]) == ("queued", "@bob", "notification")
    assert live["detail"] == "Durably queued for the live Bot Chat owner. Do NOT wait or resend; finish your turn."
    assert other["detail"].startswith("Message queued for @carol: ") and after["detail"].startswith("Message queued")
