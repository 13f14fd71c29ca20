"""Few-shot prompting: worked examples in front of the question, in the method's own protocol.

A shot is another question and a demonstrated reply to it: the text after the prompt of a
demonstration played through the real rollout (its turns and the observations between them), so the
model sees the exact layout it will have to write. ``FewShotProtocol`` puts each shot's opening
messages and its reply (as the assistant's message) before the evaluated question's messages; parsing,
observations and everything else are the wrapped protocol's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.retrieval.base import Hit
from ragrl.rollout.protocol import Protocol
from ragrl.rollout.trajectory import Action, Trajectory


@dataclass(frozen=True, slots=True)
class Shot:
    example: Example
    reply: str
    """What the assistant wrote for ``example``, observations included, without the end-of-turn token."""


def shots_from_trajectories(
    trajectories: Sequence[Trajectory], examples: Mapping[str, Example], eos: str | None
) -> list[Shot]:
    """One shot per demonstration that ended with an answer; ``eos`` (the tokenizer's end token) is
    taken off the end of the reply, since the chat template closes the assistant's message itself."""
    shots: list[Shot] = []
    for t in trajectories:
        if t.finish_reason != "answer" or t.example_id not in examples:
            continue
        reply = t.completion_text.rstrip()
        if eos and reply.endswith(eos):
            reply = reply[: -len(eos)].rstrip()
        shots.append(Shot(examples[t.example_id], reply))
    return shots


class FewShotProtocol(Protocol):
    """``inner`` with ``shots`` in front of every question (see the module docstring)."""

    def __init__(self, inner: Protocol, shots: Sequence[Shot]) -> None:
        if not shots:
            raise RagrlError("few-shot prompting needs at least one shot")
        self.inner = inner
        self.shots = list(shots)
        self.name = inner.name
        self.stop = inner.stop
        self.needs_retriever = inner.needs_retriever
        self.backtracks = inner.backtracks
        self.followup_stop = inner.followup_stop

    def messages(self, example: Example) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        for shot in [*self.shots, None]:
            opening = self.inner.messages(example if shot is None else shot.example)
            if out:  # the system message, if any, once at the top
                opening = [m for m in opening if m["role"] != "system"]
            out.extend(opening)
            if shot is not None:
                out.append({"role": "assistant", "content": shot.reply})
        return out

    def parse(self, text: str, turn: int) -> Action:
        return self.inner.parse(text, turn)

    def observation(self, action: Action, hits: list[Hit]) -> str:
        return self.inner.observation(action, hits)

    def corrective(self, action: Action) -> str:
        return self.inner.corrective(action)

    def env_spans(self, text: str) -> list[tuple[int, int]]:
        return self.inner.env_spans(text)

    def fixed_texts(self) -> list[str]:
        return self.inner.fixed_texts()

    def parse_followup(self, text: str, turn: int) -> Action:
        return self.inner.parse_followup(text, turn)

    def is_final(self, action: Action) -> bool:
        return self.inner.is_final(action)

    def after_answer(self, trajectory: Trajectory, action: Action) -> str | None:
        return self.inner.after_answer(trajectory, action)

    def is_search(self, action: Action) -> bool:
        return self.inner.is_search(action)

    def is_backtrack(self, action: Action) -> bool:
        return self.inner.is_backtrack(action)

    def __getattr__(self, name: str) -> Any:
        """Anything else a method's protocol offers (ARENA's passage numbering, ...) is the inner one's."""
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
