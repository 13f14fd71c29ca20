import pytest

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.limits import check_prompt_length, limit_questions


def _ex(i: int, question: str) -> Example:
    return Example(id=f"q{i}", question=question, answers=["a"])


def test_long_questions_are_cut_and_reported():
    config = RolloutConfig(max_question_chars=10)
    examples = [_ex(0, "short?"), _ex(1, "x" * 25), _ex(2, "y" * 11)]
    out, report = limit_questions(examples, config, "data.jsonl")
    assert [ex.question for ex in out] == ["short?", "x" * 10, "y" * 10]
    assert out[1].metadata["question_chars"] == 25 and "question_chars" not in out[0].metadata
    assert examples[1].question == "x" * 25  # the input is not modified
    assert report.cut == ("q1", "q2") and report.longest == 25
    assert report.summary("data.jsonl", 10) == (
        "data.jsonl: cut 2 question(s) to rollout.max_question_chars=10 characters "
        "(longest 25; first: q1, q2)"
    )


def test_long_questions_can_be_refused_with_the_question_named():
    config = RolloutConfig(max_question_chars=10, long_questions="reject")
    with pytest.raises(RagrlError, match=r"data.jsonl: question 'q1' has 25 characters, over .*=10"):
        limit_questions([_ex(0, "ok"), _ex(1, "x" * 25)], config, "data.jsonl")


def test_prompts_over_the_token_limit_are_refused():
    config = RolloutConfig(max_prompt_tokens=4)
    check_prompt_length(_ex(0, "q"), [1, 2, 3, 4], config)
    with pytest.raises(
        RagrlError, match=r"question 'q0': its prompt is 5 tokens, over .*max_prompt_tokens=4"
    ):
        check_prompt_length(_ex(0, "q"), [1, 2, 3, 4, 5], config)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"long_questions": "cut"}, "rollout.long_questions must be one of truncate, reject"),
        ({"max_question_chars": 0}, "rollout.max_question_chars must be a positive integer"),
        ({"max_prompt_tokens": -1}, "rollout.max_prompt_tokens must be a positive integer"),
    ],
)
def test_limit_settings_are_checked(bad, message):
    with pytest.raises(RagrlError, match=message):
        RolloutConfig(**bad)


def test_a_question_set_with_one_over_long_prompt_is_refused_up_front(world_dir):
    from ragrl.data.io import read_examples
    from ragrl.llm.hf_backend import load_tokenizer
    from ragrl.methods import load_method
    from ragrl.rollout.limits import check_prompts

    method = load_method("search_r1-tiny", ["rollout.max_prompt_tokens=200"])
    tokenizer = load_tokenizer(world_dir / "model")
    examples, _ = read_examples(world_dir / "test.jsonl")
    check_prompts(examples[:20], method.protocol, tokenizer, method.rollout, "test.jsonl")
    long = Example(id="q-long", question="Who? " + "Zorvex " * 300, answers=["a"])
    with pytest.raises(RagrlError, match=r"test.jsonl: question 'q-long': its prompt is \d+ tokens, over"):
        check_prompts([*examples[:20], long], method.protocol, tokenizer, method.rollout, "test.jsonl")
