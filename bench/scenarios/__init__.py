"""Benchmark scenarios. Importing this package registers them all (see :mod:`bench.registry`).

To add one, write a ``@scenario``-decorated function in a module here and
import that module below. Scenarios run in import (registration) order.
"""

from bench.scenarios import local  # noqa: F401  (registers local-roundtrip, local-throughput, fan-in, scale)
from bench.scenarios import relay  # noqa: F401  (registers relay-roundtrip)
