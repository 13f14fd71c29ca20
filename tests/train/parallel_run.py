"""Small training jobs for the parallel tests, alone or under ``torchrun --standalone --nproc_per_node 2``
with ``ACCELERATE_USE_CPU=true``: ``python parallel_run.py WORLD RUN_DIR MODE [OVERRIDES...]``, or several
jobs in one launch (its processes' start, mostly imports, paid once), one after the other:
``WORLD RUN_DIR MODE [OVERRIDES...] + RUN_DIR MODE [OVERRIDES...] ...``. The modes:

- ``straight``: 2 GRPO steps; ``first``: step 1, then a checkpoint; ``resume``: that run to step 2;
- ``update STEPS`` / ``update-em STEPS`` (EM alone): grpo_run.py's run (its ``sampler-<rank>.json``);
- ``sft``: one SFT step on the oracle's demonstrations of 8 training questions; ``dpo``: one DPO step on 8
  answer pairs (with its reference); each process writes ``grad_norm-<rank>.json``;
- ``evaluated``: 2 steps with a KL reference, 2 epochs (π_old recomputed), the zero-variance filter and
  an evaluation after each step (the best policy kept);
- ``nan``: step 1, then NaN advantages in step 2 (``diverged.txt``: the watchdog's message);
- ``uneven``: 1 step in which process 1's groups all have zero variance (it pads every pass);
- ``refused``: a GRPO, an SFT, a DPO and a cycle trainer whose batch the processes cannot share evenly
  (``refused-<rank>.json``: each one's error);
- ``handover``: a trainer's policy handed to a second trainer (``handover.txt``: its error);
- ``cycles-straight|first|resume``: cycles_run.py's run.

The main process writes the gathered weights to ``RUN_DIR/w.pt`` (after the stopped step for ``nan``;
none for ``refused`` and ``handover``) and marks each job done (``RUN_DIR/job-done``) as it ends. A job
that does not use ZeRO-3 refuses to run after one that did (ZeRO-3 replaces torch's linear for the rest
of the process)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from cycles_run import cycle_trainer, cycles  # noqa: E402
from grpo_run import leave, small_method, update  # noqa: E402

from ragrl.algos import ADVANTAGES, register_advantage  # noqa: E402
from ragrl.data.io import read_examples  # noqa: E402
from ragrl.errors import RagrlError  # noqa: E402
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


def refusals(world: Path, run_dir: Path, *extra: str) -> dict[str, str]:
    """A batch of 3 on two processes: each trainer's error (GRPO's prompts, SFT's demonstrations, DPO's
    pairs, a preference cycle's questions), raised before anything is trained."""

    def grpo() -> GRPOTrainer:
        method = small_method(world, run_dir, *extra, "train.grpo.prompts_per_step=3")
        return GRPOTrainer(method, method.train, eval_examples=[])

    makers = {
        "grpo": grpo,
        "sft": lambda: sft_trainer(world, run_dir, *extra, "train.sft.batch_size=3"),
        "dpo": lambda: dpo_trainer(world, run_dir, *extra, "train.dpo.batch_size=3"),
        "cycles": lambda: cycle_trainer(world, run_dir, *extra, "train.cycles.questions_per_cycle=3"),
    }
    errors = {}
    for name, make in makers.items():
        try:
            make()
        except RagrlError as e:
            errors[name] = str(e)
    return errors


def run(world: Path, run_dir: Path, mode: str, *extra: str) -> None:
    """One job; every process runs it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if mode in ("update", "update-em"):  # grpo_run.py's run: STEPS first, EM alone for update-em
        steps, *extra = extra
        update(world, run_dir / "w.pt", int(steps), *extra, em_only=mode == "update-em")
        return
    if mode.startswith("cycles-"):  # cycles_run.py's run: cycles-straight, cycles-first, cycles-resume
        cycles(world, run_dir, mode.removeprefix("cycles-"), *extra)
        return
    if mode == "handover":  # the policy of one trainer handed to a second: its error
        method = small_method(world, run_dir, *extra)
        trainer = GRPOTrainer(method, method.train, eval_examples=[])
        try:
            GRPOTrainer(
                method, method.train, eval_examples=[], model=trainer.policy, tokenizer=trainer.tokenizer
            )
        except RagrlError as e:
            (run_dir / "handover.txt").write_text(str(e))
        return
    if mode == "refused":
        rank = os.environ.get("RANK", "0")
        (run_dir / f"refused-{rank}.json").write_text(json.dumps(refusals(world, run_dir, *extra)))
        return
    if mode == "sft":
        trainer = sft_trainer(world, run_dir, *extra)
    elif mode == "dpo":
        trainer = dpo_trainer(world, run_dir, *extra)
    elif mode == "uneven":  # every group of process 1 has zero variance: it pads all its passes
        settings = ["train.steps=1", "train.grpo.group_filter=drop_zero_variance", "train.grpo.kl_coef=0.01",
                    "train.grpo.micro_batch_size=2", "train.grpo.ppo_epochs=2"]  # fmt: skip
        method = small_method(world, run_dir, *settings, *extra)
        if os.environ.get("RANK") == "1":
            method.reward = build_reward([{"name": "em", "weight": 0.0}])
        trainer = GRPOTrainer(method, method.train, eval_examples=[])
    elif mode == "evaluated":  # the main process evaluates alone; a KL reference; uneven micro-batches
        settings = ["train.steps=2", "train.eval_every=1", "train.best_metric=eval/em_answerable",
                    "train.data.eval_limit=4", "train.grpo.kl_coef=0.01", "train.grpo.ppo_epochs=2",
                    "train.grpo.group_filter=drop_zero_variance",
                    "train.grpo.micro_batch_size=2"]  # fmt: skip
        method = small_method(world, run_dir, *settings, *extra)
        dev = read_examples(world / "dev.jsonl")[0]
        trainer = GRPOTrainer(method, method.train, eval_examples=dev)
    else:
        method = small_method(world, run_dir, "train.steps=2", *extra)
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


LINEAR = torch.nn.functional.linear
"""torch's own: DeepSpeed's ZeRO-3 replaces it for the rest of the process (its memory-efficient linear)."""


def zero3(extra: list[str]) -> bool:
    """Whether a job's overrides select ZeRO-3 (``train.parallel.zero_stage`` is 3 unless set)."""
    settings = dict(o.split("=", 1) for o in extra if "=" in o)
    return (
        settings.get("train.parallel.mode") == "deepspeed"
        and settings.get("train.parallel.zero_stage", "3") == "3"
    )


def run_jobs(world: Path, jobs: list[list[str]]) -> None:
    """Each job in turn; once every process has ended it, the main process marks it done
    (``RUN_DIR/job-done``)."""
    for run_dir, mode, *extra in jobs:
        if torch.nn.functional.linear is not LINEAR and not zero3(extra):
            raise RuntimeError(
                f"job {mode} {' '.join(extra)}: a ZeRO-3 job before it replaced torch's linear for the rest "
                "of the process; put ZeRO-3 jobs last (tests/train/launch.py)"
            )
        run(world, Path(run_dir), mode, *extra)
        if torch.distributed.is_initialized():
            torch.distributed.barrier()  # every process's files are written
        if os.environ.get("RANK", "0") == "0":
            (Path(run_dir) / "job-done").touch()


if __name__ == "__main__":
    world, jobs = Path(sys.argv[1]), [[]]
    for arg in sys.argv[2:]:  # RUN_DIR MODE [OVERRIDES...], jobs separated by "+"
        if arg == "+":
            jobs.append([])
        else:
            jobs[-1].append(arg)
    run_jobs(world, jobs)
    leave()
