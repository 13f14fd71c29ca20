"""Rollout settings under which GRPO can never learn, refused before any model is loaded."""

from __future__ import annotations

from ragrl.config import Method
from ragrl.errors import RagrlError


def check_learnable(method: Method) -> None:
    """Refuse rollout settings under which GRPO can never learn: a group of one rollout, or greedy
    sampling (every rollout of a group the same), give every advantage 0 under every group estimator.
    Only for the linear rollout with episode rewards: a step-wise or custom rollout (its own groups) or
    per-step rewards (return-to-go differs between the turns of one episode) can learn either way."""
    r = method.rollout
    if r.greedy_samples and method.train.grpo.tis_cap:
        raise RagrlError(
            "rollout.greedy_samples with train.grpo.tis_cap: a greedy token has no sampling probability to "
            "weight by (set tis_cap to 0 or greedy_samples to 0)"
        )
    if r.greedy_samples and method.train.grpo.old_logprobs == "rollout":
        raise RagrlError(
            "rollout.greedy_samples with train.grpo.old_logprobs: rollout: a greedy episode's log-probs "
            "are not those of the sampling temperature, so the importance ratio would be wrong; use auto"
        )
    if r.kind != "multi_turn" or method.reward.per_step:
        return
    if r.greedy_samples >= r.n:
        raise RagrlError(
            f"rollout.greedy_samples = {r.greedy_samples} with rollout.n = {r.n}: every episode of a group "
            "would be greedy and the same, so every advantage is 0; keep greedy_samples below n"
        )
    if r.n < 2:
        raise RagrlError(
            f"rollout.n = {r.n}: GRPO compares the rollouts of a group, and a group of one has advantage 0 "
            "at every step; set rollout.n >= 2"
        )
    if r.temperature <= 0:
        raise RagrlError(
            f"rollout.temperature = {r.temperature}: greedy sampling makes every rollout of a group the "
            "same, so every advantage is 0; sample (for example rollout.temperature=1.0)"
        )
