"""What makes a run resumable: the prompt sampler's position and the checkpoint folder.

A checkpoint ``<run>/checkpoints/step-000040/`` holds

* ``state/``: ``accelerator.save_state`` — model weights, optimizer, LR scheduler, the sampler, and the
  RNG streams (python, numpy, torch) of every process (under FSDP the model and optimizer are the
  sharded ``state/sharded/`` of ``torch.distributed.checkpoint``, under DeepSpeed its own
  ``state/deepspeed/``: ``ragrl.train.parallel``);
* ``trainer_state.json``: the step, the wall time so far, and the config fingerprint;
* ``policy/``: the model and tokenizer as ``save_pretrained`` writes them (``ragrl eval --model`` reads
  it), on the main process.

Resuming loads all of it, so the run continues exactly as if it had not stopped: the sampler gives the
same prompts, the rollout seeds are a function of (seed, step), and the RNG streams are restored.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ragrl.errors import RagrlError

CHECKPOINTS = "checkpoints"


class PromptSampler:
    """Shuffled passes over ``n`` training examples: each epoch is a fresh permutation drawn from
    ``(seed, epoch)``; ``take(k)`` returns the next ``k`` indices (crossing into the next epoch when one
    runs out). Its state is two integers, saved with every checkpoint."""

    def __init__(self, n: int, seed: int) -> None:
        if n < 1:
            raise RagrlError("the training set is empty")
        self.n = n
        self.seed = int(seed)
        self.epoch = 0
        self.position = 0

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def take(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            order = self._order(self.epoch)
            chunk = order[self.position : self.position + k - len(out)]
            out.extend(int(i) for i in chunk)
            self.position += len(chunk)
            if self.position >= self.n:
                self.epoch, self.position = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict[str, int]:
        return {"n": self.n, "seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if int(state["n"]) != self.n or int(state["seed"]) != self.seed:
            raise RagrlError(
                f"checkpoint sampler was for {state['n']} examples with seed {state['seed']}, "
                f"this run has {self.n} with seed {self.seed}: resume with the same data, seed and "
                "train.data.train_answerable_only"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step-{step:06d}"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run (those with ``trainer_state.json``), oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = re.fullmatch(r"step-(\d+)", p.name)  # a leftover "step-N.tmp" is a half-written checkpoint
        if m and p.is_dir() and (p / "trainer_state.json").is_file():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def resolve_checkpoint(resume: str | Path, run_dir: str | Path) -> Path:
    """``latest`` (the newest checkpoint of ``run_dir``), a checkpoint folder, or a run folder."""
    if str(resume) == "latest":
        found = list_checkpoints(run_dir)
        if not found:
            raise RagrlError(f"{run_dir}: no checkpoint to resume from")
        return found[-1]
    path = Path(resume)
    if (path / "trainer_state.json").is_file():
        return path
    found = list_checkpoints(path)
    if found:
        return found[-1]
    raise RagrlError(f"{path}: not a checkpoint (no trainer_state.json) and no checkpoints under it")


def read_trainer_state(ckpt: Path) -> dict[str, Any]:
    try:
        return json.loads((ckpt / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RagrlError(f"{ckpt}/trainer_state.json: unreadable ({e})") from None


def save_checkpoint(
    parallel: Any,
    run_dir: str | Path,
    step: int,
    trainer_state: dict[str, Any],
    *,
    model: Any,
    optimizer: Any,
    tokenizer: Any,
    keep: int = 2,
    extra: Any = None,
) -> Path:
    """Write a checkpoint (into a temporary folder renamed at the end, so a crash never leaves a half
    checkpoint that looks complete) and keep the ``keep`` newest ones. ``parallel``
    (``ragrl.train.parallel``) writes the training state and the policy; ``extra(folder)``, on the main
    process, writes a trainer's own files into the checkpoint before the rename."""
    accelerator = parallel.acc
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    parallel.save_state(tmp / "state", model, optimizer)
    parallel.export(model, tokenizer, tmp / "policy")
    if accelerator.is_main_process:
        (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2), encoding="utf-8")
        if extra is not None:
            extra(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        if keep > 0:
            for old in list_checkpoints(run_dir)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def export_policy(model: Any, tokenizer: Any, out: Path, state_dict: dict[str, Any] | None = None) -> Path:
    """``save_pretrained`` of the policy and its tokenizer (LoRA adapters are saved as adapters);
    ``state_dict``: the weights to write instead of the model's own (a sharded model's, gathered)."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True, state_dict=state_dict)
    tokenizer.save_pretrained(str(out))
    cfg_path = out / "tokenizer_config.json"
    if cfg_path.is_file():  # a generic fast tokenizer: name a class every transformers version loads
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        if cfg.get("tokenizer_class") == "TokenizersBackend":
            from ragrl.llm.tiny import portable_tokenizer_config

            portable_tokenizer_config(out)
    return out
