"""Loaders against the real shared dataset samples (see shared/data/SOURCES.md)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from ragrl.data.io import read_examples, write_examples
from ragrl.data.loaders import (
    detect_format,
    join_sentences,
    load_2wiki,
    load_bamboogle,
    load_dataset,
    load_flashrag,
    load_hotpotqa,
    load_musique,
)
from ragrl.errors import RagrlError

HOTPOT = "hotpotqa/leeyeezeee__benchfortir/test.jsonl"
TWOWIKI = "2wikimultihopqa/saptarshi059__TTS-project/sampled_ds.json"
TWOWIKI_LAG = "2wikimultihopqa/peterbaile__lag/dev.json"
MUSIQUE = "musique/AdelWang__MIGRES/musique.json"
MUSIQUE_LAG = "musique/peterbaile__lag/dev.json"
BAMBOO_CSV = "bamboogle/LoganMilandin__comp-gap-public/bamboogle.csv"
BAMBOO_JSON = "bamboogle/LoganMilandin__comp-gap-public/bamboogle.json"
BAMBOO_FLASHRAG = "bamboogle/GaurisankarJ__reason_over_search/test.jsonl"


def _raw_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def hotpot(shared_data):
    return load_hotpotqa(shared_data / HOTPOT)


@pytest.fixture(scope="module")
def twowiki(shared_data):
    return load_2wiki(shared_data / TWOWIKI)


@pytest.fixture(scope="module")
def musique(shared_data):
    return load_musique(shared_data / MUSIQUE)


def test_join_sentences():
    assert join_sentences(["A b.", " C d.", " E."]) == "A b. C d. E."  # HotpotQA: own leading space
    assert join_sentences(["A b.", "C d.", "E."]) == "A b. C d. E."  # 2Wiki: none
    assert join_sentences(["A b. ", "C."]) == "A b. C."
    assert join_sentences([]) == ""


@pytest.mark.parametrize(
    "rel, fmt",
    [
        (HOTPOT, "hotpotqa"),
        (TWOWIKI, "2wiki"),
        (TWOWIKI_LAG, "2wiki"),
        (MUSIQUE, "musique"),
        (MUSIQUE_LAG, "musique"),
        (BAMBOO_CSV, "bamboogle"),
        (BAMBOO_JSON, "bamboogle"),
        (BAMBOO_FLASHRAG, "flashrag"),
        ("nq/probe2__TIRESRAG-R1/test.jsonl", "flashrag"),
        ("popqa/GaurisankarJ__reason_over_search/test.jsonl", "flashrag"),
    ],
)
def test_detect_format_by_content(shared_data, rel, fmt):
    assert detect_format(shared_data / rel) == fmt


def test_corpus_file_is_not_a_question_file(shared_data):
    with pytest.raises(RagrlError, match="looks like a passage corpus"):
        load_dataset(shared_data / "corpus/OSU-NLP-Group__HippoRAG/2wikimultihopqa_corpus.json")


def test_hotpotqa(hotpot, shared_data):
    examples, report = hotpot
    assert len(examples) == report.read == 500 and not report.skipped and not report.warnings
    assert Counter(e.metadata["type"] for e in examples) == {"bridge": 427, "comparison": 73}
    assert {e.metadata["level"] for e in examples} == {"hard"}
    assert Counter(len(e.passages) for e in examples) == {10: 497, 2: 2, 4: 1}
    assert Counter(e.metadata["hops"] for e in examples) == {2: 500}  # ARENA Table 2: 500 x 2-hop
    first = examples[0]
    assert first.id == "5a8c7595554299585d9e36b6"
    assert first.answers == ["Chief of Protocol"]
    titles = {p.id: p.title for p in first.passages}
    assert [titles[i] for i in first.supporting_ids] == ["Kiss and Tell (1945 film)", "Shirley Temple"]
    assert first.metadata["supporting_facts"] == [
        ["Kiss and Tell (1945 film)", 0],
        ["Shirley Temple", 0],
        ["Shirley Temple", 1],
    ]
    assert first.metadata["source"] == "hotpotqa"
    raw = _raw_jsonl(shared_data / HOTPOT)[0]
    # one sentence per fact, in fact order, exactly as given (HotpotQA's carry a leading space)
    context = dict(raw["context"])
    assert first.metadata["supporting_sentences"] == [context[t][i] for t, i in raw["supporting_facts"]]
    assert first.metadata["supporting_sentences"][2].startswith(" ")
    assert all(
        len(e.metadata["supporting_sentences"]) == len(e.metadata["supporting_facts"])
        and None not in e.metadata["supporting_sentences"]
        for e in examples
    )
    assert [p.title for p in first.passages] == [t for t, _ in raw["context"]]  # original order
    temple = next(p for p in first.passages if p.title == "Shirley Temple")
    assert temple.text == "".join(dict(raw["context"])["Shirley Temple"])  # sentences carry the space
    assert "  " not in temple.text


def test_hotpotqa_json_array_and_hf_dict_layouts(hotpot, shared_data, tmp_path):
    raws = _raw_jsonl(shared_data / HOTPOT)[:40]
    array = tmp_path / "hotpot_dev.json"
    array.write_text(json.dumps(raws, indent=2))
    hf = tmp_path / "hotpot_hf.jsonl"
    with hf.open("w") as f:
        for r in raws:
            f.write(
                json.dumps(
                    {
                        "id": r["_id"],
                        "question": r["question"],
                        "answer": r["answer"],
                        "type": r["type"],
                        "level": r["level"],
                        "supporting_facts": {
                            "title": [t for t, _ in r["supporting_facts"]],
                            "sent_id": [s for _, s in r["supporting_facts"]],
                        },
                        "context": {
                            "title": [t for t, _ in r["context"]],
                            "sentences": [s for _, s in r["context"]],
                        },
                    }
                )
                + "\n"
            )
    expected = [e.to_record() for e in hotpot[0][:40]]
    for path in (array, hf):
        assert detect_format(path) == "hotpotqa"
        examples, report = load_hotpotqa(path)
        assert [e.to_record() for e in examples] == expected
        assert report.read == 40


def test_2wiki_pandas_columns(twowiki):
    examples, report = twowiki
    assert len(examples) == 500
    assert Counter(e.metadata["type"] for e in examples) == {
        "compositional": 202,
        "bridge_comparison": 130,
        "comparison": 104,
        "inference": 64,
    }
    assert Counter(e.metadata["hops"] for e in examples) == {2: 370, 4: 130}
    assert Counter(len(e.supporting_ids) for e in examples) == {2: 367, 4: 130, 1: 3}
    assert all(len(e.passages) == 10 for e in examples)
    # exactly 3 questions have a supporting fact whose sentence index is out of range
    unresolved = {
        e.id: e.metadata["unresolved_supporting_facts"]
        for e in examples
        if "unresolved_supporting_facts" in e.metadata
    }
    assert unresolved == {
        "c049b0240bdd11eba7f7acde48001122": [["Mario Bava", 13]],
        "2a84a2920bdd11eba7f7acde48001122": [["Georges Lautner", 3]],
        "eb2a75220bdc11eba7f7acde48001122": [["Louis IX, Landgrave of Hesse-Darmstadt", 6]],
    }
    for e in examples:  # unresolved facts have a null sentence, all others their text
        sentences = e.metadata["supporting_sentences"]
        assert len(sentences) == len(e.metadata["supporting_facts"])
        nulls = [f for f, s in zip(e.metadata["supporting_facts"], sentences, strict=True) if s is None]
        assert nulls == unresolved.get(e.id, [])
    assert len(report.warnings) == 3
    assert report.warnings[0].endswith(
        "sampled_ds.json: row '5440': question c049b0240bdd11eba7f7acde48001122: supporting fact "
        "['Mario Bava', 13] not resolved: sentence index out of range (paragraph has 10 sentences)"
    )
    first = examples[0]
    assert first.metadata["evidences"] and first.metadata["answer_id"]
    assert first.passages[0].text.startswith("Anthony Robinson( 1762–1827)")


def test_2wiki_original_array_layout(twowiki, shared_data, tmp_path):
    columns = json.loads((shared_data / TWOWIKI).read_text())
    labels = list(columns["_id"])
    records = [{col: columns[col][label] for col in columns} for label in labels]
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(records, indent=1))
    examples, report = load_dataset(path)
    assert [e.to_record() for e in examples] == [e.to_record() for e in twowiki[0]]
    assert len(report.warnings) == 3 and ": JSON array item [" in report.warnings[0]
    # sentences without their own leading space are joined with one space
    rec = records[0]
    title, sents = rec["context"][3]
    assert len(sents) > 1 and not sents[1].startswith(" ")
    assert examples[0].passages[3].text == " ".join(sents)


def test_2wiki_without_context(shared_data):
    examples, report = load_2wiki(shared_data / TWOWIKI_LAG)
    assert len(examples) == 4000
    assert Counter(e.metadata["type"] for e in examples) == {
        "compositional": 1739,
        "comparison": 925,
        "bridge_comparison": 861,
        "inference": 475,
    }
    assert all(e.passages is None and e.supporting_ids == [] for e in examples)
    assert all(e.metadata["supporting_facts"] for e in examples)
    assert not any("supporting_sentences" in e.metadata for e in examples)  # no context, no sentences
    assert len(report.warnings) == 1
    assert "4000 records have supporting facts but no 'context'" in report.warnings[0]


def test_musique(musique, shared_data):
    examples, report = musique
    assert len(examples) == 200 and not report.warnings
    assert Counter(e.metadata["type"] for e in examples) == {
        "2hop": 145,
        "3hop1": 28,
        "3hop2": 4,
        "4hop1": 18,
        "4hop2": 1,
        "4hop3": 4,
    }
    assert Counter(e.metadata["hops"] for e in examples) == {2: 145, 3: 32, 4: 23}
    assert all(e.metadata["answerable"] is True for e in examples)
    assert all(len(e.passages) == 20 for e in examples)
    raw = _raw_jsonl(shared_data / MUSIQUE)[0]
    first = examples[0]
    by_idx = {p["idx"]: first.passages[i] for i, p in enumerate(raw["paragraphs"])}
    assert first.supporting_ids == [by_idx[p["idx"]].id for p in raw["paragraphs"] if p["is_supporting"]]
    steps = first.decomposition
    assert [s.question for s in steps] == [d["question"] for d in raw["question_decomposition"]]
    assert [s.supporting_ids for s in steps] == [
        (by_idx[d["paragraph_support_idx"]].id,) for d in raw["question_decomposition"]
    ]
    assert steps[-1].answers == (raw["question_decomposition"][-1]["answer"],)
    # golden answers = answer + aliases
    assert sum(len(e.answers) - 1 for e in examples) == 114
    for e in examples:
        assert set(e.supporting_ids) == {s.supporting_ids[0] for s in e.decomposition}


def test_musique_without_paragraphs(shared_data):
    examples, report = load_musique(shared_data / MUSIQUE_LAG)
    assert len(examples) == 2417
    assert examples[0].id == "2hop__460946_294723"
    assert Counter(e.metadata["type"] for e in examples) == {
        "2hop": 1252,
        "3hop1": 568,
        "3hop2": 192,
        "4hop1": 246,
        "4hop2": 64,
        "4hop3": 95,
    }
    first = examples[0]
    assert first.passages is None and first.supporting_ids == []
    assert [(s.question, s.answers) for s in first.decomposition] == [
        ("Green >> performer", ("Steve Hillage",)),
        ("#1 >> spouse", ("Miquette Giraudy",)),
    ]
    assert first.metadata["supporting_paragraph_idxs"] == [5, 10]
    assert first.metadata["supporting_document_ids"] == [
        "Green (Steve Hillage album)_0",
        "Miquette Giraudy_0",
    ]
    assert len(report.warnings) == 1 and "2417 records have no 'paragraphs'" in report.warnings[0]


def test_bamboogle_three_layouts(shared_data):
    csv_ex, _ = load_bamboogle(shared_data / BAMBOO_CSV)
    json_ex, _ = load_bamboogle(shared_data / BAMBOO_JSON)
    fr_ex, _ = load_bamboogle(shared_data / BAMBOO_FLASHRAG)
    assert len(csv_ex) == len(json_ex) == len(fr_ex) == 125
    with_alias = [e for e in csv_ex if len(e.answers) > 1]
    assert [e.answers for e in with_alias] == [["Mildred Warner", "Mildred Gale"]]
    assert csv_ex[0].answers == ["james madison"]
    # row i gets FlashRAG's id test_i, and the three files agree on the questions
    assert [(e.id, e.question) for e in csv_ex] == [(e.id, e.question) for e in fr_ex]
    assert [(e.id, e.question) for e in json_ex] == [(e.id, e.question) for e in fr_ex]
    assert {e.metadata["source"] for e in csv_ex + json_ex + fr_ex} == {"bamboogle"}
    steps = json_ex[1].decomposition
    assert [s.question for s in steps] == [
        "What was the first spacecraft that ever approached Uranus?",
        "What rocket was Voyager 2 launched on?",
    ]
    assert steps[1].answers == ("titan iiie-centaur", "titan iiie")
    assert {e.metadata["hops"] for e in json_ex} == {2}


def test_flashrag_files(shared_data):
    nq, _ = load_flashrag(shared_data / "nq/probe2__TIRESRAG-R1/test.jsonl", source="nq")
    assert len(nq) == 3610 and nq[0].question == "who got the first nobel prize in physics"
    assert nq[0].metadata == {"source": "nq"}
    tq, _ = load_dataset(shared_data / "triviaqa/GaurisankarJ__reason_over_search/test.jsonl")
    assert len(tq) == 1000 and len(tq[0].answers) > 5
    pop, _ = load_dataset(shared_data / "popqa/GaurisankarJ__reason_over_search/test.jsonl")
    assert len(pop) == 1000 and pop[0].metadata["prop"] == "composer"


def test_canonical_round_trip(hotpot, musique, tmp_path):
    for examples, _ in (hotpot, musique):
        path = tmp_path / "q.jsonl"
        write_examples(path, examples)
        again, _ = read_examples(path)
        assert again == examples
        assert load_dataset(path)[0] == examples  # canonical files load as flashrag
