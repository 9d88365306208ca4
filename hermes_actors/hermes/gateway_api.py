"""What API server a root's ``hermes gateway run`` starts, read as hermes-agent 0.19 reads it.

hermes 0.19 (``gateway/config.py``: ``load_gateway_config``, ``_apply_env_overrides``;
``gateway/run.py``: ``load_gateway_config_for_runner``; ``gateway/platforms/api_server.py``)
resolves its ``api_server`` platform in these steps, which :func:`gateway_api_server` follows:

1. ``<root>/gateway.json`` (legacy) is the base layer: its ``platforms.api_server`` block and its
   ``multiplex_profiles``.
2. ``config.yaml``'s blocks are merged over it: ``gateway.platforms.api_server``, then
   ``platforms.api_server`` (keys win in that order; ``extra`` is merged key by key).
3. A top-level ``api_server:`` mapping with an ``enabled`` key sets ``enabled`` over all of them.
4. The variables: ``API_SERVER_ENABLED`` (true) or ``API_SERVER_KEY`` (non-empty) enable the platform,
   and then ``API_SERVER_KEY``, ``API_SERVER_PORT`` and ``API_SERVER_HOST`` replace ``extra``'s ``key``,
   ``port`` and ``host``. With multiplexing on (``GATEWAY_MULTIPLEX_PROFILES``, else ``multiplex_profiles``
   / ``gateway.multiplex_profiles``), these are read from the root's ``.env`` only (hermes' secret scope,
   whose own parser takes a value as written after ``=``, matching quotes aside: no comment stripped, no
   ``${VAR}`` expanded), not from the environment ``hermes gateway run`` was started with. Every other
   variable (``GATEWAY_MULTIPLEX_PROFILES`` too) is read from the process environment, into which hermes loads
   the root's ``.env`` with python-dotenv at its start (comments stripped, quotes removed, ``${VAR}`` expanded).
   A root ``.env`` that is not valid UTF-8 gives the secret scope nothing, while python-dotenv loads it as
   latin-1.
5. The server then takes ``extra``'s ``host``, ``port``, ``key``, each falling back to the process's
   ``API_SERVER_HOST`` / ``API_SERVER_PORT`` / ``API_SERVER_KEY`` (the environment, with the root's ``.env``
   loaded over it), then ``127.0.0.1`` / ``8642`` / none; it refuses to start without a key of at least 16
   characters that is not a placeholder. So a gateway started with ``API_SERVER_KEY`` in its environment (not in
   the root's ``.env``) and an ``api_server`` block starts it: what we read here, from our own environment,
   cannot tell (``doctor`` then probes the server's ``/health``).
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from hermes_actors.hermes.api_client import ApiServer

__all__ = [
    "DEFAULT_API_HOST", "DEFAULT_API_PORT", "MIN_KEY_CHARS", "GatewayApiServer", "RootDotenv", "dotenv_refusal",
    "gateway_api_server", "hermes_true", "load_dotenv_values", "parse_dotenv", "read_gateway_api_server",
    "read_root_dotenv",
]

DEFAULT_API_HOST = "127.0.0.1"
DEFAULT_API_PORT = 8642
MIN_KEY_CHARS = 16
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
# hermes_cli.auth._PLACEHOLDER_SECRET_VALUES (0.19): a key equal to one of these is refused like a short one
_PLACEHOLDERS = frozenset({
    "*", "**", "***", "changeme", "your_api_key", "your_api_key_here", "your-api-key", "placeholder", "example",
    "dummy", "null", "none",
})
_ENABLING = ("API_SERVER_ENABLED", "API_SERVER_KEY")
_SCOPED = (*_ENABLING, "API_SERVER_PORT", "API_SERVER_HOST")  # read from hermes' secret scope when multiplexing
_FILE_MAX = 256 * 1024


@dataclass(frozen=True)
class GatewayApiServer:
    """The API server a root's hermes gateway starts (or would, were it started now).

    Attributes:
        enabled: hermes enables its ``api_server`` platform.
        host: the address it binds.
        port: its port.
        key: the bearer key it takes (``""``: none).
        multiplex: the gateway multiplexes profiles (``/p/<profile>/`` routes to that profile).
        why: when it starts no API server though something asks for one, why (else ``""``).
    """

    enabled: bool
    host: str
    port: int
    key: str
    multiplex: bool
    why: str = ""

    @property
    def key_usable(self) -> bool:
        """hermes accepts the key: at least 16 characters (spaces around it aside), not a placeholder."""
        cleaned = self.key.strip()
        return len(cleaned) >= MIN_KEY_CHARS and cleaned.lower() not in _PLACEHOLDERS

    @property
    def starts(self) -> bool:
        """hermes starts the API server (aiohttp installed aside)."""
        return self.enabled and self.key_usable

    @property
    def key_missing(self) -> bool:
        """The platform is enabled (with multiplexing on) but hermes refuses its key: it starts no API server.
        Not said when the root's ``.env`` is not read (:attr:`why` says so: the key may be there)."""
        return self.enabled and self.multiplex and not self.key_usable and not self.why

    def server(self) -> ApiServer | None:
        """Where warm turns reach it: None when it does not start or multiplexing is off (without it the
        ``/p/<profile>/`` prefix is ignored and every turn would run as the default profile). A wildcard bind
        is reached on loopback."""
        if not (self.starts and self.multiplex):
            return None
        return self.address()

    def address(self) -> ApiServer:
        """Where it listens when it starts, whether or not it does with what we read (a gateway started with an
        ``API_SERVER_KEY`` in its own environment starts it all the same): a wildcard bind is reached on
        loopback; the key is the one we read (``""``: none)."""
        host = DEFAULT_API_HOST if self.host in ("0.0.0.0", "::", "") else self.host
        return ApiServer(host=host, port=self.port, key=self.key)


