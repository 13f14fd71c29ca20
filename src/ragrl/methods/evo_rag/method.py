"""EVO-RAG as a method: its config (``ragrl/methods/configs/evo_rag.yaml``, ``evo_rag-tiny.yaml``), the
oracle for warm starts, the per-episode diagnostics, and ``build_method``.

Training (rollouts with sibling candidates, preference pairs, the multi-head reward model, DPO cycles and
the two curriculum stages) is the core's preference cycles (``train.algo: cycles``, ``ragrl.train.cycles``)
and training stages (``ragrl.train.stages``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragrl.config import Method, load_method_config, to_dataclass
from ragrl.config.train import TrainConfig
from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.methods.evo_rag.protocol import MARKERS, EvoRagProtocol, EvoRagProtocolConfig
from ragrl.methods.evo_rag.rewards import T_MAX, check_verifier, step_log
from ragrl.methods.evo_rag.schedule import RewardParams, ScheduleConfig, reward_spec
from ragrl.rewards import build_reward
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.trajectory import Trajectory

# -- the demonstrator for a warm start (§3.7) ----------------------------------------------------------------


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


# -- evaluation measurements (§5) ----------------------------------------------------------------------------


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


# -- the config ----------------------------------------------------------------------------------------------


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
