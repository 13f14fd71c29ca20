"""Demonstrators: the Search-R1 text they write, and the oracle and heuristic played through the real
rollout engine (Search-R1 protocol, BM25) on the small world."""

from __future__ import annotations

import dataclasses
import re

import pytest

from ragrl.errors import RagrlError
from ragrl.llm.tiny import train_tokenizer
from ragrl.methods import load_method
from ragrl.metrics import exact_match
from ragrl.retrieval.bm25 import BM25Retriever
from ragrl.rollout.scripted import DemonstratorBackend, Turn
from ragrl.rollout.trajectory import Action
from ragrl.synth import UNANSWERABLE_ANSWER, generate_world
from ragrl.synth.demonstrators import (
    HeuristicDemonstrator,
    OracleDemonstrator,
    QuotingOracle,
    answer_kind,
    demonstrator_by_name,
    demonstrator_texts,
    supporting_titles,
)

TURN = re.compile(r"^<think> .+ </think>\n<(search|answer)> .+ </\1>$", re.DOTALL)


@pytest.fixture(scope="module")
def setup():
    world = generate_world(0, "small")
    return world, BM25Retriever.build(world.corpus)


@pytest.fixture(scope="module")
def play(setup):
    """Play a demonstrator through the Search-R1 rollout (k = 3, 4 turns) on the world's questions."""
    world, retriever = setup
    method = load_method("search_r1", ["rollout.k=3", "rollout.max_turns=4", "rollout.max_new_tokens=64"])
    texts = [p.contents for p in world.corpus] + [ex.question for ex in world.splits["test"]]
    texts += demonstrator_texts()
    tokenizer = train_tokenizer(texts, kind="word", vocab_size=8000)

    def run(demonstrator, examples):  # noqa: ANN001, ANN202
        backend = DemonstratorBackend.for_examples(
            tokenizer, demonstrator, examples, method.protocol, retriever, method.rollout.k
        )
        return method.make_rollout(backend, retriever).run(list(examples), n=1, seed=0)

    return run


def gold_hit_rate(trajectories, examples) -> float:
    """Share of searches (matched to decomposition steps in order) whose retrieved passages hold that
    step's gold passage, read from the typed actions; steps whose passage was removed are skipped."""
    hits = total = 0
    for t, ex in zip(trajectories, examples, strict=True):
        removed = set(ex.metadata.get("removed_passage_ids", ()))
        searches = [a for a in t.actions if a.kind == "search"]
        for step, action in zip(ex.decomposition or [], searches, strict=False):
            gold = [pid for pid in step.supporting_ids if pid not in removed]
            if gold:
                total += 1
                hits += gold[0] in action.retrieved_ids
    return hits / total if total else 0.0


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
        assert TURN.match(turn) and turn.endswith(f"<search> {step.question} </search>")
        history.append(Turn(turn, "", Action("search", step.question)))
    final = oracle.next_turn(ex, history)
    assert TURN.match(final) and final.endswith(f"<answer> {ex.answers[0]} </answer>")
    un = next(e for e in world.splits["test"] if not e.metadata["answerable"])
    history = [Turn("", "", Action("search", "q"))] * len(un.decomposition)
    assert oracle.next_turn(un, history).endswith(f"<answer> {UNANSWERABLE_ANSWER} </answer>")


def test_oracle_and_heuristic_em_on_the_small_test_split(setup, play):
    world, _ = setup
    test = world.splits["test"]
    answerable = [ex for ex in test if ex.metadata["answerable"]]
    oracle = play(OracleDemonstrator(), test)
    oracle_em = [exact_match(t.final_answer or "", ex.answers) for t, ex in zip(oracle, test, strict=True)]
    assert sum(oracle_em) / len(test) >= 0.9
    assert sum(e for e, ex in zip(oracle_em, test, strict=True) if ex.metadata["answerable"]) >= 0.9 * len(
        answerable
    )
    # the oracle's sub-question searches find the gold passage of their hop (measured: 1.0)
    assert gold_hit_rate(oracle, test) >= 0.9
    assert all(
        t.finish_reason == "answer" and t.num_searches == len(ex.decomposition)
        for t, ex in zip(oracle, test, strict=True)
    )

    heuristic = play(HeuristicDemonstrator.from_world(world), test)
    heuristic_em = sum(
        exact_match(t.final_answer or "", ex.answers) for t, ex in zip(heuristic, test, strict=True)
    )
    heuristic_em /= len(test)
    assert 0.15 <= heuristic_em <= 0.5  # measured 0.29 on seed 0
    assert heuristic_em <= sum(oracle_em) / len(test) - 0.4


