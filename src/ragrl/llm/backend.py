"""The generation-backend protocol: batched token-id prompts in; token ids, per-token log-probs and a
finish reason out.

Everything above this layer (the rollout engine, demonstrators, evaluation) talks to a backend only
through ``GenerationBackend.generate``, so a transformers model on a CPU, vLLM on a GPU and a scripted
demonstrator are interchangeable.

Log-prob convention (it must match what training recomputes): for a sampled token, ``logprobs[i]`` is
``log_softmax(logits / T)[token]`` over the *full* vocabulary at temperature ``T``, i.e. before any
top-k / top-p truncation. Greedy decoding (``temperature == 0``) reports ``log_softmax(logits)``.
Sampling with ``top_k=0`` and ``top_p=1.0`` (the defaults) draws exactly from that distribution.

Stops: generation of a sequence ends at the first of (a) the tokenizer's EOS token (finish reason
``"eos"``), (b) a ``stop_token_ids`` token or the end of the token whose decoding makes the *generated*
text contain one of the ``stop`` strings (``"stop"``), (c) ``max_new_tokens`` (``"length"``). The
generated tokens are returned exactly as sampled, the stopping token included (nothing is cut or
re-tokenized), and ``stop`` names the string or token id that ended the sequence. The distinction
matters: a rollout ends the episode on ``"eos"`` but acts on the turn after ``"stop"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

FinishReason = Literal["eos", "stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 256
    temperature: float = 1.0
    """0 means greedy decoding."""
    top_p: float = 1.0
    top_k: int = 0
    """0 means no top-k truncation."""
    stop: tuple[str, ...] = ()
    """Stop strings, matched on the generated text only (never on the prompt)."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra stop tokens; the tokenizer's EOS always stops."""
    seed: int | None = None
    """Seeds the sampling of this call (same prompts + params + seed → same generations); prompt ``i``
    samples with seed ``seed + i``."""
    seeds: tuple[int, ...] | None = None
    """One seed per prompt (overrides ``seed``): a prompt then samples the same tokens whatever else is
    in the call or its position, which keeps rollouts identical when a batch is split across processes."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")

    def prompt_seed(self, i: int, base: int | None = None) -> int | None:
        """The seed of prompt ``i``: ``seeds[i]``, else ``seed + i`` (``base + i`` when ``seed`` is None
        and a base is given), else None."""
        if self.seeds is not None:
            if i >= len(self.seeds):
                raise ValueError(f"seeds has {len(self.seeds)} entries, no seed for prompt {i}")
            return int(self.seeds[i])
        start = self.seed if self.seed is not None else base
        return None if start is None else int(start) + i


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    stop: str | int | None = None
    """The stop string or stop token id that ended the generation (None for "length")."""
    metadata: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class GenerationBackend(Protocol):
    """Anything that turns batches of token-id prompts into ``Generation``s."""

    tokenizer: Any
    """A Hugging Face tokenizer (``PreTrainedTokenizerBase``) for the model's vocabulary."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """One ``Generation`` per prompt, in order."""
        ...


def model_eos_ids(model_path: str, tokenizer: Any) -> frozenset[int]:
    """The tokenizer's EOS and the model's ``generation_config.json`` ones: what a serving engine such as
    vLLM stops on (its ``stop_reason`` ids for the latter, which ragrl reports as ``"eos"``, like
    ``TransformersBackend``)."""
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    try:
        from transformers import GenerationConfig

        extra = GenerationConfig.from_pretrained(model_path, local_files_only=True).eos_token_id
    except Exception:  # no generation_config.json: the tokenizer's EOS is all there is
        extra = None
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, list | tuple):
        ids.update(int(x) for x in extra)
    return frozenset(ids)
