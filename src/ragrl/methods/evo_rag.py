"""EVO-RAG: a query-rewriting agent trained on scheduled step rewards (spec ``methods/evo-rag.md``).

**The agent (§1).** At every step the policy writes, after an optional ``<think>`` block, exactly one
action: ``<search>sub-query</search>`` (the retriever's passages come back in ``<information>``),
``<backtrack/>`` (the last step and its evidence leave the context; the step count goes on;
``<backtrack>k</backtrack>`` goes back to just before step k of the context, ``ragrl.rollout.backtrack``;
with nothing to take back it is invalid),
``<answer>span</answer>`` or ``<refuse/>`` (both end the episode; a refusal's answer is
``protocol.refusal_answer``, the synthetic world's answer to an unanswerable question). Text with no
action tag, or with tags of two kinds, is an invalid step: it is counted, answered with a corrective,
and costs a step. The episode is capped at T_max = 20 steps (``rollout.max_turns``); a truncated
episode gets one forced answer turn (``rollout.final_answer_turn``) and is logged as truncated.
``rollout.kind: stepwise`` trains each step on the context the policy saw.

**The reward (§2).** Seven per-step components (``ragrl.methods.evo_rag_rewards``) in the weight-vector
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

Training (rollouts with sibling candidates, preference pairs, the multi-head reward model, DPO cycles
and the two curriculum stages) lives in ``ragrl.methods.evo_rag_train``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragrl.data.schema import Example
from ragrl.errors import DataError, RagrlError
from ragrl.methods import Method, load_method_config, to_dataclass
from ragrl.methods.evo_rag_rewards import T_MAX, check_verifier, step_log
from ragrl.methods.search_r1 import SearchR1Protocol, SearchR1ProtocolConfig
from ragrl.methods.train_config import TrainConfig
from ragrl.rewards import build_reward
from ragrl.rollout.engine import RolloutConfig
from ragrl.rollout.protocol import find_spans, squash_ws
from ragrl.rollout.trajectory import Action, Trajectory

# --- the scheduler (§2.3, §2.5) -------------------------------------------------------------------------

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


# --- the protocol (§1.6) --------------------------------------------------------------------------------

DEFAULT_USER = (
    "Answer the multi-hop question below by searching a Wikipedia index one step at a time. At every "
    "step, think briefly inside <think> and </think>, then write exactly one action: <search> a short, "
    "self-contained sub-query </search> to retrieve passages, which are shown to you between "
    "<information> and </information>; <backtrack/> to drop your last step and its passages; <answer> "
    "a short answer </answer> once the passages suffice; or <refuse/> when they cannot answer the "
    "question. Do not repeat earlier sub-queries.\nQuestion: {question}"
)


@dataclass
class EvoRagProtocolConfig(SearchR1ProtocolConfig):
    """Search-R1's prompt, passages and corrective settings, with EVO-RAG's wording and two more."""

    user: str = DEFAULT_USER
    corrective: str = (
        "\nThat was not a valid action ({error}). Write one of <search> query </search>, <backtrack/>, "
        "<answer> answer </answer> or <refuse/>.\n"
    )
    answer_now: str = (
        "\nThat was the last search step. Answer now with <answer> answer </answer> or <refuse/>.\n"
    )
    """Said before the forced answer turn of an episode that reached T_max (``final_answer_turn``)."""
    refusal_answer: str = "unknown"
    """The final answer an episode that refuses is scored with (the synthetic world's answer to an
    unanswerable question); r_ans is 0 for a refusal either way."""


MARKERS = {"backtrack": "<backtrack/>", "refuse": "<refuse/>"}


class EvoRagProtocol(SearchR1Protocol):
    """Search-R1's protocol (prompt, passages, corrective, env spans) with EVO-RAG's four actions."""

    name = "evo_rag"
    backtracks = True
    stop = ("</search>", "</answer>", "<backtrack/>", "</backtrack>", "<refuse/>")

    def __init__(self, config: EvoRagProtocolConfig | None = None) -> None:
        super().__init__(config or EvoRagProtocolConfig())
        if self.config.empty_answer != "invalid":
            raise RagrlError("protocol.empty_answer: EVO-RAG's strict parse keeps an empty answer invalid")
        self.final_turn_note = self.config.answer_now

    def parse(self, text: str, turn: int) -> Action:
        """Strict: only the text after the last ``</think>`` counts; it must hold action tags of exactly
        one kind (the last one of that kind is taken)."""
        if not isinstance(text, str):
            return Action("invalid", turn=turn, error="no text")
        head, closed, tail = text.rpartition("</think>")
        if not closed and "<think>" in text:
            return Action("invalid", turn=turn, error="unclosed <think>")
        body = tail if closed else text
        found: dict[str, str | None] = {}
        for tag in self.action_tags:
            spans = find_spans(body, tag)
            if spans:
                found[tag] = squash_ws(spans[-1].content)
        for kind, marker in MARKERS.items():
            if marker in body:
                found[kind] = None
        numbered = find_spans(body, "backtrack")  # <backtrack>k</backtrack>: back to before step k
        if numbered and numbered[-1].start > body.rfind(MARKERS["backtrack"]):
            k = squash_ws(numbered[-1].content)
            if not (k.isdigit() and int(k) >= 1):
                return Action(
                    "invalid", turn=turn, error="<backtrack>k</backtrack> takes a step number k >= 1"
                )
            found["backtrack"] = k
        if not found:
            return Action("invalid", turn=turn, error="no action tag")
        if len(found) > 1:
            return Action("invalid", turn=turn, error=f"more than one action ({', '.join(found)})")
        kind, content = next(iter(found.items()))
        if kind in self.action_tags and not content:
            return Action("invalid", turn=turn, error=f"empty {'query' if kind == 'search' else 'answer'}")
        if kind == "refuse":
            content = self.config.refusal_answer
        return Action(kind, content=content or "", turn=turn)

    def is_final(self, action: Action) -> bool:
        return action.kind in ("answer", "refuse")

    def env_spans(self, text: str) -> list[tuple[int, int]]:
        """Search-R1's observation and corrective spans, and the answer-now note."""
        import re

        note = self.config.answer_now
        spans = super().env_spans(text) + (
            [m.span() for m in re.finditer(re.escape(note), text)] if note else []
        )
        return sorted(spans)

    def fixed_texts(self) -> list[str]:
        return [DEFAULT_USER, *MARKERS.values()]

    def replay(
        self, record: dict[str, Any], path: Any, line: int, *, fallback: bool = False
    ) -> Trajectory | None:
        """A saved episode as text, ``{id, completion, retrieved_ids?, retrieved_titles?}``: the completion
        (observations included) is split into steps as the rollout made them, and ``retrieved_ids``
        gives each executed search's passage ids in order (one list per search), which r_ret and the
        gold verifier read. Without it the text alone is replayed (every search then misses)."""
        from ragrl.rollout.replay import trajectory_from_completion

        if "retrieved_ids" not in record:
            return None
        traj = trajectory_from_completion(str(record["id"]), record["completion"], self, fallback=fallback)
        searches = [a for a in traj.actions if a.kind == "search"]
        for key in ("retrieved_ids", "retrieved_titles"):
            lists = record.get(key, [[] for _ in searches])
            if not isinstance(lists, list) or not all(
                isinstance(x, list) and all(isinstance(i, str) for i in x) for x in lists
            ):
                raise DataError(
                    "must be a list of lists of strings, one per search", path=path, line=line, field=key
                )
            if len(lists) != len(searches):
                raise DataError(
                    f"has {len(lists)} lists but the completion makes {len(searches)} searches",
                    path=path,
                    line=line,
                    field=key,
                )
            for action, values in zip(searches, lists, strict=True):
                setattr(action, key, list(values))
        return traj


