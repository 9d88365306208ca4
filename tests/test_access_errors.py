"""A path the user may not use: named, with what is wrong and what to do, by one rule, with DESIGN section 10's code.

The CLI cases run ``main`` as another user (uid 65534) in a forked child of this process: the permission
checks of the kernel then apply, as they do to a user who is not root.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import io
import json
import os
import pkgutil
import pwd
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from roots import make_root

import hermes_actors.cli.ops_commands
import hermes_actors.cli.send
import hermes_actors.hermes.setup
import hermes_actors.hermes.submit_client
from hermes_actors.cli.main import main
from hermes_actors.hermes.install import CLI_ENV_VAR, find_hermes_cli
from hermes_actors.local.cli_process import resolve_cli
from hermes_actors.store.hermes_root import discover_profiles
from hermes_actors.store.os_errors import PathFacts, blocked_at, os_error_message

# what the commands import when they run, imported before the fork: the child (uid 65534) need read no code
PRELOADED = (hermes_actors.cli.ops_commands, hermes_actors.cli.send, hermes_actors.hermes.setup,
             hermes_actors.hermes.submit_client)

NOBODY = 65534
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="running as another uid needs root")


def step(path: str, kind: str = "directory", *, owner: int = 1000, mode: int = 0o755, may: str = "rwx") -> PathFacts:
    """One step of a path: ``may`` as letters (``r`` read, ``w`` write, ``x`` enter)."""
    return PathFacts(path, kind, owner, mode, frozenset(a for a, bit in (("read", "r"), ("write", "w"),
                                                                        ("enter", "x")) if bit in may))


TOP = step("/", owner=0, may="rx")
MINE = step("/r")

BLOCKED = [
    ("another user's directory on the way", "/r/bot_relay/run", [TOP, MINE, step("/r/bot_relay", owner=0, mode=0o700,
                                                                                   may="")],
     "/r/bot_relay belongs to uid 0, not to you (uid 1000), and its mode 0700 does not let you enter it: make it "
     "yours again (chown -R me /r/bot_relay, as root)"),
    ("your root at 0000", "/r", [TOP, step("/r", mode=0, may="")],
     "/r is yours but its mode 0000 does not let you list, write in or enter it: chmod u+rwx /r"),
    ("a directory above the root", "/p/r", [TOP, step("/p", owner=0, mode=0o700, may="")],
     "/p belongs to uid 0, not to you (uid 1000), and its mode 0700 does not let you enter it: have its owner let "
     "you enter it, or run hermes-actors as the user hermes runs as"),
    ("a file where a directory belongs", "/r/bot_relay/hermes-actors-enable.json",
     [TOP, MINE, step("/r/bot_relay", "file", mode=0o600, may="rw")],
     "/r/bot_relay is a file, not a directory: move it aside, so that a directory can be made there"),
    ("your unreadable file", "/r/config.yaml", [TOP, MINE, step("/r/config.yaml", "file", mode=0, may="")],
     "/r/config.yaml is yours but its mode 0000 does not let you read or write it: chmod u+rw /r/config.yaml"),
    ("another user's file", "/r/config.yaml", [TOP, MINE, step("/r/config.yaml", "file", owner=0, mode=0o600,
                                                               may="")],
     "/r/config.yaml belongs to uid 0, not to you (uid 1000), and its mode 0600 does not let you read or write "
     "it: make it yours again (chown me /r/config.yaml, as root)"),
    ("a file in a directory you may not write in", "/r/config.yaml",
     [TOP, step("/r", mode=0o555, may="rx"), step("/r/config.yaml", "file", mode=0o644, may="rw")],
     "/r is yours but its mode 0555 does not let you write in it: chmod u+w /r"),
    ("a missing one in a directory you may not write in", "/r/bot_relay/run",
     [TOP, MINE, step("/r/bot_relay", mode=0o500, may="rx"), step("/r/bot_relay/run", "missing")],
     "/r/bot_relay is yours but its mode 0500 does not let you write in it: chmod u+w /r/bot_relay"),
    ("a name the shell would split", "/my r/x", [TOP, step("/my r", owner=0, mode=0o700, may="")],
     "/my r belongs to uid 0, not to you (uid 1000), and its mode 0700 does not let you enter it: make it yours "
     "again (chown -R me '/my r', as root)"),
    ("a file that is only read-only", "/r/config.yaml", [TOP, MINE, step("/r/config.yaml", "file", mode=0o444,
                                                                         may="r")],
     "/r/config.yaml is yours but its mode 0444 does not let you write it: chmod u+w /r/config.yaml"),
    ("nothing wrong", "/r/config.yaml", [TOP, MINE, step("/r/config.yaml", "file", mode=0o644, may="rw")], None),
    ("nothing wrong: missing in a directory you may write in", "/r/x", [TOP, MINE, step("/r/x", "missing")], None),
]


@pytest.mark.parametrize(("target", "chain", "says"), [b[1:] for b in BLOCKED], ids=[b[0] for b in BLOCKED])
def test_what_keeps_you_out_is_named_with_what_to_do(target: str, chain: list[PathFacts], says: str | None) -> None:
    root = "/my r" if target.startswith("/my r") else "/r"
    assert blocked_at(target, chain, uid=1000, user="me", root=root) == says


def test_an_error_with_nothing_to_blame_keeps_its_errnos_advice(tmp_path: Path) -> None:
    fine = tmp_path / "fine.json"  # a healthy path: nothing on the way keeps anyone out
    error = PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(fine))
    assert os_error_message(error) == (f"[Errno 13] Permission denied: {str(fine)!r}; fix the permissions: the user "
                                       "running hermes-actors must be able to write there")
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(fine))
    assert os_error_message(full) == f"[Errno 28] No space left on device: {str(fine)!r}; free space on its filesystem"


@pytest.mark.parametrize("command", [["enable"], ["disable"]])
def test_a_file_where_bot_relay_belongs_is_named_with_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """Regression (CLI fuzz review): `error: [Errno 20] Not a directory: '…/bot_relay/hermes-actors-enable.json'`."""
    root = make_root(tmp_path, managed=False)
    relay = root / "bot_relay"
    relay.write_text("x\n", encoding="utf-8")
    assert main([*command, "--root", str(root)]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {relay}/hermes-actors-enable.json: Not a directory (ENOTDIR); {relay} is a file, not a directory: "
        "move it aside, so that a directory can be made there")
    assert not any(p.managed for p in discover_profiles(root))  # nothing was written


# ── as another user ─────────────────────────────────────────────────────────


def as_nobody(argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)`` in a forked child running as uid and gid 65534: its exit code, stdout and stderr."""
    return call_as_nobody(lambda: main(argv))


