"""A small GRPO run under ``torchrun`` for the parallel tests: ``python parallel_run.py WORLD RUN_DIR
straight|first|resume|sft|dpo|evaluated|nan [OVERRIDES...]`` trains 2 GRPO steps straight, or stops after
step 1 with a checkpoint, or resumes that run to step 2, or makes one SFT step on the oracle's
demonstrations of 8 training questions, or one DPO step on 8 answer pairs (with its reference), or trains 2
steps with a KL reference, 2 epochs (π_old recomputed), the zero-variance filter and an evaluation after
each step (the best policy kept), or trains step 1 then meets NaN advantages in step 2
(``RUN_DIR/diverged.txt``: the watchdog's message); the main process writes the gathered weights to
``RUN_DIR/w.pt`` (after the stopped step for ``nan``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from grpo_run import leave, small_method  # noqa: E402

from ragrl.algos import ADVANTAGES, register_advantage  # noqa: E402
from ragrl.data.io import read_examples  # noqa: E402
from ragrl.retrieval.base import load_retriever  # noqa: E402
from ragrl.rewards import build_reward  # noqa: E402
from ragrl.synth.demonstrators import OracleDemonstrator  # noqa: E402
from ragrl.train.dpo import DPOTrainer, read_pairs  # noqa: E402
from ragrl.train.grpo import GRPOTrainer  # noqa: E402
from ragrl.train.setup import TrainingDiverged, load_policy  # noqa: E402
from ragrl.train.sft import SFTTrainer, demonstration_trajectories  # noqa: E402


def sft_trainer(world: Path, run_dir: Path, *extra: str) -> SFTTrainer:
    method = small_method(world, run_dir, "train.sft.batch_size=8", "train.sft.max_steps=1",
                          "train.grpo.micro_batch_size=2", *extra)  # fmt: skip
    _, tokenizer = load_policy(method.train.model, torch.device("cpu"))
    examples = read_examples(world / "train.jsonl")[0][:8]
    demos = demonstration_trajectories(
        method, tokenizer, OracleDemonstrator(), examples, load_retriever(world / "bm25")
    )
    return SFTTrainer(method, method.train, demos, eval_examples=[])


def dpo_trainer(world: Path, run_dir: Path, *extra: str) -> DPOTrainer:
    """8 pairs (a question's answer chosen, the next question's rejected), 4 a process, micro-batches of 2."""
    method = small_method(world, run_dir, "train.dpo.batch_size=8", "train.dpo.micro_batch_size=2",
                          "train.dpo.beta=0.5", *extra)  # fmt: skip
    _, tokenizer = load_policy(method.train.model, torch.device("cpu"))
    examples = read_examples(world / "train.jsonl")[0][:9]
    records = [
        {"id": a.id, "prompt": a.question, "chosen": f"<answer> {a.answers[0]} </answer>",
         "rejected": f"<answer> {b.answers[0]} </answer>"}
        for a, b in zip(examples, examples[1:], strict=False)
    ]  # fmt: skip
    path = run_dir / f"pairs-{os.environ.get('RANK', '0')}.jsonl"  # a file each: no race between processes
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return DPOTrainer(method, method.train, read_pairs(path, tokenizer), eval_examples=[])


if __name__ == "__main__":
    world, run_dir, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    run_dir.mkdir(parents=True, exist_ok=True)
    if mode == "sft":
        trainer = sft_trainer(world, run_dir, *sys.argv[4:])
    elif mode == "dpo":
        trainer = dpo_trainer(world, run_dir, *sys.argv[4:])
    elif mode == "uneven":  # every group of process 1 has zero variance: it pads all its passes
        extra = ["train.steps=1", "train.grpo.group_filter=drop_zero_variance", "train.grpo.kl_coef=0.01",
                 "train.grpo.micro_batch_size=2", "train.grpo.ppo_epochs=2"]  # fmt: skip
        method = small_method(world, run_dir, *extra, *sys.argv[4:])
        if os.environ.get("RANK") == "1":
            method.reward = build_reward([{"name": "em", "weight": 0.0}])
        trainer = GRPOTrainer(method, method.train, eval_examples=[])
    elif mode == "evaluated":  # the main process evaluates alone; a KL reference; uneven micro-batches
        extra = ["train.steps=2", "train.eval_every=1", "train.best_metric=eval/em_answerable",
                 "train.data.eval_limit=4", "train.grpo.kl_coef=0.01", "train.grpo.ppo_epochs=2",
                 "train.grpo.group_filter=drop_zero_variance", "train.grpo.micro_batch_size=2"]  # fmt: skip
        method = small_method(world, run_dir, *extra, *sys.argv[4:])
        dev = read_examples(world / "dev.jsonl")[0]
        trainer = GRPOTrainer(method, method.train, eval_examples=dev)
    else:
        method = small_method(world, run_dir, "train.steps=2", *sys.argv[4:])
        trainer = GRPOTrainer(method, method.train, eval_examples=[])
    if mode in ("sft", "dpo"):
        norm = trainer.step()["grad_norm"]  # before clipping: a wrong gradient scale shows here
        (run_dir / f"grad_norm-{trainer.acc.process_index}.json").write_text(json.dumps(norm))
    elif mode in ("straight", "evaluated", "uneven"):
        trainer.train()
    elif mode == "first":
        trainer.train(until=1)
    elif mode == "nan":
        trainer.train(until=1)
        if "nan_for_test" not in ADVANTAGES.names():
            register_advantage("nan_for_test")(
                lambda rewards, group_ids: torch.full_like(rewards, float("nan"))
            )
        trainer.config.grpo.advantage = "nan_for_test"
        try:
            trainer.step()
        except TrainingDiverged as e:
            (run_dir / "diverged.txt").write_text(str(e))
    else:
        trainer.train(resume="latest")
    weights = trainer.parallel.full_state_dict(trainer.model)
    if trainer.acc.is_main_process:
        torch.save({k: v.detach().clone() for k, v in weights.items()}, run_dir / "w.pt")
    trainer.acc.wait_for_everyone()
    leave()
