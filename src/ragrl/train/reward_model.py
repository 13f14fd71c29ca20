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
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object
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
    encoder: Any, sequences: Sequence[Sequence[int]], pad_id: int, *, batch_size: int = 16, passes: int = 0
) -> torch.Tensor:
    """``[N, hidden]`` embeddings of token sequences by a frozen causal LM: the final hidden state of
    each sequence's last token (right padding, so padding never reaches a real token). ``passes``: make
    at least that many forward passes, the ones past the sequences' on a padding token (a sharded
    encoder's forwards are collective: every process makes as many; ``embedding_passes``)."""
    if any(len(s) == 0 for s in sequences):
        raise RagrlError("embed_sequences: every sequence needs at least one token")
    if not sequences and not passes:
        raise RagrlError("embed_sequences: no sequences to embed")
    device = next(encoder.parameters()).device
    out, hidden_size = [], 0
    with torch.no_grad():
        for i in range(0, max(len(sequences), passes * batch_size), batch_size):
            chunk = [list(s) for s in sequences[i : i + batch_size]] or [[pad_id]]
            ids, mask = pad_batch(chunk, pad_id, "right")
            hidden = encoder(
                input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True
            ).hidden_states[-1]
            hidden_size = hidden.shape[-1]
            if i < len(sequences):
                last = torch.tensor([len(s) - 1 for s in chunk], device=device)
                out.append(hidden[torch.arange(len(chunk), device=device), last].float().cpu())
    return torch.cat(out) if out else torch.zeros(0, hidden_size)