def _coerce_bool(value: Any, default: bool) -> bool:
    """hermes' ``_coerce_bool``: None and unknown words are ``default``."""
    if value is None:
        return default
    if isinstance(value, str):
        word = value.strip().lower()
        return True if word in _TRUE else False if word in _FALSE else default
    return bool(value)


def hermes_true(value: Any) -> bool:
    """Pure: whether hermes 0.19 reads a ``config.yaml`` switch (a platform's ``enabled``, ``multiplex_profiles``)
    as on: ``_coerce_bool(value, False)``, so None, ``'no'``, ``'off'``, ``'false'``, ``0`` and unknown words
    are all off.

    Args:
        value: the value as YAML gave it.

    Returns:
        True when hermes reads it as true.
    """
    return _coerce_bool(value, False)


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _multiplex(config: Mapping[str, Any], legacy: Mapping[str, Any], environ: Mapping[str, str]) -> bool:
    """Whether the gateway multiplexes profiles: the environment's ``GATEWAY_MULTIPLEX_PROFILES`` (a known word),
    else ``multiplex_profiles`` (config.yaml's top level, else gateway.json's, else config.yaml's
    ``gateway.multiplex_profiles``, else gateway.json's ``gateway.multiplex_profiles``)."""
    word = str(environ.get("GATEWAY_MULTIPLEX_PROFILES", "")).strip().lower()
    if word in _TRUE | _FALSE:
        return word in _TRUE
    value = legacy.get("multiplex_profiles")
    nested = _mapping(config.get("gateway"))
    if "multiplex_profiles" in config:
        value = config["multiplex_profiles"]
    elif "multiplex_profiles" in nested and "multiplex_profiles" not in legacy:
        value = nested["multiplex_profiles"]
    if value is None:
        value = _mapping(legacy.get("gateway")).get("multiplex_profiles")
    return hermes_true(value)


