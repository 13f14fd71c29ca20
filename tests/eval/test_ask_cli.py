"""``ragrl ask``: questions put to a policy, each episode shown turn by turn."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ragrl.cli import app
from ragrl.data.io import read_examples
from ragrl.rollout.records import read_trajectories
from ragrl.train.reader import SHIPPED_BASE

runner = CliRunner()


def test_ask_plays_the_episode_eval_plays_and_shows_it(world_dir, tmp_path):
    examples, _ = read_examples(world_dir / "test.jsonl")
    chosen = examples[:3]
    asked = runner.invoke(app, ["ask", *(ex.question for ex in chosen), "--model", str(SHIPPED_BASE),
                                "--index", str(world_dir / "bm25")])  # fmt: skip
    assert asked.exit_code == 0, asked.output
    records = [json.loads(line) for line in asked.stdout.splitlines()]
    assert [r["question"] for r in records] == [ex.question for ex in chosen]
    # the same greedy episodes as `ragrl eval` of those questions (the reader base searches and answers)
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(ex.to_record()) + "\n" for ex in chosen))
    data = [
        "--data",
        str(tmp_path / "q.jsonl"),
        "--index",
        str(world_dir / "bm25"),
        "--out",
        str(tmp_path / "e"),
    ]
    evaluated = runner.invoke(app, ["eval", "--model", str(SHIPPED_BASE), *data])
    assert evaluated.exit_code == 0, evaluated.output
    for record, trajectory in zip(
        records, read_trajectories(tmp_path / "e" / "trajectories.jsonl"), strict=True
    ):
        assert record["answer"] == trajectory.final_answer
        assert record["queries"] == trajectory.queries and record["finish_reason"] == trajectory.finish_reason
        assert record["retrieved_ids"] == list(dict.fromkeys(trajectory.retrieved_ids))
    assert any(r["queries"] for r in records) and any(r["answer"] for r in records)
    # the transcript: each question, the policy's turns, the observations, the answer
    first = read_trajectories(tmp_path / "e" / "trajectories.jsonl")[0]
    assert asked.stderr.count("question: ") == 3 and "answer: " in asked.stderr
    for segment in first.segments:
        label = "policy: " if segment.kind == "policy" else "observation: "
        assert label + segment.text.rstrip("\n") in asked.stderr
    quiet = runner.invoke(app, ["ask", chosen[0].question, "--model", str(SHIPPED_BASE), "--closed-book",
                                "--no-transcript"])  # fmt: skip
    assert quiet.exit_code == 0, quiet.output
    assert "policy:" not in quiet.stderr and json.loads(quiet.stdout)["retrieved_ids"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give --index (a folder or a server's URL) or --closed-book, one of them"),
        (["--closed-book", "--index", "x"], "give --index (a folder or a server's URL) or --closed-book"),
        (
            ["--closed-book", "--method", "arena-tiny"],
            "method 'arena' reads the passages given with each question",
        ),
    ],
)
def test_ask_refuses_what_it_cannot_play(args, message):
    result = runner.invoke(app, ["ask", "Who?", "--model", str(SHIPPED_BASE), *args])
    assert result.exit_code != 0 and message in str(result.exception)
    empty = runner.invoke(app, ["ask", " ", "--model", str(SHIPPED_BASE), "--closed-book"])
    assert "a QUESTION is empty" in str(empty.exception)
