"""How the report reads and prints a result's figures: one number format, one CPU floor.

The table, the details lines and the targets all print numbers with :func:`num` and
judge CPU against :func:`floor_cpu`, so a figure reads the same wherever it appears.
"""

from __future__ import annotations

from typing import Any

__all__ = ["floor_cpu", "num"]


def num(value: Any, digits: int = 2) -> str:
    """A figure as the report prints it: "—" for None, ints as they are, big floats without decimals.

    Args:
        value: the figure (None when it was not measured).
        digits: decimals for a float under 100.

    Returns:
        The text.
    """
    if value is None:
        return "—"
    if isinstance(value, int):
        return str(value)
    number = float(value)
    if number >= 1000:
        return f"{number:,.0f}"
    if number >= 100:
        return f"{number:.1f}"
    return f"{number:.{digits}f}"


def floor_cpu(result: dict[str, Any]) -> float | None:
    """The CPU of one pykka ask round trip in this run (``floors.pykka_ask_cpu_us``), or None when it was not measured.

    Args:
        result: the result dict.

    Returns:
        Microseconds of CPU, or None.
    """
    value = (result.get("floors") or {}).get("pykka_ask_cpu_us")
    return float(value) if isinstance(value, int | float) and value > 0 else None
