"""``train.parallel`` (``ragrl.train.parallel``): FSDP2 and DeepSpeed ZeRO-2 / ZeRO-3 make the same
update as one process, their checkpoints resume exactly (after a clean stop and after kill -9), their
exported policy is the whole model; bad settings are refused at load."""

from __future__ import annotations

import importlib.util
import json
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
_spec = importlib.util.spec_from_file_location("launch", HERE / "launch.py")
launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launch)
TWO_PROCESSES, ENV, SHARDED, LORA = launch.TWO_PROCESSES, launch.ENV, launch.SHARDED, launch.LORA
ZERO1, OFFLOAD = launch.ZERO1, launch.OFFLOAD


def engines(*names: str, default: str = "fsdp") -> list:
    """``names`` as test parameters: ``default`` in the default run, the others ``slow`` (CI runs them
    after the default suite: ``.ci/run``), so the default run stays under 10 minutes here. The default
    run checks each behaviour under one engine, FSDP or ZeRO-3 (kill -9, the two-process resume, LoRA's
    update and resume, and SFT under none); CI runs every test under every engine."""
    return [n if n == default else pytest.param(n, marks=pytest.mark.slow) for n in names]


def same_update(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """The tolerance of the DDP test (tests/train/test_grpo.py): Adam's first step divides by |g| + eps,
    so a weight whose gradient is near eps moves by a share of a step under another reduction order
    (measured: FSDP and ZeRO-2/3 differ from one process by at most 1e-5, on 1e-5 of the weights)."""
    diff = torch.cat([(a[k] - b[k]).abs().flatten() for k in a])
    assert float((diff <= 1e-6).float().mean()) > 0.9999 and float(diff.max()) < 1e-4, float(diff.max())


def close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((float((a[k].float() - b[k].float()).abs().max()) for k in a), default=0.0)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.parallel.mode=zero", "train.parallel.mode must be one of ddp, fsdp"),
        ("deepspeed:train.parallel.zero_stage=4", "train.parallel.zero_stage must be 1, 2 or 3, got 4"),
        ("deepspeed:train.mixed_precision=fp16", "fp16 under train.parallel.mode deepspeed"),
    ],
)
def test_bad_parallel_settings_are_refused_at_load_with_the_key(world_dir, tmp_path, override, message):
    mode, _, override = override.rpartition(":")
    extra = [override] if "mode=" in override else [f"train.parallel.mode={mode or 'fsdp'}", override]
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
    with pytest.raises(RagrlError, match="sharded already"):  # the sharded policy handed to a new trainer
        GRPOTrainer(method, method.train, eval_examples=[], model=trainer.policy, tokenizer=trainer.tokenizer)
    from safetensors.torch import load_file

    exported = load_file(tmp_path / "fsdp" / "policy" / "model.safetensors")
    assert close({k: runs["fsdp"][k] for k in exported}, exported) == 0.0
    if torch.distributed.is_initialized():  # the group of one FSDP made in this test process
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("engine", engines(*SHARDED, *ZERO1, *OFFLOAD))
def test_sharded_on_two_processes_makes_the_same_first_update_as_one_process(world_dir, engine, launched):
    one = launched("update", "1", processes=1) / "w.pt"  # the DDP test's reference (test_grpo.py)
    two = launched("update", "1", *{**SHARDED, **ZERO1, **OFFLOAD}[engine]) / "w.pt"
    assert (two.parent / "sampler-1.json").is_file()  # a second process really ran
    norms = [json.loads((out.parent / "sampler-0.json").read_text())["grad_norm"][0] for out in (one, two)]
    assert norms[1] == pytest.approx(norms[0], rel=1e-4)  # the gradient itself (a scale error is ×2 or ×0.5)
    a, b = torch.load(one), torch.load(two)
    from safetensors.torch import load_file

    init = load_file(world_dir / "model" / "model.safetensors")
    assert max(float((a[k] - init[k]).abs().max()) for k in init) > 1e-4  # the update moved the weights
    same_update(a, b)


