"""DPO: the policy learns to prefer the chosen response of each pair over the rejected one.

One step, top to bottom (``DPOTrainer.step``):

1. this process's share of the step's ``train.dpo.batch_size`` pairs;
2. the summed log-probs of every chosen and rejected response under the policy (one batch, the
   output head only on the responses' tokens; for IPO the per-token mean, as TRL does);
3. the same under the reference, without gradients: a frozen copy of the starting policy, or the base
   model with the adapters off under LoRA; none with ``reference_free``;
4. the preference loss (``ragrl.algos.preference.dpo_loss``: sigmoid, robust, hinge, ipo), averaged
   over the global batch; backward, gradient clipping, the optimizer and schedule steps, the watchdog.

Pairs are read from jsonl (``read_pairs``) in one of two forms per line:

* tokens: ``{"id", "prompt_ids": [...], "chosen": {"completion_ids": [...], "loss_mask": [...]?},
  "rejected": {...}, "margin"?}`` (what a rollout writes; ``loss_mask`` defaults to all ones);
* text: ``{"id", "prompt": "..." or [{"role", "content"}, ...], "chosen": "...", "rejected": "..."}``
  (TRL's format), encoded with the policy's tokenizer: the prompt with its chat template, each response
  as written followed by the end-of-sequence token.

Held-out evaluation, checkpoints, exact resume and the run folder are the shared trainer's.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from ragrl.algos.preference import dpo_loss
from ragrl.config import Method
from ragrl.config.train import TrainConfig
from ragrl.data.io import iter_jsonl
from ragrl.errors import DataError, RagrlError
from ragrl.llm.chat import encode_messages
from ragrl.llm.logprobs import token_logprobs
from ragrl.rollout.sample import PreferencePair, Sample
from ragrl.train.base import Trainer
from ragrl.train.batch import SequenceBatch, sequence_batch

SIDES = ("chosen", "rejected")


class DPOTrainer(Trainer):
    kind = "dpo"

    def __init__(
        self, method: Method, config: TrainConfig, pairs: Sequence[PreferencePair], **kwargs: Any
    ) -> None:
        super().__init__(method, config, **kwargs)
        if not pairs:
            raise RagrlError("DPO: no preference pairs to train on")
        self.pairs = list(pairs)
        if config.dpo.batch_size % self.acc.num_processes:
            raise RagrlError(
                f"train.dpo.batch_size ({config.dpo.batch_size}) must be a multiple of the number of "
                f"processes ({self.acc.num_processes})"
            )
        self._setup_reference()
        self._prepare(len(self.pairs), self.total_steps, lr=config.dpo.lr)
        if self.ref_model is not None:  # placed as the policy is (sharded too under FSDP and ZeRO-3)
            self.ref_model = self.parallel.prepare_frozen(self.ref_model)

    def _setup_reference(self) -> None:
        """The reference: a frozen copy of the starting policy, or none (under LoRA the base model with
        the adapters off; reference-free)."""
        d = self.config.dpo
        self.ref_model = None
        if not d.reference_free and self.config.model.lora is None:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)

    @property
    def total_steps(self) -> int:
        d = self.config.dpo
        return d.max_steps if d.max_steps else d.epochs * math.ceil(len(self.pairs) / d.batch_size)

    def step(self) -> dict[str, Any]:
        d = self.config.dpo
        t0 = time.perf_counter()

        # 1. this process's share of the global batch of pairs
        per_process = d.batch_size // self.acc.num_processes
        first = self.acc.process_index * per_process
        pairs = [self.pairs[i] for i in self.sampler.take(d.batch_size)[first : first + per_process]]
        out = self.preference_update(pairs, d.batch_size)
        self.step_count += 1
        return {**out, "step_seconds": round(time.perf_counter() - t0, 3)}

    def preference_update(
        self, pairs: Sequence[PreferencePair], global_batch: int, passes: int | None = None
    ) -> dict[str, Any]:
        """Steps 2-4 on this process's ``pairs`` of a global batch of ``global_batch`` pairs, in
        micro-batches of ``train.dpo.micro_batch_size`` pairs (gradient accumulation), then one optimizer
        update; the batch means of the loss, the implicit rewards and the log-probs. ``passes``: the
        micro-batch passes every process makes when the shares differ (under a lockstep engine, the
        largest share's count; the missing ones are padding passes that add nothing); by default this
        process's own count (equal shares)."""
        size = self.config.dpo.micro_batch_size or max(len(pairs), 1)
        pieces = [pairs[i : i + size] for i in range(0, len(pairs), size)]
        passes = len(pieces) if passes is None else passes
        parts = []
        for k in range(passes):  # gradients are synchronised on the last pass only
            with nullcontext() if k == passes - 1 else self.parallel.no_sync(self.model):
                if k < len(pieces):
                    parts.append(self._micro_batch(pieces[k], global_batch))
                else:
                    self.padding_pass(reference=not self.config.dpo.reference_free)
        grad_norm = self.optimizer_step()

        local = torch.stack(parts).sum(0) if parts else torch.zeros(7)
        if self.acc.num_processes > 1:
            local = self.acc.reduce(local.to(self.acc.device), reduction="sum")
        values = [float(v) / global_batch for v in local]
        return {
            "loss": values[0],
            "rewards/chosen": values[1],
            "rewards/rejected": values[2],
            "rewards/accuracy": values[3],
            "rewards/margin": values[4],
            "logps/chosen": values[5],
            "logps/rejected": values[6],
            "grad_norm": grad_norm,
            "lr": self.scheduler.get_last_lr()[0],
        }

    def _micro_batch(self, micro: Sequence[PreferencePair], global_batch: int) -> torch.Tensor:
        """Steps 2-4 on one micro-batch, its backward included; its sums of the logged values."""
        d = self.config.dpo
        rows = [p.chosen for p in micro] + [p.rejected for p in micro]
        batch = sequence_batch(rows, self.pad_id, self.acc.device)

        # 2. summed log-probs of every response under the policy: chosen rows first, then rejected
        chosen, rejected = self._summed_logprobs(self.model, batch).split(len(micro))

        # 3. the same under the reference, without gradients
        ref_chosen = ref_rejected = None
        if not d.reference_free:
            with torch.no_grad():
                ref_chosen, ref_rejected = self._reference_logprobs(batch).split(len(micro))

        # 4. the preference loss, a sum over the micro-batch / the global batch (× N to undo DDP's
        # gradient average); the gradients of the micro-batches add up to the batch mean's
        losses, chosen_rewards, rejected_rewards = dpo_loss(
            chosen,
            rejected,
            ref_chosen,
            ref_rejected,
            beta=d.beta,
            loss_type=d.loss_type,
            label_smoothing=d.label_smoothing,
            reference_free=d.reference_free,
        )
        self.parallel.backward(losses.sum() / global_batch * self.acc.num_processes)
        margins = chosen_rewards - rejected_rewards
        return torch.stack(
            [
                losses.detach().sum(),
                chosen_rewards.sum(),
                rejected_rewards.sum(),
                (margins > 0).float().sum(),
                margins.sum(),
                chosen.detach().sum(),
                rejected.detach().sum(),
            ]
        )

    def _summed_logprobs(self, model: Any, b: SequenceBatch) -> torch.Tensor:
        """Each response's log-prob: the sum over its tokens, or for IPO the mean (TRL normalises IPO's
        log-ratios by the completion length, as the IPO authors confirmed)."""
        with self.acc.autocast():
            logp = token_logprobs(model, b.input_ids, b.attention_mask, start=b.start, mask=b.loss_mask)
        summed = (logp * b.loss_mask).sum(dim=1)
        if self.config.dpo.loss_type == "ipo":
            return summed / b.loss_mask.sum(dim=1).clamp(min=1.0)
        return summed

    def _reference_logprobs(self, b: SequenceBatch) -> torch.Tensor:
        if self.ref_model is not None:
            return self._summed_logprobs(self.ref_model, b)
        with self.policy.disable_adapter():  # LoRA: the base model is the reference
            return self._summed_logprobs(self.model, b)


def read_pairs(path: str | Path, tokenizer: Any) -> list[PreferencePair]:
    """Preference pairs from jsonl (tokens or text form, see the module docstring); errors name the
    file, line and field."""
    pairs = [pair_from_record(record, tokenizer, path, line) for line, record in iter_jsonl(path)]
    if not pairs:
        raise RagrlError(f"{path}: no preference pairs")
    return pairs


def pair_from_record(record: Any, tokenizer: Any, path: str | Path, line: int) -> PreferencePair:
    """One pair from one parsed jsonl record (``path`` and ``line`` name it in errors)."""
    if not isinstance(record, dict):
        raise DataError("expected a JSON object", path=path, line=line)
    pair_id = str(record.get("id", f"line-{line}"))
    try:
        if "prompt_ids" in record:
            prompt = _ids(record["prompt_ids"], "prompt_ids")
            sides = [_side_from_ids(record.get(k), k, prompt, pair_id) for k in SIDES]
        elif "prompt" in record:
            prompt = _prompt_from_text(record["prompt"], tokenizer)
            sides = [_side_from_text(record.get(k), k, prompt, pair_id, tokenizer) for k in SIDES]
        else:
            raise _FieldError("prompt_ids", "missing (or 'prompt' for the text form)")
        margin = record.get("margin", 0.0)
        if not isinstance(margin, (int, float)) or isinstance(margin, bool):
            raise _FieldError("margin", "must be a number")
        return PreferencePair(sides[0], sides[1], float(margin), pair_id)
    except _FieldError as e:
        raise DataError(e.message, path=path, line=line, field=e.field) from None
    except ValueError as e:
        raise DataError(str(e), path=path, line=line) from None


class _FieldError(Exception):
    def __init__(self, field: str, message: str) -> None:
        self.field, self.message = field, message


def _ids(value: Any, field: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(t, int) and t >= 0 for t in value):
        raise _FieldError(field, "must be a non-empty list of token ids")
    return list(value)


def _side_from_ids(value: Any, key: str, prompt: list[int], pair_id: str) -> Sample:
    if not isinstance(value, dict):
        raise _FieldError(key, "missing, or not an object with completion_ids")
    ids = _ids(value.get("completion_ids"), f"{key}.completion_ids")
    mask = value.get("loss_mask", [1] * len(ids))
    if not isinstance(mask, list) or len(mask) != len(ids) or any(m not in (0, 1) for m in mask):
        raise _FieldError(f"{key}.loss_mask", "must be 0/1 values, one per completion token")
    return Sample(prompt, ids, list(mask), [0.0] * len(ids), group=0, example_id=pair_id)


def _prompt_from_text(value: Any, tokenizer: Any) -> list[int]:
    if isinstance(value, str) and value.strip():
        messages = [{"role": "user", "content": value}]
    elif isinstance(value, list) and value and all(isinstance(m, dict) and "content" in m for m in value):
        messages = value
    else:
        raise _FieldError("prompt", "must be a non-empty string or a list of {role, content} messages")
    return encode_messages(messages, tokenizer)


def _side_from_text(value: Any, key: str, prompt: list[int], pair_id: str, tokenizer: Any) -> Sample:
    if not isinstance(value, str) or not value.strip():
        raise _FieldError(key, "must be a non-empty string")
    ids = list(tokenizer.encode(value, add_special_tokens=False))
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return Sample(prompt, ids, [1] * len(ids), [0.0] * len(ids), group=0, example_id=pair_id)
