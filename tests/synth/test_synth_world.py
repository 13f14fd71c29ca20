"""The synthetic world: determinism, split hygiene, unanswerable rule, decompositions, balance, fairness."""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict

import pytest

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.synth import UNANSWERABLE_ANSWER, fairness_report, generate_world
from ragrl.synth.fairness import fact_overlap, seed_entity_overlap
from ragrl.synth.world import SHARED_POOL


@pytest.fixture(scope="module", params=["facts", "entities"])
def world(request):
    return generate_world(0, "small", split=request.param)


def all_examples(world):
    return [ex for examples in world.splits.values() for ex in examples]


def test_same_seed_gives_byte_identical_files(tmp_path):
    a = generate_world(3, "small").write(tmp_path / "a")
    b = generate_world(3, "small").write(tmp_path / "b")
    assert sorted(a) == ["corpus", "dev", "stats", "test", "train", "world"]
    for key in a:
        assert a[key].read_bytes() == b[key].read_bytes(), key


def test_different_seeds_give_different_worlds(world):
    other = generate_world(1, "small")
    names = {e.name for e in world.store}
    assert len(names & {e.name for e in other.store}) < 0.05 * len(names)


def test_sizes_and_answerable_share(world):
    assert {s: len(v) for s, v in world.splits.items()} == {"train": 400, "dev": 100, "test": 100}
    for examples in world.splits.values():
        unanswerable = [ex for ex in examples if not ex.metadata["answerable"]]
        assert len(unanswerable) == len(examples) // 10
    ids = [ex.id for ex in all_examples(world)]
    assert len(set(ids)) == len(ids)


def test_unknown_size_is_a_clear_error():
    with pytest.raises(RagrlError, match="unknown synth size 'huge'"):
        generate_world(0, "huge")


def test_names_are_unique_words(world):
    names = [e.name for e in world.store]
    assert len(set(names)) == len(names)


def test_splits_use_disjoint_seed_entities(world):
    assert set(seed_entity_overlap(world).values()) == {0}
    by_pid = {e.passage_id: e for e in world.store}
    for split, examples in world.splits.items():
        for ex in examples:
            for pid in ex.supporting_ids:
                e = by_pid[pid]
                assert e.pool == SHARED_POOL or e.split == split
                # answerable questions never touch the entities kept for unanswerable ones (an
                # unanswerable chain may end on the background: a shared country, or in ``facts``
                # mode a country its split owns)
                if ex.metadata["answerable"]:
                    assert not e.reserved
                else:
                    assert e.reserved or e.kind == "country" or e.pool == SHARED_POOL


def test_corpus_and_unanswerable_rule(world):
    corpus_ids = {p.id for p in world.corpus}
    removed = set(world.removed_ids)
    assert removed and not (removed & corpus_ids)
    assert len(corpus_ids) + len(removed) == len(world.passages)
    for ex in all_examples(world):
        given = {p.id for p in ex.passages}
        assert not (given & removed)
        assert len(ex.passages) == len(given)
        assert given <= corpus_ids
        if ex.metadata["answerable"]:
            assert set(ex.supporting_ids) <= corpus_ids
            assert set(ex.supporting_ids) <= given
            assert 8 <= len(ex.passages) <= 10
            assert "removed_passage_ids" not in ex.metadata
        else:
            gone = ex.metadata["removed_passage_ids"]
            assert gone and set(gone) <= set(ex.supporting_ids) and set(gone) <= removed
            assert set(ex.supporting_ids) - set(gone) <= given
            assert ex.answers == [UNANSWERABLE_ANSWER]
            assert ex.decomposition


def test_decompositions_are_consistent_chains(world):
    text = {p.id: p.contents for p in world.passages.values()}
    for ex in all_examples(world):
        steps = ex.decomposition
        assert ex.metadata["hops"] == len(steps) == len(ex.supporting_ids)
        assert [s.supporting_ids[0] for s in steps] == ex.supporting_ids
        for step in steps:
            assert step.answers[0] in text[step.supporting_ids[0]], (ex.id, step)
        if ex.metadata["type"] == "bridge":
            gold = ex.answers if ex.metadata["answerable"] else ex.metadata["answer_if_answerable"]
            assert list(steps[-1].answers) == gold
            for prev, step in zip(steps, steps[1:], strict=False):
                assert prev.answers[0] in step.question  # the bridge entity is substituted
                assert prev.answers[0] not in ex.question


def test_metadata_and_round_trip(world):
    types = Counter()
    for ex in all_examples(world):
        md = ex.metadata
        assert md["source"] == "synth" and md["split"] in world.splits
        assert md["type"] in ("bridge", "comparison") and md["hops"] in (2, 3) and md["template"]
        types[(md["type"], md["hops"])] += 1
        assert Example.from_record(ex.to_record()) == ex
    assert set(types) == {("bridge", 2), ("bridge", 3), ("comparison", 2)}


def test_yes_no_and_pick_position_balance(world):
    for examples in world.splits.values():
        yes_no: dict[str, Counter] = defaultdict(Counter)
        first: dict[str, Counter] = defaultdict(Counter)
        for ex in examples:
            if not ex.metadata["answerable"] or ex.metadata["type"] != "comparison":
                continue
            if ex.answers[0] in ("yes", "no"):
                yes_no[ex.metadata["template"]][ex.answers[0]] += 1
            else:
                a = ex.question.split(", ", 1)[1]
                first[ex.metadata["template"]][a.startswith(ex.answers[0])] += 1
        assert len(yes_no) == 3 and len(first) == 3
        for counts in list(yes_no.values()) + list(first.values()):
            assert abs(counts.most_common()[0][1] - sum(counts.values()) / 2) <= 0.5


