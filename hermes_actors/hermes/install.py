"""Facts about an installed ``hermes-agent``: where its CLI is, what its ``chat`` accepts.

Pure functions where possible; the two that run the CLI (:func:`detect_chat_flags`)
or read its files (:func:`hermes_python`) cache or stay cheap.

hermes-agent 0.19.0 (the PyPI release) knows ``-q/--query``, ``-Q``,
``-c/--continue NAME`` and ``--no-restore-cwd``; it has no ``--query-file``,
``--create-if-missing`` or ``--in``. Newer releases may add them; we detect,
never assume.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from hermes_actors.core.names import PEER_NAME_RE, profile_home
from hermes_actors.core.outcomes import INSTALL_HERMES, NAME_THE_CLI
from hermes_actors.local.cli_process import beside_interpreter

__all__ = [
    "CLI_ENV_VAR",
    "CLI_PROFILE_RE",
    "INSTALL_HERMES",
    "NAME_THE_CLI",
    "NO_HERMES_CLI",
    "ChatFlags",
    "cli_not_found_text",
    "cli_profile_name",
    "detect_chat_flags",
    "find_hermes_cli",
    "hermes_cannot_run",
    "hermes_python",
    "parse_chat_help",
    "profile_home",
    "root_of_home",
]

CLI_ENV_VAR = "HERMES_ACTORS_HERMES_CLI"
# What doctor, serve's start and a failed turn say when find_hermes_cli finds nothing (INSTALL_HERMES, NAME_THE_CLI:
# how to get or name one, from core.outcomes: the command runner in local/ says them too)
NO_HERMES_CLI = f"no `hermes` executable found (beside python, ${CLI_ENV_VAR}, PATH)"
# hermes' own profile-id rule (hermes_cli/main.py _apply_profile_override): lowercase only, the same rule
# hermes applies to peer names.
CLI_PROFILE_RE = PEER_NAME_RE
_HELP_TIMEOUT = 60.0
_SHEBANG_MAX = 4096


@dataclass(frozen=True, slots=True)
class ChatFlags:
    """Which optional ``hermes chat`` flags an install supports."""

    query_file: bool = False
    create_if_missing: bool = False
    in_dir: bool = False
    no_restore_cwd: bool = False


def parse_chat_help(text: str) -> ChatFlags:
    """Read the supported flags from ``hermes chat --help`` output.

    Args:
        text: the help text.

    Returns:
        The flags found (a flag counts only as a whole option word).
    """

    def has(flag: str) -> bool:
        return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None

    return ChatFlags(
        query_file=has("--query-file"),
        create_if_missing=has("--create-if-missing"),
        in_dir=has("--in"),
        no_restore_cwd=has("--no-restore-cwd"),
    )


_flags_cache: dict[tuple[str, int], ChatFlags] = {}
_flags_lock = threading.Lock()


def detect_chat_flags(cli: str) -> ChatFlags | None:
    """Run ``<cli> chat --help`` once per binary (path + mtime) and parse it.

    Args:
        cli: the hermes executable.

    Returns:
        The flags, or None when the help could not be run (missing CLI,
        non-zero exit, timeout) — the caller treats the runtime as offline.
    """
    path = shutil.which(cli) or cli
    try:
        real = os.path.realpath(path)
        key = (real, os.stat(real).st_mtime_ns)
    except OSError:
        return None
    with _flags_lock:
        cached = _flags_cache.get(key)
    if cached is not None:
        return cached
    try:
        done = subprocess.run(
            [path, "chat", "--help"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
            encoding="utf-8", errors="replace", timeout=_HELP_TIMEOUT, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("cannot run {} chat --help: {}", path, exc)
        return None
    if done.returncode != 0:
        logger.warning("{} chat --help exited {}: {}", path, done.returncode, done.stderr.strip()[-300:])
        return None
    flags = parse_chat_help(done.stdout)
    with _flags_lock:
        _flags_cache[key] = flags
    logger.debug("hermes at {} supports {}", path, flags)
    return flags


def find_hermes_cli(explicit: str | os.PathLike[str] | None = None) -> str | None:
    """Locate the hermes executable.

    Order: ``explicit``; the ``HERMES_ACTORS_HERMES_CLI`` variable; the
    executable beside the running interpreter (same virtualenv — service
    contexts often lack PATH); ``PATH``.

    Args:
        explicit: a path or a name to look up on PATH.

    Returns:
        The path, or None when nothing executable is found.
    """
    for candidate in (explicit, os.environ.get(CLI_ENV_VAR)):
        if candidate:
            found = shutil.which(str(candidate))
            return found if found else None
    return beside_interpreter("hermes") or shutil.which("hermes")


def cli_not_found_text(explicit: str | os.PathLike[str] | None = None) -> str:
    """Where :func:`find_hermes_cli` looked for the hermes executable, having found none, and how to fix it.

    Both spellings of naming it are given: a turn's failure reaches command-line users and Python
    embedders alike.

    Args:
        explicit: the executable the caller named (``--cli``, ``cli=``), if any.

    Returns:
        e.g. "hermes CLI not found: no `hermes` beside python (/venv/bin/hermes) nor on PATH, and
        $HERMES_ACTORS_HERMES_CLI is not set — install hermes-agent (...), or name the executable: ...".
    """
    from_env = os.environ.get(CLI_ENV_VAR)
    if explicit:
        where = f"no executable {str(explicit)!r} (the path or name given, looked up on PATH)"
    elif from_env:
        where = f"no executable {from_env!r} (${CLI_ENV_VAR}, looked up on PATH)"
    else:
        beside = Path(sys.executable).parent / "hermes" if sys.executable else None
        where = (f"no `hermes` beside python ({beside}) nor on PATH, and ${CLI_ENV_VAR} is not set" if beside
                 else f"no `hermes` on PATH, and ${CLI_ENV_VAR} is not set")
    return f"hermes CLI not found: {where} — {INSTALL_HERMES}, or name the executable: {NAME_THE_CLI}"


def hermes_python(cli: str) -> str | None:
    """The interpreter of a hermes install, read from its CLI's shebang line.

    Args:
        cli: the hermes executable (a console-script wrapper).

    Returns:
        The interpreter path when the shebang names an existing file, else None.
    """
    try:
        with open(cli, "rb") as handle:
            first = handle.read(_SHEBANG_MAX).split(b"\n", 1)[0]
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    parts = first[2:].decode("utf-8", "replace").strip().split()
    if not parts:
        return None
    if Path(parts[0]).name == "env" and len(parts) > 1:
        return shutil.which(parts[1])
    return parts[0] if Path(parts[0]).is_file() else None


def hermes_cannot_run(profile: str) -> str | None:
    """Why hermes cannot run ``profile``'s turns (its name), or None when it can."""
    try:
        cli_profile_name(profile)
    except ValueError as exc:
        return str(exc)
    return None


