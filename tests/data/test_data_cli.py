"""`ragrl data convert` and `ragrl data stats`, end to end."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ragrl.cli import app, main
from ragrl.data.io import read_corpus, read_examples
from ragrl.data.stats import compute_stats

runner = CliRunner()
HOTPOT = "hotpotqa/leeyeezeee__benchfortir/test.jsonl"
TWOWIKI = "2wikimultihopqa/saptarshi059__TTS-project/sampled_ds.json"
MUSIQUE = "musique/AdelWang__MIGRES/musique.json"


def test_convert_hotpotqa_writes_questions_and_corpus(shared_data, tmp_path):
    result = runner.invoke(app, ["data", "convert", str(shared_data / HOTPOT), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "format: hotpotqa" in result.output
    assert f"wrote 500 questions to {tmp_path / 'questions.jsonl'}" in result.output
    assert "wrote 4947 distinct passages" in result.output and "from 4978 given" in result.output
    examples, _ = read_examples(tmp_path / "questions.jsonl")
    corpus, report = read_corpus(tmp_path / "corpus.jsonl")
    assert len(examples) == 500 and len(corpus) == 4947 and not report.warnings
    ids = {p.id for p in corpus}
    assert all(set(e.supporting_ids) <= ids for e in examples)
    first = json.loads((tmp_path / "corpus.jsonl").read_text().splitlines()[0])
    assert first == {"id": examples[0].passages[0].id, "contents": examples[0].passages[0].contents}
    assert first["contents"].startswith("Meet Corliss Archer\nMeet Corliss Archer, a program")


def test_convert_reports_unresolved_facts(shared_data, tmp_path):
    result = runner.invoke(app, ["data", "convert", str(shared_data / TWOWIKI), "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "3 supporting facts in 3 questions could not be mapped to a passage" in result.output
    assert "c049b0240bdd11eba7f7acde48001122: [['Mario Bava', 13]]" in result.output


def test_convert_without_contexts_writes_no_corpus(shared_data, tmp_path):
    nq = shared_data / "nq/probe2__TIRESRAG-R1/test.jsonl"
    result = runner.invoke(app, ["data", "convert", str(nq), "--out", str(tmp_path), "--source", "nq"])
    assert result.exit_code == 0, result.output
    assert "no corpus written: the questions come without contexts" in result.output
    assert not (tmp_path / "corpus.jsonl").exists()
    examples, _ = read_examples(tmp_path / "questions.jsonl")
    assert len(examples) == 3610 and examples[0].metadata == {"source": "nq"}


def test_convert_skip_invalid(tmp_path):
    path = tmp_path / "m.jsonl"
    good = {"id": "2hop__1_2", "question": "Q?", "answer": "A", "answer_aliases": ["a"], "answerable": True}
    bad = {"id": "x", "answer": "B", "answerable": True}
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    out = tmp_path / "out"
    result = runner.invoke(app, ["data", "convert", str(path), "--out", str(out), "--skip-invalid"])
    assert result.exit_code == 0, result.output
    assert "read 1 records, skipped 1" in result.output
    assert "skipped 1 x field 'question': missing (line 2)" in result.output
    # a field a canonical record has no place for: the summary says it is not kept
    path.write_text(
        json.dumps({"id": "1", "question": "Q?", "golden_answers": ["A"], "type": "bridge"}) + "\n"
    )
    result = runner.invoke(app, ["data", "convert", str(path), "--out", str(tmp_path / "out2")])
    assert result.exit_code == 0, result.output
    assert "field 'type' is not part of a canonical record" in " ".join(result.output.split())
    assert "(1 records); put it under metadata to keep it" in " ".join(result.output.split())
    # a duplicate id skipped with --skip-invalid counts none of its fields (it used to count them)
    record = {"id": "1", "question": "Q?", "golden_answers": ["A"], "type": "bridge"}
    path.write_text(json.dumps(record) + "\n" + json.dumps({**record, "level": "hard"}) + "\n")
    args = ["data", "convert", str(path), "--out", str(tmp_path / "o3"), "--skip-invalid"]
    result = runner.invoke(app, args)
    said = " ".join(result.output.split())
    assert result.exit_code == 0 and "read 1 records, skipped 1" in said, result.output
    assert "field 'type' is not part of a canonical record" in said and "(1 records)" in said
    assert "'level'" not in said


def test_convert_leaves_empty_passages_out_of_the_corpus_and_says_so(tmp_path):
    path = tmp_path / "m.jsonl"
    paragraphs = [
        {"idx": 0, "title": "Ada", "paragraph_text": "Ada was born in Bree.", "is_supporting": True},
        {"idx": 1, "title": "", "paragraph_text": "  "},  # nothing a search could find
    ]
    record = {
        "id": "2hop__1_2",
        "question": "Q?",
        "answer": "Bree",
        "answerable": True,
        "paragraphs": paragraphs,
    }
    path.write_text(json.dumps(record) + "\n")
    out = tmp_path / "out"
    result = runner.invoke(app, ["data", "convert", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 1 distinct passages" in result.output and "from 2 given" in result.output
    assert "left out 1 empty passages (no title and no text; `ragrl index` refuses them)" in result.output
    corpus, _ = read_corpus(out / "corpus.jsonl")  # what ragrl index reads: no error
    assert [p.title for p in corpus] == ["Ada"]


def test_cli_errors_are_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"_id": "a", "answer": "A", "supporting_facts": [], "context": []}) + "\n")
    with pytest.raises(SystemExit) as e:
        main(["data", "convert", str(path), "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {path}:1: field 'question': missing" in " ".join(err.split())
    with pytest.raises(SystemExit) as e:
        main(["data", "stats", str(path), "--format", "squad"])
    assert e.value.code == 2


def test_stats_json_on_raw_and_canonical_files(shared_data, tmp_path):
    result = runner.invoke(app, ["data", "stats", str(shared_data / MUSIQUE), "--json"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)
    assert stats["questions"] == 200
    assert stats["type"] == {"2hop": 145, "3hop1": 28, "3hop2": 4, "4hop1": 18, "4hop2": 1, "4hop3": 4}
    assert stats["hops"] == {"2": 145, "3": 32, "4": 23}
    assert stats["supporting_ids"] == {"2": 145, "3": 32, "4": 23}
    assert stats["given_passages"]["per_question"] == {"20": 200}
    assert stats["answerable"] == {"answerable": 200}
    assert stats["aliases"] == {"total": 114, "questions_with_aliases": 61, "max": 6}
    assert stats["gold_reference_ids"] == {
        "questions": 200,
        "per_question": {"1": 0, "2": 145, "3": 32, "4+": 23},
        "mean": 2.39,
        "unresolvable": 0,
        "without_passages": 0,
    }
    # the same numbers from the converted canonical file
    runner.invoke(app, ["data", "convert", str(shared_data / MUSIQUE), "--out", str(tmp_path)])
    again = runner.invoke(app, ["data", "stats", str(tmp_path / "questions.jsonl"), "--json"])
    assert json.loads(again.stdout) == stats


def test_stats_numbers(shared_data):
    from ragrl.data.loaders import load_dataset

    hotpot = compute_stats(load_dataset(shared_data / HOTPOT)[0])
    assert hotpot["type"] == {"bridge": 427, "comparison": 73}
    assert hotpot["hops"] == {"2": 500} and hotpot["mean_hops"] == 2.0
    assert hotpot["given_passages"]["per_question"] == {"2": 2, "4": 1, "10": 497}
    assert hotpot["gold_reference_ids"]["per_question"] == {"1": 0, "2": 500, "3": 0, "4+": 0}
    assert hotpot["gold_reference_ids"]["unresolvable"] == 0
    twowiki = compute_stats(load_dataset(shared_data / TWOWIKI)[0])
    assert twowiki["hops"] == {"2": 370, "4": 130}
    assert twowiki["supporting_ids"] == {"1": 3, "2": 367, "4": 130}
    assert twowiki["unresolved_supporting_facts"] == {"questions": 3, "facts": 3}
    # ARENA's gold ids: the 3 unresolved questions are unresolvable; one short sentence ("Riccardo")
    # also occurs in an earlier passage, so that question has a single gold id
    assert twowiki["gold_reference_ids"] == {
        "questions": 497,
        "per_question": {"1": 1, "2": 366, "3": 0, "4+": 130},
        "mean": 2.521,
        "unresolvable": 3,
        "without_passages": 0,
    }
    bamboo_csv = shared_data / "bamboogle/LoganMilandin__comp-gap-public/bamboogle.csv"
    bamboo = compute_stats(load_dataset(bamboo_csv)[0])
    assert bamboo["questions"] == 125 and bamboo["aliases"]["total"] == 1
    assert bamboo["answerable"] == {"unknown": 125} and bamboo["hops"] == {"(none)": 125}
    assert (
        bamboo["gold_reference_ids"]["unresolvable"]
        == bamboo["gold_reference_ids"]["without_passages"]
        == 125
    )
    assert bamboo["gold_reference_ids"]["mean"] is None


def test_stats_tables(shared_data):
    result = runner.invoke(app, ["data", "stats", str(shared_data / HOTPOT)])
    assert result.exit_code == 0, result.output
    for text in ("hops (distinct gold paragraphs)", "supporting ids per question", "bridge", "427", "73"):
        assert text in result.stdout
    assert "ARENA gold reference ids per resolvable question" in result.stdout
    assert "ARENA gold ids: resolvable questions / mean ids" in result.stdout
