"""Copy (induction) pre-training: the stage ``ragrl.llm.tiny.create_tiny_policy`` can run on a model
built from scratch before it is saved (``ragrl model tiny --copy-steps N``).

The task must force copying **by content**. An earlier version trained on ``BOS w_1 … w_n w_1 … w_n``
with a fixed ``n``: the model reached copy accuracy 1.0 in ~125 steps, but by attending to the token
exactly ``n`` positions back. That shortcut copies nothing in a real prompt (measured: 1.0 at the trained
distance, 0.03 at distance 40, 0.005 at 160), which is why reading never appeared downstream.

Here a sequence is ``BOS`` + a body of random words + spans of 2 to 8 words copied from random places of
the body, so the distance to the source varies from a few tokens to the whole sequence; the loss is on
every copied word after the first of its span (the first is unpredictable). Only an induction circuit
(find the earlier occurrence of the current word, emit the word that followed it) solves it.

Two phases:

1. short sequences (``short_length`` tokens, cheap) until the running copy accuracy reaches
   ``target_accuracy`` or ``steps`` steps have run. The circuit appears suddenly: loss sits near
   ``ln |V|`` for several hundred steps, then drops within ~100 (measured at the default shape: the
   jump around step 650, ~50 s on 2 cores);
2. once phase 1 reached its target (the circuit exists), ``long_steps`` steps on ``long_length``-token
   sequences, so the circuit works at the distances of a real prompt (measured on the demo's seeds
   0-2: copy accuracy 0.96-1.00 at distances 20 / 80 / 200 after the default 150 steps, against 0.80
   at 20 and 0.06 at 80 after phase 1 alone). Random bodies sometimes repeat a word, which makes a
   few targets ambiguous: accuracy just under 1.0 is the ceiling.

The words are random, so no fact of any dataset is learned.
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from ragrl.errors import RagrlError

MIN_SPAN, MAX_SPAN = 2, 8


@dataclass
class CopyPretraining:
    """The copy (induction) pre-training stage of ``create_tiny_policy`` (module docstring)."""

    steps: int = 0
    """At most this many phase-1 steps (0: no copy pre-training)."""
    batch_size: int = 32
    short_length: int = 32
    long_length: int = 256
    long_steps: int = 150
    """Phase-2 steps (batch ``batch_size // 2``), run when phase 1 reached ``target_accuracy``."""
    target_accuracy: float = 0.95
    """Phase 1 ends when the mean copy accuracy of the last ``window`` steps reaches this (0: after
    ``window`` steps)."""
    window: int = 10
    lr: float = 1e-3

    def __post_init__(self) -> None:
        for name in ("steps", "long_steps"):
            if getattr(self, name) < 0:
                raise RagrlError(f"copy pre-training {name} must be >= 0, got {getattr(self, name)}")
        for name in ("batch_size", "short_length", "long_length", "window"):
            if getattr(self, name) < 1:
                raise RagrlError(f"copy pre-training {name} must be >= 1, got {getattr(self, name)}")
        for name in ("short_length", "long_length"):
            if (value := getattr(self, name)) < (least := 2 * MAX_SPAN + 8):
                raise RagrlError(f"copy pre-training {name} must be >= {least} tokens, got {value}")
        if not 0 <= self.target_accuracy <= 1:
            raise RagrlError(
                f"copy pre-training target_accuracy must be in [0, 1], got {self.target_accuracy}"
            )
        if not self.lr > 0:
            raise RagrlError(f"copy pre-training lr must be > 0, got {self.lr}")


def induction_sequence(
    words: list[int], length: int, bos: int, rng: random.Random
) -> tuple[list[int], list[int]]:
    """One training sequence of ``length + 1`` tokens and its loss mask: ``BOS`` + a body of random
    ``words`` + spans copied from random places of the body; the mask is 1 on every copied token after
    the first of its span."""
    body_len = rng.randint(8, length - 2 * MAX_SPAN)
    body = [rng.choice(words) for _ in range(body_len)]
    ids, mask = [bos, *body], [0] * (body_len + 1)
    while len(ids) < length + 1:
        n = rng.randint(MIN_SPAN, MAX_SPAN)
        start = rng.randrange(0, body_len - n + 1)
        ids += body[start : start + n]
        mask += [0] + [1] * (n - 1)
    return ids[: length + 1], mask[: length + 1]


def copy_accuracy(
    model: Any, words: list[int], bos: int, *, distance: int, rows: int = 32, seed: int = 1
) -> float:
    """Greedy accuracy of copying a span of 6 random words whose source lies ``distance`` tokens back:
    ``BOS`` + ``distance`` random words + a span of 6 copied from their start (accuracy on words 2-6)."""
    import torch

    rng = random.Random(f"ragrl-copy-eval:{seed}:{distance}")
    seqs = []
    for _ in range(rows):
        body = [rng.choice(words) for _ in range(max(distance, 6))]
        seqs.append([bos, *body, *body[:6]])
    ids = torch.tensor(seqs)
    with torch.no_grad():
        pred = model(input_ids=ids).logits[:, -6:-1].argmax(-1)
    return float((pred == ids[:, -5:]).float().mean())


def copy_pretrain(model: Any, tokenizer: Any, config: CopyPretraining, *, seed: int = 0) -> dict[str, Any]:
    """Run the copy pre-training stage on ``model`` in place; returns what it measured (steps of each
    phase, the last copy loss and accuracy, held-out copy accuracy at distances 20 / 80 / 200, seconds)."""
    import torch

    from ragrl.console import console, progress_bar, styled

    skip = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    words = sorted(i for t, i in tokenizer.get_vocab().items() if i not in skip and t.strip().isalpha())
    bos = tokenizer.bos_token_id
    if bos is None:
        raise RagrlError("copy pre-training needs a tokenizer with a BOS token")
    if config.long_length + 1 > model.config.max_position_embeddings:
        raise RagrlError(
            f"copy pre-training: sequences of long_length + 1 = {config.long_length + 1} tokens exceed the "
            f"model's {model.config.max_position_embeddings} positions"
        )
    if len(words) < 2 * MAX_SPAN:
        raise RagrlError(
            f"copy pre-training needs at least {2 * MAX_SPAN} word tokens, the vocabulary has {len(words)}"
        )
    rng = random.Random(f"ragrl-tiny-copy:{seed}")  # the only randomness: the caller's RNGs stay as they are
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    model.train()
    started = time.perf_counter()
    loss_value, accuracy = float("nan"), 0.0
    recent: deque[float] = deque(maxlen=config.window)

    def step(length: int, batch_size: int) -> None:
        nonlocal loss_value, accuracy
        rows = [induction_sequence(words, length, bos, rng) for _ in range(batch_size)]
        ids = torch.tensor([r[0] for r in rows])
        mask = torch.tensor([r[1] for r in rows])[:, 1:].bool()
        logits = model(input_ids=ids).logits[:, :-1][mask]
        targets = ids[:, 1:][mask]
        loss = torch.nn.functional.cross_entropy(logits, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_value = float(loss.detach())
        accuracy = float((logits.argmax(-1) == targets).float().mean())
        recent.append(accuracy)

    short_steps, reached = 0, False
    with progress_bar() as bar:
        task = bar.add_task("COPY", total=config.steps + config.long_steps)
        while short_steps < config.steps:
            step(config.short_length, config.batch_size)
            short_steps += 1
            bar.update(task, advance=1, description=f"COPY loss {loss_value:.3f} acc {accuracy:.2f}")
            if len(recent) == recent.maxlen and sum(recent) / len(recent) >= config.target_accuracy:
                reached = True
                break
        long_steps = config.long_steps if reached else 0  # nothing to lengthen without the circuit
        bar.update(task, total=short_steps + long_steps)
        for _ in range(long_steps):
            step(config.long_length, max(1, config.batch_size // 2))
            bar.update(task, advance=1, description=f"COPY (long) loss {loss_value:.3f} acc {accuracy:.2f}")
    model.eval()
    if config.steps and not reached:
        console.print(
            styled(
                "warning:",
                "yellow",
                f"copy pre-training: accuracy {sum(recent) / max(len(recent), 1):.2f} after {short_steps} "
                f"steps did not reach {config.target_accuracy}: no induction circuit yet, long phase "
                "skipped (allow more steps)",
            )
        )
    held_out = {
        f"copy_accuracy@{d}": round(copy_accuracy(model, words, bos, distance=d), 4) for d in (20, 80, 200)
    }
    return {
        "steps": short_steps,
        "reached_target": reached,
        "long_steps": long_steps,
        "batch_size": config.batch_size,
        "short_length": config.short_length,
        "long_length": config.long_length,
        "lr": config.lr,
        "copy_loss": round(loss_value, 4),
        "copy_accuracy": round(accuracy, 4),
        **held_out,
        "seconds": round(time.perf_counter() - started, 1),
    }
