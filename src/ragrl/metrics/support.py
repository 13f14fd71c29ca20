"""HotpotQA supporting-fact and joint metrics.

A supporting fact is a ``(title, sent_id)`` pair. Predicted and gold facts are compared as sets
(duplicates count once), with the same definitions as the official HotpotQA evaluation:

* ``sp_precision = tp / (tp + fp)`` (0 when nothing is predicted), ``sp_recall = tp / (tp + fn)``
  (0 when there is no gold fact), ``sp_f1`` their harmonic mean (0 when both are 0),
  ``sp_em = 1`` iff the two sets are equal;
* ``joint_precision = precision · sp_precision``, ``joint_recall = recall · sp_recall`` (answer
  precision/recall from ``ragrl.metrics.answer.f1``), ``joint_f1`` their harmonic mean,
  ``joint_em = em · sp_em``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple


class SupportScores(NamedTuple):
    em: float
    f1: float
    precision: float
    recall: float


class JointScores(NamedTuple):
    em: float
    f1: float
    precision: float
    recall: float


def _fact_set(facts: Iterable[Sequence[Any]]) -> set[tuple[Any, ...]]:
    return {tuple(f) for f in facts}


def supporting_fact_scores(
    predicted: Iterable[Sequence[Any]], gold: Iterable[Sequence[Any]]
) -> SupportScores:
    """Supporting-fact EM/F1/precision/recall over sets of ``(title, sent_id)``."""
    pred_set, gold_set = _fact_set(predicted), _fact_set(gold)
    tp = len(pred_set & gold_set)
    fp = len(pred_set) - tp
    fn = len(gold_set) - tp
    precision = 1.0 * tp / (tp + fp) if tp + fp > 0 else 0.0
    recall = 1.0 * tp / (tp + fn) if tp + fn > 0 else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    em = 1.0 if fp + fn == 0 else 0.0
    return SupportScores(em, f1, precision, recall)


def joint_scores(
    answer_em: float,
    answer_precision: float,
    answer_recall: float,
    sp: SupportScores,
) -> JointScores:
    """HotpotQA joint metrics from the answer EM/precision/recall and the supporting-fact scores."""
    precision = answer_precision * sp.precision
    recall = answer_recall * sp.recall
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return JointScores(answer_em * sp.em, f1, precision, recall)


def parse_supporting_facts(value: Any) -> list[tuple[str, int]]:
    """Read supporting facts in either HotpotQA's ``[[title, sent_id], ...]`` form or the Hugging Face
    ``{"title": [...], "sent_id": [...]}`` form. Raises ``ValueError`` describing what is wrong."""
    if isinstance(value, dict):
        titles, sent_ids = value.get("title"), value.get("sent_id")
        if not isinstance(titles, list) or not isinstance(sent_ids, list) or len(titles) != len(sent_ids):
            raise ValueError("expected {'title': [...], 'sent_id': [...]} with lists of equal length")
        value = list(zip(titles, sent_ids, strict=True))
    if not isinstance(value, list):
        raise ValueError(f"expected a list of [title, sent_id] pairs, got {type(value).__name__}")
    out: list[tuple[str, int]] = []
    for i, fact in enumerate(value):
        if (
            not isinstance(fact, (list, tuple))
            or len(fact) != 2
            or not isinstance(fact[0], str)
            or not isinstance(fact[1], int)
            or isinstance(fact[1], bool)
        ):
            raise ValueError(f"item {i}: expected [title (string), sent_id (integer)], got {fact!r}")
        out.append((fact[0], fact[1]))
    return out
