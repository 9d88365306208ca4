"""How a turn actually runs (DESIGN 4.1).

A runner is any object with ``run_turn(turn) -> str`` or a plain callable
``fn(turn) -> str``; :func:`as_runner` turns either into a :class:`TurnRunner`.
The return value is the reply; raising :class:`~hermes_actors.errors.TurnFailed`
fails the turn with a typed reason.

:class:`CommandRunner` runs the real ``hermes`` CLI for one turn, in the
profile's "Bot Chat" session, with the message in a query file. It runs in the
caller's thread (a ProfileActor's worker) and starts no threads of its own.

Query-file lifetime: the file of a delivery is written on attempt 1 and kept
when attempt 1 fails with a possibly retryable outcome, so the policy retry
(attempt 2) replays the very same file. ``run_turn`` removes it after a
success, after any attempt-2 outcome and after a final refusal
(``target_busy``). When the caller decides NOT to retry a failed attempt 1,
it must call :meth:`CommandRunner.release` with the delivery id;
:meth:`CommandRunner.close` releases every file still kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from loguru import logger

from hermes_actors.errors import TurnFailed
from hermes_actors.local import dm_files as dmfiles
from hermes_actors.messages import BOT_CHAT_SESSION, Turn

__all__ = [
    "BOT_CHAT_TURN_ARGS",
    "REFUSAL_MARKER",
    "CallableRunner",
    "CliResult",
    "CommandRunner",
    "TurnRunner",
    "as_runner",
    "busy_text",
    "exit_failure_text",
    "refused_not_owned",
    "resolve_cli",
    "run_cli_process",
]

BOT_CHAT_TURN_ARGS: tuple[str, ...] = (
    "chat", "--in", "~", "-c", BOT_CHAT_SESSION, "--create-if-missing", "-Q",
)
REFUSAL_MARKER = "hermes-refusal-reason: "
_NOT_OWNED_CODE = "SESSION_NOT_OWNED"
_NOT_OWNED_PROSE = "already has a live owner"
_MAX_FAILURE_CHARS = 2000
_REAP_SECONDS = 5.0
# Turn-specific variables: never inherited from our own environment.
_ENV_RESUME = "HERMES_RESUME_UNANSWERED_TURN"
_ENV_COMPRESS = "HERMES_COMPRESS_BEFORE_TURN"
_ENV_AUTHOR = "HERMES_TURN_AUTHOR"
_ENV_HOME = "HERMES_HOME"
# Outcomes that are final on attempt 1 (the policy never retries them).
_FINAL_REASONS = frozenset({"target_busy"})


@runtime_checkable
class TurnRunner(Protocol):
    """Runs one turn and returns the reply text."""

    def run_turn(self, turn: Turn) -> str:
        """Run ``turn`` and return the reply.

        Args:
            turn: the turn to run.

        Returns:
            The reply text ("" or a silence marker is a silent outcome).

        Raises:
            TurnFailed: the turn failed with a typed (or to-be-classified) reason.
        """
        ...


class CallableRunner:
    """A :class:`TurnRunner` around a plain callable ``fn(turn) -> str``.

    Args:
        fn: the callable; its return value is the reply.
    """

    def __init__(self, fn: Callable[[Turn], str]) -> None:
        if not callable(fn):
            raise TypeError(f"CallableRunner needs a callable, got {type(fn).__name__}")
        self.fn = fn

    def run_turn(self, turn: Turn) -> str:
        """Call ``fn(turn)`` and return its reply.

        Args:
            turn: the turn to run.

        Returns:
            The reply ``fn`` returned.

        Raises:
            TypeError: ``fn`` returned something other than a str.
            Exception: whatever ``fn`` raised, unchanged.
        """
        reply = self.fn(turn)
        if not isinstance(reply, str):
            raise TypeError(f"runner {self.fn!r} returned {type(reply).__name__}, expected str")
        return reply

    def __repr__(self) -> str:
        return f"CallableRunner({self.fn!r})"


def as_runner(obj: object) -> TurnRunner:
    """Return ``obj`` as a :class:`TurnRunner`.

    Args:
        obj: an object with a callable ``run_turn`` (returned as is) or a
            plain callable (wrapped in :class:`CallableRunner`).

    Returns:
        The runner.

    Raises:
        TypeError: ``obj`` is neither.
    """
    if callable(getattr(obj, "run_turn", None)):
        return obj  # type: ignore[return-value]
    if callable(obj):
        return CallableRunner(obj)
    raise TypeError(
        "runner must be an object with run_turn(turn) -> str or a callable fn(turn) -> str, "
        f"got {type(obj).__name__}"
    )


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
    if sys.executable:
        sibling = Path(sys.executable).parent / (f"{name}.exe" if sys.platform == "win32" else name)
        if sibling.is_file():
            return str(sibling)
    return shutil.which(name) or name


def _strip_trailing_newlines(text: str) -> str:
    return text.rstrip("\r\n")


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


_refused_not_owned = refused_not_owned  # the name older tests use


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


def _kill_group(proc: subprocess.Popen[str], sig: int = signal.SIGKILL) -> None:
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


class CommandRunner:
    """Runs one turn with the real CLI (``hermes -p <profile> chat ... --query-file <f>``).

    Args:
        cli: the executable; :func:`resolve_cli` when None.
        timeout: seconds one turn may take before its process group is killed.
        dm_base: the temp root for the DM directory (system temp when None).
        env: variables set over ``os.environ`` for every turn.

    Raises:
        ValueError: ``timeout`` is not positive.
    """

    def __init__(
        self,
        cli: str | None = None,
        *,
        timeout: float = 600,
        dm_base: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.cli = cli if cli else resolve_cli()
        self.timeout = float(timeout)
        self.dm_base = dm_base
        self.env: dict[str, str] = dict(env or {})
        self._kept: dict[str, Path] = {}
        self._kept_lock = threading.Lock()
        # Turn processes not yet reaped (by delivery id), so stop_turns can end them; notified when one goes.
        self._live: dict[str, subprocess.Popen[str]] = {}
        self._live_changed = threading.Condition()
        self._ended: set[str] = set()  # deliveries stop_turns ended: no further attempt until released

    def __repr__(self) -> str:
        return f"CommandRunner(cli={self.cli!r}, timeout={self.timeout:g})"

    # ── query-file lifetime ─────────────────────────────────────────────────

    def release(self, delivery_id: str) -> None:
        """Remove the query file kept for ``delivery_id`` (no-op when none is kept).

        Call it when a failed attempt 1 will not be retried.

        Args:
            delivery_id: the delivery whose file to remove.
        """
        with self._live_changed:
            self._ended.discard(delivery_id)
        with self._kept_lock:
            path = self._kept.pop(delivery_id, None)
        if path is not None:
            dmfiles.remove_dm_file(path)

    def kept(self) -> list[str]:
        """Return the delivery ids whose query files are kept for a retry.

        Returns:
            The ids, in no particular order.
        """
        with self._kept_lock:
            return list(self._kept)

    def close(self) -> None:
        """Release every kept query file (the runner stays usable)."""
        for delivery_id in self.kept():
            self.release(delivery_id)

    def _keep(self, delivery_id: str, path: Path) -> None:
        with self._kept_lock:
            self._kept[delivery_id] = path

    # ── ending running turns (gateway stop) ─────────────────────────────────

    def running_turns(self) -> list[str]:
        """Return the delivery ids whose turn process is running (started and not yet reaped).

        Returns:
            The ids, in no particular order.
        """
        with self._live_changed:
            return list(self._live)

    def stop_turns(self, delivery_ids: Iterable[str] | None = None, *, grace: float = 3.0) -> int:
        """End running turns' whole process groups: SIGTERM, then SIGKILL after ``grace`` seconds.

        Returns once each such turn process has been reaped (bounded: an escaped
        grandchild holding the pipes is cut off as in a timeout). The ended
        deliveries run no further attempt here until :meth:`release`; the caller
        decides their outcome (a stopping gateway reports them ``ambiguous``).

        Args:
            delivery_ids: the deliveries whose turns to end (None: every running turn).
            grace: seconds between SIGTERM and SIGKILL.

        Returns:
            How many turn processes were running among them.
        """
        with self._live_changed:
            wanted = set(self._live) if delivery_ids is None else set(delivery_ids)
            self._ended |= wanted
            procs = [proc for key, proc in self._live.items() if key in wanted]
        if not procs:
            return 0
        for proc in procs:
            _kill_group(proc, signal.SIGTERM)
        gone = self._wait_reaped(wanted, grace)
        for proc in procs:  # also when the leader is gone: others of its group may still run
            _kill_group(proc, signal.SIGKILL)
        if not gone:
            logger.warning("turn process(es) of {} ignored SIGTERM for {:g}s; killed", sorted(wanted), grace)
            self._wait_reaped(wanted, 2 * _REAP_SECONDS)
        return len(procs)

    def _wait_reaped(self, delivery_ids: set[str], seconds: float) -> bool:
        with self._live_changed:
            return self._live_changed.wait_for(
                lambda: not delivery_ids.intersection(self._live), timeout=max(0.0, seconds)
            )

    # ── one turn ────────────────────────────────────────────────────────────

    def argv(self, turn: Turn, query_file: Path) -> list[str]:
        """Return the command line of ``turn``.

        Args:
            turn: the turn.
            query_file: the file holding the message.

        Returns:
            The argv list.
        """
        return [self.cli, "-p", turn.profile, *BOT_CHAT_TURN_ARGS, "--query-file", str(query_file)]

    def environment(self, turn: Turn) -> dict[str, str]:
        """Return the environment of ``turn``'s process.

        Args:
            turn: the turn.

        Returns:
            ``os.environ`` + the constructor's ``env`` + the turn's variables:
            the attempt-2 resume (and compress) flags, the author as compact
            JSON and ``HERMES_HOME`` when the turn has a home.
        """
        env = {**os.environ, **self.env}
        for key in (_ENV_RESUME, _ENV_COMPRESS, _ENV_AUTHOR):
            env.pop(key, None)
        if turn.attempt >= 2:
            env[_ENV_RESUME] = "1"
            if turn.retry_action == "compress_then_resume":
                env[_ENV_COMPRESS] = "1"
        if turn.author:
            env[_ENV_AUTHOR] = json.dumps(turn.author, separators=(",", ":"), default=str)
        if turn.home is not None:
            env[_ENV_HOME] = str(turn.home)
        return env

    def run_turn(self, turn: Turn) -> str:
        """Run ``turn`` through the CLI and return its reply (stdout).

        Args:
            turn: the turn; ``turn.delivery_id`` names the query file.

        Returns:
            The CLI's stdout without trailing newlines.

        Raises:
            TurnFailed: ``target_busy`` (the session is owned by another
                surface), ``delivery_timeout`` (killed after ``timeout``),
                ``runtime_offline`` (the CLI is missing), or reason "" with
                the CLI's last output lines for any other non-zero exit.
            ValueError / PermissionError / OSError: the query file could not
                be written.
        """
        path = dmfiles.write_dm_file(turn.delivery_id, turn.content, base=self.dm_base)
        self._keep(turn.delivery_id, path)
        try:
            reply = self._run(turn, path)
        except TurnFailed as failure:
            if turn.attempt >= 2 or failure.reason in _FINAL_REASONS:
                self.release(turn.delivery_id)
            else:
                logger.debug("keeping {} for a possible retry of {}", path, turn.delivery_id)
            raise
        except BaseException:
            self.release(turn.delivery_id)
            raise
        self.release(turn.delivery_id)
        return reply

    def _was_ended(self, delivery_id: str) -> bool:
        with self._live_changed:
            return delivery_id in self._ended

    def _run(self, turn: Turn, query_file: Path) -> str:
        handle = turn.handle or turn.profile
        argv = self.argv(turn, query_file)
        logger.debug("turn {} attempt {}: {}", turn.delivery_id, turn.attempt, argv)
        done = self._run_process(turn, argv, handle)
        if done.returncode == 0:
            return _strip_trailing_newlines(done.stdout)
        if refused_not_owned(done.stderr):
            raise TurnFailed(busy_text(handle), reason="target_busy")
        text = exit_failure_text(done)
        logger.info("turn {} for @{} failed: {}", turn.delivery_id, handle, text.splitlines()[0])
        raise TurnFailed(text)

    def _run_process(self, turn: Turn, argv: list[str], handle: str, cwd: Path | None = None) -> CliResult:
        """Run the turn's process, tracked so :meth:`stop_turns` can end it; the turn lock's fd goes to the child.

        Raises:
            TurnFailed: ``cancelled`` when the gateway stopped the turn; else as :func:`run_cli_process`.
        """
        if self._was_ended(turn.delivery_id):
            raise TurnFailed(f"@{handle}'s turn was ended because the gateway stopped", reason="cancelled")

        def track(proc: subprocess.Popen[str]) -> None:
            with self._live_changed:
                self._live[turn.delivery_id] = proc
                ended = turn.delivery_id in self._ended  # stop_turns ran while this one was being started
            if ended:
                _kill_group(proc, signal.SIGKILL)

        try:
            done = run_cli_process(
                argv,
                env=self.environment(turn),
                timeout=self.timeout,
                handle=handle,
                cwd=cwd,
                pass_fds=(turn.lock_fd,) if turn.lock_fd is not None else (),
                on_start=track,
            )
        finally:
            with self._live_changed:
                self._live.pop(turn.delivery_id, None)
                self._live_changed.notify_all()
        if self._was_ended(turn.delivery_id):
            raise TurnFailed(f"@{handle}'s turn was ended because the gateway stopped", reason="cancelled")
        return done


# ── one CLI process (shared by every CLI runner) ────────────────────────────


@dataclass(frozen=True, slots=True)
class CliResult:
    """What one finished CLI process left: its output and exit status."""

    stdout: str
    stderr: str
    returncode: int


def busy_text(handle: str) -> str:
    """The ``target_busy`` failure text of a turn another surface refused.

    Args:
        handle: the target's handle.

    Returns:
        The text the sender reads.
    """
    return (
        f"Delivery failed: @{handle}'s Bot Chat is open on another surface right now, "
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
    on_start: Callable[[subprocess.Popen[str]], None] | None = None,
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
    cli = argv[0]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            encoding="utf-8",
            errors="replace",
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
        raise TurnFailed(
            f"hermes CLI not found at {cli} — install Hermes or pass cli=...",
            reason="runtime_offline",
        ) from None
    except PermissionError:
        raise TurnFailed(
            f"hermes CLI at {cli} is not executable — fix its permissions or pass cli=...",
            reason="runtime_offline",
        ) from None
    except OSError as exc:
        raise TurnFailed(f"hermes CLI at {cli} could not start: {exc}", reason="runtime_offline") from None
    try:
        if on_start is not None:
            on_start(proc)
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        _reap(proc)
        raise TurnFailed(
            f"hermes timed out after {timeout:g}s running @{handle}'s Bot Chat turn; "
            "its process group was killed",
            reason="delivery_timeout",
        ) from None
    except BaseException:
        _kill_group(proc)
        _reap(proc)
        raise
    return CliResult(stdout or "", stderr or "", proc.returncode)


def _reap(proc: subprocess.Popen[str]) -> None:
    """Collect a killed process (bounded: an escaped grandchild may hold the pipes)."""
    try:
        proc.communicate(timeout=_REAP_SECONDS)
    except subprocess.TimeoutExpired:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_REAP_SECONDS)