def test_fairness_of_the_test_split(world):
    for split in ("dev", "test"):
        f = world.stats["fairness"][split]
        assert f == fairness_report(world.splits["train"], world.splits[split])
        assert f["memoriser_template_em"] <= 0.15
        assert f["memoriser_template_em_answerable"] <= 0.12
        assert f["memoriser_global_em"] <= 0.12
        assert f["yes_no_constant_em"] <= 0.6
        if world.split == "entities":  # in ``facts`` mode names (hence answers) are shared on purpose
            assert f["answer_overlap_open"] <= 0.5


def test_fairness_report_on_a_toy_set():
    def ex(i, answer, template):
        return Example(str(i), "q?", [answer], metadata={"template": template})

    train = [ex(0, "Paris", "t"), ex(1, "Paris", "t"), ex(2, "Rome", "t"), ex(3, "yes", "y")]
    test = [ex(4, "Paris", "t"), ex(5, "Oslo", "t"), ex(6, "no", "y"), ex(7, "Rome", "u")]
    f = fairness_report(train, test)
    assert f["answer_overlap"] == 0.5  # Paris, Rome
    assert f["answer_overlap_open"] == 0.6667
    assert f["memoriser_template_em"] == 0.25  # "Paris" on t (1 of 2), "yes" on y, unseen u -> "Paris"
    assert f["memoriser_global_em"] == 0.25
    assert f["yes_no_constant_em"] == 1.0


@pytest.mark.slow
def test_medium_world_is_fair():
    w = generate_world(0, "medium")
    assert {s: len(v) for s, v in w.splits.items()} == {"train": 4000, "dev": 500, "test": 500}
    assert w.stats["fairness"]["test"]["memoriser_template_em"] <= 0.15
    assert set(seed_entity_overlap(w).values()) == {0}


def test_entities_mode_is_the_original_world(tmp_path):
    """``split="entities"`` gives the questions and corpus every earlier measurement used, byte for byte
    (``world.json`` and ``stats.json`` gained the split mode and the new statistics)."""
    paths = generate_world(0, "small", split="entities").write(tmp_path)
    names = ("train", "dev", "test", "corpus")
    digests = {k: hashlib.sha256(paths[k].read_bytes()).hexdigest()[:16] for k in names}
    assert digests == {
        "train": "6c8d019ba71db31b",
        "dev": "7f369b0366279f84",
        "test": "2203911a873431b1",
        "corpus": "525045364fe22429",
    }


def test_unknown_split_mode_is_a_clear_error():
    with pytest.raises(RagrlError, match="unknown split mode 'names'"):
        generate_world(0, "small", split="names")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_facts_split_shares_names_but_no_fact(seed):
    w = generate_world(seed, "small", split="facts")
    assert w.stats["split"] == "facts"
    assert set(w.stats["fact_overlap"].values()) == {0}
    assert set(w.stats["seed_entity_overlap"].values()) == {0}
    # the proof, spelled out: no (passage, answer) step of a held-out question is a step of a training
    # question, and no training target (sub-question + what it finds, the final answer) states one
    train_steps = {(s.supporting_ids[0], s.answers[0]) for ex in w.splits["train"] for s in ex.decomposition}
    train_targets = {(s.question, a) for ex in w.splits["train"] for s in ex.decomposition for a in s.answers}
    for split in ("dev", "test"):
        for ex in w.splits[split]:
            for s in ex.decomposition:
                assert (s.supporting_ids[0], s.answers[0]) not in train_steps
                assert (s.question, s.answers[0]) not in train_targets
    # ... while names cross the splits: relations point into other splits' pools
    by_id = w.store.by_id
    crossing = [
        (e, rel) for e in w.store if e.pool in ("train", "dev", "test")
        for rel, t in e.rels.items() if by_id[t].pool not in (e.pool, SHARED_POOL)
    ]  # fmt: skip
    assert len(crossing) > 200
    assert w.stats["questions_naming_a_training_entity"]["test"] > 0
    assert not any(e.pool == SHARED_POOL for e in w.store)  # every country is owned by a split
    for e, rel in crossing:  # re-pointed relations keep the world consistent
        t = by_id[e.rels[rel]]
        if rel == "founded_by":
            assert 20 <= e.facts["founded_year"] - t.facts["birth_year"] <= 50
        if rel in ("born_in", "headquartered_in"):
            assert t.kind == "city" and not t.facts.get("capital")


def test_entities_split_shares_no_name():
    w = generate_world(0, "small", split="entities")
    assert w.stats["questions_naming_a_training_entity"] == {"dev": 0.0, "test": 0.0}
    # the facts both splits need are only the shared background: a country's capital
    train = {
        (pid, s.answers[0]) for ex in w.splits["train"] for s in ex.decomposition for pid in s.supporting_ids
    }
    shared = [
        (pid, answer) for ex in w.splits["test"] for s in ex.decomposition for pid in s.supporting_ids
        for answer in s.answers[:1] if (pid, answer) in train
    ]  # fmt: skip
    assert len(set(shared)) == fact_overlap(w)["test&train"] > 0
    by_pid = {e.passage_id: e for e in w.store}
    assert {by_pid[pid].kind for pid, _ in shared} == {"country"}
    assert all(by_pid[pid].pool == SHARED_POOL for pid, _ in shared)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_facts_split_held_out_answers_are_not_memorisable(seed):
    for f in generate_world(seed, "small", split="facts").stats["fairness"].values():
        assert f["memoriser_template_em"] <= 0.12 and f["memoriser_template_em_answerable"] <= 0.11
        assert f["memoriser_global_em"] <= 0.11
