"""Eval-RAR: a search agent that evaluates its evidence after every search (Yu et al.).

The rollout (Algorithm 1) is Search-R1's, with one more block per step: after every
``<information>`` observation the policy writes ``<evaluate>…</evaluate>``, citing the passage text that
answers the question or naming what is still missing (an entity, a relation, a time or place). Both
generation variants are the Search-R1 protocol's evaluation step (``protocol.evaluate``):

* ``free`` (AutoRefine's way): the next free-running turn opens with the block; only the prompt asks
  for it, and generation stops at ``</search>`` / ``</answer>`` / EOS as in Search-R1;
* ``separate`` (Algorithm 1, line 17): a separate generation right after the observation, stopped at
  ``</evaluate>``; optionally prefilled with ``<evaluate>`` (``prefill_evaluate``).

The step limit N is ``rollout.max_turns`` (an invalid action uses up a step and gets the paper's
corrective observation); ``rollout.final_answer_turn`` gives an unfinished episode one answer-only turn
(the code lineage).

Reward (Eqs. 2–5), all rule-based and gated, as two weighted components:

* ``em`` (weight 1): the last ``<answer>`` exactly matches a gold answer (SQuAD normalization);
* ``eval_rar_evaluation`` (weight r_eval = 0.1): fires only when the answer is NOT correct and some
  normalized gold answer is contained in the normalized concatenation of the ``<evaluate>`` bodies.

so a trajectory scores 1, 0.1 or 0. Its switches: ``if_no_answer`` (``paper``: Eq. 5 read literally, a
trajectory without an answer can still earn 0.1; ``code``: AutoRefine's code, it cannot) and
``containment`` (``char``: the paper's substring test, where gold ``no`` is found inside ``know``;
``word``: whole normalized words only). The ablation "w/o evaluation reward" is the same config with
the component's weight set to 0 (it is still logged).

Diagnostics (``eval_rar_diagnostics``, logged every training step and averaged by ``ragrl eval``):
executed searches, response length with the retrieved tokens, evaluate blocks, the evaluate-contains-gold
rate, which reward tier fired, and how often only a sub-word match made the evaluation tier fire (the
yes/no loophole).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragrl.config import Method, load_method_config, to_dataclass
from ragrl.config.train import TrainConfig
from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.metrics.answer import exact_match
from ragrl.metrics.normalize import normalize
from ragrl.rewards import build_reward
from ragrl.rewards.registry import RewardContext, register_reward
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.protocol import find_spans, first_span, squash_ws
from ragrl.rollout.scripted import Turn
from ragrl.rollout.search_protocol import SearchR1Protocol, SearchR1ProtocolConfig, search_diagnostics
from ragrl.rollout.trajectory import Action, Trajectory
from ragrl.synth.demonstrators import EvaluationPhrases, OracleDemonstrator

EVAL_RAR_PROMPT = (
    "Answer the question below; you can call a search engine as many times as you need. Reason inside "
    "<think> and </think>. When a fact is missing, write a search query between <search> and </search>; "
    "the three best passages come back between <information> and </information>. After every search, "
    "evaluate the evidence inside <evaluate> and </evaluate>: re-read the question and the passages; if "
    "they answer it, quote the passage text that supports the answer; if not, say what is still missing "
    "(an entity, a relation between entities, or a time or place). When you have enough information, "
    "give only the short final answer between <answer> and </answer>, for example <answer> Paris "
    "</answer>.\nQuestion: {question}"
)
"""Our wording of the paper's prompt (Appendix A.1): the same tags, the same evaluation instructions."""

CORRECTIVE = "\nMy action is wrong. Let me try again.\n"
"""The paper's observation for an action with neither a complete search nor a complete answer."""

IF_NO_ANSWER = ("paper", "code")
CONTAINMENT = ("char", "word")


@dataclass
class EvalRarProtocolConfig(SearchR1ProtocolConfig):
    user: str = EVAL_RAR_PROMPT
    corrective: str = CORRECTIVE
    question_mark: bool = True
    evaluate: str = "free"
    """Where the evaluation is written: ``free`` (at the start of the policy's next turn: only the prompt
    asks for it) or ``separate`` (a generation of its own right after each observation, stopped at
    ``</evaluate>``)."""
    prefill_evaluate: bool = False
    """``separate`` only: the observation ends with ``<evaluate>``, the policy writes the body."""


