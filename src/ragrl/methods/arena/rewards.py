"""ARENA's rewards (spec §2), the Naive-GRPO baseline's format reward and the citation audit.

**Rewards** (§2; every reward reads the policy's text with special tokens such as EOS removed, as the
authors' code decodes with ``skip_special_tokens=True``; see ``visible_text``). Four pure functions of
(completion text, gold answers, gold reference ids), summed with weights 1, 1, 1, 1 (total in [0, 13]):

* ``arena_format`` ∈ {0, 1}: the authors' anchored regex (``FORMAT_RE``): the reply starts with
  ``<relevance>``; only whitespace between the sections; no ``<`` inside a section; nothing after
  ``</answer>`` on its line (``$`` is MULTILINE, so a newline and more text after it still pass).
* ``arena_accuracy`` ∈ {0, 1}: exact match of the first ``<answer>`` span (``""`` when there is none)
  against any gold answer under ARENA's normalization (punctuation becomes a space: ``U.S.`` → ``u s``).
  ``metric: f1`` and ``metric: judge`` are the paper's accuracy-reward variants (§2.6).
* ``arena_relevance`` ∈ {0, 0.5, 1}: ``sorted(set(json.loads(first <relevance> span)))`` equal to the
  gold ids → 1; any overlap (a superset too) → 0.5; no overlap, or anything that fails → 0.
* ``arena_bonus`` ∈ {0, 10}: 10 iff format, accuracy (exact match) and relevance are all exactly 1.

**Audit.** ``Method.diagnostics`` measures every reply's cited ids against the gold ids
(``citation_audit``: ``cite/equal``, ``cite/overlap``, ``cite/miss``, ``cite/precision``,
``cite/recall``, ``cite/parsed``, ``bonus_rate``); ``ArenaProtocol.audit`` puts the cited ids, the
analysis and the answer of each reply into ``ragrl eval``'s per-example rows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.methods.arena.evidence import gold_ids
from ragrl.methods.arena.protocol import answer_of, cited_ids, first_content, policy_output
from ragrl.metrics.answer import exact_match, f1
from ragrl.rewards.registry import RewardContext, register_reward
from ragrl.rollout.trajectory import Trajectory

FORMAT_RE = re.compile(
    r"^<relevance>[^<]*</relevance>\s*<analysis>[^<]*</analysis>\s*<answer>[^<]*</answer>$",
    re.DOTALL | re.VERBOSE | re.MULTILINE,
)
"""The authors' format check, applied with ``re.match`` (the pattern has no literal whitespace, so
VERBOSE changes nothing)."""


THINK_ANSWER_RE = re.compile(
    r"^<think>[^<]*</think>\s*<answer>[^<]*</answer>$", re.DOTALL | re.VERBOSE | re.MULTILINE
)
"""The Naive-GRPO baseline's format, as strict as ``FORMAT_RE`` (the paper gives no regex for it)."""


def format_score(text: str) -> float:
    """1.0 if ``FORMAT_RE`` matches the reply, else 0.0 (arena.md §2.1)."""
    return float(FORMAT_RE.match(text) is not None)


def think_answer_format_score(text: str) -> float:
    return float(THINK_ANSWER_RE.match(text) is not None)


def accuracy_score(
    prediction: str, answers: Sequence[str], metric: str = "em", variant: str = "arena"
) -> float:
    """Exact match (default) or token F1 of ``prediction``, the maximum over the gold ``answers``
    (0.0 without gold answers)."""
    if not answers:
        return 0.0
    if metric == "em":
        return exact_match(prediction, list(answers), variant=variant)
    if metric == "f1":
        return f1(prediction, list(answers), variant=variant)[0]
    raise RagrlError(f"arena_accuracy: metric must be em, f1 or judge, got {metric!r}")


def relevance_score(text: str, gold: Sequence[int]) -> float:
    """1.0 / 0.5 / 0.0 exactly as the authors' code (arena.md §2.3): the first ``<relevance>`` span
    through ``sorted(set(json.loads(...)))``; equal to the gold ids → 1, non-empty overlap → 0.5,
    otherwise (or if anything raises) → 0."""
    try:
        predicted = sorted(set(json.loads(first_content(text, "relevance") or "")))
        if predicted == sorted(set(gold)):
            return 1.0
        return 0.5 if set(predicted) & set(gold) else 0.0
    except Exception:  # noqa: BLE001 - the authors' code: any failure scores 0
        return 0.0


def bonus_earned(text: str, answers: Sequence[str], gold: Sequence[int]) -> bool:
    """Format, accuracy (exact match) and relevance all exactly 1 (arena.md §2.4)."""
    return (
        format_score(text) == 1.0
        and accuracy_score(answer_of(text), answers) == 1.0
        and relevance_score(text, gold) == 1.0
    )