ZERO_SHARDS = ("deepspeed/state", [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)])
CHECKPOINT_SHARDS = {
    "fsdp": ("sharded", ["__0_0.distcp", "__1_0.distcp"]),
    "zero2": ZERO_SHARDS,
    "zero3": ZERO_SHARDS,
}
"""Where each engine's checkpoint keeps the shards every process writes."""


# three launches of two processes each (~35 s): every engine in CI (-m slow); the default run resumes one
# process exactly (test_grpo.py) and exports FSDP's gathered model from one process (above)
@pytest.mark.parametrize("engine", [pytest.param(e, marks=pytest.mark.slow) for e in SHARDED])
def test_sharded_on_two_processes_resumes_exactly_and_exports_the_gathered_model(world_dir, tmp_path, engine):
    script = str(HERE / "parallel_run.py")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    for folder, mode in ((straight, "straight"), (resumed, "first"), (resumed, "resume")):
        # the resume: a new pair of processes starts from the sharded checkpoint of step 1; a warmup, so
        # the learning rate changes from step to step (the schedule is restored too)
        extra = ["train.optim.warmup_steps=2", *SHARDED[engine]]
        run = [*TWO_PROCESSES, script, str(world_dir), str(folder), mode, *extra]
        subprocess.run(run, check=True, env=ENV, timeout=300)
    folder, shards = CHECKPOINT_SHARDS[engine]
    checkpoint = resumed / "checkpoints" / "step-000001" / "state" / folder
    assert set(shards) <= {p.name for p in checkpoint.iterdir()}  # every process wrote its own shard
    a, b = torch.load(straight / "w.pt"), torch.load(resumed / "w.pt")
    assert close(a, b) == 0.0  # bit for bit: weights, optimizer state, sampler and RNG streams restored
    from safetensors.torch import load_file

    exported = load_file(resumed / "policy" / "model.safetensors")
    assert close({k: b[k] for k in exported}, exported) == 0.0


@pytest.mark.parametrize("engine", [pytest.param(e, marks=pytest.mark.slow) for e in SHARDED])
def test_sharded_on_two_processes_resumes_exactly_after_kill_9(world_dir, tmp_path, engine):
    """Both processes killed (SIGKILL to the launcher's process group) during step 2 of 3, right after
    the checkpoint of step 1 is complete; a new pair resumes from it and ends where a straight run does."""
    import signal
    import time

    script = str(HERE / "parallel_run.py")
    extra = ["train.steps=3", "train.save_every=1", *SHARDED[engine]]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    subprocess.run([*TWO_PROCESSES, script, str(world_dir), str(straight), "straight", *extra], check=True,
                   env=ENV, timeout=300)  # fmt: skip
    run = subprocess.Popen(
        [*TWO_PROCESSES, script, str(world_dir), str(killed), "straight", *extra],
        env=ENV, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    first = killed / "checkpoints" / "step-000001"
    deadline = time.monotonic() + 300
    while not first.is_dir() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    assert first.is_dir() and not (killed / "checkpoints" / "step-000003").exists()  # killed mid-run
    assert not (killed / "w.pt").exists()
    resume = [*TWO_PROCESSES, script, str(world_dir), str(killed), "resume", *extra]
    subprocess.run(resume, check=True, env=ENV, timeout=300)
    assert close(torch.load(straight / "w.pt"), torch.load(killed / "w.pt")) == 0.0


@pytest.mark.parametrize("engine", engines(*SHARDED))
@pytest.mark.parametrize("algo", [pytest.param("sft", marks=pytest.mark.slow), "dpo"])
def test_sharded_on_two_processes_makes_the_same_sft_and_dpo_step_as_one_process(
    world_dir, algo, engine, launched
):
    # 8 demonstrations (SFT) or 8 pairs (DPO, with its reference) a step in micro-batches of 2: 4 on each
    # of two processes, accumulated
    one, two = launched(algo, processes=1), launched(algo, *SHARDED[engine])
    a, b = torch.load(one / "w.pt"), torch.load(two / "w.pt")
    from safetensors.torch import load_file

    init = load_file(world_dir / "model" / "model.safetensors")
    assert max(float((a[k] - init[k]).abs().max()) for k in init) > 1e-4
    same_update(a, b)
    norms = [json.loads((folder / "grad_norm-0.json").read_text()) for folder in (one, two)]
    assert norms[1] == pytest.approx(norms[0], rel=1e-4)  # the gradient itself (a scale error is ×2 or ×0.5)


@pytest.mark.parametrize("engine", engines(*SHARDED, default="zero3"))
def test_sharded_on_two_processes_evaluates_on_the_main_process_with_a_reference_and_recompute(
    engine, launched
):
    # the main process evaluates alone between gathered weights; the reference and recompute passes
    # and the update run in lockstep (a process left with nothing to train on: the test below)
    run = launched("evaluated", *SHARDED[engine])
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in records if r["kind"] == "eval"] == ["before", "train", "after"]
    assert (run / "best" / "best.json").is_file() and (run / "best" / "model.safetensors").is_file()
    assert all("kl" in r for r in records if r["kind"] == "train")


