"""Staged training: a stage starts from the previous stage's final or best policy; a staged run
interrupted inside a stage, or between two, resumes to the same result as an uninterrupted one."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from ragrl.config import load_method_config
from ragrl.config.train_checks import EVAL_METRICS
from ragrl.errors import RagrlError
from ragrl.methods import load_method
from ragrl.train.stages import run_stages

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("grpo_run", HERE / "grpo_run.py")
_grpo_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_grpo_run)  # registers the distinct_tokens reward (an update every step)

VOLATILE = {"time", "step_seconds", "rollout_seconds", "logprob_seconds", "update_seconds"}


def _config(world: Path, tmp: Path, stages: list[dict], **train) -> Path:
    cfg = load_method_config(
        "search_r1-tiny",
        [
            f"train.model.path={world / 'model'}",
            "train.model.dtype=float32",  # bit-equal weights are compared (auto is bfloat16 on a GPU)
            f"train.data.train={world / 'train.jsonl'}",
            f"train.data.eval={world / 'dev.jsonl'}",
            "train.data.eval_limit=3",
            f"train.data.index={world / 'bm25'}",
            "train.grpo.prompts_per_step=2",
            "train.grpo.group_filter=keep_all",
            "train.optim.lr=1e-3",
            "train.optim.warmup_steps=0",
            "rollout.n=4",
            "rollout.max_turns=2",
            "rollout.max_new_tokens=12",
            "rollout.temperature=1.0",
        ],
    )
    cfg.reward = [{"name": "distinct_tokens", "weight": 1.0}]
    cfg.train.stages = stages
    for key, value in train.items():
        cfg.train[key] = value
    path = tmp / "staged.yaml"
    OmegaConf.save(cfg, path)
    return path


def _weights(policy: Path) -> dict[str, torch.Tensor]:
    return load_file(str(policy / "model.safetensors"))


def _records(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]


STAGES = [
    {"name": "warmup", "overrides": ["train.steps=2", "train.seed=1"]},
    {"name": "main", "overrides": ["train.steps=2"], "start_from": "previous"},
]


def test_the_next_stage_starts_from_the_previous_best_policy(world_dir, tmp_path):
    # eval/n is the same at every evaluation, and ties keep the earlier policy: the best policy of the
    # first stage is the one before it trained, which is not its final policy
    stages = [STAGES[0], {"name": "main", "overrides": ["train.steps=1"], "start_from": "previous_best"}]
    cfg = _config(world_dir, tmp_path, stages, best_metric="eval/n", eval_every=1)
    out = tmp_path / "run"
    method = load_method(cfg, [f"train.out={out}"])
    cfg.write_text("method: broken\n", encoding="utf-8")  # the config is read once, when it loads
    summaries = run_stages(method)
    assert [s["steps"] for s in summaries] == [2, 1]
    best = out / "stage-0-warmup" / "best"
    assert json.loads((best / "best.json").read_text()) == {"step": 0, "metric": "eval/n", "value": 3.0}
    start, final = _weights(world_dir / "model"), _weights(out / "stage-0-warmup" / "policy")
    assert all(torch.equal(start[k], v) for k, v in _weights(best).items())
    assert any(not torch.equal(start[k], v) for k, v in final.items())
    record = json.loads((out / "stages.json").read_text())["finished"]
    assert [r["name"] for r in record] == ["warmup", "main"] and record[1]["start"] == str(best)
    assert OmegaConf.load(out / "stage-1-main" / "config.yaml").train.model.path == str(best)


@pytest.mark.parametrize("stop", [(1, 1), (1, 0), (0, 1)])
def test_an_interrupted_staged_run_resumes_to_the_same_result(world_dir, tmp_path, stop):
    cfg = _config(world_dir, tmp_path, STAGES)
    full, part = tmp_path / "full", tmp_path / "part"
    run_stages(load_method(cfg, [f"train.out={full}"]))
    assert (
        len(run_stages(load_method(cfg, [f"train.out={part}"]), stop=stop)) == stop[0]
    )  # stopped inside stage stop[0]
    with pytest.raises(RagrlError, match="a staged run is already there"):
        run_stages(load_method(cfg, [f"train.out={part}"]))  # without resume: refused, nothing overwritten
    summaries = run_stages(load_method(cfg, [f"train.out={part}"]), resume=True)
    assert [s["steps"] for s in summaries] == [2, 2]
    for stage in ("stage-0-warmup", "stage-1-main"):
        expected, got = _weights(full / stage / "policy"), _weights(part / stage / "policy")
        assert all(torch.equal(expected[k], got[k]) for k in expected), stage
        assert _records(part / stage) == _records(full / stage), stage


def test_stage_configs_are_checked_when_the_config_loads():
    with pytest.raises(
        RagrlError, match="start from the previous best: set train.best_metric|starts from the"
    ):
        load_method("search_r1-tiny", ["train.stages=[{name: a}, {name: b, start_from: previous_best}]"])
    with pytest.raises(RagrlError, match="start_from must be previous"):
        load_method("search_r1-tiny", ["train.stages=[{name: a, start_from: best}]"])
    with pytest.raises(RagrlError, match="stage names must be distinct"):
        load_method("search_r1-tiny", ["train.stages=[{name: a}, {name: a}]"])
    with pytest.raises(RagrlError, match="not allowed in a stage"):
        load_method("search_r1-tiny", ["train.stages=[{name: a, overrides: ['train.out=x']}]"])
    with pytest.raises(RagrlError, match="train.best_metric names a held-out evaluation value"):
        load_method("search_r1-tiny", ["train.best_metric=em"])
    # a typo in a later stage's overrides fails when the config loads, before the first stage trains
    typo = "train.stages=[{name: a}, {name: b, overrides: ['train.grpo.advantage=grpoo']}]"
    with pytest.raises(RagrlError, match=r"train.stages\[1\] \(b\): train.grpo.advantage: unknown advantage"):
        load_method("search_r1-tiny", [typo])


def test_a_crashed_stage_restarts_clean_and_a_finished_one_is_not_evaluated_twice(world_dir, tmp_path):
    cfg = _config(world_dir, tmp_path, STAGES)
    full, part = tmp_path / "full", tmp_path / "part"
    run_stages(load_method(cfg, [f"train.out={full}"]))
    # a crash inside stage 1 before its first checkpoint: the stage restarts from scratch on resume
    run_stages(load_method(cfg, [f"train.out={part}"]), stop=(1, 1))
    shutil.rmtree(part / "stage-1-main" / "checkpoints")
    run_stages(load_method(cfg, [f"train.out={part}"]), resume=True)
    assert _records(part / "stage-1-main") == _records(full / "stage-1-main")
    # a crash after stage 1's final checkpoint but before stages.json recorded it: no second "after"
    state = json.loads((part / "stages.json").read_text())
    (part / "stages.json").write_text(json.dumps({"finished": state["finished"][:1]}))
    run_stages(load_method(cfg, [f"train.out={part}"]), resume=True)
    assert _records(part / "stage-1-main") == _records(full / "stage-1-main")
    evals = [r for r in _records(full / "stage-0-warmup") if r["kind"] == "eval"]
    keys = {k for k, v in evals[0].items() if k.startswith("eval/") and not isinstance(v, str)}
    assert {k for k in keys if not k.startswith("eval/method/")} == set(EVAL_METRICS)
    # the method's own diagnostics (Search-R1's) come as eval/method/<name>
    assert keys - set(EVAL_METRICS) == {"eval/method/valid_searches", "eval/method/response_len_with_info"}


LORA = "train.model.lora={r: 4, alpha: 8, dropout: 0.0}"


def _lora_weights(policy: Path) -> dict[str, torch.Tensor]:
    return load_file(str(policy / "adapter_model.safetensors"))


def test_lora_stages_train_one_set_of_adapters_on(world_dir, tmp_path):
    from ragrl.config.train import LoraConfig, ModelConfig
    from ragrl.llm.hf_backend import TransformersBackend
    from ragrl.train.setup import load_policy

    cfg = _config(world_dir, tmp_path, STAGES)
    out = tmp_path / "run"
    run_stages(load_method(cfg, [f"train.out={out}", LORA]))
    first, second = out / "stage-0-warmup" / "policy", out / "stage-1-main" / "policy"
    # each stage exports adapters only, on the base model (recorded as an absolute path)
    assert not (first / "model.safetensors").exists()
    adapter = json.loads((first / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str((world_dir / "model").resolve())
    # the second stage went on from the first one's adapters: it was started from them, B is no longer
    # at its zero init, and moved
    assert OmegaConf.load(out / "stage-1-main" / "config.yaml").train.model.path == str(first)
    a, b = _lora_weights(first), _lora_weights(second)
    lora_b = [k for k in a if "lora_B" in k]
    assert lora_b and all(a[k].abs().sum() > 0 for k in lora_b)
    assert any(not torch.equal(a[k], b[k]) for k in a)
    # a stage's start: the saved adapters, trainable, the base frozen; other LoRA settings are refused
    lora = LoraConfig(r=4, alpha=8, dropout=0.0)
    model, _ = load_policy(ModelConfig(path=str(first), lora=lora), torch.device("cpu"))
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    loaded = {k: v for k, v in model.state_dict().items() if "lora_B" in k}
    assert sum(float(v.abs().sum()) for v in loaded.values()) == pytest.approx(
        sum(float(a[k].abs().sum()) for k in lora_b), rel=1e-6
    )
    with pytest.raises(RagrlError, match="holds LoRA adapters with"):
        load_policy(ModelConfig(path=str(first), lora=LoraConfig(r=8)), torch.device("cpu"))
    # with gradient checkpointing the loaded adapters still get gradients
    checkpointed, _ = load_policy(
        ModelConfig(path=str(first), lora=lora, gradient_checkpointing=True), torch.device("cpu")
    )
    checkpointed(input_ids=torch.tensor([[1, 5, 9, 4, 7]])).logits.sum().backward()
    grads = [p.grad for n, p in checkpointed.named_parameters() if "lora_A" in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)
    # adapters that do not fit their base are an error naming the folder
    broken = tmp_path / "broken"
    shutil.copytree(first, broken)
    (broken / "adapter_model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(RagrlError, match=rf"{broken}: cannot load its LoRA adapters"):
        load_policy(ModelConfig(path=str(broken), lora=lora), torch.device("cpu"))
    # evaluation (and a run without LoRA) merges the adapters into the base: same logits, no peft left
    merged = TransformersBackend(second, device="cpu").model
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    peft_model, _ = load_policy(ModelConfig(path=str(second), lora=lora), torch.device("cpu"))
    ids = torch.tensor([[1, 5, 9, 4, 7]])
    with torch.no_grad():
        expected = peft_model.eval()(input_ids=ids).logits
        assert torch.allclose(merged(input_ids=ids).logits, expected, atol=1e-5)
        base = TransformersBackend(world_dir / "model", device="cpu").model
        assert not torch.allclose(base(input_ids=ids).logits, expected, atol=1e-5)
