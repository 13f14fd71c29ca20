"""Per-token log-probs of given sequences under a causal LM: the function training uses to recompute
what a generation backend reported.

Alignment (the one thing to get right): for a batch ``input_ids`` of shape ``[B, L]``,

    token_logprobs(model, input_ids, attention_mask)[b, t]
        == log_softmax(logits(input_ids[b, : t + 1]) / T)[input_ids[b, t + 1]]

i.e. ``out[b, t]`` is the log-prob of the token at position ``t + 1`` given everything before it;
the output has ``L - 1`` columns (the first token has no prediction). With ``start=s`` only the
tokens from position ``s`` on are scored and ``out[b, j]`` is the log-prob of ``input_ids[b, s + j]``
(shape ``[B, L - s]``; ``start=None`` is ``start=1``). Positions whose target token is padding
(``attention_mask == 0``) are set to 0.

Position ids are derived from the attention mask (``cumsum(mask) - 1``), so a sequence gets the same
values whether it is left-padded (as for generation) or right-padded (as for training); the backends'
reported log-probs match this function (tests/llm/test_backends.py checks it within 1e-5).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import torch

__all__ = [
    "entropy_from_logits",
    "pad_batch",
    "position_ids_from_mask",
    "selective_log_softmax",
    "shifted_log_softmax",
    "token_logprobs",
]

_CHUNK_ELEMENTS = 1 << 24
"""Rows of logits taken at once by the chunked log-softmax: at most this many elements (a float32 chunk
is 64 MiB; two or three such chunks live at once: the upcast, the temperature's quotient, the result)."""


def pad_batch(
    seqs: Sequence[Sequence[int]],
    pad_id: int,
    side: Literal["left", "right"] = "left",
    *,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad token-id sequences to one ``[B, L]`` long tensor; returns ``(input_ids, attention_mask)``.

    ``side="left"`` puts the padding first (what generation wants: every row ends at the last
    column), ``side="right"`` puts it last (what training wants: every row starts at column 0).
    """
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    if len(seqs) == 0:
        raise ValueError("pad_batch needs at least one sequence")
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        n = len(s)
        if n == 0:
            continue
        row = torch.as_tensor(list(s), dtype=torch.long)
        if side == "left":
            ids[i, width - n :] = row
            mask[i, width - n :] = 1
        else:
            ids[i, :n] = row
            mask[i, :n] = 1
    if device is not None:
        ids, mask = ids.to(device), mask.to(device)
    return ids, mask


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``cumsum(mask) - 1`` clamped at 0: real tokens get 0, 1, 2, ... whatever side the padding is."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _row_chunks(logits: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
    """``(first row, [rows, V] chunk)`` over ``logits``' rows in order, each chunk at most
    ``_CHUNK_ELEMENTS`` elements: the whole tensor's rows when it is contiguous, else each sequence's of
    a 3-D tensor, so that a slice ``logits[:, a:b]`` (rows not one block when B > 1) is read as views,
    where ``reshape`` would copy all of it (and the backward again). Other layouts are reshaped."""
    vocab = logits.shape[-1]
    blocks = [logits] if logits.dim() != 3 or logits.is_contiguous() else list(logits.unbind(0))
    step = max(1, _CHUNK_ELEMENTS // max(1, vocab))
    first = 0
    for block in blocks:
        rows = block.reshape(-1, vocab)
        for i in range(0, rows.shape[0], step):
            yield first + i, rows[i : i + step]
        first += rows.shape[0]


class _SelectiveLogSoftmax(torch.autograd.Function):
    """``log_softmax(logits / T).gather(-1, index)`` without a float32 copy of the full log-softmax.

    Forward: a float32 log-softmax chunk by chunk (``_row_chunks``), the selected entries gathered from
    each. Backward recomputes the softmax chunk by chunk:
    ``d/dlogits = g * (onehot(index) - softmax(logits / T)) / T``. Nothing vocabulary-sized is saved
    beyond the logits themselves, and a slice of them is read where it lies, not copied. The backward
    works in place on its float32 chunks, so it cannot itself be differentiated
    (``once_differentiable``: a second-order gradient is refused, not wrong).
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, index: torch.Tensor, temperature: float) -> torch.Tensor:
        idx = index.reshape(-1, 1)
        out = torch.empty(idx.shape[0], dtype=torch.float32, device=logits.device)
        for i, chunk in _row_chunks(logits):
            n = chunk.shape[0]
            if temperature != 1.0:
                chunk = chunk.float() / temperature
            # one float32 log-softmax of this chunk (one operation: faster than gather - logsumexp)
            logp = torch.log_softmax(chunk, dim=-1, dtype=torch.float32)
            out[i : i + n] = logp.gather(-1, idx[i : i + n]).squeeze(-1)
        ctx.save_for_backward(logits, index)
        ctx.temperature = temperature
        return out.reshape(index.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        logits, index = ctx.saved_tensors
        t = ctx.temperature
        idx = index.reshape(-1, 1)
        g = grad_out.reshape(-1, 1).float()
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        flat_grad = grad.view(-1, logits.shape[-1])
        for i, chunk in _row_chunks(logits):
            n = chunk.shape[0]
            if t != 1.0:
                chunk = chunk.float() / t
            gi = g[i : i + n]
            # in place on the float32 chunk the softmax returns: no new vocabulary-wide tensor per operation
            d = torch.softmax(chunk, dim=-1, dtype=torch.float32).mul_(-gi)
            d.scatter_add_(-1, idx[i : i + n], gi)
            if t != 1.0:
                d.div_(t)
            flat_grad[i : i + n].copy_(d)
        return grad, None, None


def selective_log_softmax(
    logits: torch.Tensor, index: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``log_softmax(logits / temperature, -1).gather(-1, index[..., None]).squeeze(-1)`` in float32,
    memory-frugal in forward and backward (see ``_SelectiveLogSoftmax``)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return _SelectiveLogSoftmax.apply(logits, index.long(), float(temperature))


def cache_keyword(model: torch.nn.Module) -> str:
    """The name ``model.forward`` takes the KV cache under: ``cache`` (transformers 5.24 renamed it, and
    warns on the old name) or ``past_key_values``. The output field has the same name. A PEFT or DDP
    wrapper passes keyword arguments through: its causal LM's signature decides, here and below."""
    return forward_cache_keyword(_unwrapped(model).forward) or "past_key_values"


def forward_cache_keyword(forward: Any) -> str | None:
    """The keyword ``forward`` takes a KV cache under (``cache`` or ``past_key_values``), ``None`` when it
    names neither (a signature that cannot be read is taken for ``past_key_values``)."""
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    if "past_key_values" in params:
        return "past_key_values"
    return "cache" if "cache" in params else None


def accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether ``model.forward`` takes ``logits_to_keep`` (cached on the model)."""
    cached = getattr(model, "_ragrl_logits_to_keep", None)
    if cached is None:
        try:
            cached = "logits_to_keep" in inspect.signature(_unwrapped(model).forward).parameters
        except (TypeError, ValueError):
            cached = False
        try:
            model._ragrl_logits_to_keep = cached  # type: ignore[attr-defined]
        except AttributeError:
            pass
    return bool(cached)


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The causal LM inside a DistributedDataParallel or DeepSpeed engine and/or PEFT wrapper (whose
    forwards pass keyword arguments through to it)."""
    deepspeed = sys.modules.get("deepspeed")  # an engine exists only where deepspeed was imported
    wrappers = (torch.nn.parallel.DistributedDataParallel,) + (
        (deepspeed.DeepSpeedEngine,) if deepspeed else ()
    )
    inner = getattr(model, "module", model) if isinstance(model, wrappers) else model
    return inner.get_base_model() if hasattr(inner, "get_base_model") else inner


def _masked_head_supported(model: torch.nn.Module) -> bool:
    """Whether ``_masked_logprobs`` may run ``model``: its forward is one of transformers' own causal
    LMs' (they apply the output embedding once, to the last hidden states, then only element-wise
    transforms), and it was not found to return anything else (remembered on the model). The forward's
    class, not the model's: FSDP2 makes each model an instance of a class of its own (``FSDP<Name>``,
    defined in torch) that keeps the model's forward."""
    inner = _unwrapped(model)
    return (
        getattr(inner, "_ragrl_masked_head", True)
        and getattr(type(inner).forward, "__module__", "").startswith("transformers.")
        and hasattr(inner, "get_output_embeddings")
        and inner.get_output_embeddings() is not None
    )


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    start: int | None = None,
    with_entropy: bool = False,
    mask: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each token given its prefix: ``out[b, j] = log p_T(input_ids[b, s + j] | prefix)``.

    ``s = start`` (default 1), so with the default ``out[b, t]`` scores ``input_ids[b, t + 1]`` and
    ``out`` is ``[B, L - 1]``. ``p_T = softmax(logits / temperature)`` over the full vocabulary,
    matching the generation backends' convention (a greedy generation's log-probs are recomputed
    with ``temperature=1``). Works for left or right padding (positions come from the mask), under
    ``torch.no_grad`` and with autograd (float32 result; targets at padding are 0).

    ``with_entropy=True`` also returns the entropy of ``p_T`` at each scored position (same shape,
    detached, 0 at padding): a training diagnostic that costs no extra forward pass.

    ``mask`` ([B, L - s], nonzero where a log-prob is needed, e.g. a loss mask on the policy's tokens)
    returns 0 off the mask, and for transformers' own causal LMs (any version) computes the output
    head only at the masked positions, inside the model's own forward (``_masked_logprobs``), so its
    logit transforms and any DDP, FSDP, DeepSpeed or PEFT wrapper still apply. The head is a
    vocabulary-sized matrix product per position: where the vocabulary is large next to the model (the
    tiny policy: 8192 × 128 against ~0.85M multiply-adds per token in its four layers) it is most of a
    step's time (``benchmarks/masked_logprobs.py``). Other models compute full logits: same values.
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, L], got shape {tuple(input_ids.shape)}")
    seq_len = input_ids.shape[1]
    s = 1 if start is None else int(start)
    if not 1 <= s < seq_len:
        raise ValueError(f"start must be in [1, {seq_len - 1}] for sequences of length {seq_len}, got {s}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    position_ids = position_ids_from_mask(attention_mask)
    keep = attention_mask[:, s:].bool()
    if mask is not None:
        if mask.shape != keep.shape:
            raise ValueError(
                f"mask must have shape {tuple(keep.shape)} (positions s..L-1), got {tuple(mask.shape)}"
            )
        keep = keep & mask.bool()
        if _masked_head_supported(model):
            masked = _masked_logprobs(
                model, input_ids, attention_mask, position_ids, s, keep, temperature, with_entropy
            )
            if masked is not None:
                return masked
    n_keep = seq_len - s + 1  # logits at positions s-1 .. L-1; the last one predicts nothing
    kwargs: dict[str, Any] = {}
    if accepts_logits_to_keep(model):
        kwargs["logits_to_keep"] = n_keep
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        **kwargs,
    )
    logits = out.logits
    if logits.shape[1] != n_keep:  # a model without logits_to_keep (a slice, even a whole one, is a
        logits = logits[:, -n_keep:, :]  # node in the graph whose backward zero-fills their size)
    lp = shifted_log_softmax(logits, input_ids[:, s:], temperature)
    lp = torch.where(keep, lp, torch.zeros_like(lp))
    if not with_entropy:
        return lp
    entropy = entropy_from_logits(logits, temperature)[:, :-1]
    return lp, torch.where(keep, entropy, torch.zeros_like(lp))


def shifted_log_softmax(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``selective_log_softmax(logits[:, :-1], targets)`` for ``logits`` ``[B, n + 1, V]`` whose last
    position predicts nothing (a model's output at positions s - 1 .. L - 1, ``targets`` the tokens at
    s .. L - 1). The last position is scored against a dummy target and dropped after: its gradient is
    0, and the gradient reaches ``logits`` whole, where the slice's would be copied into a zeroed buffer
    of their size by autograd (``benchmarks/selective_logsoftmax_memory.py --sliced``)."""
    dummy = targets.new_zeros(targets.shape[0], 1)
    return selective_log_softmax(logits, torch.cat((targets, dummy), dim=1), temperature)[:, :-1]


def _masked_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    s: int,
    keep: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None:
    """``token_logprobs`` with the output head only where ``keep`` ([B, L - s]) is set. The logits at
    position t - 1 score the token at t, so the head needs the hidden states of positions s - 1 .. L - 2
    where ``keep``: a forward pre-hook on the model's output embedding hands it those rows only
    (``[N, H]``), and the model's forward goes on from the ``[N, V]`` logits as from any others (a
    boolean ``logits_to_keep`` does the same from transformers 5.24 on; a hook works on every version,
    the GPU machines' 5.17 included). None, remembered on the model, when its output is not that."""
    inner = _unwrapped(model)
    n_keep = input_ids.shape[1] - s + 1  # positions s-1 .. L-1 (the last one predicts nothing)
    calls = 0

    def kept_rows_only(_head: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        nonlocal calls
        calls += 1
        hidden = args[0]
        last_states = hidden.dim() == 3 and hidden.shape[0] == keep.shape[0]
        if calls > 1 or not last_states or hidden.shape[1] not in (n_keep, input_ids.shape[1]):
            return None  # not the one call on the last hidden states: the output check refuses it
        return (hidden[:, hidden.shape[1] - n_keep : -1][keep.to(hidden.device)], *args[1:])

    kwargs: dict[str, Any] = {"logits_to_keep": n_keep} if accepts_logits_to_keep(model) else {}
    handle = inner.get_output_embeddings().register_forward_pre_hook(kept_rows_only)
    try:
        out = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
            **kwargs,
        )  # fmt: skip
    finally:
        handle.remove()
    logits = out.logits  # [N, V], the kept positions in row-major order
    n = int(keep.sum())
    if calls != 1 or logits.dim() != 2 or logits.shape[0] != n:
        inner._ragrl_masked_head = False  # type: ignore[attr-defined]
        return None
    picked = selective_log_softmax(logits, input_ids[:, s:][keep], temperature)
    lp = torch.zeros(keep.shape, dtype=picked.dtype, device=picked.device).masked_scatter(keep, picked)
    if not with_entropy:
        return lp
    entropy = torch.zeros_like(lp).masked_scatter(keep, entropy_from_logits(logits, temperature))
    return lp, entropy


@torch.no_grad()
def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``H(softmax(logits / T))`` over the last dimension, in float32, chunked over rows like the
    log-softmax so that a long batch never holds a second full-vocabulary float32 copy."""
    logits = logits.detach()
    out = torch.empty(logits.shape[:-1].numel(), dtype=torch.float32, device=logits.device)
    for i, chunk in _row_chunks(logits):
        logp = torch.log_softmax(chunk.float() / temperature, dim=-1)
        out[i : i + chunk.shape[0]] = -(logp.exp() * logp).sum(-1)
    return out.reshape(logits.shape[:-1])
