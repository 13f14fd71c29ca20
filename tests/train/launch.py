"""How the training tests start two processes (torchrun on the CPU: gloo), and the jobs launched
together (the ``launched`` fixture, tests/train/conftest.py).

A launch's start is most of a small job's time: torchrun, two interpreters importing torch, transformers
and DeepSpeed, DeepSpeed's first set-up (measured 2026-11-29 on 2 cores: 5.2 s for two processes that
import and exit; the default run's seven two-process jobs of test_grpo.py and test_parallel.py took
11-20 s each, 106 s in all, launched apart, and 24 s in one launch of ``parallel_run.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).parent
SCRIPT = HERE / "parallel_run.py"
# Two real processes on the CPU (gloo): torchrun starts them and accelerate joins them. (`accelerate
# launch --cpu --num_processes 2` starts ONE process on a machine without GPUs, whatever it is told.)
TWO_PROCESSES = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
SHARDED = {
    "fsdp": ["train.parallel.mode=fsdp"],
    "zero2": ["train.parallel.mode=deepspeed", "train.parallel.zero_stage=2"],
    "zero3": ["train.parallel.mode=deepspeed", "train.parallel.zero_stage=3"],
}
"""The sharded engines the two-process tests run (each against one process or a straight run)."""
LORA = [
    "train.model.lora.r=4",
    "train.model.lora.dropout=0.0",
    "train.model.lora.target_modules=[q_proj,v_proj]",
]
"""Small adapters; no dropout (it draws from each process's RNG stream, so N processes would match N
DDP processes, not one)."""
ZERO1 = {"zero1": ["train.parallel.mode=deepspeed", "train.parallel.zero_stage=1"]}
"""ZeRO-1 (reduces at the accumulation boundary only): the first-update test."""
OFFLOAD = {f"{name}-offload": [*extra, "train.parallel.offload=true"] for name, extra in SHARDED.items()}
"""``train.parallel.offload``: FSDP's sharded state in host memory (``CPUOffloadPolicy``; nothing to pin
without a GPU), ZeRO's optimizer state (and under ZeRO-3 its parameters) offloaded: the first-update
test."""
REFILL = ["rollout.kind=stepwise", "train.grpo.group_filter=drop_zero_variance", "train.grpo.refill_rounds=3"]
"""Step-wise samples (uneven counts a process) and refill rounds (EM alone: most groups all wrong)."""
WHITENED = ["train.grpo.whiten=token"]

DEFAULT_RUN: dict[int, tuple[tuple[str, ...], ...]] = {
    2: (
        ("update", "1"),  # test_grpo.py: the first update under DDP
        ("update-em", "2", *REFILL),  # test_grpo.py: refills decided together
        ("update", "1", *SHARDED["fsdp"]),  # test_parallel.py: the first update sharded
        ("dpo", *SHARDED["fsdp"]),
        ("cycles-straight", "train.steps=1", *SHARDED["fsdp"]),  # test_parallel_cycles.py
        ("evaluated", *SHARDED["zero3"]),
        ("nan", "train.save_every=1", *SHARDED["zero3"]),
        ("uneven", *LORA, *SHARDED["zero3"]),
        ("refused",),  # the trainers' batches the processes cannot share
    ),
    1: (  # the references of the two-process jobs, and DeepSpeed on one process (last: its group of one)
        ("update", "1"),
        ("dpo",),
        ("cycles-straight", "train.steps=1"),
        ("update", "1", *SHARDED["zero2"]),
        ("handover", *SHARDED["zero2"]),
    ),
}
"""The default run's jobs of ``parallel_run.py`` (MODE, then OVERRIDES) by number of processes."""
SLOW: dict[int, tuple[tuple[str, ...], ...]] = {
    2: (
        ("update", "1", *WHITENED),
        ("cycles-straight", "train.steps=1"),
        ("sft", *SHARDED["fsdp"]),
        ("evaluated", *SHARDED["fsdp"]),
        ("uneven", *SHARDED["fsdp"]),
        ("uneven", *LORA, *SHARDED["fsdp"]),
        ("update", "1", *OFFLOAD["fsdp-offload"]),
        *(("update", "1", *extra) for extra in (*ZERO1.values(), SHARDED["zero2"], SHARDED["zero3"])),
        *(("update", "1", *OFFLOAD[f"{e}-offload"]) for e in ("zero2", "zero3")),
        *((algo, *SHARDED[e]) for algo in ("sft", "dpo") for e in ("zero2", "zero3")),
        ("evaluated", *SHARDED["zero2"]),
        ("nan", "train.save_every=1", *SHARDED["zero2"]),
        ("uneven", *SHARDED["zero3"]),
        *(("cycles-straight", "train.steps=1", *SHARDED[e]) for e in ("zero2", "zero3")),
    ),
    1: (("update", "1", *WHITENED), ("sft",), ("handover", *ZERO1["zero1"])),
}
"""The same for CI's slow tests (``-m slow``): the other engines."""
GROUPS = (DEFAULT_RUN, SLOW)
"""One launch for each group's jobs on each number of processes, started by the first of them a test
asks for: the engines one after the other in the same processes (DDP, FSDP, then ZeRO). A job of no
group launches alone."""


def launch(world: Path, jobs: Sequence[tuple[Path, Sequence[str]]], processes: int = 2) -> None:
    """``parallel_run.py`` on ``processes`` (1 or 2), each ``(RUN_DIR, (MODE, *OVERRIDES))`` in turn."""
    command = [*(TWO_PROCESSES if processes == 2 else [sys.executable]), str(SCRIPT), str(world)]
    for i, (folder, job) in enumerate(jobs):
        command += [*(["+"] if i else []), str(folder), *job]
    subprocess.run(command, check=True, env=ENV, timeout=300 + 60 * len(jobs))
