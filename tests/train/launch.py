"""How the training tests start two processes (torchrun on the CPU: gloo), and the jobs launched
together (the ``launched`` fixture, tests/train/conftest.py).

A launch's start is most of a small job's time: torchrun, two interpreters importing torch, transformers
and DeepSpeed, DeepSpeed's first set-up (measured 2026-11-29 on 2 cores: two processes that import and
exit, 5.2 s; the jobs of test_grpo.py, test_parallel.py and test_parallel_cycles.py in the default run,
each launched alone, 11-21 s a test: those three files took 146.2 s; with the groups below, 51.0 s at
9c7df37)."""

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
        ("refused",),  # the trainers' batches the processes cannot share
        ("evaluated", *SHARDED["zero3"]),
        ("nan", "train.save_every=1", *SHARDED["zero3"]),
        ("uneven", *LORA, *SHARDED["zero3"]),
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
        *(("update", "1", *extra) for extra in (ZERO1["zero1"], SHARDED["zero2"], OFFLOAD["zero2-offload"])),
        ("sft", *SHARDED["zero2"]),
        ("dpo", *SHARDED["zero2"]),
        ("evaluated", *SHARDED["zero2"]),
        ("nan", "train.save_every=1", *SHARDED["zero2"]),
        ("cycles-straight", "train.steps=1", *SHARDED["zero2"]),
        *(("update", "1", *extra) for extra in (SHARDED["zero3"], OFFLOAD["zero3-offload"])),
        ("sft", *SHARDED["zero3"]),
        ("dpo", *SHARDED["zero3"]),
        ("uneven", *SHARDED["zero3"]),
        ("cycles-straight", "train.steps=1", *SHARDED["zero3"]),
    ),
    1: (("update", "1", *WHITENED), ("sft",), ("handover", *ZERO1["zero1"])),
}
"""The same for CI's slow tests (``-m slow``): the other engines."""
GROUPS = (DEFAULT_RUN, SLOW)
"""One launch for each group's jobs on each number of processes, started by the first of them a test
asks for: the engines one after the other in the same processes, DDP and FSDP first, ZeRO-3 last (it
replaces torch's ``linear`` for the rest of the process: parallel_run.py refuses another job after it).
A job of no group launches alone."""


def launch(world: Path, jobs: Sequence[tuple[Path, Sequence[str]]], processes: int, log: Path) -> None:
    """``parallel_run.py`` on ``processes`` (1 or 2), each ``(RUN_DIR, (MODE, *OVERRIDES))`` in turn, its
    output into ``log``. Past the timeout torchrun is told to stop (SIGTERM: it stops its workers, each
    in a session of its own, which a kill of torchrun alone would leave running), then killed if it has
    not."""
    command = [*(TWO_PROCESSES if processes == 2 else [sys.executable]), str(SCRIPT), str(world)]
    for i, (folder, job) in enumerate(jobs):
        command += [*(["+"] if i else []), str(folder), *job]
    timeout = 300 + 60 * len(jobs)
    with (
        log.open("w") as out,
        subprocess.Popen(command, env=ENV, stdout=out, stderr=subprocess.STDOUT) as run,
    ):
        try:
            code = run.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            run.terminate()
            try:
                run.wait(timeout=60)
            except subprocess.TimeoutExpired:
                run.kill()
            raise
    if code != 0:
        raise subprocess.CalledProcessError(code, command)
