"""TrainConfig.validate and the train: section of the packaged method configs."""

from __future__ import annotations

from typing import Any

import pytest

from ragrl.config.train import TrainConfig
from ragrl.errors import RagrlError
from ragrl.methods import load_method


def test_defaults_validate() -> None:
    TrainConfig().validate()


@pytest.mark.parametrize(
    "settings",
    [
        {"grpo.prompts_per_step": 16, "grpo.minibatches": 4, "grpo.ppo_epochs": 2},
        {"mixed_precision": "bf16", "optim.schedule": "cosine", "grpo.old_logprobs": "rollout"},
        {"mixed_precision": "bf16", "cpu_mixed_precision": True},
        {"mixed_precision": "fp16", "optim.schedule": "linear", "grpo.old_logprobs": "recompute"},
        {"steps": 1, "grpo.prompts_per_step": 1, "sft.batch_size": 1},
    ],
)
def test_valid_settings(settings: dict[str, Any]) -> None:
    _set(TrainConfig(), settings).validate()


def _set(cfg: TrainConfig, settings: dict[str, Any]) -> TrainConfig:
    for dotted, value in settings.items():
        *parents, leaf = dotted.split(".")
        obj: Any = cfg
        for p in parents:
            obj = getattr(obj, p)
        setattr(obj, leaf, value)
    return cfg


@pytest.mark.parametrize(
    "settings, field",
    [
        ({"steps": 0}, "train.steps"),
        ({"steps": -3}, "train.steps"),
        ({"grpo.prompts_per_step": 0}, "train.grpo.prompts_per_step"),
        ({"grpo.ppo_epochs": 0}, "train.grpo.ppo_epochs"),
        ({"grpo.minibatches": 0}, "train.grpo.minibatches"),  # not a ZeroDivisionError
        ({"sft.batch_size": 0}, "train.sft.batch_size"),
        ({"grpo.prompts_per_step": 16, "grpo.minibatches": 3}, "train.grpo.minibatches"),
        ({"grpo.old_logprobs": "x"}, "train.grpo.old_logprobs"),
        ({"mixed_precision": "fp8"}, "train.mixed_precision"),
        ({"mixed_precision": "fp16", "cpu_mixed_precision": True}, "train.cpu_mixed_precision"),
        ({"optim.schedule": "exp"}, "train.optim.schedule"),
    ],
)
def test_invalid_settings_name_the_field(settings: dict[str, Any], field: str) -> None:
    cfg = _set(TrainConfig(), settings)
    with pytest.raises(RagrlError) as e:
        cfg.validate()
    assert field in str(e.value)
    for value in settings.values():
        if isinstance(value, str):
            assert repr(value) in str(e.value)  # the bad value is shown


def test_packaged_tiny_config() -> None:
    m = load_method("search_r1-tiny")
    train = m.train
    assert isinstance(train, TrainConfig)
    train.validate()
    assert train.grpo.prompts_per_step == 16
    assert train.grpo.group_filter == "drop_zero_variance"
    assert train.optim.lr == pytest.approx(2e-4)
    assert train.optim.warmup_steps == 5
    assert train.steps == 40
    assert m.rollout.n == 8
    assert m.rollout.temperature == 0.5


def test_overrides_reach_the_train_config() -> None:
    m = load_method("search_r1-tiny", ["train.optim.lr=1e-5", "train.grpo.ppo_epochs=2", "rollout.n=4"])
    assert m.train.optim.lr == pytest.approx(1e-5)
    assert isinstance(m.train.optim.lr, float)
    assert m.train.grpo.ppo_epochs == 2
    assert m.rollout.n == 4
    # loading checks keys, types and values (validate() runs inside load_method)
    with pytest.raises(RagrlError, match="train.grpo.minibatches"):
        load_method("search_r1-tiny", ["train.grpo.minibatches=3"])


@pytest.mark.parametrize(
    "override, key, name",
    [
        ("train.grpo.advantage=grpoo", "train.grpo.advantage", "advantage 'grpoo'"),
        ("train.grpo.kl=k4", "train.grpo.kl", "KL estimator 'k4'"),
        ("train.grpo.loss_agg=tokenmean", "train.grpo.loss_agg", "aggregation 'tokenmean'"),
        ("train.grpo.group_filter=drop_zero", "train.grpo.group_filter", "group filter 'drop_zero'"),
        ("train.grpo.pg_loss=gspo", "train.grpo.pg_loss", "policy loss 'gspo'"),
    ],
)
def test_a_misspelt_registry_name_fails_when_the_config_loads(override, key, name) -> None:
    """Before any model is loaded, with the key, the bad name and the registered ones."""
    with pytest.raises(RagrlError, match=rf"{key}: unknown {name}; registered: .+"):
        load_method("search_r1-tiny", [override])


@pytest.mark.parametrize(
    "override", ["train.grpo.clip_low=-1", "train.grpo.clip_low=1.0", "train.grpo.clip_high=-0.1"]
)
def test_clip_ranges_that_cannot_clip_are_refused(override) -> None:
    with pytest.raises(RagrlError, match="train.grpo.clip_low must be in"):
        load_method("search_r1-tiny", [override])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.grpo.group_filter_params.lo=0.2"], r"group_filter_params: drop_zero_variance takes no 'lo' "
         r"\(it takes tol, keep_singletons\)"),
        (["train.grpo.advantage_params.std=sample", "train.grpo.advantage_params.stdev=1"],
         r"advantage_params: grpo takes no 'stdev' \(it takes std, eps\)"),
        (["train.grpo.kl=k3", "train.grpo.kl_params.clip=1"], r"kl_params: k3 takes no 'clip'"),
    ],
)  # fmt: skip
def test_a_parameter_the_registered_function_does_not_take_fails_when_the_config_loads(
    overrides, message
) -> None:
    with pytest.raises(RagrlError, match=message):
        load_method("search_r1-tiny", overrides)


def test_a_method_estimators_parameters_are_checked_too() -> None:
    """TIRESRAG's estimator takes its parameters through advantage_terms: still checked at load."""
    with pytest.raises(RagrlError, match=r"tiresrag_advantage takes no 'lamda' \(it takes answer, .*lam,"):
        load_method("tiresrag-tiny", ["train.grpo.advantage_params.lamda=0.2"])
    reinforce = ["train.grpo.advantage_params.baseline=reinforce_pp"]
    with pytest.raises(RagrlError, match="reinforce_pp normalises the advantages over the update batch"):
        load_method("tiresrag-tiny", reinforce)
    load_method("tiresrag-tiny", [*reinforce, "train.grpo.whiten=token"])
    with pytest.raises(RagrlError, match="train.grpo.whiten must be one of none, sample, token"):
        load_method("search_r1-tiny", ["train.grpo.whiten=batch"])


def test_unknown_key_is_an_error_naming_it() -> None:
    with pytest.raises(RagrlError, match="train.grpo.nope"):
        load_method("search_r1-tiny", ["train.grpo.nope=1"])


def test_wrong_type_is_an_error_naming_the_key() -> None:
    with pytest.raises(RagrlError, match="train.steps"):
        load_method("search_r1-tiny", ["train.steps=abc"])


def test_unquoted_yaml_no_is_mixed_precision_no() -> None:
    """`mixed_precision: no` (or `--set train.mixed_precision=no`) reaches the dataclass as "False"."""
    method = load_method("search_r1-tiny", ["train.mixed_precision=no"])
    method.train.validate()
    assert method.train.mixed_precision == "no"
