"""argparse ``type`` functions shared by the subcommands: each refuses a bad value naming it (exit 2); and the
parser class whose own refusals (a bad choice, int or float) name a huge value cut, not whole."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from hermes_actors.core.clipping import SHOWN_CLIP_CHARS, clip, shown

__all__ = ["MAX_SUSTAINED_SECONDS", "MAX_WAIT_SECONDS", "Parser", "command_refusal", "executable", "expand_user",
           "root_path", "seconds", "seconds_within", "sustained_seconds", "user_path", "utf8_text"]

# Linux's PATH_MAX and NAME_MAX: a longer path fails every call with ENAMETOOLONG
_PATH_MAX = 4096
_NAME_MAX = 255
MAX_WAIT_SECONDS = 10_000_000.0  # ~115 days; a longer wait overflows the clocks the waits are measured on
MAX_SUSTAINED_SECONDS = 86_400.0  # bench's sustained scenario: a day; it paces and samples for all of it


def expand_user(text: str) -> str:
    """Pure but for the environment and the user database: a path option's value with a leading ``~`` or
    ``~user`` expanded, as the shell would have (a quoted ``'~/x'``, ``--root=~/x``): the one rule of every
    path option of the CLI.

    Args:
        text: the option's value.

    Returns:
        The value, expanded when it starts with ``~``.

    Raises:
        argparse.ArgumentTypeError: ``~user`` names no user (or ``~`` has no home: HOME unset, no passwd
            entry), naming the value: it is not read as a folder named ``~user`` in the working directory.
    """
    if not text.startswith("~"):
        return text
    path = os.path.expanduser(text)
    if not path.startswith("~"):
        return path
    head = text.partition("/")[0]
    why = "HOME is not set and this user has no home directory" if head == "~" else f"no user {shown(head[1:])}"
    raise argparse.ArgumentTypeError(f"{shown(text)}: cannot expand {shown(head)} ({why}); write the path out, "
                                     "or start it with ./ for a name in the current directory")


def root_path(text: str) -> Path:
    """An argparse ``type`` for ``--root``: an empty value is refused, not read as the current directory, and
    so is one longer than a path can be (the OS error, exit 1, would repeat all of it: 100,000 characters), one
    that is not UTF-8 (the root is named in JSON: the status, the host's answers) and a ``~user`` that cannot
    be expanded (:func:`expand_user`).

    Args:
        text: the option's value.

    Returns:
        The path, ``~`` expanded.

    Raises:
        argparse.ArgumentTypeError: the value is empty, not UTF-8, longer than a path or one of its names can be,
            or starts with a ``~user`` that cannot be expanded.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError("the Hermes root is empty; pass its directory (e.g. ~/.hermes)")
    utf8_text(text)
    raw = os.fsencode(text)
    if len(raw) >= _PATH_MAX or max(len(name) for name in raw.split(b"/")) > _NAME_MAX:
        raise argparse.ArgumentTypeError(
            f"the Hermes root {clip(text, SHOWN_CLIP_CHARS)!r} ({len(raw):,} bytes) is longer than a path can be "
            f"(under {_PATH_MAX:,} bytes, at most {_NAME_MAX} per name); pass its directory (e.g. ~/.hermes)")
    return Path(expand_user(text))


def user_path(text: str) -> Path:
    """An argparse ``type`` for a path option other than ``--root`` (``bench --out``): ``~`` expanded; an empty
    one is refused, not read as the current directory (``Path("")`` is ``.``), as ``--root`` refuses it.

    Args:
        text: the option's value.

    Returns:
        The path.

    Raises:
        argparse.ArgumentTypeError: it is empty (or blank), or starts with a ``~user`` that cannot be expanded
            (:func:`expand_user`).
    """
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; pass a path, or leave the option out for its default")
    return Path(expand_user(text))


def seconds(text: str) -> float:
    """An argparse ``type`` for a wait in seconds: a number from 0 to :data:`MAX_WAIT_SECONDS`.

    Args:
        text: the option's value.

    Returns:
        The seconds.

    Raises:
        argparse.ArgumentTypeError: not a number, negative, NaN, or over :data:`MAX_WAIT_SECONDS`.
    """
    return seconds_within(text, at_most=MAX_WAIT_SECONDS, bounds=f"seconds must be from 0 to {MAX_WAIT_SECONDS:,.0f}")


def sustained_seconds(text: str) -> float:
    """An argparse ``type`` for ``bench --sustained-seconds``: a number of seconds above 0, at most a day (the one
    rule of ``hermes-actors bench`` and ``python -m bench``).

    Args:
        text: the option's value.

    Returns:
        The seconds.

    Raises:
        argparse.ArgumentTypeError: not a number, not above 0, NaN, infinite or over :data:`MAX_SUSTAINED_SECONDS`.
    """
    return seconds_within(text, at_most=MAX_SUSTAINED_SECONDS, above_zero=True,
                          bounds=f"the sustained run must last more than 0 and at most {MAX_SUSTAINED_SECONDS:,.0f} "
                          "seconds")


def seconds_within(text: str, *, at_most: float, bounds: str, above_zero: bool = False) -> float:
    """The one parse of a number of seconds an option takes: a number from 0 (or above 0) to ``at_most``.

    Args:
        text: the option's value.
        at_most: the largest value taken.
        bounds: what the refusal says the bounds are (after the value).
        above_zero: 0 itself is refused too.

    Returns:
        The seconds.

    Raises:
        argparse.ArgumentTypeError: not a number, out of the bounds, NaN or infinite, naming the value (cut when huge).
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a number of seconds") from None
    floor_ok = value > 0.0 if above_zero else value >= 0.0
    if not floor_ok or not value <= at_most:  # NaN and inf fail too
        raise argparse.ArgumentTypeError(f"{shown(text)}: {bounds}")
    return value


def executable(text: str) -> str | None:
    """An argparse ``type`` for ``--cli``: the executable's path or name; an empty one is not given.

    ``--cli "$HERMES_CLI"`` with the variable unset passes ``""``, which has meant the default
    (found beside python, then on PATH) since ``--cli`` existed.

    Args:
        text: the argument.

    Returns:
        The text (``~`` expanded, :func:`expand_user`), or None when it is empty.

    Raises:
        argparse.ArgumentTypeError: it starts with a ``~user`` that cannot be expanded.
    """
    return expand_user(text) or None


def utf8_text(text: str) -> str:
    """An argparse ``type`` for a name or message sent to the host: text that is valid UTF-8.

    Python keeps an argument's undecodable bytes as lone surrogates (``\\udcff`` for the byte 0xff),
    which no request, file or journal can hold: such an argument is refused here, naming it, rather
    than failing with a traceback when the request is encoded.

    Args:
        text: the argument.

    Returns:
        The text.

    Raises:
        argparse.ArgumentTypeError: it holds bytes that are not UTF-8 (or a lone surrogate).
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raw = os.fsencode(text[exc.start])  # the byte the shell passed, where it was one
        shown = f"byte 0x{raw[0]:02x}" if len(raw) == 1 else repr(text[exc.start])
        raise argparse.ArgumentTypeError(
            f"is not valid UTF-8 text ({shown} at character {exc.start}); pass it in UTF-8") from None
    return text


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose own errors name the value they refuse through :func:`shown`: argparse's
    ``invalid choice: '<value>'`` and ``invalid int value: '<value>'`` repeat a 100,000-character argument
    whole; they keep their words, with a value over the bound cut, with its length.

    Its command (``add_subparsers``) is refused in words about what was typed (:func:`command_refusal`), not by
    argparse's dest: ``room --root R list`` said ``argument room_command: invalid choice: 'R'``, and a missing
    one ``the following arguments are required: command``.
    """

    _commands: argparse._SubParsersAction[argparse.ArgumentParser] | None = None
    _command_required = False
    _given: tuple[str, ...] = ()  # the arguments being parsed, for command_refusal

    def add_subparsers(self, **kwargs: Any) -> Any:
        """argparse's, with a missing command refused by :meth:`parse_known_args` (``required`` taken from
        argparse, whose refusal named the dest)."""
        self._command_required = bool(kwargs.pop("required", False))
        self._commands = super().add_subparsers(**kwargs)
        return self._commands

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[Any, list[str]]:
        """argparse's, the arguments kept for :func:`command_refusal`, and a missing command refused by it."""
        self._given = tuple(str(arg) for arg in (sys.argv[1:] if args is None else args))
        parsed, extras = super().parse_known_args(args, namespace)
        commands = self._commands
        if self._command_required and commands is not None and getattr(parsed, commands.dest, None) is None:
            self.error(command_refusal(self.prog, list(commands.choices), None, stray=self._stray(extras)))
        return parsed, extras

    def _stray(self, before: list[str]) -> str | None:
        """The first of ``before`` that is an option one of the commands takes, not this parser (None: none)."""
        commands = self._commands
        for arg in before:
            option = arg.partition("=")[0]
            if option.startswith("-") and option not in self._option_string_actions and commands is not None \
                    and any(option in parser._option_string_actions for parser in commands.choices.values()):
                return option
        return None

    def _get_value(self, action: argparse.Action, arg_string: str) -> object:
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as exc:  # our types' own messages name it already through shown()
            raise argparse.ArgumentError(action, _named(exc, arg_string)) from None

    def _check_value(self, action: argparse.Action, value: object) -> None:
        if action is self._commands and isinstance(value, str) and value not in action.choices:
            at = self._given.index(value) if value in self._given else 0
            following = next((arg for arg in self._given[at + 1:] if arg in action.choices), None)
            raise argparse.ArgumentError(None, command_refusal(self.prog, list(action.choices), value,
                                                               stray=self._stray(list(self._given[at - 1:at])),
                                                               following=following))
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            raise argparse.ArgumentError(action, _named(exc, value)) from None


