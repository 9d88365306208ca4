"""``enable`` / ``disable`` write nothing when they refuse, and say what they changed when a write stops them."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from roots import make_root

from hermes_actors.cli.main import main
from hermes_actors.store.hermes_root import discover_profiles


def _tree(root: Path) -> dict[str, object]:
    """Every entry under ``root``: a directory, a symlink's target, or a file's bytes (its mode too)."""
    seen: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            seen[name] = ("symlink", os.readlink(path))
        elif path.is_dir():
            seen[name] = ("directory", path.stat().st_mode)
        else:
            seen[name] = (path.read_bytes(), path.stat().st_mode)
    return seen


def _symlink_to_alices(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.parent.parent / "alice" / "profile.yaml")


BAD_PROFILE_YAML: list[tuple[str, Callable[[Path], Any], str]] = [
    ("malformed", lambda p: p.write_text("a: [\n", encoding="utf-8"), "is not valid YAML"),
    ("a list", lambda p: p.write_text("- a\n", encoding="utf-8"),
     "does not hold a mapping at the top; fix it, then run again"),
    ("a symlink", _symlink_to_alices, "is a symlink; refusing to edit it"),
    ("ui_meta no mapping", lambda p: p.write_text("ui_meta: 5\n", encoding="utf-8"),
     ": ui_meta is not a mapping; fix it, then run again"),
]


@pytest.mark.parametrize(("spoil", "says"), [b[1:] for b in BAD_PROFILE_YAML], ids=[b[0] for b in BAD_PROFILE_YAML])
def test_enable_refusing_a_profile_yaml_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spoil: Callable[[Path], Any], says: str
) -> None:
    """Regression (CLI fuzz review): with one profile's profile.yaml malformed (or a list, a symlink, a ui_meta
    that is no mapping) enable refused, exit 2 "fix it, then run again", after it had written config.yaml and
    state.db (a Bot Chat session) of the default profile and of the profiles before it, and
    bot_relay/hermes-actors-enable.json, with no "changed:" report. Every file is now read before the first
    write."""
    root = make_root(tmp_path, managed=False)  # default, alice, bob, carol: carol's is edited last
    bad = root / "profiles" / "carol" / "profile.yaml"
    spoil(bad)
    before = _tree(root)
    assert main(["enable", "--root", str(root)]) == 2
    out, err = capsys.readouterr()
    assert f"error: {bad}" in err and says in err, err
    assert "changed:" not in out
    assert _tree(root) == before


def test_disable_refusing_a_file_it_must_edit_undoes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (CLI fuzz review, the same review of disable): a profile.yaml malformed since enable refused the
    disable after it had undone the edits of the profiles before it and dropped every edit from its record, those
    of the refused file too: a later disable had nothing left to undo there."""
    root = make_root(tmp_path, managed=False)
    assert main(["enable", "--root", str(root)]) == 0
    bad = root / "profile.yaml"  # the default profile's edits are undone last (newest first)
    bad.write_text("ui_meta: {hermes-bots: {}}\nx: [\n", encoding="utf-8")
    before = _tree(root)
    capsys.readouterr()
    assert main(["disable", "--root", str(root)]) == 2
    out, err = capsys.readouterr()
    assert f"error: {bad} is not valid YAML" in err and "changed:" not in out, (out, err)
    assert _tree(root) == before  # the record included
    bad.write_text("ui_meta: {hermes-bots: {}}\n", encoding="utf-8")
    assert main(["disable", "--root", str(root)]) == 0
    assert not any(p.managed for p in discover_profiles(root))


def _replace_failing_for(monkeypatch: pytest.MonkeyPatch, failing: Path) -> None:
    """``os.replace`` onto ``failing`` fails as on a full disk (the rename that puts a rewritten YAML in place)."""
    real_replace = os.replace

    def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        if os.fspath(dst) == os.fspath(failing):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)


def _plugins(config: Path) -> object:
    return (yaml.safe_load(config.read_text(encoding="utf-8")) or {}).get("plugins") if config.exists() else None


