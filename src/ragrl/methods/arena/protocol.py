"""ARENA's protocol (spec ``methods/arena.md`` §1): the prompt over the given references, the one-turn
reply, and how a reply is read.

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
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragrl.data.schema import Example, Passage
from ragrl.errors import RagrlError
from ragrl.retrieval.base import Hit
from ragrl.rollout.protocol import Protocol
from ragrl.rollout.trajectory import Action, Trajectory

# -- the prompt (§1.1) ---------------------------------------------------------------------------------------


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


# -- reading a reply (§1.3) ----------------------------------------------------------------------------------


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


def render_references(
    passages: Sequence[Passage], template: str = "{index}. {text}", separator: str = "\n"
) -> str:
    """The ``<references>`` block: every passage in its original order, numbered from 1."""
    return separator.join(
        template.format(index=i, text=p.text, title=p.title, id=p.id) for i, p in enumerate(passages, 1)
    )


REFERENCE_FIELDS = {"index": 1, "text": "text", "title": "title", "id": "id"}
"""The fields of ``reference_template`` (with sample values)."""


# -- the protocol --------------------------------------------------------------------------------------------


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


def citation(trajectory: Trajectory) -> dict[str, Any]:
    """The reply's cited ids (None unless a JSON list of integers), analysis and answer (None when the
    section is missing): the record an auditor reads."""
    text = policy_output(trajectory)
    return {
        "cited_ids": cited_ids(text),
        "analysis": first_content(text, "analysis"),
        "answer": first_content(text, "answer"),
    }
