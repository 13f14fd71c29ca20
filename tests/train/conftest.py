"""Fixtures shared by the training tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def toy_base(tmp_path_factory):
    """A reader base at toy scale (``ragrl.train.reader``): two worlds, three SFT steps, built once."""
    from ragrl.train.reader import ReaderRecipe, pretrain_reader

    out = tmp_path_factory.mktemp("reader") / "base"
    recipe = ReaderRecipe(
        worlds=2, protected=(0,), steps=3, batch_size=4, hidden=32, layers=1, heads=2, intermediate=64,
        vocab_size=1024, copy_steps=0, validation_questions=4,
    )  # fmt: skip
    manifest = pretrain_reader(out, recipe, command="ragrl model reader --worlds 2 --steps 3")
    return out, manifest


@pytest.fixture(scope="session")
def one_process_first_update(world_dir, tmp_path_factory):
    """``grpo_run.py``'s first step on one process (its ``w.pt`` and ``sampler-0.json``), the reference of
    every "two processes make the same first update" test (test_grpo.py, test_parallel.py): run once."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path_factory.mktemp("one-process") / "w.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    script = str(Path(__file__).parent / "grpo_run.py")
    subprocess.run([sys.executable, script, str(world_dir), str(out), "1"], check=True, env=env)
    return out
