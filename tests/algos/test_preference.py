"""Preference losses: hand-worked values, and equality with TRL's ``DPOTrainer.dpo_loss`` formulas."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ragrl.algos import dpo_loss
from ragrl.errors import RagrlError


def _trl_dpo_loss(
    chosen, rejected, ref_chosen, ref_rejected, beta, loss_type, label_smoothing, reference_free
):
    """TRL's ``DPOTrainer.dpo_loss`` (trl/trainer/dpo_trainer.py, f-divergence "reverse_kl"), transcribed."""
    logratios = chosen - rejected
    ref_logratios = torch.tensor([0], dtype=logratios.dtype) if reference_free else ref_chosen - ref_rejected
    logits = logratios - ref_logratios
    if loss_type == "sigmoid":
        losses = (
            -F.logsigmoid(beta * logits) * (1 - label_smoothing)
            - F.logsigmoid(-beta * logits) * label_smoothing
        )
    elif loss_type == "robust":
        losses = (
            -F.logsigmoid(beta * logits) * (1 - label_smoothing)
            + F.logsigmoid(-beta * logits) * label_smoothing
        ) / (1 - 2 * label_smoothing)
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * logits)
    elif loss_type == "ipo":
        losses = (logits - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(loss_type)
    chosen_rewards = beta * (chosen - ref_chosen).detach()
    rejected_rewards = beta * (rejected - ref_rejected).detach()
    return losses, chosen_rewards, rejected_rewards


@pytest.mark.parametrize("loss_type", ["sigmoid", "robust", "hinge", "ipo"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reference_free", [False, True])
def test_matches_trl_on_random_tensors(loss_type, label_smoothing, reference_free):
    g = torch.Generator().manual_seed(7)
    B = 16
    chosen, rejected, ref_chosen, ref_rejected = (
        -torch.rand(B, generator=g, dtype=torch.float64) * 40 for _ in range(4)
    )
    beta = 0.1
    ours_in = chosen.clone().requires_grad_(True), rejected.clone().requires_grad_(True)
    trl_in = chosen.clone().requires_grad_(True), rejected.clone().requires_grad_(True)
    ours = dpo_loss(*ours_in, ref_chosen, ref_rejected, beta=beta, loss_type=loss_type,
                    label_smoothing=label_smoothing, reference_free=reference_free)  # fmt: skip
    trl = _trl_dpo_loss(*trl_in, ref_chosen, ref_rejected, beta, loss_type, label_smoothing, reference_free)
    for a, b in zip(ours, trl, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)
    grads_ours = torch.autograd.grad(ours[0].mean(), ours_in)
    grads_trl = torch.autograd.grad(trl[0].mean(), trl_in)
    for a, b in zip(grads_ours, grads_trl, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_hand_worked_values():
    # the policy prefers the chosen response by 2 nats more than the reference does: logits = 2
    chosen, rejected = torch.tensor([-10.0]), torch.tensor([-14.0])
    ref_chosen, ref_rejected = torch.tensor([-11.0]), torch.tensor([-13.0])
    loss, rc, rr = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.5)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-1.0)), abs=1e-7)  # -log σ(0.5 · 2)
    assert (rc.item(), rr.item()) == pytest.approx((0.5, -0.5))
    # equal preference: every sigmoid loss is log 2, the IPO loss (0 - 1/(2β))² = 1
    same = dpo_loss(chosen, chosen, chosen, chosen, beta=0.5)[0]
    assert same.item() == pytest.approx(math.log(2), abs=1e-7)
    assert dpo_loss(chosen, chosen, chosen, chosen, beta=0.5, loss_type="ipo")[0].item() == pytest.approx(1.0)
    # reference-free: logits = -10 - (-14) = 4; hinge relu(1 - 0.5 · 4) = 0
    assert (
        dpo_loss(chosen, rejected, None, None, beta=0.5, loss_type="hinge", reference_free=True)[0].item()
        == 0.0
    )


def test_bad_arguments_are_clear_errors():
    x = torch.zeros(2)
    with pytest.raises(RagrlError, match="unknown preference loss 'dpo'"):
        dpo_loss(x, x, x, x, loss_type="dpo")
    with pytest.raises(RagrlError, match="beta > 0"):
        dpo_loss(x, x, x, x, beta=0.0)
    with pytest.raises(RagrlError, match="reference log-probs"):
        dpo_loss(x, x, None, None)
    with pytest.raises(RagrlError, match="label_smoothing < 0.5"):
        dpo_loss(x, x, x, x, loss_type="robust", label_smoothing=0.5)
