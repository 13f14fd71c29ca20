"""Mean and standard deviation over runs: the "3 seeds, mean ± std" that the papers report.

``aggregate_runs`` takes one JSON object per run (a ``scores.json`` of ``ragrl eval``, a ``summary.json``
of a training run, ...) and, for every numeric value, gives its mean, its sample standard deviation
(n − 1 in the denominator, as the papers' "± std"; ``None`` for a single run), the number of runs that
have it and the values in run order. Nested objects are read with their keys joined by ``/``
(``held_out/after GRPO/em``). Booleans, strings and lists are not numbers and are listed as such; a value
that some runs lack is listed with its count, never averaged as zero.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any


def numeric_fields(record: dict[str, Any], prefix: str = "") -> tuple[dict[str, float], list[str]]:
    """The finite numbers of a JSON object by their ``/``-joined keys, and the keys of everything else."""
    numbers: dict[str, float] = {}
    other: list[str] = []
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            inner, rest = numeric_fields(value, f"{name}/")
            numbers.update(inner)
            other += rest
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            numbers[name] = float(value)
        else:
            other.append(name)
    return numbers, other


def aggregate_runs(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``{"runs": n, "metrics": {name: {mean, std, n, values}}, "partial": [...], "not_numbers": [...]}``:
    every numeric field over the runs that have it (see the module docstring)."""
    fields = [numeric_fields(r) for r in records]
    names = list(dict.fromkeys(k for numbers, _ in fields for k in numbers))
    metrics = {}
    for name in names:
        values = [numbers[name] for numbers, _ in fields if name in numbers]
        metrics[name] = {
            "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else None,
            "n": len(values),
            "values": values,
        }
    return {
        "runs": len(records),
        "metrics": metrics,
        "partial": [name for name, m in metrics.items() if m["n"] < len(records)],
        "not_numbers": sorted({k for _, other in fields for k in other} - set(names)),
    }
