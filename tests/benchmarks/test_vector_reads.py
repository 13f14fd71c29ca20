"""``benchmarks/vector_reads.py`` at toy scale: both reads return the same rows and the ratio is printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_vector_read_benchmark_compares_both_reads_on_the_same_rows():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "vector_reads.py"), "--rows", "3000", "--dim", "16",
         "--ids", "500", "--repeats", "2"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "3,000 rows of 16 float32, 500 random rows a read, 2 reads"
    assert lines[-1].startswith("pread ÷ preadv: ") and float(lines[-1].split(": ")[1]) > 0
