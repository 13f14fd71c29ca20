"""Malformed input: errors name file, line (or record index) and field; skip_invalid reports instead."""

from __future__ import annotations

import json

import pytest

from ragrl.data.loaders import load_bamboogle, load_dataset, load_hotpotqa, load_musique
from ragrl.errors import DataError, RagrlError

GOOD_HOTPOT = {
    "_id": "a1",
    "question": "Q?",
    "answer": "A",
    "type": "bridge",
    "level": "hard",
    "supporting_facts": [["T1", 0], ["T2", 1]],
    "context": [["T1", ["One.", " Two."]], ["T2", ["Three.", " Four."]]],
}


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_missing_field_in_jsonl(tmp_path):
    bad = dict(GOOD_HOTPOT, _id="a2")
    del bad["question"]
    path = _jsonl(tmp_path / "h.jsonl", [GOOD_HOTPOT, bad])
    with pytest.raises(DataError) as e:
        load_hotpotqa(path)
    assert str(e.value) == f"{path}:2: field 'question': missing"
    assert (e.value.line, e.value.field) == (2, "question")


def test_wrong_type_names_the_nested_field(tmp_path):
    bad = dict(GOOD_HOTPOT, supporting_facts=[["T1", 0], ["T2", "1"]])
    path = _jsonl(tmp_path / "h.jsonl", [bad])
    with pytest.raises(DataError) as e:
        load_dataset(path)
    assert str(e.value) == f"{path}:1: field 'supporting_facts[1]': must be a [title, sentence index] pair"
    bad = dict(GOOD_HOTPOT, context=[["T1", "not a list"]])
    path = _jsonl(tmp_path / "h2.jsonl", [bad])
    with pytest.raises(DataError, match=r"h2.jsonl:1: field 'context\[0\]': must be a \[title, \[sentence"):
        load_dataset(path)


def test_json_array_errors_give_line_and_record_index(tmp_path):
    bad = dict(GOOD_HOTPOT, _id="a2")
    del bad["answer"]
    path = tmp_path / "dev.json"
    path.write_text(json.dumps([GOOD_HOTPOT, bad], indent=2))
    starts = [i + 1 for i, line in enumerate(path.read_text().splitlines()) if line == "  {"]
    assert len(starts) == 2
    with pytest.raises(DataError) as e:
        load_hotpotqa(path)
    assert str(e.value) == f"{path}:{starts[1]}: JSON array item [1]: field 'answer': missing"


def test_pandas_columns_errors_give_row_label(tmp_path):
    path = tmp_path / "cols.json"
    path.write_text(
        json.dumps(
            {
                "_id": {"7": "a", "9": "b"},
                "question": {"7": "Q?", "9": 5},
                "answer": {"7": "A", "9": "B"},
                "type": {"7": "compositional", "9": "compositional"},
            }
        )
    )
    with pytest.raises(DataError) as e:
        load_dataset(path)
    assert str(e.value) == f"{path}: row '9': field 'question': must be a string, got int"


def test_skip_invalid_records_every_skip(tmp_path):
    no_q = dict(GOOD_HOTPOT, _id="a2")
    del no_q["question"]
    path = tmp_path / "h.jsonl"
    path.write_text(
        json.dumps(GOOD_HOTPOT) + "\n" + json.dumps(no_q) + "\n{broken\n" + json.dumps(GOOD_HOTPOT) + "\n"
    )
    examples, report = load_hotpotqa(path, skip_invalid=True)
    assert [e.id for e in examples] == ["a1"]
    assert report.read == 1
    assert [str(e) for e in report.skipped] == [
        f"{path}:2: field 'question': missing",
        f"{path}:3: invalid JSON (Expecting property name enclosed in double quotes at column 2)",
        f"{path}:4: field 'id': duplicate id 'a1' (first at {path}:1)",
    ]
    assert "skipped 3" in report.summary()


def test_unresolved_facts_are_kept_and_reported(tmp_path):
    rec = dict(GOOD_HOTPOT, supporting_facts=[["T1", 0], ["T1", 5], ["Nowhere", 0]])
    path = _jsonl(tmp_path / "h.jsonl", [rec])
    (ex,), report = load_hotpotqa(path)
    assert ex.supporting_ids == [ex.passages[0].id]
    assert ex.metadata["unresolved_supporting_facts"] == [["T1", 5], ["Nowhere", 0]]
    assert ex.metadata["supporting_facts"] == [["T1", 0], ["T1", 5], ["Nowhere", 0]]
    assert ex.metadata["hops"] == 2
    assert ex.metadata["supporting_sentences"] == ["One.", None, None]  # text as given, None if unresolved
    assert report.warnings == [
        f"{path}:1: question a1: supporting fact ['T1', 5] not resolved: "
        "sentence index out of range (paragraph has 2 sentences)",
        f"{path}:1: question a1: supporting fact ['Nowhere', 0] not resolved: title not in context",
    ]


