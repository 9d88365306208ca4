"""One CLI process of a turn, shared by every CLI runner: start it, wait for it, read what it left.

The process runs in its own process group with stdin = /dev/null and is killed
as a group (on timeout, or when the runner ends it at stop). Its output goes to
unlinked temporary files, not pipes: a turn's process must outlive a host that
dies (kill -9) under it. With pipes, a child still starting up died of the
broken pipe before it stored the DM, after the DM's start was journaled — so the
restarted host reported a turn that never ran as "may have been delivered", and
a wake was lost for good. With files the orphan finishes its turn under its
flock. The texts a sender reads for a refused or failed process are made here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from hermes_actors.core.outcomes import INSTALL_HERMES, NAME_THE_CLI
from hermes_actors.errors import TurnFailed

__all__ = [
    "REAP_SECONDS",
    "REFUSAL_MARKER",
    "CliResult",
    "beside_interpreter",
    "busy_text",
    "exit_failure_text",
    "kill_group",
    "reap",
    "refused_not_owned",
    "resolve_cli",
    "run_cli_process",
]

REFUSAL_MARKER = "hermes-refusal-reason: "
_NOT_OWNED_CODE = "SESSION_NOT_OWNED"
_NOT_OWNED_PROSE = "already has a live owner"
_MAX_FAILURE_CHARS = 2000
REAP_SECONDS = 5.0  # how long a killed process gets to be collected
# What is read of a process's output: its stdout holds the reply (cut past 4 MiB where the outcome is made),
# its stderr matters for its last lines only.
_STDOUT_READ_BYTES = 16 << 20
_STDERR_READ_BYTES = 1 << 20


def resolve_cli(name: str = "hermes") -> str:
    """Find the ``hermes`` executable.

    Service contexts often lack PATH, so the executable beside the running
    interpreter (the same virtualenv) wins, then ``shutil.which``, then the
    bare name.

    Args:
        name: the executable's name (``.exe`` is added on Windows for the sibling).

    Returns:
        The path (or bare name) to run.
    """
    return beside_interpreter(name) or shutil.which(name) or name


def beside_interpreter(name: str) -> str | None:
    """The executable ``name`` beside the running interpreter (the same virtualenv), if there is one.

    The one rule for looking there (:func:`resolve_cli`, and ``find_hermes_cli`` of the hermes layer): a
    directory on the way this user may not enter (EACCES: a checkout under another user's 0700 directory) means
    not found there, never an error.

    Args:
        name: the executable's name (``.exe`` is added on Windows).

    Returns:
        Its path, or None when there is no executable file of that name there (or it cannot be looked at).
    """
    if not sys.executable:
        return None
    sibling = Path(sys.executable).parent / (f"{name}.exe" if sys.platform == "win32" else name)
    try:
        found = sibling.is_file() and os.access(sibling, os.X_OK)
    except OSError:
        found = False
    return str(sibling) if found else None


def refused_not_owned(stderr: str) -> bool:
    """True when the CLI refused the turn because another surface owns the session.

    A marker line's code wins over prose (also an unknown code from a newer
    CLI); only without a marker does the older CLIs' wording count.

    Args:
        stderr: the CLI's stderr.

    Returns:
        True for a ``SESSION_NOT_OWNED`` marker or the "already has a live owner" prose.
    """
    for line in stderr.splitlines():
        if line.startswith(REFUSAL_MARKER):
            return line.removeprefix(REFUSAL_MARKER).strip() == _NOT_OWNED_CODE
    return _NOT_OWNED_PROSE in stderr


def _tail(text: str, limit: int = _MAX_FAILURE_CHARS) -> str:
    """The last non-empty lines of ``text``, at most ``limit`` characters in all."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        extra = len(line) + (1 if kept else 0)
        if size + extra > limit:
            if not kept:
                kept.append(line[-limit:])
            break
        kept.append(line)
        size += extra
    return "\n".join(reversed(kept))


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Signal the turn's whole process group (it was started in its own session)."""
    try:
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, sig)
        elif sig == signal.SIGKILL:
            proc.kill()
        else:
            proc.terminate()
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(OSError):
            proc.send_signal(sig)


@dataclass(frozen=True, slots=True)
class CliResult:
    """What one finished CLI process left: its output and exit status."""

    stdout: str
    stderr: str
    returncode: int


