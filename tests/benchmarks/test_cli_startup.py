"""``benchmarks/cli_startup.py`` runs end to end: both starts timed, the ratio printed last."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # 9 s of process starts: CI's slow phase runs it (the default run's 10 minutes)
def test_the_start_time_benchmark_times_both_starts_and_prints_their_ratio():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cli_startup.py"), "--repeats", "1"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("ragrl --version: ") and "the methods imported" in lines[1]
    assert lines[-1].startswith("start time ratio, now / with the methods: ")
    assert float(lines[-1].split(": ")[1]) > 0
