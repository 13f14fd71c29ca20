"""The run report: metrics read back, curves plotted, report.md written with summary, evals and samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragrl.errors import DataError
from ragrl.rollout.records import write_trajectories
from ragrl.rollout.trajectory import Segment, Trajectory
from ragrl.train.report import plot_curves, read_metrics, write_report

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _records() -> list[dict]:
    records: list[dict] = [
        {"kind": "sft", "step": 1, "time": 0.5, "loss": 2.1, "lr": 1e-5, "tokens": 512},
        {"kind": "sft", "step": 2, "time": 1.0, "loss": 1.7, "lr": 1e-5, "tokens": 512},
        {"kind": "eval", "step": 0, "time": 1.5, "eval/em": 0.23, "eval/f1": 0.31, "eval/answer_rate": 0.9,
         "eval/searches": 1.25, "eval/n": 100, "phase": "warm_start"},
    ]  # fmt: skip
    for step in range(1, 13):
        records.append(
            {
                "kind": "train",
                "step": step,
                "time": 2.0 + step,
                "reward": 0.2 + 0.02 * step,
                "reward/em": 0.1 + 0.02 * step,
                "reward/format": 0.1,
                "loss": 0.05,
                "kl": 0.001 * step,
                "grad_norm": 0.75,
                "extra_key": "ignored",
            }
        )
    records.append(
        {"kind": "eval", "step": 12, "time": 20.0, "eval/em": 0.31, "eval/f1": 0.4, "eval/answer_rate": 0.95,
         "eval/searches": 1.5, "eval/n": 100, "phase": "final"}
    )  # fmt: skip
    return records


def _write_metrics(run_dir: Path, records: list[dict]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 5000


def test_read_metrics_round_trips(tmp_path: Path) -> None:
    records = _records()
    assert read_metrics(_write_metrics(tmp_path, records)) == records


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [("[1, 2]", "expected a JSON object"), ('{"kind": "train", "time": 1.0}', "field 'step'")],
)
def test_read_metrics_names_the_bad_line(tmp_path: Path, bad_line: str, expected: str) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"kind": "train", "step": 1}) + "\n\n" + bad_line + "\n", encoding="utf-8")
    with pytest.raises(DataError) as info:
        read_metrics(path)
    assert info.value.line == 3
    assert f"metrics.jsonl:3: {expected}" in str(info.value)


def test_plot_curves_writes_a_png(tmp_path: Path) -> None:
    out = plot_curves(_records(), tmp_path / "sub" / "curves.png", title="grpo")
    assert out == tmp_path / "sub" / "curves.png"
    _assert_png(out)


@pytest.mark.parametrize("kinds", [(), ("sft",), ("eval",), ("sft", "eval")])
def test_plot_curves_with_missing_data(tmp_path: Path, kinds: tuple[str, ...]) -> None:
    records = [r for r in _records() if r["kind"] in kinds]
    _assert_png(plot_curves(records, tmp_path / "curves.png"))


def test_write_report(tmp_path: Path) -> None:
    _write_metrics(tmp_path, _records())
    (tmp_path / "config.yaml").write_text("seed: 7\n", encoding="utf-8")
    summary = {
        "method": "search_r1",
        "em_before": 0.23,
        "em_after": 0.31,
        "em_gain": 8.0,
        "n_eval": 100,
        "wall_seconds": 75.25,
        "peak_memory_mb": 1234.4,
        "custom_metric": 0.123456,
        "nested": {"not": "shown"},
    }
    report = write_report(tmp_path, summary)
    assert report == tmp_path / "report.md"
    text = report.read_text(encoding="utf-8")
    assert "| EM before | 23.0% |" in text
    assert "| EM after | 31.0% |" in text
    assert "| EM gain | +8.0 points |" in text
    assert "| held-out questions | 100 |" in text
    assert "| wall time | 75.2 s (1.3 min) |" in text
    assert "| peak memory | 1234 MB |" in text
    assert "| custom_metric | 0.1235 |" in text
    assert "nested" not in text
    assert "![curves](curves.png)" in text
    _assert_png(tmp_path / "curves.png")
    assert "| 0 | warm_start | 23.0% | 31.0% | 90.0% | 1.25 | 100 |" in text
    assert "| 12 | final | 31.0% | 40.0% | 95.0% | 1.50 | 100 |" in text
    assert "## Last training step (step 12)" in text
    assert "| kl | 0.012 |" in text
    assert "extra_key" not in text
    assert "[config.yaml](config.yaml)" in text
    assert "Sample trajectories" not in text


def test_the_report_names_each_start_s_environment(tmp_path: Path) -> None:
    start = {
        "cpu": "Xeon", "cpu_capability": "AVX512", "cpus": 2, "torch_threads": 2, "gpu": None,
        "versions": {"torch": "2.13.0+cpu", "transformers": "5.24.0"}, "git_commit": "c63ae367894d8163",
        "packages_sha256": "25b699ffc226abcd",
    }  # fmt: skip
    gpu = {"name": "NVIDIA H200", "count": 1, "cuda": "12.8"}
    dirty = "c63ae367894d8163-dirty"  # edited code: said so in the line
    starts = [{"step": 0, **start}, {"step": 40, **start, "gpu": gpu, "git_commit": dirty}]
    (tmp_path / "environment.json").write_text(json.dumps(starts), encoding="utf-8")
    text = write_report(tmp_path, {"method": "search_r1"}).read_text(encoding="utf-8")
    assert (
        "- step 0: Xeon (AVX512, 2 CPUs, 2 threads), no GPU, torch 2.13.0+cpu, transformers 5.24.0, "
        "commit c63ae367894d, packages 25b699ffc226\n"
        "- step 40: Xeon (AVX512, 2 CPUs, 2 threads), GPU NVIDIA H200, torch 2.13.0+cpu, transformers "
        "5.24.0, commit c63ae367894d-dirty, packages 25b699ffc226\n"
    ) in text
    (tmp_path / "environment.json").write_text("{", encoding="utf-8")  # a broken file: said, not a crash
    assert "_environment.json is unreadable: " in write_report(tmp_path, {}).read_text(encoding="utf-8")


def test_write_report_shows_samples(tmp_path: Path) -> None:
    trajectories = [
        Trajectory(
            example_id=f"q{i}",
            prompt_ids=[1, 2, 3],
            segments=[
                Segment("policy", [4, 5], "<search>capital of France</search>", logprobs=[-0.1, -0.2]),
                Segment(
                    "env", [6], "\n<information>Doc 1: Paris is the capital.\nDoc 2: Lyon.</information>\n"
                ),
                Segment("policy", [7], "<answer>Paris</answer>", logprobs=[-0.3]),
            ],
            final_answer="Paris",
            finish_reason="answer",
            metadata={"reward": 1.0, "em": 1.0, "big": list(range(10))},
        )
        for i in range(5)
    ]
    write_trajectories(tmp_path / "samples.jsonl", trajectories)
    text = write_report(tmp_path, {}, n_samples=2).read_text(encoding="utf-8")
    assert "### Sample 1: `q0`" in text
    assert "### Sample 2: `q1`" in text
    assert "q2" not in text
    assert "- metadata: reward=1, em=1" in text
    assert "- final answer: Paris" in text
    block = "```text\n<search>capital of France</search>\n> <information>Doc 1: Paris is the capital.\n"
    block += "> Doc 2: Lyon.</information>\n<answer>Paris</answer>\n```"
    assert block in text


def test_write_report_without_metrics(tmp_path: Path) -> None:
    text = write_report(tmp_path, {}).read_text(encoding="utf-8")
    assert "_No summary._" in text
    assert "_No evaluations recorded._" in text
    assert "Last training step" not in text
    _assert_png(tmp_path / "curves.png")


def test_write_report_with_empty_metrics_file(tmp_path: Path) -> None:
    _write_metrics(tmp_path, [])
    text = write_report(tmp_path, {"em_before": 0.5}).read_text(encoding="utf-8")
    assert "| EM before | 50.0% |" in text
    assert "![curves](curves.png)" in text
