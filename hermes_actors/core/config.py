"""Configuration: every setting declared once, ``<root>/config.yaml`` over defaults, then overrides.

Each setting is one dataclass field made with
:func:`hermes_actors.core.settings.setting`: its name is the
``config.yaml`` key, its annotation the type, and the call carries the
default, the bounds and the one-line doc. The defaults (:data:`DEFAULTS`), the
coercion and validation, the unknown-key check (:func:`unknown_keys`) and the
table in ``docs/operations.md`` (:func:`docs_table`) are all derived from
those fields.

Loading never crashes the gateway: a missing, unreadable, malformed, huge or
symlinked file is logged and treated as empty, a bad value (not a number, or outside
the range declared beside its key) falls back to its default with a warning naming
the file (absolute), the key, the value and the range (a setting declared with ``clamp_above`` takes
a value above its range as its maximum instead, saying so), and an unknown key inside one
of our sections gets one warning naming the closest known key.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger

from hermes_actors.core.hops import MAX_HOP
from hermes_actors.core.names import PEER_NAME_RE
from hermes_actors.core.settings import SeedReading, Setting, coerce, default_text, setting, settings_of
from hermes_actors.core.wake import parse_wake_mode
from hermes_actors.store.relay_protocol import seed_ttl
from hermes_actors.store.yaml_file import MAX_CONFIG_BYTES, load_yaml_file, read_yaml_mapping, warn_once

__all__ = [
    "DEFAULTS",
    "MAX_CONFIG_BYTES",
    "PEER_NAME_RE",
    "SETTINGS",
    "BotModeConfig",
    "RedisConfig",
    "Setting",
    "changed_settings",
    "deep_merge",
    "docs_table",
    "load_config",
    "load_yaml_file",
    "parse_config",
    "source_of",
    "unknown_key_text",
    "unknown_keys",
]


# ── the declaration ─────────────────────────────────────────────────────────

# The sane ranges' upper ends: past them a value is a typo or absurd (a wait of 1e300 s), refused like a
# negative one (its default is used, with a warning naming the range).
DAY = 86_400.0
WEEK = 7 * DAY
YEARS_10 = 3650 * DAY  # the envelope TTL: the seed takes any whole number; a larger one never expires in practice


# ── how the seed reads the keys it shares with us (bot_relay.py) ────────────


def _seed_ttl_reading(value: Any) -> float | int | None:
    """``bot_mode.envelope_ttl_seconds`` as the seed reads it (``_envelope_ttl_seconds``: ``int(val)``).

    Whatever ``int()`` takes is taken (a bool as 0 or 1, a whole-number string); where it raises ("60.5",
    ``.inf``, NaN, a list) the seed uses its default, and so do we. A float keeps its fraction: the file relay
    applies ``int()`` where it expires (``relay_protocol.seed_ttl``: 0.5 disables, as in the seed), while the
    Redis transport, which no seed reads, expires at the fraction.

    Args:
        value: the raw value (not None: a missing key takes the default before this).

    Returns:
        The number, or None where the seed's ``int(val)`` raises.
    """
    try:
        whole = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return value if isinstance(value, float) else whole


def _seed_wait_reading(value: Any) -> float | None:
    """``bot_mode.turn_wait_seconds`` as the seed reads it (``turn_wait_seconds()``: ``max(0.0, float(val))``).

    A negative wait (and NaN) is 0, a bool 0.0 or 1.0, a numeric string its number; where ``float()`` raises
    (an int too large for a float among them) the seed uses its default, and so do we.

    Args:
        value: the raw value.

    Returns:
        The number (``inf`` included: the range clamps it), or None where the seed's expression raises.
    """
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError, OverflowError):
        return None


# The fraction a float keeps is dropped where the file relay expires (seed_ttl, the seed's int()): said, as 0.5
# then disables expiry and 900.7 expires at 900 s, though the Redis transport keeps it
SEED_TTL = SeedReading("int(value)", _seed_ttl_reading, applied=seed_ttl,
                       at_zero="that DISABLES envelope expiry on the file relay: an envelope nobody drains is "
                               "never answered `queued_expired`",
                       kept_by="the Redis transport, which no seed reads, keeps")
# A negative wait is no wait: said with the warning, since whoever wrote -5 hardly meant that
SEED_WAIT = SeedReading("max(0, float(value))", _seed_wait_reading,
                        at_zero="no wait, so a DM behind another turn of its bot (this gateway's, or another "
                                "process's holding the bot's lock) fails target_busy at once, NOT delivered")


@dataclass(frozen=True)
class RedisConfig:
    """The ``bot_mode`` keys of the Redis Streams transport (read by ``transports.redis.store``)."""

    transport: str = setting("file", "`redis://…` / `rediss://…` / `redis` (`REDIS_URL`): the Redis Streams "
                                     "transport (see \"Multi-machine with Redis\")")
    redis_claim_idle_seconds: float = setting(60.0, "a dead consumer's un-acked entries are reclaimed after this",
                                              at_least=0.01, at_most=DAY)
    redis_max_stream_len: int = setting(100_000, "backlog bound per target connection (see \"Slow consumers\")",
                                        at_least=1, at_most=100_000_000)
    redis_heartbeat_seconds: float = setting(5.0, "heartbeat period; the key expires after 3×", at_least=0.05,
                                             at_most=3600)
    redis_prefix: str = setting("hermes:bot", "key prefix (several teams on one Redis)")
    redis_block_ms: int = setting(200, "how long one blocking stream read waits for new entries (milliseconds)",
                                  at_least=1, at_most=60_000)
    connection_label: str = setting("", "how senders see this machine (\"@scout on Mini\")", max_chars=80)
    connection_id: str = setting("", "this gateway's connection id on Redis when none is given "
                                     "(`--connection-id`, `Gateway(connection_id=...)`)", max_chars=64)


@dataclass(frozen=True)
class BotModeConfig:
    """The typed ``bot_mode`` settings plus the peer names, the transport settings and the raw config."""

    # Both read by the seed from the same config.yaml (seed=): one value, one behaviour on a shared root. A
    # longer one is clamped, not refused: the seed honours it, and it means "never" in practice (our timers and
    # waits take no such numbers)
    turn_wait_seconds: float = setting(
        120.0, "how long a queued DM waits for its turn (and for another process's lock) before `target_busy`",
        at_least=0, at_most=WEEK, clamp_above="a week: longer than any turn waits in practice", seed=SEED_WAIT)
    envelope_ttl_seconds: float = setting(
        900.0, "relay envelopes older than this are never delivered late; the file relay uses whole seconds, "
               "`int()`-ed as the seed does (≤ 0 disables, and so does 0.5); the Redis transport keeps a fraction",
        at_most=YEARS_10, clamp_above="10 years: never reached in practice", seed=SEED_TTL)
    reply_wait_seconds: float = setting(
        900.0, "how long the sender waits for a relay reply before `delivery_timeout`", at_least=0, at_most=WEEK)
    # at most the deepest hop a relayed envelope or a submit request carries: a deeper limit could not work.
    # Clamped, not refused: up to 10000 was taken before, and such a config means "as deep as a DM can go"
    max_hops: int = setting(8, f"conversation depth limit (`loop_guard`); at most {MAX_HOP}, the deepest hop a "
                               "relayed envelope or a submit request carries", at_least=1, at_most=MAX_HOP,
                            clamp_above="the deepest hop a DM can carry")
    max_pair_rate: int = setting(
        30, "DMs per minute between one pair from inside turns (`loop_guard`; 0 disables)", at_least=0,
        at_most=1_000_000)
    max_queued: int = setting(
        256, "DMs waiting for one profile; past it a new DM is refused in its ack, `target_busy` (NOT delivered)",
        at_least=1, at_most=1_000_000)
    max_notify_backlog: int = setting(
        100_000, "notifications allowed to wait behind each slow `subscribe` callback; beyond it the oldest are "
                 "skipped (logged, counted) — outcomes stay available through `wait_outcome`", at_least=1,
        at_most=100_000_000)
    turn_timeout_seconds: float = setting(
        600.0, "a turn still running after this is reported `delivery_timeout` (\"do not resend blindly\") and "
               "the profile serves the next DM; a turn process (the command and hermes CLI runners) is ended then "
               "(its process group; \"was stopped; it may have been partly done\"), and the next turn's flock waits "
               "for it to be gone; an in-process turn, which cannot be ended (\"it may still complete, but a later "
               "answer is not passed on\": the DM's outcome stays `delivery_timeout`), gives its flock up (a warm "
               "turn, which hermes goes on running, keeps the bot's next DMs `target_busy` until hermes answers it); "
               "a turn that had not begun (waiting for the flock) never runs and is reported "
               "`target_busy` (NOT delivered); a DM handed to a live owner (Bot Chat window), whose turn cannot be "
               "ended, is reported `ambiguous` (\"may have been delivered — do not resend\", its mailbox record "
               "too), and no DM of that bot is handed over or run until the owner's turn returns (a ProfileActor "
               "crash restart included) or the owner is detached: the ones queued wait their `turn_wait_seconds`, "
               "then fail `target_busy` (\"the live Bot Chat owner … has not returned a turn given up on at its "
               "timeout\"); a stop does not wait for a turn that timed out", above=0, at_most=WEEK)
    idle_stop_seconds: float = setting(60.0, "an idle ProfileActor stops after this long (0: never)", at_least=0,
                                       at_most=WEEK)
    rescan_seconds: float = setting(
        2.0, "the relay's reconcile rescan (it also takes over what a gateway that stopped or died on the root "
             "left: shelves, `sent/` records, journals), the roster's change check, and, while another process holds "
             "the rooms owner lock, the try to take the group rooms over",
        at_least=0.05, at_most=3600)
    wake_sender: str = setting(
        "auto", "deliver each outcome into the sender's Bot Chat as a new turn: `auto` (on when turns run on the "
                "real Hermes), `true` or `false` (for embedders that consume outcomes themselves)",
        choice=parse_wake_mode)
    wake_retry_seconds: float = setting(
        5.0, "a sender's wake whose turn never began (`target_busy`, `runtime_offline`, the provider's rate limit "
             "or server error) runs again after this, then after the time since it was created (at most 60 s, or "
             "this if longer), until `reply_wait_seconds` passed since it was created; then it is given up",
        at_least=0.05, at_most=3600)
    peers: tuple[str, ...] = ()
    redis: RedisConfig = field(default_factory=RedisConfig)
    raw: dict[str, Any] = field(default_factory=dict, hash=False, compare=False, repr=False)

    @property
    def expiry_enabled(self) -> bool:
        """Whether relay envelopes expire (``envelope_ttl_seconds`` > 0)."""
        return self.envelope_ttl_seconds > 0

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> BotModeConfig:
        """Build the typed config from a ``config.yaml``-shaped dict, logging every problem.

        Args:
            cfg: the (merged) config; missing keys take their defaults.

        Returns:
            The config; bad values are replaced by defaults with a warning.
        """
        config, problems = parse_config(cfg)
        for problem in problems:
            logger.warning("{}", problem)
        return config


PEERS_SECTION = "bot_peers"
PEERS_DOC = ("peer gateway names (a mapping or a list), reached with `hermes -p default peer dm` "
             "(or over Redis, see below)")  # its entries' fields belong to `hermes peer`: not checked


CORE_SETTINGS = settings_of(BotModeConfig, "bot_mode")
REDIS_SETTINGS = settings_of(RedisConfig, "bot_mode")
SETTINGS: tuple[Setting, ...] = CORE_SETTINGS + REDIS_SETTINGS
def changed_settings(before: BotModeConfig, after: BotModeConfig) -> list[str]:
    """Pure: the ``bot_mode`` settings that differ, as ``"bot_mode.max_hops 8 → 2"``.

    Args:
        before: the configuration in effect.
        after: the one just read.

    Returns:
        One line per changed setting, in declaration order (empty: nothing changed).
    """
    out: list[str] = []
    for settings, old, new in ((CORE_SETTINGS, before, after), (REDIS_SETTINGS, before.redis, after.redis)):
        for spec in settings:
            was, now = getattr(old, spec.key), getattr(new, spec.key)
            if was != now:
                out.append(f"{spec.path} {was!r} → {now!r}")
    return out


# Our sections and their keys; bot_peers is keyed by peer names, so its keys are never "unknown".
KNOWN_KEYS: dict[str, tuple[str, ...]] = {"bot_mode": tuple(s.key for s in SETTINGS)}

# Merged under config.yaml (and so visible in ``BotModeConfig.raw``); the transport keys are not,
# they take their defaults when read.
DEFAULTS: dict[str, Any] = {"bot_mode": {s.key: s.default for s in CORE_SETTINGS}, PEERS_SECTION: {}}


# ── coercion ────────────────────────────────────────────────────────────────

#: Where a key was written, given its ``section.key`` (or a section's name): a file's absolute path, or
#: ``config override``; each problem line starts with it.
Source = Callable[[str], str]


def _no_source(key: str) -> str:
    """The source of a dict that came from no file (``BotModeConfig.from_dict``)."""
    return "config"


def _section(cfg: dict[str, Any], name: str, problems: list[str], source: Source) -> dict[str, Any]:
    section = cfg.get(name)
    if section is None:
        return {}
    if not isinstance(section, dict):
        problems.append(f"{source(name)}: {name} is a {type(section).__name__}, not a mapping; using defaults")
        return {}
    return section


def _coerce_all(
    specs: tuple[Setting, ...], section: dict[str, Any], problems: list[str], source: Source
) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for spec in specs:
        values[spec.key], problem = coerce(spec, section.get(spec.key, spec.default))
        if problem is not None:
            problems.append(f"{source(spec.path)}: {problem}")
    return values


def _peer_names(raw: Any, problems: list[str], where: str) -> tuple[str, ...]:
    """Valid, lowercased, de-duplicated peer names from ``bot_peers`` (a mapping, names, or dicts with ``name``)."""
    if raw is None:
        return ()
    if isinstance(raw, dict):
        candidates: list[Any] = list(raw.keys())
    elif isinstance(raw, list):
        candidates = [item.get("name") if isinstance(item, dict) else item for item in raw]
    else:
        problems.append(f"{where}: bot_peers is a {type(raw).__name__}, not a mapping or list; ignoring it")
        return ()
    names: list[str] = []
    for candidate in candidates:
        name = candidate.strip().lower() if isinstance(candidate, str) else ""
        if not PEER_NAME_RE.match(name):
            problems.append(f"{where}: bot_peers entry {candidate!r} is not a valid peer name; skipping it")
            continue
        if name not in names:
            names.append(name)
    return tuple(names)


def parse_redis_config(cfg: dict[str, Any], source: Source = _no_source) -> tuple[RedisConfig, list[str]]:
    """Pure: the transport settings of a ``config.yaml``-shaped dict and the problems found.

    Args:
        cfg: the config (any value; a non-dict counts as empty).
        source: where each key was written (see :data:`Source`).

    Returns:
        The settings (bad values replaced by defaults) and one line per problem.
    """
    problems: list[str] = []
    section = _section(cfg if isinstance(cfg, dict) else {}, "bot_mode", problems, source)
    return RedisConfig(**_coerce_all(REDIS_SETTINGS, section, problems, source)), problems


def parse_config(cfg: dict[str, Any], source: Source = _no_source) -> tuple[BotModeConfig, list[str]]:
    """Pure: the typed config of a ``config.yaml``-shaped dict and the problems found (not logged).

    Args:
        cfg: the (merged) config; missing keys take their defaults; a non-dict counts as empty.
        source: where each key was written (see :data:`Source`); :func:`load_config` names the file.

    Returns:
        The config (bad values replaced by defaults) and one line per problem, each naming where it was
        written, the key, the value and (out of range) the accepted range.
    """
    cfg = cfg if isinstance(cfg, dict) else {}
    problems: list[str] = []
    section = _section(cfg, "bot_mode", problems, source)
    values = _coerce_all(CORE_SETTINGS, section, problems, source)
    redis = RedisConfig(**_coerce_all(REDIS_SETTINGS, section, problems, source))
    peers = _peer_names(cfg.get(PEERS_SECTION), problems, source(PEERS_SECTION))
    return BotModeConfig(**values, peers=peers, redis=redis, raw=copy.deepcopy(cfg)), problems


def source_of(path: Path, overrides: dict[str, Any] | None) -> Source:
    """Pure: where a key of the merged config was written: the ``overrides`` when they hold it, else ``path``.

    Args:
        path: the config file (named absolute).
        overrides: the ``config.yaml``-shaped overrides (``Gateway(config=...)``), or None.

    Returns:
        A :data:`Source` for :func:`parse_config`.
    """
    file = str(Path(path).absolute())

    def source(key: str) -> str:
        section, _, name = key.partition(".")
        block = overrides.get(section) if isinstance(overrides, dict) else None
        if block is not None and (not name or (isinstance(block, dict) and name in block)):
            return "config override"
        return file

    return source


# ── unknown keys ────────────────────────────────────────────────────────────


def unknown_keys(raw: Any) -> list[tuple[str, str | None]]:
    """Pure: the keys inside our sections that no setting declares (other sections are Hermes's own), and
    top-level keys that look like a misspelt section of ours.

    Args:
        raw: a ``config.yaml``-shaped dict (anything else has no keys).

    Returns:
        ``(section.key, closest known section.key or None)`` per unknown key, in file order (a misspelt
        section first, as ``(name, section)``).
    """
    found: list[tuple[str, str | None]] = []
    if not isinstance(raw, dict):
        return found
    ours = [*KNOWN_KEYS, PEERS_SECTION]
    for key in raw:  # a misspelt section of ours (bot-mode, botmode, Bot_Mode) would be ignored whole, silently
        name = str(key)
        close = [] if name in ours else difflib.get_close_matches(name.lower(), ours, n=1, cutoff=0.85)
        if close:
            found.append((name, close[0]))
    for section, known in KNOWN_KEYS.items():
        block = raw.get(section)
        if not isinstance(block, dict):
            continue
        for key in block:
            name = str(key)
            if name in known:
                continue
            close = difflib.get_close_matches(name, known, n=1)
            found.append((f"{section}.{name}", f"{section}.{close[0]}" if close else None))
    return found


def unknown_key_text(source: str, key: str, suggestion: str | None) -> str:
    """One line for an unknown key, e.g. ``config.yaml: unknown key bot_mode.x (did you mean bot_mode.y?)``.

    Args:
        source: where the key was written (a file path, or ``config override``).
        key: ``section.key``.
        suggestion: the closest known ``section.key``, or None.

    Returns:
        The line.
    """
    hint = f" (did you mean {suggestion}?)" if suggestion else ""
    return f"{source}: unknown key {key}{hint}"


# ── loading ─────────────────────────────────────────────────────────────────

def load_config(root: Path, overrides: dict[str, Any] | None = None) -> BotModeConfig:
    """Load ``<root>/config.yaml`` over :data:`DEFAULTS`, then ``overrides`` over that.

    Each problem (bad file, bad value, unknown key) is logged once per process
    while it persists, however often the file is loaded.

    Args:
        root: the Hermes root (the default profile's home).
        overrides: a ``config.yaml``-shaped dict (e.g. ``Gateway(config=...)``).

    Returns:
        The typed config.
    """
    path = Path(root).absolute() / "config.yaml"  # every warning names it in full
    from_file, file_problem = read_yaml_mapping(path)
    problems = [unknown_key_text(str(path), key, hint) for key, hint in unknown_keys(from_file)]
    problems += [unknown_key_text("config override", key, hint) for key, hint in unknown_keys(overrides)]
    merged = deep_merge(DEFAULTS, from_file)
    if overrides:
        merged = deep_merge(merged, overrides)
    config, value_problems = parse_config(merged, source_of(path, overrides))
    # The CLI, the gateway and the roster each load config.yaml: one bad key gives one warning. The file's
    # own problem is keyed by its path alone, as every reader of the file (load_yaml_file) reports it.
    warn_once(str(path), [file_problem] if file_problem else [])
    warn_once(f"{path} settings", problems + value_problems)
    return config


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


# ── docs ────────────────────────────────────────────────────────────────────


def docs_table() -> str:
    """The configuration table of ``docs/operations.md`` (a test keeps the two equal).

    Returns:
        Markdown table lines: key, accepted values, default, meaning.
    """
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    rows += [f"| `{s.path}` | {s.type_text} | {default_text(s.default)} | {s.doc} |" for s in CORE_SETTINGS]
    rows.append(f"| `{PEERS_SECTION}` | mapping or list | — | {PEERS_DOC} |")
    rows += [f"| `{s.path}` | {s.type_text} | {default_text(s.default)} | {s.doc} |" for s in REDIS_SETTINGS]
    return "\n".join(rows)
