"""A small R²AG GRPO run on the test world, as a script: ``python r2ag_run.py WORLD OUT_DIR STEPS``, or on
two processes under ``torchrun --standalone --nproc_per_node 2`` with ``ACCELERATE_USE_CPU=true``.
Trains on the first 6 answerable training questions (the RR-Forest uses up its first round in
2 steps of 4 trees) and writes from every process ``forest-<rank>.json`` (the forest's state) and from
the main process ``weights.pt``. Used by test_forest.py (1 against 2 processes)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from ragrl.data.io import read_examples
from ragrl.methods import load_method
from ragrl.train.grpo import GRPOTrainer

if __name__ == "__main__":
    world, out, steps = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    method = load_method(
        "r2ag-tiny",
        [f"train.model.path={world / 'model'}", f"train.data.index={world / 'bm25'}",
         f"train.out={out / 'run'}",
         "train.grpo.prompts_per_step=4", "train.grpo.micro_batch_size=8", "train.optim.lr=1e-3",
         "train.optim.warmup_steps=0", "train.eval_every=0", "rollout.n=4", "rollout.temperature=1.0"],
    )  # fmt: skip
    train = [e for e in read_examples(world / "train.jsonl")[0] if e.metadata.get("answerable", True)][:6]
    trainer = GRPOTrainer(method, method.train, train_examples=train, eval_examples=[])
    for _ in range(steps):
        trainer.step()
    state = trainer.source.state_dict()
    (out / f"forest-{trainer.acc.process_index}.json").write_text(json.dumps(state))
    if trainer.acc.is_main_process:
        torch.save(
            {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}, out / "weights.pt"
        )
    trainer.acc.wait_for_everyone()
    # leave as ragrl.cli does: gloo's threads abort some processes in the interpreter's teardown
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
