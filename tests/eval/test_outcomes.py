"""Outcomes: why an episode ended as it did, read from its actions (``ragrl.eval.outcomes``)."""

import json

from typer.testing import CliRunner

from ragrl.cli import app
from ragrl.data.io import read_examples
from ragrl.data.schema import Example
from ragrl.eval.outcomes import OUTCOMES, count_outcomes, outcome
from ragrl.rollout.engine import read_trajectories
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


def test_eval_reports_the_outcome_of_every_question(world_dir, tmp_path):
    runner = CliRunner()
    out = tmp_path / "heuristic"
    args = ["eval", "--model", str(world_dir / "model"), "--data", str(world_dir / "test.jsonl"),
            "--index", str(world_dir / "bm25"), "--out", str(out), "--demonstrator", "heuristic",
            "--n", "40"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    scores = json.loads((out / "scores.json").read_text())
    rows = [json.loads(line) for line in (out / "per_example.jsonl").read_text().splitlines()]
    assert sum(scores["outcomes"].values()) == 40 == len(rows)
    assert scores["outcomes"]["right"] == round(40 * scores["em"])
    # the heuristic answers every question after one search: none of its 26 misses on this world's first
    # 40 questions had found every supporting passage
    assert scores["outcomes"] == {**dict.fromkeys(OUTCOMES, 0), "right": 14, "wrong_missing_evidence": 26}
    examples = {ex.id: ex for ex in read_examples(world_dir / "test.jsonl")[0]}
    for t, row in zip(read_trajectories(out / "trajectories.jsonl"), rows, strict=True):
        found = set(examples[t.example_id].supporting_ids) <= set(t.retrieved_ids)
        if row["outcome"] == "wrong_with_all_evidence":
            assert found and row["em"] == 0.0
        if row["outcome"] == "wrong_missing_evidence":
            assert not found and row["em"] == 0.0
