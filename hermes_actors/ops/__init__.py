"""The operator's surface: status, outcome lookup, doctor, metrics and the live page.

Everything here reads the running gateway (through the ``serve`` endpoint or a
``Gateway`` in the same process) or the root's files; nothing here decides
where a DM goes.
"""

from __future__ import annotations

__all__: list[str] = []
