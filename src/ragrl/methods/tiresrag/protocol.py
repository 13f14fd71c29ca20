"""TIRESRAG-R1's protocol: think, retrieve, answer, reflect once (spec ``methods/tiresrag.md`` §1).

**The rollout (§1.2–1.4)** is Search-R1's loop with the method's prompt and insertion format. The
instructions go in the system message and the raw question in the user message. A search's passages
come back as ``\n\n<information>\n(1)Title text\n(2)…</information>\n\n`` (``None`` when nothing is
found; the code also drops a leading number from a KILT passage, which our corpora do not have). After
the first ``<answer>``, ``reflect: true`` continues the same episode once (``reflection_cue``, empty by
default, is inserted first): the policy may think, search again and answer again; the last answer is
final and every answer is kept for R^R. The released code gets the same effect by not stopping at
``</answer>`` during training; it stops there at evaluation (§8 Q7), which ``reflect: false``
reproduces. A reflection pass that neither searches nor answers again ends the episode with its answer
(the turn is kept as a ``reflect`` action), as the code ends a segment without a search. The code's
retrieval cap (8) is approximated by ``rollout.max_turns`` (searches and answers share the turns: 10
leaves room for 8 searches, an answer and its reflection, but a policy that never answers may search 9
times). ``prefill: "<think>"`` opens the assistant turn with ``<think>`` as the code does (the paper's
config); the policy's first segment continues it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ragrl.rollout.protocol import END_TOKEN_TEXT
from ragrl.rollout.search_protocol import (
    SearchR1Protocol,
    SearchR1ProtocolConfig,
    well_formed_turn,
)
from ragrl.rollout.trajectory import Action, Segment, Trajectory

VARIANT = "tiresrag"
"""The method's answer normalization (``ragrl.metrics.normalize``)."""


NO_ANSWER_MODES = ("zero", "text")


REFLECTION_MODES = ("paper", "code")


TIRESRAG_SYSTEM = (
    "You are a helpful assistant who answers questions. Think the question through inside <think> and "
    "</think> before any answer, and check every key entity it names (people, places, dates, awards). "
    "When you are unsure or need outside knowledge, write a query as <search> query </search>; the top "
    "results come back between <information> and </information>. Read and weigh each new piece of "
    "information; you may search as often as you need. Follow the evidence strictly. Before answering, "
    "check that your answer answers the original question exactly, and prefer the most precise span of "
    "the evidence. Give the final answer inside <answer> and </answer>, for example <answer> Beijing "
    "</answer>. After your first answer you have one chance to reflect: you may stop there, or go over "
    "your reasoning and the information again, search again if needed, and then give the answer again "
    "inside <answer> and </answer>."
)


@dataclass
class TiresragProtocolConfig(SearchR1ProtocolConfig):
    system: str | None = TIRESRAG_SYSTEM
    user: str = "{question}"
    information_prefix: str = "\n\n<information>\n"
    information_suffix: str = "</information>\n\n"
    doc_template: str = "({index}){title} {text}\n"
    doc_separator: str = ""
    no_results: str = "None"
    reflect: bool = True
    """One more pass after the first answer (training); false stops at the first answer (the code's eval)."""
    reflection_cue: str = ""
    """Environment text inserted before the reflection pass (empty: the policy just goes on)."""
    prefill: str = ""
    """Text that opens the assistant turn as part of the prompt (the code prefills ``<think>``); the
    policy's first segment continues it."""
    empty_answer: str = "answer"
    """``<answer> </answer>`` is the answer ``""`` (F1 0; a reflection from right to empty is −1), as the
    code reads it; ``invalid`` answers it with a corrective message instead."""


class TiresragProtocol(SearchR1Protocol):
    name = "tiresrag"

    def __init__(self, config: TiresragProtocolConfig | None = None) -> None:
        super().__init__(config or TiresragProtocolConfig())
        self.prefill = self.config.prefill

    def fixed_texts(self) -> list[str]:
        return [TIRESRAG_SYSTEM, REFLECTION_THOUGHT]

    def after_answer(self, trajectory: Trajectory, action: Action) -> str | None:
        """The reflection pass: once, after the first answer."""
        if not self.config.reflect or len(trajectory.answers) > 1:
            return None
        return self.config.reflection_cue


def turn_segments(trajectory: Trajectory) -> list[Segment]:
    """The policy segments that are turns, one per action: every one of a live episode; of an episode
    rebuilt from text, those that are not blank (the text between two observations is not a turn)."""
    policy = [s for s in trajectory.segments if s.kind == "policy"]
    if trajectory.metadata.get("replayed_from_text"):
        return [s for s in policy if s.text.strip()]
    return policy


def format_valid(trajectory: Trajectory, prefill: str = "", empty_answer: bool = True) -> bool:
    """The code's format check (§1.5), logged and never rewarded: every turn is ``<think>`` blocks then
    one ``<search>`` (or, for an answer, ``<answer>``) with no stray text, and the episode ends with an
    answer. A reflection declined with nothing (only the end token) is fine; one that writes a
    ``<think>`` block and stops is not (its last tag is not ``</answer>``), nor is an invalid turn. The
    first turn is read with the prefill it continues; an empty ``<answer> </answer>`` is well formed
    (``empty_answer``, the code's reading). Unlike the code's state machine, ``<think>`` is optional in a
    turn."""
    if trajectory.final_answer is None:
        return False
    texts = [s.text for s in turn_segments(trajectory)]
    actions = trajectory.actions
    if not texts or len(texts) != len(actions):
        return False
    texts[0] = prefill + texts[0]
    if actions[-1].kind == "reflect" and not END_TOKEN_TEXT.sub("", texts[-1]).strip():
        texts, actions = texts[:-1], actions[:-1]  # the reflection declined with nothing
    for text, action in zip(texts, actions, strict=True):
        final = action.kind == "answer"
        if action.kind not in ("search", "answer") or not well_formed_turn(
            text, final=final, empty_answer=empty_answer
        ):
            return False
    return bool(actions) and actions[-1].kind == "answer"


REFLECTION_THOUGHT = "I read the question and the information again, and my answer stands."
