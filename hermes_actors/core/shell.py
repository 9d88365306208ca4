"""Pure: a command as we print it for the user to run (a "look later with:", a "fix:", a "to do").

Every word is shell-quoted, so the command runs as printed when pasted: a root, room or
profile name with a space or a quote in it (``--root '/home/me/my hermes'``) stays one
word, where an unquoted one is split by the shell and the command fails or names another
root. A plain word (``/home/me/.hermes``, ``launch``) is printed as it is. A word with a
terminal control character (:data:`~hermes_actors.core.printable.UNPRINTABLE`: an ESC in a
folder's name) is ANSI-C quoted, each such character written as the ``\\xHH`` escapes of its
UTF-8 bytes (``--root $'/srv/root\\x1b[7mX'``): the line is safe to show on a terminal and
bash and zsh read it back as the same word, whatever their locale (dash, a plain POSIX sh, does not).
A byte of a file name that is no UTF-8 (``os.fsdecode`` gives ``b'\\xff'`` back as ``'\\udcff'``) is written
the same way, as that byte (``rm $'/x/j-\\xff.log'``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

from hermes_actors.core.printable import UNPRINTABLE

__all__ = ["shell_command"]

# A byte of a file name that is no UTF-8, as os.fsdecode gives it back (b'\xff' -> '\udcff'): the shell must be
# given the byte, which only $'…' can write (single-quoted, the surrogate names another file, or none).
_SURROGATE_ESCAPED = re.compile("[\udc80-\udcff]")


def shell_command(*words: object, env: Mapping[str, object] | None = None) -> str:
    """Pure: ``words`` as one shell command line, each quoted only when it needs to be.

    Args:
        *words: the program and its arguments (a ``Path`` or number is taken as its ``str``).
        env: variables set for the command (``HERMES_HOME``), printed first as ``NAME=value``;
            only the value is quoted, or the shell would not read it as an assignment.

    Returns:
        The line, e.g. ``HERMES_HOME='/x y' hermes gateway run``.
    """
    assignments = [f"{name}={_word(value)}" for name, value in (env or {}).items()]
    return " ".join([*assignments, *(_word(word) for word in words)])


def _word(word: object) -> str:
    """Pure: one word of a command line, as the shell reads it back and a terminal shows it.

    Args:
        word: the word (anything else than a ``str`` is taken as its ``str``).

    Returns:
        The word as it is when the shell reads it so (``/home/me/.hermes``), else single-quoted
        (``'my team'``), or ANSI-C quoted when it holds a control character (``$'a\\x1bb'``) or a byte of a
        file name that is no UTF-8 (``'j-\\udcff.log'`` as :func:`os.fsdecode` gives it: ``$'j-\\xff.log'``).
    """
    text = str(word)
    if UNPRINTABLE.search(text) is None and _SURROGATE_ESCAPED.search(text) is None:
        return shlex.quote(text)
    return "$'" + "".join(_ansi_c_char(char) for char in text) + "'"


def _ansi_c_char(char: str) -> str:
    """Pure: one character inside ``$'…'``: a backslash or quote escaped, a control character as the ``\\xHH``
    of each of its UTF-8 bytes (``\\u`` would depend on the shell's locale), a surrogate-escaped byte of a file
    name (``\\udcff``) as the ``\\xHH`` of that byte, any other as it is."""
    if char in "\\'":
        return "\\" + char
    if UNPRINTABLE.match(char) or _SURROGATE_ESCAPED.match(char):
        return "".join(f"\\x{byte:02x}" for byte in char.encode("utf-8", "surrogateescape"))
    return char
