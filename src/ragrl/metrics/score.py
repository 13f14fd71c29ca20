"""Score a predictions file against a canonical question file (the engine behind ``ragrl score``).

Predictions are jsonl, one object per line::

    {"id": "...", "prediction": "answer text",
     "retrieved_ids": ["p1", ...],            # optional: retrieval metrics vs metadata.supporting_ids
     "retrieved_texts": ["...", ...],         # optional: answer_recall@k (FlashRAG retrieval_recall)
     "supporting_facts": [["Title", 0], ...]} # optional: sp_* and joint_* vs metadata.supporting_facts

Ids present on only one side are counted and listed (``missing_predictions``, ``unknown_ids``), never
silently dropped. Means are over the examples that were scored for that metric; with
``missing_as_zero`` a gold example without a prediction scores 0 on every metric it would have had,
which is how the official HotpotQA script averages (it divides by the number of gold examples).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ragrl.data.io import iter_jsonl, read_examples
from ragrl.data.schema import Example
from ragrl.errors import DataError, RagrlError
from ragrl.metrics.answer import ANSWER_METRICS, answer_scores, f1
from ragrl.metrics.normalize import get_variant
from ragrl.metrics.retrieval import retrieval_scores
from ragrl.metrics.support import joint_scores, parse_supporting_facts, supporting_fact_scores

SP_METRICS = ("sp_em", "sp_f1", "sp_precision", "sp_recall")
JOINT_METRICS = ("joint_em", "joint_f1", "joint_precision", "joint_recall")
RETRIEVAL_AT_K = ("recall", "full_recall", "precision", "answer_recall")
RETRIEVAL_PLAIN = ("mrr", "map")
METRIC_GROUPS = {
    "answer": ANSWER_METRICS,
    "sp": SP_METRICS,
    "joint": JOINT_METRICS,
    "retrieval": tuple(f"{m}@k" for m in RETRIEVAL_AT_K) + RETRIEVAL_PLAIN,
}
DEFAULT_KS = (1, 2, 5, 10)
_AT_K = re.compile(r"^(recall|full_recall|precision|answer_recall)@(\d+)$")
FIRST_IDS = 10


@dataclass
class Prediction:
    id: str
    prediction: str
    retrieved_ids: list[str] | None = None
    retrieved_texts: list[str] | None = None
    supporting_facts: list[tuple[str, int]] | None = None
    line: int | None = None


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def read_predictions(path: str | Path) -> list[Prediction]:
    """Read a predictions jsonl file; a bad record raises ``DataError`` naming file, line and field."""
    out: list[Prediction] = []
    seen: dict[str, int] = {}
    for lineno, rec in iter_jsonl(path):

        def fail(message: str, field_name: str | None = None, lineno: int = lineno) -> DataError:
            return DataError(message, path=path, line=lineno, field=field_name)

        if not isinstance(rec, dict):
            raise fail(f"expected a JSON object, got {type(rec).__name__}")
        if "id" not in rec:
            raise fail("missing", "id")
        pid = rec["id"]
        if not isinstance(pid, (str, int)) or isinstance(pid, bool) or str(pid) == "":
            raise fail("must be a non-empty string or integer", "id")
        pid = str(pid)
        if pid in seen:
            raise fail(f"duplicate id {pid!r} (first on line {seen[pid]})", "id")
        if "prediction" not in rec:
            raise fail("missing", "prediction")
        if not isinstance(rec["prediction"], str):
            raise fail(f"must be a string, got {type(rec['prediction']).__name__}", "prediction")
        pred = Prediction(pid, rec["prediction"], line=lineno)
        for key in ("retrieved_ids", "retrieved_texts"):
            if rec.get(key) is not None:
                if not _str_list(rec[key]):
                    raise fail("must be a list of strings", key)
                setattr(pred, key, list(rec[key]))
        if rec.get("supporting_facts") is not None:
            try:
                pred.supporting_facts = parse_supporting_facts(rec["supporting_facts"])
            except ValueError as e:
                raise fail(str(e), "supporting_facts") from None
        seen[pid] = lineno
        out.append(pred)
    return out


@dataclass
class MetricSelection:
    """Which metrics to report. ``names=None`` means every applicable metric.

    ``ks`` are the cut-offs computed; ``base_ks`` (``--ks``) are those the ``retrieval`` group reports.
    """

    names: set[str] | None = None
    ks: tuple[int, ...] = DEFAULT_KS
    groups: set[str] = field(default_factory=set)
    base_ks: tuple[int, ...] = DEFAULT_KS

    def wanted(self, key: str) -> bool:
        if self.names is None or key in self.names:
            return True
        if "retrieval" in self.groups:
            if key in RETRIEVAL_PLAIN:
                return True
            m = _AT_K.match(key)
            return m is not None and int(m.group(2)) in self.base_ks
        return False


def unscored(selection: MetricSelection, counts: Mapping[str, int]) -> dict[str, str]:
    """The metrics ``--metrics`` named that no example could be scored on (``counts``: the summary's
    ``n_per_metric``), each with what it reads: a metric asked for is never dropped without a word."""
    asked = sorted(selection.names or ())
    if "retrieval" in selection.groups and not any(_AT_K.match(k) or k in RETRIEVAL_PLAIN for k in counts):
        asked.append("retrieval")
    out = {}
    for name in asked:
        if counts.get(name):
            continue
        if name in SP_METRICS or name in JOINT_METRICS:
            out[name] = "it reads the predictions' supporting_facts and the gold's supporting facts"
        elif name.startswith("answer_recall@"):
            out[name] = "it reads the predictions' retrieved_texts"
        elif name == "retrieval" or name in RETRIEVAL_PLAIN or _AT_K.match(name):
            out[name] = "it reads the predictions' retrieved_ids and the gold's supporting passage ids"
        else:
            out[name] = "no example was scored"
    return out


def valid_metric_names() -> list[str]:
    return (
        list(METRIC_GROUPS)
        + list(ANSWER_METRICS)
        + list(SP_METRICS)
        + list(JOINT_METRICS)
        + [f"{m}@K" for m in RETRIEVAL_AT_K]
        + list(RETRIEVAL_PLAIN)
    )


def parse_metrics(spec: str | None, ks: Sequence[int] = DEFAULT_KS) -> MetricSelection:
    """Parse ``--metrics`` (comma-separated names or groups) and ``--ks``.

    Names: the groups ``answer``, ``sp``, ``joint``, ``retrieval``; any single metric; retrieval
    metrics at any cut-off (``recall@3``). Unknown names raise ``RagrlError`` listing the valid ones.
    """
    base_ks = tuple(sorted(set(ks)))
    for k in base_ks:
        if k < 1:
            raise RagrlError(f"--ks: cut-offs must be positive integers, got {k}")
    if spec is None or not spec.strip():
        return MetricSelection(None, base_ks or DEFAULT_KS, base_ks=base_ks or DEFAULT_KS)
    names: set[str] = set()
    groups: set[str] = set()
    extra_ks: set[int] = set()
    singles = set(ANSWER_METRICS) | set(SP_METRICS) | set(JOINT_METRICS) | set(RETRIEVAL_PLAIN)
    for raw in spec.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        if name in METRIC_GROUPS:
            groups.add(name)
            if name != "retrieval":
                names.update(METRIC_GROUPS[name])
        elif name in singles:
            names.add(name)
        elif (m := _AT_K.match(name)) and int(m.group(2)) >= 1:
            names.add(name)
            extra_ks.add(int(m.group(2)))
        else:
            raise RagrlError(
                f"unknown metric {raw.strip()!r}; valid: {', '.join(valid_metric_names())} "
                "(K a positive integer, e.g. recall@5)"
            )
    all_ks = tuple(sorted(set(base_ks) | extra_ks)) if "retrieval" in groups else tuple(sorted(extra_ks))
    return MetricSelection(names, all_ks or base_ks, groups, base_ks=base_ks)


def _gold_facts(ex: Example, gold_path: str | Path) -> list[tuple[str, int]] | None:
    raw = ex.metadata.get("supporting_facts")
    if raw is None:
        return None
    try:
        return parse_supporting_facts(raw)
    except ValueError as e:
        raise DataError(
            f"example {ex.id!r}: {e}", path=gold_path, field="metadata.supporting_facts"
        ) from None


def score_example(
    ex: Example,
    pred: Prediction,
    variant: str,
    selection: MetricSelection,
    gold_facts: list[tuple[str, int]] | None,
) -> dict[str, float]:
    """Every applicable metric for one (gold, prediction) pair, filtered by ``selection``."""
    row: dict[str, float] = {}
    answer: dict[str, float] | None = None
    if ex.answers:
        answer = answer_scores(pred.prediction, ex.answers, variant)
        row.update(answer)
    if pred.supporting_facts is not None and gold_facts is not None:
        sp = supporting_fact_scores(pred.supporting_facts, gold_facts)
        row.update(zip(SP_METRICS, map(float, sp), strict=True))
        if answer is not None:
            _, precision, recall = f1(pred.prediction, ex.answers, variant)
            joint = joint_scores(answer["em"], precision, recall, sp)
            row.update(zip(JOINT_METRICS, map(float, joint), strict=True))
    if pred.retrieved_ids is not None or pred.retrieved_texts is not None:
        row.update(
            retrieval_scores(
                pred.retrieved_ids or [],
                pred.retrieved_texts,
                ex.supporting_ids if pred.retrieved_ids is not None else [],
                ex.answers,
                ks=selection.ks,
                variant=variant,
            )
        )
    return {k: v for k, v in row.items() if selection.wanted(k)}


@dataclass
class ScoreResult:
    summary: dict[str, Any]
    per_example: list[dict[str, Any]]


def _first(ids: Iterable[str]) -> list[str]:
    out = []
    for i in ids:
        if len(out) == FIRST_IDS:
            break
        out.append(i)
    return out


def bootstrap_ci(
    per_example: Sequence[dict[str, Any]],
    keys: Iterable[str],
    n_resamples: int,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, list[float]]:
    """Percentile bootstrap confidence intervals of the mean of each metric (resampling examples)."""
    rng = np.random.default_rng(seed)
    alpha = (1 - level) / 2
    out: dict[str, list[float]] = {}
    for key in keys:
        vals = np.array([r[key] for r in per_example if isinstance(r.get(key), (int, float))], dtype=float)
        if len(vals) == 0:
            continue
        means = np.empty(n_resamples)
        chunk = max(1, 2_000_000 // len(vals))
        for start in range(0, n_resamples, chunk):
            stop = min(n_resamples, start + chunk)
            idx = rng.integers(0, len(vals), size=(stop - start, len(vals)))
            means[start:stop] = vals[idx].mean(axis=1)
        lo, hi = np.quantile(means, [alpha, 1 - alpha])
        out[key] = [float(lo), float(hi)]
    return out


NO_GROUP = "(none)"
"""The group of the examples without the metadata key ``by=`` groups on."""


def group_of(ex: Example, key: str, gold_path: str | Path = "<gold>") -> str:
    """The group ``by=key`` puts ``ex`` in: its ``metadata[key]``, a string as it is, a number or a boolean
    as JSON writes it (``2``, ``true``); ``NO_GROUP`` when it has none. Anything else is a ``DataError``."""
    value = ex.metadata.get(key)
    if value is None:
        return NO_GROUP
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # hops 2.0 is hops 2
    if isinstance(value, (bool, int, float)):
        return json.dumps(value)
    raise DataError(
        f"example {ex.id!r}: a {type(value).__name__}, not a string or a number, so it names no group",
        path=gold_path,
        field=f"metadata.{key}",
    )


def check_group_key(examples: Sequence[Example], key: str, gold_path: str | Path = "<gold>") -> str:
    """``key`` stripped, checked before anything is scored: some question has ``metadata[key]`` and every
    one that has it names a group (``group_of``). Otherwise a ``RagrlError`` or ``DataError``."""
    key = key.strip()
    if not key:
        raise RagrlError("--by: give a metadata key to group the questions by (source, type, hops, ...)")
    found = [group_of(ex, key, gold_path) for ex in examples]
    if examples and all(group == NO_GROUP for group in found):
        seen = sorted({k for ex in examples for k in ex.metadata if ex.metadata[k] is not None})
        raise DataError(
            f"no question has metadata.{key} to group by (their metadata keys: {', '.join(seen) or 'none'})",
            path=gold_path,
        )
    return key


def _group_order(group: str) -> tuple[bool, float, str]:
    """Numbers in numeric order (``2`` before ``10``), then names, ``NO_GROUP`` last."""
    try:
        number = float(group)
    except ValueError:
        number = math.inf
    if not math.isfinite(number):  # "nan", "inf": names, not numbers
        number = math.inf
    return group == NO_GROUP, number, group


def group_means(
    per_example: Sequence[dict[str, Any]],
    groups: Sequence[str],
    metric_keys: Sequence[str],
    *,
    bootstrap: int = 0,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """Every metric's mean within each group (``groups[i]`` is ``per_example[i]``'s), averaged as the whole
    file's are, with ``n`` (the group's rows) and, with ``bootstrap``, the group's own ``ci95``. Groups are
    sorted by name (numbers in numeric order), ``NO_GROUP`` last."""
    rows_of: dict[str, list[dict[str, Any]]] = {}
    for row, group in zip(per_example, groups, strict=True):
        rows_of.setdefault(group, []).append(row)
    out: dict[str, dict[str, Any]] = {}
    for group in sorted(rows_of, key=_group_order):
        rows = rows_of[group]
        entry: dict[str, Any] = {"n": len(rows)}
        for key in metric_keys:
            vals = [row[key] for row in rows if key in row]
            if vals:
                entry[key] = math.fsum(vals) / len(vals)
        if bootstrap > 0:
            entry["ci95"] = bootstrap_ci(rows, metric_keys, bootstrap, seed)
        out[group] = entry
    return out


def score_predictions(
    examples: Sequence[Example],
    predictions: Sequence[Prediction],
    *,
    variant: str = "squad",
    selection: MetricSelection | None = None,
    missing_as_zero: bool = False,
    bootstrap: int = 0,
    seed: int = 0,
    gold_path: str | Path = "<gold>",
    by: str | None = None,
) -> ScoreResult:
    """Score ``predictions`` against ``examples``; returns the aggregate summary and per-example rows.

    ``by`` (a metadata key such as ``source``, ``type`` or ``hops``) adds ``summary["by"]``: the key and
    every metric's mean within each of its values (``group_means``), e.g. one row per dataset of a mixed
    test file. No example having the key is a ``DataError``."""
    canonical = get_variant(variant).name
    if by is not None:
        by = check_group_key(examples, by, gold_path)
    selection = selection or MetricSelection()
    by_id = {p.id: p for p in predictions}
    gold_ids = {ex.id for ex in examples}
    missing = [ex.id for ex in examples if ex.id not in by_id]
    unknown = [p.id for p in predictions if p.id not in gold_ids]

    any_sp = any(p.supporting_facts is not None for p in predictions)
    any_retrieval = any(p.retrieved_ids is not None for p in predictions)
    any_texts = any(p.retrieved_texts is not None for p in predictions)

    per_example: list[dict[str, Any]] = []
    groups: list[str] = []
    n_without_answers = 0
    n_without_gold_ids = 0
    n_without_gold_facts = 0
    for ex in examples:
        # Gold facts are only read (and validated) when some prediction has supporting facts.
        gold_facts = _gold_facts(ex, gold_path) if any_sp else None
        pred = by_id.get(ex.id)
        if pred is None:
            if not missing_as_zero:
                continue
            # Score an empty prediction with the same optional fields the others have, then zero it.
            pred = Prediction(
                ex.id,
                "",
                retrieved_ids=[] if any_retrieval else None,
                retrieved_texts=[] if any_texts else None,
                supporting_facts=[] if any_sp else None,
            )
            row: dict[str, Any] = {k: 0.0 for k in score_example(ex, pred, variant, selection, gold_facts)}
            row = {"id": ex.id, "missing": True, **row}
        else:
            row = {"id": ex.id, **score_example(ex, pred, variant, selection, gold_facts)}
        if not ex.answers:
            n_without_answers += 1
        if pred.retrieved_ids is not None and not ex.supporting_ids:
            n_without_gold_ids += 1
        if pred.supporting_facts is not None and gold_facts is None:
            n_without_gold_facts += 1
        per_example.append(row)
        if by is not None:
            groups.append(group_of(ex, by, gold_path))

    metric_keys: list[str] = []
    for row in per_example:
        for k in row:
            if k not in ("id", "missing") and k not in metric_keys:
                metric_keys.append(k)
    summary: dict[str, Any] = {"variant": canonical}
    for key in metric_keys:
        vals = [row[key] for row in per_example if key in row]
        summary[key] = math.fsum(vals) / len(vals)
    summary["n_gold"] = len(examples)
    summary["n_predictions"] = len(predictions)
    summary["n_scored"] = len(examples) - len(missing)
    summary["missing_as_zero"] = missing_as_zero
    counts = {key: sum(1 for row in per_example if key in row) for key in metric_keys}
    summary["n_per_metric"] = counts
    summary["missing_predictions"] = {"count": len(missing), "first_ids": _first(missing)}
    summary["unknown_ids"] = {"count": len(unknown), "first_ids": _first(unknown)}
    if n_without_answers:
        summary["n_without_answers"] = n_without_answers
    if any_retrieval:
        summary["n_without_gold_ids"] = n_without_gold_ids
    if any_sp:
        summary["n_without_gold_supporting_facts"] = n_without_gold_facts
    if bootstrap > 0:
        summary["bootstrap"] = {
            "resamples": bootstrap,
            "seed": seed,
            "ci95": bootstrap_ci(per_example, metric_keys, bootstrap, seed),
        }
    if by is not None:
        summary["by"] = {
            "key": by,
            "groups": group_means(per_example, groups, metric_keys, bootstrap=bootstrap, seed=seed),
        }
    return ScoreResult(summary, per_example)


def score_files(
    predictions_path: str | Path,
    gold_path: str | Path,
    *,
    variant: str = "squad",
    metrics: str | None = None,
    ks: Sequence[int] = DEFAULT_KS,
    missing_as_zero: bool = False,
    bootstrap: int = 0,
    seed: int = 0,
    by: str | None = None,
) -> ScoreResult:
    """Read both files and score them (see ``score_predictions``)."""
    get_variant(variant)
    selection = parse_metrics(metrics, ks)
    examples, _ = read_examples(gold_path)
    predictions = read_predictions(predictions_path)
    return score_predictions(
        examples,
        predictions,
        variant=variant,
        selection=selection,
        missing_as_zero=missing_as_zero,
        bootstrap=bootstrap,
        seed=seed,
        gold_path=gold_path,
        by=by,
    )
