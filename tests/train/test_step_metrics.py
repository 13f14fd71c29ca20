"""A GRPO step's logged metrics from its episodes' rows, and their reduction over processes."""

from __future__ import annotations

import pytest

from ragrl.methods import load_method
from ragrl.rewards.registry import RewardResult
from ragrl.train.step_metrics import Averages, mean_of, reduce_dicts, summarize


def _row(em: float, group: int, kept: bool, **extra: object) -> dict:
    # search_r1-tiny: the total is EM (the format component is logged with weight 0)
    base = {"reward": em, "reward/em": em, "reward/search_r1_format": 1.0, "searches": 2,
            "repeated_searches": 0, "answered": 1.0, "invalid_actions": 0, "truncated": 0.0,
            "policy_tokens": 10, "diagnostics": {}, "group": group, "kept": kept}  # fmt: skip
    return {**base, **extra}


def test_summarize_hand_computed() -> None:
    rows = [
        _row(1.0, 0, True, searches=3, diagnostics={"duplicate_queries": 0.5}),
        _row(0.0, 0, True, answered=0.0, truncated=1.0, policy_tokens=30, **{"reward/search_r1_format": 0.0}),
        _row(1.0, 1, False, invalid_actions=2, diagnostics={"duplicate_queries": 1.0}),
        _row(1.0, 1, False, repeated_searches=2),
    ]
    out = summarize(rows, load_method("search_r1-tiny"), results=[], lr=3e-4)
    assert out["reward"] == pytest.approx(0.75)
    assert out["reward/em"] == pytest.approx(0.75)
    assert out["reward/search_r1_format"] == pytest.approx(0.75)
    # group 0: rewards 1 and 0 (population std 0.5); group 1: 1 and 1 (std 0, no variance)
    assert out["group_reward_std"] == pytest.approx(0.25)
    assert out["zero_variance_frac"] == pytest.approx(0.5)
    assert out["kept_frac"] == pytest.approx(0.5)
    assert out["response_len"] == pytest.approx(15.0)
    assert out["searches"] == pytest.approx(2.25)
    assert out["repeated_searches"] == pytest.approx(0.5)
    assert out["answer_rate"] == pytest.approx(0.75)
    assert out["invalid_actions"] == pytest.approx(0.5)
    assert out["truncation_rate"] == pytest.approx(0.25)
    # a diagnostic is averaged over the episodes that report it, not diluted by the others
    assert out["duplicate_queries"] == pytest.approx(0.75)
    assert out["lr"] == 3e-4
    assert not any(k.startswith("reward_weight/") for k in out)  # the reward is not scheduled


def test_a_scheduled_reward_logs_the_weights_and_factors_in_force() -> None:
    method = load_method("tiresrag-tiny")
    assert method.reward.scheduled
    row = {"reward": 0.9, "diagnostics": {}, "group": 0, "kept": True}
    weights = {"tiresrag_answer": 1.0, "tiresrag_thinking": 0.4}
    results = [RewardResult(0.9, {"tiresrag_answer": 0.9}, weights=weights, factors={"a_t": 0.8})]
    out = summarize([row], method, results, lr=1e-4)
    assert out["reward_weight/tiresrag_answer"] == 1.0 and out["reward_weight/tiresrag_thinking"] == 0.4
    assert out["schedule/a_t"] == 0.8
    assert out["reward/tiresrag_thinking"] == 0.0  # a component no row reports averages to 0


def test_reduce_dicts_takes_min_max_and_means_by_name() -> None:
    dicts = [{"grad_norm": 1.0, "ratio_min": 0.5, "ratio_max": 2.0}, {"grad_norm": 3.0, "ratio_min": 0.25,
             "ratio_max": 1.5, "only_here": 7.0}]  # fmt: skip
    assert reduce_dicts(dicts) == {"grad_norm": 2.0, "only_here": 7.0, "ratio_max": 2.0, "ratio_min": 0.25}
    assert mean_of([{"a": 1}, {"b": 2}], "c") == 0.0


def test_averages_weight_each_value() -> None:
    stats = Averages()
    stats.add("entropy", 2.0, 10)
    stats.add("entropy", 1.0, 30)
    stats.add("kl", 5.0, 0)
    assert stats.result() == {"entropy": pytest.approx(1.25), "kl": 0.0}
