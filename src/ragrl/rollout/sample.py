"""``Sample``: one training sequence, the unit the policy loss sees.

An episode is what a rollout plays; a sample is what training learns from. A linear multi-turn episode
(Search-R1, Eval-RAR, ARENA) is one sample: its prompt and everything after it, with the loss mask on
the policy's tokens. A method whose episode branches or acts step by step (a retrieval tree, an agent
that backtracks) makes one sample per step, with that step's context as the prompt, so context the
policy no longer sees is never trained on.

Each sample names its ``group``: the samples whose rewards are compared with each other for the
advantage (the G rollouts of one question; for a tree, the G expansions of one node). ``advantage`` is
a number for the whole response or one number per completion token; the trainer broadcasts a number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ragrl.rollout.trajectory import Trajectory


@dataclass
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    loss_mask: list[int]
    """1 on the policy's tokens of ``completion_ids``, 0 on observations."""
    completion_logprobs: list[float]
    """The log-probs the generation backend reported, aligned with ``completion_ids`` (0 off the mask)."""
    group: int
    """The advantage group (for a linear episode: the question's index in the step's batch)."""
    episode: int = 0
    """Index of the episode (in the rollout's returned list) this sample came from."""
    step: int = 0
    """The episode's step this sample trains (0 for a linear episode)."""
    example_id: str = ""
    advantage: float | list[float] | None = None
    """Set by the trainer: one number, or one per completion token."""
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.completion_ids)
        if len(self.loss_mask) != n or len(self.completion_logprobs) != n:
            raise ValueError(
                f"sample of {self.example_id!r}: completion ids ({n}), loss mask ({len(self.loss_mask)}) "
                f"and log-probs ({len(self.completion_logprobs)}) must have one entry per token"
            )

    @classmethod
    def from_trajectory(cls, trajectory: Trajectory, episode: int = 0) -> Sample:
        """The one sample of a linear episode: the whole completion, grouped by the question."""
        return cls(
            prompt_ids=list(trajectory.prompt_ids),
            completion_ids=trajectory.completion_ids,
            loss_mask=trajectory.loss_mask,
            completion_logprobs=trajectory.completion_logprobs,
            group=int(trajectory.metadata.get("group", 0)),
            episode=episode,
            example_id=trajectory.example_id,
        )

    @property
    def num_policy_tokens(self) -> int:
        return sum(self.loss_mask)


def return_to_go(total: float, steps: list[float] | None, sample: Sample) -> float:
    """The default reward of a sample: its episode's total, or with per-step rewards (``steps``, one per
    policy turn) the return from the sample's step on. A linear episode's one sample, at step 0, gets
    the whole return. A rollout whose samples are not turns (a tree's nodes) defines its own
    ``sample_reward(total, steps, sample)``."""
    if steps is None:
        return total
    if sample.step >= len(steps):
        raise ValueError(
            f"sample of {sample.example_id!r} is step {sample.step}, but its episode's reward has "
            f"{len(steps)} steps (a per-step component must score every policy turn)"
        )
    return math.fsum(steps[sample.step :])


@dataclass
class PreferencePair:
    """Two responses to the same prompt, one preferred (DPO's training record). EVO-RAG makes them from
    sibling candidates at a visited state; a file of them trains with ``ragrl dpo``."""

    chosen: Sample
    rejected: Sample
    margin: float = 0.0
    """How much better the chosen response scored (kept for filtering and logs)."""
    id: str = ""

    def __post_init__(self) -> None:
        if self.chosen.prompt_ids != self.rejected.prompt_ids:
            raise ValueError(
                f"preference pair {self.id!r}: the chosen and rejected responses need one prompt"
            )
        for side in (self.chosen, self.rejected):
            if not side.prompt_ids or not any(side.loss_mask):
                raise ValueError(f"preference pair {self.id!r}: each side needs a prompt and a trained token")
