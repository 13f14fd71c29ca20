"""A multi-head reward model: named linear heads on a frozen encoder, trained on preference pairs.

EVO-RAG (spec §3.3) scores a trajectory prefix (the state and a candidate action) with seven heads, one
per reward component, on a frozen LLM encoder, trained with the averaged pairwise logistic loss

    L = −(1/|pairs × heads|) Σ_{pair, head k with a label} log σ( s_k · (f_k(x⁺) − f_k(x⁻)) )

where ``s_k = +1`` when head k prefers the chosen response (the literal paper: every head takes the
order of the total return), ``−1`` when it prefers the rejected one, and 0 leaves head k out of that
pair (the per-component extension: head k ordered by its own component, with its own margin filter).
A single head named ``total`` is the single-head control.

The encoder is frozen, so a sequence is embedded once (``embed_sequences``: the final hidden state of
its last token, under ``no_grad``) and only the heads train, on the cached embeddings, which is fast on
a CPU. ``RewardModelTrainer`` holds out a share of the pairs for validation and reports loss and
preference accuracy (per head and of the summed heads) every epoch. ``MultiHeadRewardModel.save`` /
``load`` keep the heads with their names and the encoder they belong to.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ragrl.data.io import iter_jsonl
from ragrl.errors import DataError, RagrlError
from ragrl.llm.logprobs import pad_batch
from ragrl.rollout.sample import PreferencePair
from ragrl.train.dpo import pair_from_record

HEADS_FILE = "heads.safetensors"
INFO_FILE = "reward_model.json"


class MultiHeadRewardModel(nn.Module):
    """``K`` named linear heads over a ``dim``-sized embedding: ``forward(e [N, dim]) -> [N, K]``."""

    def __init__(self, dim: int, head_names: Sequence[str], encoder: str = "") -> None:
        super().__init__()
        names = list(head_names)
        if not names or len(set(names)) != len(names):
            raise RagrlError(f"reward model heads must be distinct names, got {names}")
        self.head_names, self.encoder = names, encoder
        self.heads = nn.Linear(dim, len(names))

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        return self.heads(embeddings)

    def scores(self, embeddings: torch.Tensor) -> list[dict[str, float]]:
        """Every head's score of every embedding, by name (no gradients)."""
        with torch.no_grad():
            out = self(embeddings)
        return [dict(zip(self.head_names, row.tolist(), strict=True)) for row in out]

    def save(self, out: str | Path) -> Path:
        from safetensors.torch import save_file

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous() for k, v in self.state_dict().items()}, str(out / HEADS_FILE))
        info = {"heads": self.head_names, "dim": self.heads.in_features, "encoder": self.encoder}
        (out / INFO_FILE).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
        return out

    @classmethod
    def load(cls, directory: str | Path) -> MultiHeadRewardModel:
        from safetensors.torch import load_file

        d = Path(directory)
        if not (d / INFO_FILE).is_file() or not (d / HEADS_FILE).is_file():
            raise RagrlError(f"{d}: not a reward model folder ({INFO_FILE} and {HEADS_FILE} expected)")
        info = json.loads((d / INFO_FILE).read_text(encoding="utf-8"))
        model = cls(int(info["dim"]), info["heads"], info.get("encoder", ""))
        model.load_state_dict(load_file(str(d / HEADS_FILE)))
        return model


def embed_sequences(
    encoder: Any, sequences: Sequence[Sequence[int]], pad_id: int, *, batch_size: int = 16
) -> torch.Tensor:
    """``[N, hidden]`` embeddings of token sequences by a frozen causal LM: the final hidden state of
    each sequence's last token (right padding, so padding never reaches a real token)."""
    if not sequences or any(len(s) == 0 for s in sequences):
        raise RagrlError("embed_sequences: every sequence needs at least one token")
    device = next(encoder.parameters()).device
    out = []
    with torch.no_grad():
        for i in range(0, len(sequences), batch_size):
            chunk = [list(s) for s in sequences[i : i + batch_size]]
            ids, mask = pad_batch(chunk, pad_id, "right")
            hidden = encoder(
                input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True
            ).hidden_states[-1]
            last = torch.tensor([len(s) - 1 for s in chunk], device=device)
            out.append(hidden[torch.arange(len(chunk), device=device), last].float().cpu())
    return torch.cat(out)


@dataclass
class RewardPair:
    """A preference pair for the reward model, with each head's label: +1 (the chosen is better), −1
    (the rejected is), 0 (this head does not train on the pair)."""

    pair: PreferencePair
    signs: dict[str, float] = field(default_factory=dict)
    """Per head; a head missing here gets +1 (the pair's own order)."""


def read_reward_pairs(path: str | Path, tokenizer: Any) -> list[RewardPair]:
    """Reward-model pairs from jsonl: a DPO pair record (``ragrl.train.dpo``) with an optional
    ``"head_signs": {head: +1 | -1 | 0}``; errors name the file, line and field."""
    out = []
    for line, record in iter_jsonl(path):
        pair = pair_from_record(record, tokenizer, path, line)
        signs = record.get("head_signs", {})
        if not isinstance(signs, dict) or any(v not in (-1, 0, 1) for v in signs.values()):
            raise DataError("must map head names to -1, 0 or 1", path=path, line=line, field="head_signs")
        out.append(RewardPair(pair, {str(k): float(v) for k, v in signs.items()}))
    if not out:
        raise RagrlError(f"{path}: no preference pairs")
    return out