def command_refusal(prog: str, choices: list[str], typed: str | None, *, stray: str | None = None,
                    following: str | None = None) -> str:
    """Pure: what ``prog`` says when the word where its command goes is none of ``choices``, or there is none.

    Args:
        prog: the command line so far (``hermes-actors``, ``hermes-actors room``).
        choices: its commands.
        typed: the word given where the command goes (None: no command was given).
        stray: an option given before the command that only a command takes (``--root`` in
            ``room --root R list``): the word typed is then its value.
        following: the command given after ``stray``'s value (``list`` there), if one was.

    Returns:
        The error (argparse prints it after the usage; exit 2).
    """
    names = ", ".join(choices)
    if stray is not None:
        option = shown(stray, stray)
        if following is not None:
            return f"{option} goes after the command, not before it: {prog} {following} {option} …"
        return f"{option} goes after the command, not before it: {prog} COMMAND {option} …, COMMAND one of {names}"
    if typed is None:
        return f"a command is required: {prog} COMMAND …, COMMAND one of {names} ({prog} --help says what each does)"
    return f"{shown(typed)} is not a command of {prog}: choose one of {names}"


def _named(exc: argparse.ArgumentError, value: object) -> str:
    """Pure: argparse's message with ``repr(value)`` in it named as :func:`shown` names it (unchanged when short)."""
    return exc.message.replace(repr(value), shown(value))
