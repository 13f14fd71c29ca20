"""Copy (induction) pre-training: the stage ``ragrl.llm.tiny.create_tiny_policy`` can run on a model
built from scratch before it is saved (``ragrl model tiny --copy-steps N``)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from ragrl.errors import RagrlError


@dataclass
class CopyPretraining:
    """The copy (induction) pre-training stage of ``create_tiny_policy``: ``steps`` AdamW steps on
    sequences ``BOS w_1 … w_span w_1 … w_span`` of words drawn at random from the vocabulary, with the
    loss on the repeated half only. A model built from scratch knows no way to move a token from its
    context to its output; a few hundred steps of this teach it (copy accuracy near 1.0 after ~150
    steps at the default shape, ~35 s for 200 steps on 2 CPU cores), and every later stage that must
    copy a name, from a question into a query or from a passage into an answer, starts from there. The
    words are random, so no fact of any dataset is learned."""

    steps: int = 0
    batch_size: int = 32
    span: int = 20
    lr: float = 3e-3

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise RagrlError(f"copy pre-training steps must be >= 0, got {self.steps}")
        for name in ("batch_size", "span"):
            if getattr(self, name) < 1:
                raise RagrlError(f"copy pre-training {name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise RagrlError(f"copy pre-training lr must be > 0, got {self.lr}")


def copy_pretrain(model: Any, tokenizer: Any, config: CopyPretraining, *, seed: int = 0) -> dict[str, Any]:
    """Run the copy pre-training stage on ``model`` in place; returns what it measured (the last
    step's copy loss and greedy copy accuracy on the repeated half, the seconds it took)."""
    import torch

    from ragrl.console import progress_bar
    from ragrl.llm.logprobs import accepts_logits_to_keep

    skip = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    words = sorted(i for t, i in tokenizer.get_vocab().items() if i not in skip and t.strip().isalpha())
    if tokenizer.bos_token_id is None:
        raise RagrlError("copy pre-training needs a tokenizer with a BOS token")
    if 2 * config.span + 1 > model.config.max_position_embeddings:
        raise RagrlError(
            f"copy pre-training: sequences of 2 x span + 1 = {2 * config.span + 1} tokens exceed the "
            f"model's {model.config.max_position_embeddings} positions"
        )
    if len(words) < config.span:
        raise RagrlError(
            f"copy pre-training needs at least {config.span} word tokens, the vocabulary has {len(words)}"
        )
    rng = random.Random(f"ragrl-tiny-copy:{seed}")  # the only randomness: the caller's RNGs stay as they are
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    model.train()
    started = time.perf_counter()
    loss_value, accuracy = float("nan"), 0.0
    n = config.span
    # only the repeated half goes through the head where the model takes logits_to_keep (the head is
    # most of the cost)
    keep = {"logits_to_keep": n + 1} if accepts_logits_to_keep(model) else {}
    with progress_bar() as bar:
        task = bar.add_task("COPY", total=config.steps)
        for _ in range(config.steps):
            rows = []
            for _ in range(config.batch_size):
                span = [rng.choice(words) for _ in range(n)]
                rows.append([tokenizer.bos_token_id, *span, *span])
            ids = torch.tensor(rows)
            # predictions of the repeated half (positions n .. 2n - 1)
            logits = model(input_ids=ids, **keep).logits[:, -(n + 1) : -1]
            targets = ids[:, n + 1 :]
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            loss_value = float(loss.detach())
            accuracy = float((logits[:, 1:].argmax(-1) == targets[:, 1:]).float().mean())
            bar.update(task, advance=1, description=f"COPY loss {loss_value:.3f} acc {accuracy:.2f}")
    model.eval()
    return {
        "steps": config.steps,
        "batch_size": config.batch_size,
        "span": config.span,
        "lr": config.lr,
        "copy_loss": round(loss_value, 4),
        "copy_accuracy": round(accuracy, 4),
        "seconds": round(time.perf_counter() - started, 1),
    }
