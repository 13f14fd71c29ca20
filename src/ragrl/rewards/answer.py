"""Answer rewards shared by every method: the final answer against the gold answers, with any
normalization variant of ``ragrl.metrics``. A trajectory without a final answer scores 0."""

from __future__ import annotations

from ragrl.data.schema import Example
from ragrl.metrics.answer import cover_em, exact_match, f1, substring_acc
from ragrl.rewards.registry import RewardContext, register_reward
from ragrl.rollout.trajectory import Trajectory


@register_reward("em")
def em_reward(trajectory: Trajectory, example: Example, ctx: RewardContext, variant: str = "squad") -> float:
    """1.0 if the final answer exactly matches a gold answer after normalization, else 0.0."""
    if trajectory.final_answer is None:
        return 0.0
    return float(exact_match(trajectory.final_answer, example.answers, variant=variant))


@register_reward("f1")
def f1_reward(trajectory: Trajectory, example: Example, ctx: RewardContext, variant: str = "squad") -> float:
    """Token F1 of the final answer, maximised over gold answers."""
    if trajectory.final_answer is None:
        return 0.0
    return float(f1(trajectory.final_answer, example.answers, variant=variant)[0])


@register_reward("cover_em")
def cover_em_reward(
    trajectory: Trajectory, example: Example, ctx: RewardContext, variant: str = "squad"
) -> float:
    """1.0 if every token of some normalized gold answer occurs in the final answer."""
    if trajectory.final_answer is None:
        return 0.0
    return float(cover_em(trajectory.final_answer, example.answers, variant=variant))


@register_reward("substring")
def substring_reward(
    trajectory: Trajectory, example: Example, ctx: RewardContext, variant: str = "squad"
) -> float:
    """1.0 if a normalized gold answer is a substring of the normalized final answer (FlashRAG acc)."""
    if trajectory.final_answer is None:
        return 0.0
    return float(substring_acc(trajectory.final_answer, example.answers, variant=variant))


@register_reward("answered")
def answered_reward(trajectory: Trajectory, example: Example, ctx: RewardContext) -> float:
    """1.0 if the episode ended with an answer (a diagnostic more than a training signal)."""
    return float(trajectory.final_answer is not None)
