"""Retrieval rewards shared by every method: what the episode's searches found against the question's
gold evidence (``Example.supporting_ids``), read from the typed actions (``Trajectory.retrieved_ids``).

A process signal denser than the answer's: a group in which no rollout answers right still differs in
how much of the evidence each rollout found. A question without gold evidence scores 0 everywhere, so it
adds nothing to a group's advantages."""

from __future__ import annotations

from ragrl.data.schema import Example
from ragrl.rewards.registry import RewardContext, register_reward
from ragrl.rollout.trajectory import Trajectory


@register_reward("support_recall")
def support_recall_reward(trajectory: Trajectory, example: Example, ctx: RewardContext) -> float:
    """The share of the question's supporting passages that some search of the episode retrieved."""
    gold = set(example.supporting_ids)
    if not gold:
        return 0.0
    return len(gold & set(trajectory.retrieved_ids)) / len(gold)
