import math

import pytest
import torch

from ragrl.algos import (
    aggregate,
    aggregation_names,
    engine_mismatch,
    get_advantage,
    policy_loss,
    ppo_clip_loss,
    tis_weights,
)
from ragrl.errors import RagrlError


def assert_values(t, expected, atol=1e-7):
    torch.testing.assert_close(t.detach(), torch.tensor(expected, dtype=t.dtype), atol=atol, rtol=0)


def test_ppo_clip_by_hand_on_ratios_half_one_and_one_and_a_half():
    # ratios 0.5, 1.0, 1.5 with ε = 0.2 -> clip range [0.8, 1.2]
    # A = +1: min(ρ, clip ρ) = 0.5, 1.0, 1.2 -> loss -0.5, -1.0, -1.2; ρ = 1.5 is clipped (high)
    # A = -1: min(-ρ, -clip ρ) = -0.8, -1.0, -1.5 -> loss 0.8, 1.0, 1.5; ρ = 0.5 is clipped (low)
    ratios = torch.tensor([[0.5, 1.0, 1.5], [0.5, 1.0, 1.5]], dtype=torch.float64)
    logp = ratios.log().requires_grad_(True)
    old = torch.zeros_like(ratios)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.ones_like(ratios)
    loss, m = ppo_clip_loss(logp, old, adv, mask)
    assert_values(loss, [[-0.5, -1.0, -1.2], [0.8, 1.0, 1.5]])
    # a clipped token has no gradient; otherwise d(-ρA)/dlogp = -ρA
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    assert_values(grad, [[-0.5, -1.0, 0.0], [0.0, 1.0, 1.5]])
    assert float(m["clip_frac_high"]) == pytest.approx(1 / 6)  # ρ = 1.5 with A > 0
    assert float(m["clip_frac_low"]) == pytest.approx(1 / 6)  # ρ = 0.5 with A < 0
    assert float(m["clip_frac"]) == pytest.approx(2 / 6)
    assert float(m["ratio_mean"]) == pytest.approx(1.0)
    # approx KL(old‖new), k3 in ρ: (ρ - 1) - log ρ = 0.1931472, 0, 0.0945349 (twice) -> mean 0.0958940
    assert float(m["approx_kl"]) == pytest.approx(
        (2 * (-0.5 - math.log(0.5)) + 2 * (0.5 - math.log(1.5))) / 6
    )


def test_decoupled_clip_eps_high():
    # DAPO clip-higher: ε_low = 0.2, ε_high = 0.28 -> ρ = 1.25 with A = +1 is no longer clipped
    logp = torch.tensor([[math.log(1.25)]])
    loss, m = ppo_clip_loss(logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), eps_high=0.28)
    assert loss.item() == pytest.approx(-1.25) and float(m["clip_frac"]) == 0.0
    loss, _ = ppo_clip_loss(logp, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1))
    assert loss.item() == pytest.approx(-1.2)


