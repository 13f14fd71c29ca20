"""ARENA: Adaptive-Rewarded Evidence Navigation Agent (Ren et al. 2025, arXiv 2505.13258 v1).

The RAG *generator* is trained with GRPO to read a question and the passages given with it and to reply,
in ONE turn, with three sections in this order (spec: ``methods/arena.md`` §1)::

    <relevance>[6,8]</relevance>          the numbers of the passages it relies on (a JSON list of ints)
    <analysis>... [6] ... [8] ...</analysis>  its reasoning, citing the passage behind each claim
    <answer>Republican</answer>           a short phrase or a single word

**Input.** One user message (no system message by default), rendered with the policy's chat template:
a preamble, a description of the ``<question>`` / ``<references>`` inputs, the three-section rule, then
the question and the references. The wording is our own; the structure follows the paper's Table 1.
References are ``example.passages`` in their original order, one per line as ``"{index}. {text}"``
(1-based, no titles: ``reference_template`` changes that). Unlike the authors' code, a lone passage is
numbered too (``1. text``), so the model can cite it. There is no retriever: ``needs_retriever = False``.

**Turn.** The policy writes until EOS (``stop = ()``); the episode always ends after that one turn
(``rollout.max_turns`` must be 1). ``parse`` reads the first ``<answer>…</answer>`` span as the final
answer; a reply without one is an ``invalid`` action, and the episode ends ``"eos"`` (or
``"max_tokens"`` when the reply was cut).

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

Gold reference ids are ``example.metadata["gold_reference_ids"]`` when a loader stored them, else
``ragrl.data.references.gold_reference_ids(example)`` (for each supporting fact, the first given passage
that contains it; a fact found in no passage counts as the id ``-1``, as in the authors' code, so full
relevance credit is then impossible).

**Training** (``configs/arena.yaml``): GRPO with G = 7 samples at T = 0.9, advantage
``(r - mean) / (sample std + 1e-4)``, ε = 0.2, μ = 1, token-mean loss and the paper's one optimizer
change: the k2 KL estimator ``½ (log π_θ - log π_ref)²`` with β = 0.04 (``train.grpo.kl: k2``).

**Naive-GRPO baseline** (§6.1; ``protocol.output: think_answer``, ``configs/arena-naive.yaml``): the same
references, a ``<think>…</think><answer>…</answer>`` reply, format (``think_answer_format``) plus
accuracy rewards only, and the standard k3 KL.

**Audit.** ``Method.diagnostics`` measures every reply's cited ids against the gold ids
(``citation_audit``: ``cite/equal``, ``cite/overlap``, ``cite/miss``, ``cite/precision``,
``cite/recall``, ``cite/parsed``, ``bonus_rate``); ``ArenaProtocol.audit`` puts the cited ids, the
analysis and the answer of each reply into ``ragrl eval``'s per-example rows.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ragrl.console import console
from ragrl.data.references import GOLD_REFERENCE_KEY
from ragrl.data.schema import Example, Passage
from ragrl.errors import RagrlError
from ragrl.methods import Method, load_method_config, to_dataclass
from ragrl.methods.train_config import TrainConfig
from ragrl.metrics.answer import exact_match, f1
from ragrl.retrieval.base import Hit
from ragrl.rewards import build_reward
from ragrl.rewards.registry import RewardContext, register_reward
from ragrl.rollout.engine import RolloutConfig
from ragrl.rollout.protocol import Protocol
from ragrl.rollout.trajectory import Action, Trajectory

# -- 1. the prompt ----------------------------------------------------------------------------------

ARENA_PROMPT = """\
This is a conversation between a User and an Assistant. The User asks a question and gives some \
references; the Assistant answers the question from those references.
The User's input always contains:

<question>
[The question to be answered]
</question>

<references>
[The references, each starting with its number]
</references>

The Assistant's reply must contain EXACTLY three sections:

<relevance>
[ONLY the numbers of the references that are useful for the answer, in square brackets, e.g. [2,4]]
</relevance>

<analysis>
[Combine the useful references to reach the answer. Say which reference supports each claim]
</analysis>

<answer>
[ONLY a short phrase or a single word. No explanation]
</answer>

**User**:

<question>
{question}
</question>

<references>
{references}
</references>
"""
"""ARENA's prompt in our own wording, with the structure of the paper's Table 1 (arena.md §1.3)."""

NAIVE_PROMPT = """\
Answer the question using the references below. Reply in EXACTLY this format:
<think>[Reason step by step. Say how the references are used, or that they are not relevant and you \
rely on your own knowledge]</think>
<answer>[ONLY a short phrase or a single word]</answer>

**References**:
{references}

**Question**:
{question}
"""
"""The Naive-GRPO baseline's prompt (think / answer), in our own wording (arena.md §6.1)."""

OUTPUTS = ("arena", "think_answer")
"""The two output contracts: ARENA's relevance / analysis / answer, and the baseline's think / answer."""

TAGS = ("<relevance>", "</relevance>", "<analysis>", "</analysis>", "<answer>", "</answer>")
"""ARENA's tags (what a tokenizer should keep as single tokens)."""


