"""Delivery ids: uuid4-shaped, 32 lowercase hex chars, made without a syscall.

``uuid.uuid4()`` reads ``os.urandom``, a syscall that releases the GIL; on the
Dispatcher's hot path, re-acquiring the GIL behind busy sender threads cost
more than everything else it does per DM. Ids need to be unique, not secret
(files holding them are 0600), so a PRNG seeded once from the OS is enough.
"""

from __future__ import annotations

import os
import random
import threading

__all__ = ["new_delivery_id"]

_VERSION_MASK = ~(0xF000 << 64) & ((1 << 128) - 1)
_VARIANT_MASK = ~(0xC000 << 48) & ((1 << 128) - 1)
_VERSION_4 = 0x4000 << 64
_VARIANT_RFC = 0x8000 << 48

_local = threading.local()


def _rng() -> random.Random:
    rng: random.Random | None = getattr(_local, "rng", None)
    if rng is None or getattr(_local, "pid", None) != os.getpid():  # reseed in a forked child
        rng = _local.rng = random.Random(os.urandom(32))
        _local.pid = os.getpid()
    return rng


def new_delivery_id() -> str:
    """A random uuid4 as 32 lowercase hex chars."""
    value = (_rng().getrandbits(128) & _VERSION_MASK & _VARIANT_MASK) | _VERSION_4 | _VARIANT_RFC
    return f"{value:032x}"
