"""argparse ``type`` functions shared by the subcommands: each refuses a bad value naming it (exit 2)."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["MAX_WAIT_SECONDS", "root_path", "seconds"]

MAX_WAIT_SECONDS = 10_000_000.0  # ~115 days; a longer wait overflows the clocks the waits are measured on


def root_path(text: str) -> Path:
    """An argparse ``type`` for ``--root``: an empty value is refused, not read as the current directory.

    Args:
        text: the option's value.

    Returns:
        The path.

    Raises:
        argparse.ArgumentTypeError: the value is empty.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError("the Hermes root is empty; pass its directory (e.g. ~/.hermes)")
    return Path(text)


def seconds(text: str) -> float:
    """An argparse ``type`` for a wait in seconds: a number from 0 to :data:`MAX_WAIT_SECONDS`.

    Args:
        text: the option's value.

    Returns:
        The seconds.

    Raises:
        argparse.ArgumentTypeError: not a number, negative, NaN, or over :data:`MAX_WAIT_SECONDS`.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0.0 <= value <= MAX_WAIT_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds must be from 0 to {MAX_WAIT_SECONDS:,.0f}")
    return value
