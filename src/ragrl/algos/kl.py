"""Per-token estimators of KL(π_θ ‖ π_ref): ``f(logp, ref_logp, **params) -> Tensor`` elementwise.

``logp`` are the policy's log-probs of the sampled tokens (with gradient), ``ref_logp`` the frozen
reference model's. The tokens are sampled from (approximately) π_θ, so with ``d = ref_logp - logp``
(Schulman 2020, "Approximating KL divergence", http://joschu.net/blog/kl-approx.html):

========  ============================  ===================================================================
name      value                         notes
========  ============================  ===================================================================
``k1``    ``logp - ref_logp`` = ``-d``  unbiased, high variance, can be negative (verl ``kl``/``k1``)
``k2``    ``½ d²``                      biased, ≥ 0; ARENA's "stabilized" KL (verl ``mse``/``k2``)
``k3``    ``exp(d) - d - 1``            unbiased, ≥ 0, low variance; TRL ``GRPOTrainer``, verl
                                        ``low_var_kl``/``k3`` (Eval-RAR, Search-R1)
``abs``   ``|d|``                       verl ``abs``
========  ============================  ===================================================================

The verl names ``kl``, ``mse`` and ``low_var_kl`` are registered as aliases, so a config written for
verl reads the same here.

Gradient (what ARENA §3.3 is about): d/d logp of ``k1`` is 1, of ``k2`` is ``logp - ref_logp`` (linear
in log space) and of ``k3`` is ``1 - exp(ref_logp - logp)``, which grows exponentially as the policy
puts vanishing probability on a sampled token (logp → -∞). ``tests/algos/test_kl.py`` sweeps this.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ragrl.registry import Registry

KLFn = Callable[..., Tensor]

KL_ESTIMATORS: Registry[KLFn] = Registry("KL estimator")
register_kl = KL_ESTIMATORS.register
"""Register ``fn(logp, ref_logp, **params) -> per-token KL`` under ``name``."""
get_kl = KL_ESTIMATORS.get
kl_names = KL_ESTIMATORS.names


@register_kl("k1")
def k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``logp - ref_logp``: the naive log-ratio (ARENA's repo keeps it as a comment)."""
    return logp - ref_logp


@register_kl("k2")
def k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``½ (logp - ref_logp)²``: ARENA's stabilized KL (arena.md §3.3), verl ``mse``/``k2``."""
    return 0.5 * (logp - ref_logp).square()


@register_kl("k3")
def k3(
    logp: Tensor,
    ref_logp: Tensor,
    *,
    clamp: float | None = None,
    log_ratio_clamp: float | None = None,
) -> Tensor:
    """``exp(d) - d - 1`` with ``d = ref_logp - logp``: TRL ``GRPOTrainer``'s ``per_token_kl``, verl
    ``low_var_kl``.

    Computed as ``expm1(d) - d``: the same value, but never below 0 in floating point (the literal
    ``exp(d) - d - 1`` can round to about -1e-8 for |d| near float32's epsilon).

    ``log_ratio_clamp`` clamps ``d`` to ``[-c, c]`` before the exponential and ``clamp`` clamps the result
    to ``[-c, c]``; verl uses 20 and 10. Both are off by default (TRL clamps nothing). Note that a clamp
    that binds sets that token's gradient to zero rather than bounding it.
    """
    d = ref_logp - logp
    if log_ratio_clamp is not None:
        d = d.clamp(-log_ratio_clamp, log_ratio_clamp)
    kl = torch.expm1(d) - d
    if clamp is not None:
        kl = kl.clamp(-clamp, clamp)
    return kl


@register_kl("abs")
def abs_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """``|logp - ref_logp|`` (verl ``abs``)."""
    return (logp - ref_logp).abs()


# verl's spellings of the same estimators.
register_kl("kl")(k1)
register_kl("mse")(k2)
register_kl("low_var_kl")(k3)
