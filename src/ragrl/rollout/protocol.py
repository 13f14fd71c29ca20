"""The ``Protocol`` abstraction: a method's prompt and tag grammar, and the tag helpers every method reuses.

A protocol answers five questions for the rollout engine (``ragrl.rollout.engine``):

* what to send first: ``messages(example)`` (chat messages) and ``prompt_ids(example, tokenizer)``
  (through the tokenizer's chat template when it has one, else a plain-text rendering encoded once);
* when a policy turn stops: ``stop`` (stop strings, matched on the generated text only);
* what the policy did: ``parse(text, turn) -> Action`` on the text of ONE generated segment (never the
  prompt, never earlier turns). ``parse`` never raises: text it cannot read is an ``invalid`` action
  whose ``error`` says why;
* what the environment answers: ``observation(action, hits)`` for a search, ``corrective(action)`` for
  an invalid action;
* whether the episode is over: ``is_final(action)``;
* optionally, what the policy writes right after each search's observation: ``followup_stop``
  non-empty asks the engine for one more generation there (Eval-RAR's separate ``<evaluate>`` step),
  read by ``parse_followup``.

Nothing here special-cases a model: the only model-specific thing is the tokenizer's own chat template.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragrl.data.schema import Example
from ragrl.llm.chat import encode_messages, render_plain
from ragrl.retrieval.base import Hit
from ragrl.rollout.backtrack import invalid_backtrack
from ragrl.rollout.trajectory import Action, Trajectory

# -- tag helpers ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TagSpan:
    """One complete ``<tag>content</tag>`` occurrence: character offsets into the searched text."""

    tag: str
    start: int
    """Offset of ``<tag>``."""
    end: int
    """Offset just after ``</tag>``."""
    content: str
    """The raw text between the tags (not stripped)."""


def open_tag(tag: str) -> str:
    return f"<{tag}>"


def close_tag(tag: str) -> str:
    return f"</{tag}>"


def find_spans(text: str, tag: str) -> list[TagSpan]:
    """Every complete ``<tag>…</tag>`` span in ``text``, in order.

    Each closing tag is paired with the *last* opening tag before it that comes after the previous
    closing tag, so ``<search>a <search>b</search>`` yields one span with content ``b`` and an unclosed
    ``<search>`` yields nothing. Spans never overlap.
    """
    o, c = open_tag(tag), close_tag(tag)
    spans: list[TagSpan] = []
    pos = 0  # end of the previous closing tag
    while True:
        close_at = text.find(c, pos)
        if close_at < 0:
            return spans
        open_at = text.rfind(o, pos, close_at)
        if open_at >= 0:
            spans.append(TagSpan(tag, open_at, close_at + len(c), text[open_at + len(o) : close_at]))
        pos = close_at + len(c)


def first_span(text: str, tag: str) -> TagSpan | None:
    spans = find_spans(text, tag)
    return spans[0] if spans else None


def last_span(text: str, tag: str) -> TagSpan | None:
    spans = find_spans(text, tag)
    return spans[-1] if spans else None


def last_span_of(text: str, tags: Sequence[str]) -> TagSpan | None:
    """The complete span, of any of ``tags``, whose closing tag ends last in ``text``."""
    best: TagSpan | None = None
    for tag in tags:
        span = last_span(text, tag)
        if span is not None and (best is None or span.end > best.end):
            best = span
    return best


def strip_tags(text: str, tags: Sequence[str]) -> str:
    """Remove the opening and closing markers of ``tags`` (their content stays)."""
    for tag in tags:
        text = text.replace(open_tag(tag), "").replace(close_tag(tag), "")
    return text


_WS = re.compile(r"\s+")
_MARKUP = re.compile(r"</?[A-Za-z][\w-]*/?>")


END_TOKEN_TEXT = re.compile(r"<\|[^|<>]*\|>|</s>")
"""An end token's text as a saved completion holds it (``<|im_end|>``, ``<|endoftext|>``, ``<|eot|>``,
``</s>``): a response ends there (a live rollout stops at EOS; TIRESRAG-R1's reward cuts at
``<|im_end|>``)."""


def squash_ws(text: str) -> str:
    """Collapse runs of whitespace to one space and strip (for queries and answers)."""
    return _WS.sub(" ", text).strip()


# -- the abstraction -------------------------------------------------------------------------------


class Protocol(ABC):
    """A method's prompt and tag grammar (see the module docstring)."""

    name: str = "protocol"
    stop: tuple[str, ...] = ()
    needs_retriever: bool = True  # False: the policy reads given passages (ragrl eval needs no --index)
    backtracks: bool = False
    """True: the protocol has a backtrack action (``is_backtrack``), so its episodes are not linear and
    need ``rollout.kind: stepwise``."""
    followup_stop: tuple[str, ...] = ()
    """Non-empty: after every executed search's observation the engine runs one more policy generation,
    stopped by these strings (or EOS, or the token budgets), and records ``parse_followup`` of it. It
    belongs to the same step as the search (it does not count towards ``max_turns``)."""

    final_turn_note: str = ""
    """What the environment says before the extra turn ``rollout.final_answer_turn`` grants an
    unfinished episode (EVO-RAG: answer now); empty: nothing."""

    prefill: str = ""
    """Text that opens the assistant's turn as part of the prompt (TIRESRAG-R1's code prefills
    ``<think>``): the policy's first segment continues it. It is encoded on its own, without special
    tokens (a SentencePiece tokenizer that adds a dummy prefix space encodes it as a new word)."""

    @abstractmethod
    def messages(self, example: Example) -> list[dict[str, str]]:
        """The chat messages (``{"role", "content"}``) that open an episode."""

    def prompt_ids(self, example: Example, tokenizer: Any) -> list[int]:
        """The messages ready for generation (``encode_messages``), then the prefill."""
        ids = encode_messages(self.messages(example), tokenizer)
        if self.prefill:
            ids = ids + [int(t) for t in tokenizer.encode(self.prefill, add_special_tokens=False)]
        return ids

    def prompt_text(self, example: Example) -> str:
        """The plain-text rendering (what ``prompt_ids`` encodes when there is no chat template)."""
        return render_plain(self.messages(example)) + self.prefill

    @abstractmethod
    def parse(self, text: str, turn: int) -> Action:
        """The action in one generated segment. Must never raise: unreadable text is ``invalid``."""

    @abstractmethod
    def observation(self, action: Action, hits: list[Hit]) -> str:
        """The environment's answer to a search action."""

    @abstractmethod
    def corrective(self, action: Action) -> str:
        """The environment's answer to an invalid action."""

    def env_spans(self, text: str) -> list[tuple[int, int]]:
        """Character spans of environment text (observations, corrective messages) inside a saved
        completion, so it can be split back into policy and environment parts (``ragrl reward``).
        The default finds ``<information>…</information>`` blocks; protocols with other observations
        override it."""
        return [(s.start, s.end) for s in find_spans(text, "information")]

    def fixed_texts(self) -> list[str]:
        """The protocol's fixed wording (prompt templates and the like) that its configs do not spell
        out, so a locally trained tokenizer learns those words (``ragrl.llm.tiny``)."""
        return []

    def replay(
        self, record: dict[str, Any], path: Any, line: int, *, fallback: bool = False
    ) -> Trajectory | None:
        """A protocol whose saved steps carry more than text (R²AG's retrieved ids per query) rebuilds
        the trajectory of one ``{id, completion, ...}`` record here (``ragrl reward``); errors name
        ``path`` and ``line``; ``fallback`` as in ``trajectory_from_completion``. None (the default):
        the text alone is replayed."""
        return None

    def parse_followup(self, text: str, turn: int) -> Action:
        """The action recorded for a follow-up generation (see ``followup_stop``)."""
        return Action("followup", content=squash_ws(text), turn=turn)

    def is_final(self, action: Action) -> bool:
        return action.kind == "answer"

    def after_answer(self, trajectory: Trajectory, action: Action) -> str | None:
        """What the environment appends after an answer to ask for one more pass in the same episode
        (TIRESRAG-R1's reflection: the policy may revise its answer), or None to end the episode (the
        default). The engine keeps every answer (``Trajectory.answers``); the last one is final. It is
        called only while another turn is left, so a protocol that always asks still ends."""
        return None

    def is_search(self, action: Action) -> bool:
        return action.kind == "search"

    def is_backtrack(self, action: Action) -> bool:
        """A backtrack drops the previous step from the context the policy sees (``backtracks``)."""
        return self.backtracks and action.kind == "backtrack"

    def fallback_answer(self, text: str, invalid: Action) -> Action:
        """``rollout.invalid_fallback: answer``: a turn the protocol cannot read taken as the final answer
        (EVO-RAG §1.6): what follows the last ``</think>`` (all of it without a thinking block), tags
        removed, whitespace collapsed. A turn with no such text, or whose ``<think>`` never closes (a
        thought is not an answer), stays ``invalid``."""
        if "<think>" in text and "</think>" not in text:
            return invalid
        body = text.rpartition("</think>")[2]
        answer = squash_ws(_MARKUP.sub(" ", body))
        return Action("answer", content=answer, turn=invalid.turn) if answer else invalid

    def safe_parse(self, text: str, turn: int) -> Action:
        """``parse``, with any exception turned into an invalid action (a last line of defence)."""
        try:
            return self.parse(text, turn)
        except Exception as e:  # noqa: BLE001 - a protocol bug must not kill a batch of rollouts
            return Action("invalid", turn=turn, error=f"parser error: {type(e).__name__}: {e}")


def read_turn(
    protocol: Protocol, text: str, turn: int, hops: int, *, fallback: bool = False, tokenizer: Any = None
) -> tuple[Action, bool]:
    """The action of one policy turn as a rollout carries it out, and whether it is a fallback answer:
    the protocol's parse (``safe_parse``); with ``fallback`` (``rollout.invalid_fallback: answer``) a turn
    it cannot read is taken as the answer (``Protocol.fallback_answer``, on the text without the
    ``tokenizer``'s special tokens); a backtrack that cannot be carried out with ``hops`` steps in the
    context is invalid (``ragrl.rollout.backtrack``). The live engine, sibling candidates and text
    replays all read turns here."""
    action = protocol.safe_parse(text, turn)
    action.turn = turn
    if action.kind == "invalid" and fallback:
        for token in getattr(tokenizer, "all_special_tokens", None) or []:  # an EOS that ended the turn
            text = text.replace(token, " ")
        answer = protocol.fallback_answer(text, action)
        return answer, answer is not action
    if protocol.is_backtrack(action):
        action = invalid_backtrack(action, hops) or action
    return action, False
