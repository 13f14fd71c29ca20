"""The scoring-memory benchmark runs both ways on the same logits, whole or a slice, and they agree."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "selective_logsoftmax_memory.py"


@pytest.mark.slow  # ~20 s of process start-ups: CI runs it (.ci/run), the default run stays short
@pytest.mark.parametrize("sliced", [False, True])
def test_both_ways_score_the_same_values_and_the_ratio_is_printed_last(sliced):
    cmd = [sys.executable, str(SCRIPT), "--batch", "2", "--length", "16", "--vocab", "64", "--repeats", "1"]
    out = subprocess.run(
        cmd + ["--sliced"] * sliced, check=True, capture_output=True, text=True, timeout=300
    ).stdout
    assert ("(the first 16 positions scored)" in out.splitlines()[0]) is sliced
    same = re.findall(r"log-prob sums (\S+) / (\S+), \|grad\| sums (\S+) / (\S+)", out)
    assert len(same) == 2  # bfloat16 and float32
    for plain_lp, sel_lp, plain_g, sel_g in same:
        assert float(plain_lp) == pytest.approx(float(sel_lp), abs=1e-3)
        assert float(plain_g) == pytest.approx(float(sel_g), rel=1e-3)
    assert re.fullmatch(
        r"selective / plain: bfloat16 peak \S+, time \S+; float32 peak \S+, time \S+",
        out.splitlines()[-1],
    )
