"""Configuration loading: ``<root>/config.yaml`` over defaults, then overrides.

Loading never crashes the gateway: a missing, unreadable, malformed, huge or
symlinked file is logged and treated as empty, and a bad value falls back to
its default with a warning.
"""

from __future__ import annotations

import copy
import errno
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from loguru import logger

# The C parser (libyaml) is ~7x faster; 10,000 profile.yaml files are read at start.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

__all__ = [
    "DEFAULTS",
    "MAX_CONFIG_BYTES",
    "PEER_NAME_RE",
    "BotModeConfig",
    "deep_merge",
    "load_config",
    "load_yaml_file",
]

MAX_CONFIG_BYTES = 1024 * 1024
PEER_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}\Z")  # \Z: "$" would accept a trailing newline

DEFAULTS: dict[str, Any] = {
    "bot_mode": {
        "turn_wait_seconds": 120,
        "envelope_ttl_seconds": 900,
        "reply_wait_seconds": 900,
        "max_hops": 8,
        "max_pair_rate": 30,
        "max_queued": 256,
        "max_notify_backlog": 100000,
        "turn_timeout_seconds": 600,
        "idle_stop_seconds": 60,
        "rescan_seconds": 2.0,
        "wake_sender": "auto",  # auto | true | false (hermes_actors.core.wake)
    },
    "bot_peers": {},
}


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Merge ``over`` onto ``base`` without touching either.

    Args:
        base: the lower layer.
        over: the upper layer; its values win.

    Returns:
        A new dict: nested dicts are merged recursively, every other value of
        ``over`` replaces the one in ``base``. Values are deep-copied.
    """
    merged: dict[str, Any] = copy.deepcopy(base)
    for key, value in over.items():
        current = merged.get(key)
        if isinstance(current, dict) and isinstance(value, dict):
            merged[key] = deep_merge(current, value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _read_capped(path: Path) -> bytes | None:
    """Read a regular, non-symlink file of at most :data:`MAX_CONFIG_BYTES`.

    Args:
        path: the file to read.

    Returns:
        The bytes, or None when the file is refused (already logged).

    Raises:
        FileNotFoundError: when the file does not exist.
        OSError: when it cannot be opened or read.
    """
    if path.is_symlink():
        logger.warning("config file {} is a symlink; ignoring it", path)
        return None
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            logger.warning("config file {} is a symlink; ignoring it", path)
            return None
        raise
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            logger.warning("config file {} is not a regular file; ignoring it", path)
            return None
        if info.st_size > MAX_CONFIG_BYTES:
            logger.warning("config file {} is too big ({} bytes > {}); ignoring it",
                           path, info.st_size, MAX_CONFIG_BYTES)
            return None
        data = handle.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        logger.warning("config file {} grew past {} bytes while reading; ignoring it", path, MAX_CONFIG_BYTES)
        return None
    return data


def load_yaml_file(path: Path) -> dict[str, Any]:
    """Load a YAML mapping, tolerating every kind of bad file.

    Args:
        path: the YAML file.

    Returns:
        The top-level mapping; ``{}`` when the file is missing or empty, and
        ``{}`` plus a warning naming the file and the problem when it is a
        symlink, larger than 1 MiB, unreadable, malformed, or not a mapping.
    """
    path = Path(path)
    try:
        data = _read_capped(path)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        logger.warning("config file {} is unreadable ({}); ignoring it", path, exc)
        return {}
    if data is None:
        return {}
    try:
        loaded = yaml.load(data.decode("utf-8"), Loader=_SafeLoader)  # a safe loader (the C one when present)
    except UnicodeDecodeError as exc:
        logger.warning("config file {} is not valid UTF-8 ({}); ignoring it", path, exc)
        return {}
    except yaml.YAMLError as exc:
        logger.warning("config file {} is malformed YAML ({}); ignoring it", path, exc)
        return {}
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        logger.warning("config file {} top level is a {}, not a mapping; ignoring it",
                       path, type(loaded).__name__)
        return {}
    return loaded


# ── typed bot_mode config ───────────────────────────────────────────────────

# key → (kind, minimum, minimum inclusive); kind "float" or "int"; minimum None = any value.
_FIELDS: dict[str, tuple[str, float | None, bool]] = {
    "turn_wait_seconds": ("float", 0.0, True),
    "envelope_ttl_seconds": ("float", None, True),  # <= 0 disables expiry
    "reply_wait_seconds": ("float", 0.0, True),
    "max_hops": ("int", 1, True),
    "max_pair_rate": ("int", 0, True),  # 0 turns the per-pair rate limit off
    "max_queued": ("int", 1, True),
    "max_notify_backlog": ("int", 1, True),
    "turn_timeout_seconds": ("float", 0.0, False),
    "idle_stop_seconds": ("float", 0.0, True),
    "rescan_seconds": ("float", 0.0, False),
}


def _to_number(value: Any, kind: str) -> float | int | None:
    """Coerce a config value to a finite float or an integral int.

    Args:
        value: the raw value (number or numeric string; bools are refused).
        kind: ``"float"`` or ``"int"``.

    Returns:
        The number, or None when the value is not of that kind.
    """
    if isinstance(value, bool):
        return None
    try:
        number = float(value.strip()) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(number):
        return None
    if kind == "int":
        return int(number) if number.is_integer() else None
    return number


def _coerce_field(key: str, value: Any) -> float | int:
    """Coerce one bot_mode value, falling back to its default with a warning.

    Args:
        key: the bot_mode key (one of ``_FIELDS``).
        value: the raw value.

    Returns:
        The coerced value, or the default when the value is bad.
    """
    kind, minimum, inclusive = _FIELDS[key]
    default = DEFAULTS["bot_mode"][key]
    number = _to_number(value, kind)
    if number is None:
        logger.warning("config bot_mode.{}={!r} is not a valid {}; using default {}", key, value, kind, default)
        return float(default) if kind == "float" else int(default)
    if minimum is not None and (number < minimum or (not inclusive and number == minimum)):
        bound = ">=" if inclusive else ">"
        logger.warning("config bot_mode.{}={!r} must be {} {}; using default {}",
                       key, value, bound, minimum, default)
        return float(default) if kind == "float" else int(default)
    return number


def _wake_mode(value: Any) -> str:
    """``bot_mode.wake_sender`` parsed, falling back to ``auto`` with a warning."""
    from hermes_actors.core.wake import parse_wake_mode

    mode = parse_wake_mode(value)
    if mode is None:
        logger.warning("config bot_mode.wake_sender={!r} is not auto, true or false; using auto", value)
        return "auto"
    return mode


def _peer_names(raw: Any) -> tuple[str, ...]:
    """Extract valid, lowercased, de-duplicated peer names from ``bot_peers``.

    Args:
        raw: ``bot_peers`` — a dict keyed by name, a list of names, or a list of
            dicts with a ``name`` key.

    Returns:
        The peer names in order of appearance; invalid entries are skipped
        with a warning.
    """
    if raw is None:
        return ()
    if isinstance(raw, dict):
        candidates: list[Any] = list(raw.keys())
    elif isinstance(raw, list):
        candidates = [item.get("name") if isinstance(item, dict) else item for item in raw]
    else:
        logger.warning("config bot_peers is a {}, not a mapping or list; ignoring it", type(raw).__name__)
        return ()
    names: list[str] = []
    for candidate in candidates:
        name = candidate.strip().lower() if isinstance(candidate, str) else ""
        if not PEER_NAME_RE.match(name):
            logger.warning("config bot_peers entry {!r} is not a valid peer name; skipping it", candidate)
            continue
        if name not in names:
            names.append(name)
    return tuple(names)


@dataclass(frozen=True)
class BotModeConfig:
    """The typed ``bot_mode`` settings plus the peer names and the raw config."""

    turn_wait_seconds: float = 120.0
    envelope_ttl_seconds: float = 900.0
    reply_wait_seconds: float = 900.0
    max_hops: int = 8
    max_pair_rate: int = 30
    max_queued: int = 256
    max_notify_backlog: int = 100_000
    turn_timeout_seconds: float = 600.0
    idle_stop_seconds: float = 60.0
    rescan_seconds: float = 2.0
    wake_sender: str = "auto"
    peers: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, hash=False, compare=False, repr=False)

    @property
    def expiry_enabled(self) -> bool:
        """Whether relay envelopes expire (``envelope_ttl_seconds`` > 0)."""
        return self.envelope_ttl_seconds > 0

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> BotModeConfig:
        """Build the typed config from a ``config.yaml``-shaped dict.

        Args:
            cfg: the (merged) config; missing keys take their defaults.

        Returns:
            The config; bad values are replaced by defaults with a warning.
        """
        cfg = cfg if isinstance(cfg, dict) else {}
        section = cfg.get("bot_mode", {})
        if section is None:
            section = {}
        if not isinstance(section, dict):
            logger.warning("config bot_mode is a {}, not a mapping; using defaults", type(section).__name__)
            section = {}
        values: dict[str, Any] = {}
        for key in _FIELDS:
            values[key] = _coerce_field(key, section.get(key, DEFAULTS["bot_mode"][key]))
        values["wake_sender"] = _wake_mode(section.get("wake_sender", DEFAULTS["bot_mode"]["wake_sender"]))
        return cls(**values, peers=_peer_names(cfg.get("bot_peers")), raw=copy.deepcopy(cfg))


def load_config(root: Path, overrides: dict[str, Any] | None = None) -> BotModeConfig:
    """Load ``<root>/config.yaml`` over :data:`DEFAULTS`, then ``overrides`` over that.

    Args:
        root: the Hermes root (the default profile's home).
        overrides: a ``config.yaml``-shaped dict (e.g. ``Gateway(config=...)``).

    Returns:
        The typed config.
    """
    merged = deep_merge(DEFAULTS, load_yaml_file(Path(root) / "config.yaml"))
    if overrides:
        merged = deep_merge(merged, overrides)
    return BotModeConfig.from_dict(merged)
