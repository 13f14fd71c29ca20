"""The micro-batch memory benchmark runs each size in a process of its own and prints the ratios."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "micro_batch_memory.py"


@pytest.mark.slow  # 11 s: CI runs it (.ci/run), the default run stays under 10 minutes
def test_the_micro_batch_benchmark_measures_each_size_and_prints_the_ratios():
    cmd = [sys.executable, str(SCRIPT), "--batch", "4", "--micro", "4", "2", "--length", "120",
           "--policy-tokens", "10", "--repeats", "1"]  # fmt: skip
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300).stdout
    lines = out.strip().splitlines()
    assert lines[0].startswith("micro-batch   4 of 4: peak") and lines[1].startswith("micro-batch   2 of 4")
    assert "threads" in lines[0]
    assert lines[-1].startswith("against micro-batch 4: 2: peak x")


def test_policy_tokens_that_do_not_fit_are_refused_with_the_room_there_is():
    cmd = [sys.executable, str(SCRIPT), "--length", "120", "--policy-tokens", "50"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--policy-tokens must be in 1..16 for --length 120" in done.stderr
