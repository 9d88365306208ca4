"""The checks of what an embedder passes to :class:`~hermes_actors.gateway.Gateway` (and to the command runner).

Pure functions: each takes an argument as given, returns it in the form the gateway
uses, or raises an error that names the argument and says what to pass instead. Each
is called before the call it checks does anything: a bad argument is refused, never
found out half-way (a stop half-done, a DM accepted and then failed).
"""

from __future__ import annotations

import math
import numbers
import operator
import os
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

from hermes_actors.core.clipping import shown
from hermes_actors.store.hermes_root import root_path

__all__ = ["MAX_WAIT", "checked_abandon", "checked_callable", "checked_cli", "checked_config", "checked_env",
           "checked_hop", "checked_root", "checked_roster_rows", "checked_workers", "positive_seconds", "wait_seconds"]

_Hook = TypeVar("_Hook")

MAX_WAIT = 10_000_000.0  # ~115 days: longer waits overflow the clocks underneath (threading.TIMEOUT_MAX and time_t)


def wait_seconds(what: str, timeout: Any) -> float:
    """``timeout`` of ``what`` (``"stop"``, ``"wait_outcome"``…) as seconds to wait: 0 and below do not wait,
    ``inf`` waits as long as a clock can count.

    Args:
        what: the call the timeout belongs to (named in the error).
        timeout: the timeout as given.

    Returns:
        The seconds to wait, from 0 to :data:`MAX_WAIT`.

    Raises:
        TypeError: not a real number (a bool, None, a string...).
        ValueError: NaN.
    """
    seconds = _as_seconds(timeout)
    if seconds is None:
        raise TypeError(f"{what} timeout must be a number of seconds, not {type(timeout).__name__} "
                        f"({timeout!r}); 0 does not wait")
    if seconds != seconds:
        raise ValueError(f"{what} timeout is NaN; pass a number of seconds (0: do not wait)")
    return min(max(seconds, 0.0), MAX_WAIT)


def positive_seconds(what: str, seconds: Any) -> float:
    """``seconds`` given as ``what`` (``CommandRunner(timeout=...)``) as a time limit: more than 0 seconds, ``inf``
    as long as a clock can count.

    Args:
        what: the argument (named in the error).
        seconds: the value as given.

    Returns:
        The seconds, above 0 and at most :data:`MAX_WAIT`.

    Raises:
        TypeError: not a real number (a bool, None, a string...).
        ValueError: 0 or less, or NaN.
    """
    value = _as_seconds(seconds)
    if value is None:
        raise TypeError(f"{what} must be a number of seconds above 0, not {type(seconds).__name__} ({seconds!r})")
    if not value > 0:  # NaN too
        raise ValueError(f"{what} must be > 0 seconds, got {seconds!r}")
    return min(value, MAX_WAIT)


def _as_seconds(value: Any) -> float | None:
    """Pure: ``value`` as seconds when it is a number of seconds as an embedder passes one: any real number (an int,
    a float, a ``Decimal``, a ``Fraction``, numpy's), never a bool nor a string.

    Args:
        value: the value as given.

    Returns:
        The float (``±inf`` for one too large for a float, NaN for a signalling ``Decimal`` NaN), or None when
        ``value`` is no real number.
    """
    if not _is_real(value):
        return None
    try:
        return float(value)
    except OverflowError:  # an int or a Fraction past any float: past any clock too
        return math.inf if value > 0 else -math.inf
    except ValueError:  # Decimal("sNaN")
        return math.nan


def _is_real(value: Any) -> bool:
    """Pure: whether ``value`` is a real number (``numbers.Real`` or a ``Decimal``) other than a bool."""
    return not isinstance(value, bool) and isinstance(value, (numbers.Real, Decimal))


