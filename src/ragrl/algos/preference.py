"""Preference losses on (chosen, rejected) pairs: DPO and its variants, as pure functions by name.

Every loss takes the summed log-probs of each response under the policy and under the reference
(``[B]`` each) and returns the per-pair loss ``[B]`` plus the implicit rewards
``β · (log π_θ(y) − log π_ref(y))`` of the chosen and rejected responses (detached), as TRL's
``DPOTrainer.dpo_loss`` does. With
``logits = (log π_θ(y_w) − log π_θ(y_l)) − (log π_ref(y_w) − log π_ref(y_l))``:

* ``sigmoid`` (DPO, Rafailov et al. 2023; conservative DPO with ``label_smoothing`` ε):
  ``−(1−ε)·log σ(β·logits) − ε·log σ(−β·logits)``;
* ``robust`` (rDPO): ``(−(1−ε)·log σ(β·logits) + ε·log σ(−β·logits)) / (1 − 2ε)``;
* ``hinge`` (SLiC): ``relu(1 − β·logits)``;
* ``ipo`` (Azar et al. 2023, Eq. 17): ``(logits − 1/(2β))²``.

``reference_free=True`` drops the reference log-ratio (a reference that gives every response the same
probability; EVO-RAG's reference-free DPO). ``tests/algos/test_preference.py`` checks every loss against
TRL's ``DPOTrainer.dpo_loss`` (its 0.x form, written out in the test) on random tensors. TRL 1.16
computes the same losses inline, with two differences: its ``sigmoid`` has no label smoothing (use
``robust`` or ``label_smoothing: 0``), and IPO takes per-token mean log-probs, which
``ragrl.train.dpo`` passes for ``ipo``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ragrl.errors import RagrlError
from ragrl.registry import Registry

PreferenceFn = Callable[[Tensor, float, float], Tensor]
"""``fn(logits, beta, label_smoothing) -> losses [B]``."""

PREFERENCE_LOSSES: Registry[PreferenceFn] = Registry("preference loss")
register_preference_loss = PREFERENCE_LOSSES.register
preference_loss_names = PREFERENCE_LOSSES.names


@register_preference_loss("sigmoid")
def sigmoid_loss(logits: Tensor, beta: float, label_smoothing: float) -> Tensor:
    return (
        -F.logsigmoid(beta * logits) * (1 - label_smoothing) - F.logsigmoid(-beta * logits) * label_smoothing
    )


@register_preference_loss("robust")
def robust_loss(logits: Tensor, beta: float, label_smoothing: float) -> Tensor:
    if not 0 <= label_smoothing < 0.5:
        raise RagrlError(f"the robust DPO loss needs 0 <= label_smoothing < 0.5, got {label_smoothing}")
    num = (
        -F.logsigmoid(beta * logits) * (1 - label_smoothing) + F.logsigmoid(-beta * logits) * label_smoothing
    )
    return num / (1 - 2 * label_smoothing)


@register_preference_loss("hinge")
def hinge_loss(logits: Tensor, beta: float, label_smoothing: float) -> Tensor:
    return torch.relu(1 - beta * logits)


@register_preference_loss("ipo")
def ipo_loss(logits: Tensor, beta: float, label_smoothing: float) -> Tensor:
    return (logits - 1 / (2 * beta)) ** 2


def dpo_loss(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor | None,
    ref_rejected_logps: Tensor | None,
    *,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    reference_free: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-pair preference loss ``[B]`` and the chosen / rejected implicit rewards (see the module
    docstring). The reference log-probs may be None only with ``reference_free``; the rewards then
    use a reference of 0."""
    if beta <= 0:
        raise RagrlError(f"the preference loss needs beta > 0, got {beta}")
    fn = PREFERENCE_LOSSES.get(loss_type)
    if ref_chosen_logps is None or ref_rejected_logps is None:
        if not reference_free:
            raise RagrlError("the preference loss needs the reference log-probs unless reference_free")
        ref_chosen_logps = torch.zeros_like(chosen_logps)
        ref_rejected_logps = torch.zeros_like(rejected_logps)
    logratios = chosen_logps - rejected_logps
    ref_logratios = torch.zeros_like(logratios) if reference_free else ref_chosen_logps - ref_rejected_logps
    losses = fn(logratios - ref_logratios, beta, label_smoothing)
    chosen_rewards = beta * (chosen_logps - ref_chosen_logps).detach()
    rejected_rewards = beta * (rejected_logps - ref_rejected_logps).detach()
    return losses, chosen_rewards, rejected_rewards
