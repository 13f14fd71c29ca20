"""ARENA's gold reference ids (ragrl.data.references): hand-made records through the real loaders, the
synthetic world, and the real shared samples."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from ragrl.data.io import read_examples, write_examples
from ragrl.data.loaders import load_2wiki, load_dataset, load_hotpotqa, load_musique
from ragrl.data.references import (
    GOLD_REFERENCE_KEY,
    UNRESOLVED_RULES,
    ReferenceIds,
    ReferenceReport,
    attach_reference_ids,
    gold_reference_ids,
)
from ragrl.data.schema import Example, Passage
from ragrl.errors import DataError, RagrlError

HOTPOT = "hotpotqa/leeyeezeee__benchfortir/test.jsonl"
TWOWIKI = "2wikimultihopqa/saptarshi059__TTS-project/sampled_ds.json"
MUSIQUE = "musique/AdelWang__MIGRES/musique.json"


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _hotpot(ex_id, facts, context):
    return {
        "_id": ex_id,
        "question": "Q?",
        "answer": "A",
        "type": "bridge",
        "level": "hard",
        "supporting_facts": facts,
        "context": context,
    }


# HotpotQA-shaped: sentences after the first carry their own leading space. " Shared fact here." is
# sentence 1 of both A (position 1) and C (position 3).
CONTEXT = [
    ["A", ["Alpha starts.", " Shared fact here."]],
    ["B", ["Beta starts.", " Beta ends."]],
    ["C", ["Gamma starts.", " Shared fact here.", " Gamma ends."]],
]


def _load_hotpot(tmp_path, records):
    examples, _ = load_hotpotqa(_jsonl(tmp_path / "h.jsonl", records))
    return examples


def test_first_passage_wins(tmp_path):
    (ex,) = _load_hotpot(tmp_path, [_hotpot("h1", [["C", 1], ["B", 1]], CONTEXT)])
    assert ex.metadata["supporting_sentences"] == [" Shared fact here.", " Beta ends."]
    # the loader maps the fact to C by title; ARENA's substring rule takes the first passage, A
    assert ex.supporting_ids == [ex.passages[2].id, ex.passages[1].id]
    assert gold_reference_ids(ex) == ReferenceIds([1, 2], [])
    # the first sentence of a paragraph (no leading space) and the last (end of the text) match too
    (ex,) = _load_hotpot(tmp_path, [_hotpot("h2", [["C", 0], ["C", 2], ["B", 0]], CONTEXT)])
    assert gold_reference_ids(ex) == ReferenceIds([2, 3], [])


def test_unresolved_fact_under_each_rule(tmp_path):
    records = [
        _hotpot("ok", [["A", 0], ["B", 1]], CONTEXT),
        _hotpot("bad", [["A", 0], ["B", 9]], CONTEXT),  # sentence index out of range
        _hotpot("gone", [["Nowhere", 0], ["C", 2]], CONTEXT),  # title not in context
    ]
    ok, bad, gone = _load_hotpot(tmp_path, records)
    assert bad.metadata["supporting_sentences"] == ["Alpha starts.", None]
    assert gold_reference_ids(ok) == ReferenceIds([1, 2], [])
    assert gold_reference_ids(bad) == ReferenceIds(
        [-1, 1], ["supporting fact ['B', 9]: sentence index out of range"]
    )
    assert gold_reference_ids(gone) == ReferenceIds(
        [-1, 3], ["supporting fact ['Nowhere', 0]: title not among the given passages"]
    )

    out, report = attach_reference_ids([ok, bad, gone])  # "drop" is the default (ARENA's rule)
    assert [e.id for e in out] == ["ok"] and out[0].metadata[GOLD_REFERENCE_KEY] == [1, 2]
    assert (report.rule, report.n_in, report.n_out) == ("drop", 3, 1)
    assert report.dropped == {
        "bad": ["supporting fact ['B', 9]: sentence index out of range"],
        "gone": ["supporting fact ['Nowhere', 0]: title not among the given passages"],
    }
    assert report.kept_unresolved == {} and report.distribution == {"2": 1} and report.mean == 2.0
    assert "bad: supporting fact ['B', 9]: sentence index out of range" in report.summary()

    out, report = attach_reference_ids([ok, bad, gone], rule="keep")
    assert [e.metadata[GOLD_REFERENCE_KEY] for e in out] == [[1, 2], [-1, 1], [-1, 3]]
    assert report.dropped == {} and set(report.kept_unresolved) == {"bad", "gone"}
    assert report.distribution == {"2": 3}
    assert json.loads(json.dumps(report.to_dict()))["kept_unresolved"]["bad"] == [
        "supporting fact ['B', 9]: sentence index out of range"
    ]

    with pytest.raises(DataError) as e:
        attach_reference_ids([ok, bad, gone], rule="error")
    assert "question bad" in str(e.value) and "sentence index out of range" in str(e.value)
    assert e.value.field == GOLD_REFERENCE_KEY

    with pytest.raises(RagrlError, match="drop, keep, error"):
        attach_reference_ids([ok], rule="skip")
    assert UNRESOLVED_RULES == ("drop", "keep", "error")


def test_2wiki_sentences_without_leading_spaces(tmp_path):
    rec = {
        "_id": "w1",
        "type": "compositional",
        "question": "Q?",
        "answer": "A",
        "evidences": [["X", "r", "Y"]],
        "supporting_facts": [["Y", 1], ["X", 0]],
        "context": [
            ["Z", ["Zed one.", "Zed two."]],
            ["X", ["X was born in Y.", "X died."]],
            ["Y", ["Y is a city.", "It lies on a river."]],
        ],
    }
    (ex,), _ = load_2wiki(_jsonl(tmp_path / "w.jsonl", [rec]))
    assert ex.passages[2].text == "Y is a city. It lies on a river."  # joined with one space
    assert ex.metadata["supporting_sentences"] == ["It lies on a river.", "X was born in Y."]
    assert gold_reference_ids(ex) == ReferenceIds([2, 3], [])


def test_musique_record_through_its_loader(tmp_path):
    rec = {
        "id": "2hop__1_2",
        "question": "Q?",
        "answer": "A",
        "answer_aliases": [],
        "answerable": True,
        "paragraphs": [
            {"idx": 0, "title": "Other", "paragraph_text": "Noise.", "is_supporting": False},
            {"idx": 1, "title": "Copy", "paragraph_text": "The bridge fact.", "is_supporting": False},
            {"idx": 2, "title": "Second", "paragraph_text": "The answer fact.", "is_supporting": True},
            {"idx": 3, "title": "First", "paragraph_text": "The bridge fact.", "is_supporting": True},
        ],
        "question_decomposition": [
            {"id": 1, "question": "q1", "answer": "x", "paragraph_support_idx": 3},
            {"id": 2, "question": "q2", "answer": "A", "paragraph_support_idx": 2},
        ],
    }
    (ex,), _ = load_musique(_jsonl(tmp_path / "m.jsonl", [rec]))
    assert "supporting_sentences" not in ex.metadata
    # "First" (position 4) has the same text as "Copy" (position 2): the first passage containing it wins
    assert gold_reference_ids(ex) == ReferenceIds([2, 3], [])
    ex.supporting_ids.append("p-not-given")
    ref = gold_reference_ids(ex)
    assert ref.ids == [-1, 2, 3] and ref.unresolved == [
        "supporting id 'p-not-given' is not among the 4 given passages"
    ]


def test_no_passages_and_no_facts():
    p = Passage.make("T", "Some text.")
    no_passages = Example("n1", "Q?", ["A"], supporting_ids=[p.id])
    no_facts = Example("n2", "Q?", ["A"], passages=[p])
    no_sentences = Example("n3", "Q?", ["A"], passages=[p], metadata={"supporting_sentences": []})
    assert gold_reference_ids(no_passages) == ReferenceIds([], ["no passages"])
    assert gold_reference_ids(no_facts) == ReferenceIds([], ["no supporting facts"])
    assert gold_reference_ids(no_sentences) == ReferenceIds([], ["no supporting facts"])
    out, report = attach_reference_ids([no_passages, no_facts, no_sentences])
    assert out == [] and report.n_out == 0 and report.mean is None
    assert report.dropped == {
        "n1": ["no passages"],
        "n2": ["no supporting facts"],
        "n3": ["no supporting facts"],
    }
    bad = Example("n4", "Q?", ["A"], passages=[p], metadata={"supporting_sentences": "One."})
    with pytest.raises(DataError, match="question n4: field 'metadata.supporting_sentences'"):
        gold_reference_ids(bad)


def test_attach_copies_and_recomputes(tmp_path):
    (ex,) = _load_hotpot(tmp_path, [_hotpot("h1", [["C", 1], ["B", 1]], CONTEXT)])
    ex.metadata[GOLD_REFERENCE_KEY] = [7]  # a stale value is never read back
    assert gold_reference_ids(ex).ids == [1, 2]
    before = dict(ex.metadata)
    (out,), report = attach_reference_ids([ex])
    assert out is not ex and out.metadata is not ex.metadata
    assert ex.metadata == before  # the input is untouched
    assert out.metadata[GOLD_REFERENCE_KEY] == [1, 2]
    assert {k: v for k, v in out.metadata.items() if k != GOLD_REFERENCE_KEY} == {
        k: v for k, v in before.items() if k != GOLD_REFERENCE_KEY
    }
    assert isinstance(report, ReferenceReport) and report.n_in == report.n_out == 1
    # the canonical file keeps the sentences, so the ids are the same after a round trip
    path = tmp_path / "q.jsonl"
    write_examples(path, [out])
    (again,), _ = read_examples(path)
    assert again.metadata[GOLD_REFERENCE_KEY] == [1, 2] and gold_reference_ids(again) == gold_reference_ids(
        ex
    )


def test_synthetic_world(tmp_path):
    from ragrl.synth import generate_world

    generate_world(3, "small").write(tmp_path)  # the same world as the world_dir fixture, without its model
    examples, _ = read_examples(tmp_path / "train.jsonl")
    out, report = attach_reference_ids(examples)
    # unanswerable questions have a gold passage removed from their given passages: ARENA drops them
    unanswerable = {e.id for e in examples if e.metadata["answerable"] is False}
    assert set(report.dropped) == unanswerable and len(unanswerable) == 40
    assert all("is not among the" in r for reasons in report.dropped.values() for r in reasons)
    assert report.n_out == 360 and report.distribution == {"2": 270, "3": 90}
    for e in out:
        positions = sorted({[p.id for p in e.passages].index(s) + 1 for s in e.supporting_ids})
        assert e.metadata[GOLD_REFERENCE_KEY] == positions


# Measured on the shared samples (see docs/data.md, "Gold reference ids (ARENA)").
REAL = {
    HOTPOT: (500, {"2": 500}, {}),
    TWOWIKI: (
        497,
        {"1": 1, "2": 366, "4": 130},
        {
            "c049b0240bdd11eba7f7acde48001122": [
                "supporting fact ['Mario Bava', 13]: sentence index out of range"
            ],
            "2a84a2920bdd11eba7f7acde48001122": [
                "supporting fact ['Georges Lautner', 3]: sentence index out of range"
            ],
            "eb2a75220bdc11eba7f7acde48001122": [
                "supporting fact ['Louis IX, Landgrave of Hesse-Darmstadt', 6]: sentence index out of range"
            ],
        },
    ),
    MUSIQUE: (200, {"2": 145, "3": 32, "4": 23}, {}),
}


@pytest.mark.parametrize("rel", list(REAL))
def test_real_samples(shared_data, rel):
    examples, _ = load_dataset(shared_data / rel)
    n_out, distribution, dropped = REAL[rel]
    out, report = attach_reference_ids(examples)
    assert (report.n_in, report.n_out) == (len(examples), n_out)
    assert report.distribution == distribution and report.dropped == dropped
    assert all(-1 not in e.metadata[GOLD_REFERENCE_KEY] for e in out)
    # where ARENA's substring rule differs from the loader's title-based supporting ids
    differs = {}
    for e in out:
        positions = sorted({[p.id for p in e.passages].index(s) + 1 for s in e.supporting_ids})
        if positions != e.metadata[GOLD_REFERENCE_KEY]:
            differs[e.id] = (positions, e.metadata[GOLD_REFERENCE_KEY])
    expected = {
        # "The Big 12 Conference is a ..." also opens passage 5, "History of the Big 12 Conference"
        HOTPOT: {"5a8456ef5542990548d0b289": ([6, 10], [5, 6])},
        # "Alessandro, Principe Ruspoli" (a 2Wiki sentence fragment) also opens passage 5, and the
        # sentence "Riccardo" is in passage 1
        TWOWIKI: {
            "ce98e6620bd911eba7f7acde48001122": ([1, 7], [1, 5]),
            "8a23b5ac0bd911eba7f7acde48001122": ([1, 9], [1]),
        },
        MUSIQUE: {},
    }[rel]
    assert differs == expected
    # under "keep" the unresolved ones keep their -1
    kept, report = attach_reference_ids(examples, rule="keep")
    assert len(kept) == len(examples) and set(report.kept_unresolved) == set(dropped)
    assert Counter(-1 in e.metadata[GOLD_REFERENCE_KEY] for e in kept)[True] == len(dropped)
