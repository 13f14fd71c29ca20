"""ARENA as a method: its config, the oracle that writes ideal replies for the SFT warm start, and
``build_method``.

**Training** (``ragrl/methods/configs/arena.yaml``): GRPO with G = 7 samples at T = 0.9, advantage
``(r - mean) / (sample std + 1e-4)``, ε = 0.2, μ = 1, token-mean loss and the paper's one optimizer
change: the k2 KL estimator ``½ (log π_θ - log π_ref)²`` with β = 0.04 (``train.grpo.kl: k2``).

**Naive-GRPO baseline** (§6.1; ``protocol.output: think_answer``,
``ragrl/methods/configs/arena-naive.yaml``): the same references, a ``<think>…</think><answer>…</answer>``
reply, format (``think_answer_format``) plus accuracy rewards only, and the standard k3 KL."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragrl.config import Method, load_method_config, to_dataclass
from ragrl.config.train import TrainConfig
from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.methods.arena.evidence import gold_ids, prepare_examples
from ragrl.methods.arena.protocol import ArenaProtocol, ArenaProtocolConfig
from ragrl.methods.arena.rewards import citation_audit
from ragrl.rewards import build_reward
from ragrl.rollout.config import RolloutConfig

if TYPE_CHECKING:
    from ragrl.synth.demonstrators import GivenQuote


def _default_reward() -> list[dict[str, Any]]:
    return [
        {"name": "arena_format", "weight": 1.0},
        {"name": "arena_accuracy", "weight": 1.0},
        {"name": "arena_relevance", "weight": 1.0},
        {"name": "arena_bonus", "weight": 1.0, "value": 10.0},
    ]


def _default_rollout() -> RolloutConfig:
    return RolloutConfig(max_turns=1, max_new_tokens=256, max_total_tokens=256, temperature=0.9, n=7)


@dataclass
class ArenaConfig:
    method: str = "arena"
    name: str = "arena"
    """What reports call this run (``arena-naive`` for the baseline)."""
    protocol: ArenaProtocolConfig = field(default_factory=ArenaProtocolConfig)
    rollout: RolloutConfig = field(default_factory=_default_rollout)
    reward: list[dict[str, Any]] = field(default_factory=_default_reward)
    """The four rewards, each with weight 1 (arena.md §2.5)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    unresolved: str = "drop"
    """What to do with a question whose supporting evidence is not found among its passages
    (``ragrl.data.references``): ``drop`` it (the authors' rule), ``keep`` it with ``-1`` among its
    gold ids (full relevance credit is then impossible), or raise an ``error``."""

    @classmethod
    def load(cls, name_or_path: str | Path = "arena", overrides: Any = None) -> ArenaConfig:
        return to_dataclass(cls, load_method_config(name_or_path, overrides))


# -- an oracle reply (tests, warm starts) --------------------------------------------------------------------


def oracle_reply(example: Example, output: str = "arena", quotes: Sequence[GivenQuote] | None = None) -> str:
    """The reply that earns every reward: the gold ids, an analysis citing them, the first gold answer.

    The analysis is one line naming the gold passages, or, given ``quotes`` (a reader's hops:
    ``QuotingOracle.read_given``), each hop's entity, the number of
    its passage and the quote (``Mertaem Breke [3]: Mertaem Breke is a musician. He was born in Zurraes
    in 1965. Zurraes [7]: Zurraes is a city in Boreora.``): the claim-by-claim citing the paper's
    analysis asks for, read the way a policy that learned to read by searching an entity and quoting
    its passage reads (``ragrl.train.from_base``)."""
    ids = [i for i in gold_ids(example) if i > 0]
    if quotes:
        reasoning = " ".join(f"{q.title} [{q.index}]: {q.quote}" for q in quotes)
    elif ids:
        reasoning = f"The passages {' '.join(f'[{i}]' for i in ids)} give the answer."
    else:
        reasoning = "No passage helps."
    answer = example.answers[0] if example.answers else ""
    if output == "think_answer":
        return f"<think>{reasoning}</think>\n<answer>{answer}</answer>"
    return (
        f"<relevance>[{','.join(map(str, ids))}]</relevance>\n"
        f"<analysis>{reasoning}</analysis>\n"
        f"<answer>{answer}</answer>"
    )


class ArenaOracle:
    """A ``ragrl.rollout.scripted`` demonstrator that writes ``oracle_reply``; ``wrap(reader)`` makes one
    whose analysis quotes what ``reader.read_given(example)`` reads (``QuotingOracle``)."""

    def __init__(self, output: str = "arena", reader: Any = None) -> None:  # noqa: ANN401
        self.output = output
        self.reader = reader

    def wrap(self, inner: Any) -> ArenaOracle:  # noqa: ANN401
        """This oracle quoting the evidence ``inner`` reads in the given passages (``--demos quote``)."""
        if not hasattr(inner, "read_given"):
            raise RagrlError(
                f"ARENA's oracle reads given passages: {type(inner).__name__} has no read_given(example)"
            )
        return ArenaOracle(self.output, inner)

    def next_turn(self, example: Example, history: list[Any]) -> str:
        quotes = self.reader.read_given(example) if self.reader is not None else None
        return oracle_reply(example, self.output, quotes)


# -- the method ----------------------------------------------------------------------------------------------


def build_method(cfg: Any) -> Method:
    """ARENA (or its Naive-GRPO baseline) from a loaded config (see ``ragrl.methods.load_method``)."""
    config = to_dataclass(ArenaConfig, cfg)
    if config.rollout.max_turns != 1 or config.rollout.final_answer_turn:
        raise RagrlError(
            f"{config.name}: the reply is a single turn; set rollout.max_turns: 1 and "
            "rollout.final_answer_turn: false"
        )
    from ragrl.data.references import UNRESOLVED_RULES

    if config.unresolved not in UNRESOLVED_RULES:
        raise RagrlError(
            f"unresolved: must be one of {', '.join(UNRESOLVED_RULES)}, got {config.unresolved!r}"
        )
    protocol = ArenaProtocol(config.protocol)
    return Method(
        name=config.name,
        config=config,
        protocol=protocol,
        rollout=config.rollout,
        reward=build_reward(config.reward),
        train=config.train,
        diagnostics=citation_audit if config.protocol.output == "arena" else None,
        oracle=ArenaOracle(config.protocol.output),
        prepare=functools.partial(prepare_examples, rule=config.unresolved),
    )
