"""argparse ``type`` functions shared by the subcommands: each refuses a bad value naming it (exit 2); and the
parser class whose own refusals (a bad choice, int or float) name a huge value cut, not whole."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from hermes_actors.core.clipping import SHOWN_CLIP_CHARS, clip, shown

__all__ = ["MAX_WAIT_SECONDS", "Parser", "executable", "expand_user", "root_path", "seconds", "seconds_within",
           "user_path", "utf8_text"]

# Linux's PATH_MAX and NAME_MAX: a longer path fails every call with ENAMETOOLONG
_PATH_MAX = 4096
_NAME_MAX = 255
MAX_WAIT_SECONDS = 10_000_000.0  # ~115 days; a longer wait overflows the clocks the waits are measured on


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
    """An argparse ``type`` for a path option other than ``--root`` (``bench --out``): ``~`` expanded.

    Args:
        text: the option's value.

    Returns:
        The path.

    Raises:
        argparse.ArgumentTypeError: it starts with a ``~user`` that cannot be expanded (:func:`expand_user`).
    """
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
    """

    def _get_value(self, action: argparse.Action, arg_string: str) -> object:
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as exc:  # our types' own messages name it already through shown()
            raise argparse.ArgumentError(action, _named(exc, arg_string)) from None

    def _check_value(self, action: argparse.Action, value: object) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            raise argparse.ArgumentError(action, _named(exc, value)) from None


def _named(exc: argparse.ArgumentError, value: object) -> str:
    """Pure: argparse's message with ``repr(value)`` in it named as :func:`shown` names it (unchanged when short)."""
    return exc.message.replace(repr(value), shown(value))
