"""Training tensors from trajectories: tokens in, tokens out (never re-tokenized).

A row is ``prompt_ids + completion_ids`` right-padded. Log-probs are computed from column ``start`` =
the shortest prompt of the batch (``token_logprobs(..., start=start)``), so the prompt positions of
the longest prompts are scored but masked out. ``loss_mask[b, j]`` is 1 iff the token at position
``start + j`` of row ``b`` is a policy token (environment tokens such as retrieved passages, prompt
tokens and padding are 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ragrl.llm.logprobs import pad_batch
from ragrl.rollout.trajectory import Trajectory


@dataclass
class SequenceBatch:
    input_ids: torch.Tensor
    """[B, L] right-padded prompt + completion."""
    attention_mask: torch.Tensor
    """[B, L]."""
    start: int
    """First scored position (the shortest prompt length)."""
    loss_mask: torch.Tensor
    """[B, L - start] float: 1 on policy tokens."""
    rollout_logprobs: torch.Tensor
    """[B, L - start]: the log-probs the generation backend reported (0 off the policy tokens)."""
    old_logprobs: torch.Tensor | None = None
    """π_old, when the trainer computes it (None: π_θ detached)."""
    ref_logprobs: torch.Tensor | None = None
    """π_ref, when the loss has a KL term."""

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def sequence_batch(
    trajectories: Sequence[Trajectory], pad_id: int, device: torch.device | str = "cpu"
) -> SequenceBatch:
    if not trajectories:
        raise ValueError("sequence_batch needs at least one trajectory")
    for t in trajectories:
        if not t.prompt_ids:
            raise ValueError(f"trajectory of example {t.example_id!r} has an empty prompt")
    rows = [t.prompt_ids + t.completion_ids for t in trajectories]
    input_ids, attention_mask = pad_batch(rows, pad_id, "right")
    start = max(1, min(len(t.prompt_ids) for t in trajectories))
    width = input_ids.shape[1] - start
    loss_mask = torch.zeros((len(rows), width), dtype=torch.float32)
    logprobs = torch.zeros((len(rows), width), dtype=torch.float32)
    for b, t in enumerate(trajectories):
        offset = len(t.prompt_ids) - start
        mask = t.loss_mask
        if mask:
            loss_mask[b, offset : offset + len(mask)] = torch.tensor(mask, dtype=torch.float32)
            logprobs[b, offset : offset + len(mask)] = torch.tensor(
                t.completion_logprobs, dtype=torch.float32
            )
    return SequenceBatch(
        input_ids.to(device), attention_mask.to(device), start, loss_mask.to(device), logprobs.to(device)
    )
