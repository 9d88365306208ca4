"""Errors a command meets once its request was answered: never said as bad arguments.

Exit 2 says the arguments were bad, so nothing was done: a script that reads it may do it again. A command
whose request was answered (a DM acked or refused, a room made, posted to, read or disbanded) and that then
fails while it prints the answer or waits for what follows has not been given bad arguments, whatever the
error's type: a ``ValueError`` or ``KeyError`` raised there (a host's answer that is not a JSON object, a stdout
closed under an embedding caller) is exit 1, said in one line (``cli.main``), and so is a ``FileNotFoundError`` or
``PermissionError`` (said as any failed file operation is: the path, what keeps you out, what to do). Before,
``send`` whose DM was delivered and ``room create`` whose room was made exited 2 when their line could not be
printed, and a ``FileNotFoundError`` raised once the DM was acked still did: ``cli.main`` says those two as a missing
root or a bad path before a command acts (:data:`USAGE_ERRORS`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["USAGE_ERRORS", "AfterActionError", "action_taken"]

#: What ``cli.main`` says as a usage error (exit 2: a missing root, a path you may not use, a bad value) when a
#: command raises it before its request was answered; within :func:`action_taken` each is an :class:`AfterActionError`.
USAGE_ERRORS: tuple[type[Exception], ...] = (FileNotFoundError, PermissionError, ValueError)
_NO_BAD_ARGUMENT: tuple[type[Exception], ...] = (KeyError, *USAGE_ERRORS)  # what action_taken says as exit 1


class AfterActionError(Exception):
    """A ``KeyError`` or one of :data:`USAGE_ERRORS` (its ``__cause__``) raised once the command's request was
    answered."""


@contextmanager
def action_taken() -> Iterator[None]:
    """Within: the command's request was answered; a ``KeyError`` or one of :data:`USAGE_ERRORS` raised here is no
    bad argument.

    Yields:
        Nothing.

    Raises:
        AfterActionError: for a ``KeyError`` or one of :data:`USAGE_ERRORS` raised within, with its text (a
            ``KeyError``'s without the quotes ``str`` gives it); other errors pass as they are.
    """
    try:
        yield
    except _NO_BAD_ARGUMENT as exc:
        raise AfterActionError(str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)) from exc
