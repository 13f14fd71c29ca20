"""TIRESRAG-R1's judged rewards: what the judges see, how replies are read, the offline proxy, and a
batch through a real OpenAI-compatible HTTP endpoint (``chat_server`` in tests/conftest.py)."""

from __future__ import annotations

import pytest

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.methods.tiresrag.judges import (
    judge_inputs,
    judge_parse_failures,
    parse_sufficiency,
    parse_thinking,
    proxy_sufficiency,
    proxy_thinking,
    sufficiency_reward,
    thinking_reward,
    without_answers,
)
from ragrl.rewards import RewardContext
from ragrl.rollout.trajectory import Action, Segment, Trajectory

EX = Example("q1", "Who founded the lab that built Zorvex?", ["Mira Tolan"])
THINK = "<think> Zorvex was built by a lab. </think>\n<search> Zorvex lab </search>"
INFO = "<information> Doc 1: Zorvex was built by Tolan Labs, founded by Mira Tolan. </information>"
ANSWER = "<think> So Mira Tolan. </think>\n<answer> Mira Tolan </answer>"
REFLECT = "<think> Checking again. </think>\n<answer> Mira Tolan </answer>"


def episode(answer: str = "Mira Tolan", found: bool = True) -> Trajectory:
    info = INFO if found else "<information> No results. </information>"
    return Trajectory(
        "q1",
        [0],
        segments=[
            Segment("policy", [1], THINK),
            Segment("env", [2], info),
            Segment("policy", [3], ANSWER.replace("Mira Tolan </answer>", f"{answer} </answer>")),
            Segment("policy", [4], REFLECT.replace("Mira Tolan", answer)),
        ],
        actions=[
            Action("search", content="Zorvex lab", retrieved_ids=["d1"] if found else []),
            Action("answer", content=answer),
            Action("answer", content=answer),
        ],
        final_answer=answer,
    )


def test_the_judges_never_see_an_answer_span():
    assert without_answers("a <answer> x </answer> b <answer>y</answer>") == "a  b "
    seen = judge_inputs(episode())
    assert "<answer>" not in seen["context"] and "So Mira Tolan." in seen["context"]
    assert INFO in seen["context"]
    assert seen["information"] == "Doc 1: Zorvex was built by Tolan Labs, founded by Mira Tolan."
    assert seen["thinking"].splitlines()[0] == "<think> Zorvex was built by a lab. </think>"
    assert INFO not in seen["thinking"] and "<answer>" not in seen["thinking"]


def test_the_judges_read_the_response_as_the_code_does_prefill_included():
    """The code's reward reads the response after ``<|im_start|>assistant\n``, so the prefilled
    ``<think>`` opens it; its ``extract_information_and_others`` gives the information blocks' contents
    (stripped, one per line) and the text outside them (the start, then what follows each block). The
    expected strings are written by hand from those rules."""
    t = episode()
    t.segments[0] = Segment("policy", [1], THINK.removeprefix("<think>"))  # the policy continues "<think>"
    t.segments[-1] = Segment("policy", [4], REFLECT + "<|im_end|>")  # the code cuts at the end token
    seen = judge_inputs(t, prefill="<think>")
    assert seen["context"] == (
        "<think> Zorvex was built by a lab. </think>\n<search> Zorvex lab </search>"
        + INFO
        + "<think> So Mira Tolan. </think>\n<think> Checking again. </think>\n"
    )
    assert seen["information"] == "Doc 1: Zorvex was built by Tolan Labs, founded by Mira Tolan."
    assert seen["thinking"] == (
        "<think> Zorvex was built by a lab. </think>\n<search> Zorvex lab </search>\n"
        "<think> So Mira Tolan. </think>\n<think> Checking again. </think>"
    )
    assert judge_inputs(t)["context"].startswith(" Zorvex")  # no prefill: the completion alone


@pytest.mark.parametrize(
    ("reply", "value"),
    [
        (
            "### EXPLANATION\nBoth hops hold.\n### EVALUATION (JSON)\n"
            '{"Sufficient Context To The Given Answer": 1}',
            1.0,
        ),
        ('{"SUFFICIENT CONTEXT TO THE GIVEN ANSWER": 0}', 0.0),
        ('{ "sufficient context to the given answer" : 1.0 }', 1.0),
        ('{"Sufficient Context To The Given Answer": 2}', None),
        ('{"Sufficient Context To The Given Answer": true}', None),
        ('{"Sufficient Context To The Given Answer": "yes"}', None),
        ("The context is sufficient.", None),
    ],
)
def test_parse_sufficiency(reply, value):
    assert parse_sufficiency(reply) == value


