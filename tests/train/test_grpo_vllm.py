"""GRPO with its rollouts from a real vLLM engine (``train.engine.backend: vllm``; ``make test-vllm``
runs these in their own virtualenv with vllm-cpu): the engine follows the policy step by step, its
log-probs are the trainer's, greedy decoding makes the transformers backend's tokens after training,
and a tiny policy learns a toy task as it does with the transformers backend."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from ragrl.llm.backend import SamplingParams
from ragrl.rewards import build_reward
from ragrl.rewards.registry import REWARDS, register_reward
from ragrl.train.grpo import GRPOTrainer

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("grpo_run", HERE / "grpo_run.py")
grpo_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(grpo_run)

pytestmark = pytest.mark.vllm
ENGINE = "train.engine.options={dtype: float32, enforce_eager: true, max_model_len: 1024}"

if "even_share" not in REWARDS.names():

    @register_reward("even_share")
    def even_share(trajectory, example, ctx) -> float:  # noqa: ANN001
        """A toy task a tiny policy learns in a few steps: the share of even token ids it writes."""
        ids = [t for s in trajectory.segments if s.kind == "policy" for t in s.token_ids]
        return sum(t % 2 == 0 for t in ids) / max(len(ids), 1)


@pytest.fixture(scope="module")
def model_dir(world_dir, tmp_path_factory):  # noqa: ANN001, ANN201
    """The test world's tiny policy with head size 32 (vLLM's CPU attention has no kernel for 16)."""
    pytest.importorskip("vllm")
    from typer.testing import CliRunner

    from ragrl.cli import app

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's CPU default takes most of the RAM
    out = tmp_path_factory.mktemp("vllm") / "model"
    args = ["model", "tiny", "--data", str(world_dir), "--out", str(out), "--hidden", "64", "--layers", "2"]
    result = CliRunner().invoke(app, [*args, "--heads", "2"])
    assert result.exit_code == 0, result.output
    return out


OPEN: list[GRPOTrainer] = []


@pytest.fixture(autouse=True)
def _close_engines():  # noqa: ANN202
    """Each test's engines stop with it (a process holding a running engine cannot exit)."""
    yield
    while OPEN:
        t = OPEN.pop()
        if t.engine is not None:
            t.engine.close()


def trainer(world_dir, model_dir, run_dir, backend, *extra):  # noqa: ANN001, ANN201
    method = grpo_run.small_method(
        world_dir, run_dir, f"train.model.path={model_dir}", f"train.engine.backend={backend}", ENGINE, *extra
    )
    method.reward = build_reward([{"name": "even_share", "weight": 1.0}])
    OPEN.append(GRPOTrainer(method, method.train, eval_examples=[]))
    return OPEN[-1]


def test_the_engine_follows_the_policy_and_reports_its_logprobs(world_dir, model_dir, tmp_path):  # noqa: ANN001
    t = trainer(world_dir, model_dir, tmp_path / "run", "vllm", "train.engine.sync_every=2", "train.steps=3")
    rows = [t.step() for _ in range(3)]
    assert [r["engine/staleness"] for r in rows] == [0.0, 1.0, 0.0]  # synced before steps 1 and 3
    assert ["engine/sync_seconds" in r for r in rows] == [True, False, True]
    # fp32 engine and fp32 trainer: the same log-probs up to summation order, where the engine is synced;
    # step 2 sampled from the weights before step 1's update, and the gap shows
    assert all(rows[i]["engine/logprob_diff"] < 1e-4 and abs(rows[i]["engine/kl"]) < 1e-6 for i in (0, 2))
    assert rows[1]["engine/logprob_diff"] > 1e-3 and rows[1]["engine/kl"] > 0
    # after the last update: synced, the engine decodes what the trainer's own backend decodes
    t.engine.sync(t.step_count)
    prompts = [t.method.protocol.prompt_ids(q, t.tokenizer) for q in t.train_examples[:6]]
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    theirs = [g.token_ids for g in t.engine.generate(prompts, greedy)]
    assert theirs == [g.token_ids for g in t.backend.generate(prompts, greedy)]
    # closed (as train() does at its end), the engine starts again on the next step and takes this run's
    # weights at once, whatever the schedule says (step 3 is not a multiple of 2)
    t.close()
    row = t.step()
    assert row["engine/staleness"] == 0.0 and "engine/sync_seconds" in row
    assert row["engine/logprob_diff"] < 1e-4


def test_truncated_importance_sampling_runs_on_the_engines_logprobs(world_dir, model_dir, tmp_path):  # noqa: ANN001
    t = trainer(world_dir, model_dir, tmp_path / "run", "vllm", "train.grpo.tis_cap=2.0", "train.steps=1")
    row = t.step()
    assert row["engine/tis_cut_frac"] == 0.0  # π_old / π_engine ≈ 1: nothing reaches the cap
    assert row["grad_norm"] > 0


def test_a_tiny_policy_learns_a_toy_task_as_with_the_transformers_backend(world_dir, model_dir, tmp_path):  # noqa: ANN001
    gains = {}
    for backend in ("transformers", "vllm"):
        t = trainer(
            world_dir, model_dir, tmp_path / backend, backend, "train.optim.lr=1e-2", "train.steps=20"
        )
        rewards = [t.step()["reward"] for _ in range(20)]
        gains[backend] = sum(rewards[-5:]) / 5 - sum(rewards[:5]) / 5
        assert sum(rewards[:5]) / 5 == pytest.approx(0.5, abs=0.05)  # an untrained policy: half even
    # measured (seeds 0-2, 20 steps): transformers +0.29 / +0.17 / +0.12, vLLM +0.19 / +0.03 / +0.29
    assert gains["transformers"] > 0.1 and gains["vllm"] > 0.1, gains