def test_token_mean_weights_long_sequences_more_than_seq_mean():
    # ARENA spec §7.3. Sequence 0: 1 token with loss 4; sequence 1: 3 tokens with loss 0; T = 4
    per_token = torch.tensor([[4.0, 9.0, 9.0, 9.0], [0.0, 0.0, 0.0, 9.0]], requires_grad=True)  # 9 = padding
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0]])
    # token_mean = (4 + 0 + 0 + 0) / 4 = 1; seq_mean_token_mean = (4/1 + 0/3) / 2 = 2
    # seq_mean_token_sum_norm with constant 4 = (4/4 + 0/4) / 2 = 0.5; seq_mean_token_sum = (4 + 0) / 2 = 2
    assert aggregate(per_token, mask, "token_mean").item() == pytest.approx(1.0)
    assert aggregate(per_token, mask, "seq_mean_token_mean").item() == pytest.approx(2.0)
    assert aggregate(per_token, mask, "seq_mean_token_sum_norm", constant=4).item() == pytest.approx(0.5)
    assert aggregate(per_token, mask, "seq_mean_token_sum").item() == pytest.approx(2.0)
    # the weight of each token in the scalar: token_mean 1/4 each, so the long sequence weighs 3/4;
    # seq_mean_token_mean gives the short token 1/2 and each long token 1/6, so the long one weighs 1/2
    (w_tok,) = torch.autograd.grad(aggregate(per_token, mask, "token_mean"), per_token)
    (w_seq,) = torch.autograd.grad(aggregate(per_token, mask, "seq_mean_token_mean"), per_token)
    assert_values(w_tok, [[0.25, 0, 0, 0], [0.25, 0.25, 0.25, 0]])
    assert_values(w_seq, [[0.5, 0, 0, 0], [1 / 6, 1 / 6, 1 / 6, 0]])
    assert w_tok[1].sum().item() == pytest.approx(0.75) and w_seq[1].sum().item() == pytest.approx(0.5)


def test_aggregation_errors():
    x, m = torch.ones(2, 3), torch.ones(2, 3)
    with pytest.raises(RagrlError, match="needs 'constant'"):
        aggregate(x, m, "seq_mean_token_sum_norm")
    with pytest.raises(RagrlError, match="takes no 'constant'"):
        aggregate(x, m, "token_mean", constant=3)
    with pytest.raises(RagrlError, match="unknown aggregation 'sum'; registered: seq_mean_token_mean"):
        aggregate(x, m, "sum")
    assert aggregation_names() == [
        "seq_mean_token_mean",
        "seq_mean_token_sum",
        "seq_mean_token_sum_norm",
        "token_mean",
    ]


def test_policy_loss_on_policy_and_kl():
    # μ = 1: old_logp None -> ρ = 1, loss value = -mean(A) + β·KL, gradient = -A·∇logp + β∇KL
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -1.0], [-0.5, -3.0]])
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, m = policy_loss(logp, None, adv, mask, ref_logp=ref, beta=0.5, kl="k2")
    # pg per token -1, -1, +1 (masked: 3 tokens) -> -1/3; k2 = 0, 0.5, 0 -> mean 1/6; loss = -1/3 + 0.5/6
    assert float(m["pg_loss"]) == pytest.approx(-1 / 3)
    assert float(m["kl"]) == pytest.approx(1 / 6)
    assert loss.item() == pytest.approx(-1 / 3 + 0.5 / 6)
    assert float(m["clip_frac"]) == 0.0 and float(m["ratio_mean"]) == 1.0
    with pytest.raises(RagrlError, match="needs ref_logp"):
        policy_loss(logp, None, adv, mask, beta=0.1)


def _trl_grpo_loss(logp, old, ref, adv, mask, beta, eps_low, eps_high, loss_type, max_len):
    """TRL GRPOTrainer._compute_loss, written out directly."""
    per_token_kl = torch.exp(ref - logp) - (ref - logp) - 1
    coef_1 = torch.exp(logp - old)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token_loss = -torch.min(coef_1 * adv.unsqueeze(1), coef_2 * adv.unsqueeze(1)) + beta * per_token_kl
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type in ("bnpo", "dapo"):  # dapo: / num_items_in_batch = all completion tokens (one process)
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_len)
    raise ValueError(loss_type)


def _trl_advantages(rewards, g):
    """TRL: contiguous groups of g, (r - mean) / (std + 1e-4) with torch.std (Bessel)."""
    grouped = rewards.view(-1, g)
    mean = grouped.mean(1).repeat_interleave(g)
    std = grouped.std(1).repeat_interleave(g)
    return (rewards - mean) / (std + 1e-4)


