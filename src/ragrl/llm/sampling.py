"""Choosing each row's next token from its logits, as ``SamplingParams`` says and nothing else (the
transformers backend's decoding loop; the convention in ``ragrl.llm.backend``): greedy, or inverse-CDF
sampling of ``softmax(logits / T)`` truncated to top-k / top-p, one uniform per row from the row's own
generator."""

from __future__ import annotations

import torch

from ragrl.llm.backend import SamplingParams


def pick(
    logits: torch.Tensor, params: SamplingParams, generators: list[torch.Generator], greedy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose one token per row of ``logits``; return (tokens on CPU, their convention log-probs on CPU)."""
    if greedy:
        tokens = logits.argmax(dim=-1)
        lps = logits.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
        return tokens.cpu(), lps.cpu()
    scaled = logits / params.temperature
    logz = torch.logsumexp(scaled, dim=-1, keepdim=True)
    probs = torch.exp(scaled - logz)  # softmax(logits / T), full vocabulary
    weights = truncate(probs, params.top_k, params.top_p)
    # Inverse-CDF sampling with one uniform per row from that row's own generator.
    u = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in generators]).to(logits.device)
    cdf = weights.double().cumsum(dim=-1)
    target = (u * cdf[:, -1])[:, None]
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)
    lps = (scaled.gather(-1, tokens[:, None]) - logz).squeeze(-1)
    return tokens.cpu(), lps.cpu()


def truncate(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Zero the probabilities outside the top-k / top-p (nucleus) sets; unnormalised result."""
    vocab = probs.shape[-1]
    if top_k and top_k < vocab:
        kth = torch.topk(probs, top_k, dim=-1).values[:, -1:]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if top_p < 1.0:
        sorted_p, sorted_idx = torch.sort(probs, dim=-1, descending=True)
        total = sorted_p.sum(-1, keepdim=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each token
        drop_sorted = before >= top_p * total  # keep the smallest prefix reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, sorted_idx, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
    return probs
