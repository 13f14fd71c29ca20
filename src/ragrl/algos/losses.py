"""The PPO-clip policy loss, loss aggregation modes, and ``policy_loss`` which combines them with a KL.

Shapes: ``logp``, ``old_logp``, ``ref_logp`` and ``mask`` are ``[B, T]`` over completion tokens (``mask``
1 on policy tokens, 0 on padding and on environment tokens such as retrieved passages); ``advantages``
is ``[B]`` (one per rollout, broadcast over its tokens) or ``[B, T]``.

Aggregation modes (``aggregate(per_token, mask, mode)``; verl ``agg_loss`` ``loss_agg_mode`` and TRL
``GRPOConfig.loss_type`` in brackets):

* ``token_mean``: ``Σ m·ℓ / Σ m`` over the whole batch [verl ``token-mean``; TRL ``bnpo``, and ``dapo`` on
  one process]. ARENA (vendored TRL 0.16), DAPO, R²AG.
* ``seq_mean_token_mean``: mean over each sequence's tokens, then over sequences [verl
  ``seq-mean-token-mean``; TRL ``grpo``]. The original GRPO, Eval-RAR's Eq. 6, TIRESRAG (OpenRLHF).
* ``seq_mean_token_sum``: token sum per sequence, then mean over sequences [verl ``seq-mean-token-sum``].
* ``seq_mean_token_sum_norm``: token sum per sequence / ``constant``, then mean over sequences [verl
  ``seq-mean-token-sum-norm`` with ``loss_scale_factor``; TRL ``dr_grpo``, whose constant is
  ``max_completion_length``]. Dr. GRPO. ``constant`` is required: a constant that changes with the batch
  (the padded length, verl's fallback) brings back the length bias Dr. GRPO removes.

``token_mean`` gives every token the same weight, so a long rollout moves the loss more than a short
one; ``seq_mean_token_mean`` gives every rollout the same weight, so each token of a long rollout counts
less (``tests/algos/test_losses.py`` works an example).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from ragrl.algos.kl import get_kl
from ragrl.errors import RagrlError
from ragrl.registry import Registry

AggregationFn = Callable[..., Tensor]

AGGREGATIONS: Registry[AggregationFn] = Registry("aggregation")
register_aggregation = AGGREGATIONS.register
"""Register ``fn(per_token [B, T], mask [B, T], **params) -> scalar`` under ``name``."""
get_aggregation = AGGREGATIONS.get
aggregation_names = AGGREGATIONS.names


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """``Σ m·x / Σ m`` (0 when the mask is empty)."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1)


@register_aggregation("token_mean")
def token_mean(per_token: Tensor, mask: Tensor) -> Tensor:
    return masked_mean(per_token, mask)


@register_aggregation("seq_mean_token_mean")
def seq_mean_token_mean(per_token: Tensor, mask: Tensor) -> Tensor:
    # As TRL: a sequence with no policy token counts in the batch mean with loss 0.
    mask = mask.to(per_token.dtype)
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


@register_aggregation("seq_mean_token_sum")
def seq_mean_token_sum(per_token: Tensor, mask: Tensor) -> Tensor:
    return (per_token * mask.to(per_token.dtype)).sum(-1).mean()


