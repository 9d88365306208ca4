"""Delivery ids: uuid4-shaped, 32 lowercase hex chars; the one generator and the one validator.

A relay envelope's id is a delivery id too (the seed's envelopes use uuid4 hex),
so envelopes, replies, journal records, DM files and live-handoff records all
check ids here.

``uuid.uuid4()`` reads ``os.urandom``, a syscall that releases the GIL; on the
Dispatcher's hot path, re-acquiring the GIL behind busy sender threads cost
more than everything else it does per DM. Ids need to be unique, not secret
(files holding them are 0600), so a PRNG seeded once from the OS is enough.
"""

from __future__ import annotations

import os
import random
import re
import threading
from typing import Any, TypeGuard

from hermes_actors.errors import ValidationError

__all__ = ["DELIVERY_ID_RE", "id_of_file_name", "is_delivery_id", "new_delivery_id", "validate_delivery_id"]

DELIVERY_ID_RE = re.compile(r"^[0-9a-f]{32}\Z")  # \Z: "$" would accept a trailing newline

_VERSION_MASK = ~(0xF000 << 64) & ((1 << 128) - 1)
_VARIANT_MASK = ~(0xC000 << 48) & ((1 << 128) - 1)
_VERSION_4 = 0x4000 << 64
_VARIANT_RFC = 0x8000 << 48
# Combined once: two 128-bit operations per id instead of four
_KEPT_BITS = _VERSION_MASK & _VARIANT_MASK
_SET_BITS = _VERSION_4 | _VARIANT_RFC

_local = threading.local()  # .rng: the calling thread's generator, seeded from the OS on its first id


def _forget_generators() -> None:
    """In a forked child: every generator is seeded anew on its next use (a copied one would repeat the
    parent's ids). A fork hook, not a ``getpid`` syscall on every id."""
    global _local
    _local = threading.local()


if hasattr(os, "register_at_fork"):  # POSIX; where there is no fork there is nothing to reseed after
    os.register_at_fork(after_in_child=_forget_generators)


def _rng() -> random.Random:
    rng: random.Random | None = getattr(_local, "rng", None)
    if rng is None:
        rng = _local.rng = random.Random(os.urandom(32))
    return rng


def new_delivery_id() -> str:
    """A random uuid4 as 32 lowercase hex chars (deliveries and relay envelopes alike).

    Returns:
        The id.
    """
    return "%032x" % ((_rng().getrandbits(128) & _KEPT_BITS) | _SET_BITS)  # %-format: cheaper than f"{:032x}"


def is_delivery_id(value: Any) -> TypeGuard[str]:
    """Whether ``value`` is a delivery id (a str of 32 lowercase hex chars).

    Args:
        value: anything (untrusted input included).

    Returns:
        True for a well-formed id.
    """
    return isinstance(value, str) and DELIVERY_ID_RE.match(value) is not None


def validate_delivery_id(value: Any, *, what: str = "delivery id", file_id: str | None = None) -> str:
    """Check a delivery id before it names a file or a record.

    Args:
        value: the candidate id.
        what: what the id is called in the error ("envelope id", ...).
        file_id: when given, the id must equal it (the stem of the file it was read from).

    Returns:
        The id.

    Raises:
        ValidationError: not 32 lowercase hex chars, or not ``file_id``.
    """
    if not is_delivery_id(value):
        raise ValidationError(f"invalid {what} {value!r}: must be 32 lowercase hex characters")
    if file_id is not None and value != file_id:
        raise ValidationError(f"id {value!r} does not match its file name {file_id!r}")
    return value


def id_of_file_name(name: str) -> str | None:
    """The id of a ``<id>.json`` file name; None for any other name.

    Args:
        name: a directory entry's name.

    Returns:
        The id, or None.
    """
    stem = name.removesuffix(".json")
    return stem if stem != name and is_delivery_id(stem) else None