@pytest.mark.parametrize(
    ("loss_type", "agg"),
    [("grpo", "seq_mean_token_mean"), ("bnpo", "token_mean"), ("dapo", "token_mean"), ("dr_grpo", None)],
)
def test_matches_trl_on_a_random_batch(loss_type, agg):
    g = torch.Generator().manual_seed(1)
    groups, size, T = 3, 4, 7
    B = groups * size
    rewards = torch.rand(B, generator=g, dtype=torch.float64).round(decimals=1)
    group_ids = torch.arange(groups).repeat_interleave(size)
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    old = logp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3  # ratios well outside [0.8, 1.2]
    ref = logp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.5
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T) < lengths.unsqueeze(1)).to(torch.float64)
    beta, eps_low, eps_high = 0.04, 0.2, 0.28

    adv = get_advantage("grpo")(rewards, group_ids, eps=1e-4)
    trl_adv = _trl_advantages(rewards, size)
    assert torch.allclose(adv, trl_adv, atol=1e-6)

    ours_logp = logp.clone().requires_grad_(True)
    trl_logp = logp.clone().requires_grad_(True)
    kwargs = {"agg": agg} if agg else {"agg": "seq_mean_token_sum_norm", "constant": T}
    ours, _ = policy_loss(
        ours_logp,
        old,
        adv,
        mask,
        ref_logp=ref,
        beta=beta,
        kl="k3",
        eps_low=eps_low,
        eps_high=eps_high,
        **kwargs,
    )
    trl = _trl_grpo_loss(trl_logp, old, ref, trl_adv, mask, beta, eps_low, eps_high, loss_type, T)
    assert ours.item() == pytest.approx(trl.item(), abs=1e-6)
    (g_ours,) = torch.autograd.grad(ours, ours_logp)
    (g_trl,) = torch.autograd.grad(trl, trl_logp)
    assert torch.allclose(g_ours, g_trl, atol=1e-6)


def test_per_token_advantages_by_hand():
    """[B, T] advantages: on policy (ρ = 1) the token-mean loss is minus the mean advantage over the mask."""
    logp = torch.zeros(2, 3, requires_grad=True)
    adv = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    loss, _ = policy_loss(logp, None, adv, mask)
    assert loss.item() == pytest.approx(-(1 + 2 + 0.5 - 1 + 0) / 5)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.allclose(grad, -adv * mask / 5)


def test_engine_mismatch_and_truncated_importance_weights_by_hand():
    """π_old = (0.5, 0.25, -), π_engine = (0.25, 1.0, -), the third token masked: ratios 2 and 0.25."""
    old = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    engine = torch.log(torch.tensor([[0.25, 1.0, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    m = engine_mismatch(old, engine, mask)
    assert m["logprob_diff"].item() == pytest.approx((math.log(2) + math.log(4)) / 2)
    assert m["prob_diff"].item() == pytest.approx((0.25 + 0.75) / 2)
    # k3 of KL(π_engine ‖ π_old): mean of r - 1 - log r
    assert m["kl"].item() == pytest.approx(((2 - 1 - math.log(2)) + (0.25 - 1 - math.log(0.25))) / 2)
    weights, cut = tis_weights(old, engine, mask, cap=1.5)
    assert torch.allclose(weights, torch.tensor([[1.5, 0.25, 0.0]])) and cut.item() == pytest.approx(0.5)
    # the weights scale each token's policy term: on policy with advantage 2, -2 a token becomes
    # (-3, -0.5), token mean -1.75; the masked token adds nothing
    logp = torch.zeros(1, 3, requires_grad=True)
    loss, _ = policy_loss(logp, None, torch.tensor([2.0]), mask, is_weights=weights)
    assert loss.item() == pytest.approx(-1.75)
    (grad,) = torch.autograd.grad(loss, logp)
    assert torch.allclose(grad, torch.tensor([[-1.5, -0.25, 0.0]]))
    # the same engine as the trainer: no gap, nothing cut
    same = engine_mismatch(old, old, mask)
    assert all(v.item() == pytest.approx(0.0, abs=1e-7) for v in same.values())
