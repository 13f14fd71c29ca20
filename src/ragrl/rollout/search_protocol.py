"""The search agent's tag grammar, Search-R1's: the protocol Search-R1, Eval-RAR, TIRESRAG-R1 and EVO-RAG
share (each paper's package extends it; ``ragrl.methods.search_r1`` is the plain agent on it).

Grammar: the policy reasons in ``<think>…</think>``, asks the search engine with
``<search>query</search>`` (the environment answers ``<information>Doc 1 (Title: T) text
…</information>``) and ends with ``<answer>…</answer>``. A policy turn stops at ``</search>`` or
``</answer>`` (or EOS).

Parse rule (one generated segment, never the prompt): among the complete ``<search>…</search>`` and
``<answer>…</answer>`` spans of the segment, the one whose closing tag comes LAST decides the action.
A closing tag pairs with the nearest opening tag of the same name before it, so
``<search>a <search>b</search>`` searches ``b``; an unclosed tag counts for nothing. Content is stripped
and internal whitespace collapsed. A segment with neither span is ``invalid``; so is an empty query, and
an empty answer unless ``protocol.empty_answer: answer`` makes it the answer ``""``. ``<think>`` is
optional and never checked (the format reward, later, may check it).

Eval-RAR (``ragrl.methods.eval_rar``) extends this protocol with an evaluation step after every
observation; the hooks it uses are ``observation_tail`` and ``parse_followup``.

The prompt is our own wording (``ragrl/methods/configs/search_r1.yaml``); only the tags and the turn
structure follow the paper. The example answer the prompt shows (``<answer> Paris </answer>``) cannot be
mistaken for the policy's answer because only generated segments are parsed (Search-R1's "two ``<answer>``
matches" quirk does not arise)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.retrieval.base import Hit
from ragrl.rollout.protocol import Protocol, find_spans, last_span_of, squash_ws
from ragrl.rollout.trajectory import Action, Trajectory

DEFAULT_USER = (
    "Answer the question below. Reason step by step inside <think> and </think>. Whenever you are missing "
    "a fact, write a search query between <search> and </search>; the passages found are shown to you "
    "between <information> and </information>. Search as many times as you need. When you are sure, give "
    "only the final answer between <answer> and </answer>, for example <answer> Paris </answer>.\n"
    "Question: {question}"
)


@dataclass
class SearchR1ProtocolConfig:
    system: str | None = None
    user: str = DEFAULT_USER
    information_prefix: str = "\n<information>"
    information_suffix: str = "</information>\n"
    doc_template: str = "Doc {index} (Title: {title}) {text}"
    doc_separator: str = "\n"
    no_results: str = "No passages found."
    corrective: str = (
        "\nThat was not a valid action ({error}). Write a query as <search> query </search> "
        "or the final answer as <answer> answer </answer>.\n"
    )
    """Observation for an invalid action; ``{error}`` (optional) says what was wrong."""
    question_mark: bool = False
    """End the question with ``?`` when it does not (the Search-R1 / AutoRefine data code)."""
    empty_answer: str = "invalid"
    """What ``<answer> </answer>`` is: ``invalid`` (a corrective message, the turn does not count as an
    answer) or ``answer`` (the answer ``""``, which scores as a wrong answer: TIRESRAG-R1's code)."""


EMPTY_ANSWERS = ("invalid", "answer")


TAG_NAMES = ("think", "search", "information", "evaluate", "answer")


TAGS = tuple(t for name in TAG_NAMES for t in (f"<{name}>", f"</{name}>"))
"""Every tag of the protocol, opening and closing (what a tokenizer should keep as single tokens)."""


class SearchR1Protocol(Protocol):
    name = "search_r1"
    stop = ("</search>", "</answer>")
    action_tags = ("search", "answer")

    def __init__(self, config: SearchR1ProtocolConfig | None = None) -> None:
        self.config = c = config or SearchR1ProtocolConfig()
        for key, template in (("protocol.user", c.user), ("protocol.system", c.system or "")):
            try:
                template.format(question="q")
            except (KeyError, IndexError, ValueError) as e:
                raise RagrlError(
                    f"{key}: bad template ({type(e).__name__}: {e}); its field is {{question}}"
                ) from None
        if c.empty_answer not in EMPTY_ANSWERS:
            raise RagrlError(f"protocol.empty_answer must be one of {EMPTY_ANSWERS}, got {c.empty_answer!r}")

    def question(self, example: Example) -> str:
        q = example.question.strip()
        return q + "?" if self.config.question_mark and not q.endswith("?") else q

    def messages(self, example: Example) -> list[dict[str, str]]:
        c = self.config
        q = self.question(example)
        out = []
        if c.system:
            out.append({"role": "system", "content": c.system.format(question=q)})
        out.append({"role": "user", "content": c.user.format(question=q)})
        return out

    def parse(self, text: str, turn: int) -> Action:
        if not isinstance(text, str):
            return Action("invalid", turn=turn, error="no text")
        span = last_span_of(text, self.action_tags)
        if span is None:
            return Action("invalid", turn=turn, error="no <search> or <answer> block")
        content = squash_ws(span.content)
        if not content and span.tag == "answer" and self.config.empty_answer == "answer":
            return Action("answer", content="", turn=turn)
        if not content:
            what = "query" if span.tag == "search" else "answer"
            return Action("invalid", turn=turn, error=f"empty {what}")
        return Action(span.tag, content=content, turn=turn)

    def render_doc(self, index: int, hit: Hit) -> str:
        p = hit.passage
        return self.config.doc_template.format(
            index=index, title=p.title, text=p.text, id=p.id, score=hit.score
        )

    def observation(self, action: Action, hits: list[Hit]) -> str:
        c = self.config
        body = (
            c.doc_separator.join(self.render_doc(i, h) for i, h in enumerate(hits, 1))
            if hits
            else c.no_results
        )
        return f"{c.information_prefix}{body}{c.information_suffix}{self.observation_tail}"

    @property
    def observation_tail(self) -> str:
        """Text the environment adds after every observation (none here; Eval-RAR's prefilled
        ``<evaluate>``)."""
        return ""

    def corrective(self, action: Action) -> str:
        return self.config.corrective.format(error=action.error or "unreadable action")

    def env_spans(self, text: str) -> list[tuple[int, int]]:
        """Observations and corrective messages exactly as the config renders them (prefix and suffix
        included), so a saved completion splits back into the same policy and environment parts."""
        c = self.config
        prefill = f"(?:{re.escape(self.observation_tail)})?" if self.observation_tail else ""
        patterns = [re.escape(c.information_prefix) + r".*?" + re.escape(c.information_suffix) + prefill]
        head, has_error, tail = c.corrective.partition("{error}")
        if not has_error:
            patterns.append(re.escape(c.corrective))
        elif tail:
            patterns.append(re.escape(head) + r".*?" + re.escape(tail))
        spans = []
        for pattern in patterns:
            spans += [m.span() for m in re.finditer(pattern, text, re.DOTALL)]
        return sorted(spans)


def valid_searches(trajectory: Trajectory) -> int:
    """Searches that were executed (parsed, and passages came back or none matched): the paper's
    "valid search count"."""
    return sum(1 for a in trajectory.actions if a.kind == "search" and a.error is None)


def search_diagnostics(trajectory: Trajectory, example: Example) -> dict[str, float]:
    """Per-trajectory search statistics beyond the trainer's own (``searches``, ``response_len`` in
    policy tokens): executed searches and the response length with the retrieved tokens."""
    return {
        "valid_searches": float(valid_searches(trajectory)),
        "response_len_with_info": float(len(trajectory.completion_ids)),
    }


def thoughts(text: str) -> list[str]:
    """The ``<think>`` blocks of a text (for reports and format rewards)."""
    return [squash_ws(s.content) for s in find_spans(text, "think")]


_TURN_TAGS = ("think", "search", "answer")


def well_formed_turn(text: str, final: bool, *, empty_answer: bool = False) -> bool:
    """One policy turn in the canonical shape: optional ``<think>…</think>`` blocks, then exactly one
    ``<search>…</search>`` (a non-final turn) or ``<answer>…</answer>`` (the final turn), with nothing
    but whitespace outside the tags. The action's content must not be blank, except an answer's with
    ``empty_answer`` (a protocol where ``<answer> </answer>`` is the answer ``""``)."""
    action_tag = "answer" if final else "search"
    spans = sorted((s for tag in _TURN_TAGS for s in find_spans(text, tag)), key=lambda s: s.start)
    if not spans or spans[-1].tag != action_tag or any(s.tag != "think" for s in spans[:-1]):
        return False
    position = 0
    for span in spans:
        if span.start < position or text[position : span.start].strip():
            return False  # overlapping spans or stray text between them
        position = span.end
    blank_ok = empty_answer and action_tag == "answer"
    return not text[position:].strip() and (blank_ok or bool(squash_ws(spans[-1].content)))
