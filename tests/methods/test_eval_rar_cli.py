"""Eval-RAR through the command line: SFT on its oracle then GRPO (both evaluation variants), ``ragrl
eval`` with its diagnostics, and ``ragrl reward eval_rar`` on saved completions."""

import json

import pytest
from typer.testing import CliRunner

from ragrl.cli import app
from ragrl.data.io import write_jsonl
from ragrl.data.schema import Example

runner = CliRunner()

SMALL = ["train.sft.max_steps=2", "train.sft.batch_size=4", "train.steps=1", "train.grpo.prompts_per_step=2",
         "train.data.eval_limit=3", "train.eval_every=0", "rollout.max_new_tokens=48",
         "rollout.max_total_tokens=240", "rollout.max_turns=3", "rollout.n=3"]  # fmt: skip


def sets(*items: str) -> list[str]:
    return [a for item in items for a in ("--set", item)]


def paths(world_dir) -> list[str]:  # noqa: ANN001
    return [f"train.data.train={world_dir / 'train.jsonl'}", f"train.data.eval={world_dir / 'test.jsonl'}",
            f"train.data.index={world_dir / 'bm25'}"]  # fmt: skip


@pytest.mark.parametrize("variant", ["free", "separate"])
def test_sft_on_the_oracle_then_train_from_the_cli(world_dir, tmp_path, variant):
    sft_dir, run_dir = tmp_path / "sft", tmp_path / "grpo"
    common = [*paths(world_dir), *SMALL, f"protocol.evaluate={variant}"]
    result = runner.invoke(
        app,
        ["sft", "eval_rar-tiny", "--demos", "oracle", "--out", str(sft_dir),
         *sets(f"train.model.path={world_dir / 'model'}", *common)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    demos = [json.loads(line) for line in (sft_dir / "demonstrations.jsonl").read_text().splitlines()]
    searched = [d for d in demos if any(a["kind"] == "search" for a in d["actions"])]
    texts = ["".join(s["text"] for s in d["segments"]) for d in searched]
    assert texts and all("<evaluate>" in text for text in texts)
    result = runner.invoke(
        app,
        [
            "train",
            "eval_rar-tiny",
            "--out",
            str(run_dir),
            *sets(f"train.model.path={sft_dir / 'policy'}", *common),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (train,) = [r for r in rows if r["kind"] == "train"]
    for key in ("reward/em", "reward/eval_rar_evaluation", "searches", "valid_searches", "answer_rate",
                "response_len", "response_len_with_info", "evaluate_contains_gold", "evaluate_blocks",
                "tier/answer", "tier/evaluation", "tier/zero", "loophole", "zero_variance_frac"):  # fmt: skip
        assert key in train, key
    assert train["tier/answer"] + train["tier/evaluation"] + train["tier/zero"] == pytest.approx(1.0)
    assert train["response_len_with_info"] >= train["response_len"]
    resolved = (run_dir / "config.yaml").read_text()
    assert f"evaluate: {variant}" in resolved and "kl_coef: 0.001" in resolved


def test_eval_reports_the_diagnostics(world_dir, tmp_path):
    out = tmp_path / "eval"
    result = runner.invoke(
        app,
        ["eval", "--model", str(world_dir / "model"), "--data", str(world_dir / "test.jsonl"),
         "--index", str(world_dir / "bm25"), "--method", "eval_rar-tiny", "--n", "3", "--out", str(out),
         *sets("rollout.max_new_tokens=8", "rollout.max_turns=2")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    scores = json.loads((out / "scores.json").read_text())
    assert scores["method"] == "eval_rar"
    for key in ("evaluate_contains_gold", "valid_searches", "tier/evaluation", "loophole"):
        assert key in scores, key


def test_reward_command_scores_eval_rar_completions(tmp_path):
    gold = tmp_path / "questions.jsonl"
    examples = [Example("a", "When did he die?", ["April 22, 1994"]), Example("b", "Same city?", ["no"])]
    write_jsonl(gold, (ex.to_record() for ex in examples))
    info = "\n\n<information>Doc 1(Title: N) died April 22, 1994</information>\n\n"
    search = f"<search> Nixon </search>{info}"
    texts = [
        ("a", f"{search}<evaluate> Died April 22, 1994. </evaluate><answer> April 22, 1994 </answer>"),
        ("a", f"{search}<evaluate> Died April 22, 1994. </evaluate><answer> 1952 </answer>"),
        ("a", f"{search}<evaluate> Nixon. </evaluate><answer> 1952 </answer>"),
        ("b", f"{search}<evaluate> I do not know. </evaluate><answer> yes </answer>"),
    ]
    completions = tmp_path / "completions.jsonl"
    write_jsonl(completions, ({"id": i, "completion": c} for i, c in texts))
    for containment, last in (("char", 0.1), ("word", 0.0)):
        result = runner.invoke(
            app,
            ["reward", "eval_rar", "--completions", str(completions), "--gold", str(gold),
             *sets(f"reward.1.containment={containment}")],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")][:-1]
        assert [r["total"] for r in rows] == pytest.approx([1.0, 0.1, 0.0, last])


def test_the_paper_config_holds_the_papers_numbers_and_trains(world_dir, tmp_path):
    """eval_rar.yaml is the paper's GPU recipe; shrunk to the tiny policy (fp32, no bf16 on this CPU) it
    runs the same code path from the CLI, gradient checkpointing included."""
    from ragrl.methods import load_method

    m = load_method("eval_rar")
    g, r = m.train.grpo, m.rollout
    assert (r.n, r.k, r.max_turns, r.temperature, r.top_p) == (5, 3, 4, 1.0, 0.95)
    assert (g.clip_low, g.clip_high, g.kl, g.kl_coef, m.train.optim.lr) == (
        0.2,
        0.2,
        "low_var_kl",
        0.001,
        1e-6,
    )
    assert (m.train.steps, g.prompts_per_step, g.micro_batch_size) == (200, 512, 16)
    assert [(c.name, c.weight) for c in m.reward.components] == [("em", 1.0), ("eval_rar_evaluation", 0.1)]
    run_dir = tmp_path / "paper"
    result = runner.invoke(
        app,
        ["train", "eval_rar", "--out", str(run_dir),
         *sets(f"train.model.path={world_dir / 'model'}", *paths(world_dir), "train.model.dtype=float32",
               "train.mixed_precision=no", "train.steps=1", "train.grpo.prompts_per_step=2",
               "train.grpo.minibatches=1", "train.data.eval_limit=2", "train.eval_every=0",
               "rollout.max_new_tokens=16", "rollout.max_total_tokens=128", "rollout.max_obs_tokens=48",
               "train.optim.warmup_steps=0")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1]