def test_quoting_oracle_needs_supporting_titles_for_an_answerable_question(setup):
    from ragrl.errors import RagrlError

    world, _ = setup
    ex = dataclasses.replace(world.splits["test"][0], supporting_ids=[], passages=[])
    with pytest.raises(RagrlError, match="synth0-test-00000: the quoting oracle needs the titles"):
        QuotingOracle().next_turn(ex, [])


def test_quoting_oracle_worked_example(setup, play):
    world, _ = setup
    ex = world.splits["test"][0]
    assert ex.question == "In which country was Mertaem Breke born?"
    (t,) = play(QuotingOracle(), [ex])
    thoughts = re.findall(r"<think> (.*?) </think>", t.policy_text)
    assert t.queries == ["Mertaem Breke", "Zurraes"] and t.final_answer == "Boreora"
    assert thoughts == [
        "I need Mertaem Breke",
        "Mertaem Breke is a musician who was born in Zurraes in 1965",  # names the next hop
        "Zurraes is a city in Boreora with a population of about 573,000",  # names the answer
    ]


def test_quoting_oracle_quotes_only_what_it_retrieved(setup, play):
    world, _ = setup
    test = world.splits["test"]
    played = play(QuotingOracle(), test)
    em = [exact_match(t.final_answer or "", ex.answers) for t, ex in zip(played, test, strict=True)]
    assert sum(em) / len(test) >= 0.95  # measured 1.00 on seed 0
    quotes = copied = 0
    for t, ex in zip(played, test, strict=True):
        if not supporting_titles(ex):  # unanswerable, every supporting passage removed: look once, refuse
            assert t.queries == [ex.question] and t.final_answer == UNANSWERABLE_ANSWER
            continue
        assert t.queries == supporting_titles(ex)  # one search per hop, for the entity the hop is about
        searches = [a for a in t.actions if a.kind == "search"]
        thoughts = re.findall(r"<think> (.*?) </think>", t.policy_text)[1:]  # after each search
        for search, thought, after in zip(searches, thoughts, [*t.queries[1:], t.final_answer], strict=True):
            if thought == "I found nothing about it":
                continue
            retrieved = " ".join(p.text for p in world.corpus if p.id in search.retrieved_ids)
            assert thought in retrieved  # a sentence the search found, never a gold passage it missed
            if after in ("yes", "no"):
                continue
            quotes += 1
            copied += re.search(rf"(?<!\w){re.escape(after)}(?!\w)", thought) is not None
    # reading is copying: the next query or the answer is in the quote (measured: 158 of 193
    # quotes on seed 0, yes/no answers left out; most of the rest belong to comparisons, whose quotes
    # give a year)
    assert copied / quotes >= 0.75, (copied, quotes)


def test_quoting_oracle_reads_given_passages_as_it_reads_search_results(setup, play):
    """``read_given`` reads each hop's own given passage from its start through the sentence the oracle
    quotes after searching that hop (the same rule): a prefix of the passage, ending in that quote."""
    world, _ = setup
    test = [ex for ex in world.splits["test"] if supporting_titles(ex)]
    same = hops = 0
    for ex, t in zip(test, play(QuotingOracle(), test), strict=True):
        quotes = QuotingOracle.read_given(ex)
        assert [q.title for q in quotes] == supporting_titles(ex)
        for q in quotes:  # the hop's own (supporting) passage, numbered as given, read from its start
            passage = ex.passages[q.index - 1]
            assert passage.title == q.title and passage.id in ex.supporting_ids
            assert passage.text.startswith(q.quote) and q.quote.endswith(".")
        searched = re.findall(r"<think> (.*?) </think>", t.policy_text)[1:]
        hops += len(quotes)
        same += sum(q.quote.endswith(f"{s}.") for q, s in zip(quotes, searched, strict=False))
    # the search ranks the hop's passage first, so both read the same sentence wherever the search
    # found it (measured: 204 of 213 hops on seed 0)
    assert same / hops >= 0.9, (same, hops)


def test_reading_given_passages_at_the_edges():
    """A question without supporting passages reads nothing; a hop's passage is chosen by its supporting
    id, not by its title (a distractor may share it); without an answer the year rule decides; a quote
    keeps its own full stop, whatever it is."""
    from ragrl.data.schema import Example, Passage

    unanswerable = Example("u", "Where?", ["unknown"], supporting_ids=[], passages=[Passage("a", "A", "x.")])
    assert QuotingOracle.read_given(unanswerable) == []
    passages = [
        Passage("d", "Kora", "Kora is a river!"),  # a distractor with the hop's title
        Passage("k", "Kora", "Kora is a city. It was founded in 1820! It is old."),
    ]
    ex = Example("q", "When was Kora founded?", [], supporting_ids=["k"], passages=passages)
    (quote,) = QuotingOracle.read_given(ex)
    assert (quote.title, quote.index, quote.quote) == ("Kora", 2, "Kora is a city. It was founded in 1820!")


