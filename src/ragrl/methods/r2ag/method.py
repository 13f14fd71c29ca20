"""R²AG as a method: its config (``ragrl/methods/configs/r2ag.yaml``, ``r2ag-tiny.yaml``), its scripted
steering policies and few-shot protocol, the RR-Forest task source, and ``build_method``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragrl.config import Method, load_method_config, to_dataclass
from ragrl.config.train import TrainConfig
from ragrl.console import console
from ragrl.data.schema import Example
from ragrl.methods.r2ag import rewards as _registers_eq5  # noqa: F401  (Eq. 5's components)
from ragrl.methods.r2ag import rollout as _registers_rollout  # noqa: F401  (rollout.kind r2ag)
from ragrl.methods.r2ag.forest import RRForest
from ragrl.methods.r2ag.protocol import R2agProtocol, R2agProtocolConfig, R2agRolloutConfig
from ragrl.methods.r2ag.steering import STEERERS, SteererBackend, SteeringOracle, few_shot
from ragrl.methods.r2ag.tree import tree_diagnostics
from ragrl.rewards import build_reward


def _default_reward() -> list[dict[str, Any]]:
    return [
        {"name": "r2ag_multi_hit", "weight": 0.2, "pred_weight": 1.25},
        {"name": "r2ag_joint_hit", "weight": 0.3},
        {"name": "r2ag_ap", "weight": 0.2, "t_base": 4, "t_pred": 2},
        {"name": "r2ag_format", "weight": 1.0, "per_tag": 0.01, "cap": 0.02},
    ]


# --- config and method ---------------------------------------------------------------------------------


@dataclass
class R2agConfig:
    method: str = "r2ag"
    protocol: R2agProtocolConfig = field(default_factory=R2agProtocolConfig)
    rollout: R2agRolloutConfig = field(default_factory=R2agRolloutConfig)
    reward: list[dict[str, Any]] = field(default_factory=_default_reward)
    """Eq. 5: α·R_MH + β·R_JH + γ·R_AP + ω·R_f with α, β, γ = 0.2, 0.3, 0.2 and max ω·R_f = 0.02."""
    train: TrainConfig = field(default_factory=TrainConfig)

    @classmethod
    def load(cls, name_or_path: str | Path = "r2ag", overrides: Any = None) -> R2agConfig:
        return to_dataclass(cls, load_method_config(name_or_path, overrides))


def with_gold_in_corpus(examples: list[Example], where: str) -> list[Example]:
    """The questions R²AG trains and is scored on: those with gold documents (``supporting_ids``) that
    are not marked unanswerable. The synthetic world marks the questions whose evidence it removed from
    the corpus (``metadata.answerable: false``); they have no complete tree, so they are left out, and
    the count is reported. The index itself is not consulted: gold missing from it lowers recall."""
    kept = [e for e in examples if e.supporting_ids and e.answerable]
    if len(kept) < len(examples):
        console.print(
            f"{where}: R²AG leaves out {len(examples) - len(kept)} of {len(examples)} questions without gold "
            "documents in the corpus (no supporting_ids, or marked unanswerable)"
        )
    return kept


def _scripted(tokenizer: Any, cls: Any) -> Any:
    return SteererBackend(tokenizer, cls())


def build_method(cfg: Any) -> Method:
    """R²AG from a loaded config (``ragrl.methods.load_method``)."""
    config = to_dataclass(R2agConfig, cfg)
    return Method(
        name=config.method,
        config=config,
        protocol=R2agProtocol(config.protocol),
        rollout=config.rollout,
        eval_rollout=config.rollout.for_evaluation(),
        reward=build_reward(config.reward),
        train=config.train,
        diagnostics=tree_diagnostics,
        oracle=SteeringOracle(),
        scripted={name: functools.partial(_scripted, cls=cls) for name, cls in STEERERS.items()},
        prepare=with_gold_in_corpus,
        few_shot=few_shot,
        task_source=functools.partial(
            RRForest, max_rounds=config.rollout.rounds or config.rollout.max_iterations
        ),
    )
