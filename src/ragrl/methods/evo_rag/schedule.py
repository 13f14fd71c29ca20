"""EVO-RAG's reward scheduler (spec §2.3, §2.5): the weights of the seven step rewards over an episode and
over the two curriculum stages.

**The reward (§2).** Seven per-step components (``ragrl.methods.evo_rag.rewards``) in the weight-vector
order (β, λ, γ, δ, ρ, η, κ) = (ret, act, dup, bt, ref, step, ans), combined as
``R_t = Σ_k w_k(t)·r_k(t)`` and ``R(x) = Σ_t R_t``. The weights come from ``schedule``:

* ``mode: time_dynamic`` (EVO-RAG): inside each episode ``w_k(t) = (1 − p)·early + p·late`` with
  ``p = t / 20``, where (early, late) is the stage's pair of Table 1 anchors: (Start, Mid) in
  ``stage: discovery``, (Mid, End) in ``stage: refinement`` (Interpretation A, §2.3). With
  ``shape: piecewise_episode`` every episode follows Start → Mid → End instead (Interpretation B).
* ``mode: two_stage_fixed``: the same stages with constant weights, the stage's mean (§2.5).
* ``mode: no_reward``: the answer reward alone, weight 1 (the baseline "optimises only the final answer
  correctness"; §2.5 and §8.2 item 15).
* ``keep``: the components that count (the others are logged with weight 0): a list of names or one of
  ``COMBINATIONS`` (Table 6's ``best2``, ``best3``, ``exploration``, ``efficiency``, ``full``); a single
  name is a Table 5 single-reward run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ragrl.errors import RagrlError
from ragrl.methods.evo_rag.rewards import T_MAX

COMPONENTS = ("ret", "act", "dup", "bt", "ref", "step", "ans")
"""The seven components in the weight-vector order (β, λ, γ, δ, ρ, η, κ); also the reward model's heads."""


ANCHORS: dict[str, tuple[float, float, float]] = {
    "ret": (2.0, 1.0, 0.5),
    "act": (1.5, 0.8, 0.4),
    "dup": (0.1, 0.5, 1.2),
    "bt": (0.3, 0.5, 1.0),
    "ref": (0.5, 0.5, 0.5),
    "step": (0.02, 0.05, 0.10),
    "ans": (0.05, 0.10, 1.00),
}
"""Table 1: each weight at Stage 1 Start, Mid (= Stage 2 Start) and Stage 2 End."""


COMBINATIONS: dict[str, tuple[str, ...]] = {
    "full": COMPONENTS,
    "best2": ("bt", "ans"),
    "best3": ("bt", "ans", "dup"),
    "exploration": ("ret", "dup"),
    "efficiency": ("bt", "step"),
}
"""Table 6's reward combinations."""


MODES = ("time_dynamic", "two_stage_fixed", "no_reward")


STAGES = ("discovery", "refinement")


SHAPES = ("per_stage", "piecewise_episode")


@dataclass
class ScheduleConfig:
    mode: str = "time_dynamic"
    stage: str = "discovery"
    shape: str = "per_stage"
    keep: list[str] = field(default_factory=lambda: ["full"])
    """Component names, or one name of ``COMBINATIONS``."""
    t_max: int = T_MAX
    """The horizon of p(t) = t / t_max."""

    def kept(self) -> tuple[str, ...]:
        if len(self.keep) == 1 and self.keep[0] in COMBINATIONS:
            return COMBINATIONS[self.keep[0]]
        unknown = sorted(set(self.keep) - set(COMPONENTS))
        if unknown or not self.keep:
            raise RagrlError(
                f"schedule.keep: {unknown or 'nothing'} — give component names ({', '.join(COMPONENTS)}) "
                f"or one combination ({', '.join(COMBINATIONS)})"
            )
        return tuple(k for k in COMPONENTS if k in self.keep)

    def check(self) -> None:
        for key, value, allowed in (
            ("mode", self.mode, MODES),
            ("stage", self.stage, STAGES),
            ("shape", self.shape, SHAPES),
        ):
            if value not in allowed:
                raise RagrlError(f"schedule.{key}: {value!r} is not one of {', '.join(allowed)}")
        if self.t_max < 1:
            raise RagrlError(f"schedule.t_max must be >= 1, got {self.t_max}")
        self.kept()


def step_weights(schedule: ScheduleConfig) -> dict[str, dict[str, Any]]:
    """Each component's weight settings for ``build_reward``: ``{"weight": w, "step_weight": {...}}``
    (no ``step_weight``: constant)."""
    schedule.check()
    kept = schedule.kept()
    out: dict[str, dict[str, Any]] = {}
    for k in COMPONENTS:
        start, mid, end = ANCHORS[k]
        early, late = (start, mid) if schedule.stage == "discovery" else (mid, end)
        if schedule.mode == "no_reward":
            entry: dict[str, Any] = {"weight": 1.0 if k == "ans" else 0.0}
        elif schedule.mode == "two_stage_fixed":
            entry = {"weight": (early + late) / 2 if k in kept else 0.0}
        else:
            curve = {"early": early, "late": late, "horizon": schedule.t_max}
            if schedule.shape == "piecewise_episode":
                curve = {"early": start, "mid": mid, "late": end, "horizon": schedule.t_max}
            entry = {"weight": 1.0 if k in kept else 0.0, "step_weight": curve}
        out[k] = entry
    return out


@dataclass
class RewardParams:
    """The components' settings (§2.1; literal values by default)."""

    top_k: int | None = None
    """r_ret: the passages of a search that count (None: all ``rollout.k``)."""
    novel_hits_only: bool = False
    encoder: str | None = None
    """r_dup / r_act: a local sentence-transformers directory (None: the bundled all-MiniLM-L6-v2)."""
    clip_dup_at_zero: bool = False
    log_embeddings: bool = False
    """Keep each sub-query's embedding (the r_dup encoder's) for the per-step log (``ragrl reward``)."""
    act_progress: float = 0.3
    act_dup_threshold: float = 0.0
    act_denominator: str = "t_max"
    step_cost: float = -1.0
    verifier: dict[str, Any] = field(default_factory=lambda: {"kind": "gold"})
    """r_ref's evidence-sufficiency verifier: ``{kind: gold}`` (offline proxy), ``{kind: answer}``,
    ``{kind: corpus}`` (the question's answerability, a deviation: docs/evo_rag.md), or a judge client
    spec (``{kind: openai, model, base_url, ...}``, ``{kind: local, path}``, ``cached``)."""
    variant: str = "squad"
    """r_ans's answer normalisation (squad = the HotpotQA script)."""


def reward_spec(schedule: ScheduleConfig, params: RewardParams) -> list[dict[str, Any]]:
    """The seven components as ``build_reward`` entries, in the weight-vector order."""
    p = params
    settings: dict[str, dict[str, Any]] = {
        "ret": {"top_k": p.top_k, "novel_hits_only": p.novel_hits_only},
        "act": {
            "encoder": p.encoder,
            "progress": p.act_progress,
            "dup_threshold": p.act_dup_threshold,
            "denominator": p.act_denominator,
            "t_max": schedule.t_max,
        },
        "dup": {"encoder": p.encoder, "clip_at_zero": p.clip_dup_at_zero, "log_embeddings": p.log_embeddings},
        "bt": {},
        "ref": {"verifier": dict(p.verifier)},
        "step": {"cost": p.step_cost},
        "ans": {"variant": p.variant},
    }
    weights = step_weights(schedule)
    return [{"name": f"evo_{k}", "key": k, **weights[k], **settings[k]} for k in COMPONENTS]
