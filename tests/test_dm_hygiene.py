"""DM query-file hygiene: a hostile DM directory is refused; files live exactly as long as their delivery."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from roots import make_root, write_fake_cli

from hermes_actors import Gateway
from hermes_actors.local import dm_files as dmfiles
from hermes_actors.local.runners import CommandRunner

KEY = "0123456789abcdef0123456789abcdef"


def _dir(base: Path) -> Path:
    return base / f"hermes-dm-{os.getuid()}"


# ── the directory ───────────────────────────────────────────────────────────


def test_a_symlinked_dm_dir_is_refused_and_nothing_is_written_through_it(tmp_path: Path) -> None:
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir(mode=0o700)
    base = tmp_path / "tmp"
    base.mkdir()
    _dir(base).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(PermissionError, match="symlink"):
        dmfiles.dm_dir(base)
    with pytest.raises(PermissionError, match="symlink"):
        dmfiles.write_dm_file(KEY, "secret text", base=base)
    assert list(elsewhere.iterdir()) == []
    assert _dir(base).is_symlink(), "the refused path is left as it was"


def test_a_dm_dir_of_another_owner_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown a directory to another uid")
    path = _dir(tmp_path)
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)
    with pytest.raises(PermissionError, match=r"owned by uid 65534"):
        dmfiles.dm_dir(tmp_path)
    with pytest.raises(PermissionError, match=r"owned by uid 65534"):
        dmfiles.write_dm_file(KEY, "secret text", base=tmp_path)
    assert list(path.iterdir()) == []
    assert path.stat().st_uid == 65534, "refused, not repaired"


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o707, 0o500])
def test_a_dm_dir_with_the_wrong_mode_is_refused(tmp_path: Path, mode: int) -> None:
    path = _dir(tmp_path)
    path.mkdir()
    path.chmod(mode)
    with pytest.raises(PermissionError, match=f"mode {mode:04o}, expected 0700"):
        dmfiles.dm_dir(tmp_path)
    with pytest.raises(PermissionError):
        dmfiles.write_dm_file(KEY, "secret text", base=tmp_path)
    path.chmod(0o700)
    assert list(path.iterdir()) == []
    path.chmod(mode)
    assert stat.S_IMODE(path.stat().st_mode) == mode, "refused, not repaired"


def test_a_dm_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    _dir(tmp_path).write_text("not a dir")
    with pytest.raises(PermissionError, match="not a directory"):
        dmfiles.dm_dir(tmp_path)


# ── a fake hermes CLI ───────────────────────────────────────────────────────

FAKE_HERMES = r"""#!{python}
import json, os, stat, sys
args = sys.argv[1:]
path = args[args.index("--query-file") + 1]
info, dinfo = os.lstat(path), os.lstat(os.path.dirname(path))
entry = {{
    "path": path,
    "mode": oct(stat.S_IMODE(info.st_mode)),
    "dir_mode": oct(stat.S_IMODE(dinfo.st_mode)),
    "regular": stat.S_ISREG(info.st_mode),
    "resume": os.environ.get("HERMES_RESUME_UNANSWERED_TURN", ""),
    "body": open(path, encoding="utf-8").read(),
}}
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(entry) + "\n")
if stat.S_IMODE(info.st_mode) != 0o600 or stat.S_IMODE(dinfo.st_mode) != 0o700 or not stat.S_ISREG(info.st_mode):
    print("bad query file permissions", file=sys.stderr)
    sys.exit(3)
mode = os.environ.get("FAKE_MODE", "ok")
if mode == "fail-first" and not entry["resume"]:
    print("Error: 503 Service Unavailable", file=sys.stderr)
    sys.exit(1)
if mode == "auth":
    print("Error: 401 Unauthorized", file=sys.stderr)
    sys.exit(1)
if mode == "always-503":
    print("Error: 503 Service Unavailable", file=sys.stderr)
    sys.exit(1)