EVALUATE_MODES = ("free", "separate")


class EvalRarProtocol(SearchR1Protocol):
    """Search-R1's grammar with an ``<evaluate>…</evaluate>`` block after every observation."""

    name = "eval_rar"

    def __init__(self, config: EvalRarProtocolConfig | None = None) -> None:
        c = config or EvalRarProtocolConfig()
        if c.evaluate not in EVALUATE_MODES:
            hint = (
                " (YAML reads unquoted off/on/yes/no as booleans)" if c.evaluate in ("True", "False") else ""
            )
            raise RagrlError(
                f"eval_rar: protocol.evaluate must be free or separate, got {c.evaluate!r}{hint} (without "
                "the evaluation step it is the search_r1 method)"
            )
        if c.prefill_evaluate and c.evaluate != "separate":
            raise RagrlError("protocol.prefill_evaluate needs protocol.evaluate: separate")
        super().__init__(c)
        if c.evaluate == "separate":
            self.followup_stop = ("</evaluate>",)

    @property
    def observation_tail(self) -> str:
        return "<evaluate>" if self.config.prefill_evaluate else ""

    def parse_followup(self, text: str, turn: int) -> Action:
        """The separate evaluation step: the body of its ``<evaluate>`` block (with ``prefill_evaluate``,
        the text before ``</evaluate>``)."""
        if self.config.prefill_evaluate:
            body, closed, _ = text.partition("</evaluate>")
            error = None if closed else "unclosed <evaluate> block"
        else:
            span = first_span(text, "evaluate")
            body, error = (span.content, None) if span else ("", "no <evaluate> block")
        return Action("evaluate", content=squash_ws(body), turn=turn, error=error)


def evaluations(trajectory: Trajectory, after_observation_only: bool = False) -> list[str]:
    """The bodies of the ``<evaluate>`` blocks the policy wrote, in order (whitespace collapsed).

    Only policy text is read: each observation counts as a line break, except that an observation
    ending with the prefilled ``<evaluate>`` opens the block the next policy segment closes. The prompt
    (which names the tags) is never read.

    ``after_observation_only``: keep only the block that opens the policy text right after each
    ``<information>`` observation (nothing but whitespace before it), i.e. the evaluations Algorithm 1
    asks for, not blocks written without a search or later in a turn."""
    parts: list[str] = []
    allowed: list[tuple[int, int]] = []  # (where the block must open, where that policy segment ends)
    offset, after_obs = 0, False
    for s in trajectory.segments:
        if s.kind == "policy":
            if after_obs:
                allowed.append((offset, offset + len(s.text)))
            text, after_obs = s.text, False
        else:
            prefilled = s.text.rstrip().endswith("<evaluate>")
            text = "\n<evaluate>" if prefilled else "\n"
            after_obs = "<information>" in s.text and not prefilled
            if prefilled:
                allowed.append((offset + 1, offset + 1))
        parts.append(text)
        offset += len(text)
    joined = "".join(parts)
    spans = find_spans(joined, "evaluate")
    if after_observation_only:
        spans = [
            span
            for span in spans
            if any(a <= span.start <= end and not joined[a : span.start].strip() for a, end in allowed)
        ]
    return [squash_ws(span.content) for span in spans]


def _default_reward() -> list[dict[str, Any]]:
    return [
        {"name": "em", "weight": 1.0, "variant": "squad"},
        {"name": "eval_rar_evaluation", "weight": 0.1, "variant": "squad"},
    ]


