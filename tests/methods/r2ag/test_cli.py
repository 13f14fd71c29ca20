"""R²AG through the command line: SFT on the steering oracle's tree steps, GRPO through the RR-Forest
rounds, ``ragrl eval`` of the trees (retrieval metrics, Iter., LLM calls) and of the scripted baselines."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from ragrl.cli import app

runner = CliRunner()

SMALL = ["train.sft.max_steps=2", "train.sft.batch_size=4", "train.steps=2", "train.grpo.prompts_per_step=2",
         "train.data.eval_limit=3", "train.eval_every=0", "rollout.n=3"]  # fmt: skip


def sets(*items: str) -> list[str]:
    return [a for item in items for a in ("--set", item)]


def paths(world_dir) -> list[str]:  # noqa: ANN001
    return [f"train.data.train={world_dir / 'train.jsonl'}", f"train.data.eval={world_dir / 'test.jsonl'}",
            f"train.data.index={world_dir / 'bm25'}"]  # fmt: skip


def test_sft_train_and_eval_from_the_cli(world_dir, tmp_path):
    sft_dir, run_dir, eval_dir = tmp_path / "sft", tmp_path / "grpo", tmp_path / "eval"
    common = [*paths(world_dir), *SMALL]
    result = runner.invoke(
        app,
        ["sft", "r2ag-tiny", "--demos", "oracle", "--out", str(sft_dir),
         *sets(f"train.model.path={world_dir / 'model'}", *common)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    demos = [json.loads(line) for line in (sft_dir / "demonstrations.jsonl").read_text().splitlines()]
    # one demonstration per tree step: the first asks (no context), the last of each tree stops
    assert all(len([s for s in d["segments"] if s["kind"] == "policy"]) == 1 for d in demos)
    # the 40 unanswerable questions (their evidence is not in the corpus) have no complete tree: left out
    assert "R²AG leaves out 40 of 400 questions" in result.output
    assert sum(d["metadata"]["tree_step"] == 0 for d in demos) == 360
    assert {a["kind"] for d in demos for a in d["actions"]} <= {"think", "search", "stop"}

    result = runner.invoke(
        app,
        [
            "train",
            "r2ag-tiny",
            "--out",
            str(run_dir),
            *sets(f"train.model.path={sft_dir / 'policy'}", *common),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    assert len(train) == 2 and "forest/next" in train[0] and "reward/r2ag_ap" in train[0]
    evals = [r for r in rows if r["kind"] == "eval"]
    assert {"eval/recall@5", "eval/map", "eval/method/tree_recall", "eval/method/iterations"} <= set(evals[0])

    result = runner.invoke(
        app,
        ["eval", "--model", str(run_dir / "policy"), "--data", str(world_dir / "test.jsonl"),
         "--index", str(world_dir / "bm25"), "--method", "r2ag-tiny", "--n", "4", "--out", str(eval_dir)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    scores = json.loads((eval_dir / "scores.json").read_text())
    assert scores["method"] == "r2ag"
    assert {"tree_recall", "tree_full_recall", "tree_map", "docs", "iterations", "llm_calls"} <= set(scores)
    assert 1 <= scores["iterations"] <= 5


def test_the_scripted_baselines_from_the_cli(world_dir, tmp_path):
    out = {}
    for name, extra in (("oracle", []), ("single_step", ["--set", "rollout.k=5"])):
        result = runner.invoke(
            app,
            ["eval", "--model", str(world_dir / "model"), "--data", str(world_dir / "test.jsonl"),
             "--index", str(world_dir / "bm25"), "--method", "r2ag-tiny", "--demonstrator", name, "--n", "20",
             "--out", str(tmp_path / name), *extra],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        out[name] = json.loads((tmp_path / name / "scores.json").read_text())
    # BM25 returns fewer than k when fewer passages match any query word
    assert 4.5 <= out["single_step"]["docs"] <= 5.0 and out["single_step"]["iterations"] == 1.0
    assert out["oracle"]["tree_recall"] > out["single_step"]["tree_recall"]
    result = runner.invoke(
        app,
        ["eval", "--model", str(world_dir / "model"), "--data", str(world_dir / "test.jsonl"),
         "--index", str(world_dir / "bm25"), "--method", "r2ag-tiny", "--demonstrator", "heuristic",
         "--n", "2"],
    )  # fmt: skip
    assert result.exit_code != 0 and "plays oracle, single_step" in str(result.exception)


def test_the_paper_config_holds_the_papers_numbers_and_trains(world_dir, tmp_path):
    """r2ag.yaml is the paper's GPU recipe (§3.4); shrunk to the tiny policy (fp32, short outputs) it runs
    the same code path from the CLI, gradient checkpointing included."""
    from ragrl.methods import load_method

    m = load_method("r2ag")
    g, r = m.train.grpo, m.rollout
    assert (r.n, r.train_k, r.k, r.max_iterations, r.max_new_tokens, r.top_t) == (12, 1, 1, 5, 4096, 2)
    assert (g.prompts_per_step, g.clip_low, g.clip_high, g.kl_coef, g.loss_agg, g.group_filter) == (
        128, 0.2, 0.28, 0.0, "token_mean", "drop_zero_variance",
    )  # fmt: skip
    assert m.train.optim.lr == 1e-6 and m.train.steps == 80 and m.train.patience == 3
    weights = {c.key: (c.weight, dict(c.params)) for c in m.reward.components}
    assert weights == {
        "r2ag_multi_hit": (0.2, {"pred_weight": 1.25}), "r2ag_joint_hit": (0.3, {}),
        "r2ag_ap": (0.2, {"t_base": 4, "t_pred": 2}), "r2ag_format": (1.0, {"per_tag": 0.01, "cap": 0.02}),
    }  # fmt: skip
    result = runner.invoke(
        app,
        ["train", "r2ag", "--out", str(tmp_path / "paper"),
         *sets(f"train.model.path={world_dir / 'model'}", *paths(world_dir), "train.model.dtype=float32",
               "train.steps=1", "train.grpo.prompts_per_step=2", "train.grpo.micro_batch_size=12",
               "train.eval_every=0", "train.save_every=0", "train.data.eval_limit=2",
               "rollout.max_new_tokens=24")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "paper" / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["eval", "train", "eval"] and rows[1]["samples"] == 24


def test_few_shot_steering_from_the_cli(world_dir, tmp_path):
    result = runner.invoke(
        app,
        ["eval", "--model", str(world_dir / "model"), "--data", str(world_dir / "test.jsonl"),
         "--index", str(world_dir / "bm25"), "--method", "r2ag-tiny", "--n", "3", "--few-shot",
         str(world_dir / "train.jsonl"), "--shots", "3", "--out", str(tmp_path / "few")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    shots = [json.loads(line) for line in (tmp_path / "few" / "shots.jsonl").read_text().splitlines()]
    assert len(shots) == 3 and "stop retrieval" in shots[2]["segments"][0]["text"]
    scores = json.loads((tmp_path / "few" / "scores.json").read_text())
    assert len(scores["provenance"]["few_shot"]["ids"]) == 3