def test_heuristic_never_reads_gold(setup, play):
    world, _ = setup
    heuristic = HeuristicDemonstrator.from_world(world)
    test = world.splits["test"][:30]
    blind = [
        dataclasses.replace(
            ex, answers=["?"], supporting_ids=[], passages=None, decomposition=None, metadata={}
        )
        for ex in test
    ]
    seen, unseen = play(heuristic, test), play(heuristic, blind)
    assert [t.final_answer for t in seen] == [t.final_answer for t in unseen]
    assert all(t.queries == [ex.question] for t, ex in zip(seen, test, strict=True))


def test_heuristic_from_world_json(setup, tmp_path):
    world, _ = setup
    paths = world.write(tmp_path)
    assert (
        HeuristicDemonstrator.from_world_json(paths["world"]).gazetteer
        == HeuristicDemonstrator.from_world(world).gazetteer
    )


def test_demonstrator_by_name(setup, tmp_path):
    world, _ = setup
    paths = world.write(tmp_path)
    assert isinstance(demonstrator_by_name("oracle", tmp_path / "absent.json"), OracleDemonstrator)
    assert isinstance(demonstrator_by_name("quote", tmp_path / "absent.json"), QuotingOracle)
    heuristic = demonstrator_by_name("heuristic", paths["world"])
    assert heuristic.gazetteer == HeuristicDemonstrator.from_world(world).gazetteer
    with pytest.raises(RagrlError, match=r"absent\.json not found \(--world\)"):
        demonstrator_by_name("heuristic", tmp_path / "absent.json")
    with pytest.raises(RagrlError, match=r"'gold' \(expected oracle, quote, heuristic\)"):
        demonstrator_by_name("gold", paths["world"])


def test_invalid_turns_get_a_corrective_message_and_no_answer(setup, play):
    world, _ = setup

    class Mumbler:
        name = "mumbler"

        def next_turn(self, example, history):
            assert all(t.action.kind == "invalid" for t in history)  # the protocol's parse, typed
            return "<think> hmm </think> <search> </search>"  # an empty query: invalid

    trajs = play(Mumbler(), world.splits["test"][:2])
    assert all(
        t.final_answer is None and t.num_invalid == 4 and t.finish_reason == "max_turns" for t in trajs
    )
    assert [a.error for a in trajs[0].actions] == ["empty query"] * 4
    corrective = trajs[0].segments[1]
    assert corrective.kind == "env" and "<search>" in corrective.text  # the corrective message


def test_oracle_on_real_data_searches_supporting_titles_or_fills_step_references():
    from ragrl.data.schema import Example, Passage, SubQuestion

    oracle = OracleDemonstrator()
    hotpot = Example(
        id="h1",
        question="What government position was held by the woman who portrayed Corliss Archer?",
        answers=["Chief of Protocol"],
        supporting_ids=["p2", "p1"],
        passages=[Passage("p1", "Shirley Temple", "..."), Passage("p2", "Kiss and Tell (1945 film)", "..."),
                  Passage("p3", "Meet Corliss Archer", "...")],
    )  # fmt: skip
    turns = [oracle.next_turn(hotpot, [None] * t) for t in range(3)]
    assert turns == [
        "<think> To answer this I first need: Kiss and Tell (1945 film) </think>\n"
        "<search> Kiss and Tell (1945 film) </search>",
        "<think> I found it. Next I need: Shirley Temple </think>\n<search> Shirley Temple </search>",
        "<think> I found it. So the answer is Chief of Protocol. </think>\n"
        "<answer> Chief of Protocol </answer>",
    ]
    musique = Example(
        id="m1",
        question="What is the seat of the county where Van Hook Township is located?",
        answers=["Stanley"],
        decomposition=[
            SubQuestion(
                "Van Hook Township >> located in the administrative territorial entity", ("Mountrail County",)
            ),
            SubQuestion("#1 >> capital", ("Stanley",)),
        ],
    )
    assert oracle.next_turn(musique, [None]) == (
        "<think> I found Mountrail County. Next I need: Mountrail County >> capital </think>\n"
        "<search> Mountrail County >> capital </search>"
    )
