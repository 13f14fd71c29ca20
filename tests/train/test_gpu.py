"""On a CUDA GPU (skipped without one; ``make gpu-check`` runs them first): a bf16 GRPO step trains and
times its phases, greedy generation on the GPU equals the CPU's in float32, and the shapes benchmark's
toy sweep runs with its peak memory read."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

HERE = Path(__file__).parent
BENCHMARKS = HERE.parents[1] / "benchmarks"
_spec = importlib.util.spec_from_file_location("grpo_run", HERE / "grpo_run.py")
grpo_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(grpo_run)


def test_a_bf16_grpo_step_on_the_gpu_updates_the_policy_and_times_its_phases(world_dir, tmp_path):
    from ragrl.train.grpo import GRPOTrainer

    method = grpo_run.small_method(world_dir, tmp_path / "run", "train.steps=1", "train.model.dtype=bfloat16")
    trainer = GRPOTrainer(method, method.train)
    assert next(trainer.policy.parameters()).device.type == "cuda"
    assert next(trainer.policy.parameters()).dtype == torch.bfloat16
    before = {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}
    metrics = trainer.step()
    assert math.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    assert (
        metrics["rollout_seconds"] > 0 and metrics["update_seconds"] > 0 and metrics["logprob_seconds"] >= 0
    )
    after = trainer.policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_greedy_generation_on_the_gpu_equals_the_cpu_in_float32(world_dir):
    from ragrl.data.io import read_examples
    from ragrl.eval.runner import evaluate
    from ragrl.llm.hf_backend import TransformersBackend
    from ragrl.methods import load_method
    from ragrl.retrieval.base import load_retriever

    method = load_method("search_r1-tiny", ["rollout.max_new_tokens=16", "rollout.max_turns=2"])
    examples = read_examples(world_dir / "dev.jsonl")[0][:8]
    retriever = load_retriever(world_dir / "bm25")
    texts = {}
    for device in ("cpu", "cuda"):
        backend = TransformersBackend(world_dir / "model", device=device, dtype="float32")
        report = evaluate(backend, retriever, method, examples)
        texts[device] = [t.policy_text for t in report.trajectories]
    assert texts["cuda"] == texts["cpu"]


def test_the_shapes_benchmark_runs_its_toy_sweep_on_the_gpu(tmp_path):
    sys.path.insert(0, str(BENCHMARKS))
    import gpu_shapes

    gpu_shapes.main(["--toy", "--device", "cuda", "--out", str(tmp_path)])
    rows = __import__("json").loads((tmp_path / "shapes.json").read_text())
    assert rows and all(r["ragrl"]["peak_gb"] > 0 for r in rows)
