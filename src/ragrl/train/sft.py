"""SFT warm start: maximise the log-likelihood of demonstration trajectories, on policy tokens only.

Demonstrations are ``Trajectory`` records (any trajectory jsonl, or the synthetic world's
demonstrators played through the method's protocol by ``demonstration_trajectories``); their
environment tokens (retrieved passages) are context, never targets. The loss is the token mean of
``-log π(token)`` over the policy tokens of the global batch. Checkpoints, logging, held-out
evaluation and resume are the same as GRPO's (``ragrl.train.base.Trainer``).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import torch

from ragrl.config import Method
from ragrl.config.train import TrainConfig
from ragrl.console import console
from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.llm.logprobs import token_logprobs
from ragrl.rollout.sample import Sample
from ragrl.rollout.scripted import DemonstratorBackend
from ragrl.rollout.trajectory import Segment, Trajectory
from ragrl.train.augment import NameSwap
from ragrl.train.base import Trainer
from ragrl.train.batch import sequence_batch


def demonstration_trajectories(
    method: Method, tokenizer: Any, demonstrator: Any, examples: Sequence[Example], retriever: Any
) -> list[Trajectory]:
    """Play a demonstrator (``next_turn(example, history) -> text``) through the method's protocol and
    the real retriever, tokenized with the policy's tokenizer: SFT data in the exact token layout the
    policy will see in its own rollouts. A method's demonstrator that plays its own rollout (R²AG's
    steering oracle, whose training samples are tree steps) has ``play(method, tokenizer, examples,
    retriever) -> trajectories``."""
    if hasattr(demonstrator, "play"):
        return list(demonstrator.play(method, tokenizer, list(examples), retriever))
    backend = DemonstratorBackend.for_examples(
        tokenizer, demonstrator, examples, method.protocol, retriever, method.rollout.k
    )
    return method.make_rollout(backend, retriever).run(list(examples), n=1, seed=0)


def last_turn_only(trajectory: Trajectory) -> Trajectory:
    """The demonstration with only its last policy turn learned (``train.sft.turns: last``): every
    earlier policy segment becomes context, an env segment with the same tokens, so the sequence the
    model sees is unchanged and only the loss mask shrinks."""
    last = max(i for i, s in enumerate(trajectory.segments) if s.kind == "policy")
    segments = [
        s if s.kind == "env" or i == last else Segment("env", list(s.token_ids), s.text)
        for i, s in enumerate(trajectory.segments)
    ]
    return replace(trajectory, segments=segments)


class SFTTrainer(Trainer):
    kind = "sft"

    def __init__(
        self, method: Method, config: TrainConfig, demonstrations: Sequence[Trajectory], **kwargs: Any
    ) -> None:
        super().__init__(method, config, **kwargs)
        self.demonstrations = [t for t in demonstrations if t.num_policy_tokens > 0]
        if not self.demonstrations:
            raise RagrlError("SFT: no demonstration has a policy token to learn from")
        world = self.acc.num_processes
        if config.sft.batch_size % world:
            raise RagrlError(
                f"train.sft.batch_size ({config.sft.batch_size}) must be a multiple of the number of "
                f"processes ({world})"
            )
        self.name_swap: NameSwap | None = None
        if config.sft.name_swap > 0:
            self.name_swap = NameSwap.for_run(config, self.tokenizer, "train.sft.name_swap")
        rollout = method.make_rollout(_NoGeneration(self.tokenizer), self.retriever)
        stepwise = getattr(rollout, "keeps_step_contexts", False)
        if config.sft.turns == "last":
            if stepwise:
                raise RagrlError(
                    "train.sft.turns: last needs whole-episode demonstrations; this method trains "
                    "each step on its own context (set train.sft.turns: all)"
                )
            # a demonstration cut short by a budget has no ending turn to learn: left out, and said so
            ended = [t for t in self.demonstrations if not t.truncated]
            if len(ended) < len(self.demonstrations) and self.acc.is_main_process:
                console.print(
                    f"train.sft.turns: last: {len(self.demonstrations) - len(ended)} of "
                    f"{len(self.demonstrations)} demonstrations were cut short by a budget (no ending "
                    "turn): left out"
                )
            if not ended:
                raise RagrlError("train.sft.turns: last: every demonstration was cut short by a budget")
            self.demonstrations = [last_turn_only(t) for t in ended]
        if stepwise:
            # a step-wise method trains every turn on the context it was generated after (after a
            # backtrack that is not the whole record): the rollout's own samples, each renamed on its own
            samples = rollout.samples(self.demonstrations)
            self.demonstrations = [x for x in samples if x.num_policy_tokens > 0]
        self._prepare(len(self.demonstrations), self.total_steps, lr=config.sft.lr)

    def _renamed(self, row: Trajectory | Sample, rng: random.Random) -> Trajectory | Sample:
        """A demonstration (a trajectory, or one turn's sample of a step-wise method) renamed."""
        return self.name_swap.sample(row, rng) if isinstance(row, Sample) else self.name_swap(row, rng)

    def out_of_time(self) -> bool:
        """``train.max_seconds`` bounds the run's GRPO (or DPO) trainer, not its SFT warm start, which
        ``train.sft.max_steps`` bounds: one config carries both."""
        return False

    @property
    def total_steps(self) -> int:
        s = self.config.sft
        per_epoch = math.ceil(len(self.demonstrations) / s.batch_size)
        return s.max_steps if s.max_steps else s.epochs * per_epoch

    def step(self) -> dict[str, Any]:
        cfg = self.config
        t0 = time.perf_counter()
        # this process's share of the global batch
        per_process = cfg.sft.batch_size // self.acc.num_processes
        first = self.acc.process_index * per_process
        indices = self.sampler.take(cfg.sft.batch_size)[first : first + per_process]
        rows = [self.demonstrations[i] for i in indices]
        if self.name_swap is not None:  # seeded by (seed, step, slot): a resumed run swaps the same way
            rngs = [random.Random(f"{cfg.seed}:{self.step_count}:{first + j}") for j in range(len(rows))]
            rows = [
                self._renamed(t, rng) if rng.random() < cfg.sft.name_swap else t
                for t, rng in zip(rows, rngs, strict=True)
            ]
        micro = cfg.grpo.micro_batch_size or len(rows)
        chunks = [rows[i : i + micro] for i in range(0, len(rows), micro)]
        batches = [sequence_batch(c, self.pad_id, self.acc.device) for c in chunks]
        global_tokens = self.global_sum(sum(b.num_tokens for b in batches))
        loss_sum = 0.0
        for k, b in enumerate(batches):
            with nullcontext() if k == len(batches) - 1 else self.parallel.no_sync(self.model):
                with self.acc.autocast():
                    logp = token_logprobs(
                        self.model, b.input_ids, b.attention_mask, start=b.start, mask=b.loss_mask
                    )
                # token mean over the global batch: this process's sum / global count, × N for DDP's mean
                loss = -(logp * b.loss_mask).sum() / max(global_tokens, 1) * self.acc.num_processes
                self.parallel.backward(loss)
            loss_sum += float(loss.detach())
        grad_norm = self.optimizer_step()
        self.step_count += 1
        local = torch.tensor([loss_sum], device=self.acc.device)
        loss_value = (
            float(self.acc.reduce(local, reduction="mean")) if self.acc.num_processes > 1 else loss_sum
        )
        return {
            "loss": loss_value,
            "tokens": int(global_tokens),
            "grad_norm": grad_norm,
            "lr": self.scheduler.get_last_lr()[0],
            "step_seconds": round(time.perf_counter() - t0, 3),
        }


class _NoGeneration:
    """The backend of a rollout used only to cut demonstrations into samples (it never generates)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def generate(self, prompts: Any, params: Any) -> Any:  # pragma: no cover - never called
        raise RagrlError("SFT cuts demonstrations into samples; it does not generate")