@dataclass
class EvalRarConfig:
    method: str = "eval_rar"
    protocol: EvalRarProtocolConfig = field(default_factory=EvalRarProtocolConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: list[dict[str, Any]] = field(default_factory=_default_reward)
    """Weighted reward components (``ragrl.rewards.build_reward``): exact match of the final answer and
    the evaluation reward (Eqs. 3-5)."""
    train: TrainConfig = field(default_factory=TrainConfig)

    @classmethod
    def load(cls, name_or_path: str | Path = "eval_rar", overrides: Any = None) -> EvalRarConfig:
        return to_dataclass(cls, load_method_config(name_or_path, overrides))


# -- the evaluation reward (Eqs. 3-5) ----------------------------------------------------------------


def contains_gold(text: str, answers: list[str], variant: str = "squad", containment: str = "char") -> bool:
    """Whether a normalized gold answer occurs in the normalized ``text``: as a substring (``char``) or
    as a run of whole words (``word``). A gold answer that normalizes to nothing never matches."""
    if containment not in CONTAINMENT:
        raise RagrlError(f"containment must be one of {', '.join(CONTAINMENT)}, got {containment!r}")
    haystack = normalize(text, variant)
    if not haystack:
        return False
    for gold in answers:
        needle = normalize(gold, variant)
        if not needle:
            continue
        if containment == "char" and needle in haystack:
            return True
        if containment == "word" and f" {needle} " in f" {haystack} ":
            return True
    return False


def evaluation_text(trajectory: Trajectory, after_observation_only: bool = False) -> str:
    """y_eval: the ``<evaluate>`` bodies joined with a space (Eq. 3)."""
    return " ".join(evaluations(trajectory, after_observation_only))


def answer_correct(trajectory: Trajectory, example: Example, variant: str = "squad") -> bool:
    """R_ans (Eq. 2): the final answer exactly matches a gold answer."""
    if trajectory.final_answer is None:
        return False
    return bool(exact_match(trajectory.final_answer, example.answers, variant=variant))


def evaluation_tier(
    trajectory: Trajectory,
    example: Example,
    variant: str = "squad",
    if_no_answer: str = "paper",
    containment: str = "char",
    after_observation_only: bool = False,
) -> bool:
    """Whether the 0.1 tier of Eq. 5 fires: the answer is not correct, and the evaluation text contains a
    gold answer. Without an answer, ``if_no_answer="code"`` never fires it; ``after_observation_only``
    reads only the evaluations that open the policy's text right after an observation."""
    if if_no_answer not in IF_NO_ANSWER:
        raise RagrlError(f"if_no_answer must be one of {', '.join(IF_NO_ANSWER)}, got {if_no_answer!r}")
    if answer_correct(trajectory, example, variant):
        return False
    if trajectory.final_answer is None and if_no_answer == "code":
        return False
    text = evaluation_text(trajectory, after_observation_only)
    return contains_gold(text, list(example.answers), variant, containment)


@register_reward("eval_rar_evaluation")
def evaluation_reward(
    trajectory: Trajectory,
    example: Example,
    ctx: RewardContext,
    variant: str = "squad",
    if_no_answer: str = "paper",
    containment: str = "char",
    after_observation_only: bool = False,
) -> float:
    """1.0 when the evaluation tier fires (weight it with r_eval = 0.1), else 0.0."""
    return float(
        evaluation_tier(trajectory, example, variant, if_no_answer, containment, after_observation_only)
    )


def evaluation_settings(reward_spec: list[dict[str, Any]]) -> dict[str, Any]:
    """``variant`` / ``if_no_answer`` / ``containment`` / ``after_observation_only`` of the config's
    evaluation component (the defaults when it has none), checked."""
    settings: dict[str, Any] = {
        "variant": "squad",
        "if_no_answer": "paper",
        "containment": "char",
        "after_observation_only": False,
    }
    for i, item in enumerate(reward_spec):
        if item.get("name") == "eval_rar_evaluation":
            settings.update({k: item[k] for k in settings if k in item})
            if settings["if_no_answer"] not in IF_NO_ANSWER:
                raise RagrlError(
                    f"reward.{i}.if_no_answer must be one of {', '.join(IF_NO_ANSWER)}, "
                    f"got {settings['if_no_answer']!r}"
                )
            if not isinstance(settings["after_observation_only"], bool):
                raise RagrlError(
                    f"reward.{i}.after_observation_only must be true or false, "
                    f"got {settings['after_observation_only']!r}"
                )
            if settings["containment"] not in CONTAINMENT:
                raise RagrlError(
                    f"reward.{i}.containment must be one of {', '.join(CONTAINMENT)}, "
                    f"got {settings['containment']!r}"
                )
    return settings


def eval_rar_diagnostics(
    trajectory: Trajectory,
    example: Example,
    variant: str = "squad",
    if_no_answer: str = "paper",
    containment: str = "char",
    after_observation_only: bool = False,
) -> dict[str, float]:
    """What the paper's analysis plots, per trajectory (the trainer and ``ragrl eval`` average them)."""
    every, prompted = evaluations(trajectory), evaluations(trajectory, True)
    blocks = prompted if after_observation_only else every
    text = " ".join(blocks)
    golds = list(example.answers)
    correct = answer_correct(trajectory, example, variant)
    by = {
        c: evaluation_tier(trajectory, example, variant, if_no_answer, c, after_observation_only)
        for c in CONTAINMENT
    }
    fired = by[containment]
    return {
        **search_diagnostics(trajectory, example),
        "evaluate_blocks": float(len(blocks)),
        "evaluate_blocks_unprompted": float(len(every) - len(prompted)),
        "evaluate_words": float(len(text.split())),
        "evaluate_contains_gold": float(contains_gold(text, golds, variant, containment)),
        "tier/answer": float(correct),
        "tier/evaluation": float(fired),
        "tier/zero": float(not correct and not fired),
        "loophole": float(by["char"] and not by["word"]),
    }


# -- the oracle: demonstrations for a warm start ------------------------------------------------------


class EvalRarOracle:
    """The world's search oracle (``OracleDemonstrator``: one search per gold hop, then the gold answer)
    with an evaluation after every observation: what the passages gave for the hop just searched, then
    the next missing fact, or that the question can now be answered. Uses gold fields: an upper bound
    and a source of SFT demonstrations."""

    name = "eval_rar_oracle"

    def __init__(self, evaluate: str = "free", prefill: bool = False) -> None:
        if evaluate not in ("free", "separate"):
            raise RagrlError(f"EvalRarOracle: evaluate must be free or separate, got {evaluate!r}")
        self.evaluate, self.prefill = evaluate, prefill
        self.search_oracle: Any = OracleDemonstrator()

    def wrap(self, inner: Any) -> EvalRarOracle:  # noqa: ANN401
        """This oracle around another world demonstrator that searches one hop per search (``--demos
        quote``: the quoting oracle's entity queries and quoted evidence, then the evaluations)."""
        oracle = EvalRarOracle(self.evaluate, self.prefill)
        oracle.search_oracle = inner
        return oracle

    def evaluation(self, example: Example, hop: int, observation: str) -> str:
        """The body of the evaluation after the ``hop``-th search (1-based), whose passages the policy
        was shown as ``observation`` (cut to ``max_obs_tokens`` where it was)."""
        steps = example.decomposition or []
        p = EvaluationPhrases
        if hop <= len(steps):
            found = steps[hop - 1].answers[0]
            seen = p.found.format(found=found) if found.lower() in observation.lower() else p.not_found
        else:
            seen = p.not_found
        if hop < len(steps):
            return f"{seen} {p.missing.format(need=steps[hop].question)}"
        if not example.answerable:
            return f"{seen} {p.unanswerable}"
        return f"{seen} {p.answerable.format(answer=example.answers[0])}"

    def next_turn(self, example: Example, history: list[Turn]) -> str:
        searched = [t for t in history if t.action.kind == "search"]
        action = self.search_oracle.next_turn(example, searched)
        if not history or history[-1].action.kind != "search":
            return action  # the first turn, or the turn after a separate evaluation
        body = self.evaluation(example, len(searched), history[-1].observation)
        if self.evaluate == "separate":
            return f" {body} </evaluate>" if self.prefill else f"<evaluate> {body} </evaluate>"
        return f"<evaluate> {body} </evaluate>\n{action}"


def build_method(cfg: Any) -> Method:
    """Eval-RAR from a loaded config (see ``ragrl.methods.load_method``)."""
    config = to_dataclass(EvalRarConfig, cfg)
    protocol = EvalRarProtocol(config.protocol)
    settings = evaluation_settings(config.reward)
    return Method(
        name=config.method,
        config=config,
        protocol=protocol,
        rollout=config.rollout,
        reward=build_reward(config.reward),
        train=config.train,
        diagnostics=functools.partial(eval_rar_diagnostics, **settings),
        oracle=EvalRarOracle(config.protocol.evaluate, config.protocol.prefill_evaluate),
    )
