"""``store.sweep.sweep_old_files``: which files a housekeeping sweep removes, and which it leaves."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hermes_actors.store.sweep import sweep_old_files

NOW = 1_000_000.0
OLD = NOW - 100
NEW = NOW + 100


def _file(path: Path, mtime: float) -> Path:
    path.write_text("x")
    os.utime(path, (mtime, mtime))
    return path


@pytest.mark.parametrize(
    ("name", "mtime", "patterns", "uid_offset", "removed"),
    [
        ("a.txt", OLD, None, None, True),  # old, any name, any owner
        ("a.txt", NEW, None, None, False),  # modified after the cutoff
        ("a.txt", OLD, ("*.txt",), None, True),
        ("a.json", OLD, ("*.txt", "*.live.json"), None, False),  # no pattern matches
        ("a.live.json", OLD, ("*.txt", "*.live.json"), None, True),
        ("a.txt", OLD, None, 0, True),  # owned by the uid asked for
        ("a.txt", OLD, None, 1, False),  # another uid's file
    ],
)
def test_which_files_go(tmp_path: Path, name: str, mtime: float, patterns: tuple[str, ...] | None,
                        uid_offset: int | None, removed: bool) -> None:
    path = _file(tmp_path / name, mtime)
    uid = None if uid_offset is None else os.getuid() + uid_offset
    assert sweep_old_files(tmp_path, NOW, patterns=patterns, uid=uid) == int(removed)
    assert path.exists() is not removed


def test_symlinks_and_directories_are_left_and_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    target = _file(outside / "precious.txt", OLD)
    swept = tmp_path / "swept"
    swept.mkdir()
    (swept / "link.txt").symlink_to(target)
    os.utime(swept / "link.txt", (OLD, OLD), follow_symlinks=False)
    old_dir = swept / "dir.txt"
    old_dir.mkdir()
    os.utime(old_dir, (OLD, OLD))
    regular = _file(swept / "plain.txt", OLD)
    assert sweep_old_files(swept, NOW, patterns=("*.txt",)) == 1
    assert not regular.exists()
    assert (swept / "link.txt").is_symlink() and target.read_text() == "x"
    assert old_dir.is_dir()


def test_a_missing_directory_sweeps_nothing(tmp_path: Path) -> None:
    assert sweep_old_files(tmp_path / "absent", NOW) == 0


def test_a_directory_swapped_for_a_symlink_sweeps_nothing_outside(tmp_path: Path) -> None:
    """Regression (review): the sweep listed and removed by path, so a relay directory swapped for a symlink had
    the files of the directory it points to removed (ours, regular, older than the cutoff)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    precious = _file(outside / "precious.json", OLD)
    relay = tmp_path / "bot_relay"
    relay.mkdir()
    (relay / "claimed").symlink_to(outside, target_is_directory=True)
    assert sweep_old_files(relay / "claimed", NOW) == 0
    assert sweep_old_files(relay / "claimed", NOW, within=relay) == 0
    assert precious.exists()


def test_within_refuses_a_symlink_at_any_step_down(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "taken").mkdir(parents=True)
    precious = _file(outside / "taken" / "precious.json", OLD)
    relay = tmp_path / "bot_relay"
    relay.mkdir()
    (relay / "shelf").symlink_to(outside, target_is_directory=True)
    assert sweep_old_files(relay / "shelf" / "taken", NOW, within=relay) == 0
    assert precious.exists()
    real = relay / "real"
    real.mkdir()
    old = _file(real / "old.json", OLD)
    assert sweep_old_files(real, NOW, within=relay) == 1
    assert not old.exists()


def test_keep_spares_old_files_still_needed(tmp_path: Path) -> None:
    """``keep`` decides last, for old files only: a young file is never asked about."""
    asked: list[str] = []

    def keep(name: str) -> bool:
        asked.append(name)
        return name == "owed.json"

    for name in ("owed.json", "done.json"):
        _file(tmp_path / name, OLD)
    _file(tmp_path / "young.json", NEW)
    assert sweep_old_files(tmp_path, NOW, keep=keep) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["owed.json", "young.json"]
    assert sorted(asked) == ["done.json", "owed.json"]
