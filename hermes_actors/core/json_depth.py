"""How deep a decoded JSON value nests: the one rule for a document read that must be written again.

A leaf module. ``orjson.loads`` reads a document nesting up to 1,024 arrays and objects, but
``orjson.dumps`` refuses one nesting more than :data:`MAX_WRITABLE_DEPTH` ("Recursion limit
reached"). A relayed envelope is written again on its way (the hub posts it to its target's
``inbox/``), so one read fine and nested past that could never go on: its envelope reader refuses
it as malformed (``store.relay_protocol.parse_envelope``), where resending can be seen to be
useless, instead of failing each write as a temporary fault.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_WRITABLE_DEPTH", "nests_deeper_than"]

MAX_WRITABLE_DEPTH = 254  # the deepest nesting orjson.dumps writes (a top-level object or array is 1)


def nests_deeper_than(value: Any, limit: int) -> bool:
    """Pure: whether ``value`` nests JSON objects (dicts) and arrays (lists) more than ``limit`` deep.

    Walked without recursion (a deep value cannot exhaust the stack), and stopped at the first
    container past ``limit``.

    Args:
        value: a decoded JSON value.
        limit: the deepest nesting accepted (a top-level object or array is 1; a scalar is 0).

    Returns:
        True when some container sits more than ``limit`` containers deep.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False
