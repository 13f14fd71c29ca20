"""A small GRPO run on the test world, as a script: ``python grpo_run.py WORLD OUT.pt [STEPS] [k=v ...]``,
or on two processes under ``torchrun --standalone --nproc_per_node 2`` with ``ACCELERATE_USE_CPU=true``.
Writes the policy's state dict after STEPS steps (default 1) to OUT.pt from the main process, and from
every process ``sampler-<rank>.json`` (its prompt sampler's position and the refill rounds of each
step). Its ``update`` is parallel_run.py's ``update`` job (the tests launch it there, with others); its
``small_method``, ``weights`` and ``records`` are the GRPO tests' helpers."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from ragrl.methods import load_method
from ragrl.rewards import build_reward
from ragrl.rewards.registry import REWARDS, register_reward
from ragrl.train.grpo import GRPOTrainer

if "distinct_tokens" not in REWARDS.names():

    @register_reward("distinct_tokens")
    def distinct_tokens(trajectory, example, ctx) -> float:  # noqa: ANN001
        """A reward that varies within every group of an untrained policy (so updates happen): the
        distinct even token ids it wrote. (All distinct ids would not vary: an untrained policy samples
        near-uniformly from thousands of tokens, so a short episode repeats none.)"""
        ids = [t for s in trajectory.segments if s.kind == "policy" for t in s.token_ids]
        return len({t for t in ids if t % 2 == 0}) / 16.0


def small_method(world: Path, run_dir: Path, *extra: str):  # noqa: ANN201
    method = load_method(
        "search_r1-tiny",
        [
            f"train.model.path={world / 'model'}",
            f"train.data.train={world / 'train.jsonl'}",
            f"train.data.index={world / 'bm25'}",
            f"train.out={run_dir}",
            "train.steps=3",
            "train.grpo.prompts_per_step=4",
            "train.grpo.group_filter=keep_all",
            "train.grpo.micro_batch_size=6",
            "train.optim.lr=1e-3",
            "train.optim.warmup_steps=0",
            "train.eval_every=0",
            "rollout.n=4",
            "rollout.max_turns=2",
            "rollout.max_new_tokens=12",
            "rollout.temperature=1.0",
            *extra,
        ],
    )
    method.reward = build_reward([{"name": "distinct_tokens", "weight": 1.0}, {"name": "em", "weight": 0.5}])
    return method


VOLATILE = {"time", "step_seconds", "rollout_seconds", "logprob_seconds", "update_seconds"}


def weights(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}


def records(run_dir: Path, kind: str = "train") -> list[dict]:
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["kind"] == kind:
            out.append({k: v for k, v in r.items() if k not in VOLATILE})
    return out


def leave() -> None:
    """Exit as ragrl.cli does: gloo's threads abort some processes in the interpreter's teardown."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def update(world: Path, out: Path, steps: int, *extra: str, em_only: bool = False) -> None:
    """``steps`` GRPO steps (on every process of a launch): the weights to ``out`` from the main process,
    ``sampler-<rank>.json`` beside it from each."""
    method = small_method(world, out.parent / "run", *extra)
    if em_only:  # EM alone: most groups of an untrained policy are all 0
        method.reward = build_reward([{"name": "em", "weight": 1.0}])
    trainer = GRPOTrainer(method, method.train, eval_examples=[])
    results = [trainer.step() for _ in range(steps)]
    # every process: where its prompt sampler stands (they must agree), the refill rounds it played and
    # the gradient norms before clipping (a wrong gradient scale moves Adam's first step little)
    record = {"sampler": [trainer.sampler.epoch, trainer.sampler.position],
              "refill_rounds": [r["refill_rounds"] for r in results],
              "grad_norm": [r["grad_norm"] for r in results]}  # fmt: skip
    (out.parent / f"sampler-{trainer.acc.process_index}.json").write_text(json.dumps(record))
    state = trainer.parallel.full_state_dict(trainer.model)  # every process: a gather when sharded
    if trainer.acc.is_main_process:
        torch.save({k: v.detach().clone() for k, v in state.items()}, out)
    trainer.acc.wait_for_everyone()


if __name__ == "__main__":
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    update(Path(sys.argv[1]), Path(sys.argv[2]), steps, *sys.argv[4:])
    leave()