def _import_all_of_ours() -> None:
    """Import every module of ``hermes_actors`` and ``actors`` in this process, before a child drops to uid 65534.

    The child may not read the checkout (a clone under a 0700 directory, as CI's in mktemp's), so a module it
    imports lazily would fail there with ModuleNotFoundError when this test file runs alone; the whole suite had
    always imported them before.
    """
    import actors
    import hermes_actors

    for package in (hermes_actors, actors):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            try:
                importlib.import_module(info.name)
            except ImportError:  # an optional extra not installed: nothing of it runs in these tests
                pass


def call_as_nobody(fn: Callable[[], Any]) -> tuple[Any, str, str]:
    """``fn()`` in a forked child running as uid and gid 65534: what it returned (JSON), its stdout and stderr
    (-1 and the exception on stderr when it raised)."""
    _import_all_of_ours()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        result: Any = -1
        out, err = io.StringIO(), io.StringIO()
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                result = fn()
        except BaseException as exc:  # a SystemExit, or a bug: said to the parent
            err.write(f"the child raised {exc!r}")
        finally:
            os.write(write, json.dumps([result, out.getvalue(), err.getvalue()]).encode())
            os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    result, out, err = json.loads(b"".join(chunks))
    return result, str(out), str(err)


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory uid 65534 can reach (pytest's own are root's, 0700)."""
    made = Path(tempfile.mkdtemp(prefix="hermes-actors-access-"))
    made.chmod(0o755)
    yield made
    shutil.rmtree(made)


def nobodys_root(base: Path) -> Path:
    """A root of uid 65534 (every file of it), never enabled."""
    root = make_root(base, managed=False)
    for path in [root, *root.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
    return root


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


def last_error(err: str) -> str:
    return err.strip().splitlines()[-1] if err.strip() else ""


@ROOT_ONLY
@pytest.mark.parametrize(("command", "file"), [
    (["roster"], "run"),
    (["send", "--runner", "demo", "--from", "alice", "bob", "hi"], "run"),
    (["enable"], "hermes-actors-enable.json"),
    (["disable"], "hermes-actors-enable.json"),
], ids=lambda c: c[0] if isinstance(c, list) else c)
def test_a_bot_relay_of_another_user_is_named_with_the_chown_that_fixes_it(
    base: Path, command: list[str], file: str
) -> None:
    """Regression (CLI fuzz review): with bot_relay/ another user's (root's, 0700), roster and send said `error:
    [Errno 13] Permission denied: '…/bot_relay/run'`, enable and disable the same of `…/hermes-actors-enable.json`,
    with exit 2 (usage). Now: the path, the directory that keeps you out, the chown; exit 1 (it failed: the command
    line was right)."""
    root = nobodys_root(base)
    relay = root / "bot_relay"
    relay.mkdir(mode=0o700)  # root's
    before = _tree(root)
    code, out, err = as_nobody([command[0], "--root", str(root), *command[1:]])
    assert (code, last_error(err)) == (1, (
        f"error: {relay / file}: Permission denied (EACCES); {relay} belongs to uid 0, not to you (uid {NOBODY}), "
        f"and its mode 0700 does not let you enter it: make it yours again (chown -R {pwd.getpwuid(NOBODY).pw_name} "
        f"{relay}, as root)")), (out, err)
    assert _tree(root) == before


@ROOT_ONLY
@pytest.mark.parametrize("command", ["status", "enable"])
def test_your_root_at_mode_0000_is_named_with_the_chmod_that_fixes_it(base: Path, command: str) -> None:
    """Regression (CLI fuzz review): `error: [Errno 13] Permission denied: '<root>/config.yaml'`: the file, not the
    root that keeps you out. A root you cannot use is answered as one of another user (operations.md: exit 2)."""
    root = nobodys_root(base)
    root.chmod(0)
    code, out, err = as_nobody([command, "--root", str(root)])
    assert (code, last_error(err)) == (2, (
        f"error: Hermes root {str(root)!r} cannot be used: {root} is yours but its mode 0000 does not let you list, "
        f"write in or enter it: chmod u+rwx {root}")), (out, err)


@ROOT_ONLY
@pytest.mark.parametrize("command", ["status", "enable"])
def test_a_root_behind_a_directory_you_cannot_enter_names_that_directory(base: Path, command: str) -> None:
    """Regression (CLI fuzz review): a bare `error: [Errno 13] Permission denied: '<root>'`."""
    locked = base / "locked"
    locked.mkdir(mode=0o700)  # root's
    root = nobodys_root(locked)
    code, out, err = as_nobody([command, "--root", str(root)])
    assert (code, last_error(err)) == (2, (
        f"error: Hermes root {str(root)!r} cannot be reached: {locked} belongs to uid 0, not to you (uid {NOBODY}), "
        "and its mode 0700 does not let you enter it: have its owner let you enter it, or run hermes-actors as the "
        "user hermes runs as")), (out, err)


@ROOT_ONLY
@pytest.mark.parametrize("unreadable", ["config.yaml", "profiles/carol/profile.yaml"])
def test_enable_names_a_yaml_file_you_cannot_read_and_writes_nothing(base: Path, unreadable: str) -> None:
    """Regression (CLI fuzz review): `error: [Errno 13] Permission denied: '…/profile.yaml'`, exit 2, after enable
    had written the files of the profiles before it."""
    root = nobodys_root(base)
    bad = root / unreadable
    bad.write_text("model: {}\n", encoding="utf-8")
    os.chown(bad, NOBODY, NOBODY)
    bad.chmod(0)
    before = _tree(root)
    code, out, err = as_nobody(["enable", "--root", str(root)])
    assert (code, last_error(err)) == (1, (
        f"error: {bad}: Permission denied (EACCES); {bad} is yours but its mode 0000 does not let you read or write "
        f"it: chmod u+rw {bad}")), (out, err)
    assert _tree(root) == before


def test_a_hermes_beside_python_in_a_directory_you_cannot_enter_is_looked_for_on_path(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (CI in a fresh clone under a 0700 directory): looking for ``hermes`` beside the interpreter
    raised PermissionError (``Path.is_file`` passes EACCES on), so ``enable`` run by a user who may not enter
    that directory failed naming the venv's ``bin/hermes`` instead of what it was there to say; it is not found
    there, and PATH is looked at."""
    hidden = base / "hidden"
    (hidden / "bin").mkdir(parents=True)
    (hidden / "bin" / "hermes").write_text("#!/bin/sh\n", encoding="utf-8")
    (hidden / "bin" / "hermes").chmod(0o755)
    hidden.chmod(0o700)  # root's: uid 65534 may not enter it
    on_path = base / "path"
    on_path.mkdir(mode=0o755)
    (on_path / "hermes").write_text("#!/bin/sh\n", encoding="utf-8")
    (on_path / "hermes").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(hidden / "bin" / "python"))
    monkeypatch.delenv(CLI_ENV_VAR, raising=False)
    monkeypatch.setenv("PATH", str(on_path))
    assert call_as_nobody(find_hermes_cli) == (str(on_path / "hermes"), "", "")
    # and the lookup every runner and the peer transport make at a Gateway's start (it raised there too: a durable
    # start by such a user failed with PermissionError naming the venv's bin/hermes)
    assert call_as_nobody(resolve_cli) == (str(on_path / "hermes"), "", "")
