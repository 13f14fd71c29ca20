import json

import pytest

from ragrl.data import (
    Example,
    Passage,
    SubQuestion,
    passage_id,
    read_corpus,
    read_examples,
    write_corpus,
    write_examples,
)
from ragrl.errors import DataError


def test_passage_id_is_content_derived_and_stable():
    a = Passage.make("Shirley Temple", "Shirley Temple Black was an American actress.")
    b = Passage.make(" Shirley Temple ", "Shirley Temple Black was an American actress.  ")
    assert a == b
    assert a.id == passage_id("Shirley Temple", "Shirley Temple Black was an American actress.")
    assert a.id.startswith("p") and len(a.id) == 17
    assert Passage.make("Other", a.text).id != a.id


def test_contents_round_trip():
    p = Passage.make("Kiss and Tell (1945 film)", "Kiss and Tell is a 1945 American comedy film.")
    assert Passage.from_contents(p.id, p.contents) == p
    # FlashRAG wiki dumps quote the title
    assert Passage.from_contents("7", '"Title"\nbody').title == "Title"


def test_example_record_round_trip(tmp_path):
    p1, p2 = Passage.make("A", "a text"), Passage.make("B", "b text")
    ex = Example(
        id="q1",
        question="Who?",
        answers=["X", "x alias"],
        supporting_ids=[p2.id],
        passages=[p1, p2],
        decomposition=[SubQuestion("first?", ("Y",), (p2.id,)), SubQuestion("then?", ("X",))],
        metadata={"source": "test", "hops": 2},
    )
    rec = ex.to_record()
    assert rec["golden_answers"] == ["X", "x alias"]
    assert rec["metadata"]["supporting_ids"] == [p2.id]
    assert rec["metadata"]["passages"][0] == {"id": p1.id, "title": "A", "text": "a text"}
    assert Example.from_record(rec) == ex
    path = tmp_path / "q.jsonl"
    write_examples(path, [ex])
    back, report = read_examples(path)
    assert back == [ex] and report.read == 1 and not report.skipped


def test_flashrag_record_without_metadata():
    ex = Example.from_record({"id": "test_0", "question": "q?", "golden_answers": ["a"]})
    assert ex.supporting_ids == [] and ex.passages is None and ex.metadata == {}


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_errors_name_file_line_and_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"id": "1", "question": "q?", "golden_answers": ["a"]})
    _write(path, [good, json.dumps({"id": "2", "golden_answers": ["a"]})])
    with pytest.raises(DataError) as e:
        read_examples(path)
    assert str(e.value) == f"{path}:2: field 'question': missing"

    _write(path, [good, "{not json"])
    with pytest.raises(DataError, match=r"bad.jsonl:2: invalid JSON"):
        read_examples(path)

    _write(path, [good, json.dumps({"id": "3", "question": "q", "golden_answers": [1]})])
    with pytest.raises(DataError, match="golden_answers"):
        read_examples(path)

    # the answerable flag decides what trains (train.data.train_answerable_only): a string is an error
    flagged = {"id": "4", "question": "q", "golden_answers": ["unknown"], "metadata": {"answerable": "false"}}
    _write(path, [good, json.dumps(flagged)])
    with pytest.raises(DataError) as e:
        read_examples(path)
    assert str(e.value) == f"{path}:2: field 'metadata.answerable': must be true or false"
    flagged["metadata"]["answerable"] = False
    _write(path, [good, json.dumps(flagged)])
    assert [ex.answerable for ex in read_examples(path)[0]] == [True, False]

    # a decomposition step's answers and passage ids: strings, or the field is named (a skippable line)
    for step, field in (
        ({"question": "s1", "answers": 5}, "metadata.decomposition[1].answers"),
        ({"question": "s1", "answers": [5]}, "metadata.decomposition[1].answers"),
        ({"question": "s1", "supporting_ids": 7}, "metadata.decomposition[1].supporting_ids"),
    ):
        steps = [{"question": "s0", "answers": "x", "supporting_ids": ["p"]}, step]
        _write(path, [good, json.dumps({**flagged, "metadata": {"decomposition": steps}})])
        with pytest.raises(DataError) as e:
            read_examples(path)
        assert str(e.value).startswith(f"{path}:2: field '{field}': ")
        examples, report = read_examples(path, skip_invalid=True)
        assert [ex.id for ex in examples] == ["1"] and [s.line for s in report.skipped] == [2]


