"""Write throwaway Hermes roots with many managed profiles, fast.

A profile is ``<root>/profiles/<id>/profile.yaml`` with a dict at
``ui_meta["hermes-bots"]`` (DESIGN 5). The YAML is a fixed template written
with plain ``open`` — no YAML library on the hot path — so 10,000 profiles take
well under a few seconds.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["BENCH_CONFIG", "profile_ids", "write_root"]

#: Gateway config for every benchmark of ours: the conversation guard must not
#: interfere (DMs from ``Gateway.message_agent`` are hop 1, which the pair rate
#: exempts anyway) and idle ProfileActors stop after 5 s.
BENCH_CONFIG: dict[str, dict[str, float]] = {
    "bot_mode": {"max_pair_rate": 0, "turn_wait_seconds": 60, "idle_stop_seconds": 5},
}

_PROFILE_YAML = "display_name: {name}\ndescription: bench bot\nui_meta:\n  hermes-bots:\n    title: Bench\n"


def profile_ids(count: int) -> list[str]:
    """The folder ids ``p00000``, ``p00001``, … of ``count`` bench profiles."""
    width = max(5, len(str(max(0, count - 1))))
    return [f"p{i:0{width}d}" for i in range(count)]


def write_root(root: Path, count: int) -> list[str]:
    """Create a managed Hermes root with the default profile plus ``count`` profiles.

    Args:
        root: the directory to create (parents too); reused when it exists.
        count: how many profiles under ``<root>/profiles``.

    Returns:
        The folder ids of the created profiles (the default profile excluded).
    """
    root.mkdir(parents=True, exist_ok=True)
    (root / "profile.yaml").write_text(_PROFILE_YAML.format(name="Hermes"), encoding="utf-8")
    base = root / "profiles"
    base.mkdir(exist_ok=True)
    ids = profile_ids(count)
    base_s = os.fspath(base)
    for pid in ids:
        home = os.path.join(base_s, pid)
        os.makedirs(home, exist_ok=True)
        with open(os.path.join(home, "profile.yaml"), "w", encoding="utf-8") as fh:
            fh.write(_PROFILE_YAML.format(name=pid))
    return ids
