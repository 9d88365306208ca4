"""The DM query-file directory: refusal of hostile paths, exclusive 0600 files, cleanup."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from hermes_actors.local import dm_files as dmfiles

ID = "0123456789abcdef0123456789abcdef"
ID2 = "fedcba9876543210fedcba9876543210"
HOUR = 3600.0


def _expected_dir(base: Path) -> Path:
    return base / f"hermes-dm-{os.getuid()}"


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _age(path: Path, mtime: float) -> None:
    os.utime(path, (mtime, mtime), follow_symlinks=False)


# ── dm_dir ──────────────────────────────────────────────────────────────────


def test_dm_dir_is_created_per_user_with_mode_0700(tmp_path: Path) -> None:
    old_umask = os.umask(0o077)
    try:
        path = dmfiles.dm_dir(tmp_path)
    finally:
        os.umask(old_umask)
    assert path == _expected_dir(tmp_path)
    assert path.is_dir() and not path.is_symlink()
    assert _mode(path) == 0o700
    assert dmfiles.dm_dir(tmp_path) == path  # idempotent


def test_dm_dir_we_create_is_0700_even_when_the_umask_clears_owner_bits(tmp_path: Path) -> None:
    old_umask = os.umask(0o277)
    try:
        path = dmfiles.dm_dir(tmp_path)
    finally:
        os.umask(old_umask)
    assert _mode(path) == 0o700


def test_symlinked_dm_dir_is_refused_and_nothing_is_written_through_it(tmp_path: Path) -> None:
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir(mode=0o700)
    base = tmp_path / "tmp"
    base.mkdir()
    _expected_dir(base).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(PermissionError, match="it is a symlink"):
        dmfiles.dm_dir(base)
    with pytest.raises(PermissionError):
        dmfiles.write_dm_file(ID, "secret", base=base)
    assert list(elsewhere.iterdir()) == []
    assert _expected_dir(base).is_symlink()  # left alone


def test_non_directory_dm_path_is_refused(tmp_path: Path) -> None:
    _expected_dir(tmp_path).write_text("squatter")
    with pytest.raises(PermissionError, match="not a directory"):
        dmfiles.dm_dir(tmp_path)
    assert _expected_dir(tmp_path).read_text() == "squatter"


def test_wrong_mode_is_refused_not_repaired(tmp_path: Path) -> None:
    path = _expected_dir(tmp_path)
    path.mkdir()
    path.chmod(0o755)
    with pytest.raises(PermissionError, match=r"mode 0755, expected 0700; remove it or chmod 700"):
        dmfiles.dm_dir(tmp_path)
    with pytest.raises(PermissionError):
        dmfiles.write_dm_file(ID, "secret", base=tmp_path)
    assert list(path.iterdir()) == []
    assert _mode(path) == 0o755


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown a directory to another uid")
def test_dm_dir_owned_by_another_uid_is_refused(tmp_path: Path) -> None:
    path = _expected_dir(tmp_path)
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)
    with pytest.raises(PermissionError, match="owned by uid 65534"):
        dmfiles.dm_dir(tmp_path)
    with pytest.raises(PermissionError):
        dmfiles.write_dm_file(ID, "secret", base=tmp_path)
    assert list(path.iterdir()) == []


# ── write_dm_file ───────────────────────────────────────────────────────────


def test_write_creates_a_0600_utf8_file_named_by_delivery_id(tmp_path: Path) -> None:
    text = "Message from 🤖 Alice (@alice): héllo\nsecond line\r\n"
    path = dmfiles.write_dm_file(ID, text, base=tmp_path)
    assert path == _expected_dir(tmp_path) / f"dm-{ID}.txt"
    assert _mode(path) == 0o600
    assert path.read_bytes() == text.encode("utf-8")  # no newline translation
    assert path.stat().st_uid == os.geteuid()


@pytest.mark.parametrize(
    "bad",
    ["", "../../etc/passwd", ID.upper(), ID[:-1], ID + "0", ID[:-1] + "g", ID + "\n", f"{ID[:16]}/{ID[17:]}"],
)
def test_bad_delivery_id_is_refused_before_any_path_is_built(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValueError, match="32 lowercase hex"):
        dmfiles.write_dm_file(bad, "hi", base=tmp_path)
    assert list(tmp_path.iterdir()) == []  # not even the directory was created


def test_non_string_delivery_id_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        dmfiles.write_dm_file(123, "hi", base=tmp_path)  # type: ignore[arg-type]


def test_replay_with_same_content_returns_the_same_file(tmp_path: Path) -> None:
    first = dmfiles.write_dm_file(ID, "same", base=tmp_path)
    second = dmfiles.write_dm_file(ID, "same", base=tmp_path)
    assert first == second
    assert first.read_text(encoding="utf-8") == "same"


def test_replay_with_different_content_is_refused(tmp_path: Path) -> None:
    path = dmfiles.write_dm_file(ID, "original", base=tmp_path)
    with pytest.raises(ValueError, match="different content"):
        dmfiles.write_dm_file(ID, "forged", base=tmp_path)
    assert path.read_text(encoding="utf-8") == "original"


def test_existing_symlink_at_file_path_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("hi")
    link = dmfiles.dm_dir(tmp_path) / f"dm-{ID}.txt"
    link.symlink_to(victim)
    with pytest.raises(PermissionError, match="it is a symlink"):
        dmfiles.write_dm_file(ID, "hi", base=tmp_path)
    with pytest.raises(PermissionError):
        dmfiles.write_dm_file(ID, "overwrite", base=tmp_path)
    assert victim.read_text() == "hi"


def test_failed_write_removes_the_partial_file(tmp_path: Path) -> None:
    with pytest.raises(UnicodeEncodeError):
        dmfiles.write_dm_file(ID, "valid prefix \ud800 lone surrogate", base=tmp_path)
    assert list(_expected_dir(tmp_path).iterdir()) == []
    # the id is free again afterwards
    assert dmfiles.write_dm_file(ID, "ok", base=tmp_path).read_text() == "ok"


def test_remove_dm_file_removes_and_tolerates_missing(tmp_path: Path) -> None:
    path = dmfiles.write_dm_file(ID, "x", base=tmp_path)
    dmfiles.remove_dm_file(path)
    assert not path.exists()
    dmfiles.remove_dm_file(path)  # missing: no error
    dmfiles.remove_dm_file(tmp_path / "never-existed.txt")


# ── cleanup_bot_dm_cache ────────────────────────────────────────────────────


def test_cleanup_removes_only_files_older_than_the_cutoff(tmp_path: Path) -> None:
    now = time.time()
    old = dmfiles.write_dm_file(ID, "old", base=tmp_path)
    fresh = dmfiles.write_dm_file(ID2, "fresh", base=tmp_path)
    _age(old, now - 25 * HOUR)
    _age(fresh, now - 23 * HOUR)
    assert dmfiles.cleanup_bot_dm_cache(24, now=now, base=tmp_path) == 1
    assert not old.exists()
    assert fresh.exists()
    assert dmfiles.cleanup_bot_dm_cache(24, now=now, base=tmp_path) == 0
    # a later clock (or a shorter max age) makes the other one stale too
    assert dmfiles.cleanup_bot_dm_cache(1, now=now, base=tmp_path) == 1
    assert not fresh.exists()


def test_cleanup_sweeps_txt_and_live_json_but_nothing_else(tmp_path: Path) -> None:
    now = time.time()
    directory = dmfiles.dm_dir(tmp_path)
    doomed = [directory / "dm-a.txt", directory / "dm-a.txt.live.json", directory / "x.live.json"]
    spared = [directory / "notes.json", directory / "keep.md"]
    for path in doomed + spared:
        path.write_text("payload")
        _age(path, now - 48 * HOUR)
    subdir = directory / "dir.txt"
    subdir.mkdir()
    _age(subdir, now - 48 * HOUR)
    assert dmfiles.cleanup_bot_dm_cache(now=now, base=tmp_path) == len(doomed)
    assert not any(path.exists() for path in doomed)
    assert all(path.exists() for path in spared)
    assert subdir.is_dir()


def test_cleanup_sweeps_legacy_temp_root_orphans(tmp_path: Path) -> None:
    now = time.time()
    legacy = [tmp_path / "hermes-dm-abc.txt", tmp_path / "hermes-relay-dm-xyz.txt"]
    unrelated = [tmp_path / "other.txt", tmp_path / "hermes-dm-abc.log", tmp_path / "dm-1.txt"]
    for path in legacy + unrelated:
        path.write_text("orphan")
        _age(path, now - 30 * HOUR)
    fresh_legacy = tmp_path / "hermes-dm-new.txt"
    fresh_legacy.write_text("recent")
    _age(fresh_legacy, now - 1 * HOUR)
    assert dmfiles.cleanup_bot_dm_cache(24, now=now, base=tmp_path) == 2
    assert not any(path.exists() for path in legacy)
    assert all(path.exists() for path in unrelated)
    assert fresh_legacy.exists()
    assert _expected_dir(tmp_path).is_dir()  # the DM dir itself is never swept


def test_cleanup_never_follows_or_removes_symlinks(tmp_path: Path) -> None:
    now = time.time()
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "precious.txt"
    target.write_text("do not delete")
    _age(target, now - 100 * HOUR)
    directory = dmfiles.dm_dir(tmp_path)
    links = [directory / "dm-link.txt", tmp_path / "hermes-dm-link.txt", directory / "l.live.json"]
    for link in links:
        link.symlink_to(target)
        _age(link, now - 100 * HOUR)
    assert dmfiles.cleanup_bot_dm_cache(now=now, base=tmp_path) == 0
    assert target.read_text() == "do not delete"
    assert all(link.is_symlink() for link in links)


def test_cleanup_skips_a_refused_dm_dir_but_still_sweeps_legacy(tmp_path: Path) -> None:
    now = time.time()
    outside = tmp_path / "outside"
    outside.mkdir()
    planted = outside / "dm-planted.txt"
    planted.write_text("x")
    _age(planted, now - 100 * HOUR)
    _expected_dir(tmp_path).symlink_to(outside, target_is_directory=True)
    orphan = tmp_path / "hermes-relay-dm-1.txt"
    orphan.write_text("x")
    _age(orphan, now - 100 * HOUR)
    assert dmfiles.cleanup_bot_dm_cache(now=now, base=tmp_path) == 1
    assert not orphan.exists()
    assert planted.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown a file to another uid")
def test_cleanup_leaves_other_users_legacy_files(tmp_path: Path) -> None:
    now = time.time()
    theirs = tmp_path / "hermes-dm-theirs.txt"
    theirs.write_text("x")
    os.chown(theirs, 65534, 65534)
    _age(theirs, now - 100 * HOUR)
    assert dmfiles.cleanup_bot_dm_cache(now=now, base=tmp_path) == 0
    assert theirs.exists()
