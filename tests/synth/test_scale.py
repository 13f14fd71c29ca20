"""The synthetic corpus of any size: streamed, reproducible, prefix-stable, about Wikipedia's length."""

from __future__ import annotations

import itertools
import json
import statistics

import pytest
from typer.testing import CliRunner

from ragrl.cli import app
from ragrl.synth.scale import FUNCTION_WORDS, lexicon, synthetic_corpus


@pytest.mark.slow  # 11 s: CI's slow phase runs it (the default run's 10 minutes)
def test_the_corpus_is_reproducible_prefix_stable_and_about_a_hundred_words_a_passage():
    first = list(synthetic_corpus(12_000, seed=5))
    assert list(synthetic_corpus(12_000, seed=5)) == first
    assert list(synthetic_corpus(10_003, seed=5)) == first[:10_003]  # across the 10k generation chunk
    assert list(synthetic_corpus(5, seed=6)) != first[:5]
    assert [p.id for p in first[:3]] == ["s0", "s1", "s2"] and len({p.id for p in first}) == 12_000
    assert 95 <= statistics.mean(len(p.text.split()) for p in first) <= 105
    assert all(p.text.endswith(".") and p.title.count(" ") == 1 for p in first[:100])
    assert len(set(lexicon(5000))) == 5000
    # streamed: taking the first passages of a 21M-passage corpus costs one chunk
    assert next(iter(synthetic_corpus(21_000_000))).id == "s0"
    assert len(list(itertools.islice(synthetic_corpus(21_000_000), 3))) == 3


def test_passages_on_one_topic_share_words_the_others_do_not():
    passages = list(synthetic_corpus(2000, seed=0, topics=20))
    words = [set(p.text.lower().replace(".", "").split()) - set(FUNCTION_WORDS) for p in passages]
    overlaps = sorted(len(words[0] & w) for w in words[1:])
    # the ~100 passages on passage 0's topic (1 in 20) share far more words than the median passage
    assert overlaps[-60] > 2.5 * statistics.median(overlaps)  # measured: 15 against 5


def test_the_cli_writes_a_corpus_file(tmp_path):
    out = tmp_path / "corpus.jsonl"
    result = CliRunner().invoke(app, ["data", "synth-corpus", "--passages", "300", "--out", str(out)])
    assert result.exit_code == 0, result.output
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 300 and set(json.loads(lines[0])) == {"id", "contents"}
    assert "wrote 300 passages" in result.output
