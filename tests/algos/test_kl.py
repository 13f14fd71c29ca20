import math

import pytest
import torch

from ragrl.algos import get_kl, kl_names
from ragrl.errors import RagrlError


def test_values_by_hand():
    # logp = -1.0, ref = -1.2: logp - ref = 0.2, d = ref - logp = -0.2
    # k1 = 0.2; k2 = 0.5 * 0.04 = 0.02; k3 = exp(-0.2) + 0.2 - 1 = 0.8187308 - 0.8 = 0.0187308
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    ref = torch.tensor([-1.2, -1.0, -0.5], dtype=torch.float64)
    # second point: logp - ref = -1, d = 1: k1 = -1, k2 = 0.5, k3 = e - 1 - 1 = 0.7182818
    assert get_kl("k1")(logp, ref).tolist() == pytest.approx([0.2, -1.0, 0.0])
    assert get_kl("k2")(logp, ref).tolist() == pytest.approx([0.02, 0.5, 0.0])
    assert get_kl("k3")(logp, ref).tolist() == pytest.approx([0.0187308, 0.7182818, 0.0], abs=1e-7)
    assert get_kl("abs")(logp, ref).tolist() == pytest.approx([0.2, 1.0, 0.0])
    # TRL's literal formula
    d = ref - logp
    assert torch.allclose(get_kl("k3")(logp, ref), torch.exp(d) - d - 1, atol=1e-15)
    # verl aliases
    assert (
        get_kl("low_var_kl") is get_kl("k3")
        and get_kl("mse") is get_kl("k2")
        and get_kl("kl") is get_kl("k1")
    )


def test_k2_and_k3_are_never_negative_even_at_float32_rounding():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(10_000, generator=g) * 20
    ref = -torch.rand(10_000, generator=g) * 20
    small = -torch.rand(10_000, generator=g)
    near = small + torch.randn(10_000, generator=g) * 1e-7  # |d| near float32 epsilon
    for name in ("k2", "k3"):
        assert (get_kl(name)(logp, ref) >= 0).all(), name
        assert (get_kl(name)(small, near) >= 0).all(), name
    # the literal exp(d) - d - 1 does go negative there; expm1(d) - d does not
    d = near - small
    assert (torch.exp(d) - d - 1 < 0).any()


def test_k3_clamps_like_verl():
    logp = torch.tensor([-30.0, -1.0])
    ref = torch.tensor([-1.0, -1.0])
    assert get_kl("k3")(logp, ref)[0].item() > 1e12  # exp(29) - 30
    clamped = get_kl("k3")(logp, ref, clamp=10.0, log_ratio_clamp=20.0)
    assert clamped.tolist() == [10.0, 0.0]


def test_gradient_coefficient_sweep_k3_explodes_k2_linear():
    # ARENA spec §7.2: ref fixed at -1, logp swept from -1 down to -30.
    ref = torch.full((30,), -1.0, dtype=torch.float64)
    logp = torch.linspace(-1.0, -30.0, 30, dtype=torch.float64, requires_grad=True)
    coefs = {}
    for name in ("k1", "k2", "k3"):
        (grad,) = torch.autograd.grad(get_kl(name)(logp, ref).sum(), logp)
        coefs[name] = grad
    x = logp.detach()
    assert torch.allclose(coefs["k1"], torch.ones_like(x))
    # k2: d/dlogp ½(logp - ref)² = logp - ref: 0, -1, ..., -29, equal steps (linear)
    assert torch.allclose(coefs["k2"], x - ref)
    assert torch.allclose(coefs["k2"].diff(), torch.full((29,), -1.0, dtype=torch.float64))
    # k3: d/dlogp [exp(ref - logp) - (ref - logp) - 1] = 1 - exp(ref - logp)
    assert torch.allclose(coefs["k3"], 1 - torch.exp(ref - x))
    # ... which explodes exponentially: each unit step down in logp multiplies it by about e
    growth = coefs["k3"][10:] / coefs["k3"][9:-1]
    assert torch.allclose(growth, torch.full_like(growth, math.e), rtol=1e-4)
    assert coefs["k3"][-1].item() == pytest.approx(1 - math.exp(29))  # ≈ -3.9e12
    assert abs(coefs["k3"][-1].item()) > 1e10 * abs(coefs["k2"][-1].item())
    # a binding verl clamp zeroes the gradient rather than bounding it
    (clamped,) = torch.autograd.grad(get_kl("k3")(logp, ref, clamp=10.0).sum(), logp)
    assert clamped[-1].item() == 0.0


def test_registry():
    assert kl_names() == ["abs", "k1", "k2", "k3", "kl", "low_var_kl", "mse"]
    with pytest.raises(RagrlError, match=r"unknown KL estimator 'k4'; registered: abs, k1"):
        get_kl("k4")
