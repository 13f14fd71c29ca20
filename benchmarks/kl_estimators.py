"""KL estimators as π_θ(o_t) → 0: ARENA's argument for k2 over k3 (arena.md §3.3, §7.2 item 2).

    .venv/bin/python benchmarks/kl_estimators.py [--ref=-1] [--logps=-1,-2,-3,-5,-10,-15,-20,-30,-40,-50]
        [--beta=0.04] [--at=-20]

A numerical sweep, not a timing: ``log π_ref`` is fixed (``--ref``) and ``log π_θ`` of the sampled
token goes down the ``--logps`` grid. For each point it prints the per-token values of the registered
``k2`` (½δ²) and ``k3`` (e^δ − δ − 1) estimators, with ``δ = log π_ref − log π_θ``, and their gradient
coefficients ``d KL / d log π_θ`` obtained by torch autograd through those same functions (float64):
``log π_θ − log π_ref`` for k2 (linear in log space) and ``1 − exp(δ)`` for k3 (exponential). The
coefficient multiplies ``∇ log π_θ`` in the loss gradient, next to the policy-gradient term ``Â``
(|Â| is a few units with group-normalised rewards), so ``β · coef`` is what the KL adds per token.

Also printed: where float32 (training precision) turns k3's coefficient into inf. The last line is the
headline: |coef_k3| / |coef_k2| at ``log π_θ = --at``.
"""

from __future__ import annotations

import argparse
import math

import torch

from ragrl.algos import get_kl

ESTIMATORS = ("k2", "k3")


def coefficients(name: str, logp: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token KL, d KL / d logp) of the registered estimator ``name``, by autograd."""
    x = logp.detach().clone().requires_grad_(True)
    value = get_kl(name)(x, ref)
    (grad,) = torch.autograd.grad(value.sum(), x)
    return value.detach(), grad


def float32_overflow(ref: float) -> float | None:
    """The largest log π_θ (on a 0.01 grid down to -200) at which float32 k3's coefficient is inf."""
    logp = torch.arange(0, -20000, -1, dtype=torch.float64) / 100 + ref
    _, grad = coefficients("k3", logp.float(), torch.full_like(logp, ref, dtype=torch.float32))
    bad = (~torch.isfinite(grad)).nonzero()
    return None if bad.numel() == 0 else logp[int(bad[0])].item()


def parse_floats(text: str) -> list[float]:
    try:
        return [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise SystemExit(f"--logps: expected comma-separated numbers, got {text!r}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ref", type=float, default=-1.0, help="log π_ref of the token (fixed)")
    parser.add_argument("--logps", default="-1,-2,-3,-5,-10,-15,-20,-30,-40,-50", help="log π_θ sweep")
    parser.add_argument("--beta", type=float, default=0.04, help="KL weight (ARENA: 0.04)")
    parser.add_argument("--at", type=float, default=-20.0, help="log π_θ of the headline ratio")
    args = parser.parse_args()
    if args.at == args.ref:
        raise SystemExit("--at must differ from --ref (both coefficients are 0 where log π_θ = log π_ref)")

    grid = parse_floats(args.logps)
    if args.at not in grid:
        grid.append(args.at)
    logp = torch.tensor(grid, dtype=torch.float64)
    ref = torch.full_like(logp, args.ref)
    values, coefs = {}, {}
    for name in ESTIMATORS:
        values[name], coefs[name] = coefficients(name, logp, ref)

    print(f"KL(π_θ‖π_ref) per token, log π_ref = {args.ref:g}, δ = log π_ref − log π_θ (float64, autograd)")
    header = [
        "log π_θ",
        "δ",
        "k2 = ½δ²",
        "k3 = e^δ−δ−1",
        "coef k2",
        "coef k3",
        "coef k3 / coef k2",
        f"β·coef k2 (β={args.beta:g})",
        f"β·coef k3 (β={args.beta:g})",
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "---:|" * len(header))
    for i, lp in enumerate(grid):
        c2, c3 = coefs["k2"][i].item() + 0.0, coefs["k3"][i].item() + 0.0  # + 0.0: no "-0"
        ratio = f"{abs(c3) / abs(c2):.4g}" if c2 != 0 else "—"
        cells = [
            f"{lp:g}",
            f"{args.ref - lp:g}",
            f"{values['k2'][i].item():.6g}",
            f"{values['k3'][i].item():.4g}",
            f"{c2:.6g}",
            f"{c3:.4g}",
            ratio,
            f"{args.beta * c2 + 0.0:.4g}",
            f"{args.beta * c3 + 0.0:.4g}",
        ]
        print("| " + " | ".join(cells) + " |")
    overflow = float32_overflow(args.ref)
    if overflow is None:
        print("float32: k3's coefficient stays finite down to log π_θ = -200")
    else:
        ln_max = math.log(torch.finfo(torch.float32).max)
        print(
            f"float32: k3's coefficient is inf from log π_θ = {overflow:.2f} down "
            f"(δ = {args.ref - overflow:.2f} > ln(float32 max) ≈ {ln_max:.2f}); k2's is finite everywhere"
        )
    i = grid.index(args.at)
    headline = abs(coefs["k3"][i].item()) / abs(coefs["k2"][i].item())
    where = f"log π_θ = {args.at:g}, log π_ref = {args.ref:g}"
    print(f"k3/k2 KL gradient-coefficient ratio |coef_k3|/|coef_k2| at {where}: {headline:.4g}")


if __name__ == "__main__":
    main()
