"""Crash at any instant: ``kill -9`` a short GRPO run and a short SFT run at random instants (the first
kill of each trainer lands inside its first checkpoint write), resume each with ``--resume latest``, and
check that every run ends bit-identical to the uninterrupted one. Slow: ``make reliability``."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

KILLS_PER_TRAINER = 10
KILLS_PER_CHAIN = 4
TINY = [
    "train.grpo.prompts_per_step=2", "rollout.n=2", "rollout.max_turns=2", "rollout.max_new_tokens=8",
    "train.data.eval_limit=3", "train.sft.batch_size=4", "train.save_every=1", "train.keep_checkpoints=2",
]  # fmt: skip


def _command(trainer: str, world: Path, out: Path) -> list[str]:
    paths = [
        f"train.model.path={world / 'model'}", f"train.data.train={world / 'train.jsonl'}",
        f"train.data.eval={world / 'dev.jsonl'}", f"train.data.index={world / 'bm25'}",
    ]  # fmt: skip
    extra = ["train.steps=6"] if trainer == "train" else ["train.sft.max_steps=8"]
    sets = [arg for item in (*paths, *TINY, *extra) for arg in ("--set", item)]
    demos = ["--demos", "oracle"] if trainer == "sft" else []
    return [sys.executable, "-m", "ragrl", trainer, "search_r1-tiny", *demos, "--out", str(out), *sets]


def _start(command: list[str], log: Path) -> subprocess.Popen:
    with log.open("ab") as err:  # a file, not a pipe: a killed process never blocks on a full pipe
        return subprocess.Popen(
            [*command, "--resume", "latest"],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "PYTHONHASHSEED": "0"},
            start_new_session=True,
        )


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _kill_at(proc: subprocess.Popen, instant: float | int, out: Path) -> bool:
    """Kill ``proc`` at ``instant`` seconds (a float) or, for an int ``k``, the moment it starts writing
    checkpoint ``k``; False when it finished first."""
    if isinstance(instant, int):
        writing = out / "checkpoints" / f"step-{instant:06d}.tmp"
        while proc.poll() is None:
            if writing.exists():
                _kill(proc)
                return True
            time.sleep(0.0005)
        return False
    try:
        proc.wait(timeout=instant)
        return False
    except subprocess.TimeoutExpired:
        _kill(proc)
        return True


def _steps_saved(out: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*[0-9]"))


def _finish(command: list[str], log: Path) -> None:
    proc = _start(command, log)
    proc.wait(timeout=600)
    assert proc.returncode == 0, log.read_text(errors="replace")[-3000:]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "policy" / "model.safetensors")


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["train", "sft"])
def test_kill_at_random_instants_then_resume_ends_bit_identical(trainer, world_dir, tmp_path):
    rng = random.Random(1234 if trainer == "train" else 4321)
    base = tmp_path / "uninterrupted"
    log = tmp_path / "stderr.log"
    t0 = time.perf_counter()
    proc = _start(_command(trainer, world_dir, base), log)
    while proc.poll() is None and not (base / "config.yaml").exists():
        time.sleep(0.01)
    startup = time.perf_counter() - t0  # imports and loading: before the run folder is written
    assert proc.wait(timeout=600) == 0, log.read_text(errors="replace")[-3000:]
    wall = time.perf_counter() - t0
    reference = _weights(base)

    steps = 6 if trainer == "train" else 8
    landed, chains, where = 0, 0, Counter()
    while landed < KILLS_PER_TRAINER:
        out = tmp_path / f"chain-{chains}"
        command = _command(trainer, world_dir, out)
        for i in range(KILLS_PER_CHAIN):
            if landed == KILLS_PER_TRAINER:
                break
            # the first kill inside the first checkpoint write; then half inside a later checkpoint
            # write, half at a random instant (one in five of those anywhere, startup included)
            saved = _steps_saved(out)
            last = saved[-1] if saved else 0
            instant: float | int
            if chains == 0 and i == 0:
                instant = 1
            elif rng.random() < 0.5 and last < steps:
                instant = rng.randint(last + 1, steps)
            else:
                instant = rng.uniform(0.2 if rng.random() < 0.2 else startup, wall)
            proc = _start(command, log)
            if not _kill_at(proc, instant, out):
                assert proc.returncode == 0, log.read_text(errors="replace")[-3000:]
                break
            landed += 1
            saved = _steps_saved(out)
            if isinstance(instant, int):
                where[f"inside checkpoint {instant}'s write"] += 1
            else:
                where[f"at random, after checkpoint {saved[-1]}" if saved else "at random, before any"] += 1
        _finish(command, log)  # resume (or restart) to the end
        assert _same(_weights(out), reference), f"{trainer} chain {chains} differs from the uninterrupted run"
        chains += 1
    print(
        f"\ncrash {trainer}: {landed} kills in {chains} runs, every run bit-identical to the uninterrupted "
        f"one ({wall:.0f} s, {startup:.0f} s of it startup); kills: "
        + "; ".join(f"{k}: {v}" for k, v in sorted(where.items()))
    )
