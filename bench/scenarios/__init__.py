"""Benchmark scenarios. Importing this package registers them all (see :mod:`bench.registry`).

To add one, write a ``@scenario``-decorated function in a module here and
import that module below. Scenarios run in registration order: ``local``
first (the others import it), then the rest.
"""

from bench.scenarios import local  # noqa: F401, I001  (registers local-roundtrip, local-throughput, fan-in, scale)
from bench.scenarios import durable  # noqa: F401  (registers durable-throughput)
from bench.scenarios import relay  # noqa: F401  (registers relay-roundtrip)
from bench.scenarios import redis_roundtrip  # noqa: F401  (registers redis-roundtrip)
from bench.scenarios import rooms  # noqa: F401  (registers room-settle)
