"""The math of policy-gradient training, as pure functions in name registries (see ``docs/algos.md``).

* ``advantages``: ``get_advantage(name)(rewards, group_ids, **params)`` — grpo, grpo_mean_only, rloo,
  reinforce_pp_baseline; ``Groups`` (vectorised per-group reductions); ``difficulty_weight``.
* ``kl``: ``get_kl(name)(logp, ref_logp, **params)`` — k1, k2, k3, abs (+ verl aliases).
* ``losses``: ``ppo_clip_loss`` (the registered per-token policy losses), ``aggregate(per_token, mask,
  mode)``, ``policy_loss``.
* ``filters``: ``get_filter(name)(scores, group_ids, **params) -> keep mask``; ``group_stats``.
* ``preference``: ``dpo_loss(chosen, rejected, ref_chosen, ref_rejected, loss_type=...)`` — sigmoid (DPO),
  robust, hinge, ipo; reference-free.

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
    POLICY_LOSSES,
    aggregate,
    aggregation_names,
    engine_mismatch,
    get_aggregation,
    masked_mean,
    policy_loss,
    policy_loss_names,
    ppo_clip_loss,
    register_aggregation,
    register_policy_loss,
    tis_weights,
)
from ragrl.algos.preference import (
    PREFERENCE_LOSSES,
    dpo_loss,
    preference_loss_names,
    register_preference_loss,
)

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "FILTERS",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "PREFERENCE_LOSSES",
    "Groups",
    "advantage_names",
    "aggregate",
    "aggregation_names",
    "engine_mismatch",
    "batch_groups",
    "compute_advantages",
    "difficulty_weight",
    "dpo_loss",
    "filter_names",
    "get_advantage",
    "get_aggregation",
    "get_filter",
    "get_kl",
    "group_stats",
    "kl_names",
    "masked_mean",
    "policy_loss",
    "policy_loss_names",
    "preference_loss_names",
    "ppo_clip_loss",
    "register_advantage",
    "register_aggregation",
    "register_filter",
    "register_kl",
    "register_policy_loss",
    "tis_weights",
    "register_preference_loss",
]
