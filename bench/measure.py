"""Measurement helpers: latency summaries, process resources, machine facts.

Everything here is plain stdlib so the harness has no extra dependency.
A metrics dict ``M`` is ``{"n", "throughput_per_s", "p50_ms", "p95_ms",
"p99_ms", "max_ms"}`` plus, where measured, ``"rss_mb"`` and ``"threads"``.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

__all__ = [
    "CpuClock",
    "ResourceSampler",
    "ThreadCpu",
    "machine_info",
    "percentile",
    "read_proc_status_kb",
    "reset_peak_rss",
    "summarize",
    "thread_group",
    "us_per_item",
]


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q``-th percentile (0–100) of an ascending list, linearly interpolated.

    Args:
        sorted_values: the samples, ascending, at least one.
        q: the percentile, 0 to 100.

    Returns:
        The interpolated value (numpy's default "linear" method).
    """
    if not sorted_values:
        raise ValueError("percentile of no samples")
    rank = (len(sorted_values) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(sorted_values) - 1)
    frac = rank - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * frac


def us_per_item(seconds: float, n: int, digits: int = 2) -> float:
    """Pure: ``seconds`` spread over ``n`` items, in microseconds per item (``n`` below 1 counts as 1).

    Args:
        seconds: the total.
        n: the items.
        digits: decimals kept.
    """
    return round(seconds / max(1, n) * 1e6, digits)


def summarize(latencies_s: Iterable[float], wall_s: float, n: int | None = None) -> dict[str, Any]:
    """Build a metrics dict from per-DM latencies and the wall time they took.

    Args:
        latencies_s: one latency per DM, in seconds.
        wall_s: the wall time the DMs took (throughput = n / wall_s).
        n: the DM count (default: the number of latencies).

    Returns:
        ``{"n", "throughput_per_s", "p50_ms", "p95_ms", "p99_ms", "max_ms"}``.
    """
    values = sorted(latencies_s)
    count = len(values) if n is None else n
    if not values:
        raise ValueError("no latency samples to summarize")
    ms = [v * 1000.0 for v in values]
    return {
        "n": count,
        "throughput_per_s": round(count / wall_s, 3) if wall_s > 0 else 0.0,
        "p50_ms": round(percentile(ms, 50), 4),
        "p95_ms": round(percentile(ms, 95), 4),
        "p99_ms": round(percentile(ms, 99), 4),
        "max_ms": round(ms[-1], 4),
    }


def read_proc_status_kb(key: str) -> int | None:
    """A ``kB`` (or count) field of ``/proc/self/status`` such as ``VmRSS``.

    Returns:
        The number, or None where ``/proc`` is unavailable.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (``VmHWM``) of this process (Linux ≥ 4.0).

    Returns:
        True when the mark was reset.
    """
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _rss_mb_now() -> float:
    """The current resident set size in MiB (0.0 when unknown)."""
    kb = read_proc_status_kb("VmRSS")
    return kb / 1024.0 if kb is not None else 0.0


def _peak_rss_mb() -> float:
    """The peak RSS in MiB: ``VmHWM``, else ``getrusage`` (kB on Linux)."""
    kb = read_proc_status_kb("VmHWM")
    if kb is not None:
        return kb / 1024.0
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    except (ImportError, OSError):  # pragma: no cover — non-Unix
        return 0.0


@dataclass
class ResourceSampler:
    """Samples RSS and ``threading.active_count()`` on a thread while a block runs.

    Use as a context manager; the peaks are available after it exits.

    Args:
        interval_s: sampling period.
    """

    interval_s: float = 0.05
    peak_rss_mb: float = 0.0
    peak_threads: int = 0
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def _sample(self) -> None:
        self.peak_rss_mb = max(self.peak_rss_mb, _rss_mb_now())
        self.peak_threads = max(self.peak_threads, threading.active_count())

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> ResourceSampler:
        reset_peak_rss()
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="bench-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._sample()
        # The kernel's high-water mark catches spikes between two samples.
        self.peak_rss_mb = max(self.peak_rss_mb, _peak_rss_mb())
        # The sampler thread itself is not part of what we measure.
        self.peak_threads = max(1, self.peak_threads - 1)


