"""R²AG: a retrieval steering model grows a Reasoning-Augmented Retrieval Tree (spec ``methods/r2ag.md``).

R²AG improves *retrieval*. At each step the steering model reads the question and the documents found so
far (``q ⊕ d̃``) and writes (§1.2)::

    <think> … </think>
    <base-Q> a single-hop sub-question for the current hop </base-Q>        (one or more)
    <predicted-Q> a next-hop question it can already guess, or none </predicted-Q>

``<base-Q> stop retrieval </base-Q>`` ends the expansion. Every query is one retrieval (top-1 in
training, top-1 or top-2 at evaluation); the queries and their documents are the tree's vertices
(``ragrl.methods.r2ag_tree``). Training rewards gold hits, not answers (Eq. 5, below); every training
sample is one steering step from a tree state, and the RR-Forest rounds (``ragrl.methods.r2ag_forest``)
carry each unfinished tree, pruned to its gold-hitting branches, into the next round.

The method's parts, one module each, in the paper's order:

* ``r2ag_protocol``: the steering prompt and grammar (§1.2), the typed record of a step, the settings;
* ``r2ag_tree``: the tree (Definition 2.1), its rollout, Top-Survivor (§2) and what a tree measured;
* ``r2ag_reward``: Eq. 5 (§3.2);
* ``r2ag_forest``: the RR-Forest rounds of Algorithm 1 (§3.3);
* ``r2ag_steering``: the gold-decomposition oracle and single-step retrieval, played through the rollout.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragrl.console import console
from ragrl.data.schema import Example
from ragrl.methods import Method, load_method_config, to_dataclass
from ragrl.methods import r2ag_reward as _registers_eq5  # noqa: F401  (Eq. 5's components)
from ragrl.methods.r2ag_forest import RRForest
from ragrl.methods.r2ag_protocol import R2agProtocol, R2agProtocolConfig, R2agRolloutConfig
from ragrl.methods.r2ag_steering import STEERERS, SteererBackend, SteeringOracle, few_shot
from ragrl.methods.r2ag_tree import tree_diagnostics  # registers rollout.kind r2ag
from ragrl.methods.train_config import TrainConfig
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
