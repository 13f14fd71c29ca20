import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

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


# -- ARENA §3.3 / §7.2 item 2: k2 vs k3 as π_θ(o_t) → 0 ---------------------------------------------


def _grad_coef(name: str, logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """d KL / d logπ_θ per token, by autograd through the registered estimator."""
    x = logp.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(get_kl(name)(x, ref).sum(), x)
    return grad


def test_gradient_coefficients_down_to_logp_minus_50():
    ref = torch.full((50,), -1.0, dtype=torch.float64)
    logp = torch.linspace(-1.0, -50.0, 50, dtype=torch.float64)  # -1, -2, ..., -50
    coef_k2 = _grad_coef("k2", logp, ref)
    coef_k3 = _grad_coef("k3", logp, ref)
    # k2: logπ_θ − logπ_ref, bit for bit (0, -1, ..., -49): linear in log space
    assert torch.equal(coef_k2, logp - ref)
    # k3: 1 − π_ref/π_θ = 1 − exp(logπ_ref − logπ_θ), to the last bit or two of float64
    torch.testing.assert_close(coef_k3, 1 - torch.exp(ref - logp), rtol=1e-14, atol=1e-14)
    # both vanish where π_θ = π_ref, both push logπ_θ up (negative coefficient) below it
    assert coef_k2[0].item() == 0.0 and coef_k3[0].item() == 0.0
    assert (coef_k2[1:] < 0).all() and (coef_k3[1:] < 0).all()
    # at logπ_θ = -50: k2's coefficient is -49, k3's about -e^49 ≈ -1.9e21
    assert coef_k2[-1].item() == -49.0
    assert coef_k3[-1].item() == pytest.approx(1 - math.exp(49), rel=1e-14)
    assert coef_k3[-1].item() == pytest.approx(-1.9073465724950998e21, rel=1e-14)
    # k2 grows by exactly 1 per unit step down; k3 by a factor → e
    assert torch.equal(coef_k2.diff(), torch.full((49,), -1.0, dtype=torch.float64))
    growth = coef_k3[20:] / coef_k3[19:-1]
    torch.testing.assert_close(growth, torch.full_like(growth, math.e), rtol=1e-8, atol=0)
    # the benchmark's headline: |coef_k3| / |coef_k2| at logπ_θ = -20 is (e^19 − 1) / 19 ≈ 9.39e6
    at20 = 19  # logp[19] == -20
    assert logp[at20].item() == -20.0
    ratio = abs(coef_k3[at20].item()) / abs(coef_k2[at20].item())
    assert ratio == pytest.approx((math.exp(19) - 1) / 19, rel=1e-12)
    assert ratio == pytest.approx(9393805.26122038, rel=1e-12)
    # float32 (what training uses) still represents k3's coefficient at -50, it does not overflow yet
    coef32 = _grad_coef("k3", logp.float(), ref.float())
    assert torch.isfinite(coef32).all()
    assert coef32[-1].item() == pytest.approx(1 - math.exp(49), rel=1e-6)


@pytest.mark.parametrize(
    ("logp", "ref", "k2", "k3"),
    [
        # δ = ref − logp
        (-3.0, -1.0, 2.0, 4.38905609893065),  # δ = 2: ½·4; e² − 2 − 1
        (-1.0, -3.0, 2.0, 1.1353352832366128),  # δ = −2: ½·4; e⁻² + 2 − 1
        (-1.5, -1.0, 0.125, 0.1487212707001282),  # δ = ½: ⅛; e^½ − ½ − 1
        (-50.0, -1.0, 1200.5, 1.9073465724950998e21),  # δ = 49: ½·2401; e⁴⁹ − 50
        (-7.0, -7.0, 0.0, 0.0),  # δ = 0
    ],
)
def test_k2_k3_closed_forms_by_hand(logp, ref, k2, k3):
    lp = torch.tensor([logp], dtype=torch.float64)
    rf = torch.tensor([ref], dtype=torch.float64)
    d = ref - logp
    assert get_kl("k2")(lp, rf).item() == pytest.approx(k2, rel=1e-15, abs=0)
    assert get_kl("k2")(lp, rf).item() == pytest.approx(0.5 * d * d, rel=1e-15, abs=0)
    assert get_kl("k3")(lp, rf).item() == pytest.approx(k3, rel=1e-14, abs=0)
    assert get_kl("k3")(lp, rf).item() == pytest.approx(math.exp(d) - d - 1, rel=1e-14, abs=0)


_logps = st.floats(min_value=-60.0, max_value=0.0, allow_nan=False)


@given(st.lists(st.tuples(_logps, _logps), min_size=1, max_size=64))
@settings(max_examples=200)
def test_k2_k3_non_negative_on_random_grids(pairs):
    for dtype in (torch.float64, torch.float32):
        logp = torch.tensor([p for p, _ in pairs], dtype=dtype)
        ref = torch.tensor([r for _, r in pairs], dtype=dtype)
        k2v = get_kl("k2")(logp, ref)
        k3v = get_kl("k3")(logp, ref)
        assert (k2v >= 0).all(), dtype
        assert (k3v >= 0).all(), dtype
        assert torch.isfinite(k2v).all() and torch.isfinite(k3v).all()
        # both are 0 exactly where the log-probs agree
        same = logp == ref
        assert (k2v[same] == 0).all() and (k3v[same] == 0).all()
    # float64: k3 − k2 = δ³/6 + δ⁴/24 + ... has the sign of δ (k3 above k2 where π_θ < π_ref)
    logp = torch.tensor([p for p, _ in pairs], dtype=torch.float64)
    ref = torch.tensor([r for _, r in pairs], dtype=torch.float64)
    d = ref - logp
    gap = get_kl("k3")(logp, ref) - get_kl("k2")(logp, ref)
    clear = d.abs() > 1e-3
    assert torch.equal(torch.sign(gap[clear]), torch.sign(d[clear]))
