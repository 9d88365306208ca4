"""One turn with the installed ``hermes`` CLI, in the profile's "Bot Chat" session.

The command line follows what the install supports (detected once per binary
from ``hermes chat --help``):

- hermes-agent 0.19: ``hermes -p NAME chat -c "Bot Chat" -Q --no-restore-cwd
  --query=TEXT``, run with cwd = the profile home (the session's cwd is not
  restored, so nothing is printed before the reply), the titled session
  created first when missing (0.19's ``-c`` exits 1 on a missing title), the
  text on the command line (one argument may not exceed 128 KiB on Linux, so
  text over 100 KiB is refused clearly);
- releases with ``--query-file``/``--create-if-missing``/``--in`` get those
  flags instead (the query file's lifetime is :class:`CommandRunner`'s).

``--query=TEXT`` (not ``-q TEXT``) keeps a message that starts with ``-`` a value.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from loguru import logger

from hermes_actors.core.reasons import MISSING_CONFIG, RUNTIME_OFFLINE, UNKNOWN
from hermes_actors.errors import TurnFailed
from hermes_actors.facade.args import checked_cli
from hermes_actors.hermes.cli_output import reply_or_failure
from hermes_actors.hermes.gateway_process import gateway_pid
from hermes_actors.hermes.install import (
    INSTALL_HERMES,
    NAME_THE_CLI,
    ChatFlags,
    cli_not_found_text,
    cli_profile_name,
    detect_chat_flags,
    find_hermes_cli,
    home_names_no_model,
    profile_home,
    root_of_home,
)
from hermes_actors.hermes.plugin import HOP_ENV
from hermes_actors.hermes.retry import prepare_bot_chat_retry, take_back_unanswered, text_stored_since
from hermes_actors.hermes.sessions import BotChatError, ensure_bot_chat
from hermes_actors.local.command_runner import CommandRunner
from hermes_actors.messages import Turn
from hermes_actors.store.turnlock import TurnLock, turn_lock_path

__all__ = ["MAX_ARGV_TEXT_BYTES", "HermesCliRunner", "never_reached", "no_model_failure", "turn_home", "turn_root"]

MAX_ARGV_TEXT_BYTES = 100 * 1024


def turn_home(turn: Turn) -> Path:
    """The profile home a turn runs in.

    Args:
        turn: the turn (``home`` wins; else ``root`` + ``profile``).

    Returns:
        The home.

    Raises:
        TurnFailed: ``runtime_offline`` when the turn has neither.
    """
    if turn.home is not None:
        return Path(turn.home)
    if turn.root is not None:
        return profile_home(Path(turn.root), turn.profile)
    raise TurnFailed(f"@{turn.handle or turn.profile}'s turn names no profile home or root", reason=RUNTIME_OFFLINE)


def turn_root(turn: Turn) -> Path:
    """The Hermes root a turn's profile lives in (``HERMES_HOME`` of its process and of the gateway).

    Args:
        turn: the turn (``root`` wins; else the root of its home).

    Returns:
        The root.

    Raises:
        TurnFailed: ``runtime_offline`` when the turn has neither a root nor a home.
    """
    return Path(turn.root) if turn.root is not None else root_of_home(turn_home(turn))


def no_model_failure(turn: Turn, handle: str, detail: str) -> TurnFailed | None:
    """The ``missing_config`` failure of a turn whose profile names no model: one text for CLI and warm turns.

    hermes' own words for it mislead: the CLI prints its setup wizard (``hermes config set model.provider
    custom`` …, without ``-p NAME``: those commands edit the root profile, not the bot's), the API server
    answers a bare 500. This names the bot's own ``config.yaml`` and what to set there.

    Args:
        turn: the failed turn.
        handle: the target's handle.
        detail: what hermes said, one line (appended after the text).

    Returns:
        The failure; None when the profile names a model, its ``config.yaml`` does not read, or the turn
        names no home (then hermes' failure stands).
    """
    try:
        home = turn_home(turn)
    except TurnFailed:
        return None
    if home_names_no_model(home) is not True:
        return None
    return TurnFailed(f"@{handle} has no model: {home / 'config.yaml'} names none, so hermes cannot run its turns "
                      f"(set model.default and its provider there) — {detail}", reason=MISSING_CONFIG)


def never_reached(turn: Turn, since: float) -> bool:
    """Whether a turn a previous host started (and died in) provably never reached the bot: it never ran.

    Provably: nothing that may still run it lives on (no hermes gateway but this process, which
    may have taken its warm request; no hermes CLI process of it, which would hold the bot's turn
    lock it inherited), and the bot's ``state.db`` holds no user message with its text since
    ``since`` (hermes stores it as the turn begins). Anything else, or what cannot be told, is False.

    Args:
        turn: the turn, as it would run now.
        since: the wall-clock time before which it cannot have begun (its delivery's acceptance).

    Returns:
        True only when it provably never ran.
    """
    try:
        root, home = turn_root(turn), turn_home(turn)
    except TurnFailed:  # no home for the turn: cannot tell
        return False
    pid = gateway_pid(root)
    if pid is not None and pid != os.getpid():
        return False  # a live gateway that is not this process may have taken it and store it yet
    lock = TurnLock(turn_lock_path(root, turn.profile))
    try:
        if not lock.try_acquire():
            return False  # held: a CLI process the dead host started (or a turn of this host) may be running it
        lock.release()  # free: no process of a turn holds it, and none of the dead host's is left to start
    except OSError:
        return False
    finally:
        lock.close()
    return text_stored_since(home, turn.content, since) is False


class HermesCliRunner(CommandRunner):
    """Runs one Bot Chat turn with the installed hermes CLI (any supported release).

    Args:
        cli: the executable (path or name); found by
            :func:`~hermes_actors.hermes.install.find_hermes_cli` when None.
        timeout: seconds one turn may take before its process group is killed.
        dm_base: the temp root for query files (releases with ``--query-file``).
        env: variables set over ``os.environ`` for every turn.
        flags: the chat flags to use; detected from ``hermes chat --help`` when None.

    Raises:
        TypeError, ValueError: a bad ``cli``, ``timeout`` or ``env``, as :class:`CommandRunner`'s (``cli`` is checked
            before it is looked up).
    """

    real_hermes = True  # turns run on the real Hermes: ``bot_mode.wake_sender: auto`` wakes senders

    def __init__(
        self,
        cli: str | os.PathLike[str] | None = None,
        *,
        timeout: float = 600,
        dm_base: Path | None = None,
        env: dict[str, str] | None = None,
        flags: ChatFlags | None = None,
    ) -> None:
        cli = checked_cli(cli)
        found = find_hermes_cli(cli)
        super().__init__(found or cli or "hermes", timeout=timeout, dm_base=dm_base, env=env)
        self.cli_found = found is not None
        self._asked = cli  # named in the failure when nothing was found
        self._flags = flags

    def __repr__(self) -> str:
        return f"HermesCliRunner(cli={self.cli!r}, timeout={self.timeout:g})"

    def flags(self) -> ChatFlags:
        """The chat flags of the CLI (detected on first use, then cached).

        Returns:
            The flags.

        Raises:
            TurnFailed: ``runtime_offline`` when the CLI is missing or its
                help cannot be run.
        """
        if self._flags is None:
            if not self.cli_found:
                raise TurnFailed(cli_not_found_text(self._asked), reason=RUNTIME_OFFLINE)
            detected = detect_chat_flags(self.cli)
            if detected is None:  # why is in the warning detect_chat_flags logged
                raise TurnFailed(
                    f"hermes CLI {self.cli} does not work (`{self.cli} chat --help` failed, see the log) — "
                    f"re{INSTALL_HERMES}, or name a working one: {NAME_THE_CLI}",
                    reason=RUNTIME_OFFLINE,
                )
            self._flags = detected
        return self._flags

    def argv(self, turn: Turn, query_file: Path | None) -> list[str]:
        """Return the command line of ``turn`` for the detected flags.

        Args:
            turn: the turn.
            query_file: the file holding the message (releases with
                ``--query-file``), or None to pass the text as ``--query=``.

        Returns:
            The argv list.

        Raises:
            ValueError: the profile name is one hermes rejects.
        """
        flags = self.flags()
        argv = [self.cli, "-p", cli_profile_name(turn.profile), "chat"]
        if flags.in_dir:
            argv += ["--in", "~"]
        argv += ["-c", turn.session]
        if flags.create_if_missing:
            argv.append("--create-if-missing")
        argv.append("-Q")
        if flags.no_restore_cwd:
            argv.append("--no-restore-cwd")
        if query_file is not None:
            argv += ["--query-file", str(query_file)]
        else:
            # A command line cannot carry NUL (exec refuses "embedded null byte"): shown as U+FFFD instead.
            argv.append(f"--query={turn.content.replace(chr(0), chr(0xFFFD))}")
        return argv

    def environment(self, turn: Turn) -> dict[str, str]:
        """The turn's environment: :meth:`CommandRunner.environment` with ``HERMES_HOME`` = the root.

        ``-p NAME`` resolves the profile under ``HERMES_HOME``'s root, for the
        default profile too. ``HERMES_ACTORS_HOP`` is the turn's hop, so a DM our
        plugin sends from this turn is one hop deeper.

        Args:
            turn: the turn.

        Returns:
            The environment.
        """
        env = super().environment(turn)
        env["HERMES_HOME"] = str(turn_root(turn))
        env[HOP_ENV] = str(max(0, turn.hop))
        return env

    def run_turn(self, turn: Turn) -> str:
        """Run ``turn`` and return its reply.

        Args:
            turn: the turn.

        Returns:
            The reply, read cleanly from stdout.

        Raises:
            TurnFailed: ``runtime_offline`` (no CLI, no home, the session
                cannot be created), ``target_busy``, ``delivery_timeout``,
                a classified reason for any other failure, or ``unknown``
                for text too long for the command line of this release.
        """
        flags = self.flags()
        if flags.query_file:
            return super().run_turn(turn)
        size = len(turn.content.encode("utf-8", "surrogatepass"))
        if size > MAX_ARGV_TEXT_BYTES:
            raise TurnFailed(
                f"the message to @{turn.handle or turn.profile} is {size} bytes; this hermes release takes "
                f"the message on its command line, at most {MAX_ARGV_TEXT_BYTES} bytes — shorten it "
                "(or upgrade hermes to a release with --query-file)",
                reason=UNKNOWN,
            )
        # Under the turn lock, and a CLI turn holds it for as long as its process lives: a DM (or wake-up) the
        # session ends with unanswered is a dead turn's (see hermes.retry). A Bot Mode release resumes it itself.
        take_back_unanswered(turn_home(turn), turn.session)
        return self._run(turn, None)

    def never_reached(self, turn: Turn, since: float) -> bool:
        """At a start: whether a wake the previous host started never reached the bot (:func:`never_reached`)."""
        return never_reached(turn, since)

    def prepare_retry(self, turn: Turn, began: float) -> bool:
        """Before the policy retry: take back the DM hermes stored when the first attempt failed.

        A release with ``--query-file`` (Bot Mode) resumes the unanswered turn itself
        (``HERMES_RESUME_UNANSWERED_TURN``); hermes-agent 0.19 does not (see
        :mod:`hermes_actors.hermes.retry`).

        Args:
            turn: the retry's turn.
            began: ``time.time()`` when the first attempt began.

        Returns:
            Whether the retry may run.
        """
        if self.flags().query_file:
            return True
        return prepare_bot_chat_retry(turn_home(turn), turn.session, turn.content, began)

    def forget_failed(self, turn: Turn, began: float) -> None:
        """After a final failure: take back the DM hermes stored, if it is all the turn left.

        The sender is told the DM was NOT delivered; left in Bot Chat, hermes would merge it into
        the bot's next turn. A release with ``--query-file`` (Bot Mode) keeps its own record.

        Args:
            turn: the failed turn.
            began: ``time.time()`` when its first attempt began.
        """
        self.prepare_retry(turn, began)  # the same taking back, its answer unneeded: no retry follows

    def _run(self, turn: Turn, query_file: Path | None) -> str:
        handle = turn.handle or turn.profile
        home = turn_home(turn)
        try:
            argv = self.argv(turn, query_file)
        except ValueError as exc:
            raise TurnFailed(str(exc), reason=UNKNOWN) from None
        if not self.flags().create_if_missing:
            self._ensure_session(turn, home, handle)
        logger.debug("turn {} attempt {} for @{}: {}", turn.delivery_id, turn.attempt, handle, argv[:-1])
        done = self._run_process(turn, argv, handle, cwd=home)
        try:
            return reply_or_failure(done, handle, turn.profile)
        except TurnFailed as failure:
            if failure.reason != MISSING_CONFIG:
                raise
            # hermes' first line names the problem; the wizard's commands after it would edit the root profile
            raise no_model_failure(turn, handle, failure.text.splitlines()[0]) or failure from None

    def _ensure_session(self, turn: Turn, home: Path, handle: str) -> Any:
        try:
            return ensure_bot_chat(home, cli=self.cli, title=turn.session)
        except BotChatError as exc:
            raise TurnFailed(
                f"@{handle}'s {turn.session!r} session could not be prepared: {exc}", reason=RUNTIME_OFFLINE
            ) from None
