"""Retrieval metrics over one ranked list.

Conventions (the same for every id-based metric):

* the ranked list is deduplicated first (the first occurrence of an id keeps its rank), then cut at
  ``k``; so a retriever that returns the same passage twice gains nothing from it;
* ``precision_at_k`` divides by ``k`` even when fewer than ``k`` ids were retrieved;
* an empty gold set raises ``ValueError``: recall over nothing is undefined, and counting such
  examples as 0 (or 1) would bias the mean. ``retrieval_scores`` leaves the id-based keys out for
  such an example and ``aggregate_retrieval`` reports how many there were (``n_without_gold``);
* ``k`` must be a positive integer (``None`` where allowed means the whole list).

``answer_recall_at_k`` is FlashRAG's ``retrieval_recall``: it needs no gold ids, only the answers.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence

from ragrl.metrics.normalize import get_variant


def _check_k(k: int | None, allow_none: bool = False) -> None:
    if k is None and allow_none:
        return
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")


def _gold_set(gold_ids: Collection[str]) -> set[str]:
    gold = set(gold_ids)
    if not gold:
        raise ValueError("no gold ids: retrieval metrics are undefined for this example")
    return gold


def _ranked(retrieved_ids: Sequence[str], k: int | None) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for rid in retrieved_ids:
        if rid not in seen:
            seen.add(rid)
            out.append(rid)
            if k is not None and len(out) == k:
                break
    return out


def recall_at_k(retrieved_ids: Sequence[str], gold_ids: Collection[str], k: int) -> float:
    """``|top-k ∩ gold| / |gold|``."""
    _check_k(k)
    gold = _gold_set(gold_ids)
    return len(gold.intersection(_ranked(retrieved_ids, k))) / len(gold)


def full_recall_at_k(retrieved_ids: Sequence[str], gold_ids: Collection[str], k: int) -> float:
    """1.0 iff every gold id is in the top k (multi-hop "all supporting passages retrieved")."""
    _check_k(k)
    gold = _gold_set(gold_ids)
    return 1.0 if gold.issubset(_ranked(retrieved_ids, k)) else 0.0


def precision_at_k(retrieved_ids: Sequence[str], gold_ids: Collection[str], k: int) -> float:
    """``|top-k ∩ gold| / k``."""
    _check_k(k)
    gold = _gold_set(gold_ids)
    return len(gold.intersection(_ranked(retrieved_ids, k))) / k


def answer_recall_at_k(
    retrieved_texts: Sequence[str], answers: Sequence[str], k: int, variant: str = "squad"
) -> float:
    """1.0 iff some normalized answer is a substring of some normalized top-k text (FlashRAG's
    ``retrieval_recall``). Raises ``ValueError`` when there are no answers."""
    _check_k(k)
    if isinstance(answers, str):
        answers = [answers]
    if not answers:
        raise ValueError("no answers: answer recall is undefined for this example")
    norm = get_variant(variant).function
    golds = [norm(a) for a in answers]
    for text in list(retrieved_texts)[:k]:
        hay = norm(text)
        if any(g in hay for g in golds):
            return 1.0
    return 0.0


def reciprocal_rank(retrieved_ids: Sequence[str], gold_ids: Collection[str], k: int | None = None) -> float:
    """``1 / rank`` of the first gold id within the top k (0.0 if none)."""
    _check_k(k, allow_none=True)
    gold = _gold_set(gold_ids)
    for rank, rid in enumerate(_ranked(retrieved_ids, k), start=1):
        if rid in gold:
            return 1.0 / rank
    return 0.0


def average_precision(retrieved_ids: Sequence[str], gold_ids: Collection[str], k: int | None = None) -> float:
    """Sum of precision@i over the ranks i (≤ k) holding a gold id, divided by ``|gold|``."""
    _check_k(k, allow_none=True)
    gold = _gold_set(gold_ids)
    hits = 0
    total = 0.0
    for rank, rid in enumerate(_ranked(retrieved_ids, k), start=1):
        if rid in gold:
            hits += 1
            total += hits / rank
    return total / len(gold)


def retrieval_scores(
    retrieved_ids: Sequence[str],
    retrieved_texts: Sequence[str] | None,
    gold_ids: Collection[str],
    answers: Sequence[str],
    ks: Iterable[int] = (1, 2, 5, 10),
    variant: str = "squad",
) -> dict[str, float]:
    """All retrieval metrics for one example.

    Keys: ``recall@k``, ``full_recall@k``, ``precision@k`` for each k, ``mrr`` and ``map`` (over the
    whole list) when ``gold_ids`` is non-empty; ``answer_recall@k`` when ``retrieved_texts`` is given
    and there are answers.
    """
    ks = list(ks)
    for k in ks:
        _check_k(k)
    out: dict[str, float] = {}
    if gold_ids:
        for k in ks:
            out[f"recall@{k}"] = recall_at_k(retrieved_ids, gold_ids, k)
            out[f"full_recall@{k}"] = full_recall_at_k(retrieved_ids, gold_ids, k)
            out[f"precision@{k}"] = precision_at_k(retrieved_ids, gold_ids, k)
        out["mrr"] = reciprocal_rank(retrieved_ids, gold_ids)
        out["map"] = average_precision(retrieved_ids, gold_ids)
    if retrieved_texts is not None and answers:
        for k in ks:
            out[f"answer_recall@{k}"] = answer_recall_at_k(retrieved_texts, answers, k, variant)
    return out


def aggregate_retrieval(rows: Iterable[dict[str, float]]) -> dict[str, float]:
    """Mean of each metric over the rows that have it, plus ``n`` (rows seen) and ``n_without_gold``
    (rows without id-based metrics, i.e. examples that had no gold ids)."""
    values: dict[str, list[float]] = {}
    n = 0
    n_without_gold = 0
    for row in rows:
        n += 1
        if "mrr" not in row:
            n_without_gold += 1
        for key, value in row.items():
            values.setdefault(key, []).append(value)
    out: dict[str, float] = {key: math.fsum(vals) / len(vals) for key, vals in values.items()}
    out["n"] = n
    out["n_without_gold"] = n_without_gold
    return out