@dataclass
class ArenaProtocolConfig:
    output: str = "arena"
    """``arena`` (relevance / analysis / answer) or ``think_answer`` (the Naive-GRPO baseline)."""
    system: str | None = None
    """An optional system message (the paper sends none; the chat template may add its default)."""
    user: str | None = None
    """The user message, with ``{question}`` and ``{references}``; None: ``ARENA_PROMPT`` or
    ``NAIVE_PROMPT`` (by ``output``)."""
    reference_template: str = "{index}. {text}"
    """One reference line; fields ``index`` (1-based), ``text``, ``title``, ``id``. The paper shows no
    titles; ``"{index}. {title}: {text}"`` adds them."""
    reference_separator: str = "\n"


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


# -- 2. reading a reply -------------------------------------------------------------------------------

SPECIAL_TOKEN_RE = re.compile(
    r"<\|[^<>|\s]+\|>"  # <|eot|> <|im_end|> <|endoftext|> <|eot_id|> ... (ragrl tiny, Qwen, Llama-3)
    r"|<｜[^<>｜]+｜>"  # <｜end▁of▁sentence｜> (DeepSeek)
    r"|</?s>|<(?:eos|bos|pad|unk|end_of_turn|start_of_turn)>"  # Llama-2 / Mistral, Gemma
)
"""Special-token spellings of the common chat-model families."""


def visible_text(text: str) -> str:
    """``text`` without special tokens: what ``decode(..., skip_special_tokens=True)`` gives.

    The engine decodes policy segments with their special tokens (a reply that ended with EOS ends with
    ``<|eot|>``, ``<|im_end|>``, ...), but the authors score the decoding *without* them, which matters
    for the format regex's ``$``. The rewards only see the text, so the special tokens are recognised
    by their spelling (``SPECIAL_TOKEN_RE``)."""
    return SPECIAL_TOKEN_RE.sub("", text)


def policy_output(trajectory: Trajectory) -> str:
    """The reply the rewards score: the policy's text, special tokens removed."""
    return visible_text(trajectory.policy_text)


_SPAN_RE = {
    tag: re.compile(rf"<{tag}>\s*(.*?)\s*</{tag}>", re.DOTALL)
    for tag in ("relevance", "analysis", "answer", "think")
}


def first_content(text: str, tag: str) -> str | None:
    """The content of the first ``<tag>…</tag>`` span, stripped (the authors' non-greedy
    ``<tag>\\s*(.*?)\\s*</tag>``, DOTALL); None when there is no such span."""
    m = _SPAN_RE[tag].search(text)
    return m.group(1).strip() if m else None


def answer_of(text: str) -> str:
    """The reply's answer: the first ``<answer>`` span, ``""`` when there is none (arena.md §2.2)."""
    return first_content(text, "answer") or ""


def cited_ids(text: str) -> list[int] | None:
    """The reference numbers of the first ``<relevance>`` span, sorted and de-duplicated, or None
    unless it is a JSON list of integers (``6.0`` counts as 6; ``true`` and ``"6"`` do not).

    Stricter than the relevance reward's reading (which takes anything ``sorted(set(json.loads(s)))``
    accepts): this is the audit's notion of "the model cited these passages"."""
    raw = first_content(text, "relevance")
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, list):
        return None
    ids = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int | float) or not float(v).is_integer():
            return None
        ids.append(int(v))
    return sorted(set(ids))


# -- 3. gold reference ids -----------------------------------------------------------------------------


def gold_ids(example: Example) -> list[int]:
    """The example's gold reference numbers (1-based positions in ``example.passages``), sorted and
    de-duplicated; ``-1`` stands for a supporting fact found in no passage (arena.md §4.2)."""
    stored = example.metadata.get(GOLD_REFERENCE_KEY)
    if stored is not None:
        if not isinstance(stored, list | tuple) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in stored
        ):
            raise RagrlError(
                f"example {example.id!r}: metadata.{GOLD_REFERENCE_KEY} must be a list of integers, "
                f"got {stored!r}"
            )
        return sorted(set(stored))
    from ragrl.data.references import gold_reference_ids

    return sorted(set(gold_reference_ids(example).ids))


# -- 4. the protocol ------------------------------------------------------------------------------------


def render_references(
    passages: Sequence[Passage], template: str = "{index}. {text}", separator: str = "\n"
) -> str:
    """The ``<references>`` block: every passage in its original order, numbered from 1."""
    return separator.join(
        template.format(index=i, text=p.text, title=p.title, id=p.id) for i, p in enumerate(passages, 1)
    )


REFERENCE_FIELDS = {"index": 1, "text": "text", "title": "title", "id": "id"}
"""The fields of ``reference_template`` (with sample values)."""


