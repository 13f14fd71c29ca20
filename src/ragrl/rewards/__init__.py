"""Rewards: a registry of named components and their weighted composition (``build_reward``)."""

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
