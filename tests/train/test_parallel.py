"""``train.parallel`` (``ragrl.train.parallel``): FSDP2 makes the same update as one process, its
checkpoints resume exactly, its exported policy is the whole model; bad settings are refused at load."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ragrl.errors import RagrlError
from ragrl.train.grpo import GRPOTrainer

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("grpo_run", HERE / "grpo_run.py")
grpo_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(grpo_run)
small_method = grpo_run.small_method
TWO_PROCESSES = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}


def close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.parallel.mode=zero", "train.parallel.mode must be one of ddp, fsdp"),
        ("train.algo=cycles", "not supported by train.algo cycles"),
        ("train.model.lora.r=4", "fsdp with train.model.lora is not supported"),
    ],
)
def test_bad_parallel_settings_are_refused_at_load_with_the_key(world_dir, tmp_path, override, message):
    extra = [override] if "mode=" in override else ["train.parallel.mode=fsdp", override]
    with pytest.raises(RagrlError, match=message):
        small_method(world_dir, tmp_path / "run", *extra)


def test_a_stage_cannot_change_the_parallel_mode(world_dir, tmp_path):
    stage = "train.stages=[{name: a, overrides: ['train.parallel.mode=fsdp']}]"
    with pytest.raises(
        RagrlError, match=r"train.stages\[0\].overrides: a stage cannot change train.parallel"
    ):
        small_method(world_dir, tmp_path / "run", stage)


def test_fsdp_on_one_process_trains_as_ddp_does_and_exports_the_whole_model(world_dir, tmp_path):
    runs = {}
    for mode in ("ddp", "fsdp"):
        method = small_method(world_dir, tmp_path / mode, "train.steps=2", f"train.parallel.mode={mode}")
        trainer = GRPOTrainer(method, method.train, eval_examples=[])
        trainer.train()
        runs[mode] = trainer.parallel.full_state_dict(trainer.model)
    assert close(runs["ddp"], runs["fsdp"]) < 1e-5
    from safetensors.torch import load_file

    exported = load_file(tmp_path / "fsdp" / "policy" / "model.safetensors")
    assert close({k: runs["fsdp"][k] for k in exported}, exported) == 0.0
    if torch.distributed.is_initialized():  # the group of one FSDP made in this test process
        torch.distributed.destroy_process_group()


def test_fsdp_on_two_processes_makes_the_same_first_update_as_one_process(world_dir, tmp_path):
    script = str(HERE / "grpo_run.py")
    one, two = tmp_path / "one" / "w.pt", tmp_path / "two" / "w.pt"
    for out in (one, two):
        out.parent.mkdir()
    subprocess.run([sys.executable, script, str(world_dir), str(one), "1"], check=True, env=ENV)
    run = [*TWO_PROCESSES, script, str(world_dir), str(two), "1", "train.parallel.mode=fsdp"]
    subprocess.run(run, check=True, env=ENV, timeout=300)
    assert (two.parent / "sampler-1.json").is_file()  # a second process really ran
    a, b = torch.load(one), torch.load(two)
    from safetensors.torch import load_file

    init = load_file(world_dir / "model" / "model.safetensors")
    assert max(float((a[k] - init[k]).abs().max()) for k in init) > 1e-4  # the update moved the weights
    # the tolerance of the DDP test (tests/train/test_grpo.py): Adam's first step divides by |g| + eps,
    # so a weight whose gradient is near eps moves by a share of a step under another reduction order
    diff = torch.cat([(a[k] - b[k]).abs().flatten() for k in a])
    assert float((diff <= 1e-6).float().mean()) > 0.9999 and float(diff.max()) < 1e-4, float(diff.max())


def test_fsdp_on_two_processes_resumes_exactly_and_exports_the_gathered_model(world_dir, tmp_path):
    script = str(HERE / "parallel_run.py")
    fsdp = "train.parallel.mode=fsdp"
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    for folder, mode in ((straight, "straight"), (resumed, "first"), (resumed, "resume")):
        # the resume: a new pair of processes starts from the sharded checkpoint of step 1
        run = [*TWO_PROCESSES, script, str(world_dir), str(folder), mode, fsdp]
        subprocess.run(run, check=True, env=ENV, timeout=300)
    checkpoint = resumed / "checkpoints" / "step-000001" / "state"
    assert sorted(p.name for p in (checkpoint / "sharded").iterdir() if p.suffix == ".distcp") == [
        "__0_0.distcp", "__1_0.distcp",
    ]  # fmt: skip  # every process wrote its own shard
    a, b = torch.load(straight / "w.pt"), torch.load(resumed / "w.pt")
    assert close(a, b) == 0.0  # bit for bit: weights, optimizer state, sampler and RNG streams restored
    from safetensors.torch import load_file

    exported = load_file(resumed / "policy" / "model.safetensors")
    assert close({k: b[k] for k in exported}, exported) == 0.0


def test_fsdp_on_two_processes_makes_the_same_sft_step_as_one_process(world_dir, tmp_path):
    # 8 demonstrations a step in micro-batches of 2: 4 on each of two processes, accumulated
    script = str(HERE / "parallel_run.py")
    one, two = tmp_path / "one", tmp_path / "two"
    subprocess.run([sys.executable, script, str(world_dir), str(one), "sft"], check=True, env=ENV)
    run = [*TWO_PROCESSES, script, str(world_dir), str(two), "sft", "train.parallel.mode=fsdp"]
    subprocess.run(run, check=True, env=ENV, timeout=300)
    a, b = torch.load(one / "w.pt"), torch.load(two / "w.pt")
    from safetensors.torch import load_file

    init = load_file(world_dir / "model" / "model.safetensors")
    assert max(float((a[k] - init[k]).abs().max()) for k in init) > 1e-4
    diff = torch.cat([(a[k] - b[k]).abs().flatten() for k in a])
    assert float((diff <= 1e-6).float().mean()) > 0.9999 and float(diff.max()) < 1e-4, float(diff.max())


def test_fsdp_on_two_processes_evaluates_on_the_main_process_and_pads_uneven_micro_batches(
    world_dir, tmp_path
):
    # the main process evaluates alone between gathered weights; the reference and recompute passes
    # and the update run in lockstep although the filter leaves each process its own number of samples
    import json

    script = str(HERE / "parallel_run.py")
    run = [*TWO_PROCESSES, script, str(world_dir), str(tmp_path), "evaluated", "train.parallel.mode=fsdp"]
    subprocess.run(run, check=True, env=ENV, timeout=300)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in records if r["kind"] == "eval"] == ["before", "train", "after"]
    assert (tmp_path / "best" / "best.json").is_file() and (tmp_path / "best" / "model.safetensors").is_file()
    assert all("kl" in r for r in records if r["kind"] == "train")
