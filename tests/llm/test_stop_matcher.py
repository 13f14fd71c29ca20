"""The stop-string matcher's fast path (skip decoding unless the new token could end a stop string)
finds exactly the stops that decoding the tail at every step finds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragrl.llm.stops import StopMatcher
from ragrl.llm.tiny import train_tokenizer

CORPUS = [
    "Who founded Zorvex Labs? <search> Zorvex Labs founder </search> Mira Tolan.",
    "Die Stadt Köln – 日本 ok",
]
STOPS = ("</search>", "</answer>", "Labs?", "ö", "日本")


@pytest.fixture(scope="module", params=["word", "bpe"])
def tokenizer(request):
    return train_tokenizer(CORPUS, kind=request.param, vocab_size=400)


@settings(max_examples=150)
@given(data=st.data())
def test_fast_path_agrees_with_full_decoding(tokenizer, data):
    ids = data.draw(st.lists(st.integers(0, len(tokenizer) - 1), min_size=1, max_size=40))
    fast, slow = StopMatcher(tokenizer, STOPS), StopMatcher(tokenizer, STOPS)
    slow.fast = False
    assert fast.fast
    for n in range(1, len(ids) + 1):
        assert fast(ids[:n]) == slow(ids[:n])
