"""The real ``hermes`` CLI as a turn runner: one CLI process per turn attempt.

:class:`CommandRunner` runs one turn in the turn's session (``turn.session``: "Bot Chat"
for a DM, "Group: <name>" for a room's member turn),
with the message in a query file. It runs in the caller's thread (a
ProfileActor's worker) and starts no threads of its own.

Query-file lifetime: the file of a delivery is written on attempt 1 and kept
when attempt 1 fails with a possibly retryable outcome, so the policy retry
(attempt 2) replays the very same file. ``run_turn`` removes it after a
success, after any attempt-2 outcome and after a final refusal
(``target_busy``). When the caller decides NOT to retry a failed attempt 1,
it must call :meth:`CommandRunner.release` with the delivery id;
:meth:`CommandRunner.close` releases every file still kept.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from loguru import logger

from hermes_actors.errors import TurnFailed
from hermes_actors.facade.args import checked_cli, checked_env, positive_seconds
from hermes_actors.local import dm_files as dmfiles
from hermes_actors.local.cli_process import (
    REAP_SECONDS,
    CliResult,
    busy_text,
    exit_failure_text,
    kill_group,
    refused_not_owned,
    resolve_cli,
    run_cli_process,
)
from hermes_actors.messages import BOT_CHAT_SESSION, Turn

__all__ = ["BOT_CHAT_TURN_ARGS", "CommandRunner", "chat_args"]


def chat_args(session: str) -> tuple[str, ...]:
    """Pure: the ``hermes chat`` arguments of a turn in ``session`` (created when missing)."""
    return ("chat", "--in", "~", "-c", session, "--create-if-missing", "-Q")


BOT_CHAT_TURN_ARGS: tuple[str, ...] = chat_args(BOT_CHAT_SESSION)
# Turn-specific variables: never inherited from our own environment.
_ENV_RESUME = "HERMES_RESUME_UNANSWERED_TURN"
_ENV_COMPRESS = "HERMES_COMPRESS_BEFORE_TURN"
_ENV_AUTHOR = "HERMES_TURN_AUTHOR"
_ENV_HOME = "HERMES_HOME"
# Outcomes that are final on attempt 1 (the policy never retries them).
_FINAL_REASONS = frozenset({"target_busy"})


def _strip_trailing_newlines(text: str) -> str:
    return text.rstrip("\r\n")


class CommandRunner:
    """Runs one turn with the real CLI (``hermes -p <profile> chat ... --query-file <f>``).

    Args:
        cli: the executable, a str or a path; :func:`resolve_cli` when None (or "").
        timeout: seconds one turn may take before its process group is killed (a real number above 0:
            an int, a float, a ``Decimal``, a ``Fraction``, numpy's; ``inf``: as
            long as a clock can count).
        dm_base: the temp root for the DM directory (system temp when None).
        env: variables set over ``os.environ`` for every turn: a dict of str to str.

    Raises:
        TypeError: ``cli`` is neither None, a str nor a path (an int, bytes...), ``timeout`` is not a number (a bool,
            a str...), or ``env`` is not a dict of str to str (the key is named).
        ValueError: ``timeout`` is not positive (or NaN), or an ``env`` key is no variable name (empty, or
            holding ``=`` or a NUL) or a value holds a NUL.
    """

    def __init__(
        self,
        cli: str | os.PathLike[str] | None = None,
        *,
        timeout: float = 600,
        dm_base: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        name = checked_cli(cli)
        self.timeout = positive_seconds("timeout", timeout)
        self.env: dict[str, str] = checked_env(env)
        self.cli = name if name else resolve_cli()
        self.dm_base = dm_base
        self._kept: dict[str, Path] = {}
        self._kept_lock = threading.Lock()
        # Turn processes not yet reaped (by delivery id), so stop_turns can end them; notified when one goes.
        self._live: dict[str, subprocess.Popen[bytes]] = {}
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
            kill_group(proc, signal.SIGTERM)
        gone = self._wait_reaped(wanted, grace)
        for proc in procs:  # also when the leader is gone: others of its group may still run
            kill_group(proc, signal.SIGKILL)
        if not gone:
            logger.warning("turn process(es) of {} ignored SIGTERM for {:g}s; killed", sorted(wanted), grace)
            self._wait_reaped(wanted, 2 * REAP_SECONDS)
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
        # the turn's own session: a room's member turn must not run in (and write to) the DM session
        return [self.cli, "-p", turn.profile, *chat_args(turn.session), "--query-file", str(query_file)]

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
            raise TurnFailed(busy_text(turn.profile), reason="target_busy")
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

        def track(proc: subprocess.Popen[bytes]) -> None:
            with self._live_changed:
                self._live[turn.delivery_id] = proc
                ended = turn.delivery_id in self._ended  # stop_turns ran while this one was being started
            if ended:
                kill_group(proc, signal.SIGKILL)

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
