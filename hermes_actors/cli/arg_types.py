"""argparse ``type`` functions shared by the subcommands: each refuses a bad value naming it (exit 2)."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["root_path", "seconds"]


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
    """An argparse ``type`` for a wait in seconds: a finite number, zero or more.

    Args:
        text: the option's value.

    Returns:
        The seconds.

    Raises:
        argparse.ArgumentTypeError: not a number, negative, or not finite.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: seconds must be zero or more (and finite)")
    return value
