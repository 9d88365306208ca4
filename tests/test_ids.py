"""Delivery ids: the one generator (``new_delivery_id``) and its validator."""

from __future__ import annotations

import os
import sys

import pytest

from hermes_actors.core import ids
from hermes_actors.core.ids import is_delivery_id, new_delivery_id


def test_ids_are_uuid4_shaped_and_distinct() -> None:
    made = [new_delivery_id() for _ in range(1000)]
    assert all(is_delivery_id(key) and key[12] == "4" and key[16] in "89ab" for key in made)
    assert len(set(made)) == len(made)


def test_an_id_costs_no_getpid_syscall(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every DM draws one on its sender's thread: a forked child reseeds through a fork hook instead.
    new_delivery_id()  # this thread's generator exists

    def getpid() -> int:
        raise AssertionError("new_delivery_id called os.getpid")

    monkeypatch.setattr(ids.os, "getpid", getpid)
    assert is_delivery_id(new_delivery_id())


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32", reason="needs fork")
def test_a_forked_child_never_repeats_its_parents_next_id() -> None:
    new_delivery_id()  # the parent's generator exists before the fork, and the child starts with a copy of it
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id, to the parent
        try:
            os.write(write, new_delivery_id().encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    assert is_delivery_id(child) and child != new_delivery_id()
