"""Search-R1: the plain search agent every paper compares against.

Its tag grammar (``<think>``, ``<search>``, ``<information>``, ``<answer>``) is the core's
``ragrl.rollout.search_protocol``, which Eval-RAR, TIRESRAG-R1 and EVO-RAG extend; this module is the
method on it: its config, its format reward and ``build_method``. The prompt is our own wording
(``ragrl/methods/configs/search_r1.yaml``); only the tags and the turn structure follow the paper.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragrl.config import Method, load_method_config, to_dataclass
from ragrl.config.train import TrainConfig
from ragrl.data.schema import Example
from ragrl.metrics.answer import exact_match
from ragrl.metrics.normalize import normalize
from ragrl.rewards import build_reward
from ragrl.rewards.registry import RewardContext, register_reward
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.search_protocol import (
    SearchR1Protocol,
    SearchR1ProtocolConfig,
    search_diagnostics,
    well_formed_turn,
)
from ragrl.rollout.trajectory import Trajectory


def _default_reward() -> list[dict[str, Any]]:
    return [{"name": "em", "weight": 1.0, "variant": "squad"}, {"name": "search_r1_format", "weight": 0.0}]


@dataclass
class SearchR1Config:
    method: str = "search_r1"
    protocol: SearchR1ProtocolConfig = field(default_factory=SearchR1ProtocolConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: list[dict[str, Any]] = field(default_factory=_default_reward)
    """Weighted reward components (``ragrl.rewards.build_reward``): exact match of the final answer,
    plus an optional format term (weight 0 by default, as in Search-R1's EM recipe)."""
    train: TrainConfig = field(default_factory=TrainConfig)

    @classmethod
    def load(cls, name_or_path: str | Path = "search_r1", overrides: Any = None) -> SearchR1Config:
        return to_dataclass(cls, load_method_config(name_or_path, overrides))


@register_reward("search_r1_format")
def format_reward(trajectory: Trajectory, example: Example, ctx: RewardContext) -> float:
    """1.0 if the episode ended with an answer and every policy turn is well formed (see
    ``well_formed_turn``), else 0.0. Search-R1 gates its format bonus on the answer's correctness; here
    it is a separate, weighted component (weight 0 by default), so each part is logged on its own."""
    if trajectory.final_answer is None:
        return 0.0
    turns = [s.text for s in trajectory.segments if s.kind == "policy"]
    return float(
        bool(turns)
        and all(well_formed_turn(t, final=False) for t in turns[:-1])
        and well_formed_turn(turns[-1], final=True)
    )


# Search-R1's format check (``is_valid_sequence`` in its ``verl/utils/reward_score/qa_em_format.py``): the
# episode is <think>, then a <search> with its <information> and another <think>, ..., then <answer>, with
# only whitespace between the blocks and nothing after the answer. (state, tag) -> the next state:
_TAG = re.compile(r"(</?(?:think|search|information|answer)>)")
_NEXT = {
    ("start", "<think>"): "in_think",
    ("information", "<think>"): "in_think",
    ("in_think", "</think>"): "after_think",
    ("after_think", "<search>"): "in_search",
    ("in_search", "</search>"): "after_search",
    ("after_search", "<information>"): "in_information",
    ("in_information", "</information>"): "information",
    ("after_think", "<answer>"): "in_answer",
    ("in_answer", "</answer>"): "end",
}
_INSIDE = ("in_think", "in_search", "in_information", "in_answer")


def valid_sequence(text: str) -> bool:
    """Whether an episode's text (its turns and observations, after the prompt) has Search-R1's format."""
    for tag in ("think", "search", "information", "answer"):
        if text.count(f"<{tag}>") != text.count(f"</{tag}>"):
            return False
    state: str | None = "start"
    for part in _TAG.split(text):
        if not part.strip():
            continue
        if _TAG.fullmatch(part):
            state = _NEXT.get((state, part))  # type: ignore[arg-type]
            if state is None:
                return False
        elif state not in _INSIDE:
            return False
    return state == "end"


@register_reward("search_r1_em_format")
def em_format_reward(
    trajectory: Trajectory,
    example: Example,
    ctx: RewardContext,
    structure_format_score: float = 0.2,
    final_format_score: float = 0.1,
    retrieval_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """Search-R1's EM reward with its format terms (``compute_score_em`` of ``qa_em_format.py``; the
    defaults are its ``train_*_format.sh`` settings). The terms are gated, not added:

    * a right answer (SQuAD EM) scores ``score``, less ``structure_format_score`` if the format is broken;
    * a wrong or missing answer in a valid format scores ``structure_format_score``, plus
      ``retrieval_score`` when a gold answer appears in a retrieved passage;
    * a wrong answer in a broken format scores ``final_format_score``, a missing one 0.

    It reads the episode's text, turns and observations, as the authors' function reads the decoded
    response: the format is ``valid_sequence``, the answer the last ``<answer>`` block anywhere in it (a
    corrective observation's example block included, as theirs). Two differences, both where the authors
    read the prompt: their retrieval check also scans the prompt's ``<information>`` mentions, and their
    format check needs Qwen's ``<|im_start|>assistant`` marker; this one reads the episode alone, under
    any chat template."""
    text = trajectory.completion_text
    valid = valid_sequence(text)
    found = False
    if valid:
        golds = [normalize(g) for g in example.answers]
        blocks = [normalize(b) for b in re.findall(r"<information>(.*?)</information>", text, re.S)]
        found = any(g in b for b in blocks for g in golds)
    blocks_of_answer = re.findall(r"<answer>(.*?)</answer>", text, re.S)
    answer = blocks_of_answer[-1].strip() if blocks_of_answer else None
    if answer is not None and exact_match(answer, example.answers, variant="squad"):
        return score if valid else score - structure_format_score
    if valid:
        return structure_format_score + retrieval_score if found else structure_format_score
    return 0.0 if answer is None else final_format_score


def build_method(cfg: Any) -> Method:
    """The Search-R1 method from a loaded config (see ``ragrl.methods.load_method``)."""
    config = to_dataclass(SearchR1Config, cfg)
    return Method(
        name=config.method,
        config=config,
        protocol=SearchR1Protocol(config.protocol),
        rollout=config.rollout,
        reward=build_reward(config.reward),
        train=config.train,
        diagnostics=search_diagnostics,
    )
