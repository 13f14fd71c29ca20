"""Few-shot prompting: shots in front of the question, in the wrapped protocol's own layout."""

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.methods import load_method
from ragrl.rollout.fewshot import FewShotProtocol, Shot, dropped_shots, shots_from_trajectories
from ragrl.rollout.trajectory import Action, Segment, Trajectory


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


def test_the_system_message_is_the_evaluated_questions_and_appears_once():
    inner = load_method("search_r1", ["protocol.system=You search. ({question})"]).protocol
    few = FewShotProtocol(inner, [Shot(_example(1, "Who founded A?"), "reply")])
    messages = few.messages(_example(2, "What is C?"))
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"] == "You search. (What is C?)"  # not the shot's question
    assert "Who founded A?" in messages[1]["content"] and "What is C?" in messages[3]["content"]
    text = "<think> t </think>\n<search> who founded A </search>"
    assert few.parse(text, 0) == inner.parse(text, 0)
    assert few.stop == inner.stop and few.name == inner.name and few.needs_retriever
    assert few.fixed_texts() == inner.fixed_texts()
    with pytest.raises(RagrlError, match="at least one shot"):
        FewShotProtocol(inner, [])


def test_shots_are_well_answered_demonstrations_without_the_end_token():
    def traj(i: int, reason: str, text: str, *kinds: str) -> Trajectory:
        actions = [Action(kind, turn=t) for t, kind in enumerate(kinds)]
        segments = [Segment("policy", [2], text=text)]
        return Trajectory(f"q{i}", [1], segments=segments, actions=actions, finish_reason=reason)

    examples = {f"q{i}": _example(i, f"question {i}") for i in range(6)}
    examples["q4"].metadata["answerable"] = False
    played = [
        traj(0, "answer", "<search> a </search>...<answer> Bo </answer><|im_end|>\n", "search", "answer"),
        traj(1, "max_turns", "<search> a </search>", "search", "search"),  # never answered
        traj(2, "answer", "<search> b </search>...<answer> Cy </answer>", "search", "answer"),
        traj(3, "answer", "oops <search> c </search>...<answer> Di </answer>", "invalid", "search", "answer"),
        traj(4, "answer", "<search> d </search>...<answer> unknown </answer>", "search", "answer"),
        traj(5, "answer", "<answer> Ed </answer>", "answer"),  # answered without searching
    ]
    shots = shots_from_trajectories(played, examples, "<|im_end|>", must_search=True)
    assert [(s.example.id, s.reply) for s in shots] == [
        ("q0", "<search> a </search>...<answer> Bo </answer>"),
        ("q2", "<search> b </search>...<answer> Cy </answer>"),
    ]
    assert [s.example.id for s in shots_from_trajectories(played, examples, None)] == ["q0", "q2", "q5"]
    prefilled = shots_from_trajectories(played[:1], examples, "<|im_end|>", prefill="<think>")
    assert prefilled[0].reply == "<think><search> a </search>...<answer> Bo </answer>"  # the whole turn


def test_a_prefilling_protocol_keeps_its_prefill_under_few_shot():
    inner = load_method("tiresrag", ["protocol.system=null"]).protocol
    assert inner.prefill == "<think>"
    few = FewShotProtocol(
        inner, [Shot(_example(1, "Who founded A?"), "<think> t </think><answer> Bo </answer>")]
    )
    assert few.prefill == "<think>" and few.prompt_text(_example(2, "What is C?")).endswith("<think>")
    assert not few.prompt_text(_example(2, "What is C?")).endswith("<think><think>")


def tokenizer(chat_template: str) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(["the founder of A, search and answer"], trainer)
    out = PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False)
    out.chat_template = chat_template
    return out


def test_a_chat_template_that_drops_earlier_reasoning_is_caught():
    keeps = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"
    # like Qwen3's: an assistant turn before the last user turn keeps only what follows </think>
    drops = (
        "{% for m in messages %}<{{ m.role }}>"
        "{% if m.role == 'assistant' and not loop.last %}{{ m.content.split('</think>')[-1] }}"
        "{% else %}{{ m.content }}{% endif %}\n{% endfor %}<assistant>"
    )
    inner = load_method("search_r1").protocol
    reply = "<think> I need the founder of A first </think> <search> founder of A </search>"
    reply += " <answer> Bo </answer>"
    few = FewShotProtocol(inner, [Shot(_example(1, "Who founded A?"), reply)])
    assert dropped_shots(few, _example(2, "What is C?"), tokenizer(keeps)) == []
    assert dropped_shots(few, _example(2, "What is C?"), tokenizer(drops)) == ["q1"]
