"""The Protocol abstraction and the shared tag helpers; a method-defined protocol runs in the engine."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ragrl.data.schema import Example, Passage
from ragrl.retrieval.bm25 import BM25Retriever
from ragrl.rollout.engine import RolloutConfig, RolloutEngine
from ragrl.rollout.protocol import (
    Protocol,
    find_spans,
    first_span,
    last_span,
    last_span_of,
    squash_ws,
    strip_tags,
)
from ragrl.rollout.scripted import ScriptedBackend
from ragrl.rollout.trajectory import Action


def tokenizer(chat_template: str | None = None) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["look up the capital of France"], trainer)
    tok.add_tokens(
        [AddedToken(t, normalized=False) for t in ("<lookup>", "</lookup>", "<final>", "</final>")]
    )
    out = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", clean_up_tokenization_spaces=False)
    if chat_template:
        out.chat_template = chat_template
    return out


def test_find_spans_pairs_each_close_with_nearest_open():
    text = "x <s>a</s> <s>b <s>c</s> </s> <s>unclosed"
    spans = find_spans(text, "s")
    assert [s.content for s in spans] == ["a", "c"]
    assert text[spans[1].start : spans[1].end] == "<s>c</s>"
    assert first_span(text, "s").content == "a" and last_span(text, "s").content == "c"
    assert find_spans("</s><s>", "s") == [] and last_span("", "s") is None


def test_last_span_of_picks_the_latest_closing_tag():
    assert last_span_of("<a>1</a><b>2</b>", ("a", "b")).tag == "b"
    assert last_span_of("<b>2</b><a>1</a>", ("a", "b")).tag == "a"
    assert last_span_of("<b>2 <a>1</a></b>", ("a", "b")).tag == "b"
    assert last_span_of("nothing", ("a", "b")) is None


def test_small_helpers():
    assert strip_tags("<a>x</a> <b>y</b>", ("a",)) == "x <b>y</b>"
    assert squash_ws("  a \n\t b  ") == "a b"


def test_protocol_is_abstract():
    with pytest.raises(TypeError):
        Protocol()  # type: ignore[abstract]


class LookupProtocol(Protocol):
    """How a method defines its own grammar: <lookup>q</lookup> and <final>a</final>."""

    name = "lookup"
    stop = ("</lookup>", "</final>")

    def messages(self, example):
        return [
            {
                "role": "user",
                "content": f"Use <lookup> q </lookup>, end with <final> a </final>. {example.question}",
            }
        ]

    def parse(self, text, turn):
        span = last_span_of(text, ("lookup", "final"))
        if span is None or not span.content.strip():
            return Action("invalid", turn=turn, error="no action")
        return Action("search" if span.tag == "lookup" else "answer", content=span.content.strip(), turn=turn)

    def observation(self, action, hits):
        return "\n[" + " | ".join(h.passage.title for h in hits) + "]\n"

    def corrective(self, action):
        return "\n[invalid]\n"


def test_a_method_protocol_runs_in_the_engine():
    retriever = BM25Retriever.build([Passage.make("Paris", "Paris is the capital of France.")])
    turns = iter(["<lookup> capital of France </lookup>", "<final> Paris </final> ignored"])
    tok = tokenizer()
    engine = RolloutEngine(
        ScriptedBackend(tok, lambda p, i: next(turns)), retriever, LookupProtocol(), RolloutConfig()
    )
    [traj] = engine.run([Example("q", "What is the capital of France?", ["Paris"])])
    assert [s.text for s in traj.segments] == [
        "<lookup> capital of France </lookup>",
        "\n[Paris]\n",
        "<final> Paris </final>",
    ]
    assert traj.final_answer == "Paris" and traj.metadata["protocol"] == "lookup"


def test_safe_parse_turns_a_parser_bug_into_an_invalid_action():
    class Broken(LookupProtocol):
        def parse(self, text, turn):
            raise KeyError("boom")

    a = Broken().safe_parse("anything", 3)
    assert a.kind == "invalid" and a.turn == 3 and "KeyError" in a.error
