"""Rewards: a registry of named components and their weighted composition (``build_reward``).

Importing the package registers the shared answer and retrieval rewards (``ragrl.rewards.answer``,
``ragrl.rewards.retrieval``); a method's own components are registered by its module.
"""

import ragrl.rewards.answer  # noqa: F401  (registers em, f1, cover_em, substring, answered)
import ragrl.rewards.retrieval  # noqa: F401  (registers support_recall)
from ragrl.rewards.registry import (
    CompositeReward,
    RewardComponent,
    RewardContext,
    RewardResult,
    build_reward,
    get_reward,
    register_reward,
    reward_names,
)

__all__ = [
    "CompositeReward",
    "RewardComponent",
    "RewardContext",
    "RewardResult",
    "build_reward",
    "get_reward",
    "register_reward",
    "reward_names",
]
