import pytest

from ragrl.data.schema import Example
from ragrl.retrieval.evaluate import evaluate_hits, evaluate_retriever


def test_evaluate_retriever_by_hand(toy_bm25, toy_passages):
    by_title = {p.title: p for p in toy_passages}
    examples = [
        # both gold passages: Berlin is found first, Paris second ("capital" + "city")
        Example("q1", "capital city of Germany", ["Berlin"], [by_title["Berlin"].id, by_title["Paris"].id]),
        Example(
            "q2", "coral reef off Queensland", ["Great Barrier Reef"], [by_title["Great Barrier Reef"].id]
        ),
        Example("q3", "no gold ids here", ["x"], []),
    ]
    hits = toy_bm25.search([ex.question for ex in examples], k=2)
    assert [h.passage.title for h in hits[0]] == ["Berlin", "Paris"]
    m = evaluate_retriever(toy_bm25, examples, ks=(1, 2))
    assert m == evaluate_hits(examples, toy_bm25.search([ex.question for ex in examples], k=2), ks=(1, 2))
    assert m["recall@1"] == pytest.approx((0.5 + 1.0) / 2)
    assert m["recall@2"] == pytest.approx(1.0)
    assert m["full_recall@1"] == pytest.approx(0.5)
    assert m["mrr"] == pytest.approx(1.0)
    assert m["n"] == 3 and m["n_without_gold"] == 1
