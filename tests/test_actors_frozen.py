"""actors.fast_init: the same frozen dataclass, built without object.__setattr__ per field."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import InitVar, dataclass, field
from typing import Any

import pytest

from actors.frozen import fast_init


def _pair() -> tuple[type[Any], type[Any]]:
    """The same class twice: the stock dataclass, and the one given fast_init."""

    def make() -> type[Any]:
        @dataclass(frozen=True, slots=True)
        class Message:
            key: str
            count: int
            label: str = "none"
            tags: dict[str, int] = field(default_factory=dict)
            items: tuple[int, ...] = ()

        return Message

    return make(), fast_init(make())


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("k", 1), {}),
        (("k",), {"count": 2}),
        ((), {"key": "k", "count": 3, "label": "x"}),
        (("k", 4, "y", {"a": 1}, (1, 2)), {}),
        (("k", 5), {"items": (3,), "tags": {"b": 2}}),
    ],
)
def test_builds_what_the_dataclass_init_builds(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    stock, fast = _pair()
    want, got = stock(*args, **kwargs), fast(*args, **kwargs)
    assert dataclasses.astuple(got) == dataclasses.astuple(want)
    assert repr(got).split("(", 1)[1] == repr(want).split("(", 1)[1]


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((), {}, "missing"),
        (("k",), {}, "missing"),
        (("k", 1), {"nope": 1}, "unexpected keyword"),
        (("k", 1), {"key": "again"}, "multiple values"),
        (("k", 1, "l", {}, (), "extra"), {}, "positional"),
    ],
)
def test_refuses_the_calls_the_dataclass_init_refuses(
    args: tuple[Any, ...], kwargs: dict[str, Any], error: str
) -> None:
    stock, fast = _pair()
    with pytest.raises(TypeError, match=error):
        stock(*args, **kwargs)
    with pytest.raises(TypeError, match=error):
        fast(*args, **kwargs)


def test_instances_stay_frozen_and_keep_every_dataclass_behaviour() -> None:
    _, fast = _pair()
    one = fast("k", 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.count = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        del one.key
    assert one.tags == {} and fast("k", 1).tags is not one.tags, "a fresh default per instance"
    assert dataclasses.replace(one, count=9) == fast("k", 9)
    assert copy.deepcopy(one) == one and copy.copy(one) == one
    assert hash(fast("k", 1, "x", items=(1,)).items) == hash((1,))
    assert fast.__init__.__qualname__.endswith("Message.__init__")


def test_a_class_without_fields_still_builds() -> None:
    @fast_init
    @dataclass(frozen=True, slots=True)
    class Ping:
        pass

    assert Ping() == Ping()


def _not_frozen() -> type[Any]:
    @dataclass(slots=True)
    class A:
        x: int

    return A


def _no_slots() -> type[Any]:
    @dataclass(frozen=True)
    class A:
        x: int

    return A


def _post_init() -> type[Any]:
    @dataclass(frozen=True, slots=True)
    class A:
        x: int

        def __post_init__(self) -> None:
            pass

    return A


def _keyword_only() -> type[Any]:
    @dataclass(frozen=True, slots=True, kw_only=True)
    class A:
        x: int

    return A


def _not_in_init() -> type[Any]:
    @dataclass(frozen=True, slots=True)
    class A:
        x: int = field(default=0, init=False)

    return A


def _init_var() -> type[Any]:
    @dataclass(frozen=True, slots=True)
    class A:
        x: int
        y: InitVar[int] = 0

    return A


def _clashing_name() -> type[Any]:
    @dataclass(frozen=True, slots=True)
    class A:
        _set_0: int

    return A


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (_not_frozen, "not a frozen dataclass"),
        (_no_slots, "no slots"),
        (_post_init, "__post_init__"),
        (_keyword_only, "keyword-only"),
        (_not_in_init, "init=False"),
        (_init_var, "InitVar"),
        (_clashing_name, "clashes"),
        (lambda: int, "not a frozen dataclass"),
    ],
)
def test_refuses_a_class_whose_init_it_would_not_reproduce(make: Any, error: str) -> None:
    with pytest.raises(TypeError, match=error):
        fast_init(make())