def checked_abandon(abandon: Any) -> Any:
    """``Gateway.stop(abandon=...)``: None, or what is set to stop waiting for the running turns.

    Anything with an ``is_set()`` method is taken (a ``threading.Event``, a ``multiprocessing`` one): the stop
    only asks it ``is_set()`` while it waits.

    Args:
        abandon: the value as given.

    Returns:
        ``abandon``.

    Raises:
        TypeError: neither None nor an object with an ``is_set()`` method (a bool: pass an Event and set it).
    """
    if abandon is not None and not callable(getattr(abandon, "is_set", None)):
        raise TypeError(f"stop abandon must be a threading.Event (or any object with is_set()) or None, not "
                        f"{type(abandon).__name__} ({shown(abandon)}); set the event to stop waiting for the "
                        "running turns")
    return abandon


def checked_callable(name: str, hook: _Hook | None, shape: str) -> _Hook | None:
    """A callback an embedder passes (``Gateway(on_failure=...)``, ``host_stopping``): None, or a callable.

    Args:
        name: the keyword (named in the error).
        hook: the value as given.
        shape: what the callable must be, for the error (``"a callable returning a bool"``).

    Returns:
        ``hook``.

    Raises:
        TypeError: neither None nor callable.
    """
    if hook is not None and not callable(hook):
        raise TypeError(f"{name} must be {shape}, not {type(hook).__name__}")
    return hook


def checked_workers(workers: Any) -> int:
    """``Gateway(workers=...)``: the turn worker thread cap.

    Args:
        workers: the value as given.

    Returns:
        The cap, an int: from anything ``operator.index`` takes (an int, ``numpy.int64``) or a whole float
        (``8.0``).

    Raises:
        TypeError: a bool, or not a number (a str, None).
        ValueError: a float with a fraction (``8.5``, ``inf``, NaN), or less than 1.
    """
    if isinstance(workers, bool):
        raise TypeError(f"Gateway workers must be a number of turn worker threads (e.g. 64), not a bool "
                        f"({workers!r})")
    count = _whole(workers)
    if count is None and isinstance(workers, float):
        raise ValueError(f"Gateway workers must be a whole number of turn worker threads (e.g. 64), "
                         f"not {workers!r}")
    if count is None:
        raise TypeError(f"Gateway workers must be a whole number of turn worker threads (e.g. 64), not "
                        f"{type(workers).__name__} ({shown(workers)})")
    if count < 1:
        raise ValueError(f"Gateway workers must be 1 or more (the turn worker thread cap), not {count}")
    return count


