"""ARENA through the command line: ``ragrl reward arena`` on saved completions, and ``ragrl eval`` of a
given-passages method without a retrieval index."""

import json

import pytest
from typer.testing import CliRunner

from ragrl.cli import app
from ragrl.data.io import read_examples, write_jsonl
from ragrl.data.references import GOLD_REFERENCE_KEY
from ragrl.data.schema import Example, Passage
from ragrl.methods import load_method

runner = CliRunner()


def test_reward_command_scores_arena_completions(tmp_path):
    passages = [Passage(f"p{i}", f"T{i}", f"Passage number {i}.") for i in range(1, 5)]
    gold = tmp_path / "questions.jsonl"
    examples = [
        Example(
            "a", "Which party?", ["Republican"], passages=passages, metadata={GOLD_REFERENCE_KEY: [2, 4]}
        ),
        Example("b", "Which city?", ["U.S."], passages=passages, metadata={GOLD_REFERENCE_KEY: [1]}),
    ]
    write_jsonl(gold, (ex.to_record() for ex in examples))
    completions = tmp_path / "completions.jsonl"
    texts = [
        (
            "a",
            "<relevance>[4,2]</relevance>\n<analysis>[2], [4]</analysis>\n<answer>republican</answer><|eot|>",
        ),
        ("a", "<relevance>[2,3]</relevance>\n<analysis>[2].</analysis>\n<answer>Democratic</answer>"),
        ("b", " <relevance>[1]</relevance><analysis>x</analysis><answer>U S</answer>"),
        ("b", "<answer>nowhere</answer>"),
    ]
    write_jsonl(completions, ({"id": i, "completion": c} for i, c in texts))
    result = runner.invoke(app, ["reward", "arena", "--completions", str(completions), "--gold", str(gold)])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    per_example, summary = lines[:-1], lines[-1]
    names = ("arena_format", "arena_accuracy", "arena_relevance", "arena_bonus", "total")
    assert [tuple(r[k] for k in names) for r in per_example] == [
        (1.0, 1.0, 1.0, 10.0, 13.0),
        (1.0, 0.0, 0.5, 0.0, 1.5),
        (0.0, 1.0, 1.0, 0.0, 2.0),  # leading space: no format, no bonus
        (0.0, 0.0, 0.0, 0.0, 0.0),
    ]
    assert summary["n"] == 4 and summary["mean"]["total"] == pytest.approx(16.5 / 4)
    # the baseline's reward reads the same file
    result = runner.invoke(
        app, ["reward", "arena-naive", "--completions", str(completions), "--gold", str(gold)]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.splitlines()[-1])["mean"]["arena_accuracy"] == 0.5


def test_eval_of_arena_needs_no_index(world_dir, tmp_path):
    # the synthetic questions carry their passages; gold reference ids come from ragrl.data.references
    out = tmp_path / "eval"
    data = world_dir / "test.jsonl"
    args = [
        "eval",
        "--model",
        str(world_dir / "model"),
        "--data",
        str(data),
        "--method",
        "arena-tiny",
        "--n",
        "3",
    ]
    result = runner.invoke(
        app, [*args, "--out", str(out), "--variant", "arena", "--set", "rollout.max_new_tokens=16"]
    )
    assert result.exit_code == 0, result.output
    scores = json.loads((out / "scores.json").read_text())
    # unanswerable questions (their gold passage was removed) are dropped, as the authors did
    first3 = read_examples(data)[0][:3]
    expected = len(load_method("arena-tiny").prepare_examples(first3, "test"))
    assert 1 <= expected <= 3
    assert scores["method"] == "arena" and scores["n_scored"] == expected
    assert scores["provenance"]["index"] is None
    for key in ("reward/arena_format", "reward/arena_relevance", "cite/equal", "cite/miss", "bonus_rate"):
        assert key in scores
    assert scores["cite/equal"] + scores["cite/overlap"] + scores["cite/miss"] == pytest.approx(1.0)
    assert scores["policy_tokens_mean"] <= 16 and scores["searches_per_question"] == 0
    rows = [json.loads(line) for line in (out / "per_example.jsonl").read_text().splitlines()]
    assert all({"cited_ids", "analysis", "answer", "cite/precision"} <= set(row) for row in rows)


def test_eval_of_a_search_method_without_index_is_a_clear_error(world_dir):
    result = runner.invoke(
        app,
        ["eval", "--model", str(world_dir / "model"), "--data", str(world_dir / "test.jsonl"), "--n", "1"],
    )
    assert result.exit_code != 0
    assert "method 'search_r1' searches a corpus: pass --index" in str(result.exception)


def test_sft_then_train_arena_tiny_from_the_cli(world_dir, tmp_path):
    """`ragrl sft arena-tiny --demos oracle` plays ARENA's own oracle (not the search agent's), then
    `ragrl train arena-tiny` runs GRPO from it without a retrieval index, logging the citation audit."""
    paths = [f"train.data.train={world_dir / 'train.jsonl'}", f"train.data.eval={world_dir / 'test.jsonl'}"]
    small = ["train.sft.max_steps=2", "train.sft.batch_size=4", "train.steps=1",
             "train.grpo.prompts_per_step=2", "train.data.eval_limit=3", "train.eval_every=0",
             "rollout.max_new_tokens=12", "rollout.max_total_tokens=12", "rollout.n=3"]  # fmt: skip

    def sets(*items):
        return [a for item in items for a in ("--set", item)]

    sft_dir, run_dir = tmp_path / "sft", tmp_path / "grpo"
    result = runner.invoke(
        app,
        ["sft", "arena-tiny", "--demos", "oracle", "--out", str(sft_dir),
         *sets(f"train.model.path={world_dir / 'model'}", *paths, *small)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    demos = [json.loads(line) for line in (sft_dir / "demonstrations.jsonl").read_text().splitlines()]
    assert demos and all("<relevance>" in s["segments"][0]["text"] for s in demos)
    result = runner.invoke(
        app,
        ["train", "arena-tiny", "--out", str(run_dir),
         *sets(f"train.model.path={sft_dir / 'policy'}", *paths, *small)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert len(train_rows) == 1
    for key in ("reward/arena_format", "reward/arena_relevance", "reward/arena_bonus", "cite/recall", "kl"):
        assert key in train_rows[0], key
    evals = [r for r in rows if r["kind"] == "eval"]
    assert evals and all(r["eval/n"] <= 3 for r in evals)