def embedding_passes(n_sequences: int, batch_size: int = 16) -> int:
    """The forward passes ``embed_sequences`` makes for ``n_sequences``."""
    return math.ceil(n_sequences / batch_size)


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
    """Fits the heads of a ``MultiHeadRewardModel`` on cached embeddings of preference pairs.

    With ``acc`` on several processes, each process passes its own share of the pairs: the rows are
    every process's pairs in process order, the same split and the same shuffled mini-batches on every
    process; a process embeds and scores its own rows only, and the heads' gradients and every logged
    sum are added over processes, so each process holds the same heads as one process trained on all
    the pairs (nothing but the sums travel: no sequence and no embedding)."""

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
        acc: Any = None,
        lockstep: bool = False,
    ) -> None:
        """``model`` / ``optimizer``: go on training these heads (preference cycles train one epoch a
        cycle on new pairs); ``held_out``: the questions whose pairs validate (the id before ``#``), in
        place of a ``val_fraction`` split of these pairs; ``acc``: the run's processes (see the class
        docstring), ``lockstep`` when the encoder's forwards are collective (sharded)."""
        if not 0.0 <= config.val_fraction < 1.0:
            raise RagrlError(f"reward model: val_fraction must be in [0, 1), got {config.val_fraction}")
        self.config = config
        self.acc = acc if acc is not None and acc.num_processes > 1 else None
        unknown = sorted({h for p in pairs for h in p.signs} - set(config.heads))
        ids = [p.pair.id for p in pairs]
        found = gather_object([(ids, unknown)]) if self.acc is not None else [(ids, unknown)]
        unknown = sorted({h for _, heads in found for h in heads})  # every process raises, or none
        if unknown:
            raise RagrlError(f"reward model: pairs label heads {unknown} that are not among {config.heads}")
        shares = [share for share, _ in found]
        every = [i for share in shares for i in share]
        if not every:
            raise RagrlError("reward model: no pairs to train on")
        self.first = sum(len(share) for share in shares[: self.acc.process_index if self.acc else 0])
        """The first row of this process's pairs among every process's."""
        sequences = [s.prompt_ids + s.completion_ids for p in pairs for s in (p.pair.chosen, p.pair.rejected)]
        passes, self.padding_passes = 0, 0
        """The forward passes every process made that embedded nothing (under a lockstep engine)."""
        if self.acc is not None and lockstep:
            own = [embedding_passes(2 * len(share)) for share in shares]
            passes = max(own)
            self.padding_passes = sum(passes - n for n in own)
        elif not sequences:
            passes = 1  # nothing of its own: one pass for the embedding's size
        emb = embed_sequences(encoder, sequences, pad_id, passes=passes)
        self.chosen, self.rejected = emb[0::2], emb[1::2]
        self.signs = torch.tensor(
            [[float(p.signs.get(h, 1.0)) for h in config.heads] for p in pairs], dtype=torch.float32
        ).reshape(len(pairs), len(config.heads))
        if held_out is None:
            self.train_rows, self.val_rows = _split(every, config.val_fraction, config.seed)
        else:
            self.val_rows = [i for i, pid in enumerate(every) if pid.rsplit("#", 1)[0] in held_out]
            self.train_rows = [i for i, pid in enumerate(every) if pid.rsplit("#", 1)[0] not in held_out]
        if model is None:
            torch.manual_seed(config.seed)  # the same heads on every process
            model = MultiHeadRewardModel(emb.shape[1], config.heads, encoder=name)
        elif list(model.head_names) != list(config.heads):
            raise RagrlError(f"reward model: the heads {model.head_names} are not {config.heads}")
        self.model = model
        self.optimizer = optimizer or torch.optim.AdamW(
            self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay
        )
        self.history: list[dict[str, float]] = []

    def _mine(self, rows: list[int]) -> list[int]:
        """This process's rows among ``rows`` (every process's), as indices into its own pairs."""
        n = len(self.signs)
        return [r - self.first for r in rows if self.first <= r < self.first + n]

    def _sum(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` added over processes."""
        if self.acc is None:
            return values
        return self.acc.reduce(values.to(self.acc.device), reduction="sum").cpu()

    def evaluate(self, rows: list[int]) -> dict[str, float]:
        """Loss and accuracy over ``rows``; per head, and of the summed heads on the pair's own order
        (empty when no head has a label on these pairs)."""
        mine, k = self._mine(rows), len(self.config.heads)
        with torch.no_grad():
            c, r, s = self.model(self.chosen[mine]), self.model(self.rejected[mine]), self.signs[mine]
            used = s != 0
            margin = s * (c - r)
            sums = torch.cat(
                [
                    torch.stack(
                        [
                            used.sum().float(),
                            -F.logsigmoid(margin[used]).sum(),
                            (margin[used] > 0).sum().float(),
                            ((c.sum(1) - r.sum(1)) > 0).sum().float(),
                            torch.tensor(float(len(mine))),
                        ]
                    ),
                    used.sum(0).float(),
                    ((margin > 0) & used).sum(0).float(),
                ]
            ).double()
        sums = self._sum(sums).tolist()
        n = sums[0]
        if n == 0:
            return {}
        out = {"loss": sums[1] / n, "accuracy": sums[2] / n, "accuracy/sum": sums[3] / sums[4]}
        for j, head in enumerate(self.config.heads):
            if sums[5 + j]:
                out[f"accuracy/{head}"] = sums[5 + k + j] / sums[5 + j]
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
                mine = self._mine(order[i : i + cfg.batch_size])
                signs = self.signs[mine]
                n = int(self._sum(torch.tensor([float((signs != 0).sum())]))[0])
                if n == 0:  # no head has a label on these pairs: nothing to learn from them
                    continue
                # the mean over every process's labelled (pair, head): this process's sum / n
                margin = signs * (self.model(self.chosen[mine]) - self.model(self.rejected[mine]))
                loss_sum = -F.logsigmoid(margin[signs != 0]).sum()
                self.optimizer.zero_grad(set_to_none=True)
                (loss_sum / n).backward()
                if self.acc is not None:
                    for param in self.model.parameters():
                        param.grad = self._sum(param.grad)
                self.optimizer.step()
                total += float(self._sum(loss_sum.detach().double().reshape(1))[0])
                labelled += n
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
