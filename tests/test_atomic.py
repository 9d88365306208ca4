"""Tests for hermes_actors.store.atomic (atomic writes), store.private_dir and the hostile-aware reads."""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hermes_actors.errors import HostileFileError, StoreError
from hermes_actors.store import atomic
from hermes_actors.store.atomic import (
    atomic_write_json,
    create_exclusive_json,
    read_json_file,
)
from hermes_actors.store.private_dir import ensure_private_dir

IS_ROOT = os.geteuid() == 0
OTHER_UID = 65534


@pytest.fixture()
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """A data dir and a temp dir on the same filesystem."""
    data = tmp_path / "data"
    tmp = tmp_path / "tmp"
    data.mkdir()
    tmp.mkdir()
    return data, tmp


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ── atomic_write_json ───────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("payload", "sort_keys", "fsync", "expected"),
    [
        ({"b": 1, "a": "é"}, False, False, '{"b":1,"a":"é"}'),
        ({"b": 1, "a": "é"}, True, False, '{"a":"é","b":1}'),
        ([1, None, True], False, True, "[1,null,true]"),
        ("plain", True, True, '"plain"'),
    ],
)
def test_atomic_write_round_trip(
    dirs: tuple[Path, Path], payload: Any, sort_keys: bool, fsync: bool, expected: str
) -> None:
    data, tmp = dirs
    target = data / "x.json"
    atomic_write_json(target, payload, tmp_dir=tmp, sort_keys=sort_keys, fsync=fsync)
    assert target.read_text(encoding="utf-8") == expected
    assert json.loads(target.read_text(encoding="utf-8")) == payload
    assert _mode(target) == 0o600
    assert list(tmp.iterdir()) == []


def test_atomic_write_replaces_existing(dirs: tuple[Path, Path]) -> None:
    data, tmp = dirs
    target = data / "x.json"
    target.write_text("old")
    os.chmod(target, 0o644)
    atomic_write_json(target, {"new": True}, tmp_dir=tmp)
    assert json.loads(target.read_text()) == {"new": True}
    assert _mode(target) == 0o600


def test_atomic_write_narrow_umask_still_0600(dirs: tuple[Path, Path]) -> None:
    data, tmp = dirs
    old = os.umask(0o077)
    try:
        atomic_write_json(data / "x.json", 1, tmp_dir=tmp)
    finally:
        os.umask(old)
    assert _mode(data / "x.json") == 0o600


@pytest.mark.parametrize(
    ("func", "code", "symbol"),
    [
        ("replace", errno.ENOSPC, "ENOSPC"),
        ("replace", errno.EACCES, "EACCES"),
        ("fsync", errno.EIO, "EIO"),
        ("write", errno.ENOSPC, "ENOSPC"),
    ],
)
def test_atomic_write_failure_leaves_no_temp(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, func: str, code: int, symbol: str
) -> None:
    data, tmp = dirs
    target = data / "x.json"
    target.write_text('"old"')
    calls: list[str] = []

    def boom(*args: Any, **kwargs: Any) -> Any:
        calls.append(func)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(atomic.os, func, boom)
    with pytest.raises(StoreError) as info:
        atomic_write_json(target, {"a": 1}, tmp_dir=tmp, fsync=True)
    monkeypatch.undo()
    assert calls == [func]
    text = str(info.value)
    assert str(target) in text and symbol in text
    assert info.value.errno == code
    assert list(tmp.iterdir()) == []
    assert target.read_text() == '"old"'


def test_atomic_write_unserializable_is_store_error(dirs: tuple[Path, Path]) -> None:
    data, tmp = dirs
    with pytest.raises(StoreError, match=r"x\.json"):
        atomic_write_json(data / "x.json", {"a": object()}, tmp_dir=tmp)
    assert list(tmp.iterdir()) == []
    assert not (data / "x.json").exists()


def test_atomic_write_missing_tmp_dir_is_store_error(dirs: tuple[Path, Path]) -> None:
    data, tmp = dirs
    with pytest.raises(StoreError, match="ENOENT"):
        atomic_write_json(data / "x.json", 1, tmp_dir=tmp / "nope")


