"""The no-symlink directory walk (:mod:`hermes_actors.store.relay_dirfd`): its descriptors under interrupts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hermes_actors.store.relay_dirfd import open_dir_below


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
