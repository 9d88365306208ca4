"""Hostile relay files in replies/ and inbox/: refused or quarantined, logged; the relay keeps working."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hostile_files import kind_param, place
from relay_helpers import remote_row, seed_envelope, seed_write_json, write_roster_file
from roots import LogCapture, RecordingRunner, make_root

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.store import relay_protocol as rp
from hermes_actors.store.relay_inbox import InboxPaths, post_to_inbox
from hermes_actors.store.relay_shelf import find_on_shelves

KINDS = [
    "non-json", "json-array", "huge", "symlink", "bad-name", "id-mismatch", "group-writable", "other-uid", "socket",
    "directory",
]


PARAMS = [kind_param(k) for k in KINDS]


def plant(kind: str, directory: Path, file_id: str, valid: dict[str, Any], staging: Path,
          limit: int = 1 << 20) -> str:
    """Put a hostile ``<file_id>.json`` (or a badly named file) into ``directory``; return the planted name.

    ``limit``: the size the directory's reader accepts ("huge" is just over it).

    Files are prepared in ``staging`` (same filesystem) and renamed in (``hostile_files.place``).
    """
    name = f"{file_id}.json"
    body: bytes = json.dumps(valid).encode()
    mode = 0o600
    if kind == "non-json":
        body = b"{this is not json"
    elif kind == "json-array":
        body = json.dumps([valid]).encode()
    elif kind == "huge":
        body = json.dumps({**valid, "padding": "x" * limit}).encode()
    elif kind == "bad-name":
        name = f"{file_id.upper()}.json"
    elif kind == "id-mismatch":
        body = json.dumps({**valid, "id": uuid.uuid4().hex}).encode()
    elif kind == "group-writable":
        mode = 0o666
    place(kind, body, directory / name, staging, mode=mode)
    return name


def quarantined(relay: Path, name: str) -> Callable[[], list[Path]]:
    def found() -> list[Path]:
        q = relay / "quarantine"
        return sorted(q.glob(f"{name}.*.quarantined")) if q.is_dir() else []

    return found


@pytest.mark.parametrize("kind", PARAMS)
def test_hostile_reply_files_are_quarantined_and_valid_replies_still_flow(
    kind: str, tmp_path: Path, logs: LogCapture
) -> None:
    root = make_root(tmp_path, name="alpha")
    write_roster_file(root, [remote_row("moxie", "mini", online=True)])
    relay = root / "bot_relay"
    with Gateway(root, runner=RecordingRunner(), config={"bot_mode": {"rescan_seconds": 0.2}},
                 connection_id="alpha") as gw:
        ack = gw.message_agent(sender="alice", target="moxie", message="hi")
        envelope_id = ack["delivery_id"]
        valid = {"id": envelope_id, "at": int(time.time()), "reply": "FROM THE HOSTILE FILE", "error": "",
                 "reason": ""}
        name = plant(kind, relay / "replies", envelope_id, valid, tmp_path / "staging", rp.REPLY_FILE_MAX_BYTES)

        moved = await_condition(quarantined(relay, name), timeout=10, message=f"{name} quarantined")
        assert len(moved) == 1
        await_condition(lambda: logs.matching("quarantined", name), timeout=10, message=f"a log line for {name}")
        assert not (relay / "replies" / name).exists() and not (relay / "replies" / name).is_symlink()
        if kind == "symlink":
            assert moved[0].is_symlink()  # the link itself moved; its target was never touched
            assert Path(os.readlink(moved[0])).read_text(encoding="utf-8") == json.dumps(valid)
        assert gw.stats()["relay"]["replies"] == 0  # handled in the relay: no reply taken

        # The positive marker: the real reply, through the same path. An outcome settles once, so had the hostile
        # content become the outcome, this would read "FROM THE HOSTILE FILE".
        seed_write_json(relay / "replies" / f"{envelope_id}.json", {**valid, "reply": "the real reply"})
        out = gw.wait_outcome(envelope_id, timeout=10)
        assert (out["status"], out["reply"]) == ("replied", "the real reply")
        assert gw.stats()["relay"]["replies"] == 1


@pytest.mark.parametrize("kind", PARAMS)
def test_hostile_inbox_files_are_quarantined_and_valid_envelopes_still_flow(
    kind: str, tmp_path: Path, logs: LogCapture
) -> None:
    root = make_root(tmp_path, name="alpha")
    rec = RecordingRunner()
    paths = InboxPaths.from_root(root)
    with Gateway(root, runner=rec, config={"bot_mode": {"rescan_seconds": 0.2}}, connection_id="alpha") as gw:
        bad = seed_envelope(target_connection="alpha", target_profile="bob", from_profile="moxie")
        name = plant(kind, paths.inbox, bad["id"], {**bad, "reply_connection": "mini"}, tmp_path / "staging")

        moved = await_condition(quarantined(paths.relay.base, name), timeout=10, message=f"{name} quarantined")
        assert len(moved) == 1
        await_condition(lambda: logs.matching("quarantined", name), timeout=10, message=f"a log line for {name}")
        assert not (paths.inbox / name).exists() and not find_on_shelves(paths.taken_parent, name)
        assert gw.stats()["relay_alive"]

        good = seed_envelope(target_connection="alpha", target_profile="bob", from_profile="moxie")
        post_to_inbox(paths, good, "mini")
        await_condition((paths.delivered / f"{good['id']}.json").exists, timeout=10, message="the valid envelope ran")
    assert [t.delivery_id for t in rec.entered] == [good["id"]]  # the hostile one never ran
    assert not list(paths.delivered.glob(f"{bad['id']}*"))


def test_an_inbox_envelope_with_a_bad_hop_is_quarantined_never_run(tmp_path: Path, logs: LogCapture) -> None:
    """Regression (review): the file relay ran an envelope whose hop was "abc", -5, 1.5, null, 1e40, true or 1001
    as a hop-1 DM (``delivery_from_envelope`` mapped it), where the Redis transport drops it. One rule for both
    now (``parse_envelope``, by ``core.hops.is_hop``): such an envelope is quarantined and never runs; an
    absent hop or one from 0 to MAX_HOP is taken as it is."""
    root = make_root(tmp_path, name="alpha")
    rec = RecordingRunner()
    paths = InboxPaths.from_root(root)
    staging = tmp_path / "staging"
    staging.mkdir()
    with Gateway(root, runner=rec, config={"bot_mode": {"rescan_seconds": 0.2}}, connection_id="alpha"):
        bad = []
        for hop in ("abc", -5, 1.5, None, 1e40, True, 1001):
            env = {**seed_envelope(target_connection="alpha", target_profile="bob", from_profile="moxie"), "hop": hop}
            temp = staging / f"{env['id']}.json"
            temp.write_text(json.dumps({**env, "reply_connection": "mini"}))
            temp.chmod(0o600)
            os.replace(temp, paths.inbox / temp.name)  # as another program would post it: no check on the way
            bad.append(env["id"])
        good = [seed_envelope(target_connection="alpha", target_profile="bob", from_profile="moxie")]
        good += [{**seed_envelope(target_connection="alpha", target_profile="bob", from_profile="moxie"), "hop": h}
                 for h in (0, 3)]
        for env in good:
            post_to_inbox(paths, env, "mini")
        await_condition(lambda: all((paths.delivered / f"{e['id']}.json").exists() for e in good), timeout=20,
                        message="the envelopes with a good hop ran")
        for envelope_id in bad:
            await_condition(quarantined(paths.relay.base, f"{envelope_id}.json"), timeout=20,
                            message=f"{envelope_id} quarantined")
        for envelope_id in bad:  # its sender is told it was NOT delivered (it used to wait reply_wait_seconds)
            await_condition((paths.delivered / f"{envelope_id}.json").exists, timeout=20,
                            message=f"the error reply of {envelope_id}")
    assert sorted(t.delivery_id for t in rec.entered) == sorted(e["id"] for e in good), "no bad hop ran a turn"
    for envelope_id in bad:
        record = json.loads((paths.delivered / f"{envelope_id}.json").read_text(encoding="utf-8"))
        assert (record["reply"], record["reason"], record["reply_connection"]) == ("", "unknown", "mini"), record
        assert "malformed" in record["error"] and "'hop'" in record["error"] and "NOT delivered" in record["error"]
    assert len(logs.matching("'hop' is not an integer from 0 to 1000")) >= len(bad), logs.lines
