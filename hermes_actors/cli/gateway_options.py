"""What the command's gateway options make: the turn runner of ``--runner``/``--cli`` and the config of ``--redis``.

Shared by every command that may start a gateway of its own (``roster``, ``send``, ``serve``, ``room``). Every
command taking ``--cli`` (those, ``doctor`` and ``enable``) refuses one that names no executable by one rule,
:func:`check_cli`, whatever ``--runner`` says and host or not. When such a command asks the host serving the
root instead, the host uses its own runner, transport and connection id: :func:`host_ignored_note` says which of
these options were given for nothing.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from hermes_actors.core.clipping import shown

__all__ = ["check_cli", "given_gateway_options", "host_ignored_note", "runner_for", "transport_config"]

# Each option a command takes for a gateway of its own (its argparse dest), and what a host uses of its own instead.
_HOST_OWN = {"--runner": "runner", "--cli": "runner", "--redis": "transport", "--connection-id": "connection id"}
_DESTS = {"--runner": "runner", "--cli": "cli", "--redis": "redis", "--connection-id": "connection_id"}


def check_cli(cli: str | None) -> None:
    """Refuse a ``--cli`` that names no executable: it would fail every turn (``--runner command``), be passed
    over for another hermes found beside python or on PATH (the hermes runners), or be taken and never used
    (``--runner demo``, a host's own runner), saying nothing. The one rule of every command taking ``--cli``.

    Args:
        cli: the ``--cli`` value (None: not given).

    Raises:
        ValueError: naming the value and what to do.
    """
    if cli is not None and shutil.which(cli) is None:
        raise ValueError(f"--cli {shown(cli, cli)}: no executable file by that path or name on PATH; give the "
                         "hermes executable's path, or leave --cli out (it is then found beside python, then on PATH)")


def runner_for(kind: str | None, cli: str | None, root: Path) -> Any:
    """The ``Gateway(runner=...)`` of ``--runner``: None (the real Hermes, chosen at start), ``"demo"`` or a runner.

    Args:
        kind: ``hermes``, ``command`` or ``demo``; None (no ``--runner``) is ``hermes``.
        cli: the ``--cli`` executable (None: found as the runners find it).
        root: the Hermes root (its ``config.yaml`` gives the turn timeout).

    Returns:
        What ``Gateway`` takes as its runner.

    Raises:
        ValueError: ``--cli`` names no executable (:func:`check_cli`; with ``demo`` too).
    """
    check_cli(cli)
    if kind == "demo":
        return "demo"
    from hermes_actors.core.config import load_config

    timeout = load_config(root).turn_timeout_seconds
    if kind in (None, "hermes"):
        if cli is None:
            return None
        from hermes_actors.hermes.select import default_runner

        return default_runner(root, cli=cli, timeout=timeout)
    from hermes_actors.local.command_runner import CommandRunner

    return CommandRunner(cli=cli, timeout=timeout)


def transport_config(args: argparse.Namespace) -> dict[str, Any]:
    """The config overrides of ``--redis`` (empty without it: ``config.yaml`` decides), once ``--connection-id``
    and ``--redis`` are known to be usable: a command calls it before it prints or starts anything.

    Args:
        args: the parsed command line (its ``redis`` and ``connection_id``).

    Returns:
        The overrides to merge into the gateway's config.

    Raises:
        ValueError: ``--connection-id`` is not a connection id, or ``--redis`` selects no Redis server: an empty
            one too, which the config would read as the file relay (the message names the option, not the
            config key it stands for).
    """
    if args.connection_id is not None:
        from hermes_actors.core.names import checked_connection_id

        checked_connection_id(args.connection_id)
    if args.redis is None:
        return {}
    if not args.redis.strip():  # `--redis "$REDIS"` with the variable unset: never the file relay, silently
        raise ValueError("--redis is empty: pass a redis://, rediss:// or unix:// URL (e.g. redis://127.0.0.1:6379/0) "
                         "or 'redis' to read REDIS_URL, or leave --redis out to use the transport config.yaml sets")
    overrides = {"bot_mode": {"transport": args.redis}}
    _check_redis_option(args.redis, overrides)
    return overrides


def _check_redis_option(value: str, overrides: dict[str, Any]) -> None:
    """Refuse a ``--redis`` the transport would refuse at start, in words about ``--redis``.

    The rule stays the transport's (:func:`redis_url_from_config`, whose URL checks are
    :func:`redis_url_problem`); only its message, which names the ``bot_mode.transport`` key the user
    never typed here, is told again.

    Raises:
        ValueError: not a usable redis://, rediss:// or unix:// URL (scheme, host, port 1-65535, database
            index), or ``redis`` while ``REDIS_URL`` is unset or not usable.
    """
    import os

    from hermes_actors.core.clipping import shown
    from hermes_actors.transports.redis.store import mask_url, redis_url_from_config, redis_url_problem

    try:
        redis_url_from_config(overrides)
    except ValueError:
        text = value.strip()
        if text.lower() != "redis":
            problem = redis_url_problem(text) or "is not a redis://, rediss:// or unix:// URL"
            if problem.startswith("is not a redis://"):
                problem += " (e.g. redis://127.0.0.1:6379/0), nor 'redis' to read REDIS_URL"
            raise ValueError(f"--redis {shown(mask_url(text))} {problem}") from None
        env_url = os.environ.get("REDIS_URL", "").strip()
        if not env_url:
            raise ValueError("--redis redis reads the URL from REDIS_URL, which is not set") from None
        problem = redis_url_problem(env_url) or "is not a redis://, rediss:// or unix:// URL"
        raise ValueError(f"--redis redis reads REDIS_URL, and {shown(mask_url(env_url))} {problem}") from None


def given_gateway_options(args: argparse.Namespace) -> dict[str, str]:
    """Pure: the gateway options given on the command line, as they are shown (a ``--redis`` password masked).

    Args:
        args: the parsed command line (a command without one of the options has no attribute for it).

    Returns:
        Option → its value as shown, in the order of :data:`_HOST_OWN`; an option not given (None), or an
        empty ``--cli`` or ``--redis`` (the default), is left out.
    """
    from hermes_actors.transports.redis.store import mask_url

    given: dict[str, str] = {}
    for option, dest in _DESTS.items():
        value = getattr(args, dest, None)
        if value is None or (option in ("--cli", "--redis") and not value):
            continue
        text = mask_url(value) if option == "--redis" else str(value)
        given[option] = shown(text, text)
    return given


def host_ignored_note(root: object, given: dict[str, str], *, does: str, without: str) -> str | None:
    """Pure: the note a command that asks the host prints for the gateway options it was given for nothing.

    The host serving the root runs with its own runner, transport and connection id: ``--runner``, ``--cli``,
    ``--redis`` and ``--connection-id`` only choose those of a gateway the command runs itself, with no host.
    Said, since what answers (the real Hermes, say, for ``--runner demo``) would otherwise surprise.

    Args:
        root: the Hermes root.
        given: :func:`given_gateway_options` (option → value as shown).
        does: what the host does with its own, e.g. ``"runs the DM"``.
        without: what the options are for, e.g. ``"a send that runs the DM itself"``.

    Returns:
        ``note: --runner demo ignored: the host serving <root> runs the DM with its own runner (they are for
        a send that runs the DM itself, on a root with no host)``, or None when none was given.
    """
    if not given:
        return None
    options = _listed([f"{option} {value}" for option, value in given.items()])
    own = _listed(list(dict.fromkeys(_HOST_OWN[option] for option in given)))
    return f"note: {options} ignored: the host serving {root} {does} with its own {own} (they are for {without}, on " \
           "a root with no host)"


def _listed(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"
