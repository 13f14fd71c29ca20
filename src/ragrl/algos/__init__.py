"""The math of policy-gradient training, as pure functions in name registries (see ``docs/algos.md``).

* ``advantages``: ``get_advantage(name)(rewards, group_ids, **params)`` — grpo, grpo_mean_only, rloo,
  reinforce_pp_baseline; ``Groups`` (vectorised per-group reductions); ``difficulty_weight``.
* ``kl``: ``get_kl(name)(logp, ref_logp, **params)`` — k1, k2, k3, abs (+ verl aliases).
* ``losses``: ``ppo_clip_loss``, ``aggregate(per_token, mask, mode)``, ``policy_loss``.
* ``filters``: ``get_filter(name)(scores, group_ids, **params) -> keep mask``; ``group_stats``.

A method adds its own entry with the matching ``register_*`` decorator in its own module; the trainer
only ever looks names up.
"""

from ragrl.algos.advantages import (
    ADVANTAGES,
    Groups,
    advantage_names,
    batch_groups,
    compute_advantages,
    difficulty_weight,
    get_advantage,
    register_advantage,
)
from ragrl.algos.filters import FILTERS, filter_names, get_filter, group_stats, register_filter
from ragrl.algos.kl import KL_ESTIMATORS, get_kl, kl_names, register_kl
from ragrl.algos.losses import (
    AGGREGATIONS,
    aggregate,
    aggregation_names,
    get_aggregation,
    masked_mean,
    policy_loss,
    ppo_clip_loss,
    register_aggregation,
)

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "FILTERS",
    "KL_ESTIMATORS",
    "Groups",
    "advantage_names",
    "aggregate",
    "aggregation_names",
    "batch_groups",
    "compute_advantages",
    "difficulty_weight",
    "filter_names",
    "get_advantage",
    "get_aggregation",
    "get_filter",
    "get_kl",
    "group_stats",
    "kl_names",
    "masked_mean",
    "policy_loss",
    "ppo_clip_loss",
    "register_advantage",
    "register_aggregation",
    "register_filter",
    "register_kl",
]
