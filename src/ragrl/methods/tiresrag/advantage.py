"""TIRESRAG-R1's advantage estimator ``tiresrag`` (the consistency penalty and the difficulty weight) and
the step diagnostics that read whole groups.

**Advantages (§2.8, §3.1, §3.2)**, the estimator ``tiresrag``:

    A_i  = (R_i − mean_g R) / std_g R                         group z-score of R_sum
    P_i  = −λ_p · z^A_i · s_T z^T_i · s_S z^S_i   if that product is < 0, else 0
    A'_i = (A_i − P_i) · W(mean_g R^S)                        W(ρ) = 0.4 + 1.1 / (1 + exp(10 (ρ − 0.75)))

z^A, z^T, z^S are the group z-scores of the raw answer, thinking and sufficiency rewards, with the
population std and ε = 1e-8 as the code's ``compute_consistency_penalty`` (``penalty_std``,
``penalty_eps``), whatever ``std`` and ``eps`` the advantage A_i uses: the code's own A_i takes the sample
std and ε = 1e-9 (``std: sample, eps: 1.0e-9`` reproduces it). ``penalty: paper`` uses s_T = s_S = 1
(Eq. 7 with its typo A^T·A^T corrected to A^S·A^T, §8 Q2);
``penalty: code`` scales them by the components' weights in force, s_T = 0.6 a_t and s_S = 0.3 a_t, as
``compute_consistency_penalty`` does (0.018 a_t² |z^A z^T z^S| at the paper's weights). A group whose
R^S or R^T are all equal gets no penalty. ``difficulty: false`` drops W (the "w/o difficulty"
ablation). ``baseline: reinforce_pp`` is the code's Reinforce++ path (§3.6): A = r − mean_g, minus the
penalty, no W, then normalised over the update batch after the filter (``train.grpo.whiten: token``,
which the config must set).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ragrl.algos.advantages import batch_groups, difficulty_weight, grpo, grpo_mean_only, register_advantage
from ragrl.algos.filters import saturated_groups
from ragrl.config.train import TrainConfig
from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.methods.tiresrag.rewards import answer_right
from ragrl.rewards.registry import RewardResult
from ragrl.rollout.trajectory import Trajectory


def step_diagnostics(
    trajectories: Sequence[Trajectory],
    examples: Sequence[Example],
    results: Sequence[RewardResult],
    config: TrainConfig,
    *,
    answer: str = "tiresrag_answer",
    sufficiency: str = "tiresrag_sufficiency",
) -> dict[str, float]:
    """What the authors tracked over a step (§7.1 "Logging") that needs whole groups or the rewards:

    * ``filter/low_frac``, ``filter/high_frac``: the shares of groups whose answer F1 are all ≤ low or all
      ≥ high (with ``drop_saturated`` on: its thresholds on the component it reads, so the shares it
      drops; otherwise 0.1 and 0.9 on answer F1, the shares it would drop);
    * ``suff/correct_sufficient`` (and the three other cells): the correct × sufficient 2×2 as shares of
      the episodes; correct is cover-EM of the final answer, sufficient is R^S ≥ 0.5;
    * with ``advantage: tiresrag``: the difficulty weight W of the groups (``adv/W_mean``, ``_min``,
      ``_max``) and the consistency penalty A^P of the episodes (``adv/penalty_mean``, ``_max``, and
      ``adv/penalty_share``, the share it touches), as the update used them.
    """
    out: dict[str, float] = {}
    if not results:
        return out
    group_ids = torch.tensor([t.metadata["group"] for t in trajectories])
    totals = torch.tensor([r.total for r in results], dtype=torch.float32)
    components = {
        key: torch.tensor([r.components[key] for r in results], dtype=torch.float32)
        for key in results[0].components
    }
    grpo_config = config.grpo
    edges, on = {"low": 0.1, "high": 0.9}, answer
    if grpo_config.group_filter == "drop_saturated":
        edges.update(grpo_config.group_filter_params)
        on = grpo_config.group_filter_on
    scores = totals if on == "total" else components.get(on)
    if scores is not None:
        below, above = saturated_groups(scores, group_ids, **edges)
        out["filter/low_frac"] = float(below.float().mean())
        out["filter/high_frac"] = float(above.float().mean())
    if sufficiency in components:
        correct = [
            answer_right(t.final_answer, e.answers) for t, e in zip(trajectories, examples, strict=True)
        ]
        sufficient = [r.components[sufficiency] >= 0.5 for r in results]
        for c_name, c in (("correct", True), ("wrong", False)):
            for s_name, s in (("sufficient", True), ("insufficient", False)):
                cell = [x == c and y == s for x, y in zip(correct, sufficient, strict=True)]
                out[f"suff/{c_name}_{s_name}"] = sum(cell) / len(cell)
    if grpo_config.advantage == "tiresrag":
        params = grpo_config.advantage_params
        terms = advantage_terms(
            totals, group_ids, components=components, weights=results[0].weights, **params
        )
        _, groups = batch_groups(totals, group_ids)
        w, pen = groups.mean(terms["weight"]), terms["penalty"]
        out.update({"adv/W_mean": float(w.mean()), "adv/W_min": float(w.min()), "adv/W_max": float(w.max())})
        out.update({"adv/penalty_mean": float(pen.mean()), "adv/penalty_max": float(pen.max()),
                    "adv/penalty_share": float((pen > 0).float().mean())})  # fmt: skip
    return out


PENALTY_MODES = ("paper", "code", "none")

BASELINES = ("grpo", "reinforce_pp")

STDS = ("population", "sample")


def consistency_penalty(
    z_answer: Tensor, z_thinking: Tensor, z_sufficiency: Tensor, *, lam: float = 0.1
) -> Tensor:
    """``A^P = −λ_p · zA · zT · zS`` where that product is negative, else 0 (so ``A^P ≥ 0``)."""
    product = z_answer * z_thinking * z_sufficiency
    return torch.where(product < 0, -lam * product, torch.zeros_like(product))


def advantage_terms(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    components: Mapping[str, Tensor],
    weights: Mapping[str, float] | None = None,
    answer: str = "tiresrag_answer",
    thinking: str = "tiresrag_thinking",
    sufficiency: str = "tiresrag_sufficiency",
    baseline: str = "grpo",
    penalty: str = "paper",
    lam: float = 0.1,
    difficulty: bool | None = None,
    weight_a: float = 0.4,
    weight_b: float = 1.5,
    rho0: float = 0.75,
    k: float = 10.0,
    std: str = "population",
    eps: float = 1e-8,
    penalty_std: str = "population",
    penalty_eps: float = 1e-8,
) -> dict[str, Tensor]:
    """The advantage and its parts, per rollout: ``advantage``, the consistency ``penalty`` A^P (0 where
    off) and the difficulty ``weight`` W of its group (1 where off). ``answer``, ``thinking`` and
    ``sufficiency`` name the reward components (their reporting keys) the estimator reads.

    ``baseline: grpo`` is the group z-score; ``reinforce_pp`` is the code's Reinforce++ path, r − mean_g
    (its normalisation over the update batch is the trainer's ``train.grpo.whiten``, after the filter).
    ``difficulty`` (W) defaults to on for ``grpo`` and off for ``reinforce_pp``, as the code. ``std`` and
    ``eps`` are A_i's group z-score; ``penalty_std`` and ``penalty_eps`` the penalty's (the code's
    ``np.std``, population, + 1e-8, whatever A_i uses)."""
    if baseline not in BASELINES:
        raise RagrlError(f"advantage_params.baseline must be one of {BASELINES}, got {baseline!r}")
    for key, value in (("std", std), ("penalty_std", penalty_std)):
        if value not in STDS:
            raise RagrlError(f"advantage_params.{key} must be one of {STDS}, got {value!r}")
    if penalty not in PENALTY_MODES:
        raise RagrlError(f"advantage_params.penalty must be one of {PENALTY_MODES}, got {penalty!r}")
    if difficulty is None:  # the code's Reinforce++ path has no W
        difficulty = baseline == "grpo"
    wanted: dict[str, str] = {}
    if penalty != "none":
        wanted.update(answer=answer, thinking=thinking, sufficiency=sufficiency)
    if difficulty:
        wanted["sufficiency"] = sufficiency
    missing = [f"{role}={key!r}" for role, key in wanted.items() if key not in components]
    if missing:
        raise RagrlError(
            f"the tiresrag advantage reads the reward components {', '.join(missing)}, which the reward "
            f"does not have (it has {', '.join(map(repr, components)) or 'none'})"
        )
    r, groups = batch_groups(rewards, group_ids)

    def z(x: Tensor, std: str, eps: float) -> Tensor:  # the group z-score (0 in a group of equal values)
        return grpo(x.to(r), group_ids, std=std, eps=eps)

    advantage = z(r, std, eps) if baseline == "grpo" else grpo_mean_only(r, group_ids)
    pen = torch.zeros_like(r)
    if penalty != "none":
        z_a, z_t, z_s = (
            z(components[key], penalty_std, penalty_eps) for key in (answer, thinking, sufficiency)
        )
        if penalty == "code":
            if weights is None or thinking not in weights or sufficiency not in weights:
                raise RagrlError("penalty: code scales by the components' weights in force; none were given")
            z_t, z_s = weights[thinking] * z_t, weights[sufficiency] * z_s
        pen = consistency_penalty(z_a, z_t, z_s, lam=lam)
        advantage = advantage - pen
    w = torch.ones_like(r)
    if difficulty:
        rho = groups.mean(components[sufficiency].to(r))
        w = difficulty_weight(rho, a=weight_a, b=weight_b, rho0=rho0, k=k).to(r)[groups.inverse]
        advantage = advantage * w
    return {"advantage": advantage, "penalty": pen, "weight": w}


@register_advantage("tiresrag")
def tiresrag_advantage(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    components: Mapping[str, Tensor],
    weights: Mapping[str, float] | None = None,
    **params: Any,
) -> Tensor:
    """``A' = (A − A^P) · W(mean_g R^S)`` over each group (module docstring; ``advantage_terms`` takes
    the parameters)."""
    accepted = [p for p in inspect.signature(advantage_terms).parameters if p not in ("rewards", "group_ids")]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise RagrlError(f"advantage_params: the tiresrag advantage takes no {unknown} (it takes {accepted})")
    return advantage_terms(rewards, group_ids, components=components, weights=weights, **params)["advantage"]


tiresrag_advantage.__signature__ = inspect.signature(advantage_terms)  # type: ignore[attr-defined]
