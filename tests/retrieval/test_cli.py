from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ragrl.cli import app, main
from ragrl.data.io import write_corpus, write_examples
from ragrl.data.schema import Example

runner = CliRunner()


@pytest.fixture(scope="module")
def built(tmp_path_factory, toy_passages):
    d = tmp_path_factory.mktemp("cli")
    half = len(toy_passages) // 2
    write_corpus(d / "c1.jsonl", toy_passages[: half + 1])
    write_corpus(d / "c2.jsonl", toy_passages[half:])  # overlaps c1 by one passage: merged by id
    result = runner.invoke(
        app,
        ["index", str(d / "c1.jsonl"), str(d / "c2.jsonl"), "--retriever", "bm25", "--out", str(d / "idx")],
    )
    assert result.exit_code == 0, result.output
    assert f"indexed {len(toy_passages)} passages with bm25" in result.output
    return d


def test_index_and_search_table(built):
    result = runner.invoke(app, ["search", str(built / "idx"), "highest mountain", "-k", "2"])
    assert result.exit_code == 0, result.output
    assert "Mount Everest" in result.output and "rank" in result.output


def test_one_query_with_out_is_written_not_dropped(built):
    out = built / "one.jsonl"
    result = runner.invoke(app, ["search", str(built / "idx"), "highest mountain", "-k", "2", "-o", str(out)])
    assert result.exit_code == 0, result.output
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["query"] == "highest mountain" and record["hits"][0]["title"] == "Mount Everest"