def test_enable_stopped_by_a_failed_write_says_what_it_changed_and_disable_undoes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (CLI fuzz review): a write failing part-way (a full disk) printed the error alone: nothing said
    which files enable had changed already, nor that disable undoes them."""
    root = make_root(tmp_path, managed=False)
    yamls = {path: path.read_bytes() for path in root.rglob("profile.yaml")}
    failing = root / "profiles" / "carol" / "profile.yaml"
    _replace_failing_for(monkeypatch, failing)
    assert main(["enable", "--root", str(root)]) == 1
    out, err = capsys.readouterr()
    bob = root / "profiles" / "bob"
    assert f"  changed: {bob / 'profile.yaml'}: ui_meta.hermes-bots = {{}}" in out, out
    assert f"  changed: {bob / 'config.yaml'}: added 'hermes-actors' to plugins.enabled" in out, out
    assert str(failing.parent) not in out  # nothing of carol's changed
    assert (f"  to do: enable stopped part-way (the error below): fix it and run hermes-actors enable --root {root} "
            f"again, or undo the changes above with hermes-actors disable --root {root}") in out, out
    assert err.strip().splitlines()[-1] == (f"error: cannot write {failing}: No space left on device (ENOSPC); free "
                                            "space on its filesystem"), err
    assert failing.read_bytes() == yamls[failing] and _plugins(failing.with_name("config.yaml")) is None

    monkeypatch.undo()
    assert main(["disable", "--root", str(root)]) == 0
    assert {path: path.read_bytes() for path in yamls} == yamls
    assert all(_plugins(home / "config.yaml") is None for home in (root, bob))


def test_disable_stopped_by_a_failed_write_keeps_the_rest_for_the_next_disable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (CLI fuzz review, the same review of disable): a write failing part-way dropped every edit from
    the record, the ones not undone too, so the next disable left them (still managed, still the plugin)."""
    root = make_root(tmp_path, managed=False)
    assert main(["enable", "--root", str(root)]) == 0
    capsys.readouterr()
    alice = root / "profiles" / "alice"
    _replace_failing_for(monkeypatch, alice / "config.yaml")  # after carol's and bob's (newest first)
    assert main(["disable", "--root", str(root)]) == 1
    out, err = capsys.readouterr()
    assert f"  changed: {root / 'profiles' / 'carol' / 'profile.yaml'}: ui_meta.hermes-bots restored" in out, out
    assert (f"  to do: disable stopped part-way (the error below): fix it and run hermes-actors disable --root {root} "
            "again to undo the rest") in out, out
    assert err.strip().splitlines()[-1].startswith(f"error: cannot write {alice / 'config.yaml'}: No space left"), err
    assert {p.profile for p in discover_profiles(root) if p.managed} == {"default", "alice"}

    monkeypatch.undo()
    assert main(["disable", "--root", str(root)]) == 0
    assert not any(p.managed for p in discover_profiles(root))
    assert _plugins(alice / "config.yaml") is None and _plugins(root / "config.yaml") is None


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_enable_with_a_bot_relay_of_another_user_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (CLI fuzz review): the record's directory was found unusable only when the record was saved, after
    every profile's files and session had been written."""
    root = make_root(tmp_path, managed=False)
    (root / "bot_relay").mkdir(mode=0o700)
    os.chown(root / "bot_relay", 65534, 65534)
    before = _tree(root)
    assert main(["enable", "--root", str(root)]) == 2
    assert f"error: {root / 'bot_relay'} is owned by uid 65534, expected 0" in capsys.readouterr().err
    assert _tree(root) == before


