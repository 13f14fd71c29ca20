"""make_optimizer (AdamW + warmup schedules), MetricsLog, and the small helpers of train.setup."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from ragrl.config.train import OptimConfig
from ragrl.errors import RagrlError
from ragrl.train.setup import MetricsLog, TrainingDiverged, make_optimizer, peak_memory_mb

pytest.importorskip("transformers")


def _lrs(schedule: str, warmup: int, total: int, steps: int) -> list[float]:
    """The learning rate after each of ``steps`` optimizer + scheduler steps (lr 1.0)."""
    model = torch.nn.Linear(2, 1)
    opt, sched = make_optimizer(model, OptimConfig(lr=1.0, warmup_steps=warmup, schedule=schedule), total)
    out = []
    for _ in range(steps):
        opt.step()
        sched.step()
        out.append(opt.param_groups[0]["lr"])
    return out


def test_constant_schedule_with_warmup() -> None:
    # transformers' linear warmup: lr * step / warmup, then flat
    assert _lrs("constant", warmup=4, total=10, steps=6) == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])


def test_warmup_starts_at_zero() -> None:
    model = torch.nn.Linear(2, 1)
    opt, _ = make_optimizer(model, OptimConfig(lr=1.0, warmup_steps=4), 10)
    assert opt.param_groups[0]["lr"] == 0.0  # the first update of a warmup runs at lr 0
    opt, _ = make_optimizer(model, OptimConfig(lr=0.5, warmup_steps=0), 10)
    assert opt.param_groups[0]["lr"] == 0.5


def test_linear_schedule_decays_to_zero() -> None:
    # warmup 2 of 6 steps: 1/2, 2/2, then (6 - k) / 4
    assert _lrs("linear", warmup=2, total=6, steps=7) == pytest.approx([0.5, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0])
    assert _lrs("linear", warmup=0, total=4, steps=4) == pytest.approx([0.75, 0.5, 0.25, 0.0])


def test_cosine_schedule() -> None:
    expected = [0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(1, 5)]  # .854, .5, .146, 0
    assert _lrs("cosine", warmup=0, total=4, steps=4) == pytest.approx(expected, abs=1e-9)


def test_optimizer_settings_and_trainable_parameters() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    model[0].requires_grad_(False)
    cfg = OptimConfig(lr=3e-4, weight_decay=0.1, betas=[0.8, 0.95], eps=1e-6)
    opt, _ = make_optimizer(model, cfg, total_steps=0)  # 0 total steps does not break the schedule
    assert isinstance(opt, torch.optim.AdamW)
    (group,) = opt.param_groups
    assert {id(p) for p in group["params"]} == {id(p) for p in model[1].parameters()}
    assert group["betas"] == (0.8, 0.95)
    assert group["eps"] == 1e-6 and group["weight_decay"] == 0.1 and group["lr"] == pytest.approx(3e-4)
    model.requires_grad_(False)
    with pytest.raises(RagrlError, match="no trainable parameters"):
        make_optimizer(model, cfg, 10)


# -- MetricsLog ---------------------------------------------------------------------------------------------


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_log_appends_json_records(tmp_path: Path) -> None:
    path = tmp_path / "run" / "metrics.jsonl"  # the parent is created on the first record
    log = MetricsLog(path)
    rec = log.log(
        "train",
        1,
        {
            "loss": 0.123456789,
            "nan": float("nan"),
            "inf": float("inf"),
            "ninf": float("-inf"),
            "tensor": torch.tensor(2.5),
            "tensor_nan": torch.tensor(float("nan")),
            "tokens": 512,
            "phase": "x",
        },
    )
    assert list(rec)[:3] == ["kind", "step", "time"]
    assert rec["kind"] == "train" and rec["step"] == 1
    assert isinstance(rec["time"], float) and 0.0 <= rec["time"] < 60
    assert rec["loss"] == 0.123457  # rounded to 6 digits
    assert rec["nan"] == "nan" and rec["inf"] == "inf" and rec["ninf"] == "-inf"
    assert rec["tensor"] == 2.5 and rec["tensor_nan"] == "nan"
    assert rec["tokens"] == 512 and rec["phase"] == "x"
    log.log("eval", 1, {"eval/em": 0.5})
    records = _read(path)  # strict JSON: no NaN / Infinity literals
    assert records[0] == rec
    assert [(r["kind"], r["step"]) for r in records] == [("train", 1), ("eval", 1)]
    assert log.last["train"] == rec and log.last["eval"]["eval/em"] == 0.5


def test_start_time_continues_the_clock(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "m.jsonl", start_time=100.0)
    assert 100.0 <= log.elapsed() < 160.0
    assert log.log("train", 5, {})["time"] >= 100.0


def test_truncate_after_drops_later_records(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    log.log("eval", 0, {"phase": "before"})
    for step in range(1, 6):
        log.log("train", step, {"loss": float(step)})
    log.log("eval", 4, {"phase": "periodic"})
    log.truncate_after(2)
    assert [(r["kind"], r["step"]) for r in _read(path)] == [("eval", 0), ("train", 1), ("train", 2)]
    log.log("train", 3, {"loss": 3.0})  # the resumed run appends after the kept records
    assert [r["step"] for r in _read(path)] == [0, 1, 2, 3]
    log.truncate_after(0)
    assert [(r["kind"], r["step"], r["phase"]) for r in _read(path)] == [("eval", 0, "before")]


def test_truncate_after_without_a_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    MetricsLog(path).truncate_after(3)
    assert not path.exists()


def test_disabled_log_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, enabled=False)
    rec = log.log("train", 1, {"loss": float("nan")})
    assert rec["loss"] == "nan" and log.last["train"] == rec  # still returned and remembered
    assert not path.exists()
    path.write_text('{"kind": "train", "step": 9}\n', encoding="utf-8")
    log.truncate_after(1)  # another process's file is left alone
    assert path.read_text(encoding="utf-8") == '{"kind": "train", "step": 9}\n'


def test_truncate_after_tolerates_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "train", "step": 1}\n{"kind": "tra', encoding="utf-8")
    MetricsLog(path).truncate_after(1)
    assert _read(path) == [{"kind": "train", "step": 1}]


# -- helpers ----------------------------------------------------------------------------------------


def test_peak_memory() -> None:
    mb = peak_memory_mb()
    assert isinstance(mb, float) and mb > 1.0
    assert mb == round(mb, 1)


def test_training_diverged_is_a_ragrl_error() -> None:
    assert issubclass(TrainingDiverged, RagrlError)  # the CLI prints it instead of a traceback


def test_cosine_to_a_floor() -> None:
    """TIRESRAG-R1's schedule: cosine from lr to 0.1·lr (no warmup here), the floor reached at the end."""
    model = torch.nn.Linear(2, 1)
    opt, sched = make_optimizer(model, OptimConfig(lr=1.0, schedule="cosine", min_lr_ratio=0.1), 4)
    lrs = []
    for _ in range(4):
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    want = [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(1, 5)]
    assert lrs == pytest.approx(want) and lrs[-1] == pytest.approx(0.1)


def test_a_floor_needs_cosine() -> None:
    from ragrl.methods import load_method

    with pytest.raises(RagrlError, match="min_lr_ratio must be in"):
        load_method("search_r1-tiny", ["train.optim.min_lr_ratio=0.1"])
    assert load_method("tiresrag").train.optim.min_lr_ratio == 0.1
