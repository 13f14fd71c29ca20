"""``benchmarks/bm25s_numpy.py`` end to end, this interpreter on both sides (the comparison needs a second
virtualenv): the same scores are checked and the ratio is printed last."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("RAGRL_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.mark.skipif(not (DATA / "corpus").is_dir(), reason="needs ../shared/data")
def test_the_numpy_comparison_checks_the_scores_and_prints_the_ratio():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bm25s_numpy.py"), "--other", sys.executable,
         "--rounds", "1", "--queries", "20", "--repeats", "1"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 4 and lines[0].startswith("round 1: numpy ")
    assert lines[2] == "the same scores for all 20 queries (within 0.0e+00); 0 differ in which equal or " \
        "nearly equal-score passages fill the last places"  # fmt: skip
    assert lines[3].startswith("numpy ") and float(lines[3].split(": ")[1]) > 0
    # without a second interpreter it says what it needs
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bm25s_numpy.py")],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "--other PYTHON is required" in bad.stderr
