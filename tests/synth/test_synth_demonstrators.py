"""Demonstrators: the Search-R1 text format, the oracle and the heuristic measured against BM25."""

from __future__ import annotations

import dataclasses
import re

import pytest

from ragrl.data.schema import Passage
from ragrl.metrics import exact_match
from ragrl.retrieval.bm25 import BM25Retriever
from ragrl.synth import UNANSWERABLE_ANSWER, generate_world
from ragrl.synth.demonstrators import (
    HeuristicDemonstrator,
    OracleDemonstrator,
    answer_kind,
    extract_retrieved,
    extract_retrieved_titles,
    gold_hit_rate,
    parse_turn,
    render_information,
    simulate,
    simulate_episodes,
)

TURN = re.compile(r"^<think> .+ </think>\n<(search|answer)> .+ </\1>$", re.DOTALL)


@pytest.fixture(scope="module")
def setup():
    world = generate_world(0, "small")
    return world, BM25Retriever.build(world.corpus)


def test_render_and_extract_round_trip():
    ps = [
        Passage.make("Zorvex Labs", "Zorvex Labs was founded by Mira Tolan."),
        Passage.make("Tamrin", "A city."),
    ]
    obs = render_information(ps)
    assert obs.strip().startswith("<information>") and obs.strip().endswith("</information>")
    assert "Doc 1 (Title: Zorvex Labs) Zorvex Labs was founded by Mira Tolan." in obs
    assert extract_retrieved(obs) == [(p.title, p.text) for p in ps]
    assert extract_retrieved_titles(obs) == ["Zorvex Labs", "Tamrin"]
    assert extract_retrieved_titles("no documents") == []


def test_parse_turn():
    assert parse_turn("<think> x </think>\n<search> Who founded Zorvex Labs? </search>") == (
        "search",
        "Who founded Zorvex Labs?",
    )
    assert parse_turn("<think> x </think>\n<answer> Mira Tolan </answer>") == ("answer", "Mira Tolan")
    assert parse_turn("<think> just thinking </think>") == ("invalid", "")


def test_answer_kind():
    assert answer_kind("Was A born before B?") == "yes/no"
    assert answer_kind("Which company is older, A Labs or B Works?") == "pick"
    assert answer_kind("In which country was the founder of X born?") == "country"
    assert answer_kind("What is the capital of the country where X was born?") == "city"
    assert answer_kind("In what year was the founder of X born?") == "year"
    assert answer_kind("Who employs the author of X?") == "company"
    assert answer_kind("Who founded the company that X works for?") == "person"
    assert answer_kind("Where was the founder of X born?") == "city"


def test_oracle_follows_the_decomposition(setup):
    world, _ = setup
    oracle = OracleDemonstrator()
    ex = next(e for e in world.splits["test"] if e.metadata["hops"] == 3 and e.metadata["answerable"])
    history = []
    for step in ex.decomposition:
        turn = oracle.next_turn(ex, history)
        assert TURN.match(turn) and turn.endswith("</search>")
        assert parse_turn(turn) == ("search", step.question)
        history.append((turn, "<information>\n</information>"))
    final = oracle.next_turn(ex, history)
    assert TURN.match(final) and parse_turn(final) == ("answer", ex.answers[0])
    un = next(e for e in world.splits["test"] if not e.metadata["answerable"])
    history = [("", "")] * len(un.decomposition)
    assert parse_turn(oracle.next_turn(un, history)) == ("answer", UNANSWERABLE_ANSWER)


def test_oracle_and_heuristic_em_on_the_small_test_split(setup):
    world, retriever = setup
    test = world.splits["test"]
    answerable = [ex for ex in test if ex.metadata["answerable"]]
    oracle_eps = simulate_episodes(OracleDemonstrator(), test, retriever, k=3, max_turns=4)
    oracle_em = [exact_match(ep.prediction, ex.answers) for ep, ex in zip(oracle_eps, test, strict=True)]
    assert sum(oracle_em) / len(test) >= 0.9
    assert sum(e for e, ex in zip(oracle_em, test, strict=True) if ex.metadata["answerable"]) >= 0.9 * len(
        answerable
    )
    # the oracle's sub-question searches find the gold passage of their hop (measured: 1.0)
    assert gold_hit_rate(oracle_eps, test) >= 0.9
    assert all(
        ep.answered and len(ep.queries) == len(ex.decomposition)
        for ep, ex in zip(oracle_eps, test, strict=True)
    )

    heuristic = HeuristicDemonstrator.from_world(world)
    preds = simulate(heuristic, test, retriever, k=3, max_turns=4)
    heuristic_em = sum(exact_match(p, ex.answers) for p, ex in zip(preds, test, strict=True)) / len(test)
    assert 0.15 <= heuristic_em <= 0.5  # measured 0.29 on seed 0
    assert heuristic_em <= sum(oracle_em) / len(test) - 0.4


def test_heuristic_never_reads_gold(setup):
    world, retriever = setup
    heuristic = HeuristicDemonstrator.from_world(world)
    test = world.splits["test"][:30]
    blind = [
        dataclasses.replace(
            ex, answers=["?"], supporting_ids=[], passages=None, decomposition=None, metadata={}
        )
        for ex in test
    ]
    assert simulate(heuristic, test, retriever) == simulate(heuristic, blind, retriever)
    eps = simulate_episodes(heuristic, test, retriever)
    assert all(
        len(ep.queries) == 1 and ep.queries[0] == ex.question for ep, ex in zip(eps, test, strict=True)
    )


def test_heuristic_from_world_json(setup, tmp_path):
    world, _ = setup
    paths = world.write(tmp_path)
    assert (
        HeuristicDemonstrator.from_world_json(paths["world"]).gazetteer
        == HeuristicDemonstrator.from_world(world).gazetteer
    )


def test_invalid_turns_get_a_corrective_message_and_no_answer(setup):
    world, retriever = setup

    class Mumbler:
        name = "mumbler"

        def next_turn(self, example, history):
            return "<think> hmm </think>"

    eps = simulate_episodes(Mumbler(), world.splits["test"][:2], retriever, max_turns=3)
    assert all(not ep.answered and ep.prediction == "" and len(ep.turns) == 3 for ep in eps)
    assert "My previous action is invalid" in eps[0].turns[0][1]