@register_aggregation("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(per_token: Tensor, mask: Tensor, *, constant: float) -> Tensor:
    if not constant or constant <= 0:
        raise RagrlError(
            f"seq_mean_token_sum_norm needs a positive constant (e.g. max new tokens), got {constant}"
        )
    return ((per_token * mask.to(per_token.dtype)).sum(-1) / constant).mean()


def aggregate(
    per_token: Tensor, mask: Tensor, mode: str = "token_mean", *, constant: float | None = None
) -> Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar with the registered ``mode``."""
    fn = get_aggregation(mode)
    takes_constant = "constant" in inspect.signature(fn).parameters
    if takes_constant:
        if constant is None:
            raise RagrlError(f"aggregation {mode!r} needs 'constant' (e.g. the max response length)")
        return fn(per_token, mask, constant=constant)
    if constant is not None:
        raise RagrlError(f"aggregation {mode!r} takes no 'constant' (got {constant})")
    return fn(per_token, mask)


POLICY_LOSSES: Registry[Callable[..., tuple[Tensor, dict[str, Tensor]]]] = Registry("policy loss")
register_policy_loss = POLICY_LOSSES.register
"""Register a per-token policy-gradient loss ``fn(logp, old_logp, advantages, mask, *, eps_low, eps_high)
-> ([B, T] loss, metrics)`` (GSPO, REINFORCE++ and the like plug in here); ``train.grpo.pg_loss`` names
it."""
policy_loss_names = POLICY_LOSSES.names


@register_policy_loss("ppo_clip")
def ppo_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token PPO-clip loss ``-min(ρ·A, clip(ρ, 1 - eps_low, 1 + eps_high)·A)``, ρ = exp(logp - old_logp).

    ``eps_low != eps_high`` is DAPO's decoupled clip ("clip-higher"; R²AG); TRL ``epsilon``/``epsilon_high``,
    verl ``clip_ratio_low``/``clip_ratio_high``. Returns the unreduced ``[B, T]`` loss (padding included:
    aggregate with the mask) and detached 0-dim metrics over masked tokens, as TRL logs them:

    * ``clip_frac_low``: ρ < 1 - eps_low with A < 0 (the clip binds from below),
    * ``clip_frac_high``: ρ > 1 + eps_high with A > 0,
    * ``clip_frac``: their sum,
    * ``approx_kl``: KL(π_old ‖ π_θ) by the k3 estimator ``(ρ - 1) - log ρ`` on tokens sampled from π_old,
    * ``ratio_mean``: mean ρ.
    """
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv
    per_token = -torch.min(unclipped, clipped)

    with torch.no_grad():
        low = ((ratio < 1 - eps_low) & (adv < 0)).to(ratio.dtype)
        high = ((ratio > 1 + eps_high) & (adv > 0)).to(ratio.dtype)
        metrics = {
            "clip_frac_low": masked_mean(low, mask),
            "clip_frac_high": masked_mean(high, mask),
            "clip_frac": masked_mean(low + high, mask),
            "approx_kl": masked_mean(torch.expm1(log_ratio) - log_ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
        }
    return per_token, metrics


def policy_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    ref_logp: Tensor | None = None,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    beta: float = 0.0,
    kl: str = "k3",
    kl_params: Mapping[str, Any] | None = None,
    agg: str = "token_mean",
    constant: float | None = None,
    pg_loss: str = "ppo_clip",
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The GRPO-family loss: a per-token policy loss (``pg_loss``, PPO-clip by default) + β·KL(π_θ‖π_ref)
    per token, then one aggregation.

    ``old_logp=None`` means one update per batch (μ = 1): π_old is π_θ detached, so ρ = 1 in value and
    the clip never binds (as TRL with ``num_iterations=1``). ``beta=0`` skips the KL and needs no
    ``ref_logp``. With ``beta > 0`` the KL is added to the per-token loss before aggregating, as TRL does;
    verl aggregates the two separately with the same mode, which gives the same scalar.

    ``is_weights`` (``[B, T]``, detached) multiply the policy term per token before the KL is added:
    truncated importance sampling's min(π_old / π_engine, C) (``tis_weights``), as verl applies
    ``tis_imp_ratio`` to ``pg_losses``.

    Returns the scalar loss and detached metrics: those of ``ppo_clip_loss`` plus ``pg_loss`` (the clip
    term alone, aggregated), ``kl`` (masked token mean of the KL estimate, when ``beta > 0``) and ``loss``.
    """
    if old_logp is None:
        old_logp = logp.detach()
    pg, metrics = POLICY_LOSSES.get(pg_loss)(
        logp, old_logp, advantages, mask, eps_low=eps_low, eps_high=eps_high
    )
    if is_weights is not None:
        pg = pg * is_weights.detach()
    per_token = pg
    if beta != 0.0:
        if ref_logp is None:
            raise RagrlError(f"beta = {beta} needs ref_logp (the reference model's log-probs)")
        kl_per_token = get_kl(kl)(logp, ref_logp, **dict(kl_params or {}))
        per_token = pg + beta * kl_per_token
        metrics["kl"] = masked_mean(kl_per_token.detach(), mask)
    loss = aggregate(per_token, mask, agg, constant=constant)
    metrics["pg_loss"] = aggregate(pg.detach(), mask, agg, constant=constant)
    metrics["loss"] = loss.detach()
    return loss, metrics


def tis_weights(old_logp: Tensor, engine_logp: Tensor, mask: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    """Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings you
    off-policy RL training"): per token min(π_old / π_engine, ``cap``), 0 off the mask, and the share of
    masked tokens the cap cut."""
    ratio = torch.exp(old_logp - engine_logp) * mask
    return ratio.clamp(max=cap), masked_mean((ratio > cap).float(), mask)


def engine_mismatch(old_logp: Tensor, engine_logp: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """How far the trainer's log-probs of the sampled tokens (π_old) are from the ones the generation
    engine reported (π_engine), over the masked tokens: ``logprob_diff`` mean |log π_old − log π_engine|,
    ``prob_diff`` mean |π_old − π_engine| (verl's ``rollout_probs_diff_mean``) and ``kl`` the k3 estimate
    of KL(π_engine ‖ π_old), unbiased on tokens the engine sampled: mean(r − 1 − log r), r = π_old /
    π_engine."""
    log_r = (old_logp - engine_logp) * mask
    return {
        "logprob_diff": masked_mean(log_r.abs(), mask),
        "prob_diff": masked_mean((old_logp.exp() - engine_logp.exp()).abs(), mask),
        "kl": masked_mean(torch.exp(log_r) - 1.0 - log_r, mask),
    }
