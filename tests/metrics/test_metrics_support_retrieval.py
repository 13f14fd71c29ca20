"""Supporting-fact, joint and retrieval metrics by hand."""

from __future__ import annotations

import pytest

from ragrl.metrics import (
    aggregate_retrieval,
    answer_recall_at_k,
    average_precision,
    full_recall_at_k,
    joint_scores,
    parse_supporting_facts,
    precision_at_k,
    recall_at_k,
    reciprocal_rank,
    retrieval_scores,
    supporting_fact_scores,
)


def test_sp_by_hand():
    gold = [["A", 0], ["B", 1]]
    s = supporting_fact_scores([["A", 0], ["C", 2]], gold)
    assert (s.em, s.precision, s.recall) == (0.0, 0.5, 0.5) and s.f1 == 0.5
    assert supporting_fact_scores([("A", 0), ("B", 1), ("A", 0)], gold) == (1.0, 1.0, 1.0, 1.0)
    assert supporting_fact_scores([], []) == (1.0, 0.0, 0.0, 0.0)  # official: em 1, rest 0
    assert supporting_fact_scores([], gold) == (0.0, 0.0, 0.0, 0.0)


def test_joint_by_hand():
    sp = supporting_fact_scores([["A", 0]], [["A", 0], ["B", 1]])  # P=1, R=0.5
    j = joint_scores(0.0, 0.5, 1.0, sp)
    assert (j.precision, j.recall, j.em) == (0.5, 0.5, 0.0) and j.f1 == 0.5
    assert joint_scores(1.0, 0, 0, sp) == (0.0, 0.0, 0.0, 0.0)


def test_parse_supporting_facts_forms():
    assert parse_supporting_facts([["A", 0]]) == [("A", 0)]
    assert parse_supporting_facts({"title": ["A", "B"], "sent_id": [0, 2]}) == [("A", 0), ("B", 2)]
    for bad in (["A", 0], [["A", "0"]], [["A", True]], {"title": ["A"]}, "x"):
        with pytest.raises(ValueError):
            parse_supporting_facts(bad)


RANKED = ["d1", "g1", "d2", "g1", "g2", "d3"]  # g1 duplicated: counts once, list is d1 g1 d2 g2 d3
GOLD = {"g1", "g2"}


def test_recall_precision_by_hand():
    assert recall_at_k(RANKED, GOLD, 1) == 0.0
    assert recall_at_k(RANKED, GOLD, 2) == 0.5
    assert recall_at_k(RANKED, GOLD, 3) == 0.5
    assert recall_at_k(RANKED, GOLD, 4) == 1.0  # 4th unique id is g2
    assert full_recall_at_k(RANKED, GOLD, 3) == 0.0 and full_recall_at_k(RANKED, GOLD, 4) == 1.0
    assert precision_at_k(RANKED, GOLD, 2) == 0.5
    assert precision_at_k(RANKED, GOLD, 10) == 0.2  # divides by k
    assert precision_at_k(["g1", "g1"], GOLD, 2) == 0.5  # the duplicate is not a second hit


def test_mrr_map_by_hand():
    assert reciprocal_rank(RANKED, GOLD) == 0.5
    assert reciprocal_rank(RANKED, GOLD, k=1) == 0.0
    # hits at ranks 2 and 4: AP = (1/2 + 2/4) / 2
    assert average_precision(RANKED, GOLD) == pytest.approx(0.5)
    assert average_precision(RANKED, GOLD, k=3) == pytest.approx(0.25)
    assert average_precision(["g1", "g2"], GOLD) == 1.0
    assert average_precision(["g1"], {"g1", "g2", "g3", "g4"}) == 0.25  # normalised by |gold|


def test_empty_gold_and_bad_k():
    for fn in (recall_at_k, full_recall_at_k, precision_at_k):
        with pytest.raises(ValueError):
            fn(RANKED, [], 5)
        with pytest.raises(ValueError):
            fn(RANKED, GOLD, 0)
    with pytest.raises(ValueError):
        reciprocal_rank(RANKED, set())
    with pytest.raises(ValueError):
        average_precision(RANKED, [])


def test_answer_recall():
    texts = ["Paris is nice", "The U.S. Army", "nothing"]
    assert answer_recall_at_k(texts, ["us army"], 1) == 0.0
    assert answer_recall_at_k(texts, ["us army"], 2) == 1.0
    assert answer_recall_at_k(texts, ["us army"], 2, variant="arena") == 0.0  # arena: 'u s army'
    with pytest.raises(ValueError):
        answer_recall_at_k(texts, [], 2)


def test_retrieval_scores_and_aggregate():
    a = retrieval_scores(RANKED, None, GOLD, ["x"], ks=(1, 4))
    assert a == {
        "recall@1": 0.0,
        "full_recall@1": 0.0,
        "precision@1": 0.0,
        "recall@4": 1.0,
        "full_recall@4": 1.0,
        "precision@4": 0.5,
        "mrr": 0.5,
        "map": pytest.approx(0.5),
    }
    b = retrieval_scores(["z"], ["the answer is x"], [], ["x"], ks=(1, 4))
    assert b == {"answer_recall@1": 1.0, "answer_recall@4": 1.0}
    agg = aggregate_retrieval([a, b])
    assert agg["n"] == 2 and agg["n_without_gold"] == 1
    assert agg["recall@4"] == 1.0  # the example without gold ids is not counted as 0
    assert agg["answer_recall@1"] == 1.0
