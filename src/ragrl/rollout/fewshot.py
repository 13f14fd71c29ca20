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
from ragrl.rollout.protocol import Protocol, squash_ws
from ragrl.rollout.trajectory import Action, Trajectory


@dataclass(frozen=True, slots=True)
class Shot:
    example: Example
    reply: str
    """What the assistant wrote for ``example``, observations included, without the end-of-turn token."""


def shots_from_trajectories(
    trajectories: Sequence[Trajectory],
    examples: Mapping[str, Example],
    eos: str | None,
    *,
    must_search: bool = False,
    prefill: str = "",
) -> list[Shot]:
    """One shot per demonstration worth showing: it ended with an answer, wrote no invalid turn, is not
    an unanswerable question's refusal, and (``must_search``: the protocol searches) searched at least
    once. ``eos`` (the tokenizer's end token) is taken off the end of the reply, since the chat template
    closes the assistant's message itself; the protocol's ``prefill`` (in the prompt, not the
    completion) opens it, so a shot shows the whole assistant turn."""
    shots: list[Shot] = []
    for t in trajectories:
        example = examples.get(t.example_id)
        if example is None or t.finish_reason != "answer" or t.num_invalid > 0:
            continue
        if not example.answerable or (must_search and t.num_searches == 0):
            continue
        reply = (prefill + t.completion_text).rstrip()
        if eos and reply.endswith(eos):
            reply = reply[: -len(eos)].rstrip()
        shots.append(Shot(example, reply))
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
        self.prefill = inner.prefill

    def messages(self, example: Example) -> list[dict[str, str]]:
        """The question's own system message (if any) first, then each shot's user turn and reply, then
        the question's user turn: a system template that names the question names the evaluated one."""
        question = self.inner.messages(example)
        out = [m for m in question if m["role"] == "system"]
        for shot in self.shots:
            out.extend(m for m in self.inner.messages(shot.example) if m["role"] != "system")
            out.append({"role": "assistant", "content": shot.reply})
        out.extend(m for m in question if m["role"] != "system")
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


def dropped_shots(protocol: FewShotProtocol, example: Example, tokenizer: Any) -> list[str]:
    """The ids of the shots whose reply is not in the encoded prompt of ``example``: some chat templates
    (Qwen3's, for one) keep only the text after ``</think>`` of assistant turns before the last user
    turn, which would silently cut a shot's searches and observations out."""
    prompt = squash_ws(tokenizer.decode(protocol.prompt_ids(example, tokenizer)))
    dropped: list[str] = []
    for shot in protocol.shots:
        reply = squash_ws(tokenizer.decode(tokenizer.encode(shot.reply, add_special_tokens=False)))
        core = reply[20:-20] if len(reply) > 60 else reply  # the ends may merge with the template's tokens
        if core not in prompt:
            dropped.append(shot.example.id)
    return dropped
