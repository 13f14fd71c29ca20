"""The demo's closing-table helpers (src/ragrl/train/demo.py)."""

from __future__ import annotations

from ragrl.data.schema import Example
from ragrl.train.demo import em_by_type


def test_em_by_type_splits_the_answerable_questions_by_their_type():
    """Three bridge and two comparison questions are answerable, one comparison is not, one question
    has no type: the unanswerable one is left out, the untyped one is named, the rows of questions not
    in the set are ignored."""
    kinds = ["bridge", "bridge", "bridge", "comparison", "comparison", "comparison", None]
    examples = [
        Example(f"q{i}", "?", ["x"], metadata={"type": kind, "answerable": i != 5} if kind else {})
        for i, kind in enumerate(kinds)
    ]
    ems = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    rows = [{"id": ex.id, "em": em} for ex, em in zip(examples, ems, strict=True)]
    rows.append({"id": "elsewhere", "em": 1.0})
    assert em_by_type(rows, examples) == {
        "bridge": {"n": 3, "right": 1.0, "em": 0.333333},
        "comparison": {"n": 2, "right": 2.0, "em": 1.0},
        "untyped": {"n": 1, "right": 0.0, "em": 0.0},
    }
    assert em_by_type([], examples) == {}


def test_the_held_out_row_counts_refusals_of_answerable_questions():
    """A refusal (the unanswerable questions' ``unknown``, in any case or with an article) of an answerable
    question is a wrong answer to the outcomes, not a missing one: the row counts it apart. Four
    answerable questions, one refused, one unanswered, one right; the unanswerable question's right
    ``unknown`` is not counted."""
    from types import SimpleNamespace

    from ragrl.train.demo import _held_out

    examples = [
        Example(f"q{i}", "?", ["x"], metadata={"answerable": i < 4, "type": "bridge"}) for i in range(5)
    ]
    predictions = ["x", "The Unknown", None, "y", "unknown"]
    outcomes = ["right", "wrong_missing_evidence", "no_answer", "wrong_with_all_evidence", "right"]
    rows = [
        {"id": ex.id, "prediction": p, "em": float(o == "right"), "outcome": o}
        for ex, p, o in zip(examples, predictions, outcomes, strict=True)
    ]
    row = _held_out(SimpleNamespace(rows=rows, scores={"em": 0.4}), examples)
    assert row["refused_answerable"] == 0.25 and row["em_answerable"] == 0.25
    assert row["outcomes_answerable"]["no_answer"] == 1
