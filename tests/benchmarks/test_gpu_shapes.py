"""``benchmarks/gpu_shapes.py``'s tables: a row is written as each of its parts is measured, so a device
call cut at its limit still brings back what it measured (the third GPU run's shapes call ended at its
limit with one row of two)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_shapes  # noqa: E402

# the third GPU run's Qwen2.5-1.5B row (2026-11-29), as gpu_shapes wrote it, part by part
ROW = {
    "shape": "qwen2.5-1.5b",
    "questions": 8,
    "sequences": 40,
    "parameters": 1_543_714_304,
    "prompt_tokens": 513,
}
GENERATE = {"tokens_per_s": 579}
RAGRL = {
    "step_seconds": 15.26, "rollout_seconds": 12.29, "logprob_seconds": 0.01, "update_seconds": 2.96,
    "rollout_tokens_per_s": 1628, "peak_gb": 17.21, "response_len": 500,
}  # fmt: skip


def test_a_row_cut_at_the_calls_limit_shows_what_it_measured():
    before_ragrl = {**ROW, "generate": GENERATE}
    line = gpu_shapes.table([before_ragrl]).splitlines()[2]
    assert line == "| qwen2.5-1.5b | 1544M | 8 × 5 | 513 | 579 | — | not reached | — | not reached | — |"
    out_of_memory = {**before_ragrl, "oom": True}  # ragrl's step ran out of memory: generate's figure stays
    line = gpu_shapes.table([out_of_memory]).splitlines()[2]
    assert line == "| qwen2.5-1.5b | 1544M | 8 × 5 | 513 | 579 | — | OOM | — | not reached | — |"
    before_trl = {**before_ragrl, "ragrl": RAGRL}
    line = gpu_shapes.table([before_trl]).splitlines()[2]
    assert line == (
        "| qwen2.5-1.5b | 1544M | 8 × 5 | 513 | 579 | 1,628 | 15.26 (12.3 / 0.0 / 3.0) | 17.21 | not reached "
        "| — |"
    )
    assert all(line.count("|") == 11 for line in gpu_shapes.table([before_ragrl, out_of_memory]).splitlines())
    whole = {**before_trl, "trl": {"step_seconds": 13.75}, "trl_over_ragrl": 0.9}
    line = gpu_shapes.table([whole]).splitlines()[2]
    assert line == (
        "| qwen2.5-1.5b | 1544M | 8 × 5 | 513 | 579 | 1,628 | 15.26 (12.3 / 0.0 / 3.0) | 17.21 | 13.75 "
        "| 0.9 |"
    )


def test_the_sweep_reports_each_part_of_a_row_as_it_is_measured(tmp_path):
    """The toy shape on the CPU: the tables are rewritten after generate, after ragrl's step and after
    the whole row, the one row growing (never a second copy of it)."""
    seen: list[set[str]] = []
    real_write = gpu_shapes.table

    def table(rows):  # what each rewrite of the tables held
        seen.append({key for row in rows for key in row} | {f"rows={len(rows)}"})
        return real_write(rows)

    gpu_shapes.table = table
    try:
        gpu_shapes.main(["--toy", "--out", str(tmp_path)])
    finally:
        gpu_shapes.table = real_write
    writes = seen[:-1]  # the last call prints the final table
    assert all("rows=1" in w for w in writes)
    assert "generate" in writes[0] and "ragrl" not in writes[0]
    assert "ragrl" in writes[1] and "trl" not in writes[1]
    assert "trl" in writes[-1]