def _whole(value: Any) -> int | None:
    """Pure: ``value`` as an int when it is a whole number as an embedder passes one (the one rule for whole-number
    arguments): anything ``operator.index`` takes (an int, ``numpy.int64``) or a float without a fraction (``8.0``).

    Args:
        value: the value as given.

    Returns:
        The int, or None: a bool (``True`` is no count), a float with a fraction (``8.5``, ``inf``, NaN), or no
        number at all (a str, None).
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    try:
        return operator.index(value)
    except TypeError:
        return None


def checked_env(env: Any) -> dict[str, str]:
    """``CommandRunner(env=...)``: the variables set over ``os.environ`` for every turn's process (None: none).

    Args:
        env: the value as given.

    Returns:
        A copy of it (a new dict when None).

    Raises:
        TypeError: not a dict (a list of pairs: pass ``dict(pairs)``), or a key or value that is not a str
            (bytes: decode them, ``os.fsdecode``).
        ValueError: a key that is no variable name (empty, or holding ``=`` or a NUL), or a value holding a NUL.
    """
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be a dict of variable names to str values, not {type(env).__name__}: str keys, "
                        "str values ({'LANG': 'C.UTF-8'})" + ("; pass dict(pairs)" if isinstance(env, (list, tuple))
                                                             else ""))
    for key, value in env.items():
        if not isinstance(key, str):
            raise TypeError(f"env key {shown(key)} must be a str (a variable name), not {type(key).__name__}"
                            + _str_advice(key, "key"))
        if not key or "=" in key or "\0" in key:
            raise ValueError(f"env key {shown(key)} is not a variable name (empty, or holds '=' or a NUL)")
        if not isinstance(value, str):
            raise TypeError(f"env[{shown(key)}] must be a str, not {type(value).__name__} ({shown(value)})"
                            + (_str_advice(value, "value") or "; pass str(value)"))
        if "\0" in value:
            raise ValueError(f"env[{shown(key)}] holds a NUL character, which no environment variable can")
    return dict(env)


def _str_advice(value: Any, what: str) -> str:
    """Pure: how to pass ``value`` (an env ``key`` or ``value`` that is no str) as a str: bytes are decoded as the
    system decodes environment bytes (``os.fsdecode``); "" for anything else."""
    return f"; decode it: os.fsdecode({what})" if isinstance(value, (bytes, bytearray)) else ""


def checked_root(root: str | Path) -> Path:
    """``Gateway(root=...)`` as the absolute path of the Hermes root (whether it exists is checked at start).

    Args:
        root: the root as given.

    Returns:
        The absolute path (:func:`~hermes_actors.store.hermes_root.root_path`).

    Raises:
        TypeError: not a str or path.
        ValueError: empty (``Path("")`` is the current directory, where the relay and journal
            directories would be created by accident).
    """
    if not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"Gateway root must be the Hermes root directory (a str or path), "
                        f"not {type(root).__name__} ({root!r})")
    if not str(root).strip():
        raise ValueError(
            f"Hermes root is empty ({str(root)!r}): pass the Hermes root directory "
            "(the default profile's home, e.g. ~/.hermes), not the current directory by accident"
        )
    return root_path(root)


def checked_config(config: Any) -> dict[str, Any]:
    """``Gateway(config=...)`` as the overrides deep-merged over ``config.yaml`` (None: none).

    Args:
        config: the config as given.

    Returns:
        A copy of it (a new dict when None).

    Raises:
        TypeError: neither None nor a dict.
    """
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"Gateway config must be a dict shaped like config.yaml (e.g. "
                        f"{{'bot_mode': {{...}}}}), not {type(config).__name__}")
    return dict(config or {})


def checked_hop(hop: Any) -> int:
    """``message_agent(hop=...)``: the DM's depth in its conversation, a whole number (:func:`_whole`).

    Args:
        hop: the hop as given.

    Returns:
        The hop, an int: from anything ``operator.index`` takes (an int, ``numpy.int64``) or a whole float (``0.0``).

    Raises:
        TypeError: not a whole number (a bool, a float with a fraction, a str, None).
        ValueError: negative.
    """
    value = _whole(hop)
    if value is None:
        raise TypeError(f"message_agent hop must be a whole number (0 for a first DM), not {type(hop).__name__} "
                        f"({hop!r})")
    if value < 0:
        raise ValueError(f"message_agent hop must be 0 or more, not {hop}")
    return value


def checked_cli(cli: Any) -> str | None:
    """``CommandRunner(cli=...)`` (and ``HermesCliRunner``'s): the hermes executable, a path or a name (None: found).

    Args:
        cli: the value as given.

    Returns:
        ``cli`` as a str (a path made one with ``os.fspath``), or None when it is None.

    Raises:
        TypeError: neither None, a str nor a path (bytes: decode them, ``os.fsdecode``).
    """
    if cli is None or isinstance(cli, str):
        return cli
    name = os.fspath(cli) if isinstance(cli, os.PathLike) else cli
    if not isinstance(name, str):
        raise TypeError(f"cli must be the hermes executable, a path or a name as a str (e.g. 'hermes' or "
                        f"'/usr/local/bin/hermes'), not {type(cli).__name__} ({shown(cli)})"
                        + _str_advice(name, "cli"))
    return name


def checked_roster_rows(rows: Any) -> list[Any]:
    """``Gateway.relay_sync_roster(rows)``: the Desktop's ``agents`` list (its rows are checked one by one later).

    Args:
        rows: the value as given.

    Returns:
        ``rows``.

    Raises:
        TypeError: not a list (None included: pass ``[]`` to empty the remote roster).
    """
    if not isinstance(rows, list):
        raise TypeError(f"relay_sync_roster rows must be the Desktop's agents list (a list of row dicts, e.g. "
                        f"[{{'profile': 'bob', 'connection_id': 'mini'}}]), not {type(rows).__name__} "
                        f"({shown(rows)}); pass [] to empty the remote roster")
    return rows