def test_search_queries_file_jsonl(built, toy_passages):
    (built / "q.txt").write_text("capital of Germany\n\nhighest mountain\nthe of and\n")
    result = runner.invoke(app, ["search", str(built / "idx"), "--queries", str(built / "q.txt"), "-k", "3"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [r["query"] for r in lines] == ["capital of Germany", "highest mountain", "the of and"]
    assert lines[0]["hits"][0]["title"] == "Berlin"
    assert set(lines[0]["hits"][0]) == {"id", "title", "score"}
    assert lines[2]["hits"] == []  # zero-score rule


def _questions(built, toy_passages):
    by_title = {p.title: p for p in toy_passages}
    examples = [
        Example("q1", "Which city is the capital of Germany?", ["Berlin"], [by_title["Berlin"].id]),
        Example(
            "q2",
            "Who created the Python programming language?",
            ["Guido van Rossum"],
            [by_title["Python (programming language)"].id],
        ),
        Example(
            "q3",
            "What is the highest mountain?",
            ["Mount Everest"],
            [by_title["Mount Everest"].id, by_title["Paris"].id],
        ),
    ]
    write_examples(built / "q.jsonl", examples)
    return built / "q.jsonl"


def test_search_question_file_out_and_eval(built, toy_passages):
    pytest.importorskip("ragrl.metrics.retrieval")
    qfile = _questions(built, toy_passages)
    result = runner.invoke(
        app,
        [
            "search",
            str(built / "idx"),
            "--queries",
            str(qfile),
            "-k",
            "1",
            "--out",
            str(built / "hits.jsonl"),
            "--eval",
            "--eval-k",
            "1,5",
        ],
    )
    assert result.exit_code == 0, result.output
    recs = [json.loads(line) for line in (built / "hits.jsonl").read_text().splitlines()]
    assert [r["id"] for r in recs] == ["q1", "q2", "q3"] and all(len(r["hits"]) == 1 for r in recs)
    metrics = json.loads(result.stdout[result.stdout.index("{") :])
    assert metrics["n"] == 3 and metrics["k"] == [1, 5]
    assert metrics["recall@1"] == pytest.approx((1 + 1 + 0.5) / 3)
    assert metrics["full_recall@1"] == pytest.approx(2 / 3)
    assert metrics["answer_recall@1"] == pytest.approx(1.0)
    assert metrics["mrr"] == pytest.approx(1.0)


def test_index_dense_max_length_is_recorded(built, tmp_path):
    pytest.importorskip("faiss")
    out = tmp_path / "dense"
    args = ["index", str(built / "c1.jsonl"), "--retriever", "dense", "--max-length", "16", "--device", "cpu",
            "--out", str(out)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "retriever.json").read_text())["params"]["max_length"] == 16


def test_search_cache_record_replay_without_index(built, toy_passages, tmp_path):
    import shutil

    idx = tmp_path / "idx"
    shutil.copytree(built / "idx", idx)
    (tmp_path / "q.txt").write_text("capital of Germany\nhighest mountain\n")
    args = ["search", str(idx), "--queries", str(tmp_path / "q.txt"), "--cache", str(tmp_path / "c.db")]
    rec = runner.invoke(app, [*args, "--cache-mode", "record"])
    assert rec.exit_code == 0, rec.output
    shutil.rmtree(idx)  # replay needs no index
    rep = runner.invoke(app, [*args, "--cache-mode", "replay"])
    assert rep.exit_code == 0, rep.output
    assert rep.stdout == rec.stdout


def test_cli_errors_are_one_line(built, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["search", str(tmp_path / "missing-index"), "q"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "missing-index" in err and "does not exist" in err and "Traceback" not in err
    (tmp_path / "notindex").mkdir()
    with pytest.raises(SystemExit):
        main(["search", str(tmp_path / "notindex"), "q"])
    assert "retriever.json is missing" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["search", str(built / "idx"), "a", "--queries", str(tmp_path / "x")])
    assert "either a QUERY or --queries" in capsys.readouterr().err
    (tmp_path / "q.db").write_text("")
    with pytest.raises(SystemExit):
        main(
            [
                "search",
                str(built / "idx"),
                "never asked",
                "--cache",
                str(tmp_path / "new.db"),
                "--cache-mode",
                "replay",
            ]
        )
    assert "does not exist" in capsys.readouterr().err


def test_cli_replay_miss_names_query(built, tmp_path, capsys):
    db = tmp_path / "c.db"
    assert runner.invoke(app, ["search", str(built / "idx"), "river", "--cache", str(db)]).exit_code == 0
    with pytest.raises(SystemExit):
        main(["search", str(built / "idx"), "never asked", "--cache", str(db), "--cache-mode", "replay"])
    assert "replay miss: query 'never asked'" in capsys.readouterr().err.replace("\n", " ")


def test_dense_and_hybrid_index_from_cli(built, toy_passages):
    pytest.importorskip("faiss")
    dense = built / "dense"
    result = runner.invoke(
        app,
        [
            "index",
            str(built / "c1.jsonl"),
            str(built / "c2.jsonl"),
            "--retriever",
            "dense",
            "--device",
            "cpu",
            "--out",
            str(dense),
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"indexed {len(toy_passages)} passages with dense" in result.output
    hybrid = built / "hybrid"
    result = runner.invoke(
        app,
        ["index", "--retriever", "hybrid", "--components", f"{built / 'idx'},{dense}", "--out", str(hybrid)],
    )
    assert result.exit_code == 0, result.output
    queries = built / "q-dense.txt"  # its own file: under xdist the test writing q.txt may run elsewhere
    queries.write_text("capital of Germany\n\nhighest mountain\nthe of and\n")
    for index_dir in (dense, hybrid):
        result = runner.invoke(app, ["search", str(index_dir), "--queries", str(queries), "-k", "2"])
        assert result.exit_code == 0, result.output
        first = json.loads(result.stdout.splitlines()[0])
        assert first["hits"][0]["title"] == "Berlin"  # "capital of Germany"


def test_index_without_corpus_is_a_clear_error(tmp_path):
    result = runner.invoke(app, ["index", "--out", str(tmp_path / "x")])
    assert result.exit_code != 0
    assert "give at least one CORPUS file" in str(result.exception) + result.output


def test_a_failed_build_leaves_nothing_half_made(built, tmp_path):
    """Bad input found during a build (an empty corpus, an unknown BM25 method) used to leave
    ``OUT/.build/``; now nothing is left, and an index rebuilt in place keeps its old files."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    for args, says in (
        ([str(empty)], "cannot build a BM25 index from an empty corpus"),
        ([str(built / "c1.jsonl"), "--bm25-method", "nope"], "unknown BM25 method 'nope'"),
    ):
        result = runner.invoke(app, ["index", *args, "--out", str(tmp_path / "idx")])
        assert result.exit_code != 0 and says in str(result.exception), result.output
        assert not (tmp_path / "idx").exists()
    again = tmp_path / "again"
    assert runner.invoke(app, ["index", str(built / "c1.jsonl"), "--out", str(again)]).exit_code == 0
    before = sorted(p.name for p in again.iterdir())
    assert runner.invoke(
        app, ["index", str(built / "c1.jsonl"), "--out", str(again), "--bm25-method", "x"]
    ).exit_code
    assert sorted(p.name for p in again.iterdir()) == before and ".build" not in before


def test_a_save_that_fails_part_way_lets_the_same_command_rebuild(built, tmp_path, monkeypatch):
    from ragrl.retrieval.bm25 import BM25Retriever

    out, args = tmp_path / "idx", ["index", str(built / "c1.jsonl"), "--out", str(tmp_path / "idx")]
    real = BM25Retriever.save

    def full_disk(self, path):
        (path / "corpus.jsonl").write_text("half")  # part of the index written, no manifest yet
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(BM25Retriever, "save", full_disk)
    failed = runner.invoke(app, args)
    assert failed.exit_code != 0 and "the save failed; run the command again" in failed.output
    monkeypatch.setattr(BM25Retriever, "save", real)
    result = runner.invoke(app, args)  # not refused as "not an empty directory or a ragrl index"
    assert result.exit_code == 0, result.output
    assert (out / "retriever.json").is_file() and not (out / ".build").exists()


def test_an_option_the_chosen_retriever_does_not_read_is_refused(built, tmp_path):
    corpus, both = str(built / "c1.jsonl"), f"{built / 'idx'},{built / 'idx'}"
    for args, says in (
        (["--device", "cuda", "--model", "x"],
         "not read by a bm25 index: --model (for dense or hybrid), --device (for dense or hybrid)"),
        (["--retriever", "dense", "--k1", "2", "--no-stem"],
         "not read by a dense index: --k1 (for bm25 or hybrid), --stem/--no-stem (for bm25 or hybrid)"),
        (["--rrf-k", "30"], "not read by a bm25 index: --rrf-k (for hybrid)"),
        (["--retriever", "hybrid", "--components", both, "--k1", "2"],
         "not read by a hybrid index of two built --components (they load as they were built): --k1"),
        (["--retriever", "hybrid", "--components", both, "--index-type", "hnsw"],
         "not read by a hybrid index of two built --components (they load as they were built): --index-type"),
        (["--retriever", "hybrid", "--components", both],
         "--components fuses two built indexes: it reads no CORPUS file (leave them out)"),
        (["--retriever", "hybrid", "--recall-check", "3"],
         "--recall-check measures a dense index against exact search: use --retriever dense"),
    ):  # fmt: skip
        result = runner.invoke(app, ["index", corpus, "--out", str(tmp_path / "i"), *args])
        assert result.exit_code != 0 and str(result.exception) == says, result.output
    assert not any(tmp_path.iterdir())
    result = runner.invoke(app, ["index", corpus, "--out", str(tmp_path / "i"), "--k1", "1.2", "--no-stem"])
    assert result.exit_code == 0, result.output  # BM25's own options are read


def test_an_approximate_dense_index_from_the_cli_resumes_a_killed_build_and_reports_recall(
    tmp_path, monkeypatch
):
    pytest.importorskip("faiss")
    from ragrl.retrieval import embeddings

    corpus = tmp_path / "corpus.jsonl"
    assert runner.invoke(app, ["data", "synth-corpus", "-n", "1200", "--out", str(corpus)]).exit_code == 0
    out = tmp_path / "ivf"
    args = ["index", str(corpus), "--retriever", "dense", "--model", "hashing:32", "--out", str(out)]
    args += ["--index-type", "ivf-pq", "--shard-size", "500", "--nprobe", "8"]
    real = embeddings.encode_shards

    def killed_after_two_shards(encode, *a, **kw):
        calls = []

        def dying(texts):
            calls.append(len(texts))
            if len(calls) == 3:
                raise KeyboardInterrupt
            return encode(texts)

        return real(dying, *a, **kw)

    monkeypatch.setattr("ragrl.retrieval.dense.encode_shards", killed_after_two_shards)
    assert runner.invoke(app, args).exit_code != 0
    assert sorted(p.name for p in (out / ".build" / "shards").iterdir())[-1] == "shard-00001.json"
    monkeypatch.setattr("ragrl.retrieval.dense.encode_shards", real)
    result = runner.invoke(app, [*args, "--recall-check", "40"])
    assert result.exit_code == 0, result.output
    assert (
        "kept 2 of 3 encoded shards" in result.output and "indexed 1,200 passages with dense" in result.output
    )
    assert not (out / ".build").exists()  # the build folder goes once the index is saved
    recall = json.loads((out / "recall.json").read_text())
    assert recall["queries"] == 40 and recall["index"] == "IVF16,PQ16x4fsr" and 0 < recall["recall@10"] <= 1
    assert f"recall@10 {recall['recall@10']:.3f}" in result.output
    manifest = json.loads((out / "retriever.json").read_text())
    assert manifest["params"]["nprobe"] == 8 and manifest["num_passages"] == 1200
    searched = runner.invoke(app, ["search", str(out), "Thaesukren harbour", "-k", "2"])
    assert searched.exit_code == 0, searched.output
    # a factory string faiss cannot read is one line and a nonzero exit
    bad = runner.invoke(app, [*args[:7], str(tmp_path / "bad"), "--index-spec", "IVF,PQ"])
    assert bad.exit_code == 1 and str(bad.exception) == (
        "--index-spec 'IVF,PQ': faiss cannot build it (could not parse index string IVF,PQ)"
    )
    # found once the corpus is encoded: the shards stay, named, for a rerun with a spec faiss reads
    assert "encoded shard file(s) kept; a rerun with the same encoder settings resumes" in bad.output
    assert any((tmp_path / "bad" / ".build" / "shards").iterdir())


def test_counts_and_bm25_parameters_out_of_range_are_usage_errors(built, tmp_path, capsys):
    corpus, idx = str(built / "c1.jsonl"), str(built / "idx")
    for args, option in (
        (["index", corpus, "--out", str(tmp_path / "i1"), "--k1", "-1"], "--k1"),
        (["index", corpus, "--out", str(tmp_path / "i2"), "--b", "7"], "--b"),
        (["index", corpus, "--out", str(tmp_path / "i3"), "--retriever", "dense", "--batch-size", "0"],
         "--batch-size"),
        (["search", idx, "--queries", corpus, "--batch-size", "0"], "--batch-size"),
    ):  # fmt: skip
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and f"Invalid value for '{option}'" in result.output, result.output
    assert not any(tmp_path.iterdir())
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n")
    for args, message in (
        (["search", idx, "--queries", str(blank)], f"{blank}: no queries (the file is empty or blank)"),
        (["search", idx, "  "], "QUERY is empty"),
    ):
        result = runner.invoke(app, args)
        assert result.exit_code != 0 and message in str(result.exception), result.output
    blank.unlink()
    # a device this machine does not have is named before a dense build starts
    dense = ["index", corpus, "--retriever", "dense", "--model", "hashing:32", "--out", str(tmp_path / "d")]
    with pytest.raises(SystemExit) as e:
        main([*dense, "--device", "banana"])
    assert e.value.code == 2
    assert "error: device 'banana': not a device name (auto, cpu, cuda, cuda:N)" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before the build began
    assert runner.invoke(app, [*dense, "--device", "cpu"]).exit_code == 0
    result = runner.invoke(app, ["search", str(tmp_path / "d"), "mountain", "--device", "banana"])
    assert result.exit_code != 0 and "device 'banana': not a device name" in str(result.exception)