# --- the demonstrator for a warm start (§3.7) ------------------------------------------------------------


class EvoRagOracle:
    """A world demonstrator in EVO-RAG's grammar: it plays ``inner`` (the world's search oracle by
    default, which searches each gold sub-question; ``wrap(QuotingOracle())`` searches the entity each
    hop is about and quotes the evidence, as the demo's warm start does) and, on a question the corpus
    cannot answer, refuses (``<refuse/>``) where ``inner`` answers ``unknown``. Uses gold fields: an
    upper bound and a source of SFT traces (the paper's unspecified warm start; ours)."""

    def __init__(self, inner: Any = None) -> None:
        from ragrl.synth.demonstrators import OracleDemonstrator

        self.inner = inner if inner is not None else OracleDemonstrator()
        self.name = self.inner.name

    def wrap(self, inner: Any) -> EvoRagOracle:
        """This oracle around another world demonstrator (``ragrl sft --demos quote``)."""
        return EvoRagOracle(inner)

    def next_turn(self, example: Example, history: list[Any]) -> str:
        text = self.inner.next_turn(example, history)
        if not example.answerable and "<answer>" in text:
            thought = text[: text.index("<answer>")].rstrip()
            return f"{thought}\n{MARKERS['refuse']}"
        return text


# --- evaluation measurements (§5) -----------------------------------------------------------------------