class ArenaProtocol(Protocol):
    """One turn: question + given references in, ``<relevance>/<analysis>/<answer>`` (or the baseline's
    ``<think>/<answer>``) out, ended by EOS."""

    name = "arena"
    stop = ()
    needs_retriever = False

    def __init__(self, config: ArenaProtocolConfig | None = None) -> None:
        self.config = config or ArenaProtocolConfig()
        if self.config.output not in OUTPUTS:
            raise RagrlError(
                f"protocol.output must be one of {', '.join(OUTPUTS)}, got {self.config.output!r}"
            )
        if self.config.output == "think_answer":
            self.name = "arena_naive"
        prompt_fields = {"question": "q", "references": "r"}
        for key, template, fields in (
            ("protocol.user", self.user_template, prompt_fields),
            ("protocol.system", self.config.system or "", prompt_fields),
            ("protocol.reference_template", self.config.reference_template, REFERENCE_FIELDS),
        ):
            try:
                template.format(**fields)
            except (KeyError, IndexError, ValueError) as e:
                raise RagrlError(
                    f"{key}: bad template ({type(e).__name__}: {e}); its fields are {', '.join(fields)}"
                ) from None

    @property
    def user_template(self) -> str:
        c = self.config
        if c.user is not None:
            return c.user
        return ARENA_PROMPT if c.output == "arena" else NAIVE_PROMPT

    def fixed_texts(self) -> list[str]:
        return [self.user_template]

    def messages(self, example: Example) -> list[dict[str, str]]:
        if not example.passages:
            raise RagrlError(
                f"example {example.id!r} has no passages: ARENA reads the passages given with each "
                "question (metadata.passages in the question file)"
            )
        c = self.config
        fields = {
            "question": example.question.strip(),
            "references": render_references(example.passages, c.reference_template, c.reference_separator),
        }
        out = []
        if c.system:
            out.append({"role": "system", "content": c.system.format(**fields)})
        out.append({"role": "user", "content": self.user_template.format(**fields)})
        return out

    def parse(self, text: str, turn: int) -> Action:
        """The whole reply is one final action: its first ``<answer>`` span (stripped)."""
        if not isinstance(text, str):
            return Action("invalid", turn=turn, error="no text")
        answer = first_content(visible_text(text), "answer")
        if answer is None:
            return Action("invalid", turn=turn, error="no <answer>…</answer> block")
        return Action("answer", content=answer, turn=turn)

    def audit(self, trajectory: Trajectory) -> dict[str, Any]:
        """What ``ragrl eval`` keeps per example: see ``citation``."""
        return citation(trajectory)

    def env_spans(self, text: str) -> list[tuple[int, int]]:
        return []  # a reply holds no environment text

    def observation(self, action: Action, hits: list[Hit]) -> str:
        raise RagrlError("ARENA reads the given passages; it never searches")

    def corrective(self, action: Action) -> str:
        raise RagrlError("ARENA is single-turn (rollout.max_turns: 1); there is no second turn to correct")


# -- 5. rewards -----------------------------------------------------------------------------------------

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


# -- the LLM-judge accuracy variant (arena.md §2.6) ------------------------------------------------


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


# -- 6. the citation audit ------------------------------------------------------------------------------


def citation(trajectory: Trajectory) -> dict[str, Any]:
    """The reply's cited ids (None unless a JSON list of integers), analysis and answer (None when the
    section is missing): the record an auditor reads."""
    text = policy_output(trajectory)
    return {
        "cited_ids": cited_ids(text),
        "analysis": first_content(text, "analysis"),
        "answer": first_content(text, "answer"),
    }


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


# -- 7. an oracle reply (tests, warm starts) ------------------------------------------------------------


def oracle_reply(example: Example, output: str = "arena") -> str:
    """The reply that earns every reward: the gold ids, a one-line analysis citing them, the first
    gold answer (in words the tiny policy's tokenizer knows)."""
    ids = [i for i in gold_ids(example) if i > 0]
    reasoning = (
        f"The passages {' '.join(f'[{i}]' for i in ids)} give the answer." if ids else "No passage helps."
    )
    answer = example.answers[0] if example.answers else ""
    if output == "think_answer":
        return f"<think>{reasoning}</think>\n<answer>{answer}</answer>"
    return (
        f"<relevance>[{','.join(map(str, ids))}]</relevance>\n"
        f"<analysis>{reasoning}</analysis>\n"
        f"<answer>{answer}</answer>"
    )


class ArenaOracle:
    """A ``ragrl.rollout.scripted`` demonstrator that writes ``oracle_reply``."""

    def __init__(self, output: str = "arena") -> None:
        self.output = output

    def next_turn(self, example: Example, history: list[Any]) -> str:
        return oracle_reply(example, self.output)


# -- the method -----------------------------------------------------------------------------------------


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


def prepare_examples(examples: Sequence[Example], where: str, rule: str = "drop") -> list[Example]:
    """Attach the gold reference ids (``metadata["gold_reference_ids"]``) and apply ``rule`` to questions
    whose evidence cannot be located; what is dropped is printed, never silent."""
    from ragrl.data.references import attach_reference_ids

    kept, report = attach_reference_ids(examples, rule)
    if report.dropped or report.kept_unresolved:
        head = report.summary().splitlines()[0]
        ids = list(report.dropped or report.kept_unresolved)
        more = f" (+{len(ids) - 5} more)" if len(ids) > 5 else ""
        console.print(f"{where}: {head}; unresolved: {', '.join(ids[:5])}{more}")
    return kept
