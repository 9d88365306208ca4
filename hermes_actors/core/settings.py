"""How a setting is declared, and the pure rules derived from one declaration.

A setting is a dataclass field made with :func:`setting`: the field name is the
``config.yaml`` key, the annotation (``float``, ``int`` or ``str``) the type, and
the call holds the default, the bounds and the one-line doc.
:func:`settings_of` reads them back as :class:`Setting` rows and :func:`coerce`
turns a raw value into the declared type. The declarations themselves live in
:mod:`hermes_actors.core.config`.

A setting the seed reads too (from the same ``config.yaml``) declares the
seed's reading (:class:`SeedReading`): its value is then taken as the seed
takes it, so two implementations on one root agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal

__all__ = ["Kind", "SeedReading", "Setting", "coerce", "default_text", "setting", "settings_of"]

Kind = Literal["float", "int", "text"]
_KINDS: dict[str, Kind] = {"float": "float", "int": "int", "str": "text"}  # annotation → kind
_SPEC = "hermes_actors.setting"  # the dataclass field metadata key


@dataclass(frozen=True)
class SeedReading:
    """How the seed reads a setting it shares with us: one expression and its pure implementation."""

    rule: str  # the seed's expression, as the docs and warnings show it: ``int(value)``
    read: Callable[[Any], float | int | None]  # the seed's value, or None where its expression raises
    # what the setting then does when a value not written as 0 is read as 0 (a negative wait, a TTL of 0.5):
    # said after the warning, as the user wrote something else ("" says nothing more)
    at_zero: str = ""
    # where the seed's expression is applied to the number we keep rather than where it is read (the file relay
    # ``int()``s the TTL where it expires): that application; None: ``read`` already gives what applies
    applied: Callable[[float], float | int] | None = None
    # who uses the number as kept where ``applied`` drops part of it, said after the warning
    # ("the Redis transport, which no seed reads, keeps")
    kept_by: str = ""


@dataclass(frozen=True)
class _Spec:
    """What :func:`setting` records beside the default."""

    doc: str
    minimum: float | None
    inclusive: bool
    maximum: float | None
    max_chars: int | None
    choice: Callable[[Any], str | None] | None
    clamp_above: str | None
    seed: SeedReading | None


def setting(
    default: float | str,
    doc: str,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    clamp_above: str | None = None,
    max_chars: int | None = None,
    choice: Callable[[Any], str | None] | None = None,
    seed: SeedReading | None = None,
) -> Any:
    """Declare one setting as a dataclass field.

    Args:
        default: the value when the key is missing or bad.
        doc: one line for the docs table (say what ``0`` or ``≤ 0`` means when it disables something).
        at_least: the smallest accepted number (inclusive).
        above: numbers must be greater than this (exclusive).
        at_most: the largest accepted number (inclusive): past it a value is absurd (a wait of 1e300
            seconds, a queue of 10**12), refused like one below the minimum.
        clamp_above: what ``at_most`` is (``"the deepest hop a DM can carry"``): a value past it is then taken
            as ``at_most``, with a warning saying so, instead of being refused: for a limit that only grew
            tighter than an older version's, where a larger value meant "as much as there is" (a value below
            the minimum, or of the wrong type, still takes the default).
        max_chars: text longer than this is cut, with a warning.
        choice: for text with a fixed set of values: maps a raw value (bools included) to its canonical
            text, or None when it is not one of them (then the default is used, with a warning).
        seed: for a number the seed reads from the same ``config.yaml``: its reading replaces ours (where the
            seed's expression raises, the default is used, as the seed does; a value it reads otherwise than
            as the plain number written, a bool, a text, a negative wait or a TTL's fraction, is taken so with
            a warning); the range
            still applies to the number it gives.

    Returns:
        A dataclass field (typed ``Any`` so the annotation keeps its type for mypy).

    Raises:
        ValueError: both ``at_least`` and ``above`` given, or ``clamp_above`` without ``at_most``.
    """
    if at_least is not None and above is not None:
        raise ValueError("give at_least or above, not both")
    if clamp_above is not None and at_most is None:
        raise ValueError("clamp_above needs at_most: the value a larger one is taken as")
    minimum = at_least if above is None else above
    spec = _Spec(doc=doc, minimum=minimum, inclusive=above is None, maximum=at_most, max_chars=max_chars,
                 choice=choice, clamp_above=clamp_above, seed=seed)
    return field(default=default, metadata={_SPEC: spec})


@dataclass(frozen=True)
class Setting:
    """One declared setting, as the rest of this module sees it."""

    section: str
    key: str
    kind: Kind
    default: float | int | str
    minimum: float | None
    inclusive: bool
    max_chars: int | None
    doc: str
    choice: Callable[[Any], str | None] | None = None
    maximum: float | None = None
    clamp_above: str | None = None  # what ``maximum`` is: a larger value is taken as it (see :func:`setting`)
    seed: SeedReading | None = None  # how the seed reads it (see :func:`setting`)

    @property
    def path(self) -> str:
        """``section.key``, as written in messages and docs."""
        return f"{self.section}.{self.key}"

    @property
    def type_text(self) -> str:
        """The accepted values in words, e.g. ``number > 0``."""
        if self.choice is not None:
            return "one of the values named in the description"
        base = {"float": "number", "int": "integer", "text": "text"}[self.kind]
        if self.max_chars is not None:
            return f"{base} (≤ {self.max_chars} characters)"
        bounds = self.range_text
        if self.clamp_above is not None and self.maximum is not None:
            bounds += f" (a larger one is taken as {_bound_text(self.maximum)})"
        text = f"{base} {bounds}" if bounds else base
        return text if self.seed is None else f"{text}, read as the seed reads it: `{self.seed.rule}`"

    @property
    def range_text(self) -> str:
        """The accepted range of a number in words, e.g. ``≥ 0.05, ≤ 3600`` (empty: unbounded)."""
        parts = [] if self.minimum is None else [f"{'≥' if self.inclusive else '>'} {_bound_text(self.minimum)}"]
        parts += [] if self.maximum is None else [f"≤ {_bound_text(self.maximum)}"]
        return ", ".join(parts)


def _bound_text(bound: float) -> str:
    """A bound as the docs and warnings show it: whole numbers in full (``604800``, not ``604800.0`` or
    ``6.048e+05``), others as ``%g`` (``0.05``)."""
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def settings_of(cls: type, section: str) -> tuple[Setting, ...]:
    """The settings a dataclass declares with :func:`setting`, in field order.

    Args:
        cls: the dataclass.
        section: the ``config.yaml`` section its keys live in.

    Returns:
        One :class:`Setting` per declared field (other fields are skipped).

    Raises:
        TypeError: a declared field is not annotated ``float``, ``int`` or ``str``.
    """
    out: list[Setting] = []
    for f in fields(cls):
        spec = f.metadata.get(_SPEC)
        if spec is None:
            continue
        kind = _KINDS.get(str(f.type))
        if kind is None or f.default is MISSING:
            raise TypeError(f"setting {cls.__name__}.{f.name}: annotate float, int or str and give a default")
        out.append(Setting(section, f.name, kind, f.default, spec.minimum, spec.inclusive, spec.max_chars, spec.doc,
                           spec.choice, spec.maximum, spec.clamp_above, spec.seed))
    return tuple(out)


def _to_number(value: Any, kind: Kind) -> float | int | None:
    """A finite float or an integral int from a number or numeric string (bools refused); None when not."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value.strip()) if isinstance(value, str) else float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int too large for a float (1 and 400 zeros)
        return None
    if not math.isfinite(number):
        return None
    if kind == "int":
        return int(number) if number.is_integer() else None
    return number


