"""Input that is not UTF-8 text (latin-1, random bytes, a .gz file) is a one-line error naming the file
(and the line), in every reader and command, never a UnicodeDecodeError traceback."""

from __future__ import annotations

import gzip
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragrl.cli import main
from ragrl.data.io import iter_jsonl, read_corpus, read_examples, read_text
from ragrl.errors import DataError, RagrlError

GOOD = {"id": "q1", "question": "Où est né Zorvex?", "golden_answers": ["Lagos"]}


def _files(tmp_path):
    latin = tmp_path / "latin1.jsonl"
    latin.write_bytes(
        json.dumps(GOOD).encode() + b"\n" + '{"id": "q2", "question": "Caf\xe9?"}\n'.encode("latin-1")
    )
    binary = tmp_path / "random.jsonl"
    binary.write_bytes(bytes(range(128, 256)) * 4)
    packed = tmp_path / "questions.jsonl.gz"
    packed.write_bytes(gzip.compress((json.dumps(GOOD) + "\n").encode()))
    return latin, binary, packed


def test_readers_name_the_file_and_the_line_of_the_first_bad_byte(tmp_path):
    latin, binary, packed = _files(tmp_path)
    with pytest.raises(DataError, match=r"latin1.jsonl:2: not UTF-8 text \(byte 0xe9 at column 30\)"):
        read_examples(latin)
    with pytest.raises(DataError, match=r"latin1.jsonl:2: not UTF-8 text"):
        read_text(latin)
    assert [n for n, r in iter_jsonl(latin, on_error="yield") if isinstance(r, DataError)] == [2]
    with pytest.raises(DataError, match=r"random.jsonl:1: not UTF-8 text"):
        read_corpus(binary)
    for reader in (read_examples, read_corpus, read_text):
        with pytest.raises(
            DataError, match=r"questions.jsonl.gz: a gzip-compressed file: decompress it first"
        ):
            reader(packed)


@pytest.mark.parametrize(
    "args",
    [
        ["data", "stats", "{f}"],
        ["data", "convert", "{f}", "--out", "{tmp}/out"],
        ["score", "{f}", "--gold", "{f}"],
        ["reward", "search_r1", "--completions", "{f}", "--gold", "{f}"],
        ["index", "{f}", "--out", "{tmp}/idx"],
        ["train", "{f}"],
    ],
)
def test_commands_exit_2_with_one_line(tmp_path, capsys, args):
    latin, binary, packed = _files(tmp_path)
    config = tmp_path / "bad.yaml"
    config.write_bytes("method: search_r1\nnote: caf\xe9\n".encode("latin-1"))
    for f in (latin, binary, packed):
        target = config if args[0] == "train" else f
        argv = [a.format(f=target, tmp=tmp_path) for a in args]
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err and "UnicodeDecodeError" not in err
        assert str(target.name) in err and len(err.strip().splitlines()) <= 3, err


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=400))
def test_any_bytes_give_records_or_a_clear_error(tmp_path, data):
    """Fuzzed bytes: the question and corpus readers return records or raise a RagrlError, nothing else."""
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(data)
    for reader in (read_examples, read_corpus):
        try:
            reader(path)
        except RagrlError:
            pass


def test_search_queries_file_in_latin1(tmp_path, capsys):
    from ragrl.data.schema import Passage
    from ragrl.retrieval.bm25 import BM25Retriever

    BM25Retriever.build([Passage.make("Paris", "Paris is in France.")]).save(tmp_path / "bm25")
    latin = tmp_path / "queries.txt"
    latin.write_bytes("where is Paris\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(SystemExit) as e:
        main(["search", str(tmp_path / "bm25"), "--queries", str(latin)])
    assert e.value.code == 2 and "queries.txt:2: not UTF-8 text" in capsys.readouterr().err


def test_columns_count_characters_and_a_bom_is_allowed(tmp_path):
    accented = tmp_path / "accents.jsonl"
    accented.write_bytes("éé".encode() + b"\xff\n")  # two 2-byte characters, then the bad byte
    with pytest.raises(DataError, match=r"accents.jsonl:1: not UTF-8 text \(byte 0xff at column 3\)"):
        read_text(accented)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbfab\ncd\xffx\n")
    with pytest.raises(DataError, match=r"bom.jsonl:2: not UTF-8 text \(byte 0xff at column 3\)"):
        read_text(bom, encoding="utf-8-sig")
    bom.write_bytes(b'\xef\xbb\xbf{"a": 1}\n{"a": 2}\n')  # what some editors save
    assert [r for _, r in iter_jsonl(bom)] == [{"a": 1}, {"a": 2}]


def test_a_damaged_index_and_an_empty_model_folder_are_one_line_errors(tmp_path, capsys):
    from ragrl.data.schema import Passage
    from ragrl.retrieval.base import load_retriever
    from ragrl.retrieval.bm25 import BM25Retriever

    index = tmp_path / "bm25"
    BM25Retriever.build([Passage.make("Paris", "Paris is in France."), Passage.make("Rome", "Rome.")]).save(
        index
    )
    npy = sorted(index.rglob("*.npy"))[0]
    npy.write_bytes(npy.read_bytes()[:20])  # cut short, as a full disk or a killed copy leaves it
    with pytest.raises(RagrlError, match=r"bm25: the bm25s index files are damaged .*rebuild it"):
        load_retriever(index)
    with pytest.raises(SystemExit) as e:
        main(["search", str(index), "Paris"])
    assert e.value.code == 2 and "damaged" in capsys.readouterr().err
    empty = tmp_path / "model"
    empty.mkdir()
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps(GOOD) + "\n", encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        main(["eval", "--model", str(empty), "--data", str(questions), "--index", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err and ("model" in err or "nope" in err)
    from ragrl.llm.hf_backend import TransformersBackend

    with pytest.raises(RagrlError, match="model: not a model folder transformers can load"):
        TransformersBackend(empty)


def test_lone_cr_line_endings_read_like_any_other(tmp_path):
    records = [GOOD, {**GOOD, "id": "q2"}, {**GOOD, "id": "q3"}]
    for ending in ("\n", "\r\n", "\r"):
        path = tmp_path / "q.jsonl"
        path.write_bytes(ending.join(json.dumps(r) for r in records).encode() + ending.encode())
        examples, _ = read_examples(path)
        assert [ex.id for ex in examples] == ["q1", "q2", "q3"], repr(ending)
    path.write_bytes(b'{"id": "q1"}\r{oops\r')
    with pytest.raises(DataError, match=r"q.jsonl:2: invalid JSON"):
        list(iter_jsonl(path))


def test_a_file_of_only_bad_records_names_the_first_one(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text("{bad\n{worse\n")
    with pytest.raises(SystemExit) as e:
        main(["data", "stats", str(path)])
    assert e.value.code == 2
    assert f"{path}:1: invalid JSON (Expecting property name" in capsys.readouterr().err
