"""Group filters ``f(scores [N], group_ids [N], **params) -> keep [N] (bool)`` and ``group_stats``.

A filter keeps or drops whole groups (all rollouts of one prompt together). ``scores`` is whatever the
filter should read: the total reward for DAPO, the answer-F1 component alone for TIRESRAG (its filter
ignores the judge rewards); the trainer passes the tensor its config names.

* ``keep_all``: no filtering.
* ``drop_zero_variance``: DAPO's dynamic sampling (R²AG's ``std({R_i}) > 0``): drop a group whose scores
  are all equal (``max - min <= tol``). Such a group has advantage 0 under every estimator in
  ``advantages.py`` and only dilutes the batch. A group of one rollout is dropped too unless
  ``keep_singletons=True`` (verl's DAPO recipe keeps singletons).
* ``drop_saturated``: TIRESRAG §3.3, its code being authoritative: drop a group if ``max ≤ low`` (all
  near-wrong) or ``min ≥ high`` (all near-right), defaults ``low = 0.1``, ``high = 0.9`` on answer F1. The
  edges are inclusive: a group whose best F1 is exactly 0.1 is dropped, and so is one whose worst F1 is
  exactly 0.9. Compare in the scores' own dtype (a float32 0.1 equals the Python literal 0.1 there).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ragrl.algos.advantages import batch_groups
from ragrl.registry import Registry

FilterFn = Callable[..., Tensor]

FILTERS: Registry[FilterFn] = Registry("group filter")
register_filter = FILTERS.register
"""Register ``fn(scores, group_ids, **params) -> keep mask`` under ``name``."""
get_filter = FILTERS.get
filter_names = FILTERS.names


@register_filter("keep_all")
def keep_all(scores: Tensor, group_ids: Tensor) -> Tensor:
    s, _ = batch_groups(scores, group_ids)
    return torch.ones_like(s, dtype=torch.bool)


@register_filter("drop_zero_variance")
def drop_zero_variance(
    scores: Tensor, group_ids: Tensor, *, tol: float = 0.0, keep_singletons: bool = False
) -> Tensor:
    s, groups = batch_groups(scores, group_ids)
    keep = (groups.max(s) - groups.min(s)) > tol
    if keep_singletons:
        keep = keep | (groups.counts == 1)
    return keep[groups.inverse]


@register_filter("drop_saturated")
def drop_saturated(scores: Tensor, group_ids: Tensor, *, low: float = 0.1, high: float = 0.9) -> Tensor:
    below, above = saturated_groups(scores, group_ids, low=low, high=high)
    _, groups = batch_groups(scores, group_ids)
    return ~(below | above)[groups.inverse]


def saturated_groups(
    scores: Tensor, group_ids: Tensor, *, low: float = 0.1, high: float = 0.9
) -> tuple[Tensor, Tensor]:
    """Per group (in ``Groups`` order): whether every score is ``≤ low``, and whether every one is
    ``≥ high`` (what ``drop_saturated`` drops, the two kinds apart for logging)."""
    s, groups = batch_groups(scores, group_ids)
    return groups.max(s) <= low, groups.min(s) >= high


def group_stats(rewards: Tensor, group_ids: Tensor) -> dict[str, float]:
    """Per-step logging numbers about the groups of a batch.

    ``reward_std_in_group``: mean over groups of the population std of rewards within the group (0 for a
    singleton); ``zero_variance_share``: share of groups whose rewards are all equal (these give no
    gradient under GRPO); plus ``num_groups``, ``group_size_mean`` and ``reward_mean``.
    """
    r, groups = batch_groups(rewards, group_ids)
    stds = groups.std(r, "population")
    return {
        "num_groups": float(groups.num),
        "group_size_mean": float(groups.counts.mean()) if groups.num else 0.0,
        "reward_mean": float(r.mean()) if r.numel() else 0.0,
        "reward_std_in_group": float(stds.mean()) if groups.num else 0.0,
        "zero_variance_share": float(groups.all_equal(r).to(r.dtype).mean()) if groups.num else 0.0,
    }
