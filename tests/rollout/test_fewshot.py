"""Few-shot prompting: shots in front of the question, in the wrapped protocol's own layout."""

import pytest

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.methods import load_method
from ragrl.rollout.fewshot import FewShotProtocol, Shot, shots_from_trajectories
from ragrl.rollout.trajectory import Segment, Trajectory


def _example(i: int, question: str) -> Example:
    return Example(id=f"q{i}", question=question, answers=["x"])


def test_shots_come_first_as_user_and_assistant_turns_and_the_question_last():
    inner = load_method("search_r1").protocol
    shots = [
        Shot(_example(1, "Who founded A?"), "<answer> Bo </answer>"),
        Shot(_example(2, "Where is B?"), "R2"),
    ]
    messages = FewShotProtocol(inner, shots).messages(_example(3, "What is C?"))
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[0] == inner.messages(shots[0].example)[0]
    assert messages[1]["content"] == "<answer> Bo </answer>" and messages[3]["content"] == "R2"
    assert messages[-1] == inner.messages(_example(3, "What is C?"))[0]


def test_a_system_message_appears_once_and_everything_else_is_the_inner_protocols():
    inner = load_method("search_r1", ["protocol.system=You search."]).protocol
    few = FewShotProtocol(inner, [Shot(_example(1, "Who founded A?"), "reply")])
    roles = [m["role"] for m in few.messages(_example(2, "What is C?"))]
    assert roles == ["system", "user", "assistant", "user"]
    text = "<think> t </think>\n<search> who founded A </search>"
    assert few.parse(text, 0) == inner.parse(text, 0)
    assert few.stop == inner.stop and few.name == inner.name and few.needs_retriever
    assert few.fixed_texts() == inner.fixed_texts()
    with pytest.raises(RagrlError, match="at least one shot"):
        FewShotProtocol(inner, [])


def test_shots_are_answered_demonstrations_without_the_end_token():
    def traj(i: int, reason: str, text: str) -> Trajectory:
        return Trajectory(f"q{i}", [1], segments=[Segment("policy", [2], text=text)], finish_reason=reason)

    examples = {f"q{i}": _example(i, f"question {i}") for i in range(3)}
    played = [
        traj(0, "answer", "<answer> Bo </answer><|im_end|>\n"),
        traj(1, "max_turns", "<search> a </search>"),
        traj(2, "answer", "<answer> Cy </answer>"),
    ]
    shots = shots_from_trajectories(played, examples, "<|im_end|>")
    assert [(s.example.id, s.reply) for s in shots] == [
        ("q0", "<answer> Bo </answer>"),
        ("q2", "<answer> Cy </answer>"),
    ]