def test_skip_invalid_reports_every_skipped_line(tmp_path):
    path = tmp_path / "mixed.jsonl"
    lines = [
        json.dumps({"id": "1", "question": "q?", "golden_answers": ["a"]}),
        "{broken",
        json.dumps({"id": "2", "question": "", "golden_answers": ["a"]}),
        json.dumps({"id": "1", "question": "dup?", "golden_answers": ["a"]}),
        json.dumps({"id": "4", "question": "q4?", "golden_answers": ["b"]}),
    ]
    _write(path, lines)
    examples, report = read_examples(path, skip_invalid=True)
    assert [e.id for e in examples] == ["1", "4"]
    assert [e.line for e in report.skipped] == [2, 3, 4]
    assert "skipped 3" in report.summary()
    assert "  skipped 1 x field 'question': must be a non-empty string (line 3)" in report.summary()
    report.skipped = [DataError("missing", path=path, line=n, field="question") for n in range(1, 13)]
    assert report.summary().splitlines()[1] == (
        "  skipped 12 x field 'question': missing (line 1, line 2, line 3, line 4, line 5, line 6, line 7, "
        "line 8, line 9, line 10, and 2 more)"
    )


def test_read_corpus_formats(tmp_path):
    jl = tmp_path / "c.jsonl"
    _write(
        jl, [json.dumps({"id": "0", "contents": "T\nbody"}), json.dumps({"id": "0", "contents": "T\nbody"})]
    )
    passages, report = read_corpus(jl)
    assert passages == [Passage("0", "T", "body")] and len(report.warnings) == 1
    arr = tmp_path / "c.json"
    arr.write_text(json.dumps([{"title": "T", "text": "body"}, {"title": "U", "text": "more"}]))
    passages, _ = read_corpus(arr)
    assert [p.id for p in passages] == [passage_id("T", "body"), passage_id("U", "more")]
    _write(
        jl, [json.dumps({"id": "0", "contents": "T\nbody"}), json.dumps({"id": "0", "contents": "T\nother"})]
    )
    with pytest.raises(DataError, match="c.jsonl:2: field 'id': duplicate id"):
        read_corpus(jl)


def test_a_title_beside_contents_is_kept(tmp_path):
    """``{id, title, contents}``: FlashRAG's ``contents`` whose first line is that title splits as usual;
    ``contents`` that does not begin with the title is the body under it (the title used to be dropped)."""
    jl = tmp_path / "c.jsonl"
    records = [
        {"id": "0", "title": "Paris", "contents": "Paris\nThe capital of France."},
        {"id": "1", "title": "Berlin", "contents": "The capital of Germany.\nIt lies on the Spree."},
        {"id": "2", "title": " ", "contents": "Rome\nThe capital of Italy."},
        {"id": "3", "title": '"Weird Al" Yankovic', "contents": '"Weird Al" Yankovic\nA singer.'},
        {"id": "4", "title": "A\nB", "contents": "A\nB\nA title with a newline."},
    ]
    _write(jl, [json.dumps(r) for r in records])
    passages, _ = read_corpus(jl)
    assert passages == [
        Passage("0", "Paris", "The capital of France."),
        Passage("1", "Berlin", "The capital of Germany.\nIt lies on the Spree."),
        Passage("2", "Rome", "The capital of Italy."),  # a blank title is no title
        Passage("3", '"Weird Al" Yankovic', "A singer."),  # quotes in the title: still split off
        Passage("4", "A\nB", "A title with a newline."),
    ]
    _write(jl, [json.dumps({"id": "0", "title": 3, "contents": "T\nbody"})])
    with pytest.raises(DataError, match="c.jsonl:1: field 'title': must be a string"):
        read_corpus(jl)
    # a question's own passages read the same way
    given = records[:2]
    record = {"id": "q", "question": "q?", "golden_answers": ["a"], "metadata": {"passages": given}}
    assert Example.from_record(record).passages == passages[:2]
    # ragrl's server sends id, contents, title and text: title and text are read, as before
    served = {"id": "5", "contents": "T\nbody", "title": "T", "text": "body"}
    untitled = {"id": "6", "contents": "U\nmore", "text": "ignored: no title beside it"}
    record["metadata"]["passages"] = [served, untitled]
    assert Example.from_record(record).passages == [Passage("5", "T", "body"), Passage("6", "U", "more")]
    # written back, every one of them reads the same: contents where it splits back, else title and text
    write_corpus(jl, passages)
    assert read_corpus(jl)[0] == passages
    assert '"title": "\\"Weird Al\\" Yankovic"' in jl.read_text()


