"""Pure: text cut to a width, and a user's value as an error or refusal names it.

A value someone typed or a bot sent (a target, a room, an id, ``--profiles``) is
named in the text that refuses it, so they can see what was wrong. Past a bound
it is cut, with its length said: a 100,000-character target must not come back
as a 100,000-character refusal (on a terminal, or in the bot's context).
"""

from __future__ import annotations

__all__ = ["SHOWN_CLIP_CHARS", "SHOWN_MAX_CHARS", "clip", "shown"]

# Longer than any name, id, URL or path a person types: up to here a value is shown whole, as before.
SHOWN_MAX_CHARS = 200
# How much of a longer value is shown: enough to recognize it.
SHOWN_CLIP_CHARS = 60


def clip(text: str, width: int) -> str:
    """Pure: ``text`` on one line, at most ``width`` characters, cut at a word boundary with "…".

    Args:
        text: any text (newlines become spaces).
        width: the maximum length (at least 2).

    Returns:
        The text, or its longest prefix ending at a whole word plus "…".
    """
    flat = " ".join(str(text).split())
    if len(flat) <= width:
        return flat
    cut = flat[: max(1, width - 1)]
    space = cut.rfind(" ")
    if space > width // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:—-") + "…"


def shown(value: object, short: str | None = None) -> str:
    """Pure: ``value`` as an error or refusal text names it: whole when short, else cut, with its length.

    Args:
        value: what the user or bot gave (a str; anything else is measured by its ``repr``).
        short: how the text shows a value of at most :data:`SHOWN_MAX_CHARS` characters (default:
            ``repr(value)``; the seed's texts quote some as ``'<value>'``, some bare): kept exactly.

    Returns:
        ``short``, or for a longer value ``'<its first words>…' (N characters)``.
    """
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= SHOWN_MAX_CHARS:
        return repr(value) if short is None else short
    return f"{clip(text, SHOWN_CLIP_CHARS)!r} ({len(text):,} characters)"