def coerce(spec: Setting, value: Any) -> tuple[float | int | str, str | None]:
    """Pure: one raw value as its setting's type.

    Args:
        spec: the setting.
        value: the raw value from the config.

    Returns:
        ``(value, None)``, or ``(default or cut text or maximum, problem)`` where ``problem``
        is one line naming the key and the value (and, for a number out of range, the range; for
        one above the maximum of a ``clamp_above`` setting, the maximum it is taken as; for a setting
        the seed reads, the seed's expression: a value it reads otherwise than written is taken so,
        said in ``problem``, with what it does at 0 when it is read as 0: :attr:`SeedReading.at_zero`);
        whoever read the value puts where it was written in front (``parse_config``).
    """
    default = spec.default
    if spec.choice is not None:
        picked = spec.choice(value) if value is not None else str(default)
        if picked is None:
            return default, f"{spec.path}={value!r} is not one of the accepted values; using {default!r}"
        return picked, None
    if spec.kind == "text":
        if value is None:
            return default, None
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            return default, f"{spec.path}={value!r} is not valid text; using default {default!r}"
        text = str(value).strip() or str(default)
        if spec.max_chars is not None and len(text) > spec.max_chars:
            return text[:spec.max_chars], f"{spec.path} is longer than {spec.max_chars} characters; cut"
        return text, None
    plain = _to_number(value, spec.kind)
    number = plain if spec.seed is None else spec.seed.read(value)
    if number is None and spec.seed is not None:  # the seed falls back to its default there too
        return default, f"{spec.path}={value!r} is not a number the seed's `{spec.seed.rule}` reads; using " \
                        f"default {default}, as the seed does"
    if number is None:  # inf and NaN too: never a sane wait or count
        must = f" (it must be {spec.range_text})" if spec.range_text else ""
        return default, f"{spec.path}={value!r} is not a valid {spec.kind}{must}; using default {default}"
    minimum, maximum = spec.minimum, spec.maximum
    too_low = minimum is not None and (number < minimum or (not spec.inclusive and number == minimum))
    if not too_low and maximum is not None and number > maximum and spec.clamp_above is not None:
        limit = int(maximum) if spec.kind == "int" else float(maximum)
        return limit, f"{spec.path}={value!r} is above {_bound_text(maximum)}, {spec.clamp_above}; using {limit}"
    if too_low or (maximum is not None and number > maximum):
        return default, (f"{spec.path}={value!r} is out of range (it must be {spec.range_text}); "
                         f"using default {default}")
    number = float(number) if spec.kind == "float" else number  # in range: never too large for a float
    if spec.seed is not None:  # odd: said, yet taken as the seed takes it
        return number, _seed_oddity(spec.path, spec.seed, value, plain, number)
    return number, None