def test_an_emptied_record_is_never_removed_through_a_bot_relay_swapped_for_a_symlink(tmp_path: Path) -> None:
    """Regression (hostile review of removals): ``save_record(root, [])`` removed the record by path, so through a
    ``bot_relay/`` swapped for a symlink it deleted the file of that name outside the root. Now it is refused like
    the record's write, and nothing outside is removed."""
    from hermes_actors.errors import HostileFileError
    from hermes_actors.hermes.recorded_edits import record_path, save_record

    root = make_root(tmp_path)
    relay = root / "bot_relay"
    relay.mkdir(mode=0o700, exist_ok=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    precious = outside / record_path(root).name
    precious.write_text("outside", encoding="utf-8")
    relay.rename(tmp_path / "bot_relay.aside")
    relay.symlink_to(outside, target_is_directory=True)
    with pytest.raises(HostileFileError, match=f"{relay} is a symlink or not a directory"):
        save_record(root, [])
    assert precious.read_text(encoding="utf-8") == "outside"
# ── a record enable never wrote (hostile paths) ──────────────────────────────


def _set(file: object, **fields: object) -> dict[str, object]:
    return {"file": file, "keys": ["a"], "op": "set", "after": 1, "absent": True, **fields}


RECORD_ENTRIES: list[tuple[str, dict[str, object], str | None]] = [
    ("root config", _set("config.yaml"), None),
    ("root profile.yaml", _set("profile.yaml", absent=False, before=None), None),
    ("a profile's", {"file": "profiles/alice/config.yaml", "keys": ["plugins", "enabled"], "op": "list_add",
                     "item": "hermes-actors", "list_created": True, "parents": 1}, None),
    ("absolute", _set("/tmp/hostile/victim.yaml"), "names '/tmp/hostile/victim.yaml', not a file enable edits"),
    ("up and out", _set("../victim/config.yaml"), "names '../victim/config.yaml', not a file enable edits"),
    ("up from a profile", _set("profiles/../../config.yaml"), "not a file enable edits"),
    ("deeper", _set("profiles/a/b/config.yaml"), "not a file enable edits"),
    (".env", _set(".env"), "names '.env', not a file enable edits"),
    ("no file", {"keys": ["a"], "op": "set", "after": 1, "absent": True}, "has no file name (file: None)"),
    ("empty", {}, "has no file name (file: None)"),
    ("no keys", _set("config.yaml", keys=[]), "has no key path (keys: []; a non-empty list of strings)"),
    ("keys no list", _set("config.yaml", keys="a"), "has no key path (keys: 'a'"),
    ("a key no string", _set("config.yaml", keys=["a", 1]), "has a key that is not a string"),
    ("unknown op", _set("config.yaml", op="rm"), "has an unknown op 'rm' (enable records set or list_add)"),
    ("no after", {"file": "config.yaml", "keys": ["a"], "op": "set", "absent": True}, "has no after value"),
    ("no before", _set("config.yaml", absent=False), "has no before value"),
    ("absent no bool", _set("config.yaml", absent="yes"), "has absent 'yes', not true or false"),
    ("parents no count", _set("config.yaml", parents="2"), "has parents '2', not a count"),
    ("file created", _set("config.yaml", file_created=True), None),
    ("file_created no bool", _set("config.yaml", file_created="yes"), "has file_created 'yes', not true or false"),
    ("no item", {"file": "config.yaml", "keys": ["a"], "op": "list_add"}, "has item None, not a string"),
]


@pytest.mark.parametrize(("entry", "problem"), [r[1:] for r in RECORD_ENTRIES], ids=[r[0] for r in RECORD_ENTRIES])
def test_record_entry_problem_names_what_enable_never_records(entry: dict[str, object], problem: str | None) -> None:
    from hermes_actors.hermes.recorded_edits import record_entry_problem

    got = record_entry_problem(entry)
    assert got is None if problem is None else (got is not None and problem in got), got


@pytest.mark.parametrize("entry", [
    _set("/OUTSIDE/victim.yaml"), _set("../victim.yaml"), {}, _set("config.yaml", keys=[]),
], ids=["absolute", "dotdot", "empty", "no keys"])
def test_disable_refuses_a_record_enable_never_wrote_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], entry: dict[str, object]
) -> None:
    """Regression (hostile paths): an entry naming a file outside the root had disable rewrite it (`changed:
    /tmp/hostile/victim.yaml: a restored`); an entry `{}` ended in a KeyError traceback, `"keys": []` in an
    IndexError one. The whole record is checked first: refused, exit 2, naming the entry; nothing changed."""
    import json

    victim = tmp_path / "victim.yaml"
    victim.write_text("a: 1\n", encoding="utf-8")
    root = make_root(tmp_path)
    relay = root / "bot_relay"
    relay.mkdir(mode=0o700)
    record = relay / "hermes-actors-enable.json"
    if entry.get("file") == "/OUTSIDE/victim.yaml":
        entry = {**entry, "file": str(victim)}
    record.write_text(json.dumps({"version": 1, "edits": [entry]}), encoding="utf-8")
    record.chmod(0o600)
    before = _tree(tmp_path)
    assert main(["disable", "--root", str(root)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"error: {record}: edit 1 of 1 "), err
    assert "nothing was changed: remove that edit from the record" in err and "Traceback" not in err
    assert _tree(tmp_path) == before


def test_disable_reads_no_record_and_no_file_through_a_symlink(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression (hostile paths): a record behind a ``bot_relay/`` that is a symlink, and a profile's file behind
    a profile folder that is one, were read (here: said malformed, naming the files outside); never read now."""
    import json

    outside = tmp_path / "outside"
    (outside / "relay").mkdir(parents=True, mode=0o700)
    (outside / "relay" / "hermes-actors-enable.json").write_text('{"edits": 5}', encoding="utf-8")
    (outside / "relay" / "hermes-actors-enable.json").chmod(0o600)
    (outside / "home").mkdir()
    (outside / "home" / "config.yaml").write_text("a: [\n", encoding="utf-8")
    root = make_root(tmp_path / "r")
    (root / "bot_relay").symlink_to(outside / "relay")
    assert main(["disable", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {root / 'bot_relay'} is a symlink; refusing to read the enable record through"), err
    (root / "bot_relay").unlink()
    (root / "bot_relay").mkdir(mode=0o700)
    entry = {"file": "profiles/evil/config.yaml", "keys": ["plugins", "enabled"], "op": "list_add",
             "item": "hermes-actors"}
    (root / "bot_relay" / "hermes-actors-enable.json").write_text(json.dumps({"edits": [entry]}), encoding="utf-8")
    (root / "bot_relay" / "hermes-actors-enable.json").chmod(0o600)
    (root / "profiles" / "evil").symlink_to(outside / "home")
    before = _tree(tmp_path)
    assert main(["disable", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {root / 'profiles' / 'evil'} is a symlink or not a directory; refusing"), err
    assert _tree(tmp_path) == before


_BY_HAND = ("Look at it (each edit names a YAML file under the root, the keys enable set and their earlier value): "
            "put it right, or move it aside (mv {record} {record}.bad) and undo enable's edits by hand: "
            "'hermes-actors' in plugins.enabled of the root's and each profile's config.yaml, the hermes-bots block "
            "under ui_meta in each profile.yaml, and after enable --gateway platforms.hermes_actors (and the "
            "platforms.api_server and multiplex_profiles settings it set) in the root's config.yaml; a YAML file "
            "enable rewrote without its comments has its earlier text beside it, in <name>.before-hermes-actors "
            "(docs/hermes.md, Uninstall)")


@pytest.mark.parametrize(("text", "says"), [
    ('[{"file":"../../../etc/passwd","keys":["x"]}]',
     "{record} is not a record this version wrote; refusing to guess. "),
    ("{not json",
     "{record} is not valid JSON: unexpected character, expected a string key: line 1 column 2 (char 1). "),
], ids=["a list", "not JSON"])
def test_disable_refusing_a_record_it_cannot_read_says_what_to_do_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, says: str
) -> None:
    """Regression (CLI review): a corrupt or foreign record (`[{"file":"../../../etc/passwd",…}]`) said only
    `…is not a record this version wrote; refusing to guess` and invalid JSON only the parser's message, neither
    what to do; a record with an edit lacking its op ended in a KeyError traceback, and one naming a file outside
    the root had disable edit it."""
    root = make_root(tmp_path)
    outside = tmp_path / "outside" / "config.yaml"
    outside.parent.mkdir()
    outside.write_text("plugins:\n  enabled:\n  - hermes-actors\n", encoding="utf-8")
    record = root / "bot_relay" / "hermes-actors-enable.json"
    record.parent.mkdir(mode=0o700)
    record.write_text(text, encoding="utf-8")
    record.chmod(0o600)
    before = _tree(tmp_path)
    assert main(["disable", "--root", str(root)]) == 2
    captured = capsys.readouterr()
    assert captured.err == "error: " + (says + _BY_HAND).format(record=record) + "\n"
    assert _tree(tmp_path) == before
