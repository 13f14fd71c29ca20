"""Outcomes: why an episode ended as it did, read from its actions (``ragrl.rollout.outcomes``)."""

import pytest

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.rollout.outcomes import OUTCOMES, count_outcomes, outcome
from ragrl.rollout.trajectory import Action, Trajectory

QUESTION = Example("q", "When was the director of Thaesukren born?", ["1988"], supporting_ids=["p1", "p2"])


def _episode(*steps: list[str] | str, answer: str | None = "Brilam") -> Trajectory:
    """Searches (a list of retrieved ids each) and backtracks (``"back"``, ``"back:k"``), then the answer."""
    actions = []
    for i, step in enumerate(steps):
        if isinstance(step, str):
            actions.append(Action("backtrack", step.partition(":")[2], turn=i))
        else:
            actions.append(Action("search", f"query {i}", turn=i, retrieved_ids=step))
    if answer is not None:
        actions.append(Action("answer", answer, turn=len(steps)))
    return Trajectory("q", [1], actions=actions, final_answer=answer)


def test_each_outcome_from_the_actions():
    # the failures of the demo's warm start (docs/training.md): the right passages, the wrong slot
    assert outcome(_episode(["p1", "p7"], ["p2", "p1"]), QUESTION, 0.0) == "wrong_with_all_evidence"
    assert outcome(_episode(["p1", "p7"], ["p9"]), QUESTION, 0.0) == "wrong_missing_evidence"
    assert outcome(_episode(["p1"], ["p2"], answer="1988"), QUESTION, 1.0) == "right"
    assert outcome(_episode(["p1"], answer=None), QUESTION, 0.0) == "no_answer"
    assert outcome(_episode(["p1"], answer=""), QUESTION, 0.0) == "wrong_missing_evidence"  # answered
    assert outcome(_episode(), QUESTION, 0.0) == "wrong_no_search"
    no_gold = Example("q", QUESTION.question, ["1988"])
    assert outcome(_episode(["p1"]), no_gold, 0.0) == "wrong_no_gold_evidence"
    # EM decides `right`, even when the answer came without searching or evidence
    assert outcome(_episode(answer="1988"), QUESTION, 1.0) == "right"
    # without a gold answer there is no exact match to judge
    assert outcome(_episode(["p1"], ["p2"]), Example("q", "?", []), None) == "unscored"


def test_an_unanswerable_question_answered_is_not_a_search_miss():
    # the synthetic world keeps the removed passage's id in supporting_ids: it could never be found
    unanswerable = Example("q", QUESTION.question, ["unknown"], supporting_ids=["p1", "p2"],
                           metadata={"answerable": False})  # fmt: skip
    assert outcome(_episode(["p1"]), unanswerable, 0.0) == "wrong_unanswerable"
    assert outcome(_episode(["p1"], answer="unknown"), unanswerable, 1.0) == "right"
    assert outcome(_episode(["p1"], answer=None), unanswerable, 0.0) == "no_answer"


def test_evidence_a_backtrack_took_back_does_not_count():
    # p2 came from a search the agent then took back: it was not in its context when it answered
    assert outcome(_episode(["p1"], ["p2"], "back"), QUESTION, 0.0) == "wrong_missing_evidence"
    assert outcome(_episode(["p2"], ["p7"], "back:2", ["p1"]), QUESTION, 0.0) == "wrong_with_all_evidence"
    assert outcome(_episode(["p2"], ["p7"], "back:1", ["p1"]), QUESTION, 0.0) == "wrong_missing_evidence"
    # an invalid backtrack (nothing to take back) takes nothing back
    assert outcome(_episode("back", ["p1", "p2"]), QUESTION, 0.0) == "wrong_with_all_evidence"


def test_counts_list_every_outcome_in_order_and_refuse_unknown_ones():
    counts = count_outcomes(["right", "no_answer", "right", "wrong_missing_evidence"])
    assert list(counts) == list(OUTCOMES)
    assert counts == {**dict.fromkeys(OUTCOMES, 0), "right": 2, "no_answer": 1, "wrong_missing_evidence": 1}
    with pytest.raises(RagrlError, match="unknown outcome.*'wrong'"):
        count_outcomes(["right", "wrong"])
