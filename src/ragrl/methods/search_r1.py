"""Search-R1: the plain search agent every paper compares against.

Its tag grammar (``<think>``, ``<search>``, ``<information>``, ``<answer>``) is the core's
``ragrl.rollout.search_protocol``, which Eval-RAR, TIRESRAG-R1 and EVO-RAG extend; this module is the
method on it: its config, its format reward and ``build_method``. The prompt is our own wording
(``ragrl/methods/configs/search_r1.yaml``); only the tags and the turn structure follow the paper.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragrl.config import Method, load_method_config, to_dataclass
from ragrl.config.train import TrainConfig
from ragrl.data.schema import Example
from ragrl.rewards import build_reward
from ragrl.rewards.registry import RewardContext, register_reward
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.search_protocol import (
    SearchR1Protocol,
    SearchR1ProtocolConfig,
    search_diagnostics,
    well_formed_turn,
)
from ragrl.rollout.trajectory import Trajectory


def _default_reward() -> list[dict[str, Any]]:
    return [{"name": "em", "weight": 1.0, "variant": "squad"}, {"name": "search_r1_format", "weight": 0.0}]


@dataclass
class SearchR1Config:
    method: str = "search_r1"
    protocol: SearchR1ProtocolConfig = field(default_factory=SearchR1ProtocolConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: list[dict[str, Any]] = field(default_factory=_default_reward)
    """Weighted reward components (``ragrl.rewards.build_reward``): exact match of the final answer,
    plus an optional format term (weight 0 by default, as in Search-R1's EM recipe)."""
    train: TrainConfig = field(default_factory=TrainConfig)

    @classmethod
    def load(cls, name_or_path: str | Path = "search_r1", overrides: Any = None) -> SearchR1Config:
        return to_dataclass(cls, load_method_config(name_or_path, overrides))


@register_reward("search_r1_format")
def format_reward(trajectory: Trajectory, example: Example, ctx: RewardContext) -> float:
    """1.0 if the episode ended with an answer and every policy turn is well formed (see
    ``well_formed_turn``), else 0.0. Search-R1 gates its format bonus on the answer's correctness; here
    it is a separate, weighted component (weight 0 by default), so each part is logged on its own."""
    if trajectory.final_answer is None:
        return 0.0
    turns = [s.text for s in trajectory.segments if s.kind == "policy"]
    return float(
        bool(turns)
        and all(well_formed_turn(t, final=False) for t in turns[:-1])
        and well_formed_turn(turns[-1], final=True)
    )


def build_method(cfg: Any) -> Method:
    """The Search-R1 method from a loaded config (see ``ragrl.methods.load_method``)."""
    config = to_dataclass(SearchR1Config, cfg)
    return Method(
        name=config.method,
        config=config,
        protocol=SearchR1Protocol(config.protocol),
        rollout=config.rollout,
        reward=build_reward(config.reward),
        train=config.train,
        diagnostics=search_diagnostics,
    )
