"""The trainer ``ragrl train`` runs for a method: ``train.algo`` names it."""

from __future__ import annotations

from typing import Any

from ragrl.config import Method
from ragrl.config.train import TrainConfig
from ragrl.train.learnable import check_learnable


def make_trainer(method: Method, config: TrainConfig, **kwargs: Any) -> Any:
    """``grpo``: ``GRPOTrainer`` (policy-gradient steps); ``cycles``: ``CycleTrainer`` (sibling
    candidates, a reward model and DPO each cycle)."""
    if config.algo == "cycles":
        from ragrl.train.cycles import CycleTrainer

        return CycleTrainer(method, config, **kwargs)
    from ragrl.train.grpo import GRPOTrainer

    return GRPOTrainer(method, config, **kwargs)


def check_trainable(method: Method) -> None:
    """Before any model is loaded: a GRPO run whose reward can never vary is refused."""
    if method.train.algo == "grpo":
        check_learnable(method)