def test_duplicate_title_uses_first_paragraph_with_that_sentence(tmp_path):
    rec = dict(GOOD_HOTPOT, supporting_facts=[["T", 2]], context=[["T", ["a."]], ["T", ["b.", " c.", " d."]]])
    (ex,), _ = load_hotpotqa(_jsonl(tmp_path / "h.jsonl", [rec]))
    assert ex.supporting_ids == [ex.passages[1].id]
    assert ex.metadata["supporting_sentences"] == [" d."]
    assert ex.passages[1].text == "b. c. d."


def test_musique_errors(tmp_path):
    rec = {
        "id": "2hop__1_2",
        "question": "Q?",
        "answer": "A",
        "answer_aliases": [],
        "answerable": True,
        "paragraphs": [{"idx": 0, "title": "T", "paragraph_text": 3, "is_supporting": True}],
        "question_decomposition": [],
    }
    path = _jsonl(tmp_path / "m.jsonl", [rec])
    with pytest.raises(DataError) as e:
        load_musique(path)
    assert str(e.value) == f"{path}:1: field 'paragraphs[0].paragraph_text': missing or not a string"


def test_bamboogle_csv_errors(tmp_path):
    path = tmp_path / "b.csv"
    path.write_text("question,,,,answer,,\nWho?,,,,Me,,\n\nWhat?,,,\n")
    with pytest.raises(DataError) as e:
        load_bamboogle(path)
    assert str(e.value) == (
        f"{path}:4: field 'answer': expected at least 5 columns (question, -, -, -, answer), got 4"
    )
    examples, report = load_bamboogle(path, skip_invalid=True)
    assert [(e.id, e.question, e.answers) for e in examples] == [("test_0", "Who?", ["Me"])]
    assert len(report.skipped) == 1


def test_unknown_layout_lists_formats(tmp_path):
    path = _jsonl(tmp_path / "x.jsonl", [{"prompt": "hi", "completion": "there"}])
    with pytest.raises(RagrlError) as e:
        load_dataset(path)
    assert str(e.value) == (
        f"{path}: cannot tell the dataset format (first record: prompt, completion). Supported formats: "
        "hotpotqa, 2wiki, musique, bamboogle, flashrag (canonical = flashrag). Pass --format to choose one."
    )
    with pytest.raises(RagrlError, match="unknown format 'squad'; choose one of: auto, hotpotqa, 2wiki"):
        load_dataset(path, "squad")


def test_explicit_format_that_does_not_match(tmp_path):
    path = _jsonl(tmp_path / "h.jsonl", [GOOD_HOTPOT])
    with pytest.raises(RagrlError) as e:
        load_musique(path)
    assert str(e.value) == f"{path}: looks like hotpotqa, not musique; use --format hotpotqa or auto"


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(RagrlError, match="no such file"):
        load_dataset(tmp_path / "nope.json")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="empty.jsonl: empty file"):
        load_dataset(tmp_path / "empty.jsonl")


def test_hf_dict_layout_with_uneven_columns(tmp_path):
    hf = dict(GOOD_HOTPOT, id="a1", supporting_facts={"title": ["T1", "T2"], "sent_id": [0]})
    del hf["_id"]
    path = _jsonl(tmp_path / "hf.jsonl", [hf])
    with pytest.raises(DataError) as e:
        load_hotpotqa(path)
    assert str(e.value) == (
        f"{path}:1: field 'supporting_facts': "
        "the dict layout needs lists 'title' and 'sent_id' of the same length"
    )
    hf["supporting_facts"] = {"title": ["T1"], "sent_id": [0]}
    hf["context"] = {"title": ["T1", "T2"], "sentences": [["One."]]}
    path = _jsonl(tmp_path / "hf2.jsonl", [hf])
    with pytest.raises(
        DataError, match=r"field 'context': the dict layout needs lists 'title' and 'sentences'"
    ):
        load_hotpotqa(path)
