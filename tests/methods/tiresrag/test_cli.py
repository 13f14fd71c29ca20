"""TIRESRAG-R1 through the command line: SFT on its oracle, GRPO with the CPU config (the paper's
diagnostics in metrics.jsonl), ``ragrl eval`` with the reflection diagnostics, ``ragrl analyze-thinking``
on what it saved, and the paper's config on the tiny policy."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ragrl.cli import app

runner = CliRunner()

SMALL = ["train.sft.max_steps=2", "train.sft.batch_size=4", "train.steps=2", "train.grpo.prompts_per_step=2",
         "train.data.eval_limit=3", "train.eval_every=0", "rollout.max_total_tokens=240", "rollout.n=3",
         "train.grpo.refill_rounds=1"]  # fmt: skip


def sets(*items: str) -> list[str]:
    return [a for item in items for a in ("--set", item)]


def paths(world_dir) -> list[str]:  # noqa: ANN001
    return [f"train.data.train={world_dir / 'train.jsonl'}", f"train.data.eval={world_dir / 'test.jsonl'}",
            f"train.data.index={world_dir / 'bm25'}"]  # fmt: skip


def test_sft_train_eval_and_analyze_from_the_cli(world_dir, tmp_path):
    sft_dir, run_dir, eval_dir = tmp_path / "sft", tmp_path / "grpo", tmp_path / "eval"
    common = [*paths(world_dir), *SMALL]
    result = runner.invoke(
        app,
        ["sft", "tiresrag-tiny", "--demos", "oracle", "--out", str(sft_dir),
         *sets(f"train.model.path={world_dir / 'model'}", *common)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    demos = [json.loads(line) for line in (sft_dir / "demonstrations.jsonl").read_text().splitlines()]
    kinds = [[a["kind"] for a in d["actions"]] for d in demos]
    answered = [k for k, d in zip(kinds, demos, strict=True) if d["finish_reason"] == "answer"]
    # each answered episode goes on to the reflection (cut short by the 240-token budget in some)
    assert all(k[-2] == "answer" and k[-1] in ("answer", "reflect") for k in answered)
    assert sum(k[-2:] == ["answer", "answer"] for k in answered) > len(answered) / 2

    result = runner.invoke(
        app,
        [
            "train",
            "tiresrag-tiny",
            "--out",
            str(run_dir),
            *sets(f"train.model.path={sft_dir / 'policy'}", *common),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    assert len(train) == 2
    for key in ("reward/tiresrag_answer", "reward/tiresrag_sufficiency", "reward/tiresrag_thinking",
                "reward/tiresrag_reflection", "schedule/a_t", "filter/low_frac", "filter/high_frac",
                "suff/correct_sufficient", "suff/wrong_insufficient", "adv/W_mean", "adv/penalty_share",
                "reflect/none", "reflect/wrong_to_right", "answers", "format_valid",
                "refill_rounds"):  # fmt: skip
        assert key in train[0], key
    assert train[0]["schedule/a_t"] == pytest.approx(1 / (1 + 2.718281828 ** ((1 - 1.8) / 3)), abs=1e-6)

    result = runner.invoke(
        app,
        ["eval", "--model", str(run_dir / "policy"), "--data", str(world_dir / "test.jsonl"),
         "--index", str(world_dir / "bm25"), "--method", "tiresrag-tiny", "--n", "4", "--out", str(eval_dir)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    scores = json.loads((eval_dir / "scores.json").read_text())
    assert scores["method"] == "tiresrag" and "reflect/unchanged" in scores and "format_valid" in scores

    result = runner.invoke(
        app,
        ["analyze-thinking", "--trajectories", str(eval_dir / "trajectories.jsonl"),
         "--gold", str(world_dir / "test.jsonl"), "--config", "tiresrag-tiny"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.splitlines()[-1])
    assert summary["n"] == 4 and sum(sum(row.values()) for row in summary["table1"].values()) == 4


def test_the_paper_config_holds_the_papers_numbers_and_trains(world_dir, tmp_path):
    """tiresrag.yaml is the paper's GPU recipe (§3.4); shrunk to the tiny policy (fp32, no bf16 on this
    CPU) it runs the same code path from the CLI: the <think> prefill, gradient checkpointing, the
    filter with refill."""
    from ragrl.methods import load_method

    m = load_method("tiresrag")
    g, r = m.train.grpo, m.rollout
    assert (r.n, r.k, r.temperature, r.top_p, r.max_new_tokens) == (5, 5, 1.0, 0.95, 512)
    assert (g.prompts_per_step, g.clip_low, g.clip_high, g.kl_coef, m.train.optim.lr) == (
        112,
        0.2,
        0.2,
        0.0,
        2e-6,
    )
    assert m.protocol.prefill == "<think>" and m.train.steps == 144
    result = runner.invoke(
        app,
        ["train", "tiresrag", "--out", str(tmp_path / "paper"),
         *sets(f"train.model.path={world_dir / 'model'}", *paths(world_dir), "train.model.dtype=float32",
               "train.steps=1", "train.grpo.prompts_per_step=2", "train.grpo.micro_batch_size=10",
               "train.grpo.refill_rounds=0", "train.eval_every=0", "train.save_every=0",
               "train.data.eval_limit=2", "rollout.max_new_tokens=16", "rollout.max_total_tokens=200",
               "rollout.max_obs_tokens=64", "rollout.max_turns=3", "protocol.system=null")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "paper" / "metrics.jsonl").read_text().splitlines()]
    assert any(r["kind"] == "train" for r in rows)