@pytest.mark.parametrize(
    ("reply", "value"),
    [
        ("0.7", 0.7),
        (" 1.0\n", 1.0),
        ("<think>weighing it</think>\n0.3", 0.3),
        ("0.7 because", None),
        ("1.5", None),
        ("", None),
    ],
)
def test_parse_thinking(reply, value):
    assert parse_thinking(reply) == value


def test_offline_proxy():
    assert proxy_sufficiency(episode(), EX) == 1.0
    assert proxy_sufficiency(episode(found=False), EX) == 0.0
    assert proxy_thinking(episode()) == 1.0  # searched; the answer is in the evidence
    assert proxy_thinking(episode("Oslo")) == 0.5  # an answer the evidence does not hold
    closed = Trajectory("q1", [0], actions=[Action("answer", content="Oslo")], final_answer="Oslo")
    assert proxy_thinking(closed) == 0.0  # no search, nothing to ground the answer in
    ctx = RewardContext()
    assert sufficiency_reward([episode(), episode(found=False)], [EX, EX], ctx) == [1.0, 0.0]
    with pytest.raises(RagrlError, match="proxy takes no settings"):
        thinking_reward([episode()], [EX], ctx, judge={"kind": "proxy", "model": "x"})


def reply(text: str | None) -> tuple[int, dict]:
    return 200, {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "judge",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
    }


def test_judged_batch_through_an_openai_endpoint(chat_server):
    judge = {"kind": "openai", "base_url": chat_server.url, "model": "qwen3-8b", "concurrency": 1}
    episodes = [episode(), episode("Oslo", found=False), episode()]
    chat_server.script = [
        reply('### EVALUATION (JSON)\n{"Sufficient Context To The Given Answer": 1}'),
        reply('{"Sufficient Context To The Given Answer": 0}'),
        reply("I cannot tell."),
    ]
    values = sufficiency_reward(episodes, [EX] * 3, RewardContext(), judge=judge)
    assert values == [1.0, 0.0, 0.0]  # the unreadable reply scores 0 ...
    assert judge_parse_failures(episodes) == {"tiresrag_sufficiency": 1}  # ... and is counted
    first = chat_server.requests[0]["body"]["messages"]
    assert first[0]["role"] == "system" and "Sufficient Context To The Given Answer" in first[0]["content"]
    assert first[1]["content"].startswith(
        f"### QUESTION\n{EX.question}\n### ANSWER\nMira Tolan\n### REFERENCES\n"
    )
    assert "<answer>" not in first[1]["content"]

    chat_server.script = [reply("0.8"), reply("<think>meh</think> 0.2"), reply("great")]
    assert thinking_reward(episodes, [EX] * 3, RewardContext(), judge=judge) == [0.8, 0.2, 0.0]
    nothing = [episode()]  # a reply without text (content: null) is unreadable too, not an error
    chat_server.script = [reply(None)]
    assert thinking_reward(nothing, [EX], RewardContext(), judge=judge) == [0.0]
    assert judge_parse_failures(nothing) == {"tiresrag_thinking": 1}
    user = chat_server.requests[3]["body"]["messages"][1]["content"]
    assert user.startswith(
        "INPUT:\n### CONTEXT\nDoc 1: Zorvex was built by Tolan Labs, founded by Mira Tolan.\n"
        f"### QUESTION\n{EX.question}\n### MODEL THINKING PROCESS\n"
    )
    assert "### ANSWER" not in user  # the thinking judge never sees the gold answer
    assert judge_parse_failures(episodes) == {"tiresrag_sufficiency": 1, "tiresrag_thinking": 1}
    assert episodes[2].metadata["judge"]["tiresrag_thinking"] == {"reply": "great", "parsed": False}
    assert len(chat_server.requests) == 7


def test_a_corrective_message_is_not_evidence():
    # no search, one invalid action: the environment's corrective text holds "no" and "answer"
    invalid = Trajectory(
        "q1",
        [0],
        segments=[
            Segment("policy", [1], "I think no."),
            Segment("env", [2], "\nThat was not a valid action. Write a query or the final answer.\n"),
            Segment("policy", [3], "<answer> no </answer>"),
        ],
        actions=[Action("invalid", error="no tag"), Action("answer", content="no")],
        final_answer="no",
    )
    assert judge_inputs(invalid)["information"] == ""
    yes_no = Example("q2", "Is Oslo in Sweden?", ["no"])
    assert proxy_sufficiency(invalid, yes_no) == 0.0 and proxy_thinking(invalid) == 0.0
