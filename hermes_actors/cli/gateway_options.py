"""What the command's gateway options make: the turn runner of ``--runner``/``--cli`` and the config of ``--redis``.

Shared by every command that may start a gateway of its own (``roster``, ``send``, ``serve``, ``room``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["runner_for", "transport_config"]


def runner_for(kind: str, cli: str | None, root: Path) -> Any:
    """The ``Gateway(runner=...)`` of ``--runner``: None (the real Hermes, chosen at start), ``"demo"`` or a runner.

    Args:
        kind: ``hermes``, ``command`` or ``demo``.
        cli: the ``--cli`` executable (None: found as the runners find it).
        root: the Hermes root (its ``config.yaml`` gives the turn timeout).

    Returns:
        What ``Gateway`` takes as its runner.
    """
    if kind == "demo":
        return "demo"
    from hermes_actors.core.config import load_config

    timeout = load_config(root).turn_timeout_seconds
    if kind == "hermes":
        if cli is None:
            return None
        from hermes_actors.hermes.select import default_runner

        return default_runner(root, cli=cli, timeout=timeout)
    from hermes_actors.local.command_runner import CommandRunner

    return CommandRunner(cli=cli, timeout=timeout)


def transport_config(args: argparse.Namespace) -> dict[str, Any]:
    """The config overrides of ``--redis`` (empty without it: ``config.yaml`` decides).

    Args:
        args: the parsed command line (its ``redis``).

    Returns:
        The overrides to merge into the gateway's config.
    """
    return {"bot_mode": {"transport": args.redis}} if args.redis else {}
