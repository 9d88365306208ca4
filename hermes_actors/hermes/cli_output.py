"""Reading what one ``hermes chat -Q`` turn printed: the reply, or a typed failure.

Pure functions over the process's output (table-tested).

What hermes-agent 0.19 prints with ``-q TEXT -Q``: the reply on stdout
(``print(response)``), then ``\\nsession_id: <id>`` on stderr. Before the reply
stdout can carry ``↪ restored workspace dir: <dir>`` (a resumed session's
recorded cwd differs and ``--no-restore-cwd`` was not given),
``⚠ session's recorded dir is gone (...)`` and the dimmed
``⚠ tirith security scanner enabled but not available — ...`` warning.
``-c NAME`` on a missing session exits 1 with ``No session found matching
'NAME'.`` on stdout. A failed agent run with no reply prints ``Error: <text>``
on stderr (exit 1 when the run failed, 0 when it was only partial). A provider
that keeps failing exits 1 with ``API call failed after 3 retries: HTTP 500: ...``
on *stdout*, while stderr carries only notices (``Session ... found but has no
messages. Starting fresh.``) and the ``session_id:`` line: the failure text is
read from both streams, so the reason is classified from the error itself.
"""

from __future__ import annotations

import re

from hermes_actors.core.reasons import RUNTIME_OFFLINE, TARGET_BUSY, classify_agent_error
from hermes_actors.errors import TurnFailed
from hermes_actors.local.cli_process import CliResult, busy_text, exit_failure_text, refused_not_owned

__all__ = ["NO_SESSION_MARKER", "clean_reply", "failure_of", "reply_or_failure", "session_id_of"]

NO_SESSION_MARKER = "No session found matching"
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_NOISE_PREFIXES = (
    "↻ Resumed session",  # `-c` on a session with messages (printed after a failed run's error too)
    "↪ restored workspace dir:",
    "⚠ session's recorded dir is gone",
    "⚠ tirith security scanner",
)
_SESSION_ID_RE = re.compile(r"^session_id:\s*(\S+)\s*$", re.MULTILINE)
_FRESH_SESSION_RE = re.compile(r"^Session \S+ found but has no messages\. Starting fresh\.$")
_ERROR_RE = re.compile(r"^Error: (.+)$", re.MULTILINE)
_LIVE_OWNER = "already has a live owner"


def _is_noise(line: str) -> bool:
    bare = _ANSI_RE.sub("", line).strip()
    return not bare or bare.startswith(_NOISE_PREFIXES) or bool(_FRESH_SESSION_RE.match(bare))


def clean_reply(stdout: str) -> str:
    """The reply in a successful turn's stdout.

    Leading notice lines hermes prints before the reply (restored-dir,
    missing-dir and security-scanner notices, blank lines) are dropped; the
    reply itself is kept verbatim except for trailing newlines.

    Args:
        stdout: the CLI's stdout.

    Returns:
        The reply ("" when only notices were printed).
    """
    lines = stdout.splitlines(keepends=True)
    start = 0
    while start < len(lines) and _is_noise(lines[start]):
        start += 1
    return "".join(lines[start:]).rstrip("\r\n")


def session_id_of(stderr: str) -> str:
    """The session id hermes reported on stderr (``session_id: <id>``).

    Args:
        stderr: the CLI's stderr.

    Returns:
        The last reported id, "" when none.
    """
    found = _SESSION_ID_RE.findall(stderr)
    return found[-1] if found else ""


def failure_of(done: CliResult, handle: str, profile: str = "") -> TurnFailed:
    """The typed failure of a turn whose process exited non-zero.

    Args:
        done: the finished process.
        handle: the target's handle.
        profile: the profile the CLI ran as (named by a lease refusal, as the seed does; default ``handle``).

    Returns:
        ``target_busy`` for a lease refusal (marker or prose, on either
        stream); ``runtime_offline`` for a missing Bot Chat session (the
        runner recreates it on the retry); else the last output lines with
        the reason :func:`~hermes_actors.core.reasons.classify_agent_error` gives.
    """
    if refused_not_owned(done.stderr) or _LIVE_OWNER in done.stdout:
        return TurnFailed(busy_text(profile or handle), reason=TARGET_BUSY)
    if NO_SESSION_MARKER in done.stdout:
        return TurnFailed(
            f"@{handle}'s Bot Chat session was not found by hermes (it was deleted or renamed), "
            "so the message was NOT delivered",
            reason=RUNTIME_OFFLINE,
        )
    text = exit_failure_text(_without_chatter(done))
    return TurnFailed(text, reason=classify_agent_error(text))


def _without_chatter(done: CliResult) -> CliResult:
    """``done`` with both streams' meaningful lines as its stderr (notices and ``session_id:`` dropped).

    hermes prints a provider failure on stdout and only chatter on stderr, so the
    text to classify is what both streams say, stdout first (the order hermes printed it).
    """
    kept = [
        line
        for stream in (done.stdout, done.stderr)
        for line in stream.splitlines()
        if not _is_noise(line) and not _SESSION_ID_RE.match(line.strip())
    ]
    return CliResult("", "\n".join(kept), done.returncode)


def reply_or_failure(done: CliResult, handle: str, profile: str = "") -> str:
    """The reply of a finished turn, or raise its failure.

    Args:
        done: the finished process.
        handle: the target's handle.
        profile: the profile the CLI ran as (see :func:`failure_of`).

    Returns:
        The cleaned reply.

    Raises:
        TurnFailed: the process exited non-zero, or exited 0 with no reply
            and an ``Error:`` line on stderr (a partial run).
    """
    if done.returncode != 0:
        raise failure_of(done, handle, profile)
    reply = clean_reply(done.stdout)
    if not reply:
        errors = _ERROR_RE.findall(done.stderr)
        if errors:
            text = f"hermes: {errors[-1].strip()}"
            raise TurnFailed(text, reason=classify_agent_error(text))
    return reply