def cli_profile_name(profile: str) -> str:
    """The profile name as ``hermes -p`` accepts it.

    Args:
        profile: our folder id (``default`` for the root profile).

    Returns:
        ``profile`` unchanged.

    Raises:
        ValueError: hermes would reject it (it takes lowercase letters,
            digits, ``_`` and ``-`` only).
    """
    if not CLI_PROFILE_RE.match(profile):
        raise ValueError(
            f"profile {profile!r} cannot be run by hermes: its profile names are lowercase letters, "
            "digits, '_' and '-' (at most 64)"
        )
    return profile


def root_of_home(home: Path) -> Path:
    """The root a profile home belongs to (the inverse of :func:`profile_home`).

    Args:
        home: a profile home.

    Returns:
        The grandparent when the parent is named ``profiles``, else ``home``.
    """
    home = Path(home)
    return home.parent.parent if home.parent.name == "profiles" else home


def model_name(config: Any) -> str:
    """Pure: the model a profile's ``config.yaml`` names, as hermes reads it (``""``: none named).

    ``model: NAME``, or ``model: {default: NAME}`` (``model.model`` in older files). A section that names
    only a ``provider`` or a ``base_url`` has no name here, yet hermes completes it (it asks a local server
    for its model, or takes the provider's default): see :func:`names_no_model`.

    Args:
        config: the parsed ``config.yaml`` (anything: a broken file's value is no model).
    """
    model = config.get("model") if isinstance(config, dict) else None
    if isinstance(model, dict):
        model = model.get("default") or model.get("model")
    return model.strip() if isinstance(model, str) else ""


def names_no_model(config: Any) -> bool:
    """Pure: whether a profile's ``config.yaml`` gives hermes nothing to find a model with.

    A profile is its own hermes home: the root's model is not its model, and with no ``model``
    section (or one with no name, provider or base URL) hermes runs no turn of it (the CLI exits
    "isn't configured yet"; the API server answers 500), unless its environment names a provider.
    """
    if model_name(config):
        return False
    model = config.get("model") if isinstance(config, dict) else None
    return not (isinstance(model, dict) and any(
        isinstance(model.get(key), str) and model[key].strip() for key in ("provider", "base_url")))


def home_names_no_model(home: Path) -> bool | None:
    """:func:`names_no_model` for ``home``'s ``config.yaml``; None when that file does not read."""
    from hermes_actors.store.yaml_file import read_yaml_mapping

    data, problem = read_yaml_mapping(Path(home) / "config.yaml")
    return None if problem else names_no_model(data)
