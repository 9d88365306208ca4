"""Pure: text as a terminal shows it, never acts on it.

Names and paths read from disk (a profile folder, a root), values a user typed and text bots sent may hold
terminal control characters: an ESC sequence recolours or clears the screen, an OSC one sets the window's
title, a bidi override reorders what follows. What the CLI prints shows each one escaped instead
(:func:`printable`); a command it prints for the user to run writes them as shell escapes
(:mod:`hermes_actors.core.shell`). One rule, :data:`UNPRINTABLE`, says which characters these are.
"""

from __future__ import annotations

import re

__all__ = ["UNPRINTABLE", "printable"]

# C0/C1 control characters but newline and tab, and the bidi embeddings/overrides/isolates: what
# a terminal would act on (colours, clearing the screen, a title, reordered text) instead of show.
UNPRINTABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """Pure: ``text`` safe to print on a terminal: each control character shown as ``\\xNN``/``\\uNNNN``.

    Roster titles, handles, replies, errors and paths come from files and bots we do not control.

    Args:
        text: any text (newlines and tabs are kept: they lay text out, they control nothing).

    Returns:
        The text, each character of :data:`UNPRINTABLE` written as Python writes it escaped (``\\x1b``,
        ``\\u202e``); text without one is returned as it is, so escaping twice changes nothing.
    """
    return UNPRINTABLE.sub(lambda m: ascii(m.group())[1:-1], text)
