"""``hermes-actors status``, ``outcome`` and ``doctor``: each command, each exit code."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from roots import (
    HERMES_019,
    AnsweringApi,
    LogCapture,
    RecordingRunner,
    make_root,
    send_dm,
    start_gateway,
    write_fake_cli,
    write_profile,
)

from actors.testkit import await_condition
from hermes_actors import Gateway
from hermes_actors.cli.main import main
from hermes_actors.local.command_runner import CommandRunner
from hermes_actors.ops.doctor import run_doctor
from hermes_actors.ops.doctor_checks import (
    BLOCK,
    OK,
    WARN,
    check_connection_ids,
    check_models,
    check_peers,
    check_plugin,
    within_sentence,
)
from hermes_actors.records import ProfileInfo, RemoteAgent
from hermes_actors.store.hermes_root import discover_profiles
from hermes_actors.store.private_dir import ensure_private_dir
from hermes_actors.store.relay_files import enqueue_envelope, write_reply
from hermes_actors.store.relay_inbox import InboxPaths, mark_consumed
from hermes_actors.store.relay_protocol import make_envelope, make_reply
from hermes_actors.store.relay_sent import clear_sent, record_sent


def _json(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    return dict(json.loads(capsys.readouterr().out))


# ── status ──────────────────────────────────────────────────────────────────


def test_status_asks_the_running_serve(tmp_path: Path, gateways: list[Gateway],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    root = make_root(tmp_path)
    release = threading.Event()
    rec = RecordingRunner(lambda turn: "done" if release.wait(30) else "")
    gw = start_gateway(gateways, root, rec, serve_submit=True)
    try:
        key = send_dm(gw, "hello")
        rec.wait_entered(1)
        assert main(["status", "--root", str(root), "--json"]) == 0
        status = _json(capsys)
        assert status["running"] is True and status["source"] == "gateway"
        assert [r["delivery_id"] for r in status["in_flight"]] == [key]  # type: ignore[union-attr]
        assert main(["status", "--root", str(root)]) == 0
        text = capsys.readouterr().out
        assert f"gateway: serving {root}" in text and "@bob" in text and "running" in text and key in text
    finally:
        release.set()


def test_status_without_a_serve_reads_the_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_root(tmp_path)
    with Gateway(root, runner=RecordingRunner()) as gw:
        gw.wait_outcome(send_dm(gw, "hello"), timeout=10)
    assert main(["status", "--root", str(root), "--json"]) == 0
    status = _json(capsys)
    assert status["running"] is False and status["source"] == "files"
    assert status["counters"]["by_status"] == {"replied": 1}  # type: ignore[index]
    assert main(["status", "--root", str(root)]) == 0
    assert f"gateway: none serves {root}" in capsys.readouterr().out


def test_a_symlinked_bot_relay_is_a_status_problem_and_send_is_refused(
    tmp_path: Path, gateways: list[Gateway], capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (hostile paths): r4's ``bot_relay/`` a symlink to r1's, r1 served: ``status --root r4`` said
    ``gateway: serving r1`` (``problems: []``), and ``send --root r4`` was delivered by r1's host to r1's bob. Now
    status reads the files and says the problem as doctor does; send is refused (exit 2), nothing sent."""
    served = make_root(tmp_path / "one")
    mine = make_root(tmp_path / "four")
    rec = RecordingRunner()
    start_gateway(gateways, served, rec, serve_submit=True)
    (mine / "bot_relay").symlink_to(served / "bot_relay")
    assert main(["status", "--root", str(mine), "--json"]) == 0
    status = _json(capsys)
    assert status["running"] is False and status["root"] == str(mine)
    problems = status["problems"]
    assert isinstance(problems, list)
    assert problems[0].startswith(f"relay directories: {mine / 'bot_relay'} is a symlink or not a directory")
    assert main(["status", "--root", str(mine)]) == 0
    assert f"problem: relay directories: {mine / 'bot_relay'} is a symlink" in capsys.readouterr().out
    code = main(["send", "--root", str(mine), "--from", "alice", "bob", "for four's bob only", "--wait", "10"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith(f"error: {mine / 'bot_relay'} is a symlink or not a directory; refusing to use it: ")
    assert rec.entered == []


def test_json_output_escapes_a_file_name_that_is_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression (hostile paths): a FIFO named ``journal/j-\\xff\\xfe.log`` made ``status --json``, ``outcome
    <id> --json`` and ``doctor --json`` end with ``TypeError: str is not valid UTF-8: surrogates not allowed``
    (a traceback, exit 1), and a symlink ``profiles/l\\xfeink`` made ``doctor --json`` crash too. The JSON is
    printed, valid UTF-8, each undecodable byte written out as ``\\udcXX``."""
    root = make_root(tmp_path)
    journal = root / "bot_relay" / "journal"
    journal.mkdir(parents=True, mode=0o700)
    os.mkfifo(os.fsencode(journal) + b"/j-\xff\xfe.log")
    os.symlink(tmp_path, os.fsencode(root / "profiles") + b"/l\xfeink")
    runs = [(["status", "--root", str(root), "--json"], 0, "j-\\udcff\\udcfe.log is a FIFO"),
            (["outcome", "--root", str(root), "ab" * 16, "--json"], 1, "j-\\udcff\\udcfe.log is a FIFO"),
            (["doctor", "--root", str(root), "--json"], None, "profiles/l\\udcfeink: it is a symlink")]
    for argv, code, says in runs:
        got = main(argv)  # before: TypeError out of main (the CLI's traceback, exit 1)
        out, err = capsys.readouterr()
        assert got == code if code is not None else got in (0, 1), (argv, got, err)
        assert orjson.loads(out.encode("utf-8")) == json.loads(out)  # valid UTF-8 JSON, for a strict reader too
        assert says.replace("\\", "\\\\") in out, out  # the six characters \udcff, JSON-escaped


def test_status_of_a_missing_root_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--root", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("managed", [True, False])
def test_serve_says_at_start_when_no_profile_is_managed(tmp_path: Path, managed: bool,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from hermes_actors.cli.serve import serve

    root = make_root(tmp_path, managed=managed)
    stop = threading.Event()
    assert serve(root, connection_id=None, runner=RecordingRunner(), stop=stop, on_ready=lambda _: stop.set()) == 0
    err = capsys.readouterr().err
    assert ("not Bot-Mode-managed" in err and f"fix: hermes-actors enable --root {root}" in err) is not managed, err


def test_serve_warns_at_start_when_no_hermes_cli_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (acceptance review): ``serve`` (hermes runner, no --cli) on a machine without a ``hermes``
    executable started without a word, and every turn then failed runtime_offline. It warns at the start, with
    doctor's verdict and fix."""
    from hermes_actors.cli.serve import serve

    monkeypatch.setenv("HERMES_ACTORS_HERMES_CLI", str(tmp_path / "no-such-hermes"))
    root = make_root(tmp_path)
    stop = threading.Event()
    with LogCapture("WARNING") as logs:
        assert serve(root, connection_id=None, runner=None, stop=stop, on_ready=lambda _: stop.set()) == 0
    assert logs.matching("hermes CLI: no `hermes` executable found (beside python, $HERMES_ACTORS_HERMES_CLI, "
                         "PATH): every turn fails runtime_offline until hermes is installed or --cli is given; fix: "
                         "install hermes-agent (pip install 'hermes-actors[hermes]') or pass --cli PATH"), logs.lines


@pytest.mark.parametrize("warm", ["none", "answering", "not answering"])
def test_the_missing_cli_warning_says_what_fails(tmp_path: Path, warm: str) -> None:
    """Warm turns that answer still run without a hermes CLI: only their fallback is gone."""
    from hermes_actors.cli.serve import missing_cli_warning
    from hermes_actors.hermes.api_client import ApiServer
    from hermes_actors.hermes.api_runner import ApiRunner
    from hermes_actors.hermes.cli_runner import HermesCliRunner
    from hermes_actors.hermes.warm_or_cli import WarmOrCliRunner

    cli = HermesCliRunner(str(tmp_path / "no-such-hermes"))
    runner: Any = cli if warm == "none" else WarmOrCliRunner(ApiRunner(ApiServer("127.0.0.1", 9, "k" * 16)), cli,
                                                             cold=warm == "not answering")
    text = missing_cli_warning(runner)
    assert text is not None and text.startswith("hermes CLI: no `hermes` executable found") and text.endswith(
        "fix: install hermes-agent (pip install 'hermes-actors[hermes]') or pass --cli PATH"), text
    if warm == "answering":
        assert "warm turns run, but the CLI fallback is unavailable" in text and "every turn" not in text, text
    else:
        assert "every turn fails runtime_offline until hermes is installed or --cli is given" in text, text
    assert missing_cli_warning(HermesCliRunner(shutil.which("sh"))) is None  # found: nothing to say
    assert missing_cli_warning(RecordingRunner()) is None  # not the real Hermes: no CLI needed


def test_serve_names_the_root_and_connection_id_it_serves_as(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: with ``--root .`` the line said ``gateway serving . as …``: the raw argument, not the root."""
    from hermes_actors.cli.serve import serve

    root = make_root(tmp_path)
    monkeypatch.chdir(root)
    stop = threading.Event()
    assert serve(Path("."), connection_id="mini", runner=RecordingRunner(), stop=stop,
                 on_ready=lambda _: stop.set()) == 0
    assert f"gateway serving {root} as mini: @hermes" in capsys.readouterr().out


# ── outcome ─────────────────────────────────────────────────────────────────


def test_outcome_exit_codes_through_the_host(tmp_path: Path, gateways: list[Gateway],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    root = make_root(tmp_path)
    release = threading.Event()

    def behave(turn: object) -> str:
        body = getattr(turn, "content", "")
        if "fail" in body:
            raise RuntimeError("boom")
        return "done" if "slow" not in body or release.wait(30) else ""

    gw = start_gateway(gateways, root, RecordingRunner(behave), serve_submit=True)
    try:
        done = send_dm(gw, "quick")
        gw.wait_outcome(done, timeout=10)
        assert main(["outcome", "--root", str(root), done]) == 0
        assert capsys.readouterr().out == "Reply from @bob: done\n"
        failed = send_dm(gw, "please fail")
        gw.wait_outcome(failed, timeout=10)
        assert main(["outcome", "--root", str(root), failed]) == 1
        assert capsys.readouterr().out.startswith("failed [")
        slow = send_dm(gw, "slow one", target="carol")
        assert main(["outcome", "--root", str(root), slow]) == 1
        assert capsys.readouterr().out == f"pending: delivery {slow} has no outcome yet\n"
        waiter = threading.Thread(target=release.set)
        waiter.start()
        assert main(["outcome", "--root", str(root), slow, "--wait", "30", "--json"]) == 0
        assert _json(capsys)["status"] == "replied"
        waiter.join()
        assert main(["outcome", "--root", str(root), "0" * 32]) == 1
        assert capsys.readouterr().out.startswith(f"unknown: delivery {'0' * 32}")
    finally:
        release.set()


def test_outcome_without_a_host_reads_the_journal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_root(tmp_path)
    with Gateway(root, runner=RecordingRunner()) as gw:
        key = send_dm(gw, "hello")
        gw.wait_outcome(key, timeout=10)
    assert main(["outcome", "--root", str(root), key, "--json"]) == 0
    assert _json(capsys)["text"] == "Reply from @bob: ok: hello"
    assert main(["outcome", "--root", str(root), "f" * 32]) == 1


def test_outcome_of_a_relayed_dm_without_a_host_names_its_target(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    root = make_root(tmp_path)
    paths = InboxPaths.from_root(root).ensure()
    now = time.time()
    dave = RemoteAgent(profile="dave", handle="dave", connection_id="conn-mini", connection_label="Mini")
    envelope = make_envelope(target=dave, message="hi", sender_profile="alice", sender_handle="alice", now=now)
    key = envelope["id"]
    record_sent(paths, key, "@dave on Mini", now=now, sender="alice", sender_handle="alice")
    write_reply(paths.relay, make_reply(key, reply="hello back", now=now))
    # while the sender's gateway has not reported it, the sent record has the ack's label
    assert main(["outcome", "--root", str(root), key, "--json"]) == 0
    assert _json(capsys)["text"] == "Reply from @dave on Mini: hello back"
    # reported: the relay marks it consumed/ and drops the sent record; the envelope it claimed still names the target
    mark_consumed(paths, key, now=now)
    clear_sent(paths, key)
    enqueue_envelope(paths.relay, envelope)
    os.rename(paths.relay.outbox / f"{key}.json", paths.relay.claimed / f"{key}.json")
    assert main(["outcome", "--root", str(root), key]) == 0
    assert capsys.readouterr().out == "Reply from @dave on conn-mini: hello back\n"
    # nothing names it any more: a neutral label, never an error
    (paths.relay.claimed / f"{key}.json").unlink()
    assert main(["outcome", "--root", str(root), key, "--json"]) == 0
    assert _json(capsys)["from"] == "the relayed target"


def test_outcome_refuses_a_malformed_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_root(tmp_path)
    assert main(["outcome", "--root", str(root), "../../etc/passwd"]) == 2
    assert "is not a delivery id" in capsys.readouterr().err


# ── doctor ──────────────────────────────────────────────────────────────────

FAKE_HERMES = "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Hermes Agent v0.19.0'; exit 0; fi\nexit 1\n"


@pytest.fixture
def no_hermes_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor finds no hermes CLI ($HERMES_ACTORS_HERMES_CLI names none; a --cli naming none is refused, exit 2)."""
    monkeypatch.setenv("HERMES_ACTORS_HERMES_CLI", str(tmp_path / "missing"))


def _enabled_root(tmp_path: Path, config: dict[str, object] | None = None) -> Path:
    root = make_root(tmp_path, {"alice": {}})
    for home in (root, root / "profiles" / "alice"):
        cfg = dict(config or {}) if home == root else {}
        cfg["plugins"] = {"enabled": ["hermes-actors"]}
        (home / "config.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return root


def test_doctor_passes_on_a_ready_root(tmp_path: Path, gateways: list[Gateway],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    root = _enabled_root(tmp_path)
    cli = write_fake_cli(tmp_path, FAKE_HERMES)
    start_gateway(gateways, root, serve_submit=True)
    assert main(["doctor", "--root", str(root), "--cli", str(cli)]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "Hermes Agent v0.19.0" in out and "nothing blocks DMs" in out and "[block]" not in out


@pytest.mark.usefixtures("no_hermes_cli")
def test_doctor_names_each_blocker_with_its_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_root(tmp_path, {"alice": {}}, managed=False,
                     config={"bot_mode": {"turn_wait_secs": 3}})
    assert main(["doctor", "--root", str(root), "--json"]) == 1
    report = _json(capsys)
    checks = {c["name"]: c for c in report["checks"]}  # type: ignore[union-attr]
    assert report["blocking"] is True
    assert checks["hermes CLI"]["level"] == BLOCK and "pip install" in checks["hermes CLI"]["fix"]
    assert checks["profiles managed"]["level"] == BLOCK
    assert checks["profiles managed"]["fix"] == f"hermes-actors enable --root {root}"
    assert checks["daemon running"]["level"] == BLOCK and "hermes-actors serve" in checks["daemon running"]["fix"]
    assert checks["config keys"]["level"] == WARN
    assert "did you mean bot_mode.turn_wait_seconds?" in checks["config keys"]["detail"]


@pytest.mark.usefixtures("no_hermes_cli")
def test_doctor_warns_of_a_managed_profile_hermes_cannot_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_root(tmp_path, {"alice": {}, "UPPER": {}})  # both managed: on the roster, DMs to UPPER acked
    assert main(["doctor", "--root", str(root), "--json"]) == 1
    check = {c["name"]: c for c in _json(capsys)["checks"]}["profiles managed"]  # type: ignore[union-attr]
    assert check["level"] == WARN
    assert "hermes cannot run their turns: UPPER" in check["detail"] and "alice" not in check["detail"]
    assert "--profiles UPPER" in check["fix"]


def test_enable_and_disable_refuse_an_empty_or_bogus_profile_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_root(tmp_path, {"alice": {}}, managed=False)
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert main(["enable", "--root", str(root), "--profiles", ""]) == 2  # (a --cli naming nothing: refused first)
    assert "no profile named" in capsys.readouterr().err
    assert main(["disable", "--root", str(root), "--profiles", "../x"]) == 2
    err = capsys.readouterr().err
    assert "no such profile" in err and "../x" in err
    assert main(["disable", "--root", str(root), "--profiles", " , "]) == 2
    assert "no profile named" in capsys.readouterr().err
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before  # nothing was touched


def _config_keys_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bot_mode: dict[str, object]
) -> tuple[Path, dict[str, Any]]:
    """An enabled root whose config.yaml has ``bot_mode``, and doctor's "config keys" check of it (--json)."""
    root = _enabled_root(tmp_path, {"bot_mode": bot_mode})
    main(["doctor", "--root", str(root), "--json"])
    return root, {c["name"]: c for c in _json(capsys)["checks"]}["config keys"]  # type: ignore[union-attr]


@pytest.mark.usefixtures("no_hermes_cli")
def test_doctor_names_the_bad_values_a_host_would_replace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, check = _config_keys_check(tmp_path, capsys,
                                     {"max_hops": "zero", "wake_sender": "maybe", "turn_wait_secs": 3})
    assert check["level"] == WARN
    assert (f"{root / 'config.yaml'}: bot_mode.max_hops='zero' is not a valid int (it must be ≥ 1, ≤ 1000); "
            "using default 8") in check["detail"]
    assert "bot_mode.wake_sender='maybe'" in check["detail"]
    assert "unknown bot_mode.turn_wait_secs (did you mean bot_mode.turn_wait_seconds?)" in check["detail"]


@pytest.mark.usefixtures("no_hermes_cli")
def test_doctor_says_what_a_negative_turn_wait_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression (uxbatch): a negative ``bot_mode.turn_wait_seconds`` is read as 0, as the seed reads it; doctor
    said only that, not that a DM behind another turn of the bot (another process's included) then fails at once."""
    root, check = _config_keys_check(tmp_path, capsys, {"turn_wait_seconds": -5})
    assert check["level"] == WARN
    assert check["detail"] == (f"{root / 'config.yaml'}: bot_mode.turn_wait_seconds=-5 is read as 0.0, as the seed "
                               "reads it (`max(0, float(value))`): no wait, so a DM behind another turn of its bot "
                               "(this gateway's, or another process's holding the bot's lock) fails target_busy at "
                               "once, NOT delivered")
    assert check["fix"] == f"in {root / 'config.yaml'}: fix the values above (what each warning says is used meanwhile)"


@pytest.mark.usefixtures("no_hermes_cli")
def test_doctor_says_an_envelope_ttl_under_one_second_disables_expiry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (configfix): ``envelope_ttl_seconds: 0.5`` is 0 for the file relay (the seed's ``int()``), so
    expiry is off; doctor said ``[ok] config keys … no bad value``."""
    root, check = _config_keys_check(tmp_path, capsys, {"envelope_ttl_seconds": 0.5})
    assert check["level"] == WARN
    assert check["detail"] == (f"{root / 'config.yaml'}: bot_mode.envelope_ttl_seconds=0.5 is read as 0, as the seed "
                               "reads it (`int(value)`): that DISABLES envelope expiry on the file relay: an "
                               "envelope nobody drains is never answered `queued_expired`; the Redis transport, "
                               "which no seed reads, keeps 0.5")


@pytest.mark.usefixtures("no_hermes_cli")
def test_doctor_on_an_unreadable_config_asks_to_fix_it_not_to_enable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _enabled_root(tmp_path)
    (root / "config.yaml").write_text("plugins: [unclosed\n", encoding="utf-8")
    main(["doctor", "--root", str(root), "--json"])
    check = {c["name"]: c for c in _json(capsys)["checks"]}["plugin enabled"]  # type: ignore[union-attr]
    assert check["level"] == BLOCK and f"config file {root / 'config.yaml'} is malformed YAML" in check["detail"]
    assert check["fix"] == f"fix {root / 'config.yaml'}" and "enable" not in check["fix"]


@pytest.mark.usefixtures("no_hermes_cli")
@pytest.mark.parametrize(("planted", "says"), [("FIFO", "is not a regular file"), ("symlink", "is a symlink")])
def test_doctor_names_one_problem_for_a_config_yaml_that_is_not_a_file_in_every_check_that_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], planted: str, says: str
) -> None:
    """Regression (hostile-files review): with config.yaml a FIFO or /dev/zero, "plugin enabled" and "models" said
    `the config.yaml of default does not read as YAML`, and only "config keys" said `is not a regular file`. One
    reading rule (read_yaml_mapping), one message: each check names the file's problem as that rule words it."""
    root = _enabled_root(tmp_path)
    config = root / "config.yaml"
    config.unlink()
    if planted == "FIFO":
        os.mkfifo(config, 0o600)
    else:
        config.symlink_to("/dev/zero")
    main(["doctor", "--root", str(root), "--json"])
    checks = {c["name"]: c for c in _json(capsys)["checks"]}  # type: ignore[union-attr]
    said = f"config file {config} {says}; ignoring it"
    for name in ("plugin enabled", "models", "config keys"):
        assert said in checks[name]["detail"], checks[name]
        assert "does not read as YAML" not in checks[name]["detail"], checks[name]


def test_doctor_reports_an_unreachable_redis(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    root = _enabled_root(tmp_path, {"bot_mode": {"transport": f"redis://user:secret@127.0.0.1:{port}/0"}})
    checks = {c.name: c for c in run_doctor(root, cli=str(write_fake_cli(tmp_path, FAKE_HERMES)),
                                            ping=lambda r: {"pid": 1, "root": str(r), "version": "x"})}
    assert checks["redis extra"].level == OK
    assert checks["redis"].level == BLOCK and "unreachable" in checks["redis"].detail
    assert "secret" not in checks["redis"].detail  # the password is masked


def test_doctor_warns_of_bot_peers_a_hermes_without_a_peer_command_cannot_reach(tmp_path: Path) -> None:
    """Regression (acceptance run, hermes-agent 0.19): a `bot_peers` DM was acked, then failed runtime_offline
    3 s later, and doctor said nothing of it. It now names the peer and why, with the fix."""
    root = _enabled_root(tmp_path, {"bot_peers": ["spark"]})
    cli = str(write_fake_cli(tmp_path, HERMES_019))
    checks = {c.name: c for c in run_doctor(root, cli=cli, ping=lambda r: {"pid": 1, "root": str(r), "version": "x"})}
    peers = checks["bot_peers"]
    assert peers.level == WARN, peers
    assert peers.detail.startswith("spark: reached with `hermes peer dm`") and "has no `peer` command" in peers.detail
    assert "hermes-agent 0.19 has no Bot Mode peers" in peers.detail and "acked, then fails" in peers.detail
    assert "Redis" in peers.fix and "hermes release with Bot Mode" in peers.fix
    bare = _enabled_root(tmp_path / "other")  # no bot_peers: nothing to ask the CLI
    assert {c.name: c for c in run_doctor(bare, cli=cli)}["bot_peers"].level == OK


def test_the_bot_peers_warning_joins_why_into_its_sentence() -> None:
    """Regression (docs review): doctor printed ``spark: reached with `hermes peer dm`, but The hermes CLI at …``,
    a capital mid-sentence: the failed DM's sentence was joined as it was. Its first letter is lower-cased now."""
    check = check_peers(["spark"], [], "/usr/bin/hermes", True)
    assert check.detail.startswith("spark: reached with `hermes peer dm`, but the hermes CLI at '/usr/bin/hermes' "
                                   "has no `peer` command"), check.detail


@pytest.mark.parametrize(("text", "joined"), [
    ("The hermes CLI at '/x' has no `peer` command", "the hermes CLI at '/x' has no `peer` command"),
    ("A DM is acked", "a DM is acked"),
    ("CLI not found", "CLI not found"),  # an acronym keeps its capitals
    ("EACCES on /x", "EACCES on /x"),
    ("already lower", "already lower"),
    ("", ""),
])
def test_within_sentence_lowercases_the_first_letter_but_of_an_acronym(text: str, joined: str) -> None:
    assert within_sentence(text) == joined


def test_doctor_names_enable_gateway_in_the_hosting_fix_only_until_it_was_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (journey review): with no host running, doctor's fix said `(or: HERMES_HOME=… hermes gateway run,
    after hermes-actors enable --root … --gateway)` also once `enable --gateway` was done; it names that step only
    while the root's config.yaml does not ask its hermes gateway to host the actors yet."""
    root = make_root(tmp_path, managed=False)
    cli = str(write_fake_cli(tmp_path, FAKE_HERMES))
    assert main(["enable", "--root", str(root)]) == 0

    def daemon_fix() -> str:
        return {c.name: c for c in run_doctor(root, cli=cli, ping=lambda r: None)}["daemon running"].fix

    assert daemon_fix() == (f"hermes-actors serve --root {root}   (or: HERMES_HOME={root} hermes gateway run, after "
                            f"hermes-actors enable --root {root} --gateway)")
    assert main(["enable", "--root", str(root), "--gateway"]) == 0
    assert daemon_fix() == f"hermes-actors serve --root {root}   (or: HERMES_HOME={root} hermes gateway run)"


@pytest.mark.parametrize(("config", "hosts"), [
    ({}, False),
    ({"platforms": {"hermes_actors": {"enabled": True, "extra": {"host_actors": True}}}}, True),
    ({"gateway": {"platforms": {"hermes_actors": {"enabled": "yes", "extra": {"host_actors": True}}}}}, True),
    ({"platforms": {"hermes_actors": {"enabled": False, "extra": {"host_actors": True}}}}, False),  # switched off
    ({"platforms": {"hermes_actors": {"enabled": True}}}, False),  # no marker: hermes never starts it
    ({"platforms": {"hermes_actors": {"enabled": True, "extra": {"host_actors": "yes"}}}}, False),
    ({"platforms": {"hermes_actors": None}}, False),  # no block to hermes
], ids=["none", "top", "nested", "off", "no-marker", "marker-not-true", "null"])
def test_gateway_hosts_actors(config: dict[str, Any], hosts: bool) -> None:
    from hermes_actors.hermes.setup import gateway_hosts_actors

    assert gateway_hosts_actors(config) is hosts


def test_doctor_names_a_relay_directory_other_users_may_write_in(tmp_path: Path) -> None:
    """Regression (hostile review): with replies/ and outbox/ chmod 0777, ``doctor`` said all was ok. It warns
    now, naming each directory and its mode, with the chmod that fixes it; it changes nothing itself."""
    root = _enabled_root(tmp_path)
    paths = InboxPaths.from_root(root).ensure()
    cli = str(write_fake_cli(tmp_path, FAKE_HERMES))
    assert {c.name: c for c in run_doctor(root, cli=cli, ping=lambda r: None)}["relay directories"].level == OK
    for directory in (paths.relay.replies, paths.relay.outbox):
        os.chmod(directory, 0o777)
    check = {c.name: c for c in run_doctor(root, cli=cli, ping=lambda r: None)}["relay directories"]
    assert check.level == WARN, check
    assert f"{paths.relay.outbox} (mode 0777)" in check.detail and f"{paths.relay.replies} (mode 0777)" in check.detail
    assert check.fix.startswith(f"chmod 700 {paths.relay.outbox} {paths.relay.replies}"), check.fix
    assert os.stat(paths.relay.replies).st_mode & 0o777 == 0o777  # the doctor only looks


def test_doctor_names_journal_and_rooms_other_users_may_write_in(tmp_path: Path) -> None:
    """Regression (configfix): with journal/ and rooms/ chmod 0777, ``doctor`` said ``[ok] relay directories``."""
    root = _enabled_root(tmp_path)
    paths = InboxPaths.from_root(root).ensure()
    for directory in (paths.journal, paths.rooms):
        ensure_private_dir(directory, within=root)
        os.chmod(directory, 0o777)
    check = {c.name: c for c in run_doctor(root, cli=str(write_fake_cli(tmp_path, FAKE_HERMES)),
                                           ping=lambda r: None)}["relay directories"]
    assert check.level == WARN, check
    assert f"{paths.journal} (mode 0777)" in check.detail and f"{paths.rooms} (mode 0777)" in check.detail, check
    assert check.fix.startswith(f"chmod 700 {paths.journal} {paths.rooms}"), check.fix


def test_doctor_plugin_missing_for_one_profile_is_a_warning(tmp_path: Path) -> None:
    root = _enabled_root(tmp_path)
    (root / "profiles" / "alice" / "config.yaml").write_text("plugins: {enabled: []}\n", encoding="utf-8")
    checks = {c.name: c for c in run_doctor(root, cli=str(write_fake_cli(tmp_path, FAKE_HERMES)),
                                            ping=lambda r: None)}
    assert checks["plugin enabled"].level == WARN and "alice" in checks["plugin enabled"].detail
    assert checks["plugin enabled"].fix.endswith("--profiles alice")


@pytest.mark.parametrize(
    ("own", "remote", "routed", "level"),
    [
        (set(), set(), set(), OK),
        ({"alpha"}, {"mini"}, {"alpha"}, OK),
        ({"alpha"}, {"alpha", "mini"}, set(), BLOCK),  # our name is another root's on the hub
        ({"alpha"}, {"mini"}, {"alfa"}, BLOCK),  # the hub routes to us under another name
    ],
)
def test_connection_id_check(own: set[str], remote: set[str], routed: set[str], level: str) -> None:
    assert check_connection_ids(own, remote, routed).level == level


def test_doctor_sees_the_hub_route_to_a_running_gateway_under_another_name(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Regression: a running gateway empties ``inbox/`` at once, so doctor never saw the name the hub used for it
    ("connection ids: gateway runs as mini" while the hub routed here as mini2); the relay now keeps the names
    it was handed in its heartbeat, and says so once in the log."""
    from relay_helpers import seed_envelope

    from hermes_actors.store.relay_inbox import post_to_inbox

    root = make_root(tmp_path)
    cli = str(write_fake_cli(tmp_path, FAKE_HERMES))
    start_gateway(gateways, root, RecordingRunner(), connection_id="mini")
    paths = InboxPaths.from_root(root)
    with LogCapture("WARNING") as logs:
        for name in ("mini", "mini2"):
            envelope = seed_envelope(target_connection=name, target_profile="bob", message=f"to {name}")
            post_to_inbox(paths, envelope, "alpha")
            await_condition((paths.delivered / f"{envelope['id']}.json").exists, timeout=20,
                            message=f"the envelope routed as {name} answered")
    # the warning is logged before the envelope is handed on, so before its answer: once, for mini2 only
    assert len(logs.matching("routes DMs to this root as 'mini2'", "runs as 'mini'")) == 1
    assert logs.matching("routes DMs to this root as") == logs.matching("'mini2'")
    checks = {c.name: c for c in run_doctor(root, cli=cli, ping=lambda r: None)}
    assert checks["connection ids"].level == BLOCK, checks["connection ids"]
    assert "routes to this root as mini2" in checks["connection ids"].detail


def test_doctor_reads_only_live_gateways_heartbeats_and_a_name_the_hub_stopped_using_lapses(
    tmp_path: Path, gateways: list[Gateway], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (review): doctor blocked on a killed gateway's heartbeat file (its routed_as), and a running
    gateway kept a name the hub once used until it restarted, after the hub's --name was fixed."""
    from relay_helpers import seed_envelope

    from hermes_actors.relay import relay_actor
    from hermes_actors.store.processes import pid_alive
    from hermes_actors.store.relay_inbox import post_to_inbox

    root = make_root(tmp_path)
    cli = str(write_fake_cli(tmp_path, FAKE_HERMES))
    paths = InboxPaths.from_root(root)
    paths.heartbeat.mkdir(parents=True, exist_ok=True, mode=0o700)
    dead = next(pid for pid in range(4_000_000, 4_100_000) if not pid_alive(pid))
    (paths.heartbeat / f"{dead}.json").write_text(json.dumps(
        {"pid": dead, "connection_id": "alpha", "at": int(time.time()), "routed_as": ["beta"]}), encoding="utf-8")
    checks = {c.name: c for c in run_doctor(root, cli=cli, ping=lambda r: None)}
    assert checks["connection ids"].level == OK, checks["connection ids"]  # the killed gateway's file is ignored

    monkeypatch.setattr(relay_actor, "ROUTED_AS_KEEP_SECONDS", 0.0)  # a name lapses at the next heartbeat
    start_gateway(gateways, root, RecordingRunner(), connection_id="mini")
    envelope = seed_envelope(target_connection="mini2", target_profile="bob")
    post_to_inbox(paths, envelope, "alpha")
    await_condition((paths.delivered / f"{envelope['id']}.json").exists, timeout=20, message="the envelope answered")
    mine = paths.heartbeat / f"{os.getpid()}.json"
    await_condition(lambda: "routed_as" not in json.loads(mine.read_text(encoding="utf-8")), timeout=20,
                    message="the name the hub no longer uses dropped from the heartbeat")
    checks = {c.name: c for c in run_doctor(root, cli=cli, ping=lambda r: None)}
    assert checks["connection ids"].level == OK and "runs as mini" in checks["connection ids"].detail


def test_doctor_tells_a_wrong_redis_password_from_a_good_one(tmp_path: Path) -> None:
    from redis_fixture import RedisServer, redis_binary

    if redis_binary() is None:
        pytest.skip("redis-server is not installed (apt-get install -y redis-server)")
    server = RedisServer(tmp_path / "redis", password="right-password").start()
    try:
        cli = str(write_fake_cli(tmp_path, FAKE_HERMES))
        for password, level in (("wrong-password", BLOCK), ("right-password", OK)):
            root = _enabled_root(tmp_path / password,
                                 {"bot_mode": {"transport": f"redis://:{password}@127.0.0.1:{server.port}/0"}})
            checks = {c.name: c for c in run_doctor(root, cli=cli, ping=lambda r: None)}
            assert checks["redis"].level == level, checks["redis"]
            if level == BLOCK:
                assert "credentials" in checks["redis"].detail and password not in checks["redis"].detail
    finally:
        server.kill()


def test_enable_keeps_the_text_of_a_commented_config_it_rewrites(tmp_path: Path) -> None:
    from hermes_actors.hermes.setup import enable

    root = make_root(tmp_path, {"alice": {}}, managed=False)
    config = root / "profiles" / "alice" / "config.yaml"
    original = "# written by hermes profile create\n# model: pick one\nmodel:\n  provider: custom\n"
    config.write_text(original, encoding="utf-8")
    report = enable(root, ["alice"], cli=str(tmp_path / "missing"), env={})
    kept = config.with_name("config.yaml.before-hermes-actors")
    assert kept.read_text(encoding="utf-8") == original
    assert f"{config}: rewritten without its comments; its previous text is in {kept}" in report.changed
    assert yaml.safe_load(config.read_text())["plugins"]["enabled"] == ["hermes-actors"]
    enable(root, ["alice"], cli=str(tmp_path / "missing"), env={})  # idempotent: the first text stays kept
    assert kept.read_text(encoding="utf-8") == original


def test_enable_keeps_the_text_of_a_yaml_file_whose_comments_are_at_lines_ends(tmp_path: Path) -> None:
    """An end-of-line comment is a comment too: the rewrite drops it, so the first text is kept and said."""
    from hermes_actors.hermes.setup import disable, enable

    root = make_root(tmp_path, {"alice": {}}, managed=False)
    config, profile = root / "config.yaml", root / "profiles" / "alice" / "profile.yaml"
    texts = {config: "model:\n  default: gpt-4o   # keep: the model we pay for\n  provider: openai  # do not change\n",
             profile: "display_name: Alice  # her public name\n"}
    for path, text in texts.items():
        path.write_text(text, encoding="utf-8")
    report = enable(root, ["alice", "default"], cli=str(tmp_path / "missing"), env={})
    for path, text in texts.items():
        kept = path.with_name(f"{path.name}.before-hermes-actors")
        assert kept.read_text(encoding="utf-8") == text, path
        assert f"{path}: rewritten without its comments; its previous text is in {kept}" in report.changed
    assert yaml.safe_load(config.read_text())["model"] == {"default": "gpt-4o", "provider": "openai"}
    disable(root)
    assert (root / "config.yaml.before-hermes-actors").read_text(encoding="utf-8") == texts[config]


def test_enable_keeps_no_copy_of_a_yaml_file_whose_hashes_are_text(tmp_path: Path) -> None:
    from hermes_actors.hermes.setup import enable

    root = make_root(tmp_path, {"alice": {}}, managed=False)
    config = root / "profiles" / "alice" / "config.yaml"
    config.write_text('model:\n  base_url: http://127.0.0.1:8080/v1#frag\n  note: "# not a comment"\n',
                      encoding="utf-8")
    report = enable(root, ["alice"], cli=str(tmp_path / "missing"), env={})
    assert not config.with_name("config.yaml.before-hermes-actors").exists()
    assert not any("rewritten without its comments" in line for line in report.changed), report.changed


def test_enable_never_writes_through_a_hard_link_left_at_a_temp_name(tmp_path: Path) -> None:
    """The YAML it rewrites is staged in a fresh file of its own: a link planted beside it is not followed."""
    from hermes_actors.hermes.setup import enable

    root = make_root(tmp_path, {"bob": {}}, managed=False, config={"model": {}})
    config, profile = root / "config.yaml", root / "profiles" / "bob" / "profile.yaml"
    config.chmod(0o640)
    outside = tmp_path / "outside"
    outside.write_text("SECRET\n", encoding="utf-8")
    for planted in (root / ".config.yaml.hermes-actors.tmp", profile.with_name(".profile.yaml.hermes-actors.tmp")):
        os.link(outside, planted)  # the temp name enable used to open with O_TRUNC
    enable(root, cli=str(tmp_path / "missing"), env={})
    assert outside.read_text(encoding="utf-8") == "SECRET\n" and outside.stat().st_nlink == 3
    for edited in (config, profile):
        assert edited.stat().st_ino != outside.stat().st_ino, edited
    assert yaml.safe_load(config.read_text())["plugins"]["enabled"] == ["hermes-actors"]
    assert yaml.safe_load(profile.read_text())["ui_meta"]["hermes-bots"] == {}
    assert config.stat().st_mode & 0o777 == 0o640  # the edited file keeps its mode


def test_enable_does_not_hang_on_a_fifo_left_at_a_temp_name(tmp_path: Path) -> None:
    from hermes_actors.hermes.setup import enable

    root = make_root(tmp_path, {"bob": {}}, managed=False, config={"model": {}})
    fifo = root / ".config.yaml.hermes-actors.tmp"
    os.mkfifo(fifo)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            enable(root, cli=str(tmp_path / "missing"), env={})
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)
    hung = worker.is_alive()
    if hung:  # let the writer through, so the thread ends with the test
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        worker.join(60)
    assert not hung, "enable blocked opening the FIFO"
    assert errors == []
    assert yaml.safe_load((root / "config.yaml").read_text())["plugins"]["enabled"] == ["hermes-actors"]


@pytest.mark.parametrize(("profiles", "level", "says"), [
    ({"alice": {}, "bob": {"managed": False}}, WARN, "not managed: bob (their Bot Chat gets no message_agent tool; "
                                                   "they still receive DMs)"),
    ({"alice": {}, "UPPER": {"managed": False}}, OK, "2 profile(s): default, alice; left off the roster, hermes "
                                                     "cannot run them: UPPER"),
], ids=["unmanaged", "unmanaged-unrunnable"])
@pytest.mark.usefixtures("no_hermes_cli")
def test_doctor_says_what_an_unmanaged_profile_means(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], profiles: dict[str, dict[str, bool]], level: str, says: str
) -> None:
    root = make_root(tmp_path, profiles)
    main(["doctor", "--root", str(root), "--json"])
    check = {c["name"]: c for c in _json(capsys)["checks"]}["profiles managed"]  # type: ignore[union-attr]
    assert (check["level"], check["detail"]) == (level, says)


@pytest.mark.parametrize(("server", "answers", "key_missing", "level", "says"), [
    (None, False, True, WARN, "API_SERVER_KEY is not set or shorter than 16 characters"),
    (None, False, False, OK, "not configured: turns run with the hermes CLI"),
    ("127.0.0.1:8642", False, False, WARN, "does not answer: turns run with the hermes CLI until it does"),
    ("127.0.0.1:8642", True, False, OK, "the hermes API server 127.0.0.1:8642 answers (a probe just now; no host "
                                        "runs"),  # no host: only the probe can be said
], ids=["key-missing", "not-configured", "down", "warm"])
def test_doctor_says_whether_turns_run_warm(
    tmp_path: Path, server: str | None, answers: bool, key_missing: bool, level: str, says: str
) -> None:
    from hermes_actors.ops.doctor_checks import check_warm_turns

    check = check_warm_turns(tmp_path, server, answers, key_missing)
    assert check.level == level and says in check.detail, check


@pytest.mark.parametrize(("host", "level", "says"), [
    (None, OK, "answers (a probe just now; no host runs: one that starts runs its turns warm through it)"),
    ({"pid": 7, "turns_via": "warm", "cli_seconds": 0.0}, OK,
     "through the hermes API server 127.0.0.1:8642 (the running host, pid 7, runs its next turn there)"),
    ({"pid": 7, "turns_via": "starting", "cli_seconds": 0.0}, OK, "the running host, pid 7, runs its next turn there"),
    ({"pid": 7, "turns_via": "cli", "cli_seconds": 24.6}, WARN,
     "answers, but the running host (pid 7) runs turns with the hermes CLI for up to 25 s more"),
    ({"pid": 7, "turns_via": "cli", "cli_seconds": None}, WARN, "runs every turn with the hermes CLI"),
    ({"pid": 7}, OK, "answers (a probe just now; the running host, pid 7, does not say how its turns run)"),
], ids=["no-host", "host-warm", "host-starting", "host-cli-for-now", "host-cli-for-good", "host-says-nothing"])
def test_doctor_says_warm_turns_are_ok_only_when_the_running_host_runs_them_warm(
    tmp_path: Path, host: dict[str, Any] | None, level: str, says: str
) -> None:
    from hermes_actors.ops.doctor_checks import check_warm_turns

    check = check_warm_turns(tmp_path, "127.0.0.1:8642", True, False, host=host)
    assert check.level == level and says in check.detail, check
    assert check.level == OK or check.fix, check


@pytest.mark.parametrize(("host", "level", "says"), [
    (None, OK, "the hermes API server 127.0.0.1:8642 answers (a probe of /health just now; its API_SERVER_KEY is in "
               "neither "),
    ({"pid": 7, "turns_via": "warm", "cli_seconds": 0.0}, OK,
     "through the hermes API server 127.0.0.1:8642 (the running host, pid 7, runs its next turn there); its "
     "API_SERVER_KEY is in neither "),
    ({"pid": 7, "turns_via": "cli", "cli_seconds": 24.6}, WARN, "runs turns with the hermes CLI for up to 25 s more"),
    ({"pid": 7, "turns_via": "cli", "cli_seconds": None}, WARN,
     "(pid 7) runs every turn with the hermes CLI: it read no usable API_SERVER_KEY"),
], ids=["no-host", "host-warm", "host-cli-for-now", "host-cli-for-good"])
def test_doctor_says_an_api_server_started_with_a_key_it_cannot_see_runs(
    tmp_path: Path, host: dict[str, Any] | None, level: str, says: str
) -> None:
    from hermes_actors.ops.doctor_checks import check_warm_turns

    check = check_warm_turns(tmp_path, "127.0.0.1:8642", True, True, runs_unseen=True, host=host)
    assert check.level == level and says in check.detail, check
    assert "refuses to start" not in check.detail and "every turn runs with the hermes CLI" not in check.detail
    assert check.level == OK or check.fix, check


@pytest.mark.parametrize("hosted", [True, False], ids=["gateway-hosts", "no-host"])
def test_doctor_does_not_say_the_api_server_cannot_start_while_it_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hosted: bool
) -> None:
    """Regression (hermes 0.19): `hermes gateway run` started with API_SERVER_KEY in its environment (not in the
    root's .env) starts its API server from the config.yaml block and serves warm turns, yet doctor, run from a shell
    without the variable, warned "API_SERVER_KEY is not set … hermes refuses to start it, so every turn runs with the
    hermes CLI": it took its own environment for the gateway's."""
    monkeypatch.delenv("API_SERVER_KEY", raising=False)
    api = AnsweringApi(sessions=401)  # its key is not ours to know: only /health answers us
    try:
        root = make_root(tmp_path, config={
            "platforms": {"api_server": {"enabled": True, "extra": {"host": "127.0.0.1", "port": api.port}}},
            "gateway": {"multiplex_profiles": True}})
        (root / "gateway.pid").write_text(json.dumps({"pid": os.getpid()}), encoding="utf-8")  # the gateway runs
        pong = {"pid": 7, "turns_via": "warm", "cli_seconds": 0.0} if hosted else None
        checks = {c.name: c for c in run_doctor(root, cli=str(write_fake_cli(tmp_path, FAKE_HERMES)),
                                                ping=lambda r: pong)}
    finally:
        api.close()
    check = checks["warm turns"]
    assert check.level == OK, check
    assert f"127.0.0.1:{api.port}" in check.detail and "refuses to start" not in check.detail, check
    assert "the hermes gateway took it from the environment it was started with, which doctor cannot see" in \
        check.detail, check



@pytest.mark.parametrize(("health_body", "gateway_runs"), [
    (b"[]", True), (b'"ok"', True), (b'{"status": "ok"}', False),
], ids=["list", "string", "no-gateway"])
def test_doctor_trusts_an_answering_health_only_from_the_roots_running_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, health_body: bytes, gateway_runs: bool
) -> None:
    """Regression (diffrev35): with the key doctor reads missing, doctor probed /health on the configured port and
    said `[ok] … answers` of any program answering {"status": "ok"} there, though no hermes gateway of the root ran;
    a body of other JSON (`[]`, `"ok"`) crashed it (AttributeError: 'list' object has no attribute 'get')."""
    monkeypatch.delenv("API_SERVER_KEY", raising=False)
    api = AnsweringApi(sessions=401, health_body=health_body)
    try:
        root = make_root(tmp_path, config={
            "platforms": {"api_server": {"enabled": True, "extra": {"host": "127.0.0.1", "port": api.port}}},
            "gateway": {"multiplex_profiles": True}})
        if gateway_runs:
            (root / "gateway.pid").write_text(json.dumps({"pid": os.getpid()}), encoding="utf-8")
        checks = {c.name: c for c in run_doctor(root, cli=str(write_fake_cli(tmp_path, FAKE_HERMES)),
                                                ping=lambda r: None)}
    finally:
        api.close()
    check = checks["warm turns"]
    assert check.level == WARN and "hermes refuses to start it" in check.detail, check


def test_doctor_still_says_the_key_is_missing_when_nothing_answers(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("API_SERVER_KEY", raising=False)
    with socket.socket() as taken:  # bound, not listening: a connection to it is refused
        taken.bind(("127.0.0.1", 0))
        root = make_root(tmp_path, config={
            "platforms": {"api_server": {"enabled": True, "extra": {"host": "127.0.0.1",
                                                                    "port": taken.getsockname()[1]}}},
            "gateway": {"multiplex_profiles": True}})
        checks = {c.name: c for c in run_doctor(root, cli=str(write_fake_cli(tmp_path, FAKE_HERMES)),
                                                ping=lambda r: None)}
    assert checks["warm turns"].level == WARN and "hermes refuses to start it" in checks["warm turns"].detail


def test_doctor_says_the_gateway_hosting_the_actors_waits_for_its_api_server_starting(tmp_path: Path) -> None:
    from hermes_actors.ops.doctor_checks import check_warm_turns

    check = check_warm_turns(tmp_path, "127.0.0.1:8642", False, False, "does not answer (refused)",
                             host={"pid": 7, "turns_via": "starting", "cli_seconds": 0.0})
    assert check.level == WARN and check.detail == (
        "the hermes API server 127.0.0.1:8642 does not answer yet: the running host (pid 7, the hermes gateway) "
        "waits for it to start, up to 30 s from its own start, then runs turns with the hermes CLI until it answers")
    assert str(tmp_path / "logs" / "gateway.log") in check.fix


def test_doctor_does_not_say_warm_turns_are_ok_while_the_running_host_runs_them_with_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, no_hermes_cli: None
) -> None:
    """Regression (acceptance, hermes 0.19): `doctor` said `[ok] warm turns: through the hermes API server` while
    the hermes gateway hosting the actors ran every DM as a cold CLI turn (its API server had answered a probe,
    the host's runner had not tried it again yet). The host's ping now says how its turns run."""
    from hermes_actors.hermes.api_client import ApiServer
    from hermes_actors.hermes.api_runner import ApiRunner
    from hermes_actors.hermes.cli_runner import HermesCliRunner
    from hermes_actors.hermes.warm_or_cli import WarmOrCliRunner

    monkeypatch.delenv("API_SERVER_KEY", raising=False)
    api = AnsweringApi()
    try:
        key = "k" * 20
        root = make_root(tmp_path, config={
            "platforms": {"api_server": {"enabled": True, "extra": {"host": "127.0.0.1", "port": api.port,
                                                                    "key": key}}},
            "gateway": {"multiplex_profiles": True}})
        cold = WarmOrCliRunner(ApiRunner(ApiServer("127.0.0.1", api.port, key)), HermesCliRunner("/bin/sh"),
                               cold=True)  # its start's probe found no API server: the CLI for 30 s
        with Gateway(root, runner=cold, serve_submit=True):
            main(["doctor", "--root", str(root), "--json"])
    finally:
        api.close()
    check = {c["name"]: c for c in _json(capsys)["checks"]}["warm turns"]  # type: ignore[union-attr]
    assert check["level"] == WARN, check
    assert f"the hermes API server 127.0.0.1:{api.port} answers, but the running host (pid {os.getpid()}) runs " \
           "turns with the hermes CLI for up to" in check["detail"], check


@pytest.mark.parametrize(("health", "sessions", "needle", "fix"), [
    (200, 401, "refuses our API_SERVER_KEY (HTTP 401)", "the same API_SERVER_KEY"),
    (404, 200, "answered HTTP 404 on /health", "free the port"),
], ids=["key-refused", "another-server"])
def test_doctor_names_an_api_server_that_answers_but_not_as_ours_expects(
    tmp_path: Path, health: int, sessions: int, needle: str, fix: str
) -> None:
    """Regression: a key the running gateway refuses, or another program on the port, read as "does not
    answer" and the fix said to start the gateway, which was running."""
    from hermes_actors.hermes.api_client import ApiServer
    from hermes_actors.hermes.select import api_server_problem
    from hermes_actors.ops.doctor_checks import check_warm_turns

    fake = AnsweringApi(health, sessions)
    try:
        problem = api_server_problem(ApiServer("127.0.0.1", fake.port, "k" * 20))
    finally:
        fake.close()
    assert problem is not None and problem.misconfigured and needle in problem.text, problem
    check = check_warm_turns(tmp_path, f"127.0.0.1:{fake.port}", False, False, problem.text, problem.misconfigured)
    assert check.level == WARN and needle in check.detail and fix in check.fix, check


@pytest.mark.usefixtures("no_hermes_cli")
def test_doctor_warns_when_enable_gateway_left_the_api_server_without_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """hermes refuses to start the API server without the key: every turn then runs with the CLI, silently."""
    monkeypatch.delenv("API_SERVER_KEY", raising=False)
    root = make_root(tmp_path, config={"platforms": {"api_server": {"enabled": True, "extra": {"port": 8642}}},
                                       "gateway": {"multiplex_profiles": True}})
    main(["doctor", "--root", str(root), "--json"])
    check = {c["name"]: c for c in _json(capsys)["checks"]}["warm turns"]  # type: ignore[union-attr]
    assert check["level"] == WARN and "API_SERVER_KEY" in check["detail"] and ".env" in check["fix"], check


@pytest.mark.parametrize(("enabled", "level", "needle"), [
    ({}, BLOCK, "no profile is Bot-Mode-managed"),  # was OK: "enabled for 0 managed profile(s)"
    ({"alice": True, "bob": True}, OK, "enabled for 2 managed profile(s)"),
    ({"alice": True, "bob": False}, WARN, "not enabled for: bob"),
    ({"alice": False}, BLOCK, "in no profile's plugins.enabled"),
    ({"alice": None}, BLOCK, "cannot tell: config file /x/config.yaml is not a regular file; ignoring it (hermes "
                             "cannot load the plugin"),
])
def test_check_plugin(tmp_path: Path, enabled: dict[str, bool | None], level: str, needle: str) -> None:
    check = check_plugin(tmp_path, enabled, {"alice": "config file /x/config.yaml is not a regular file; ignoring it"})
    assert check.level == level and needle in check.detail


@pytest.mark.parametrize(("models", "level", "needle"), [
    ({"alice": "fake-model", "bob": "gpt-x"}, OK, "(fake-model, gpt-x)"),
    ({"alice": "fake-model", "bob": ""}, WARN, "no model set for: bob"),
    ({"alice": None}, WARN, "cannot tell: config file /x/config.yaml is a symlink; ignoring it (hermes cannot run"),
])
def test_check_models(tmp_path: Path, models: dict[str, str | None], level: str, needle: str) -> None:
    # an unmanaged one's problem is named nowhere else
    check = check_models(tmp_path, models, {"alice": "config file /x/config.yaml is a symlink; ignoring it"})
    assert check.level == level and needle in check.detail, check
    if level == WARN and "bob" in models:
        assert str(tmp_path / "profiles" / "bob" / "config.yaml") in check.fix
        assert "hermes -p bob model" in check.fix  # the profile named, no placeholder


@pytest.mark.parametrize(("model", "level"), [
    ({"provider": "custom", "default": "fake-model"}, OK),
    ({"model": "fake-model"}, OK),  # the older key hermes still reads
    ("fake-model", OK),
    (None, WARN),
    ({"default": "   "}, WARN),
    ({"temperature": 0.2}, WARN),
    # hermes completes these itself (a local server's one model, a provider's default): no warning
    ({"provider": "custom", "base_url": "http://127.0.0.1:9/v1"}, OK),
    ({"provider": "openrouter"}, OK),
])
def test_doctor_warns_of_a_managed_bot_without_a_model(tmp_path: Path, model: Any, level: str) -> None:
    """A managed profile with no model of its own acked DMs and failed every turn missing_config; doctor said ok."""
    root = make_root(tmp_path, {"alice": {}}, config={"model": {"default": "the-root-model"}})  # the default bot's
    config = root / "profiles" / "alice" / "config.yaml"
    config.write_text(yaml.safe_dump({"model": model} if model is not None else {}), encoding="utf-8")
    check = {c.name: c for c in run_doctor(root, cli=str(tmp_path / "missing"), ping=lambda r: None)}["models"]
    assert check.level == level, check
    assert ("alice" in check.detail) == (level == WARN)


def test_doctor_names_an_unmanaged_bot_without_a_model_too(tmp_path: Path) -> None:
    """A profile created after `enable` is on the roster and receives DMs (managed or not): doctor said every
    managed profile names a model and nothing blocks DMs, while each DM to it failed."""
    root = make_root(tmp_path, {"alice": {}}, config={"model": {"default": "the-root-model"}})
    (root / "profiles" / "alice" / "config.yaml").write_text(yaml.safe_dump({"model": "m"}), encoding="utf-8")
    write_profile(root / "profiles" / "carol", managed=False)
    check = {c.name: c for c in run_doctor(root, cli=str(tmp_path / "missing"), ping=lambda r: None)}["models"]
    assert check.level == WARN and "carol" in check.detail and "alice" not in check.detail, check


def test_doctor_does_not_ask_for_the_hermes_cli_when_the_running_host_uses_another_runner(
    tmp_path: Path, gateways: list[Gateway]
) -> None:
    """Regression: with `serve --runner demo` serving and DMs flowing, doctor blocked on the missing hermes CLI."""
    root = make_root(tmp_path)
    start_gateway(gateways, root, RecordingRunner(), serve_submit=True)
    checks = {c.name: c for c in run_doctor(root, cli=str(tmp_path / "no-hermes-here"))}
    assert checks["hermes CLI"].level == OK and "not needed by the running host" in checks["hermes CLI"].detail
    assert checks["daemon running"].level == OK
    gateways[-1].stop()
    checks = {c.name: c for c in run_doctor(root, cli=str(tmp_path / "no-hermes-here"))}
    assert checks["hermes CLI"].level == BLOCK  # no host: the next one runs on the real Hermes by default
    # a host whose turns run a Bot Mode release's CLI (`serve --runner command`) needs it as much
    start_gateway(gateways, root, CommandRunner(str(tmp_path / "no-hermes-here")), serve_submit=True)
    checks = {c.name: c for c in run_doctor(root, cli=str(tmp_path / "no-hermes-here"))}
    assert checks["hermes CLI"].level == BLOCK


@pytest.mark.parametrize("swap", ["profiles-symlink", "profiles-file", "one-profile-symlink"])
def test_doctor_and_the_log_name_a_profiles_folder_that_hides_profiles(
    tmp_path: Path, logs: LogCapture, swap: str
) -> None:
    """A ``profiles/`` swapped for a symlink or a file made the root silently have only ``default``: doctor said
    ``[ok] profiles managed: 1 profile(s): default``, ``send`` said ``Unknown sender``, nothing was logged."""
    root = make_root(tmp_path, {"alice": {}, "bob": {}})
    elsewhere = tmp_path / "elsewhere"
    bad = root / "profiles" / "bob" if swap == "one-profile-symlink" else root / "profiles"
    shutil.move(bad, elsewhere)
    if swap == "profiles-file":
        bad.write_text("x")
    else:
        bad.symlink_to(elsewhere, target_is_directory=True)
    check = {c.name: c for c in run_doctor(root, cli=str(tmp_path / "missing"), ping=lambda r: None)}[
        "profile folders"]
    what = "is not a directory" if swap == "profiles-file" else "is a symlink"
    assert check.level == WARN and str(bad) in check.detail and what in check.detail, check
    assert "real folder" in check.fix
    assert logs.matching(str(bad), what), logs.lines  # the gateway's discovery says it too, at WARNING
    discover_profiles(root)
    assert len(logs.matching(str(bad), what)) == 1  # once, not at every status poll


@pytest.mark.usefixtures("no_hermes_cli")
def test_doctor_prints_the_profile_folders_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_root(tmp_path, {"alice": {}})
    main(["doctor", "--root", str(root)])
    assert (f"[ok   ] profile folders: no symlinked, unreadable, unreachable or other user's profile folder "
            f"under {root}") in capsys.readouterr().out
    (root / "profiles").rename(tmp_path / "moved")
    (root / "profiles").symlink_to(tmp_path / "moved", target_is_directory=True)
    main(["doctor", "--root", str(root)])
    assert f"[warn ] profile folders: {root / 'profiles'} is a symlink" in capsys.readouterr().out


def test_enable_on_a_root_reached_through_a_symlink_edits_its_real_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: with ``~/.hermes -> /data/hermes`` enable refused: "its directory … is a symlink"."""
    root = make_root(tmp_path, {"bob": {}}, managed=False)
    link = tmp_path / "link"
    link.symlink_to(root, target_is_directory=True)
    assert main(["enable", "--root", str(link)]) == 0, capsys.readouterr().err
    config = yaml.safe_load((root / "config.yaml").read_text(encoding="utf-8"))
    assert "hermes-actors" in config["plugins"]["enabled"]
    assert link.is_symlink() and (link / "config.yaml").samefile(root / "config.yaml")
    assert [p.profile for p in discover_profiles(root) if p.managed] == ["default", "bob"]


def test_a_root_given_as_a_relative_path_works_like_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: ``--root .`` failed at start: "bot_relay is not inside ." (the root was never made absolute)."""
    root = make_root(tmp_path)
    monkeypatch.chdir(root / "profiles")
    with Gateway("..", runner=RecordingRunner()) as gw:
        assert gw.root == root and gw.root.is_absolute()
        assert gw.wait_outcome(send_dm(gw, "relative"), timeout=10)["status"] == "replied"
    monkeypatch.chdir(root)
    assert main(["send", "--root", ".", "--from", "alice", "bob", "hi", "--runner", "demo", "--wait", "10"]) == 0
    assert "Reply from @bob" in capsys.readouterr().out


def test_enable_gateway_with_a_port_moves_the_api_server_an_earlier_enable_configured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: after ``enable --gateway`` (port 8642), ``enable --gateway --port N`` said "nothing to change"
    and left 8642, though the docs say --port names the port; ``disable`` then left the block behind."""
    root = make_root(tmp_path, managed=False)
    assert main(["enable", "--root", str(root), "--gateway"]) == 0
    api = yaml.safe_load((root / "config.yaml").read_text(encoding="utf-8"))["platforms"]["api_server"]
    assert api["extra"]["port"] == 8642
    assert main(["enable", "--root", str(root), "--gateway", "--port", "60129"]) == 0
    assert "platforms.api_server.extra.port = 60129" in capsys.readouterr().out
    api = yaml.safe_load((root / "config.yaml").read_text(encoding="utf-8"))["platforms"]["api_server"]
    assert api["extra"] == {"host": "127.0.0.1", "port": 60129}
    assert main(["enable", "--root", str(root), "--gateway"]) == 0  # no --port: the port set stays
    assert yaml.safe_load((root / "config.yaml").read_text(encoding="utf-8"))["platforms"]["api_server"] == api
    capsys.readouterr()
    assert main(["disable", "--root", str(root)]) == 0
    assert f"HERMES_HOME={root} hermes gateway run --replace" in capsys.readouterr().out  # the gateway read it at start
    config = yaml.safe_load((root / "config.yaml").read_text(encoding="utf-8")) or {}
    assert "api_server" not in (config.get("platforms") or {}), config


@pytest.mark.parametrize(("port", "says"), [
    ("-1", "--port -1: the port -1 is out of range (1-65535)"),
    ("70000", "--port 70000: the port 70000 is out of range (1-65535)"),
    ("99999", "--port 99999: the port 99999 is out of range (1-65535)"),
    ("0", "--port 0 names no port: the API server would take any free one"),
])
def test_enable_gateway_refuses_a_port_hermes_clients_could_not_reach(
    port: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: ``--port=-1`` (0, 70000, 99999) exited 0 and wrote the port into config.yaml, where doctor then
    said only that the API server does not answer."""
    root = make_root(tmp_path, managed=False)
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert main(["enable", "--root", str(root), "--gateway", f"--port={port}"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: {says}"), captured.err
    assert captured.out == ""
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before  # nothing was touched


def test_enable_refuses_a_port_without_gateway(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression: ``enable --port 9000`` without ``--gateway`` exited 0 and ignored the port."""
    root = make_root(tmp_path, managed=False)
    assert main(["enable", "--root", str(root), "--port", "9000"]) == 2
    assert capsys.readouterr().err.startswith("error: --port 9000 needs --gateway")
    assert not (root / "bot_relay").exists()  # no record: nothing was enabled


def test_each_key_enable_changed_is_named_once_by_enable_and_by_disable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: after the port was set twice, ``disable`` printed ``...extra.port restored`` twice."""
    root = make_root(tmp_path, managed=False)
    assert main(["enable", "--root", str(root), "--gateway", "--port", "9000"]) == 0
    out = capsys.readouterr().out
    assert out.count("platforms.api_server") == 1 and "'port': 9000" in out, out  # the new block, with its port
    for port in ("9001", "9002"):
        assert main(["enable", "--root", str(root), "--gateway", "--port", port]) == 0
    capsys.readouterr()
    assert main(["disable", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.count("platforms.api_server.extra.port restored") == 1, out
    assert "platforms.api_server restored" in out
    config = yaml.safe_load((root / "config.yaml").read_text(encoding="utf-8")) or {}
    assert "api_server" not in (config.get("platforms") or {}), config


@pytest.mark.parametrize(("error", "level", "says"), [
    (None, OK, "answers"),
    ("AuthenticationError: invalid username-password pair", BLOCK, "refused our credentials"),
    ("ConnectionError: Error 1 connecting to 127.0.0.1:6390. [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify "
     "failed: self-signed certificate (_ssl.c:1006).", BLOCK, "TLS certificate did not verify"),  # not "unreachable"
    ("ConnectionError: Error 111 connecting to 127.0.0.1:6390. Connection refused.", BLOCK, "is unreachable"),
])
def test_redis_check_names_what_is_wrong(error: str | None, level: str, says: str) -> None:
    from hermes_actors.ops.doctor_checks import check_redis

    check = check_redis("rediss://127.0.0.1:6390/0", error)
    assert check.level == level and says in check.detail, check
    if "CERTIFICATE" in (error or ""):
        assert "ssl_ca_certs=/path/to/ca.pem" in check.fix
        named = check_redis("rediss://127.0.0.1:6390/0?ssl_ca_certs=/etc/ca.pem", error)
        assert "did not sign it, or the certificate is not for this host name" in named.fix, named


def test_disable_while_a_host_serves_the_root_says_to_stop_it(
    tmp_path: Path, gateways: list[Gateway], capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (acceptance review): `disable` under a running `serve` changed everything silently, then the host
    refused every DM ("This install is not Bot-Mode-managed"). It now names the host's pid and says to stop it."""
    root = make_root(tmp_path, managed=False)
    assert main(["enable", "--root", str(root)]) == 0
    start_gateway(gateways, root, serve_submit=True)  # holds submit.lock, as serve does
    capsys.readouterr()
    assert main(["disable", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    todo = [line for line in out.splitlines() if line.startswith("  to do: ")]
    assert todo[0] == (f"  to do: stop the host that still serves {root} (pid {os.getpid()}: `hermes-actors serve`, "
                       "or `hermes gateway run` hosting the actors): until it stops it refuses every DM (\"This "
                       "install is not Bot-Mode-managed\")"), out
    assert not any(p.managed for p in discover_profiles(root))  # undone all the same

    gateways.pop().stop(timeout=5)
    assert main(["enable", "--root", str(root)]) == 0
    assert main(["disable", "--root", str(root)]) == 0
    assert "stop the host" not in capsys.readouterr().out  # no host: no such line


def test_disable_while_the_hermes_gateway_hosts_the_actors_says_one_thing_to_do_with_it(
    tmp_path: Path, gateways: list[Gateway], capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (journey review): with the hermes gateway hosting the actors, `disable` said both `stop the host
    that still serves … (pid …)` and `restart the hermes gateway if one runs, so it stops hosting the actors: …
    --replace`, two instructions for one process. It says one: restart that gateway (it goes on serving the rest)."""
    root = make_root(tmp_path, managed=False)
    assert main(["enable", "--root", str(root), "--gateway"]) == 0
    start_gateway(gateways, root, serve_submit=True)  # holds submit.lock, as the hosting gateway does
    (root / "gateway.pid").write_text(json.dumps({"pid": os.getpid()}), encoding="utf-8")  # and it is that gateway
    capsys.readouterr()
    assert main(["disable", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    todo = [line for line in out.splitlines() if line.startswith("  to do: ")]
    assert todo[0] == (f"  to do: restart the hermes gateway that hosts the actors of {root} (pid {os.getpid()}), so "
                       "it stops hosting them (until then it refuses every DM (\"This install is not "
                       f"Bot-Mode-managed\")): HERMES_HOME={root} hermes gateway run --replace"), out
    assert sum("hermes gateway run --replace" in line for line in todo) == 1, out
    assert "stop the host" not in out, out


def test_disable_names_what_it_leaves_for_the_user_to_remove(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (acceptance review): the report named only the kept Bot Chat sessions, not the rooms' Group
    sessions, the profile.yaml files enable created (now `{}`) or bot_relay/, which docs/hermes.md lists as the
    user's to remove."""
    root = make_root(tmp_path, managed=False)
    created = root / "profiles" / "alice" / "profile.yaml"
    created.unlink()  # enable creates it for its managed flag
    assert main(["enable", "--root", str(root)]) == 0
    assert created.exists()
    capsys.readouterr()
    assert main(["disable", "--root", str(root), "--profiles", "alice"]) == 0
    out = capsys.readouterr().out
    assert "  to do: the 'Bot Chat' sessions, and the rooms' 'Group: <name>' ones, were kept" in out, out
    assert f"  to do: {created} is now {{}} (enable created it): remove it if you want" in out, out
    assert "bot_relay" not in out  # the rest of the record is still there: not yet the user's
    assert main(["disable", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"  to do: {root / 'bot_relay'} was kept (the journal, relay directories, turn locks, quarantine): " \
           "remove it if you want, once no host runs" in out, out
    assert f"{created} is now" not in out  # said once, by the disable that emptied it


def test_disable_says_enable_created_only_the_files_it_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (diff review): a profile's config.yaml the user had (holding only `# my settings`) was, after
    enable and disable, said to be `is now {} (enable created it): remove it if you want`, beside the line naming
    the `.before-hermes-actors` copy enable made of it. The enable record now says which files enable created; only
    those are said to be enable's, a file the user had never is."""
    root = make_root(tmp_path, managed=False)
    mine = root / "profiles" / "alice" / "config.yaml"
    mine.write_text("# my settings\n", encoding="utf-8")
    created = root / "profiles" / "bob" / "config.yaml"
    assert not created.exists()
    assert main(["enable", "--root", str(root)]) == 0
    assert created.exists()
    capsys.readouterr()
    assert main(["disable", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert f"  to do: {created} is now {{}} (enable created it): remove it if you want\n" in out, out
    assert f"  to do: {mine}.before-hermes-actors was kept" in out, out
    assert f"{mine} is now" not in out, out


def test_disable_names_the_config_yamls_enable_created_its_copies_and_the_api_key_left_to_the_user(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (journey review): after `disable`, a profile's config.yaml that enable created was left as `{}`
    unmentioned (only profile.yaml files were named), and so were the `config.yaml.before-hermes-actors` copy and the
    API_SERVER_KEY in the root's .env, with which hermes still starts its API server once the gateway restarts:
    docs/hermes.md says the "to do" lines name what uninstall step 3 leaves to the user."""
    root = make_root(tmp_path, managed=False, config={"model": {"default": "m", "provider": "custom"}})
    config = root / "config.yaml"
    config.write_text("# my settings\n" + config.read_text(encoding="utf-8"), encoding="utf-8")  # enable keeps a copy
    (root / ".env").write_text("API_SERVER_KEY=" + "k" * 32 + "\n", encoding="utf-8")
    (root / ".env").chmod(0o600)
    assert main(["enable", "--root", str(root), "--gateway"]) == 0
    capsys.readouterr()
    assert main(["disable", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    created = root / "profiles" / "alice" / "config.yaml"  # enable created it for plugins.enabled
    assert f"  to do: {created} is now {{}} (enable created it): remove it if you want\n" in out, out
    assert f"  to do: {config}.before-hermes-actors was kept (the copy enable made of {config} before rewriting it " \
           "without its comments): take back what you want from it, then remove it\n" in out, out
    assert f"  to do: API_SERVER_KEY is still set in {root / '.env'}: the hermes gateway still starts its API server " \
           "(127.0.0.1:8642) with it at its next start; remove it if you set it for warm turns only\n" in out, out
    assert f"{config} is now" not in out  # it holds the user's model


def test_disable_of_every_profile_that_undoes_the_whole_record_names_bot_relay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (docs review docrev): docs/hermes.md says the `bot_relay/` "to do" comes once the whole record is
    undone, but only a `disable` without --profiles said it: `--profiles` naming every profile of an install
    enabled without --gateway undid the whole record and left bot_relay/ unmentioned (no later disable says it
    either: there is nothing left to undo). It is said whenever nothing of the record is left."""
    root = make_root(tmp_path, managed=False)
    assert main(["enable", "--root", str(root)]) == 0
    capsys.readouterr()
    every = ",".join(p.profile for p in discover_profiles(root))
    assert main(["disable", "--root", str(root), "--profiles", every]) == 0
    out = capsys.readouterr().out
    assert f"  to do: {root / 'bot_relay'} was kept (the journal, relay directories, turn locks, quarantine): " \
           "remove it if you want, once no host runs" in out, out


def test_disable_of_some_profiles_while_a_host_serves_says_what_stays_served(
    tmp_path: Path, gateways: list[Gateway], capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (review diffrev12 of 29882e1): `disable --profiles alice` under a running host said to stop it,
    as it "refuses every DM", while it went on serving alice and bob: one managed profile keeps the install Bot
    Mode, where every profile is a teammate. It now says so; once none is managed, the stop line, and the host
    (no restart) refuses every DM."""
    root = make_root(tmp_path, managed=False)
    assert main(["enable", "--root", str(root)]) == 0
    gw = start_gateway(gateways, root, serve_submit=True, config={"bot_mode": {"rescan_seconds": 0.05}})
    capsys.readouterr()
    assert main(["disable", "--root", str(root), "--profiles", "alice"]) == 0
    out = capsys.readouterr().out
    todo = [line for line in out.splitlines() if line.startswith("  to do: ")]
    assert todo[0] == (f"  to do: alice: no longer managed, so no message_agent tool (cannot send DMs), but still on "
                       f"the roster and receiving DMs (the host serving {root} (pid {os.getpid()}) keeps serving it, "
                       "no restart needed): default, bob, carol, still managed, keep the root a Bot Mode install, "
                       f"where every profile is a teammate. To refuse every DM, disable the rest too: hermes-actors "
                       f"disable --root {root}"), out
    assert "stop the host" not in out and "refuses every DM" not in out
    assert gw.wait_outcome(send_dm(gw, "still there?", target="alice", sender="bob"), timeout=10)["status"] == "replied"

    assert main(["disable", "--root", str(root), "--profiles", "default,bob,carol"]) == 0
    out = capsys.readouterr().out
    assert f"  to do: stop the host that still serves {root} (pid {os.getpid()}:" in out, out  # true now

    def refused() -> bool:
        ack = gw.message_agent(sender="bob", target="alice", message="hi")
        return "This install is not Bot-Mode-managed" in str(ack.get("error", ""))

    await_condition(refused, timeout=10, interval=0.05, message="the host refusing DMs once no profile is managed")


def test_doctor_fixes_and_setup_reports_quote_a_root_with_a_space(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (review diffrev12): the commands doctor's fixes and enable/disable's "to do" lines name were built
    unquoted, so a root with a space gave commands the shell splits (and `HERMES_HOME=/x y hermes` runs `y`)."""
    from hermes_actors.ops.doctor_checks import check_daemon, check_managed, check_plugin, check_warm_turns

    spaced = Path("/srv/my hermes")
    quoted = "'/srv/my hermes'"
    unmanaged = [ProfileInfo("default", "hermes", spaced, "default"), ProfileInfo("bob", "bob", spaced, "bob")]
    fixes = [check_managed(spaced, unmanaged).fix, check_plugin(spaced, {}).fix,
             check_plugin(spaced, {"default": True, "bob": False}).fix, check_daemon(spaced, None).fix,
             check_warm_turns(spaced, "127.0.0.1:8642", False, True).fix,
             check_warm_turns(spaced, None, False, False).detail]
    assert fixes == [f"hermes-actors enable --root {quoted}", f"hermes-actors enable --root {quoted}",
                     f"hermes-actors enable --root {quoted} --profiles bob",
                     f"hermes-actors serve --root {quoted}   (or: HERMES_HOME={quoted} hermes gateway run, after "
                     f"hermes-actors enable --root {quoted} --gateway)",
                     f"set API_SERVER_KEY in {spaced / '.env'}, then restart: HERMES_HOME={quoted} hermes gateway run",
                     f"not configured: turns run with the hermes CLI (for warm turns: hermes-actors enable --root "
                     f"{quoted} --gateway)"], fixes

    root = make_root(tmp_path, managed=False, name="my hermes")
    assert main(["enable", "--root", str(root)]) == 0
    assert f"  to do: start the actors: hermes-actors serve --root '{root}'" in capsys.readouterr().out
    assert main(["enable", "--root", str(root), "--gateway"]) == 0
    assert f"  to do: start the gateway: HERMES_HOME='{root}' hermes gateway run" in capsys.readouterr().out
    assert main(["disable", "--root", str(root), "--profiles", "alice"]) == 0
    out = capsys.readouterr().out
    assert f"To refuse every DM, disable the rest too: hermes-actors disable --root '{root}'\n" in out, out
    assert main(["disable", "--root", str(root)]) == 0
    assert f"  to do: restart the hermes gateway if one runs, so it stops hosting the actors: HERMES_HOME='{root}' " \
           "hermes gateway run --replace" in capsys.readouterr().out


@pytest.mark.parametrize(("running", "changed", "line"), [
    (None, True, "start the gateway: HERMES_HOME='/srv/my hermes' hermes gateway run"),
    (None, False, "start the gateway: HERMES_HOME='/srv/my hermes' hermes gateway run"),
    (4242, True, "restart the hermes gateway that runs (pid 4242; it read config.yaml at its start, and a second "
                 "`hermes gateway run` would exit: \"Another gateway instance is already running\"): "
                 "HERMES_HOME='/srv/my hermes' hermes gateway run --replace"),
    (4242, False, None),  # it has nothing new to read: a restart would only end a warm turn in progress
], ids=["none-runs", "none-runs-nothing-changed", "one-runs", "one-runs-nothing-changed"])
def test_gateway_todo_restarts_a_running_gateway_with_replace(running: int | None, changed: bool,
                                                              line: str | None) -> None:
    from hermes_actors.hermes.setup import gateway_todo

    assert gateway_todo(Path("/srv/my hermes"), running, config_changed=changed) == line


def test_enable_gateway_beside_a_running_gateway_names_the_replace_form(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (acceptance on hermes 0.19): with `hermes gateway run` already running (hosting off), `enable
    --gateway` said `to do: start the gateway: HERMES_HOME=… hermes gateway run`; run as printed, hermes said
    "Another gateway instance is already running" and exited 1."""
    root = make_root(tmp_path, managed=False)
    (root / "gateway.pid").write_text(json.dumps({"pid": os.getpid()}), encoding="utf-8")  # hermes 0.19's pid file
    assert main(["enable", "--root", str(root), "--gateway"]) == 0
    out = capsys.readouterr().out
    assert f"  to do: restart the hermes gateway that runs (pid {os.getpid()}; " in out, out
    assert out.rstrip().endswith(f"HERMES_HOME={root} hermes gateway run --replace"), out
    assert "start the gateway:" not in out


@contextlib.contextmanager
def _gateway_started_after_the_configs(root: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A stand-in hermes gateway (named by hermes 0.19's ``gateway.pid``) started after every ``config.yaml`` of the
    root was last written (their mtimes set an hour back): it read them all. Killed on the way out."""
    an_hour_ago = time.time() - 3600
    for config in [root / "config.yaml", *(root / "profiles").glob("*/config.yaml")]:
        os.utime(config, (an_hour_ago, an_hour_ago))
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE) as gateway:
        try:
            (root / "gateway.pid").write_text(json.dumps({"pid": gateway.pid}), encoding="utf-8")
            yield gateway
        finally:
            gateway.kill()


def test_enable_gateway_again_beside_a_running_gateway_says_no_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: run again with nothing to change, `enable --gateway` said `nothing to change` and then to restart
    the running gateway with --replace, which serves no purpose and ends a warm turn in progress `ambiguous`. But
    (diffrev35) a gateway started before a config.yaml was last written (an earlier run's advice not followed yet,
    an edit by hand) still runs the old settings: its restart is still advised."""
    root = make_root(tmp_path, managed=False)
    pid_file = root / "gateway.pid"  # hermes 0.19's pid file
    pid_file.write_text(json.dumps({"pid": os.getpid()}), encoding="utf-8")
    assert main(["enable", "--root", str(root), "--gateway"]) == 0
    assert "  to do: restart the hermes gateway that runs" in capsys.readouterr().out
    an_hour_ago = time.time() - 3600
    with _gateway_started_after_the_configs(root) as gateway:  # restarted since: it read them
        assert main(["enable", "--root", str(root), "--gateway"]) == 0
        out = capsys.readouterr().out
        assert "  nothing to change\n" in out, out
        assert "restart the hermes gateway" not in out and "--replace" not in out, out
        profile = root / "profiles" / "alice" / "profile.yaml"  # read by the host at its rescan: still no restart
        profile.write_text(yaml.safe_dump({k: v for k, v in yaml.safe_load(profile.read_text()).items()
                                           if k != "ui_meta"}), encoding="utf-8")
        assert main(["enable", "--root", str(root), "--gateway"]) == 0
        out = capsys.readouterr().out
        assert f"  changed: {profile}: ui_meta.hermes-bots = {{}}" in out, out
        assert "restart the hermes gateway" not in out, out
        os.utime(root / "config.yaml")  # config.yaml written after the gateway started (by hand): it runs the old one
        assert main(["enable", "--root", str(root), "--gateway"]) == 0
        out = capsys.readouterr().out
        assert "  nothing to change\n" in out, out
        assert f"  to do: restart the hermes gateway that runs (pid {gateway.pid}; " in out, out
        config = yaml.safe_load((root / "config.yaml").read_text())
        config["platforms"]["api_server"]["enabled"] = False  # config.yaml changed: the gateway must restart
        (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        os.utime(root / "config.yaml", (an_hour_ago, an_hour_ago))  # this run's write alone says so
        assert main(["enable", "--root", str(root), "--gateway"]) == 0
        assert f"  to do: restart the hermes gateway that runs (pid {gateway.pid}; " in capsys.readouterr().out


def test_enable_gateway_asks_no_restart_for_a_profiles_own_config_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (journey review): `enable --gateway` said `nothing to change`, then to restart the running hermes
    gateway, because a profile's config.yaml (its model, set by hand) was newer than the gateway's start. hermes reads
    a profile's own config.yaml per turn (and, multiplexing, loads the root's plugins for every profile): only the
    root's config.yaml, read at the gateway's start, calls for a restart, which ends a warm turn `ambiguous`."""
    root = make_root(tmp_path, managed=False)
    assert main(["enable", "--root", str(root), "--gateway"]) == 0
    capsys.readouterr()
    with _gateway_started_after_the_configs(root):
        carol = root / "profiles" / "carol" / "config.yaml"
        config = yaml.safe_load(carol.read_text(encoding="utf-8")) or {}
        carol.write_text(yaml.safe_dump({**config, "model": {"provider": "custom", "default": "m2"}}), encoding="utf-8")
        assert main(["enable", "--root", str(root), "--gateway"]) == 0
        out = capsys.readouterr().out
        assert "  nothing to change\n" in out, out
        assert "restart the hermes gateway" not in out and "--replace" not in out, out
        alice = root / "profiles" / "alice" / "config.yaml"  # enable writes a profile's plugins.enabled: no restart
        config = yaml.safe_load(alice.read_text(encoding="utf-8"))
        alice.write_text(yaml.safe_dump({**config, "plugins": {"enabled": []}}), encoding="utf-8")
        assert main(["enable", "--root", str(root), "--gateway"]) == 0
        out = capsys.readouterr().out
        assert f"  changed: {alice}: " in out, out
        assert "restart the hermes gateway" not in out and "--replace" not in out, out


@pytest.mark.parametrize(("current", "written", "ours"), [
    ({"enabled": True, "extra": {"host_actors": True}}, {"enabled": True, "extra": {"host_actors": True}}, True),
    ({"enabled": False, "extra": {"host_actors": True}}, {"enabled": True, "extra": {"host_actors": True}}, True),
    ({"extra": {"host_actors": True}}, {"enabled": True, "extra": {"host_actors": True}}, True),
    ({"enabled": False, "extra": {"host_actors": True, "root": "/x"}},
     {"enabled": True, "extra": {"host_actors": True}}, False),
    ({"enabled": True, "extra": {"host_actors": False}}, {"enabled": True, "extra": {"host_actors": True}}, False),
    ({"enabled": True}, {"enabled": True, "extra": {"host_actors": True}}, False),
    ({"extra": {"host_actors": True}, "enabled": True, "token": "t"}, {"enabled": True, "extra": {"host_actors": True}},
     False),
    (False, True, False),  # a switch enable set itself (the user's block): the user's value now
    ({"a": 2}, {"a": 1}, False),  # no switch in what enable wrote: every change is the user's
    ("x", {"enabled": True}, False),
], ids=["same", "switched-off", "switch-removed", "root-added", "host-off", "extra-removed", "key-added", "scalar",
        "no-switch", "not-a-block"])
def test_still_as_written_lets_only_the_enabled_switch_differ(current: Any, written: Any, ours: bool) -> None:
    from hermes_actors.hermes.recorded_edits import still_as_written

    assert still_as_written(current, written) is ours


def _set_hosting(root: Path, block: dict[str, Any]) -> None:
    config = yaml.safe_load((root / "config.yaml").read_text(encoding="utf-8")) or {}
    config.setdefault("platforms", {})["hermes_actors"] = block
    (root / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")


def _hosting(root: Path) -> Any:
    return (yaml.safe_load((root / "config.yaml").read_text(encoding="utf-8")).get("platforms") or {}).get(
        "hermes_actors")


def test_disable_removes_the_block_enable_wrote_whose_switch_was_turned_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (acceptance on hermes 0.19): after the serve + warm turns recipe of docs/hermes.md (the user sets
    platforms.hermes_actors.enabled: false by hand), disable left `{enabled: false, extra: {host_actors: true}}`,
    saying "changed since enable; left as it is"."""
    root = make_root(tmp_path, managed=False)
    assert main(["enable", "--root", str(root), "--gateway"]) == 0
    _set_hosting(root, {"enabled": False, "extra": {"host_actors": True}})
    capsys.readouterr()
    assert main(["disable", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert _hosting(root) is None, out
    assert "changed since enable" not in out and f"{root / 'config.yaml'}: platforms.hermes_actors restored" in out


def test_disable_leaves_a_block_the_user_really_changed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_root(tmp_path, managed=False)
    assert main(["enable", "--root", str(root), "--gateway"]) == 0
    changed = {"enabled": False, "extra": {"host_actors": True, "root": str(root)}}
    _set_hosting(root, changed)
    capsys.readouterr()
    assert main(["disable", "--root", str(root)]) == 0
    assert _hosting(root) == changed
    assert "platforms.hermes_actors changed since enable; left as it is" in capsys.readouterr().out


def test_disable_puts_the_false_of_the_users_own_block_back(tmp_path: Path) -> None:
    own = {"enabled": False, "extra": {"host_actors": True}}
    root = make_root(tmp_path, managed=False, config={"platforms": {"hermes_actors": own}})
    assert main(["enable", "--root", str(root), "--gateway"]) == 0
    assert _hosting(root) == {"enabled": True, "extra": {"host_actors": True}}  # enable --gateway asks to host
    assert main(["disable", "--root", str(root)]) == 0
    assert _hosting(root) == own


@pytest.mark.usefixtures("no_hermes_cli")
def test_doctor_says_why_the_gateway_starts_no_api_server_when_its_variables_are_in_the_environment_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: hermes 0.19, multiplexing profiles, reads API_SERVER_ENABLED / API_SERVER_KEY from the root's
    .env only; doctor read the environment too and said the server "does not answer", with a fix that started
    the gateway again. It now says hermes starts none, and why."""
    monkeypatch.setenv("API_SERVER_KEY", "k" * 32)
    monkeypatch.setenv("API_SERVER_ENABLED", "true")
    root = make_root(tmp_path, config={"gateway": {"multiplex_profiles": True}})
    main(["doctor", "--root", str(root), "--json"])
    check = {c["name"]: c for c in _json(capsys)["checks"]}["warm turns"]  # type: ignore[union-attr]
    assert check["level"] == WARN, check
    assert check["detail"].startswith(
        "the hermes gateway starts no API server: API_SERVER_ENABLED and API_SERVER_KEY are set in the environment "
        "but not in the root's .env"), check
    assert str(root / ".env") in check["fix"], check
