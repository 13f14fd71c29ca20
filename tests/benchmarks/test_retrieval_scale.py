"""``benchmarks/retrieval_scale.py`` at toy scale: every step runs (the corpus, the IVF-PQ, BM25 and
hybrid builds, the speed comparison and its sweep of settings, two servers under concurrent clients)
and its table is printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # 24 s: CI runs it (.ci/run), the default run stays under 10 minutes
def test_the_scale_benchmark_runs_every_step_at_toy_scale(tmp_path):
    pytest.importorskip("faiss")
    pytest.importorskip("uvicorn")
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "retrieval_scale.py"), "--passages", "3000",
         "--queries", "64", "--clients", "3", "--bm25", "--sweep", "--workdir", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((tmp_path / "steps.json").read_text())
    for step in ("synth-corpus", "index ivf-pq", "index bm25", "index hybrid"):
        assert record[step]["seconds"] > 0 and record[step]["peak_rss_mb"] > 0
    assert record["recall check"]["index"] == "IVF64,PQ192x4fsr"
    for name in ("serve ivf-pq", "serve bm25 + ivf-pq (hybrid)"):
        assert record[name]["errors"] == 0 and record[name]["requests"] == 60
    assert record["speed"]["ivf_pq_qps"] > 0 and 0 < record["speed"]["recall@10"] <= 1
    # the built index, the previous default and today's built from its vectors (the same spec as the
    # built one here), HNSW32 from them
    indexes = ["IVF64,PQ192x4fsr", "IVF64,PQ96x4fsr"] + ["IVF64,PQ192x4fsr"] * 6 + ["HNSW32"] * 3
    assert [r["index"] for r in record["sweep"]] == indexes
    settings = [(r.get("nprobe"), r.get("rerank")) for r in record["sweep"][:3]]
    assert settings == [(64, 10), (512, 40), (128, 10)]
    assert all(0 < r["recall@10"] <= 1 and r["qps"] > 0 for r in record["sweep"])
    assert done.stdout.splitlines()[-1].startswith("IVF-PQ ÷ flat queries/s at batch 32: ")