def _block(config: Mapping[str, Any], legacy: Mapping[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    """The ``api_server`` platform's ``enabled`` value once gateway.json and config.yaml's platform blocks merged,
    the top-level ``api_server.enabled`` (None: not written) and ``extra``."""
    merged = _mapping(_mapping(legacy.get("platforms")).get("api_server"))
    for platforms in (_mapping(config.get("gateway")).get("platforms"), config.get("platforms")):
        block = _mapping(_mapping(platforms).get("api_server"))
        if block:
            extra = {**_mapping(merged.get("extra")), **_mapping(block.get("extra"))}
            merged = {**merged, **block, "extra": extra}
    top = config.get("api_server")
    return merged.get("enabled"), top.get("enabled") if isinstance(top, dict) else None, _mapping(merged.get("extra"))


def gateway_api_server(
    config: Mapping[str, Any],
    legacy: Mapping[str, Any],
    dotenv: Mapping[str, str],
    environ: Mapping[str, str],
    *,
    loaded: Mapping[str, str] | None = None,
    refused: str = "",
    not_utf8: bool = False,
) -> GatewayApiServer:
    """Pure: the API server a root's ``hermes gateway run`` (0.19) starts, as hermes resolves it.

    Args:
        config: the root's ``config.yaml`` mapping.
        legacy: the root's ``gateway.json`` mapping (``{}`` when there is none).
        dotenv: the root's ``.env`` pairs as hermes' secret scope reads them (:func:`parse_dotenv`).
        environ: the environment the gateway is started with (ours stands for it).
        loaded: the root's ``.env`` pairs as python-dotenv loads them into hermes' environment
            (:func:`load_dotenv_values`; None: ``dotenv``).
        refused: why the root's ``.env`` was not read (:func:`dotenv_refusal`; ``""``: it was, or there is none).
        not_utf8: the root's ``.env`` is not valid UTF-8: hermes' secret scope reads nothing from it (``dotenv``
            is then ``{}``), while python-dotenv loads it as latin-1 (``loaded``).

    Returns:
        What hermes starts: enabled, host, port, key, multiplexing, and why it starts none when something asks
        for one (a variable it does not read there, an ``enabled: false`` over an enabled block, a ``.env`` we
        do not read).
    """
    # hermes loads the root's .env over its environment at its start (python-dotenv)
    process = {**environ, **(dotenv if loaded is None else loaded)}
    multiplex = _multiplex(config, legacy, process)
    scope = dotenv if multiplex else process  # multiplexing: the root's .env alone (hermes' secret scope)
    block_enabled, top_enabled, extra = _block(config, legacy)
    top_written = isinstance(config.get("api_server"), dict) and "enabled" in config["api_server"]
    enabled = hermes_true(top_enabled if top_written else block_enabled)
    if str(scope.get("API_SERVER_ENABLED", "")).strip().lower() in _TRUE or scope.get("API_SERVER_KEY"):
        enabled = True
        if scope.get("API_SERVER_KEY"):
            extra["key"] = scope["API_SERVER_KEY"]
        try:
            if scope.get("API_SERVER_PORT"):
                extra["port"] = int(scope["API_SERVER_PORT"])
        except ValueError:
            pass
        if scope.get("API_SERVER_HOST"):
            extra["host"] = scope["API_SERVER_HOST"]
    host = extra["host"] if "host" in extra else process.get("API_SERVER_HOST", DEFAULT_API_HOST)
    raw_port = extra.get("port")
    try:
        port = int(raw_port if raw_port is not None else process.get("API_SERVER_PORT", str(DEFAULT_API_PORT)))
    except (TypeError, ValueError):
        port = DEFAULT_API_PORT
    key = extra["key"] if "key" in extra else process.get("API_SERVER_KEY", "")
    why = ""
    usable = isinstance(key, str) and GatewayApiServer(enabled, "", 0, key, multiplex).key_usable
    if refused and not (enabled and usable):
        why = (f"hermes-actors does not read the root's .env, which {refused}, so it cannot tell what hermes reads "
               "there (hermes reads it all the same)")
    elif not_utf8 and multiplex and not (enabled and usable) and any(name in (loaded or {}) for name in _SCOPED):
        why = ("the root's .env is not valid UTF-8, and hermes 0.19, multiplexing profiles, reads the API server's "
               "variables from that .env with a strict UTF-8 reader that then reads nothing from it (re-save it as "
               "UTF-8)")
    elif not enabled:
        ignored = [name for name in _ENABLING if name not in dotenv and environ.get(name)
                   and (name != "API_SERVER_ENABLED" or str(environ[name]).strip().lower() in _TRUE)]
        if top_written and hermes_true(block_enabled):
            why = ("config.yaml's top-level api_server: block says enabled: false, which hermes reads over the "
                   "platforms.api_server block")
        elif multiplex and ignored:
            why = (f"{' and '.join(ignored)} {'are' if len(ignored) > 1 else 'is'} set in the environment but not in "
                   "the root's .env, and hermes 0.19, multiplexing profiles, reads the API server's variables from "
                   "that .env only")
    return GatewayApiServer(enabled=enabled, host=str(host or ""), port=port, key=key if isinstance(key, str) else "",
                            multiplex=multiplex, why=why)


def dotenv_refusal(mode: int, uid: int, size: int, *, our_uid: int, root_owner: int | None = None) -> str:
    """Pure: why hermes-actors does not read a root's ``.env`` (followed through symlinks, as hermes does).

    hermes reads it whatever it is; we read the settings that say where warm turns (their text and the bearer
    key) go from it, so only a file that you, root or the Hermes root's owner control: a regular file (not a
    FIFO, a device, a directory), owned by us, root or the owner of the Hermes root directory (the user hermes
    runs as, who writes its ``config.yaml``, read with no owner check, which names the API server too: running
    as root on a user's root, the user's own ``.env`` was refused), not writable by every user, at most 256 KiB.
    Another user's file (a symlink into their home) is refused, and the refusal is said where the API server
    is.

    Args:
        mode: the file's ``st_mode`` (``fstat`` of what the path leads to).
        uid: its owner.
        size: its size in bytes.
        our_uid: this process's uid.
        root_owner: the owner of the Hermes root directory (None: not known, only ours and root's are read).

    Returns:
        The refusal (``"is not a regular file"``, ...), ``""`` when it may be read.
    """
    if not stat.S_ISREG(mode):
        return "is not a regular file"
    if uid not in (our_uid, 0, root_owner):
        if root_owner is None or root_owner in (our_uid, 0):
            return f"is owned by uid {uid}, neither ours ({our_uid}) nor root's"
        return f"is owned by uid {uid}, neither ours ({our_uid}), the Hermes root's owner's ({root_owner}) nor root's"
    if mode & stat.S_IWOTH:
        return f"is writable by every user (mode {stat.S_IMODE(mode):04o})"
    if size > _FILE_MAX:
        return f"is over {_FILE_MAX // 1024} KiB ({size} bytes)"
    return ""


def parse_dotenv(text: str) -> dict[str, str]:
    """Pure: the ``KEY=VALUE`` pairs of a ``.env`` text as hermes' secret scope reads them
    (``agent/secret_scope.load_env_file``): ``export`` and matching quotes stripped, ``#`` lines skipped, the
    rest of a value kept as written (no inline comment stripped, no ``${VAR}`` expanded).

    Args:
        text: the file's text.

    Returns:
        The pairs.
    """
    pairs: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.removeprefix("export ").split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if key.strip():
            pairs[key.strip()] = value
    return pairs


def load_dotenv_values(text: str) -> dict[str, str]:
    """The pairs of a ``.env`` text as hermes loads them into its environment: python-dotenv's
    ``dotenv_values`` (inline comments stripped, quotes removed, ``${VAR}`` expanded from earlier lines and
    the environment). Without python-dotenv (hermes depends on it; ours does not), :func:`parse_dotenv`'s pairs
    with an unquoted value's `` #`` comment cut.

    Args:
        text: the file's text.

    Returns:
        The pairs that have a value.
    """
    try:
        from dotenv import dotenv_values
    except ImportError:
        return {key: _plain_value(value) for key, value in parse_dotenv(text).items()}
    return {key: value for key, value in dotenv_values(stream=io.StringIO(text)).items() if value is not None}


def _plain_value(value: str) -> str:
    """Pure: a value :func:`parse_dotenv` kept as written, as python-dotenv reads it: a quoted one up to its
    closing quote, an unquoted one up to a ``#`` that follows a space."""
    if value[:1] in ("'", '"'):
        close = value.find(value[0], 1)
        return value[1:close] if close > 0 else value
    return re.split(r"\s#", value, maxsplit=1)[0].rstrip()


@dataclass(frozen=True)
class RootDotenv:
    """A root's ``.env`` as hermes reads it.

    Attributes:
        scope: its pairs as hermes' secret scope reads them (:func:`parse_dotenv`).
        loaded: its pairs as hermes loads them into its environment (:func:`load_dotenv_values`).
        refused: why it was not read (:func:`dotenv_refusal`; ``""``: it was, or there is none).
        not_utf8: it is not valid UTF-8: hermes' secret scope reads nothing from it (``scope`` is ``{}``), and
            python-dotenv loads it as latin-1 (``loaded``), as hermes does.
    """

    scope: dict[str, str]
    loaded: dict[str, str]
    refused: str = ""
    not_utf8: bool = False


def read_root_dotenv(path: Path, *, root_owner: int | None = None) -> RootDotenv:
    """Read a root's ``.env``, following a symlink as hermes does, within :func:`dotenv_refusal`'s rules.

    Read as hermes 0.19 reads it: its secret scope (``agent.secret_scope.load_env_file``) decodes it as strict
    UTF-8 and reads nothing from a file that is not (a latin-1 byte in a comment is enough), while its start
    loads it into the environment with python-dotenv, falling back to latin-1
    (``hermes_cli.env_loader._load_dotenv_with_fallback``).

    Args:
        path: the file.
        root_owner: the owner of the Hermes root directory (:func:`dotenv_refusal`).

    Returns:
        Its pairs both ways; none when it is missing, unreadable or refused (``refused`` says why, and a
        warning is logged).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # O_NONBLOCK: a FIFO never hangs it
    except FileNotFoundError:
        return RootDotenv({}, {})
    except OSError as exc:
        return _refused(path, f"cannot be opened ({exc.strerror or exc})")
    try:
        st = os.fstat(fd)
        why = dotenv_refusal(st.st_mode, st.st_uid, st.st_size, our_uid=os.getuid(), root_owner=root_owner)
        if why:
            return _refused(path, why)
        data = os.read(fd, _FILE_MAX + 1)
    except OSError as exc:
        return _refused(path, f"cannot be read ({exc.strerror or exc})")
    finally:
        os.close(fd)
    if len(data) > _FILE_MAX:
        return _refused(path, f"grew over {_FILE_MAX // 1024} KiB while read")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        logger.warning("{} is not valid UTF-8 ({}): hermes' secret scope reads nothing from it (its API_SERVER_* "
                       "variables are not read while multiplexing profiles), and hermes loads the rest as latin-1",
                       path, exc)
        return RootDotenv({}, load_dotenv_values(data.decode("latin-1")), not_utf8=True)
    return RootDotenv(parse_dotenv(text), load_dotenv_values(text))


def _refused(path: Path, why: str) -> RootDotenv:
    logger.warning("hermes-actors does not read {}: it {} (the API server's settings there are not known to it)",
                   path, why)
    return RootDotenv({}, {}, why)


def _read_json_mapping(path: Path) -> dict[str, Any]:
    """A JSON file's mapping; ``{}`` when missing, unreadable, no mapping or over 256 KiB (hermes skips it too)."""
    try:
        if not path.is_file() or path.stat().st_size > _FILE_MAX:
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_gateway_api_server(
    root: Path, config: Mapping[str, Any], environ: Mapping[str, str]
) -> GatewayApiServer:
    """:func:`gateway_api_server` for a root: its ``gateway.json`` and ``.env`` read from disk.

    Args:
        root: the Hermes root (the gateway's ``HERMES_HOME``).
        config: the root's ``config.yaml`` mapping.
        environ: the environment the gateway is started with (ours stands for it).

    Returns:
        The API server hermes starts there.
    """
    try:
        root_owner: int | None = os.stat(root).st_uid
    except OSError:
        root_owner = None
    dotenv = read_root_dotenv(root / ".env", root_owner=root_owner)
    return gateway_api_server(config, _read_json_mapping(root / "gateway.json"), dotenv.scope, environ,
                              loaded=dotenv.loaded, refused=dotenv.refused, not_utf8=dotenv.not_utf8)
