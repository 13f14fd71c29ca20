"""``benchmarks/vllm_rollout.py`` at toy scale with the real engine (``make test-vllm``): both sides play
their rollouts, the weight load is timed and the ratio is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.vllm
def test_the_vllm_rollout_benchmark_runs_both_sides(tmp_path):
    pytest.importorskip("vllm")
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, "vllm_rollout.py", "--questions", "4", "--n", "2", "--repeats", "1",
         "--hidden", "64", "--layers", "2", "--workdir", str(tmp_path / "work"), "--json", str(out)],
        capture_output=True, text=True, cwd=ROOT / "benchmarks", timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    for side in ("transformers", "vllm"):
        assert figures[side]["policy_tokens"] > 0 and figures[side]["tokens_per_s_median"] > 0
    assert figures["weight_sync_s"] > 0 and figures["vllm_over_transformers"] > 0
    assert "rollout tokens/s, vLLM / transformers (median): " in done.stdout
