"""EVO-RAG's protocol (spec ``methods/evo-rag.md`` §1): Search-R1's grammar with backtracking and
refusal.

**The agent (§1).** At every step the policy writes, after an optional ``<think>`` block, exactly one
action: ``<search>sub-query</search>`` (the retriever's passages come back in ``<information>``),
``<backtrack/>`` (the last step and its evidence leave the context; the step count goes on;
``<backtrack>k</backtrack>`` goes back to just before step k of the context, ``ragrl.rollout.backtrack``;
with nothing to take back it is invalid),
``<answer>span</answer>`` or ``<refuse/>`` (both end the episode; a refusal's answer is
``protocol.refusal_answer``, the synthetic world's answer to an unanswerable question). Text with no
action tag, or with tags of two kinds, is an invalid step: it is counted, answered with a corrective,
and costs a step. The episode is capped at T_max = 20 steps (``rollout.max_turns``); a truncated
episode gets one forced answer turn (``rollout.final_answer_turn``) and is logged as truncated.
``rollout.kind: stepwise`` trains each step on the context the policy saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ragrl.errors import DataError, RagrlError
from ragrl.rollout.protocol import find_spans, squash_ws
from ragrl.rollout.search_protocol import SearchR1Protocol, SearchR1ProtocolConfig
from ragrl.rollout.trajectory import Action, Trajectory

DEFAULT_USER = (
    "Answer the multi-hop question below by searching a Wikipedia index one step at a time. At every "
    "step, think briefly inside <think> and </think>, then write exactly one action: <search> a short, "
    "self-contained sub-query </search> to retrieve passages, which are shown to you between "
    "<information> and </information>; <backtrack/> to drop your last step and its passages; <answer> "
    "a short answer </answer> once the passages suffice; or <refuse/> when they cannot answer the "
    "question. Do not repeat earlier sub-queries.\nQuestion: {question}"
)


@dataclass
class EvoRagProtocolConfig(SearchR1ProtocolConfig):
    """Search-R1's prompt, passages and corrective settings, with EVO-RAG's wording and two more."""

    user: str = DEFAULT_USER
    corrective: str = (
        "\nThat was not a valid action ({error}). Write one of <search> query </search>, <backtrack/>, "
        "<answer> answer </answer> or <refuse/>.\n"
    )
    answer_now: str = (
        "\nThat was the last search step. Answer now with <answer> answer </answer> or <refuse/>.\n"
    )
    """Said before the forced answer turn of an episode that reached T_max (``final_answer_turn``)."""
    refusal_answer: str = "unknown"
    """The final answer an episode that refuses is scored with (the synthetic world's answer to an
    unanswerable question); r_ans is 0 for a refusal either way."""


MARKERS = {"backtrack": "<backtrack/>", "refuse": "<refuse/>"}


class EvoRagProtocol(SearchR1Protocol):
    """Search-R1's protocol (prompt, passages, corrective, env spans) with EVO-RAG's four actions."""

    name = "evo_rag"
    backtracks = True
    stop = ("</search>", "</answer>", "<backtrack/>", "</backtrack>", "<refuse/>")

    def __init__(self, config: EvoRagProtocolConfig | None = None) -> None:
        super().__init__(config or EvoRagProtocolConfig())
        if self.config.empty_answer != "invalid":
            raise RagrlError("protocol.empty_answer: EVO-RAG's strict parse keeps an empty answer invalid")
        self.final_turn_note = self.config.answer_now

    def parse(self, text: str, turn: int) -> Action:
        """Strict: only the text after the last ``</think>`` counts; it must hold action tags of exactly
        one kind (the last one of that kind is taken)."""
        if not isinstance(text, str):
            return Action("invalid", turn=turn, error="no text")
        head, closed, tail = text.rpartition("</think>")
        if not closed and "<think>" in text:
            return Action("invalid", turn=turn, error="unclosed <think>")
        body = tail if closed else text
        found: dict[str, str | None] = {}
        for tag in self.action_tags:
            spans = find_spans(body, tag)
            if spans:
                found[tag] = squash_ws(spans[-1].content)
        for kind, marker in MARKERS.items():
            if marker in body:
                found[kind] = None
        numbered = find_spans(body, "backtrack")  # <backtrack>k</backtrack>: back to before step k
        if numbered and numbered[-1].start > body.rfind(MARKERS["backtrack"]):
            k = squash_ws(numbered[-1].content)
            if not (k.isdigit() and int(k) >= 1):
                return Action(
                    "invalid", turn=turn, error="<backtrack>k</backtrack> takes a step number k >= 1"
                )
            found["backtrack"] = k
        if not found:
            return Action("invalid", turn=turn, error="no action tag")
        if len(found) > 1:
            return Action("invalid", turn=turn, error=f"more than one action ({', '.join(found)})")
        kind, content = next(iter(found.items()))
        if kind in self.action_tags and not content:
            return Action("invalid", turn=turn, error=f"empty {'query' if kind == 'search' else 'answer'}")
        if kind == "refuse":
            content = self.config.refusal_answer
        return Action(kind, content=content or "", turn=turn)

    def is_final(self, action: Action) -> bool:
        return action.kind in ("answer", "refuse")

    def env_spans(self, text: str) -> list[tuple[int, int]]:
        """Search-R1's observation and corrective spans, and the answer-now note."""
        import re

        note = self.config.answer_now
        spans = super().env_spans(text) + (
            [m.span() for m in re.finditer(re.escape(note), text)] if note else []
        )
        return sorted(spans)

    def fixed_texts(self) -> list[str]:
        return [DEFAULT_USER, *MARKERS.values()]

    def replay(
        self, record: dict[str, Any], path: Any, line: int, *, fallback: bool = False
    ) -> Trajectory | None:
        """A saved episode as text, ``{id, completion, retrieved_ids?, retrieved_titles?}``: the completion
        (observations included) is split into steps as the rollout made them, and ``retrieved_ids``
        gives each executed search's passage ids in order (one list per search), which r_ret and the
        gold verifier read. Without it the text alone is replayed (every search then misses)."""
        from ragrl.rollout.replay import trajectory_from_completion

        if "retrieved_ids" not in record:
            return None
        traj = trajectory_from_completion(str(record["id"]), record["completion"], self, fallback=fallback)
        searches = [a for a in traj.actions if a.kind == "search"]
        for key in ("retrieved_ids", "retrieved_titles"):
            lists = record.get(key, [[] for _ in searches])
            if not isinstance(lists, list) or not all(
                isinstance(x, list) and all(isinstance(i, str) for i in x) for x in lists
            ):
                raise DataError(
                    "must be a list of lists of strings, one per search", path=path, line=line, field=key
                )
            if len(lists) != len(searches):
                raise DataError(
                    f"has {len(lists)} lists but the completion makes {len(searches)} searches",
                    path=path,
                    line=line,
                    field=key,
                )
            for action, values in zip(searches, lists, strict=True):
                setattr(action, key, list(values))
        return traj
