"""The no-symlink directory walk (:mod:`hermes_actors.store.relay_dirfd`): its descriptors under interrupts, and
:func:`~hermes_actors.store.relay_dirfd.remove_below`, the one way an entry under a root is removed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hermes_actors.errors import HostileFileError
from hermes_actors.store.relay_dirfd import link_below, lstat_below, open_dir_below, remove_below


def test_a_walk_interrupted_right_after_closing_a_step_closes_every_descriptor_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression (review of the embedding API): a KeyboardInterrupt right after the walk closed the step
    # above closed that step's number again, by then maybe another thread's file (the journal's: EBADF
    # on every later commit).
    (tmp_path / "a" / "b").mkdir(parents=True)
    opened: list[int] = []
    closed: list[int] = []
    real_open, real_close = os.open, os.close

    def open_(*args: object, **kwargs: object) -> int:
        fd = real_open(*args, **kwargs)  # type: ignore[arg-type]
        opened.append(fd)
        return fd

    def close(fd: int) -> None:
        closed.append(fd)
        real_close(fd)
        if len(closed) == 1:
            raise KeyboardInterrupt  # the first close is of step "a", once "b" is open

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "close", close)
    with pytest.raises(KeyboardInterrupt):
        open_dir_below(tmp_path, tmp_path / "a" / "b")
    monkeypatch.undo()
    assert len(closed) == len(set(closed)), f"a descriptor closed twice: {closed}"
    assert sorted(closed) == sorted(opened), f"opened {opened}, closed {closed}"


# The shapes remove_below meets, each planted under <anchor>/bot_relay/ with the entry meant at bot_relay/dir/x.json,
# and an outside directory holding a file of that name: what the call returns or raises, and whether the entry is
# still there after it. The outside file is never touched.
_REMOVALS = [
    # (case, directory=, returns or raises, entry left)
    ("a-file", False, True, False),
    ("missing-entry", False, False, False),
    ("missing-directory", False, False, False),
    ("a-symlink-entry", False, True, False),  # the link goes, never what it points to
    ("an-empty-directory", True, True, False),
    ("a-directory-not-asked-for", False, OSError, True),
    ("directory-swapped-for-a-symlink", False, HostileFileError, True),
    ("bot-relay-swapped-for-a-symlink", False, HostileFileError, True),
    ("directory-swapped-for-a-file", False, HostileFileError, False),
    pytest.param("directory-of-another-uid", False, HostileFileError, True,
                 marks=pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")),
]


def _plant_removal(case: str, anchor: Path, outside: Path) -> Path:
    """Lay out ``case`` under ``anchor``; returns the entry to remove (``bot_relay/dir/x.json``)."""
    relay = anchor / "bot_relay"
    directory = relay / "dir"
    entry = directory / "x.json"
    outside.mkdir()
    (outside / "x.json").write_text("outside", encoding="utf-8")
    if case == "bot-relay-swapped-for-a-symlink":
        (outside / "dir").mkdir()
        (outside / "dir" / "x.json").write_text("outside", encoding="utf-8")
        relay.symlink_to(outside, target_is_directory=True)
        return entry
    relay.mkdir()
    if case == "directory-swapped-for-a-symlink":
        directory.symlink_to(outside, target_is_directory=True)
    elif case == "directory-swapped-for-a-file":
        directory.write_text("a file", encoding="utf-8")
    elif case != "missing-directory":
        directory.mkdir()
    if case in ("a-file", "directory-of-another-uid"):
        entry.write_text("ours", encoding="utf-8")
    elif case == "a-symlink-entry":
        entry.symlink_to(outside / "x.json")
    elif case in ("an-empty-directory", "a-directory-not-asked-for"):
        entry.mkdir()
    if case == "directory-of-another-uid":
        os.chown(directory, 12345, 12345)
    return entry


@pytest.mark.parametrize(("case", "directory", "expected", "entry_left"), _REMOVALS)
def test_remove_below_removes_only_through_directories_of_ours(
    tmp_path: Path, case: str, directory: bool, expected: bool | type[Exception], entry_left: bool
) -> None:
    anchor, outside = tmp_path / "root", tmp_path / "outside"
    anchor.mkdir()
    entry = _plant_removal(case, anchor, outside)
    if isinstance(expected, bool):
        assert remove_below(anchor, entry, directory=directory) is expected
    else:
        with pytest.raises(expected):
            remove_below(anchor, entry, directory=directory)
    assert os.path.lexists(entry) is entry_left
    assert (outside / "x.json").read_text(encoding="utf-8") == "outside"
    if case == "bot-relay-swapped-for-a-symlink":
        assert (outside / "dir" / "x.json").read_text(encoding="utf-8") == "outside"


def test_remove_below_names_the_directory_it_refuses(tmp_path: Path) -> None:
    anchor, outside = tmp_path / "root", tmp_path / "outside"
    anchor.mkdir()
    entry = _plant_removal("directory-swapped-for-a-symlink", anchor, outside)
    with pytest.raises(HostileFileError, match=f"^{entry.parent} is a symlink or not a directory; refusing to use it$"):
        remove_below(anchor, entry)


def test_remove_below_refuses_a_path_outside_its_anchor(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.json").write_text("outside", encoding="utf-8")
    with pytest.raises(ValueError, match="is not inside"):
        remove_below(tmp_path / "root", tmp_path / "elsewhere" / "x.json")
    assert (tmp_path / "elsewhere" / "x.json").exists()


# (case, what lstat_below answers: a file type, or the error raised); the layout is _plant_removal's
_LOOKS = [
    ("a-file", "file", None),
    ("a-symlink-entry", "symlink", None),  # the entry itself, never followed
    ("missing-entry", None, FileNotFoundError),
    ("missing-directory", None, FileNotFoundError),
    ("directory-swapped-for-a-symlink", None, HostileFileError),
    ("bot-relay-swapped-for-a-symlink", None, HostileFileError),
    ("directory-swapped-for-a-file", None, HostileFileError),
]


@pytest.mark.parametrize(("case", "kind", "error"), _LOOKS)
def test_lstat_below_looks_only_through_directories_of_ours(
    tmp_path: Path, case: str, kind: str | None, error: type[Exception] | None
) -> None:
    import stat

    anchor, outside = tmp_path / "root", tmp_path / "outside"
    anchor.mkdir()
    entry = _plant_removal(case, anchor, outside)
    if error is not None:
        with pytest.raises(error):
            lstat_below(anchor, entry)
        return
    mode = lstat_below(anchor, entry).st_mode
    assert (stat.S_ISREG(mode), stat.S_ISLNK(mode)) == (kind == "file", kind == "symlink")


@pytest.mark.parametrize(("case", "error"), [
    ("a-file", None),
    ("a-symlink-entry", None),  # the link itself is linked, not what it points to
    ("missing-entry", FileNotFoundError),
    ("directory-swapped-for-a-symlink", HostileFileError),
    ("bot-relay-swapped-for-a-symlink", HostileFileError),
    ("directory-swapped-for-a-file", HostileFileError),
])
def test_link_below_links_only_through_directories_of_ours(
    tmp_path: Path, case: str, error: type[Exception] | None
) -> None:
    anchor, outside = tmp_path / "root", tmp_path / "outside"
    anchor.mkdir()
    entry = _plant_removal(case, anchor, outside)
    target = anchor / "linked.json"
    if error is not None:
        with pytest.raises(error):
            link_below(anchor, entry, target)
        assert not os.path.lexists(target) and os.lstat(outside / "x.json").st_nlink == 1
        return
    link_below(anchor, entry, target)
    assert os.lstat(target).st_ino == os.lstat(entry).st_ino
    with pytest.raises(FileExistsError):  # never over an entry there
        link_below(anchor, entry, target)


def test_link_below_never_makes_a_link_through_a_swapped_target_directory(tmp_path: Path) -> None:
    anchor, outside = tmp_path / "root", tmp_path / "outside"
    anchor.mkdir()
    entry = _plant_removal("a-file", anchor, outside)
    (anchor / "bot_relay" / "to").symlink_to(outside, target_is_directory=True)
    with pytest.raises(HostileFileError, match="to is a symlink"):
        link_below(anchor, entry, anchor / "bot_relay" / "to" / "x.lock")
    assert not os.path.lexists(outside / "x.lock")
