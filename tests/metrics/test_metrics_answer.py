"""Hand-worked vectors for normalization and the answer metrics."""

from __future__ import annotations

import pytest

from ragrl.errors import RagrlError
from ragrl.metrics import (
    VARIANTS,
    contains_answer,
    cover_em,
    exact_match,
    f1,
    get_normalizer,
    normalize,
    substring_acc,
    variant_names,
)


@pytest.mark.parametrize(
    "text, variant, expected",
    [
        ("U.S.", "squad", "us"),
        ("U.S.", "arena", "u s"),
        ("U.S.", "tiresrag", "u s"),
        ("U.S.", "none", "U.S."),
        ("The Kiss_and_Tell", "squad", "kissandtell"),  # "_" is ASCII punctuation: deleted
        ("The Kiss_and_Tell", "arena", "kiss and tell"),
        ("O’Brien", "squad", "o’brien"),  # ’ is not ASCII punctuation
        ("O’Brien", "arena", "o brien"),
        ("don´t `x`", "arena", "don t x"),
        # the authors' TIRESRAG normalize_answer: ASCII punctuation, ´ and ` go; the curly quotes stay
        ("O’Brien", "tiresrag", "o’brien"),
        ("‘Levertov’s’", "tiresrag", "‘levertov’s’"),
        ("‘Levertov’s’", "r1_searcher", "levertov s"),  # R1-Searcher's normalize_answer strips them
        ("don´t `x` O'Brien_s", "tiresrag", "don t x o brien s"),
        ("a an the", "squad", ""),
        ("theory of a cat", "squad", "theory of cat"),
        ("True", "squad", "true"),
        ("True", "tiresrag", "yes"),
        ("False", "r1_searcher", "no"),
        ("True.", "tiresrag", "true"),  # the mapping is whole-string, before normalization
        (" True", "tiresrag", "true"),
        ("true", "tiresrag", "true"),
        ("  two\u00a0\u2003words\n", "none", "two words"),
        ("1,000.50", "squad", "100050"),
        ("1,000.50", "arena", "1 000 50"),
        ("Röntgen—Æthelburh", "squad", "röntgen—æthelburh"),
        ("", "arena", ""),
    ],
)
def test_normalize_vectors(text, variant, expected):
    assert normalize(text, variant) == expected


def test_registry():
    assert set(VARIANTS) == {"squad", "arena", "tiresrag", "r1_searcher", "none"}
    assert {"hotpotqa", "flashrag"} <= set(variant_names())
    assert get_normalizer("HotpotQA")("The U.S.") == "us"
    for name, doc in VARIANTS.items():
        assert "Used by" in doc, name
    with pytest.raises(RagrlError) as e:
        normalize("x", "squadd")
    assert "squad" in str(e.value) and "arena" in str(e.value) and "tiresrag" in str(e.value)


def test_f1_by_hand():
    # pred tokens: [cat, sat, on, mat]; gold: [cat, sat]; common 2 -> P=2/4, R=2/2, F1=2*.5*1/1.5
    f, p, r = f1("The cat sat on the mat", "a cat sat")
    assert (p, r) == (0.5, 1.0)
    assert f == pytest.approx(2 / 3)
    # repeated tokens count with multiplicity: pred [a? no: 'x','x','y'] vs gold ['x','y','y']
    f, p, r = f1("x x y", "x y y")
    assert (p, r) == (2 / 3, 2 / 3) and f == pytest.approx(2 / 3)
    assert f1("nothing", "else") == (0.0, 0.0, 0.0)
    assert f1("", "") == (0.0, 0.0, 0.0)  # EM is 1 here, F1 0: the official script's behaviour
    assert exact_match("", "") == 1.0


def test_f1_max_over_aliases_returns_best_triple():
    f, p, r = f1("new york city", ["York", "New York City", "city of new york"])
    assert (f, p, r) == (1.0, 1.0, 1.0)
    f, p, r = f1("new york", ["york", "new york city"])
    assert f == pytest.approx(0.8) and (p, r) == (1.0, 2 / 3)  # 0.8 beats york's 2/3


def test_yes_no_rule():
    # 'no' vs 'no way': overlapping token, but the rule zeroes it for squad/tiresrag
    assert f1("no", "no way") == (0.0, 0.0, 0.0)
    assert f1("no way", "no", variant="tiresrag") == (0.0, 0.0, 0.0)
    assert f1("no", "no way", variant="arena")[0] == pytest.approx(2 / 3)
    assert f1("no", "no way", yes_no_rule=False)[0] == pytest.approx(2 / 3)
    assert f1("no", "no way", variant="arena", yes_no_rule=True) == (0.0, 0.0, 0.0)
    assert f1("Yes.", "yes") == (1.0, 1.0, 1.0)
    assert f1("True", "yes", variant="tiresrag") == (1.0, 1.0, 1.0)
    assert f1("True", "yes") == (0.0, 0.0, 0.0)


def test_em_max_over_aliases_and_empty_golds():
    assert exact_match("The Beatles", ["Rolling Stones", "beatles"]) == 1.0
    assert exact_match("U.S.", "us") == 1.0
    assert exact_match("U.S.", "us", variant="arena") == 0.0
    with pytest.raises(ValueError):
        exact_match("x", [])


def test_cover_em_vs_substring():
    # tokens present, out of order: cover-EM yes, substring no
    assert cover_em("york new", "New York") == 1.0
    assert substring_acc("york new", "New York") == 0.0
    # substring inside a token: substring yes, cover-EM no
    assert substring_acc("i know", "no") == 1.0
    assert cover_em("i know", "no") == 0.0
    # both
    assert cover_em("it was in new york city", "New York") == 1.0
    assert substring_acc("it was in new york city", "New York") == 1.0
    # a gold that normalizes to nothing: FlashRAG substring matches anything, cover-EM does not
    assert substring_acc("anything", "The") == 1.0
    assert cover_em("anything", "The") == 0.0
    assert cover_em("", "The") == 1.0


def test_contains_answer_word_boundary():
    assert contains_answer("I know the answer", "no") is True
    assert contains_answer("I know the answer", "no", word_boundary=True) is False
    assert contains_answer("The answer is no.", "no", word_boundary=True) is True
    assert contains_answer("he said: New York!", ["Paris", "new york"], word_boundary=True) is True
    assert contains_answer("newyorker", "new york", word_boundary=True) is False
    assert contains_answer("anything", "the", word_boundary=True) is False
    assert contains_answer("anything", "the") is True