@pytest.mark.parametrize("engine", engines("zero2", "zero3", default="zero3"))
def test_deepspeed_skips_a_non_finite_update_and_the_watchdog_stops_the_run(engine, launched):
    # ZeRO clips inside its own step: the norm is read after it, and ZeRO has skipped the update
    run = launched("nan", "train.save_every=1", *SHARDED[engine])
    message = (run / "diverged.txt").read_text()
    assert message.startswith("step 2: the gradient norm is ") and "step-000001" in message
    from safetensors.torch import load_file

    good = load_file(run / "checkpoints" / "step-000001" / "policy" / "model.safetensors")
    after = torch.load(run / "w.pt")
    assert close({k: after[k] for k in good}, good) == 0.0  # the bad update was not applied


@pytest.mark.parametrize("stage", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_a_zero_1_or_2_policy_handed_to_a_second_trainer_is_refused(stage, launched):
    # ZeRO-1/2 leave the parameters whole but map them to the first engine's optimizer partitions and
    # hook their gradients: a second engine over them would train with the first one's hooks on
    run = launched("handover", *{**SHARDED, **ZERO1}[f"zero{stage}"], processes=1)
    assert "sharded already" in (run / "handover.txt").read_text()


def test_deepspeed_on_one_process_makes_the_ddp_update(launched):
    ddp, ds = (launched("update", "1", *engine, processes=1) / "w.pt" for engine in ([], SHARDED["zero2"]))
    assert close(torch.load(ddp), torch.load(ds)) == 0.0


@pytest.mark.parametrize("engine", [pytest.param(e, marks=pytest.mark.slow) for e in ("fsdp", "zero3")])
def test_lora_sharded_on_two_processes_makes_the_same_update_resumes_exactly_and_exports_the_adapters(
    world_dir, tmp_path, engine
):
    # LoRA's dropout draws from each process's RNG stream: off, so one process is the reference
    lora = [
        *LORA,
        "train.grpo.kl_coef=0.01",  # a KL reference: under LoRA the base with the adapters off
    ]
    grpo, parallel = str(HERE / "grpo_run.py"), str(HERE / "parallel_run.py")
    one = tmp_path / "one" / "w.pt"
    one.parent.mkdir()
    subprocess.run([sys.executable, grpo, str(world_dir), str(one), "2", *lora], check=True, env=ENV)
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    for folder, mode in ((straight, "straight"), (resumed, "first"), (resumed, "resume")):
        run = [*TWO_PROCESSES, parallel, str(world_dir), str(folder), mode, *lora, *SHARDED[engine]]
        subprocess.run(run, check=True, env=ENV, timeout=300)
    a, b, c = torch.load(one), torch.load(straight / "w.pt"), torch.load(resumed / "w.pt")
    adapters_one, adapters_two = ({k: v for k, v in w.items() if "lora_" in k} for w in (a, b))
    assert len(adapters_one) == 8 and max(float(v.abs().max()) for k, v in a.items() if "lora_B" in k) > 1e-4
    same_update(adapters_one, adapters_two)  # two steps (the KL reference is the base with the adapters off)
    frozen = [k for k in b if "lora_" not in k]  # the base stays as it was (ZeRO-3 gathers the adapters only)
    assert close({k: a[k] for k in frozen}, {k: b[k] for k in frozen}) == 0.0
    assert close(b, c) == 0.0
    from safetensors.torch import load_file

    adapters = load_file(resumed / "policy" / "adapter_model.safetensors")  # saved as adapters
    assert len(adapters) == 8
    assert close(adapters, {k.replace(".default", ""): v for k, v in c.items() if "lora_" in k}) == 0.0


@pytest.mark.parametrize("engine", engines("fsdp", "zero3", default="zero3"))
@pytest.mark.parametrize(
    "lora", [pytest.param([], id="full", marks=pytest.mark.slow), pytest.param(LORA, id="lora")]
)
def test_sharded_update_pads_a_process_whose_groups_were_all_filtered_out(engine, lora, launched):
    # process 1's rewards are all 0, so drop_zero_variance leaves it nothing: every pass of its update
    # (π_old recomputed, the KL reference, the policy) is padding that must join process 0's collectives;
    # under ZeRO-3 with LoRA the reference padding runs with the adapters off, as the real pass does
    run = launched("uneven", *lora, *SHARDED[engine])
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 1 and train[0]["zero_variance_frac"] == 0.5 and "kl" in train[0]


def test_a_batch_the_processes_cannot_share_evenly_is_refused_before_training(launched):
    # GRPO's prompts (whole groups a process), SFT's demonstrations, DPO's pairs, a preference cycle's
    # questions: 3 on two processes
    run = launched("refused")
    errors = [json.loads((run / f"refused-{rank}.json").read_text()) for rank in (0, 1)]
    assert errors[0] == errors[1]  # both processes stop, with the same message
    assert errors[0] == {
        "grpo": "train.grpo.prompts_per_step (3) must be a multiple of the number of processes × "
        "minibatches (2 × 1): every process holds whole groups",
        "sft": "train.sft.batch_size (3) must be a multiple of the number of processes (2)",
        "dpo": "train.dpo.batch_size (3) must be a multiple of the number of processes (2)",
        "cycles": "train.cycles.questions_per_cycle (3) must be a multiple of the number of processes (2): "
        "each plays an equal share",
    }


def test_stale_extension_build_locks_are_named(tmp_path, monkeypatch):
    """A DeepSpeed op build killed mid-way leaves ``<extensions dir>/<op>/lock``, on which every later
    start waits forever: a lock older than ten minutes is reported with its age, a fresh one (a build
    running now) is not."""
    from ragrl.train.parallel import stale_build_locks

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    old, fresh = tmp_path / "deepspeed_shm_comm" / "lock", tmp_path / "other_op" / "lock"
    for lock in (old, fresh):
        lock.parent.mkdir()
        lock.touch()
    hour_ago = old.stat().st_mtime - 3600
    os.utime(old, (hour_ago, hour_ago))
    (found,) = stale_build_locks()
    assert found[0] == old and 3590 < found[1] < 3700
    assert stale_build_locks(max_age_s=7200) == []
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "absent"))
    assert stale_build_locks() == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="DeepSpeed's CUDA accelerator has no such op")
def test_deepspeeds_cpu_op_is_built_into_torchs_extensions_folder():
    """``make test`` builds DeepSpeed's CPU collectives op before the tests (``build_deepspeed_cpu_ops``;
    here it loads, or a new machine builds it, about 40 s): the library loaded is torch's build of it."""
    import os

    from torch.utils.cpp_extension import get_default_build_root

    from ragrl.train.parallel import build_deepspeed_cpu_ops

    built = build_deepspeed_cpu_ops()
    assert built is not None and built.is_file() and built.name.startswith("deepspeed_shm_comm")
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    assert root in built.parents