@dataclass
class CpuClock:
    """CPU seconds (user + system) this process spent across all its threads, and its reaped children's.

    ``start()`` then ``stop()``: :attr:`self_s` and :attr:`children_s` hold what
    was spent in between. Process CPU time is not stolen by other jobs on the
    machine the way wall time is, so per-DM CPU is a steadier figure than a rate.
    """

    self_s: float = 0.0
    children_s: float = 0.0
    _mark: tuple[float, float] = (0.0, 0.0)

    @staticmethod
    def _now() -> tuple[float, float]:
        import resource

        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime

    def start(self) -> CpuClock:
        """Take the starting mark. Returns self."""
        self._mark = self._now()
        return self

    def stop(self) -> CpuClock:
        """Record the CPU spent since :meth:`start`. Returns self."""
        me, kids = self._now()
        self.self_s, self.children_s = me - self._mark[0], kids - self._mark[1]
        return self

    def per_item_us(self, n: int, *, children: bool = False) -> float:
        """Microseconds of CPU per item (this process, plus its children when ``children``)."""
        return us_per_item(self.self_s + (self.children_s if children else 0.0), n)


def thread_group(name: str) -> str:
    """Pure: the group a thread's CPU is reported under: its name up to the first ``-``, space or ``(``.

    ``"DispatcherActor-2 (urn:uuid:…)"`` → ``"DispatcherActor"``; ``"ProfileActor-17 (…)"`` →
    ``"ProfileActor"``; ``"journal-writer"`` → ``"journal"``.
    """
    for separator in ("(", " ", "-"):
        name = name.split(separator, 1)[0]
    return name or "unnamed"


@dataclass
class ThreadCpu:
    """CPU seconds per thread group of this process between :meth:`start` and :meth:`stop`.

    Each living thread's own CPU clock (``time.pthread_getcpuclockid``, nanoseconds; the
    ``/proc`` tick counters are too coarse for a hundred threads that each run a few ms).
    A thread that ended before :meth:`stop` is not counted — the benchmark's sender threads
    report their own CPU instead (``Run.sender_cpu_s``). :attr:`groups` stays empty where
    the platform has no per-thread CPU clocks.
    """

    groups: dict[str, float] = field(default_factory=dict)
    _mark: dict[int, float] = field(default_factory=dict)

    @staticmethod
    def _now() -> dict[int, tuple[str, float]]:
        getclock = getattr(time, "pthread_getcpuclockid", None)
        out: dict[int, tuple[str, float]] = {}
        if getclock is None:
            return out
        for thread in threading.enumerate():
            if thread.ident is None:
                continue
            try:
                out[thread.ident] = (thread.name, time.clock_gettime(getclock(thread.ident)))
            except (OSError, ValueError):  # it ended meanwhile
                continue
        return out

    def start(self) -> ThreadCpu:
        """Take the starting mark. Returns self."""
        self._mark = {ident: cpu for ident, (_, cpu) in self._now().items()}
        return self

    def stop(self) -> ThreadCpu:
        """Group the CPU every living thread spent since :meth:`start` by :func:`thread_group`. Returns self."""
        self.groups = {}
        for ident, (name, cpu) in self._now().items():
            group = thread_group(name)
            self.groups[group] = self.groups.get(group, 0.0) + cpu - self._mark.get(ident, 0.0)
        return self

    def per_item_us(self, n: int) -> dict[str, float]:
        """Microseconds of CPU per item for each group that spent at least 0.1 µs per item, largest first."""
        rows = sorted(((g, us_per_item(s, n, 1)) for g, s in self.groups.items()), key=lambda row: -row[1])
        return {group: us for group, us in rows if us >= 0.1}


@contextlib.contextmanager
def stopwatch() -> Iterator[list[float]]:
    """Yield a one-element list that holds the elapsed seconds after the block."""
    box = [0.0]
    start = time.perf_counter()
    try:
        yield box
    finally:
        box[0] = time.perf_counter() - start


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or ""


def machine_info() -> dict[str, Any]:
    """Facts about the machine and software a result was measured on (no hostname)."""
    mem_kb = None
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo", encoding="ascii") as fh:
        mem_kb = int(fh.readline().split()[1])
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "mem_total_mb": round(mem_kb / 1024) if mem_kb else None,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "pykka": _version("pykka"),
        "watchdog": _version("watchdog"),
        "orjson": _version("orjson"),
        "hermes_actors": _version("hermes-actors"),
        "executable_is_venv": sys.prefix != sys.base_prefix,
        "load_avg_1m_at_start": _load_average(),
    }


def _load_average() -> float | None:
    """The 1-minute load average when the run started: other work on the machine skews every figure."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None
