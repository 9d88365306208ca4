"""The command's own output channels, stdout and stderr, as every subcommand writes them.

A command started with stdout or stderr closed (``>&-``) does its work all the same: what it would print
there is dropped (stdout's closing said once on stderr, when stderr is open), its exit code says how the
command went, and the closed descriptor is held by ``/dev/null`` so that no file, socket or child process
the command opens takes it. A write to stdout that fails for another reason than a reader that left (a
full disk: ``> /dev/full``) is a :class:`StdoutError`, whose line (:func:`stdout_error_line`) says it was
stdout that could not be written. A write to stderr that fails (its reader left, a full disk) is dropped: what
the command does and its exit code never depend on it. Neither stream fails on a character its encoding cannot
write (``PYTHONIOENCODING=ascii``, a C locale): it is written as a backslash escape (:func:`encodable`), or,
in a ``--json`` document, as JSON's ``\\uXXXX`` escape (:func:`print_json`).

Everything a command prints on either is shown, never acted on, by a terminal: each control character of it
(an ESC in a folder's name, a root's path, a value typed, a bot's reply) is written escaped
(:func:`~hermes_actors.core.printable.printable`), here, for every line, whoever prints it. Only what must reach
its reader as it is goes to the stream below (:func:`unescaped`): a ``--json`` document (:func:`print_json`), the
log sink (it escapes its messages itself and keeps its colours) and the benchmark's progress bar
(:func:`unescaped_output`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any, TextIO, cast

from hermes_actors.cli.render import ascii_json, json_text
from hermes_actors.core.printable import printable
from hermes_actors.store.os_errors import os_error_text, what_to_do

__all__ = [
    "STDOUT_CLOSED_NOTE", "StdoutError", "devnull_onto", "encodable", "output_streams", "print_json",
    "stdout_error_line", "stdout_target", "unescaped", "unescaped_output",
]

STDOUT_CLOSED_NOTE = "note: stdout is closed: what this command prints there is dropped (its exit code still tells)"


class StdoutError(OSError):
    """A write to stdout failed (a full disk, an I/O error); a reader that left stays a ``BrokenPipeError``."""


def stdout_error_line(exc: OSError, target: str | None) -> str:
    """Pure: the line a command prints when stdout cannot be written, with what to do about it.

    Args:
        exc: the error of the write.
        target: what stdout is (``/dev/full``, a file's path), or None when it cannot be told.

    Returns:
        e.g. ``cannot write stdout (/dev/full): No space left on device (ENOSPC); free space on its
        filesystem``, without the ``error:`` prefix.
    """
    advice = what_to_do(exc)
    where = f"stdout ({target})" if target else "stdout"
    return f"cannot write {where}: {os_error_text(exc)}{f'; {advice}' if advice else ''}"


def stdout_target() -> str | None:
    """What descriptor 1 is written to (``/dev/full``, a file), or None when the system does not say.

    Returns:
        The path ``/proc/self/fd/1`` links to, or None (no ``/proc``, or a pipe or socket).
    """
    try:
        target = os.readlink("/proc/self/fd/1")
    except OSError:
        return None
    return target if target.startswith("/") else None


def encodable(text: str, encoding: str | None) -> str:
    """Pure: ``text`` with each character ``encoding`` cannot write as a backslash escape (``é`` in ASCII: ``\\xe9``).

    Args:
        text: what is printed.
        encoding: the stream's encoding (None: a stream of text, such as ``io.StringIO``, that encodes nothing).

    Returns:
        The text, unchanged when ``encoding`` writes all of it.
    """
    if encoding is None:
        return text
    return text.encode(encoding, "backslashreplace").decode(encoding)


class _Output:
    """A stream whose writes never fail on a character its encoding cannot write (:func:`encodable`): a DM sent or
    a room made is never said as an error (exit 2: "bad arguments", read by a script as "nothing was done")
    because its ack names a character the terminal's locale lacks."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def _write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except UnicodeEncodeError:  # raised before anything is written: the whole text goes, escaped
            return self._stream.write(encodable(text, getattr(self._stream, "encoding", None)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _NamedStdout(_Output):
    """``sys.stdout`` whose failed writes are :class:`StdoutError` (a ``BrokenPipeError`` passes as it is)."""

    def write(self, text: str) -> int:
        try:
            return self._write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StdoutError(exc.errno, exc.strerror) from exc

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StdoutError(exc.errno, exc.strerror) from exc


class _DroppingStderr(_Output):
    """``sys.stderr`` whose failed writes are dropped: a reader that left (stderr piped to a program that exited) or
    a full disk (``2>/dev/full``) must not change what the command does nor its exit code (before, a failed "no
    host" note ended ``send`` before it sent its DM, exit 141 as if stdout's reader had left)."""

    def write(self, text: str) -> int:
        try:
            return self._write(text)
        except OSError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            self._drop()

    def _drop(self) -> None:
        """From now on write the stream to ``/dev/null``: what it still buffers is dropped, not failed on again (at
        the next write, or at exit, where a buffered stderr that cannot be flushed makes the exit code 120)."""
        with suppress(OSError, ValueError):  # no descriptor (a stream of text): nothing buffered fails again
            devnull_onto((self._stream.fileno(),))


class _Printable:
    """A stream whose writes are shown, never acted on, by a terminal (:func:`printable`); :attr:`unescaped` is the
    stream below, which it writes to."""

    def __init__(self, stream: TextIO) -> None:
        self.unescaped = stream

    def write(self, text: str) -> int:
        self.unescaped.write(printable(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.unescaped, name)


def unescaped(stream: TextIO) -> TextIO:
    """The stream below ``stream`` when it escapes what is written to it (:func:`output_streams`), else ``stream``.

    Args:
        stream: ``sys.stdout`` or ``sys.stderr``, as they are now.

    Returns:
        The stream that writes text as it is given.
    """
    return cast(TextIO, getattr(stream, "unescaped", stream))


def print_json(value: Any, *, indent: bool = False) -> None:
    """Print ``value`` on stdout as one JSON document, as it is: its reader is a program, and what the escaping of
    :func:`output_streams` writes (``\\x7f``) is no JSON. Its strings' C0 control characters are JSON escapes
    (``\\u001b``) already, and a lone surrogate (a file name's undecodable byte) is written out
    (:func:`~hermes_actors.cli.render.json_text`). When stdout's encoding cannot write a character of it
    (``PYTHONIOENCODING=ascii``, a C locale), the document is written in ASCII, its other characters as JSON's
    ``\\uXXXX`` escapes (:func:`~hermes_actors.cli.render.ascii_json`): :func:`encodable`'s ``\\xe9`` is no JSON.

    Args:
        value: what the JSON says.
        indent: two spaces an indent level (else on one line).
    """
    stream = unescaped(sys.stdout)
    text = json_text(value, indent=indent)
    if not _writes(text, getattr(stream, "encoding", None)):
        text = ascii_json(text)
    print(text, file=stream)


def _writes(text: str, encoding: str | None) -> bool:
    """Pure: whether a stream in ``encoding`` (None: a stream of text, which encodes nothing) writes ``text``."""
    if encoding is None:
        return True
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


@contextmanager
def unescaped_output() -> Iterator[None]:
    """Within: ``sys.stdout`` and ``sys.stderr`` write as they are given, for output that draws with control
    characters on purpose (the benchmark's progress bar redraws its line with ``\\r``); on leaving, as they were.

    Yields:
        Nothing.
    """
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = unescaped(stdout), unescaped(stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = stdout, stderr


def devnull_onto(fds: tuple[int, ...]) -> None:
    """Point each descriptor of ``fds`` at ``/dev/null``: what is written there from now on is dropped.

    Args:
        fds: the descriptors (1 for stdout: what it still buffers is dropped at exit, not failed on again).
    """
    if not fds:
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in fds:
        if fd != devnull:
            os.dup2(devnull, fd)
    if devnull not in fds:
        os.close(devnull)


def _hold_closed_descriptors(fds: tuple[int, ...]) -> None:
    """Open ``/dev/null`` on each of ``fds`` that is closed: the next file opened would take it otherwise,
    and whatever writes to the descriptor (a child process) would write into that file."""
    closed = []
    for fd in fds:
        try:
            os.fstat(fd)
        except OSError:
            closed.append(fd)
    devnull_onto(tuple(closed))


@contextmanager
def output_streams() -> Iterator[None]:
    """Within: ``sys.stdout`` and ``sys.stderr`` writable, whatever the command was started with, and what is
    written there shown escaped (:class:`_Printable`); on leaving, the streams the process had (a caller in the
    same process gets its own back).

    A closed one (Python makes it None) is ``/dev/null``: what is printed there is dropped; a closed stdout is
    said once on stderr (:data:`STDOUT_CLOSED_NOTE`) when stderr is open. stdout's failed writes raise
    :class:`StdoutError`; stderr's are dropped. Neither fails on a character its encoding cannot write.

    Yields:
        Nothing.
    """
    stdout, stderr = sys.stdout, sys.stderr
    _hold_closed_descriptors(tuple(fd for fd, stream in ((1, stdout), (2, stderr)) if stream is None))
    dropped = {name: open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (closed on leaving)
               for name, stream in (("stdout", stdout), ("stderr", stderr)) if stream is None}
    for name, null in dropped.items():
        setattr(sys, name, null)
    if stdout is None and stderr is not None:
        with suppress(OSError):
            print(STDOUT_CLOSED_NOTE, file=sys.stderr, flush=True)
    sys.stdout = cast(TextIO, _Printable(cast(TextIO, _NamedStdout(sys.stdout))))
    sys.stderr = cast(TextIO, _Printable(cast(TextIO, _DroppingStderr(sys.stderr))))
    try:
        yield
    finally:
        sys.stdout, sys.stderr = stdout, stderr
        for null in dropped.values():
            null.close()