def diagnostics(trajectory: Trajectory, example: Example) -> dict[str, float]:
    """Steps (all and SEARCH only), backtracks, invalid steps, refusal, truncation, duplicate searches
    (max cosine > 0.8, where the reward computed it) and gold recall over the episode."""
    actions = trajectory.actions
    searches = [a for a in actions if a.kind == "search"]
    cos = trajectory.metadata.get("evo_rag", {}).get("max_cos") or []
    dups = [c for c in cos if c is not None]
    gold = set(example.supporting_ids)
    found = {i for a in searches for i in a.retrieved_ids}
    out = {
        "steps": float(len(actions)),
        "search_steps": float(len(searches)),
        "backtracks": float(sum(a.kind == "backtrack" for a in actions)),
        "invalid_steps": float(sum(a.kind == "invalid" for a in actions)),
        # invalid outputs the rollout resampled or took as the answer (rollout.resample_invalid,
        # invalid_fallback): with both, invalid_steps alone would hide the invalid-format rate
        "invalid_resampled": float(len(trajectory.metadata.get("resampled", []))),
        "fallback_answers": float(len(trajectory.metadata.get("fallback_answers", []))),
        "refused": float(bool(actions) and actions[-1].kind == "refuse"),
        "truncated": float(trajectory.truncated or bool(trajectory.metadata.get("forced_answer"))),
        "answerable": float(example.answerable),
    }
    if dups:
        out["duplicate_rate"] = sum(c > 0.8 for c in dups) / len(dups)
    if gold:
        out["gold_recall"] = len(gold & found) / len(gold)
    return out


# --- the config -----------------------------------------------------------------------------------------


def _rollout() -> RolloutConfig:
    return RolloutConfig(kind="stepwise", max_turns=T_MAX, final_answer_turn=True, k=5)


@dataclass
class EvoRagConfig:
    method: str = "evo_rag"
    protocol: EvoRagProtocolConfig = field(default_factory=EvoRagProtocolConfig)
    rollout: RolloutConfig = field(default_factory=_rollout)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    rewards: RewardParams = field(default_factory=RewardParams)
    train: TrainConfig = field(default_factory=TrainConfig)

    @classmethod
    def load(cls, name_or_path: str | Path = "evo_rag", overrides: Any = None) -> EvoRagConfig:
        return to_dataclass(cls, load_method_config(name_or_path, overrides))


def build_method(cfg: Any) -> Method:
    """EVO-RAG from a loaded config (``ragrl.methods.load_method``)."""
    config = to_dataclass(EvoRagConfig, cfg)
    if config.rollout.kind != "stepwise":
        raise RagrlError(
            f"rollout.kind: EVO-RAG backtracks, so it needs stepwise, got {config.rollout.kind!r}"
        )
    check_verifier(config.rewards.verifier)
    if config.rewards.act_denominator not in ("t_max", "episode"):
        raise RagrlError(
            f"rewards.act_denominator is t_max or episode, got {config.rewards.act_denominator!r}"
        )
    if config.rewards.act_denominator == "episode" and config.train.algo == "cycles":
        raise RagrlError(
            "rewards.act_denominator: episode divides by the episode's length, which a sibling branch cut "
            "at its step does not have; preference cycles need t_max"
        )
    if config.schedule.mode == "no_reward" and config.schedule.keep != ["full"]:
        raise RagrlError(
            "schedule.keep: the no_reward mode keeps the answer reward alone; leave keep at [full]"
        )
    reward = build_reward(reward_spec(config.schedule, config.rewards))
    return Method(
        name=config.method,
        config=config,
        protocol=EvoRagProtocol(config.protocol),
        rollout=config.rollout,
        reward=reward,
        train=config.train,
        diagnostics=diagnostics,
        step_log=step_log,
        oracle=EvoRagOracle(),
    )