def test_atomic_write_refuses_symlinked_parent(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    data, tmp = dirs
    link = tmp_path / "link"
    link.symlink_to(data, target_is_directory=True)
    with pytest.raises(HostileFileError, match="symlink"):
        atomic_write_json(link / "x.json", 1, tmp_dir=tmp)
    assert list(data.iterdir()) == []
    assert list(tmp.iterdir()) == []


@pytest.mark.parametrize("write", [atomic_write_json, create_exclusive_json])
def test_a_symlinked_or_foreign_temp_dir_is_refused_and_nothing_is_written(
    write: Any, dirs: tuple[Path, Path], tmp_path: Path
) -> None:
    data, _ = dirs
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    swapped = tmp_path / "swapped-tmp"
    swapped.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(HostileFileError, match="symlink"):
        write(data / "x.json", 1, tmp_dir=swapped)
    plain = tmp_path / "plain-file"
    plain.write_text("")
    with pytest.raises(HostileFileError, match="not a directory"):
        write(data / "x.json", 1, tmp_dir=plain)
    assert list(elsewhere.iterdir()) == [] and list(data.iterdir()) == []


def test_temp_name_shape(dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    data, tmp = dirs
    seen: list[str] = []
    real = os.replace

    def spy(src: Any, dst: Any, **kwargs: Any) -> None:
        seen.append(Path(src).name)
        real(src, dst, **kwargs)

    monkeypatch.setattr(atomic.os, "replace", spy)
    atomic_write_json(data / "abc.json", 1, tmp_dir=tmp)
    monkeypatch.undo()
    assert len(seen) == 1
    assert seen[0].startswith(".abc.json.") and seen[0].endswith(".tmp")


# ── create_exclusive_json ───────────────────────────────────────────────────


def test_create_exclusive_first_writer_wins(dirs: tuple[Path, Path]) -> None:
    data, tmp = dirs
    target = data / "r.json"
    assert create_exclusive_json(target, {"n": 1}, tmp_dir=tmp) is True
    assert create_exclusive_json(target, {"n": 2}, tmp_dir=tmp) is False
    assert json.loads(target.read_text()) == {"n": 1}
    assert _mode(target) == 0o600
    assert list(tmp.iterdir()) == []


def test_create_exclusive_dangling_symlink_counts_as_taken(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    data, tmp = dirs
    target = data / "r.json"
    target.symlink_to(tmp_path / "elsewhere.json")
    assert create_exclusive_json(target, 1, tmp_dir=tmp) is False
    assert not (tmp_path / "elsewhere.json").exists()
    assert list(tmp.iterdir()) == []


def test_create_exclusive_thread_race_exactly_one_wins(dirs: tuple[Path, Path]) -> None:
    data, tmp = dirs
    target = data / "r.json"
    n = 16
    barrier = threading.Barrier(n)
    results: list[tuple[int, bool]] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        barrier.wait()
        won = create_exclusive_json(target, {"writer": i}, tmp_dir=tmp)
        with lock:
            results.append((i, won))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, won in results if won]
    assert len(results) == n and len(winners) == 1
    assert json.loads(target.read_text()) == {"writer": winners[0]}
    assert list(tmp.iterdir()) == []


def test_create_exclusive_link_failure(dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    data, tmp = dirs

    def boom(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EMLINK, os.strerror(errno.EMLINK))

    monkeypatch.setattr(atomic.os, "link", boom)
    with pytest.raises(StoreError, match="EMLINK"):
        create_exclusive_json(data / "r.json", 1, tmp_dir=tmp)
    monkeypatch.undo()
    assert list(tmp.iterdir()) == []
    assert not (data / "r.json").exists()


# ── read_json_file ──────────────────────────────────────────────────────────


def _regular(path: Path, text: str = '{"ok": 1}', mode: int = 0o600) -> Path:
    path.write_text(text)
    os.chmod(path, mode)
    return path


def _regular_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    os.chmod(path, 0o600)
    return path


def _make_symlink(path: Path) -> Path:
    real = _regular(path.with_name("real.json"))
    path.symlink_to(real)
    return path


def _make_fifo(path: Path) -> Path:
    os.mkfifo(path, 0o600)
    return path


def _make_dir(path: Path) -> Path:
    path.mkdir(mode=0o700)
    return path


HOSTILE_CASES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("symlink", _make_symlink, "is a symlink"),
    ("fifo", _make_fifo, "not a regular file"),
    ("directory", _make_dir, "not a regular file"),
    ("huge", lambda p: _regular(p, "[" + "1," * 600_000 + "1]"), "too large"),
    ("corrupt", lambda p: _regular(p, '{"a": '), "is not valid JSON"),
    ("not utf-8", lambda p: _regular_bytes(p, b'"\xff\xfe"'), "is not valid JSON"),
    ("empty", lambda p: _regular(p, ""), "is not valid JSON"),
    ("group-writable", lambda p: _regular(p, mode=0o620), "writable by group or others"),
    ("other-writable", lambda p: _regular(p, mode=0o602), "writable by group or others"),
]


@pytest.mark.parametrize(("name", "make", "why"), HOSTILE_CASES, ids=[c[0] for c in HOSTILE_CASES])
def test_read_json_file_refuses_hostile(tmp_path: Path, name: str, make: Callable[[Path], Path], why: str) -> None:
    path = make(tmp_path / "f.json")
    with pytest.raises(HostileFileError, match=why) as info:
        read_json_file(path)
    assert str(path) in str(info.value)


@pytest.mark.skipif(not IS_ROOT, reason="chown to another uid needs root")
def test_read_json_file_refuses_other_owner(tmp_path: Path) -> None:
    path = _regular(tmp_path / "f.json")
    os.chown(path, OTHER_UID, -1)
    with pytest.raises(HostileFileError, match=f"owned by uid {OTHER_UID}"):
        read_json_file(path)
    assert read_json_file(path, expect_uid=None) == {"ok": 1}
    assert read_json_file(path, expect_uid=OTHER_UID) == {"ok": 1}


@pytest.mark.parametrize(
    ("text", "expected"),
    [('{"ok": 1}', {"ok": 1}), ("[1, 2]", [1, 2]), ('"s"', "s"), ("null", None)],
)
def test_read_json_file_accepts_any_json_value(tmp_path: Path, text: str, expected: Any) -> None:
    assert read_json_file(_regular(tmp_path / "f.json", text, 0o644)) == expected


def test_read_json_file_size_limit_is_inclusive(tmp_path: Path) -> None:
    path = _regular(tmp_path / "f.json", '"abc"')
    assert read_json_file(path, max_bytes=5) == "abc"
    with pytest.raises(HostileFileError, match="too large"):
        read_json_file(path, max_bytes=4)


def test_read_json_file_missing_propagates(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_json_file(tmp_path / "missing.json")


# ── ensure_private_dir ──────────────────────────────────────────────────────


def test_ensure_private_dir_creates_nested_0700(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c"
    old = os.umask(0o022)
    try:
        assert ensure_private_dir(target) == target
    finally:
        os.umask(old)
    for p in (tmp_path / "a", tmp_path / "a" / "b", target):
        assert _mode(p) == 0o700
    assert ensure_private_dir(target) == target  # idempotent


def test_ensure_private_dir_leaves_existing_ancestor_mode(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)
    ensure_private_dir(tmp_path / "x")
    assert _mode(tmp_path) == 0o755


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda p: p.symlink_to(p.parent, target_is_directory=True), "is a symlink"),
        (lambda p: p.write_text("x"), "is not a directory"),
    ],
    ids=["symlink", "file"],
)
def test_ensure_private_dir_refuses(tmp_path: Path, make: Callable[[Path], Any], why: str) -> None:
    target = tmp_path / "d"
    make(target)
    with pytest.raises(HostileFileError, match=why):
        ensure_private_dir(target)


@pytest.mark.skipif(not IS_ROOT, reason="chown to another uid needs root")
def test_ensure_private_dir_refuses_other_owner(tmp_path: Path) -> None:
    target = tmp_path / "d"
    target.mkdir()
    os.chown(target, OTHER_UID, -1)
    with pytest.raises(HostileFileError, match=f"owned by uid {OTHER_UID}"):
        ensure_private_dir(target)


def test_a_temp_that_cannot_be_removed_is_named_by_its_absolute_path(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, warnings: list[str]
) -> None:
    """Regression (ops review): on a disk gone read-only, the warning named the temp by its bare name
    (``.x.json.<hex>.tmp``, relative to a directory descriptor): it names the file in full and what to do."""
    data, tmp = dirs
    real_unlink = os.unlink

    def write_fails(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        if str(path).endswith(".tmp"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(atomic.os, "replace", write_fails)
    monkeypatch.setattr(os, "unlink", unlink)
    with pytest.raises(StoreError) as info:
        atomic_write_json(data / "x.json", 1, tmp_dir=tmp)
    monkeypatch.undo()
    assert f"cannot write {data / 'x.json'}: Read-only file system (EROFS); its filesystem is mounted read-only: " \
           "remount it read-write" == str(info.value)
    (left,) = tmp.iterdir()
    (warning,) = [w for w in warnings if "could not remove temp file" in w]
    assert f"could not remove temp file {left}: Read-only file system (EROFS)" in warning, warning
    assert "remount it read-write" in warning and "remove it by hand" in warning


@pytest.mark.parametrize(("code", "advice"), [
    (errno.ENOSPC, "free space on its filesystem"),
    (errno.EDQUOT, "raise the disk quota"),
    (errno.EROFS, "remount it read-write"),
    (errno.EACCES, "fix the permissions"),
    (errno.EPERM, "fix the permissions"),
    (errno.EIO, None),
])
def test_store_errors_say_what_to_do(code: int, advice: str | None) -> None:
    from hermes_actors.store.os_errors import store_error, what_to_do

    exc = OSError(code, os.strerror(code))
    said = what_to_do(exc)
    assert (said is None) if advice is None else (advice in str(said))
    text = str(store_error("write", Path("relative.json"), exc))
    assert text.startswith(f"cannot write {Path.cwd() / 'relative.json'}: ")
    assert advice is None or text.endswith(f"; {said}")