def busy_text(profile: str) -> str:
    """The ``target_busy`` failure text of a turn another surface refused.

    Args:
        profile: the profile the CLI ran as (its ``-p``): the seed names it so, ``@default`` included.

    Returns:
        The text the sender reads.
    """
    return (
        f"Delivery failed: @{profile}'s Bot Chat is open on another surface right now, "
        "so your message was NOT delivered. Try again later."
    )


def exit_failure_text(done: CliResult) -> str:
    """The failure text of a CLI process that exited non-zero.

    Args:
        done: the finished process.

    Returns:
        ``hermes exited with status N: <last lines of stderr, else stdout>``.
    """
    detail = _tail(done.stderr if done.stderr.strip() else done.stdout)
    if detail:
        return f"hermes exited with status {done.returncode}: {detail}"
    return f"hermes exited with status {done.returncode} (no output)"


def run_cli_process(
    argv: list[str],
    *,
    env: Mapping[str, str],
    timeout: float,
    handle: str,
    cwd: Path | None = None,
    pass_fds: tuple[int, ...] = (),
    on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> CliResult:
    """Run one turn's CLI process in its own process group, stdin = /dev/null.

    Args:
        argv: the command line (``argv[0]`` is the CLI).
        env: the process's whole environment.
        timeout: seconds before the whole process group is killed.
        handle: the target's handle (for failure texts).
        cwd: the working directory (inherited when None).
        pass_fds: descriptors the child inherits (the turn lock's: the flock lives as long as the child).
        on_start: called with the started process before it is waited for (a runner tracks it to end it
            at stop); if it raises, the process group is killed and the error propagates.

    Returns:
        The finished process's output and exit status.

    Raises:
        TurnFailed: ``runtime_offline`` (the CLI is missing or not
            executable, or the directory is unusable) or ``delivery_timeout``
            (killed after ``timeout``).
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = _start(argv, env=env, handle=handle, cwd=cwd, pass_fds=pass_fds, out=out, err=err)
        try:
            if on_start is not None:
                on_start(proc)
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            reap(proc)
            raise TurnFailed(
                f"hermes timed out after {timeout:g}s running @{handle}'s Bot Chat turn; "
                "its process group was killed",
                reason="delivery_timeout",
            ) from None
        except BaseException:
            kill_group(proc)
            reap(proc)
            raise
        return CliResult(_read_head(out, _STDOUT_READ_BYTES), _read_tail(err, _STDERR_READ_BYTES), proc.returncode)


def _start(
    argv: list[str], *, env: Mapping[str, str], handle: str, cwd: Path | None, pass_fds: tuple[int, ...],
    out: IO[bytes], err: IO[bytes],
) -> subprocess.Popen[bytes]:
    """Start the process (see :func:`run_cli_process`); a start that fails is ``runtime_offline``."""
    cli = argv[0]
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=dict(env),
            cwd=str(cwd) if cwd is not None else None,
            start_new_session=True,
            pass_fds=pass_fds,
        )
    except FileNotFoundError:
        if cwd is not None and not cwd.is_dir():
            raise TurnFailed(
                f"@{handle}'s profile home {cwd} does not exist — the profile is gone or the root is wrong",
                reason="runtime_offline",
            ) from None
        # both spellings of naming it: a turn's failure reaches command-line users and Python embedders alike
        raise TurnFailed(
            f"hermes CLI not found at {cli} — {INSTALL_HERMES}, or name the executable: {NAME_THE_CLI}",
            reason="runtime_offline",
        ) from None
    except PermissionError:
        raise TurnFailed(
            f"hermes CLI at {cli} is not executable — fix its permissions, or name another: {NAME_THE_CLI}",
            reason="runtime_offline",
        ) from None
    except OSError as exc:
        raise TurnFailed(f"hermes CLI at {cli} could not start: {exc}", reason="runtime_offline") from None


def _read_head(stream: IO[bytes], limit: int) -> str:
    """The first ``limit`` bytes the process wrote to ``stream``, as text."""
    stream.seek(0)
    return stream.read(limit).decode("utf-8", "replace")


def _read_tail(stream: IO[bytes], limit: int) -> str:
    """The last ``limit`` bytes the process wrote to ``stream``, as text (a cut character is replaced)."""
    end = stream.seek(0, os.SEEK_END)
    stream.seek(max(0, end - limit))
    return stream.read(limit).decode("utf-8", "replace")


def reap(proc: subprocess.Popen[bytes]) -> None:
    """Collect a killed process, waiting a bounded time."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=REAP_SECONDS)
