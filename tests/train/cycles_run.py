"""A small preference-cycle run (EVO-RAG's ``train.algo: cycles``) as a script, for the parallel tests:
``python cycles_run.py WORLD RUN_DIR straight|first|resume [OVERRIDES...]``, alone or under ``torchrun
--standalone --nproc_per_node 2`` with ``ACCELERATE_USE_CPU=true``. ``straight`` trains 2 cycles,
``first`` stops after cycle 1 with a checkpoint, ``resume`` resumes that run to cycle 2 (``train.steps``
overrides the count). Every process writes ``heads-<rank>.pt`` (its reward models' heads); the main
process writes ``cycles.json`` (each cycle's logged metrics, the timings left out) and the gathered
policy, ``w.pt``.

The cycle: 8 questions (4 a process on two), 3 candidates a state (an untagged turn is the answer, so
the untrained policy's siblings differ), every sibling pair for the reward models, DPO batches of 3
pairs in micro-batches of 1 (each process trains on the pairs of a batch that it made: on two
processes the shares of 3 always differ, so a sharded engine pads), both reward models, the policy
pairs scored by the multi-head reward model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from grpo_run import leave  # noqa: E402

from ragrl.methods import load_method  # noqa: E402
from ragrl.train.cycles import CycleTrainer  # noqa: E402

VOLATILE = {"time", "step_seconds", "seconds_rollout"}


def cycle_trainer(world: Path, run_dir: Path, *extra: str) -> CycleTrainer:
    method = load_method(
        "evo_rag-tiny",
        [
            f"train.model.path={world / 'model'}",
            f"train.out={run_dir}",
            f"train.data.train={world / 'train.jsonl'}",
            f"train.data.index={world / 'bm25'}",
            "rollout.max_turns=3",
            "rollout.invalid_fallback=answer",  # an untrained policy writes no tag: its text answers
            "train.steps=2",
            "train.cycles.questions_per_cycle=8",
            "train.cycles.n_candidates=3",
            "train.cycles.policy_pair_scorer=rm",
            "train.cycles.pref_margin=0.0",
            "train.cycles.rm_pair_threshold=0.0",
            "train.dpo.batch_size=3",
            "train.dpo.micro_batch_size=1",
            "train.stages=[]",
            "train.eval_every=0",
            "train.optim.lr=1e-3",
            *extra,
        ],
    )
    return CycleTrainer(method, method.train, eval_examples=[])


def cycles(world: Path, run_dir: Path, mode: str, *extra: str) -> None:
    """The run (``straight``, ``first`` or ``resume``) on every process of a launch, and its records."""
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = cycle_trainer(world, run_dir, *extra)
    if mode == "first":
        trainer.train(until=1)
    else:
        trainer.train(resume="latest" if mode == "resume" else None)
    rank = trainer.acc.process_index
    if trainer.acc.is_main_process:
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        cycles = [{k: v for k, v in r.items() if k not in VOLATILE} for r in records if r["kind"] == "cycle"]
        (run_dir / "cycles.json").write_text(json.dumps(cycles))
    heads = {name: model.heads.state_dict() for name, (model, _) in trainer.reward_models.items()}
    torch.save(heads, run_dir / f"heads-{rank}.pt")
    weights = trainer.parallel.full_state_dict(trainer.model)
    if trainer.acc.is_main_process:
        torch.save({k: v.detach().clone() for k, v in weights.items()}, run_dir / "w.pt")
    trainer.acc.wait_for_everyone()


if __name__ == "__main__":
    cycles(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], *sys.argv[4:])
    leave()
