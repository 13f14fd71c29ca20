"""A synthetic corpus of any size, for the retrieval paths at scale (``ragrl data synth-corpus``).

Not a world: no facts, no questions. Passages about as long as Wikipedia's (DPR's 100-word passages),
written in the synthetic world's language: made-up words from its syllables (``world._ONSETS`` ...)
drawn from a topic's words and with a Zipf law over a ``vocabulary``-word lexicon, plus the English
function words, in sentences of 6 to 20 words, under a two-word made-up title. Generation streams in
chunks: a corpus of millions of passages is written without being held; the same seed gives the same
passages, and a smaller corpus is the start of a larger one.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ragrl.data.schema import Passage
from ragrl.synth.world import _CODAS, _ONSETS, _VOWELS

FUNCTION_WORDS = (
    "the", "of", "and", "in", "to", "a", "was", "is", "for", "on", "by", "with", "as", "at", "from",
    "his", "her", "its", "which", "that", "were", "an", "after", "during", "between", "under",
)  # fmt: skip
CHUNK = 10_000


def lexicon(size: int, seed: int = 0) -> list[str]:
    """``size`` distinct made-up words, each two or three syllables of the world's language."""
    rng = np.random.default_rng(seed)
    words: dict[str, None] = {}
    while len(words) < size:
        syllables = int(rng.integers(2, 4))
        word = "".join(
            _ONSETS[rng.integers(len(_ONSETS))]
            + _VOWELS[rng.integers(len(_VOWELS))]
            + _CODAS[rng.integers(len(_CODAS))]
            for _ in range(syllables)
        )
        words.setdefault(word, None)
    return list(words)


def synthetic_corpus(
    n: int,
    *,
    seed: int = 0,
    words: int = 100,
    vocabulary: int = 50_000,
    topics: int = 2_000,
    zipf: float = 1.1,
) -> Iterator[Passage]:
    """``n`` passages of about ``words`` words each (ids ``s0`` ... ``s{n-1}``), streamed.

    Each passage is about one of ``topics`` topics: half its words come from its topic's 100 words, the
    rest from the whole lexicon (Zipf) and the function words, so passages on one topic are near each
    other, as Wikipedia's are (an approximate index's clusters need that structure)."""
    lex = np.array(lexicon(vocabulary, seed), dtype=object)
    function = np.array(FUNCTION_WORDS, dtype=object)
    topic_words = np.random.default_rng([seed, 2**31]).integers(vocabulary, size=(topics, 100))
    for start in range(0, n, CHUNK):
        rng = np.random.default_rng([seed, start])
        count = min(CHUNK, n - start)  # a whole chunk is drawn: a smaller corpus is a larger one's start
        lengths = rng.integers(int(words * 0.8), int(words * 1.2) + 1, size=CHUNK)
        total = int(lengths.sum())
        topic = np.repeat(rng.integers(topics, size=CHUNK), lengths)
        ranks = (rng.zipf(zipf, size=total) - 1) % vocabulary
        on_topic = rng.random(total) < 0.5
        ranks[on_topic] = topic_words[topic[on_topic], rng.integers(100, size=int(on_topic.sum()))]
        content = lex[ranks]
        glue = rng.random(total) < 0.2  # a fifth of the words are function words
        content[glue] = function[rng.integers(len(function), size=int(glue.sum()))]
        titles = lex[rng.integers(vocabulary, size=(CHUNK, 2))]
        ends = rng.integers(6, 21, size=total)  # a sentence ends after 6-20 words
        position = 0
        for i in range(count):
            tokens = content[position : position + lengths[i]].tolist()
            sentences, cut = [], 0
            while cut < len(tokens):
                step = int(ends[position + cut])
                sentences.append(" ".join(tokens[cut : cut + step]).capitalize() + ".")
                cut += step
            position += lengths[i]
            title = f"{titles[i, 0].capitalize()} {titles[i, 1].capitalize()}"
            yield Passage(f"s{start + i}", title, " ".join(sentences))