def pairwise_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, signs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The averaged pairwise logistic loss over every (pair, head) with a label, and the share of those
    the heads order correctly. ``chosen`` / ``rejected``: ``[N, K]`` head scores; ``signs``: ``[N, K]``
    in {+1, −1, 0}."""
    used = signs != 0
    if not bool(used.any()):
        raise RagrlError("reward model: no (pair, head) has a label")
    margin = signs * (chosen - rejected)
    loss = -F.logsigmoid(margin[used]).mean()
    accuracy = (margin[used] > 0).float().mean()
    return loss, accuracy


@dataclass
class RewardModelConfig:
    heads: list[str] = field(default_factory=lambda: ["total"])
    epochs: int = 20
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.0
    val_fraction: float = 0.1
    """Share of the pairs held out (by the pair's ``id`` prefix before ``#``, so the pairs of one
    question stay together) for validation."""
    seed: int = 0


class RewardModelTrainer:
    """Fits the heads of a ``MultiHeadRewardModel`` on cached embeddings of preference pairs."""

    def __init__(
        self,
        encoder: Any,
        pad_id: int,
        pairs: Sequence[RewardPair],
        config: RewardModelConfig,
        *,
        name: str = "",
        model: MultiHeadRewardModel | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        held_out: set[str] | None = None,
    ) -> None:
        """``model`` / ``optimizer``: go on training these heads (preference cycles train one epoch a
        cycle on new pairs); ``held_out``: the questions whose pairs validate (the id before ``#``), in
        place of a ``val_fraction`` split of these pairs."""
        if not pairs:
            raise RagrlError("reward model: no pairs to train on")
        if not 0.0 <= config.val_fraction < 1.0:
            raise RagrlError(f"reward model: val_fraction must be in [0, 1), got {config.val_fraction}")
        self.config = config
        unknown = sorted({h for p in pairs for h in p.signs} - set(config.heads))
        if unknown:
            raise RagrlError(f"reward model: pairs label heads {unknown} that are not among {config.heads}")
        sequences = [s.prompt_ids + s.completion_ids for p in pairs for s in (p.pair.chosen, p.pair.rejected)]
        emb = embed_sequences(encoder, sequences, pad_id)
        self.chosen, self.rejected = emb[0::2], emb[1::2]
        self.signs = torch.tensor(
            [[float(p.signs.get(h, 1.0)) for h in config.heads] for p in pairs], dtype=torch.float32
        )
        ids = [p.pair.id for p in pairs]
        if held_out is None:
            self.train_rows, self.val_rows = _split(ids, config.val_fraction, config.seed)
        else:
            self.val_rows = [i for i, pid in enumerate(ids) if pid.rsplit("#", 1)[0] in held_out]
            self.train_rows = [i for i, pid in enumerate(ids) if pid.rsplit("#", 1)[0] not in held_out]
        if model is None:
            torch.manual_seed(config.seed)
            model = MultiHeadRewardModel(emb.shape[1], config.heads, encoder=name)
        elif list(model.head_names) != list(config.heads):
            raise RagrlError(f"reward model: the heads {model.head_names} are not {config.heads}")
        self.model = model
        self.optimizer = optimizer or torch.optim.AdamW(
            self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        self.history: list[dict[str, float]] = []

    def evaluate(self, rows: list[int]) -> dict[str, float]:
        """Loss and accuracy over ``rows``; per head, and of the summed heads on the pair's own order
        (empty when no head has a label on these pairs)."""
        if not bool((self.signs[rows] != 0).any()):
            return {}
        with torch.no_grad():
            c, r, s = self.model(self.chosen[rows]), self.model(self.rejected[rows]), self.signs[rows]
            loss, accuracy = pairwise_loss(c, r, s)
            out = {"loss": float(loss), "accuracy": float(accuracy)}
            out["accuracy/sum"] = float(((c.sum(1) - r.sum(1)) > 0).float().mean())
            for k, head in enumerate(self.config.heads):
                used = s[:, k] != 0
                if bool(used.any()):
                    out[f"accuracy/{head}"] = float(
                        ((s[:, k] * (c[:, k] - r[:, k]))[used] > 0).float().mean()
                    )
        return out

    def train(self) -> list[dict[str, float]]:
        """``epochs`` passes over the training pairs in shuffled mini-batches; one record per epoch with
        the training loss and the validation loss and accuracy (when pairs are held out)."""
        cfg = self.config
        rng = random.Random(cfg.seed)
        for epoch in range(1, cfg.epochs + 1):
            order = list(self.train_rows)
            rng.shuffle(order)
            total, labelled = 0.0, 0
            for i in range(0, len(order), cfg.batch_size):
                rows = order[i : i + cfg.batch_size]
                n = int((self.signs[rows] != 0).sum())
                if n == 0:  # no head has a label on these pairs: nothing to learn from them
                    continue
                loss, _ = pairwise_loss(
                    self.model(self.chosen[rows]), self.model(self.rejected[rows]), self.signs[rows]
                )
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                total, labelled = total + float(loss.detach()) * n, labelled + n
            record: dict[str, float] = {"epoch": epoch}
            if labelled:  # every pair held out, or none with a label: no training loss to report
                record["train/loss"] = total / labelled
            if self.val_rows:
                record.update({f"val/{k}": v for k, v in self.evaluate(self.val_rows).items()})
            self.history.append(record)
        return self.history


def _split(ids: Sequence[str], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Train / validation rows, holding out whole questions (the id before ``#``)."""
    questions = sorted({i.rsplit("#", 1)[0] for i in ids})
    random.Random(seed).shuffle(questions)
    held = set(questions[: round(len(questions) * fraction)])
    train = [i for i, pid in enumerate(ids) if pid.rsplit("#", 1)[0] not in held]
    val = [i for i, pid in enumerate(ids) if pid.rsplit("#", 1)[0] in held]
    if not train:
        raise RagrlError("reward model: every pair was held out; lower val_fraction")
    return train, val