print("reply: " + entry["body"].split("): ", 1)[-1])
"""


@pytest.fixture
def fake_cli(tmp_path: Path) -> Path:
    return write_fake_cli(tmp_path, FAKE_HERMES.format(python=sys.executable))


def _log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _run_one(tmp_path: Path, fake_cli: Path, mode: str) -> tuple[dict[str, Any], list[dict[str, Any]], Path]:
    root = make_root(tmp_path)
    base = tmp_path / "tmpbase"
    base.mkdir()
    log = tmp_path / "fake.log"
    runner = CommandRunner(cli=str(fake_cli), timeout=30, dm_base=base, env={"FAKE_LOG": str(log), "FAKE_MODE": mode})
    with Gateway(root, runner=runner) as gw:
        ack = gw.message_agent(sender="alice", target="bob", message="the secret plan")
        out = gw.wait_outcome(ack["delivery_id"], timeout=30)
        # Settled: the query file is gone already (removed before the outcome was published).
        assert list(_dir(base).iterdir()) == [], f"left behind: {list(_dir(base).iterdir())}"
        assert runner.kept() == []
    assert out["delivery_id"] == ack["delivery_id"]
    entries = _log(log)
    for entry in entries:
        assert entry["mode"] == "0o600" and entry["dir_mode"] == "0o700" and entry["regular"], entry
        assert entry["path"] == str(_dir(base) / f"dm-{ack['delivery_id']}.txt")
        assert entry["body"].endswith("the secret plan")
    return out, entries, base


def test_the_dm_file_exists_private_during_the_turn_and_goes_after_it(tmp_path: Path, fake_cli: Path) -> None:
    out, entries, _ = _run_one(tmp_path, fake_cli, "ok")
    assert out["status"] == "replied" and out["reply"] == "reply: the secret plan"
    assert len(entries) == 1 and entries[0]["resume"] == ""


def test_the_policy_retry_replays_the_same_file_then_it_is_removed(tmp_path: Path, fake_cli: Path) -> None:
    out, entries, _ = _run_one(tmp_path, fake_cli, "fail-first")
    assert out["status"] == "replied" and out["reply"] == "reply: the secret plan"
    assert [e["resume"] for e in entries] == ["", "1"], "attempt 2 resumes the same session"
    assert entries[0]["path"] == entries[1]["path"], "both attempts read the very same query file"


def test_a_retry_that_fails_again_still_removes_the_file(tmp_path: Path, fake_cli: Path) -> None:
    out, entries, _ = _run_one(tmp_path, fake_cli, "always-503")
    assert out["status"] == "failed" and out["reason"] == "provider_server_error"
    assert len(entries) == 2 and entries[0]["path"] == entries[1]["path"]


def test_a_failure_that_is_not_retried_removes_the_file(tmp_path: Path, fake_cli: Path) -> None:
    out, entries, _ = _run_one(tmp_path, fake_cli, "auth")
    assert out["status"] == "failed" and out["reason"] == "provider_auth_or_access"
    assert len(entries) == 1


def test_a_refused_dm_dir_fails_the_delivery_and_writes_nothing(tmp_path: Path, fake_cli: Path) -> None:
    root = make_root(tmp_path)
    base = tmp_path / "tmpbase"
    base.mkdir()
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir(mode=0o700)
    _dir(base).symlink_to(elsewhere, target_is_directory=True)
    log = tmp_path / "fake.log"
    runner = CommandRunner(cli=str(fake_cli), timeout=30, dm_base=base, env={"FAKE_LOG": str(log)})
    with Gateway(root, runner=runner) as gw:
        ack = gw.message_agent(sender="alice", target="bob", message="the secret plan")
        out = gw.wait_outcome(ack["delivery_id"], timeout=30)
    assert out["status"] == "failed"
    assert "refusing DM directory" in out["error"] and "symlink" in out["error"]
    assert list(elsewhere.iterdir()) == []
    assert not log.exists(), "the CLI never ran"