def _seed_oddity(path: str, seed: SeedReading, value: Any, plain: float | int | None,
                 number: float | int) -> str | None:
    """Pure: the warning for a value the seed reads otherwise than as written, or None when it is read as written.

    Not as written: a bool or a text read as a number, a number the seed's expression changes (a negative wait
    is 0), or one whose application drops part of it (a TTL of 900.7 expires at 900 s, one of 0.5 never).

    Args:
        path: ``section.key``.
        seed: the setting's seed reading.
        value: the raw value.
        plain: the value as a plain number (None: not one, a bool or a non-numeric text).
        number: the value taken.

    Returns:
        One line naming the key, the value, what it is read as and (read as 0) what that does, or None.
    """
    applied = number if seed.applied is None else seed.applied(number)
    if not isinstance(value, bool | str) and plain == number and applied == number:
        return None
    shown = number if applied == number else applied  # 1.0 stays 1.0; 900.7 is 900
    text = f"{path}={value!r} is read as {shown!r}, as the seed reads it (`{seed.rule}`)"
    if applied == 0 and seed.at_zero:
        text += f": {seed.at_zero}"
    if applied != number and seed.kept_by:
        text += f"; {seed.kept_by} {number!r}"
    return text


def default_text(value: float | int | str) -> str:
    """A default as the docs show it: ``2.0`` → ``2``, empty text → ``—``."""
    if isinstance(value, str):
        return value or "—"
    return f"{value:g}" if isinstance(value, float) else str(value)
