"""Pure: a command as we print it for the user to run (a "look later with:", a "fix:", a "to do").

Every word is shell-quoted, so the command runs as printed when pasted: a root, room or
profile name with a space or a quote in it (``--root '/home/me/my hermes'``) stays one
word, where an unquoted one is split by the shell and the command fails or names another
root. A plain word (``/home/me/.hermes``, ``launch``) is printed as it is.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

__all__ = ["shell_command"]


def shell_command(*words: object, env: Mapping[str, object] | None = None) -> str:
    """Pure: ``words`` as one shell command line, each quoted only when it needs to be.

    Args:
        *words: the program and its arguments (a ``Path`` or number is taken as its ``str``).
        env: variables set for the command (``HERMES_HOME``), printed first as ``NAME=value``;
            only the value is quoted, or the shell would not read it as an assignment.

    Returns:
        The line, e.g. ``HERMES_HOME='/x y' hermes gateway run``.
    """
    assignments = [f"{name}={shlex.quote(str(value))}" for name, value in (env or {}).items()]
    return " ".join([*assignments, *(shlex.quote(str(word)) for word in words)])
