"""Training tensors from samples (``ragrl.rollout.sample.Sample``, or a linear ``Trajectory``, which has
the same fields): tokens in, tokens out (never re-tokenized).

A row is ``prompt_ids + completion_ids`` right-padded. Log-probs are computed from column ``start`` =
the shortest prompt of the batch (``token_logprobs(..., start=start)``), so the prompt positions of
the longest prompts are scored but masked out. ``loss_mask[b, j]`` is 1 iff the token at position
``start + j`` of row ``b`` is a policy token (environment tokens such as retrieved passages, prompt
tokens and padding are 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ragrl.llm.logprobs import pad_batch


class Sequenceable(Protocol):
    """What a row of a training batch is made of: a ``Sample`` or a linear ``Trajectory``."""

    example_id: str
    prompt_ids: list[int]

    @property
    def completion_ids(self) -> list[int]: ...
    @property
    def loss_mask(self) -> list[int]: ...
    @property
    def completion_logprobs(self) -> list[float]: ...


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
    trajectories: Sequence[Sequenceable], pad_id: int, device: torch.device | str = "cpu"
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


def advantage_tensor(samples: Sequence[Sequenceable], batch: SequenceBatch) -> torch.Tensor:
    """The advantages of ``samples`` (their ``advantage`` field) for the loss on ``batch``: ``[B]`` when
    every sample has one number, else ``[B, L - start]`` aligned with ``batch.loss_mask`` (a number is
    broadcast over its sample's tokens; a list has one value per completion token)."""
    values = [getattr(s, "advantage", None) for s in samples]
    if any(v is None for v in values):
        raise ValueError("every sample needs its advantage before the update")
    if all(isinstance(v, (int, float)) for v in values):
        return torch.tensor(values, dtype=torch.float32)
    out = torch.zeros(batch.loss_mask.shape, dtype=torch.float32)
    for b, (s, v) in enumerate(zip(samples, values, strict=True)):
        offset = len(s.prompt_ids) - batch.start
        n = len(s.completion_ids)
        if isinstance(v, (int, float)):
            out[b, offset : offset + n] = float(v)
        else:
            if len(v) != n:
                raise ValueError(
                    f"sample of {s.example_id!r}: {len(v)} per-token advantages for {n} completion tokens"
                )
            out[b, offset : offset + n] = torch.tensor(v, dtype=torch.float32)
    return out


def group_minibatches(group_ids: list[int], parts: int) -> list[list[int]]:
    """Split row indices ``0..len(group_ids)-1`` into ``parts`` minibatches of whole groups (in group
    order; a minibatch may be empty on a process whose groups were all filtered out)."""
    order = list(dict.fromkeys(group_ids))
    per = math.ceil(len(order) / parts) if order else 0
    out = []
    for p in range(parts):
        chosen = set(order[p * per : (p + 1) * per])
        out.append([i for i, gid in enumerate(group_ids) if gid in chosen])
    return out


def chunks(items: list[int], size: int) -> list[list[int]]:
    """``items`` in consecutive pieces of ``size`` (one piece when ``size`` is 0)."""
    if not items:
        return []
    size = size or len(items)
    return [items[i : i + size] for i in range(0, len(items), size)]
