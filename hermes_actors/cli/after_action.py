"""Errors a command meets once its request was answered: never said as bad arguments.

Exit 2 says the arguments were bad, so nothing was done: a script that reads it may do it again. A command
whose request was answered (a DM acked or refused, a room made, posted to, read or disbanded) and that then
fails while it prints the answer or waits for what follows has not been given bad arguments, whatever the
error's type: a ``ValueError`` or ``KeyError`` raised there (a host's answer that is not a JSON object, a stdout
closed under an embedding caller) is exit 1, said in one line (``cli.main``). Before, ``send`` whose DM was
delivered and ``room create`` whose room was made exited 2 when their line could not be printed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["AfterActionError", "action_taken"]


class AfterActionError(Exception):
    """A ``ValueError`` or ``KeyError`` (its ``__cause__``) raised once the command's request was answered."""


@contextmanager
def action_taken() -> Iterator[None]:
    """Within: the command's request was answered; a ``ValueError`` or ``KeyError`` raised here is no bad argument.

    Yields:
        Nothing.

    Raises:
        AfterActionError: for a ``ValueError`` or ``KeyError`` raised within, with its text (a ``KeyError``'s
            without the quotes ``str`` gives it); other errors pass as they are.
    """
    try:
        yield
    except (KeyError, ValueError) as exc:
        raise AfterActionError(str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)) from exc
