"""Shared by the GRPO and SFT trainers: the accelerator, the policy, the optimizer and schedule, the
metrics log. Distribution, mixed precision and device placement are accelerate's; nothing here is a
re-implementation of them."""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ragrl.config.train import ModelConfig, OptimConfig, TrainConfig
from ragrl.errors import RagrlError


class TrainingDiverged(RagrlError):
    """The watchdog stopped the run: a loss or gradient was NaN or infinite."""


def process_state() -> Any:
    """accelerate's ``PartialState`` (which process this is, and how many there are) as the trainers'
    ``Accelerator`` will see it. The first state made fixes the layout for the whole run, and a bare
    ``PartialState()`` ignores ``ACCELERATE_USE_CPU``: made first under ``torchrun`` on CPU, it made every
    process a single-process run of its own that wrote the same run folder."""
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    return PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))


def make_accelerator(config: TrainConfig) -> Any:
    """An ``accelerate.Accelerator`` for the config; ``accelerate launch`` decides the processes."""
    from accelerate import Accelerator

    mp = config.mixed_precision
    if not torch.cuda.is_available():
        if not config.cpu_mixed_precision:
            mp = "no"  # the CPU path stays fp32
        # accelerate imports DeepSpeed where it is installed (unwrap_model), and DeepSpeed then warns
        # that it guessed the CPU; tell it instead
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    return Accelerator(mixed_precision=mp)


def load_policy(config: ModelConfig, device: torch.device) -> tuple[Any, Any]:
    """The trainable policy and its tokenizer from a local folder, with LoRA and gradient checkpointing
    applied as configured. A folder of LoRA adapters (an earlier LoRA run's ``policy/`` or ``best/``: a
    training stage's start) goes on training those adapters under ``train.model.lora``, whose settings
    must match them, and is merged into its base model for a run without LoRA."""
    from ragrl.llm.hf_backend import ADAPTER_CONFIG, _load, load_tokenizer, resolve_dtype

    if not config.path:
        raise RagrlError("train.model.path: no model given (a local model folder, e.g. `ragrl model tiny`)")
    path = Path(config.path)
    if not path.is_dir():
        raise RagrlError(f"train.model.path: {path} is not a local model folder")
    dtype = resolve_dtype(config.dtype, device)
    # absolute: a LoRA run's adapters record their base model's path, and a later stage loads it from there
    adapters = (path / ADAPTER_CONFIG).is_file()
    model = _load(path.resolve(), dtype, keep_adapter=config.lora is not None).to(device)
    tokenizer = load_tokenizer(path)
    if config.gradient_checkpointing:
        # transformers >= 5 renames it (the old name warns and will go in v6)
        enable = (
            getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        )
        enable()
        model.config.use_cache = False
    if config.lora is not None and adapters:
        _check_adapters(model, config.lora, path)
        if config.gradient_checkpointing:
            # the adapters were loaded before checkpointing was on: the frozen embeddings' outputs must
            # require grad, or a reentrant checkpoint (transformers 4.x) gives the adapters no gradient
            model.enable_input_require_grads()
    elif config.lora is not None:
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError:
            raise RagrlError("train.model.lora needs peft: pip install 'ragrl[lora]'") from None
        lora = config.lora
        model = get_peft_model(
            model,
            LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=list(lora.target_modules),
                task_type="CAUSAL_LM",
            ),
        )
    model.train()
    return model, tokenizer


def _check_adapters(model: Any, lora: Any, path: Path) -> None:
    """Adapters loaded to train on must be the ones ``train.model.lora`` describes."""
    saved = model.peft_config["default"]
    found = _lora_settings(saved.r, saved.lora_alpha, saved.lora_dropout, saved.target_modules)
    wanted = _lora_settings(lora.r, lora.alpha, lora.dropout, lora.target_modules)
    if found != wanted:
        raise RagrlError(
            f"train.model.path: {path} holds LoRA adapters with {found}, but train.model.lora asks for "
            f"{wanted}; set train.model.lora to match them"
        )


def _lora_settings(r: int, alpha: float, dropout: float, targets: Any) -> dict[str, Any]:
    return {"r": r, "alpha": alpha, "dropout": dropout, "target_modules": sorted(targets)}


def make_optimizer(model: Any, config: OptimConfig, total_steps: int) -> tuple[Any, Any]:
    """AdamW over the trainable parameters and a transformers LR schedule with linear warmup."""
    from transformers import get_scheduler

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise RagrlError("the model has no trainable parameters")
    optimizer = torch.optim.AdamW(
        params, lr=config.lr, betas=tuple(config.betas), eps=config.eps, weight_decay=config.weight_decay
    )
    name = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}[config.schedule]
    extra: dict[str, Any] = {}
    if config.min_lr_ratio:  # cosine to a floor (validated: cosine only)
        name, extra = (
            "cosine_with_min_lr",
            {"scheduler_specific_kwargs": {"min_lr_rate": config.min_lr_ratio}},
        )
    scheduler = get_scheduler(
        name, optimizer, num_warmup_steps=config.warmup_steps, num_training_steps=max(total_steps, 1), **extra
    )
    return optimizer, scheduler


def peak_memory_mb() -> float:
    """Peak resident memory of this process (MiB), plus the CUDA peak when on a GPU."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    mb = rss / 1024 if sys.platform != "darwin" else rss / 2**20
    if torch.cuda.is_available():
        mb += torch.cuda.max_memory_allocated() / 2**20
    return round(mb, 1)


class MetricsLog:
    """``metrics.jsonl`` of a run: one JSON object per record (``kind``, ``step``, ``time`` + values),
    appended and flushed as it goes, written by the main process only."""

    def __init__(self, path: Path, *, enabled: bool = True, start_time: float = 0.0) -> None:
        self.path = path
        self.enabled = enabled
        self.t0 = time.perf_counter() - start_time
        self.last: dict[str, dict[str, Any]] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def truncate_after(self, step: int) -> None:
        """Drop records past ``step`` (what a resumed run will log again)."""
        if not self.enabled or not self.path.is_file():
            return
        keep = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line torn by the crash being resumed from
                continue
            if isinstance(record, dict) and record.get("step", 0) <= step:
                keep.append(line)
        self.path.write_text("".join(line + "\n" for line in keep), encoding="utf-8")

    def log(self, kind: str, step: int, values: dict[str, Any]) -> dict[str, Any]:
        record = {"kind": kind, "step": step, "time": round(self.elapsed(), 3)}
        record.update({k: _plain(v) for k, v in values.items()})
        self.last[kind] = record
        if self.enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        return record


def _plain(v: Any) -> Any:
    if isinstance(v, torch.Tensor | np.generic):
        v = v.item()
    if isinstance(v, float):
        return round(v, 6) if math.isfinite(v) else str(v)
    return v