@register_reward("arena_format")
def arena_format(trajectory: Trajectory, example: Example, ctx: RewardContext) -> float:
    """1.0 if the reply is exactly ``<relevance>…</relevance> <analysis>…</analysis> <answer>…</answer>``."""
    return format_score(policy_output(trajectory))


@register_reward("arena_accuracy")
def arena_accuracy(
    trajectory: Trajectory,
    example: Example,
    ctx: RewardContext,
    metric: str = "em",
    variant: str = "arena",
    judge: dict[str, Any] | None = None,
) -> float:
    """The first ``<answer>`` span against the gold answers: ``metric`` ``em`` (the paper's reward),
    ``f1``, or ``judge`` (an LLM judge through ``ragrl.metrics.judge``; ``judge`` holds its settings)."""
    prediction = answer_of(policy_output(trajectory))
    if metric == "judge":
        return judge_score(example, prediction, judge or {})
    return accuracy_score(prediction, example.answers, metric, variant)


@register_reward("arena_relevance")
def arena_relevance(trajectory: Trajectory, example: Example, ctx: RewardContext) -> float:
    """1 if the cited references are exactly the gold ones, 0.5 if they overlap, else 0."""
    return relevance_score(policy_output(trajectory), gold_ids(example))


@register_reward("arena_bonus")
def arena_bonus(trajectory: Trajectory, example: Example, ctx: RewardContext, value: float = 10.0) -> float:
    """``value`` when format, exact-match accuracy and relevance are all 1, else 0."""
    text = policy_output(trajectory)
    return float(value) if bonus_earned(text, example.answers, gold_ids(example)) else 0.0


@register_reward("think_answer_format")
def think_answer_format(trajectory: Trajectory, example: Example, ctx: RewardContext) -> float:
    """The Naive-GRPO baseline's format: exactly ``<think>…</think>`` then ``<answer>…</answer>``."""
    return think_answer_format_score(policy_output(trajectory))


# -- the LLM-judge accuracy variant (arena.md §2.6) ----------------------------------------------------------


def judge_score(example: Example, prediction: str, settings: dict[str, Any]) -> float:
    """The judge's score (1 / 0.5 / 0) of ``prediction`` against the gold answers.

    ``settings`` is a ``ragrl.metrics.judge_clients.make_judge`` spec (``{kind: openai, base_url,
    model, ...}`` or ``{kind: local, path, ...}``); the client is built once per spec and its replies
    are cached by prompt. Replies are read with the reward variant's rule (a reply that starts with
    yes / no decides first). An empty prediction scores 0 without a call."""
    if not prediction.strip() or not example.answers:
        return 0.0
    from ragrl.metrics.judge import judge_answer

    client, cache = _judge_client(json.dumps(settings, sort_keys=True))
    return float(
        judge_answer(
            example.question, list(example.answers), prediction, client=client, cache=cache, prefix_first=True
        )
    )


@lru_cache(maxsize=8)
def _judge_client(spec_json: str) -> tuple[Any, dict[str, str]]:
    """One judge client (and its reply cache) per settings, built on first use."""
    from ragrl.metrics.judge_clients import make_judge

    spec = json.loads(spec_json)
    if not spec:
        raise RagrlError(
            "arena_accuracy with metric: judge needs judge settings, e.g. "
            "judge: {kind: openai, base_url: https://api.openai.com/v1, model: gpt-4o-2024-11-20}"
        )
    return make_judge(spec), {}


# -- the citation audit --------------------------------------------------------------------------------------


def citation_audit(trajectory: Trajectory, example: Example) -> dict[str, float]:
    """Cited ids against gold ids, one reply at a time (``Method.diagnostics``).

    ``cite/equal`` (same set), ``cite/overlap`` (a common id but not the same set), ``cite/miss`` (no
    common id, or no readable list) sum to 1; with a readable list they are the relevance reward's 1 /
    0.5 / 0. ``cite/precision`` and ``cite/recall`` are 0 for an unreadable (or empty) list;
    ``bonus_rate`` is 1 when the reply earned the bonus."""
    text = policy_output(trajectory)
    gold = gold_ids(example)
    cited = cited_ids(text)
    common = set(cited or ()) & set(gold)
    equal = cited is not None and cited == gold
    overlap = bool(common) and not equal
    return {
        "cite/parsed": float(cited is not None),
        "cite/equal": float(equal),
        "cite/overlap": float(overlap),
        "cite/miss": float(not equal and not overlap),
        "cite/precision": len(common) / len(cited) if cited else 0.0,
        "cite/recall": len(common) / len(gold) if cited is not None and gold else 0.0,
        "bonus_rate": float(bonus_earned(text, example.answers, gold)),
    }
