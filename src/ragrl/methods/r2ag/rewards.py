"""R²AG's reward, Eq. 5 (spec §3.2): gold hits of the steering step's queries, not answers.

    R = α·R_MH + β·R_JH + γ·R_AP + ω·R_f        (α, β, γ = 0.2, 0.3, 0.2; max ω·R_f = 0.02)

Each term is a registered reward component (``r2ag_multi_hit``, ``r2ag_joint_hit``, ``r2ag_ap``,
``r2ag_format``) weighted in the config, so every term is logged on its own. A trajectory's value is the
sum over its steering steps (a training sample is one step); the zeroing rules zero every term of a step.
Algorithm 1 writes R = R_MH + R_JH + R_AP without coefficients or R_f; Eq. 5 is implemented (§3.2).
Worked example (a test vector): g = {A, B}, round 1, base queries hitting A then noise, a predicted
query hitting B, no stop: 0.2·2.25 + 0.2·1.0 + 0.02 = 0.67; the next round (context {A, B}) that only
stops: 0.3 + 0.02 = 0.32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.methods.r2ag.protocol import BASE, PREDICTED, StepRecord, format_segments, prior_ids, step_records
from ragrl.rewards.registry import RewardContext, register_reward
from ragrl.rollout.trajectory import Trajectory


@dataclass(frozen=True)
class StepReward:
    """The terms of Eq. 5 for one step, before the coefficients (``zeroed`` names the rule that zeroed the
    total, if one did)."""

    multi_hit: float
    joint_hit: float
    ap: float
    format: float
    zeroed: str | None = None


def top_ap(hits: Sequence[str | None], gold: set[str], t: int) -> float:
    """Top-t/x AP: ``(1/|g|) Σ_{u≤t} precision@u · 1{r_u ∈ g}`` over the top-1 documents of the first
    ``t`` candidates in written order. A document need not be new to the tree, but within the list a
    gold document counts once, where it first appears (as in any AP: a repeat is not another relevant
    item), so repeating a query cannot raise R_AP past 1 (§8.2 item 5)."""
    total, found, seen = 0.0, 0, set()
    for u, doc in enumerate(hits[:t], start=1):
        if doc is not None and doc in gold and doc not in seen:
            seen.add(doc)
            found += 1
            total += found / u
    return total / len(gold)


def step_reward(
    step: StepRecord,
    prior: Sequence[str],
    gold: Sequence[str],
    *,
    pred_weight: float = 1.25,
    t_base: int = 4,
    t_pred: int = 2,
    per_tag: float = 0.01,
    format_cap: float = 0.02,
    format_count: int = 0,
) -> StepReward:
    """Eq. 5's terms for one step given the documents retrieved before it (``prior``) and the gold set.

    * R_MH = R_MH^b + ℓ·R_MH^p over *all* candidates: a candidate counts when its top-1 document is gold
      and new (not in ``prior``); a new gold document counts once, for the first candidate that hit it
      (base ones first), the text's "number of newly retrieved gold documents" (spec §8.2 item 5);
    * R_AP = R_AP^b (first ``t_base`` base candidates) + R_AP^p (first ``t_pred`` predicted ones);
    * R_JH = 1 when every gold document is in ``prior`` or this step's retrievals and the step stops;
    * R_f = ``per_tag`` per query-tag segment after ``<think>`` (``format_count``), capped;
    * the total is zeroed (every term 0) without ``<think>``, on a stop before all gold is retrieved, and
      on an output cut by the token budget."""
    g = set(gold)
    if not g:
        raise RagrlError("R²AG's reward needs the question's gold documents (supporting_ids)")
    after = set(prior) | set(step.retrieved)
    complete = g <= after
    zeroed = None
    if not step.think:
        zeroed = "no <think>"
    elif step.stop and not complete:
        zeroed = "premature stop"
    elif step.truncated:
        zeroed = "truncated"
    if zeroed is not None:
        return StepReward(0.0, 0.0, 0.0, 0.0, zeroed)
    seen = set(prior)
    counts = {BASE: 0, PREDICTED: 0}
    for tag, hits in ((BASE, step.base_hits), (PREDICTED, step.pred_hits)):
        for doc in hits:
            if doc is not None and doc in g and doc not in seen:
                seen.add(doc)
                counts[tag] += 1
    multi_hit = counts[BASE] + pred_weight * counts[PREDICTED]
    ap = top_ap(step.base_hits, g, t_base) + top_ap(step.pred_hits, g, t_pred)
    joint = float(complete and step.stop)
    fmt = min(per_tag * format_count, format_cap)
    return StepReward(multi_hit, joint, ap, fmt)


def trajectory_step_rewards(trajectory: Trajectory, example: Example, **params: Any) -> list[StepReward]:
    """Eq. 5's terms of every steering step of ``trajectory`` (the documents before step t: the state's
    context and everything steps < t retrieved)."""
    policy = [s for s in trajectory.segments if s.kind == "policy"]
    prior = prior_ids(trajectory, example)
    out = []
    for t, step in enumerate(step_records(trajectory)):
        count = format_segments(policy[t].text) if t < len(policy) else 0
        out.append(step_reward(step, prior, example.supporting_ids, format_count=count, **params))
        prior = [*prior, *step.retrieved]
    return out


def _summed(trajectory: Trajectory, example: Example, term: str, **params: Any) -> float:
    return math.fsum(getattr(r, term) for r in trajectory_step_rewards(trajectory, example, **params))


@register_reward("r2ag_multi_hit")
def multi_hit_reward(
    trajectory: Trajectory, example: Example, ctx: RewardContext, pred_weight: float = 1.25
) -> float:
    """R_MH (Multi-Hit@Top-1), summed over the trajectory's steps (a training sample has one)."""
    return _summed(trajectory, example, "multi_hit", pred_weight=pred_weight)


@register_reward("r2ag_joint_hit")
def joint_hit_reward(trajectory: Trajectory, example: Example, ctx: RewardContext) -> float:
    """R_JH (Joint-Hit@Top-1): all gold retrieved and the step stops."""
    return _summed(trajectory, example, "joint_hit")


@register_reward("r2ag_ap")
def ap_reward(
    trajectory: Trajectory, example: Example, ctx: RewardContext, t_base: int = 4, t_pred: int = 2
) -> float:
    """R_AP (Top-t/x AP) = R_AP^b + R_AP^p."""
    return _summed(trajectory, example, "ap", t_base=t_base, t_pred=t_pred)


@register_reward("r2ag_format")
def format_reward(
    trajectory: Trajectory, example: Example, ctx: RewardContext, per_tag: float = 0.01, cap: float = 0.02
) -> float:
    """ω·R_f: ``per_tag`` per query-tag segment after ``<think>``, at most ``cap`` a step."""
    return _summed(trajectory, example, "format", per_tag=per_tag, format_cap=cap)