def test_an_empty_passage_is_an_error_naming_its_line_or_is_skipped_and_reported(tmp_path):
    jl = tmp_path / "c.jsonl"
    empty = [
        {"id": "1", "contents": ""},
        {"id": "1", "contents": " \n  "},
        {"id": "1", "contents": '" "\n'},  # a quoted blank title
        {"id": "1", "title": "", "text": " "},
    ]
    for record, field in zip(empty, ("contents", "contents", "contents", "text"), strict=True):
        _write(jl, [json.dumps({"id": "0", "contents": "T\nbody"}), json.dumps(record)])
        with pytest.raises(
            DataError, match=rf"c.jsonl:2: field '{field}': empty passage \(no title and no text\)"
        ):
            read_corpus(jl)
    passages, report = read_corpus(jl, skip_invalid=True)
    assert [p.id for p in passages] == ["0"] and [e.line for e in report.skipped] == [2]
    array = tmp_path / "c.json"  # a JSON array of {title, text}: the item is named
    array.write_text(json.dumps([{"title": "T", "text": "body"}, {"title": " ", "text": ""}]))
    with pytest.raises(DataError, match=r"JSON array item \[1\]: field 'text': empty passage"):
        read_corpus(array)
    # a title alone, or a text alone, is a passage
    _write(
        jl,
        [
            json.dumps({"id": "0", "contents": "Title only"}),
            json.dumps({"id": "1", "title": "", "text": "t"}),
        ],
    )
    assert [(p.title, p.text) for p in read_corpus(jl)[0]] == [("Title only", ""), ("", "t")]


def test_read_corpora_merges_by_id_and_rejects_conflicts(tmp_path):
    from ragrl.data import read_corpora

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write(
        a, [json.dumps({"id": "0", "contents": "T\nbody"}), json.dumps({"id": "1", "contents": "U\nmore"})]
    )
    _write(
        b, [json.dumps({"id": "1", "contents": "U\nmore"}), json.dumps({"id": "2", "contents": "V\nlast"})]
    )
    passages, reports = read_corpora([a, b])
    assert [p.id for p in passages] == ["0", "1", "2"]
    assert [r.read for r in reports] == [2, 2]
    _write(b, [json.dumps({"id": "1", "contents": "U\nchanged"})])
    with pytest.raises(DataError, match=r"b.jsonl:1: field 'id': passage id '1' has different contents"):
        read_corpora([a, b])


def test_written_files_are_readable_by_others(tmp_path):
    path = tmp_path / "q.jsonl"
    write_examples(path, [Example("1", "q?", ["a"])])
    assert path.stat().st_mode & 0o044 == 0o044


def test_iter_corpora_streams_merges_and_names_the_line_of_a_conflict(tmp_path):
    from ragrl.data.io import iter_corpora

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write(
        a,
        [
            json.dumps({"id": "0", "contents": "T\nbody"}),
            json.dumps({"id": "0", "contents": "T\nbody"}),  # a repeat in the same file: merged
            "{not json",
        ],
    )
    _write(b, [json.dumps({"id": "0", "contents": "T\nbody"}), json.dumps({"id": "1", "contents": "U\nx"})])
    stream = iter_corpora([a, b])
    assert next(stream).id == "0"  # the first passage comes before the file is read to its end
    with pytest.raises(DataError, match=r"a.jsonl:3"):
        next(stream)
    _write(
        a, [json.dumps({"id": "0", "contents": "T\nbody"}), json.dumps({"id": "0", "contents": "T\nother"})]
    )
    with pytest.raises(DataError, match=r"a.jsonl:2: field 'id': duplicate id '0' with different contents"):
        list(iter_corpora([a]))
    _write(a, [json.dumps({"id": "0", "contents": "T\nbody"})])
    reports = []
    assert [p.id for p in iter_corpora([a, b], reports)] == ["0", "1"]
    assert [r.read for r in reports] == [1, 2]  # a passage in both files counts in both, is kept once
    _write(
        b, [json.dumps({"id": "0", "contents": "T\nbody"}), json.dumps({"id": "0", "contents": "T\nbody"})]
    )
    reports = []
    assert [p.id for p in iter_corpora([a, b], reports)] == ["0"]
    assert [r.read for r in reports] == [1, 1] and reports[1].warnings == [
        "line 2: duplicate of passage 0, merged"
    ]


def test_a_field_outside_the_canonical_record_is_reported_not_kept(tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [
        {"id": "1", "question": "q?", "golden_answers": ["a"], "type": "bridge"},
        {"id": "2", "question": "q?", "golden_answers": ["a"], "metadata": {"type": "bridge"}},
        {"id": "3", "question": "q?", "golden_answers": ["a"], "type": "comparison"},
    ]
    _write(path, [json.dumps(r) for r in rows])
    examples, report = read_examples(path)
    assert [ex.metadata for ex in examples] == [{}, {"type": "bridge"}, {}]
    assert report.warnings == [
        f"{path}: field 'type' is not part of a canonical record (id, question, golden_answers, metadata) "
        "and is not kept (2 records, first on line 1); put it under metadata to keep it"
    ]
