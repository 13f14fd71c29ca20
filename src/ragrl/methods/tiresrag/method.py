"""TIRESRAG-R1 as a method: its config (``ragrl/methods/configs/tiresrag.yaml``, ``tiresrag-tiny.yaml``),
its per-episode diagnostics, the oracle for warm starts, and ``build_method``.

**The annealed weight a_t (§2.6)** is the core schedule ``sigmoid_decay`` (center 0.9, width 10) on the
auxiliary components' weights, so ``R_sum = R^A + a_t (0.6 R^T + 0.3 R^S + 0.3 R^R)`` (§2.7) is the
composite reward of the config.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragrl.config import Method, load_method_config, to_dataclass
from ragrl.config.train import TrainConfig
from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.methods.tiresrag.advantage import step_diagnostics
from ragrl.methods.tiresrag.judges import judge_parse_failures
from ragrl.methods.tiresrag.protocol import (
    REFLECTION_THOUGHT,
    TiresragProtocol,
    TiresragProtocolConfig,
    format_valid,
)
from ragrl.methods.tiresrag.rewards import answer_right
from ragrl.rewards import build_reward
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.scripted import Turn
from ragrl.rollout.search_protocol import (
    search_diagnostics,
)
from ragrl.rollout.trajectory import Trajectory
from ragrl.synth.demonstrators import OracleDemonstrator, answer_turn


@dataclass
class TiresragConfig:
    method: str = "tiresrag"
    protocol: TiresragProtocolConfig = field(default_factory=TiresragProtocolConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: list[dict[str, Any]] = field(default_factory=list)
    train: TrainConfig = field(default_factory=TrainConfig)

    @classmethod
    def load(cls, name_or_path: str | Path = "tiresrag", overrides: Any = None) -> TiresragConfig:
        return to_dataclass(cls, load_method_config(name_or_path, overrides))


def diagnostics(
    trajectory: Trajectory, example: Example, prefill: str = "", empty_answer: bool = True
) -> dict[str, float]:
    """Search counts (Search-R1's), answers per episode, the reflection's transition (by cover-EM of the
    first and last answer), the format check and the judge's unreadable replies (§7.1 "Logging")."""
    out = search_diagnostics(trajectory, example)
    answers = trajectory.answers
    out["answers"] = float(len(answers))
    out["format_valid"] = float(format_valid(trajectory, prefill, empty_answer))
    right = [answer_right(a, example.answers) for a in (answers[0], answers[-1])] if answers else []
    reflected = len(answers) > 1
    out["reflect/none"] = float(not reflected)
    out["reflect/wrong_to_right"] = float(reflected and not right[0] and right[1])
    out["reflect/right_to_wrong"] = float(reflected and right[0] and not right[1])
    out["reflect/unchanged"] = float(reflected and right[0] == right[1])
    for component, failures in judge_parse_failures([trajectory]).items():
        out[f"{component}/parse_failures"] = float(failures)
    return out


# -- the warm start's demonstrator ---------------------------------------------------------------------------


class TiresragOracle:
    """The world's search oracle (``OracleDemonstrator``: one search per gold hop, then the gold answer),
    then the reflection pass: it re-reads and gives the same answer again. A warm start on it teaches
    the pass and its format; what the pass is worth is left to RL. Uses gold fields: an upper bound and
    a source of SFT demonstrations."""

    name = "tiresrag_oracle"

    def __init__(self, prefill: str = "") -> None:
        self.search_oracle: Any = OracleDemonstrator()
        self.prefill = prefill
        """The protocol's prefill: the first turn continues it instead of repeating it."""

    def wrap(self, inner: Any) -> TiresragOracle:  # noqa: ANN401
        """This oracle around another world demonstrator (``--demos quote``: the quoting oracle's
        entity queries and quoted evidence, then the reflection pass)."""
        oracle = TiresragOracle(self.prefill)
        oracle.search_oracle = inner
        return oracle

    def next_turn(self, example: Example, history: list[Turn]) -> str:
        answered = [t.action.content for t in history if t.action.kind == "answer"]
        if answered:
            return answer_turn(REFLECTION_THOUGHT, answered[-1])
        text = self.search_oracle.next_turn(example, history)
        if not history and self.prefill and text.startswith(self.prefill):
            text = text[len(self.prefill) :]
        return text


READS_THE_RESPONSE = ("tiresrag_answer", "tiresrag_sufficiency", "tiresrag_thinking")
"""The components that read the response text as the code does, the protocol's prefill included."""


def with_prefill(components: list[dict[str, Any]], prefill: str) -> list[dict[str, Any]]:
    """The reward components, those that read the response text given the protocol's ``prefill``
    (one set in a component must be the protocol's)."""
    out = []
    for i, spec in enumerate(components):
        if isinstance(spec, Mapping) and spec.get("name") in READS_THE_RESPONSE:
            if spec.get("prefill", prefill) != prefill:
                raise RagrlError(
                    f"reward.{i}.prefill: {spec['prefill']!r} differs from protocol.prefill {prefill!r} "
                    "(leave it out: the component reads the protocol's)"
                )
            spec = {**spec, "prefill": prefill}
        out.append(spec)
    return out


def build_method(cfg: Any) -> Method:
    """TIRESRAG-R1 from a loaded config (``ragrl.methods.load_method``)."""
    config = to_dataclass(TiresragConfig, cfg)
    if not config.reward:
        raise RagrlError("reward: TIRESRAG-R1 needs its reward components (see tiresrag.yaml)")
    g = config.train.grpo
    if (
        g.advantage == "tiresrag"
        and g.advantage_params.get("baseline") == "reinforce_pp"
        and g.whiten == "none"
    ):
        raise RagrlError(
            "train.grpo.advantage_params.baseline: reinforce_pp normalises the advantages over the update "
            "batch: set train.grpo.whiten to token (the code's replay-buffer whitening) or sample"
        )
    return Method(
        name=config.method,
        config=config,
        protocol=TiresragProtocol(config.protocol),
        rollout=config.rollout,
        reward=build_reward(with_prefill(config.reward, config.protocol.prefill)),
        train=config.train,
        diagnostics=functools.partial(
            diagnostics,
            prefill=config.protocol.prefill,
            empty_answer=config.protocol.empty_answer == "answer",
        ),
        step_diagnostics=step_diagnostics,
        oracle=TiresragOracle(config.protocol.prefill),
    )


# the parameters are advantage_terms', so that a config's advantage_params are checked when it loads
