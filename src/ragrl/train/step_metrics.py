"""What a GRPO step logs: its episodes' rows summarised into one ``metrics.jsonl`` record.

A row is one episode: its reward and reward components, its rollout statistics
(``ragrl.eval.runner.rollout_stats``: searches, answered, tokens ...), the method's per-episode
diagnostics, its group and whether one of its samples reached the update. ``summarize`` turns the rows
of every process (gathered by the caller) into the step's means, the group statistics (reward spread
within groups, the share of groups with no variance) and the weights of a scheduled reward.
``Averages`` keeps the update's per-micro-batch statistics (clip fractions, KL, entropy) as weighted
means, and ``reduce_dicts`` reduces one dict per process to one.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ragrl.algos import group_stats
from ragrl.config import Method
from ragrl.eval.runner import rollout_stats
from ragrl.rewards.registry import RewardResult
from ragrl.rollout.trajectory import Trajectory


def episode_rows(
    episodes: list[Trajectory],
    results: list[RewardResult],
    diagnostics: list[dict[str, float]],
    groups: list[int],
    kept: list[bool],
) -> list[dict[str, Any]]:
    """One row per episode (see the module's docstring)."""
    stats = rollout_stats(episodes)
    return [
        {
            "reward": r.total,
            **{f"reward/{k}": v for k, v in r.components.items()},
            **s,
            "diagnostics": d,
            "group": int(gid),
            "kept": bool(k),
        }
        for r, s, d, gid, k in zip(results, stats, diagnostics, groups, kept, strict=True)
    ]


def summarize(
    rows: list[dict[str, Any]], method: Method, results: list[RewardResult], lr: float
) -> dict[str, Any]:
    """The step's metrics over every process's ``rows``; ``results`` (this process's) give the weights
    and schedule factors in force when the method's reward is scheduled; ``lr`` is logged as is."""
    groups = group_stats(torch.tensor([r["reward"] for r in rows]), torch.tensor([r["group"] for r in rows]))
    out: dict[str, Any] = {"reward": mean_of(rows, "reward")}
    for key in method.reward.keys:
        out[f"reward/{key}"] = mean_of(rows, f"reward/{key}")
    if method.reward.scheduled and results:  # the weights in force at this step
        out.update({f"reward_weight/{k}": w for k, w in results[0].weights.items()})
        out.update({f"schedule/{label}": f for label, f in results[0].factors.items()})
    out.update(
        group_reward_std=groups["reward_std_in_group"],
        zero_variance_frac=groups["zero_variance_share"],
        kept_frac=mean_of(rows, "kept"),
        response_len=mean_of(rows, "policy_tokens"),
        searches=mean_of(rows, "searches"),
        repeated_searches=mean_of(rows, "repeated_searches"),
        answer_rate=mean_of(rows, "answered"),
        invalid_actions=mean_of(rows, "invalid_actions"),
        truncation_rate=mean_of(rows, "truncated"),
        lr=lr,
    )
    for key in dict.fromkeys(k for row in rows for k in row["diagnostics"]):
        values = [row["diagnostics"][key] for row in rows if key in row["diagnostics"]]
        out[key] = sum(values) / len(values)
    return out


class Averages:
    """Weighted means of per-micro-batch metrics."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}

    def add(self, name: str, value: float, weight: float) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + value * weight
        self.weights[name] = self.weights.get(name, 0.0) + weight

    def result(self) -> dict[str, float]:
        return {k: v / self.weights[k] if self.weights[k] else 0.0 for k, v in self.sums.items()}


def mean_of(rows: list[dict[str, Any]], key: str) -> float:
    """The mean of ``key`` over the rows that have it (0.0 when none has)."""
    values = [float(r[key]) for r in rows if key in r]
    return math.fsum(values) / len(values) if values else 0.0


def reduce_dicts(dicts: list[dict[str, float]]) -> dict[str, float]:
    """Per key: the min of ``*_min`` values, the max of ``*_max`` values, else the mean."""
    out = {}
    for k in sorted({k for d in dicts for k in d}):
        values = [d[k] for d in dicts if k in d]
        if k.endswith("_min"):
            out[k] = min(values)
        elif k.endswith("_max"):
            out[k] = max(values)
        else:
            out[k] = mean_of(dicts, k)
    return out
