"""What the memory benchmarks share: a process's resident memory now and its high-water mark, and
``timed_passes``, which runs a pass a warm-up and ``repeats`` more times and reports its peak above the
memory resident when it was called (each benchmark runs one arm per process, so the peak is the arm's)."""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any


def resident_mb() -> float:
    """Resident memory now (``/proc/self/statm``), MiB: not a high-water mark."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def high_water_mb() -> float:
    """The process's peak resident memory so far (``ru_maxrss``, kB on Linux), MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed_passes(one_pass: Callable[[], Any], repeats: int) -> dict[str, float]:
    """``one_pass`` once as a warm-up, then ``repeats`` times: ``seconds`` (the median of the timed
    passes), ``peak_above_mb`` (the high-water mark after them above the memory resident at the call)
    and ``setup_above_mb`` (the high-water mark the set-up had already reached above it: a peak at or
    below that one is not the passes')."""
    base, setup_peak = resident_mb(), high_water_mb()
    seconds = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        one_pass()
        seconds.append(time.perf_counter() - t0)
    return {
        "seconds": statistics.median(seconds[1:]),
        "peak_above_mb": high_water_mb() - base,
        "setup_above_mb": setup_peak - base,
    }
