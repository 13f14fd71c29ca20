"""Trainer helpers shared by GRPO and SFT."""

from __future__ import annotations

from ragrl.data.schema import Example
from ragrl.train.base import collapse_check


def test_collapse_check_separates_learning_from_a_constant_answer():
    """A policy answering ``unknown`` to everything scores the unanswerable share of EM; the check shows
    EM 0 on the answerable questions and one answer taking every row."""
    examples = [Example(f"q{i}", "?", ["x"], metadata={"answerable": i >= 8}) for i in range(10)]
    rows = [{"id": ex.id, "em": float(i < 2), "prediction": "unknown"} for i, ex in enumerate(examples)]
    assert collapse_check(rows, examples) == {
        "eval/em_answerable": 0.0,
        "eval/top_answer": "unknown",
        "eval/top_answer_share": 1.0,
    }
    rows = [{"id": "q8", "em": 1.0, "prediction": "x"}, {"id": "q9", "em": 0.0, "prediction": None}]
    assert collapse_check(rows, examples) == {
        "eval/em_answerable": 0.5,
        "eval/top_answer": "x",
        "eval/top_answer_share": 0.5,
    }
    rows = [{"id": "q9", "em": 0.0, "prediction": None}]
    assert collapse_check(rows, examples)["eval/top_answer"] == "(no answer)"
    assert collapse_check([], examples)["eval/top_answer_share"] == 0.0
