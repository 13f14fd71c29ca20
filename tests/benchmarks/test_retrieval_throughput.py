"""``benchmarks/retrieval_throughput.py`` on the shared 2Wiki sample, few queries: ragrl, raw bm25s, a
loaded index and two threads give the same hits and their ratios are printed (~3 s)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("RAGRL_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.mark.skipif(not (DATA / "corpus").is_dir(), reason="needs ../shared/data")
def test_the_bm25_throughput_benchmark_checks_the_hits_and_prints_each_ratio():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "retrieval_throughput.py"), "--queries", "50",
         "--repeats", "1", "--rank-bm25-queries", "5", "--compare-threads", "2", "--loaded"],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[1].startswith("check: identical scores and hits for all 50 queries")
    ratios = {line.split(" throughput ratio: ")[0]: float(line.split(": ")[-1])
              for line in lines if " throughput ratio: " in line}  # fmt: skip
    assert set(ratios) >= {"ragrl/bm25s", "n_threads=2 / n_threads=0", "loaded / built"}
    assert all(r > 0 for r in ratios.values())
    assert lines[-1].startswith("loaded / built throughput ratio: ")
    loaded = [line for line in lines if line.startswith("ragrl bm25, loaded (passages on disk): ")]
    assert len(loaded) == 1 and loaded[0].endswith("(same hits)")
