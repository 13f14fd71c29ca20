"""Is B better than A on the same questions? A paired comparison of two scored runs (``ragrl compare``).

Two evaluations of one question file differ by a few points; whether that is more than the noise of
those questions is what a paired test says. Each question is scored by both runs, so the test works on
the per-question differences ``d_i = b_i - a_i``:

* the **delta**: the mean of ``d`` (B's mean minus A's, on the questions both scored);
* a **paired bootstrap** 95% interval of the delta: the questions resampled with replacement, the same
  question drawn for both runs (Koehn 2004; the percentile interval);
* a **sign-flip permutation** p-value, two-sided: under "A and B are the same policy" each ``d_i`` is as
  likely ``-d_i``, so the delta is compared with those of random sign flips,
  ``p = (1 + #{|delta*| >= |delta|}) / (1 + resamples)``;
* for a 0/1 metric (EM), the **exact McNemar** test: only the questions the runs disagree on count,
  ``b`` that B gets right and A wrong, ``c`` the other way; under the null each is a fair coin, so
  ``p = min(1, 2 * P(Binomial(b + c, 1/2) <= min(b, c)))``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragrl.data.io import iter_jsonl
from ragrl.errors import DataError, RagrlError


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for ``b`` and ``c`` discordant pairs (1.0 when there are none)."""
    n = b + c
    if n == 0:
        return 1.0
    term = tail = 1  # C(n, 0); each next term from the last, so the sum costs min(b, c) small products
    for i in range(min(b, c)):
        term = term * (n - i) // (i + 1)
        tail += term
    return min(1.0, 2 * tail / 2**n)


def paired_comparison(
    a: Sequence[float], b: Sequence[float], *, resamples: int = 10_000, seed: int = 0
) -> dict[str, Any]:
    """The paired statistics of one metric: ``a[i]`` and ``b[i]`` are the two runs' scores of question
    ``i``. Returns ``n``, both means, ``delta`` (b - a), ``ci95`` (paired bootstrap), ``p_value``
    (sign-flip permutation) and, when every score is 0 or 1, ``mcnemar`` ``{b_only, a_only, p_value}``."""
    if len(a) != len(b):
        raise RagrlError(f"paired scores need one of each per question, got {len(a)} and {len(b)}")
    if not a:
        raise RagrlError("no question is scored by both runs: nothing to compare")
    if resamples < 1:
        raise RagrlError(f"resamples must be at least 1, got {resamples}")
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise RagrlError("paired scores must be finite numbers (a NaN or an infinity was given)")
    d = y - x
    delta = math.fsum(d) / len(d)
    rng = np.random.default_rng(seed)
    boot = np.empty(resamples)
    flips = np.empty(resamples)
    chunk = max(1, 2_000_000 // len(d))
    for start in range(0, resamples, chunk):
        stop = min(resamples, start + chunk)
        boot[start:stop] = d[rng.integers(0, len(d), size=(stop - start, len(d)))].mean(axis=1)
        signs = rng.integers(0, 2, size=(stop - start, len(d))) * 2 - 1
        flips[start:stop] = (signs * d).mean(axis=1)
    lo, hi = np.quantile(boot, [0.025, 0.975])
    extreme = int(np.sum(np.abs(flips) >= abs(delta) - 1e-12))
    out: dict[str, Any] = {
        "n": len(d),
        "a": math.fsum(x) / len(x),
        "b": math.fsum(y) / len(y),
        "delta": delta,
        "ci95": [float(lo), float(hi)],
        "p_value": (1 + extreme) / (1 + resamples),
    }
    if all(v in (0.0, 1.0) for v in (*x, *y)):
        b_only = int(np.sum((y == 1) & (x == 0)))
        a_only = int(np.sum((x == 1) & (y == 0)))
        out["mcnemar"] = {"b_only": b_only, "a_only": a_only, "p_value": mcnemar_exact(b_only, a_only)}
    return out


def read_scored(path: str | Path) -> tuple[Path, list[dict[str, Any]]]:
    """The per-question rows of a scored run: a ``per_example.jsonl`` (``ragrl eval``, ``ragrl score
    --per-example``) or an evaluation folder holding one. A line that is not an object with an ``id``, or
    an id seen before, is a ``DataError`` naming the file and line."""
    path = Path(path)
    if path.is_dir():
        path = path / "per_example.jsonl"
        if not path.is_file():
            raise RagrlError(
                f"{path.parent}: holds no per_example.jsonl (an evaluation folder of `ragrl eval`)"
            )
    rows: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for lineno, rec in iter_jsonl(path):
        if not isinstance(rec, dict):
            raise DataError(f"expected a JSON object, got {type(rec).__name__}", path=path, line=lineno)
        if "id" not in rec or isinstance(rec["id"], bool) or not isinstance(rec["id"], (str, int)):
            raise DataError("missing, or not a string or an integer", path=path, line=lineno, field="id")
        rid = str(rec["id"])
        if rid in seen:
            raise DataError(
                f"duplicate id {rid!r} (first on line {seen[rid]})", path=path, line=lineno, field="id"
            )
        seen[rid] = lineno
        rows.append(rec)
    return path, rows


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def pair_rows(
    a_rows: Sequence[Mapping[str, Any]],
    b_rows: Sequence[Mapping[str, Any]],
    metric: str,
    names: tuple[str, str] = ("A", "B"),
) -> tuple[list[float], list[float], dict[str, list[str]]]:
    """Each run's ``metric`` on the ids both scored, in A's order, and what was left out: the ids only
    one run has (``a_only``, ``b_only``) and those both have but one did not score on ``metric``
    (``unscored``). A run in which no row has ``metric`` is an error naming it."""
    for rows, name in ((a_rows, names[0]), (b_rows, names[1])):
        if not any(_number(r.get(metric)) for r in rows):
            keys = sorted({k for r in rows for k, v in r.items() if _number(v)})
            raise RagrlError(
                f"{name}: no row has the metric {metric!r} (numbers there: {', '.join(keys) or 'none'})"
            )
    b_by_id = {str(r["id"]): r for r in b_rows}
    a_ids = {str(r["id"]) for r in a_rows}
    xs: list[float] = []
    ys: list[float] = []
    left_out: dict[str, list[str]] = {
        "a_only": [],
        "b_only": [i for i in b_by_id if i not in a_ids],
        "unscored": [],
    }
    for row in a_rows:
        rid = str(row["id"])
        other = b_by_id.get(rid)
        if other is None:
            left_out["a_only"].append(rid)
        elif _number(row.get(metric)) and _number(other.get(metric)):
            xs.append(float(row[metric]))
            ys.append(float(other[metric]))
        else:
            left_out["unscored"].append(rid)
    return xs, ys, left_out
