"""Faster construction of frozen, slotted dataclasses (the messages actors exchange).

``@dataclass(frozen=True)`` makes the generated ``__init__`` set every field
through ``object.__setattr__``, because the class's own ``__setattr__`` refuses.
On CPython 3.11 that costs about 0.45 µs per field: a 12-field frozen message
takes 7.3 µs to build where the same class unfrozen takes 2.6 µs (measured with
``timeit``), and a message travels through several such objects on its way.

With ``slots=True`` every field is a slot, and a slot's descriptor sets the value
directly, without ``__setattr__``. :func:`fast_init` replaces the dataclass's
``__init__`` with one that does only that: the same signature, defaults and
default factories, and instances exactly as frozen afterwards (``__setattr__``
and ``__delattr__`` still refuse). ``dataclasses.replace``, ``==``, ``repr``,
``hash`` and pickling are untouched.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, TypeVar

__all__ = ["fast_init"]

T = TypeVar("T")


class _UseFactory:
    """The default of a parameter whose field has a ``default_factory``."""

    def __repr__(self) -> str:
        return "<factory>"


_USE_FACTORY = _UseFactory()
_RESERVED = ("_set_", "_default_", "_factory_")  # prefixes of the generated __init__'s own names


def fast_init(cls: type[T]) -> type[T]:
    """Give a frozen, slotted dataclass an ``__init__`` that fills its slots directly.

    Apply it above ``@dataclass(frozen=True, slots=True)``.

    Args:
        cls: the dataclass.

    Returns:
        ``cls``, with its ``__init__`` replaced.

    Raises:
        TypeError: ``cls`` is not a frozen dataclass with ``slots=True``, or uses what
            this ``__init__`` does not reproduce (``__post_init__``, ``InitVar``,
            ``init=False`` or keyword-only fields).
    """
    name = getattr(cls, "__qualname__", repr(cls))
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise TypeError(f"fast_init: {name} is not a frozen dataclass")
    if "__slots__" not in cls.__dict__:
        raise TypeError(f"fast_init: {name} has no slots (use @dataclass(frozen=True, slots=True))")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"fast_init: {name} has a __post_init__, which this __init__ would not call")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if len(getattr(cls, "__dataclass_fields__", {})) != len(fields):
        raise TypeError(f"fast_init: {name} has InitVar or ClassVar pseudo-fields")
    namespace: dict[str, Any] = {"_USE_FACTORY": _USE_FACTORY}
    arguments: list[str] = []
    body: list[str] = []
    for index, field in enumerate(fields):
        if not field.init or field.kw_only:
            raise TypeError(f"fast_init: {name}.{field.name} is init=False or keyword-only")
        if field.name == "self" or field.name in namespace or field.name.startswith(_RESERVED):
            raise TypeError(f"fast_init: {name}.{field.name} clashes with a name the generated __init__ uses")
        slot = cls.__dict__.get(field.name)
        if not isinstance(slot, types.MemberDescriptorType):
            raise TypeError(f"fast_init: {name}.{field.name} is not a slot")
        setter = f"_set_{index}"
        namespace[setter] = slot.__set__
        value = field.name
        if field.default is not dataclasses.MISSING:
            namespace[f"_default_{index}"] = field.default
            arguments.append(f"{field.name}=_default_{index}")
        elif field.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{index}"] = field.default_factory
            arguments.append(f"{field.name}=_USE_FACTORY")
            value = f"_factory_{index}() if {field.name} is _USE_FACTORY else {field.name}"
        else:
            arguments.append(field.name)
        body.append(f"    {setter}(self, {value})\n")
    source = f"def __init__(self, {', '.join(arguments)}):\n" + ("".join(body) or "    pass\n")
    exec(source, namespace)  # as dataclasses itself builds __init__: from source text
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
