"""Property tests: ranges, relations between metrics, alias maximisation, idempotence."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ragrl.metrics import (
    VARIANTS,
    average_precision,
    contains_answer,
    cover_em,
    exact_match,
    f1,
    full_recall_at_k,
    normalize,
    precision_at_k,
    recall_at_k,
    reciprocal_rank,
    substring_acc,
)

WORDS = st.sampled_from(
    [
        "a",
        "an",
        "the",
        "The",
        "yes",
        "no",
        "noanswer",
        "True",
        "cat",
        "U.S.",
        "x_y",
        "Röntgen",
        "1,000",
        "’s",
        "new",
        "york",
    ]
)
TEXT = st.one_of(
    st.text(max_size=20), st.lists(st.one_of(WORDS, st.text(max_size=3)), max_size=6).map(" ".join)
)
VARIANT = st.sampled_from(sorted(VARIANTS))


@settings(max_examples=400)
@given(pred=TEXT, golds=st.lists(TEXT, min_size=1, max_size=4), variant=VARIANT)
def test_ranges_and_relations(pred, golds, variant):
    em = exact_match(pred, golds, variant)
    f, p, r = f1(pred, golds, variant)
    cem = cover_em(pred, golds, variant)
    acc = substring_acc(pred, golds, variant)
    assert em in (0.0, 1.0) and cem in (0.0, 1.0) and acc in (0.0, 1.0)
    assert 0.0 <= f <= 1.0 and 0.0 <= p <= 1.0 and 0.0 <= r <= 1.0
    assert min(p, r) <= f + 1e-12 and f <= max(p, r) + 1e-12
    # an exact match is also covered and contained
    assert cem >= em and acc >= em
    assert contains_answer(pred, golds, variant=variant) == bool(acc)
    if contains_answer(pred, golds, word_boundary=True, variant=variant):
        assert acc == 1.0
    # EM implies F1 = 1, except when both sides normalize to nothing (F1 has no tokens to count)
    if em == 1.0 and normalize(pred, variant):
        assert f == 1.0


@settings(max_examples=300)
@given(pred=TEXT, golds=st.lists(TEXT, min_size=1, max_size=4), variant=VARIANT)
def test_alias_max(pred, golds, variant):
    assert exact_match(pred, golds, variant) == max(exact_match(pred, g, variant) for g in golds)
    assert f1(pred, golds, variant)[0] == max(f1(pred, g, variant)[0] for g in golds)
    assert cover_em(pred, golds, variant) == max(cover_em(pred, g, variant) for g in golds)
    assert substring_acc(pred, golds, variant) == max(substring_acc(pred, g, variant) for g in golds)


@settings(max_examples=500)
@given(text=TEXT, variant=VARIANT)
def test_normalization_is_idempotent(text, variant):
    once = normalize(text, variant)
    assert normalize(once, variant) == once


@settings(max_examples=300)
@given(text=TEXT)
def test_exact_match_is_symmetric(text):
    assert exact_match(text, text) == 1.0


IDS = st.sampled_from([f"p{i}" for i in range(8)])


@settings(max_examples=400)
@given(ranked=st.lists(IDS, max_size=10), gold=st.sets(IDS, min_size=1, max_size=4), k=st.integers(1, 12))
def test_retrieval_ranges_and_monotonicity(ranked, gold, k):
    rec = recall_at_k(ranked, gold, k)
    assert 0.0 <= rec <= 1.0
    assert rec <= recall_at_k(ranked, gold, k + 1)
    assert full_recall_at_k(ranked, gold, k) <= rec
    assert full_recall_at_k(ranked, gold, k) == (1.0 if rec == 1.0 else 0.0)
    assert abs(precision_at_k(ranked, gold, k) * k - rec * len(gold)) < 1e-9
    rr = reciprocal_rank(ranked, gold, k)
    ap = average_precision(ranked, gold, k)
    assert 0.0 <= rr <= 1.0 and 0.0 <= ap <= 1.0
    assert (rr == 0.0) == (rec == 0.0) == (ap == 0.0)
    # duplicates never change anything
    assert recall_at_k(ranked + ranked, gold, k) == rec
    assert average_precision([x for x in ranked for _ in (0, 1)], gold) == average_precision(ranked, gold)
