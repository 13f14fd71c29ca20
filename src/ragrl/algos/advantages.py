"""Advantage estimators: ``f(rewards [N], group_ids [N], **params) -> advantages [N]``.

One scalar per rollout; the loss broadcasts it over that rollout's policy tokens. ``group_ids`` says
which rollouts answer the same prompt. Groups need not be contiguous or equal-sized (after a group
filter, or with variable ``n`` per prompt, they are not); everything is vectorised with index/scatter
ops over a ``Groups`` index, never a Python loop per group.

Registered names (``get_advantage(name)``; a method adds its own with ``@register_advantage``):

* ``grpo``: group z-score ``(r - mean_g) / (std_g + eps)``. ``std="sample"`` is Bessel-corrected
  ``torch.std`` (TRL ``GRPOTrainer``, verl ``compute_grpo_outcome_advantage``); ``"population"`` divides
  by ``n`` (TIRESRAG Algorithm 1). ``eps``: ARENA/TRL 1e-4, verl/Eval-RAR 1e-6, TIRESRAG 1e-8/1e-9.
* ``grpo_mean_only``: ``r - mean_g`` (Dr. GRPO; verl ``norm_adv_by_std_in_grpo=False``).
* ``rloo``: ``r_i - mean_{j != i in g} r_j`` (Ahmadian et al. 2024; verl ``rloo``).
* ``reinforce_pp_baseline``: ``r - mean_g``, then whitened over the whole batch (Reinforce++ with a
  group baseline: verl ``reinforce_plus_plus_baseline``, OpenRLHF ``reinforce_baseline``, TIRESRAG §3.6).

Edge cases, the same for every estimator here:

* a group whose rewards are all equal gets advantage exactly 0, whatever ``eps`` (even 0) — TRL and
  verl give 0 only up to the rounding of ``mean`` (e.g. three rewards of 0.1 have a float mean
  0.1 + 2.8e-17);
* a group of one rollout is such a group: its advantage is 0 (for ``rloo`` the leave-one-out baseline
  is undefined and 0 is used too).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from ragrl.errors import RagrlError
from ragrl.registry import Registry

AdvantageFn = Callable[..., Tensor]

ADVANTAGES: Registry[AdvantageFn] = Registry("advantage")
register_advantage = ADVANTAGES.register
"""Register ``fn(rewards, group_ids, **params) -> advantages`` under ``name``."""
get_advantage = ADVANTAGES.get
advantage_names = ADVANTAGES.names


def compute_advantages(
    name: str,
    rewards: Tensor,
    group_ids: Tensor,
    *,
    components: Mapping[str, Tensor] | None = None,
    weights: Mapping[str, float] | None = None,
    **params: object,
) -> Tensor:
    """``get_advantage(name)(rewards, group_ids, **params)``: the call a trainer makes from its config.

    ``components`` (each reward component's raw values, aligned with ``rewards``) reach estimators that
    declare a ``components`` parameter (TIRESRAG-R1's difficulty weight reads the sufficiency
    component, its consistency penalty the z-scores of three); ``weights`` (each component's weight in
    force at this step, a schedule applied) reach those that declare ``weights``. The others never
    see them."""
    fn = get_advantage(name)
    declared = inspect.signature(fn).parameters
    extra: dict[str, object] = {}
    if components is not None and "components" in declared:
        extra["components"] = components
    if weights is not None and "weights" in declared:
        extra["weights"] = weights
    return fn(rewards, group_ids, **extra, **params)


# --- groups -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Groups:
    """Dense group index of a batch: ``inverse[i]`` in ``0..num-1`` is rollout ``i``'s group."""

    inverse: Tensor
    counts: Tensor
    """Rollouts per group, ``[num]`` (float, so it divides without casts)."""

    @classmethod
    def of(cls, group_ids: Tensor | list[int]) -> Groups:
        ids = torch.as_tensor(group_ids)
        if ids.dim() != 1:
            raise RagrlError(f"group_ids must be 1-D, got shape {tuple(ids.shape)}")
        _, inverse = torch.unique(ids, return_inverse=True)
        num = int(_.numel())
        counts = torch.zeros(num, dtype=torch.float64, device=ids.device).index_add_(
            0, inverse, torch.ones_like(inverse, dtype=torch.float64)
        )
        return cls(inverse, counts)

    @property
    def num(self) -> int:
        return int(self.counts.numel())

    def sum(self, x: Tensor) -> Tensor:
        return x.new_zeros(self.num).index_add_(0, self.inverse, x)

    def mean(self, x: Tensor) -> Tensor:
        return self.sum(x) / self.counts.to(x.dtype)

    def min(self, x: Tensor) -> Tensor:
        return x.new_zeros(self.num).scatter_reduce_(0, self.inverse, x, reduce="amin", include_self=False)

    def max(self, x: Tensor) -> Tensor:
        return x.new_zeros(self.num).scatter_reduce_(0, self.inverse, x, reduce="amax", include_self=False)

    def std(self, x: Tensor, std: str = "sample") -> Tensor:
        """Per-group std; ``"sample"`` divides by ``n - 1`` (clamped to 1, so a singleton gives 0)."""
        dev = x - self.mean(x)[self.inverse]
        n = self.counts.to(x.dtype)
        return (self.sum(dev * dev) / _std_divisor(n, std)).sqrt()

    def all_equal(self, x: Tensor) -> Tensor:
        """``[num]`` bool: every reward in the group is the same (always true for a singleton)."""
        return self.max(x) == self.min(x)


def _std_divisor(n: Tensor, std: str) -> Tensor:
    if std == "sample":
        return (n - 1).clamp(min=1)
    if std == "population":
        return n
    raise RagrlError(f"std must be 'sample' or 'population', got {std!r}")


def batch_groups(rewards: Tensor | list[float], group_ids: Tensor | list[int]) -> tuple[Tensor, Groups]:
    """Check shapes; return the rewards as a float tensor and their ``Groups``."""
    r = torch.as_tensor(rewards)
    if not r.is_floating_point():
        r = r.to(torch.get_default_dtype())
    if r.dim() != 1:
        raise RagrlError(f"rewards must be 1-D [N], got shape {tuple(r.shape)}")
    groups = Groups.of(group_ids)
    if groups.inverse.numel() != r.numel():
        raise RagrlError(f"rewards has {r.numel()} entries but group_ids has {groups.inverse.numel()}")
    return r, groups


def _centered(r: Tensor, groups: Groups) -> Tensor:
    """``r - mean_g``, exactly 0 in groups whose rewards are all equal."""
    centered = r - groups.mean(r)[groups.inverse]
    return torch.where(groups.all_equal(r)[groups.inverse], torch.zeros_like(r), centered)


# --- estimators ---------------------------------------------------------------------------------------


@register_advantage("grpo")
def grpo(rewards: Tensor, group_ids: Tensor, *, std: str = "sample", eps: float = 1e-6) -> Tensor:
    """Group z-score ``(r - mean_g) / (std_g + eps)`` (DeepSeekMath GRPO; TRL, verl ``grpo``)."""
    r, groups = batch_groups(rewards, group_ids)
    return _centered(r, groups) / (groups.std(r, std)[groups.inverse] + eps)


@register_advantage("grpo_mean_only")
def grpo_mean_only(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """``r - mean_g``: Dr. GRPO (Liu et al. 2025) drops the std division."""
    r, groups = batch_groups(rewards, group_ids)
    return _centered(r, groups)


@register_advantage("rloo")
def rloo(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Leave-one-out baseline ``r_i - (sum_g - r_i) / (n_g - 1)`` = ``n/(n-1) · (r_i - mean_g)``."""
    r, groups = batch_groups(rewards, group_ids)
    n = groups.counts.to(r.dtype)[groups.inverse]
    return _centered(r, groups) * n / (n - 1).clamp(min=1)


@register_advantage("reinforce_pp_baseline")
def reinforce_pp_baseline(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    std: str = "sample",
    eps: float = 1e-8,
    token_counts: Tensor | None = None,
) -> Tensor:
    """Reinforce++ with a group baseline: ``c = r - mean_g``, then ``(c - mean(c)) / (std(c) + eps)``
    over the whole batch.

    ``token_counts`` (per rollout) weights the batch statistics by length, which reproduces exactly the
    token-level whitening of verl (``masked_whiten``) and OpenRLHF (over the replay buffer), since every
    token of a rollout carries the same advantage; without it the batch is whitened per rollout.
    """
    r, groups = batch_groups(rewards, group_ids)
    c = _centered(r, groups)
    w = torch.ones_like(c) if token_counts is None else torch.as_tensor(token_counts).to(c)
    total = w.sum()
    mu = (w * c).sum() / total
    var = (w * (c - mu) ** 2).sum() / _std_divisor(total, std)
    return (c - mu) / (var.sqrt() + eps)


# --- difficulty weighting (TIRESRAG §3.2) -------------------------------------------------------------


def difficulty_weight(
    rho: Tensor | float, *, a: float = 0.4, b: float = 1.5, rho0: float = 0.75, k: float = 10.0
) -> Tensor:
    """``W(ρ) = a + (b - a) / (1 + exp(k (ρ - ρ0)))`` (TIRESRAG Eq. 6, after GRPO-LEAD).

    ``ρ`` is a per-group success rate (TIRESRAG: the mean sufficiency reward of the group): hard groups
    (low ρ) get a weight near ``b``, easy ones near ``a``. A method multiplies its advantages by
    ``difficulty_weight(groups.mean(score))[groups.inverse]``.
    """
    rho_t = torch.as_tensor(rho)
    if not rho_t.is_floating_point():
        rho_t = rho_t.to(torch.get_default_dtype())
    return a + (b - a) * torch.sigmoid(-k * (rho_t - rho0))
