"""Outcomes: why an episode ended as it did, read from its actions (``ragrl.rollout.outcomes``)."""

from ragrl.data.schema import Example
from ragrl.rollout.outcomes import OUTCOMES, count_outcomes, outcome
from ragrl.rollout.trajectory import Action, Trajectory

QUESTION = Example("q", "When was the director of Thaesukren born?", ["1988"], supporting_ids=["p1", "p2"])


def _episode(*searches: list[str], answer: str | None = "Brilam") -> Trajectory:
    actions = [Action("search", f"query {i}", turn=i, retrieved_ids=ids) for i, ids in enumerate(searches)]
    if answer is not None:
        actions.append(Action("answer", answer, turn=len(searches)))
    return Trajectory("q", [1], actions=actions, final_answer=answer)


def test_each_outcome_from_the_actions():
    # the failures of the demo's warm start (docs/training.md): the right passages, the wrong slot
    assert outcome(_episode(["p1", "p7"], ["p2", "p1"]), QUESTION, 0.0) == "wrong_with_all_evidence"
    assert outcome(_episode(["p1", "p7"], ["p9"]), QUESTION, 0.0) == "wrong_missing_evidence"
    assert outcome(_episode(["p1"], ["p2"], answer="1988"), QUESTION, 1.0) == "right"
    assert outcome(_episode(["p1"], answer=None), QUESTION, 0.0) == "no_answer"
    assert outcome(_episode(), QUESTION, 0.0) == "wrong_no_search"
    no_gold = Example("q", QUESTION.question, ["1988"])
    assert outcome(_episode(["p1"]), no_gold, 0.0) == "wrong"
    # EM decides `right`, even when the answer came without searching or evidence
    assert outcome(_episode(answer="1988"), QUESTION, 1.0) == "right"


def test_counts_list_every_outcome_in_order():
    counts = count_outcomes(["right", "no_answer", "right", "wrong_missing_evidence"])
    assert list(counts) == list(OUTCOMES)
    assert counts == {
        "right": 2,
        "no_answer": 1,
        "wrong_with_all_evidence": 0,
        "wrong_missing_evidence": 1,
        "wrong_no_search": 0,
        "wrong": 0,
    }
