"""The rollout tests' small world: four passages, a BPE with the protocol tags, scripted policies and an
engine over them (loaded by tests/rollout/test_engine.py, test_records.py and test_scripted.py)."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from ragrl.data.schema import Example, Passage
from ragrl.llm.tiny import train_tokenizer
from ragrl.retrieval.bm25 import BM25Retriever
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.engine import RolloutEngine
from ragrl.rollout.scripted import ScriptedBackend
from ragrl.rollout.search_protocol import TAGS as SEARCH_R1_TAGS
from ragrl.rollout.search_protocol import SearchR1Protocol

TAGS = list(SEARCH_R1_TAGS)

PASSAGES = [
    Passage.make("Alan Turing", "Alan Turing was born in Maida Vale, London, in 1912."),
    Passage.make("London", "London is the capital city of England and the United Kingdom."),
    Passage.make("Paris", "Paris is the capital of France, on the river Seine."),
    Passage.make("Ada Lovelace", "Ada Lovelace wrote the first published algorithm for a machine."),
]


def bpe_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE with the protocol tags as single tokens and no chat template (plain prompts)."""
    tok = train_tokenizer([p.contents for p in PASSAGES] * 3, kind="bpe", vocab_size=600, special_tags=TAGS)
    tok.chat_template = None
    return tok


TOK = bpe_tokenizer()
EOS = TOK.eos_token_id
INFO_END = TOK.convert_tokens_to_ids("</information>")


@pytest.fixture(scope="module")
def bm25():
    return BM25Retriever.build(PASSAGES)


def example(i: int = 0, q: str = "In which country was Alan Turing born?") -> Example:
    return Example(id=f"q{i}", question=q, answers=["England"])


PROTOCOL = SearchR1Protocol()


def turn_of(prompt_ids: list[int]) -> int:
    """Observations seen so far (the prompt text itself contains one </information>)."""
    return prompt_ids.count(INFO_END) - 1


def script(turns: list[str]):
    """A policy that writes turns[i] at turn i (and answers after the list is used up)."""

    def policy(prompt_ids, index):
        t = turn_of(prompt_ids)
        return turns[t] if t < len(turns) else "<answer> done </answer>"

    return policy


TWO_SEARCHES = [
    "<think> first find where Turing was born </think>\n<search> Alan Turing born </search>",
    "<think> London; which country </think>\n<search> London capital city England </search>",
    "<think> England </think>\n<answer> England </answer>",
]


def engine(policy, retriever, **cfg):
    backend = ScriptedBackend(TOK, policy)
    return RolloutEngine(backend, retriever, PROTOCOL, RolloutConfig(**cfg)), backend
