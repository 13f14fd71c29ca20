"""Fuzzed readers: every file ragrl reads, under arbitrary bytes and structurally broken JSON, gives
records or a one-line ``RagrlError`` naming the file (and the line, for a bad line of a jsonl file);
never a traceback. The default run tries ``FAST_CASES`` cases per reader; ``make reliability`` runs
``SLOW_CASES`` per reader and prints the counts (docs/reliability.md)."""

from __future__ import annotations

import functools
import json
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragrl.data.io import read_corpus, read_examples
from ragrl.data.loaders import load_dataset
from ragrl.errors import DataError, RagrlError
from ragrl.methods import load_method
from ragrl.metrics.score import read_predictions
from ragrl.retrieval.base import load_retriever
from ragrl.retrieval.bm25 import BM25Retriever
from ragrl.rollout.records import read_trajectories
from ragrl.rollout.replay import read_completions
from ragrl.rollout.trajectory import Action, Segment, Trajectory

FAST_CASES = 60
SLOW_CASES = 10_000

QUESTION = {"id": "q1", "question": "Who founded Zorvex?", "golden_answers": ["Ana Lind"], "metadata": {}}
PASSAGE = {"id": "p1", "contents": "Zorvex\nZorvex was founded by Ana Lind."}
PREDICTION = {"id": "q1", "prediction": "Ana Lind"}
COMPLETION = {"id": "q1", "completion": "<search>Zorvex founder</search><answer>Ana Lind</answer>"}
TRAJECTORY = Trajectory(
    example_id="q1",
    prompt_ids=[1, 2, 3],
    segments=[Segment("policy", [4, 5], "<answer>Ana Lind</answer>", [-0.5, -0.1], "stop")],
    actions=[Action("answer", "Ana Lind")],
    final_answer="Ana Lind",
).to_dict()
HOTPOT = {
    "_id": "h1",
    "question": "Who founded Zorvex?",
    "answer": "Ana Lind",
    "type": "bridge",
    "supporting_facts": [["Zorvex", 0]],
    "context": [["Zorvex", ["Zorvex was founded by Ana Lind."]]],
}
CONFIG = "method: search_r1\nrollout:\n  max_turns: 3\n  k: 2\ntrain:\n  steps: 4\n  grpo:\n    kl: k3\n"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def broken_jsonl(draw, valid: dict) -> bytes:
    """A few lines: valid records, records with a key dropped or a value replaced by any JSON value,
    lines cut short, a non-object, stray bytes."""
    lines = []
    for _ in range(draw(st.integers(1, 4))):
        record = dict(valid)
        kind = draw(st.sampled_from(["valid", "drop", "replace", "add", "cut", "other", "bytes"]))
        if kind == "drop" and record:
            record.pop(draw(st.sampled_from(sorted(record))))
        elif kind == "replace" and record:
            record[draw(st.sampled_from(sorted(record)))] = draw(json_values)
        elif kind == "add":
            record[draw(st.text(max_size=8))] = draw(json_values)
        line = json.dumps(record).encode()
        if kind == "cut":
            line = line[: draw(st.integers(0, max(len(line) - 1, 0)))]
        elif kind == "other":
            line = json.dumps(draw(json_values)).encode()
        elif kind == "bytes":
            line = draw(st.binary(max_size=40))
        lines.append(line)
    return b"\n".join(lines) + draw(st.sampled_from([b"", b"\n", b"\r\n"]))


@st.composite
def broken_json_document(draw, valid: dict) -> bytes:
    """A JSON array of records (a dataset file), with the same kinds of damage."""
    records = []
    for _ in range(draw(st.integers(0, 3))):
        record = dict(valid)
        kind = draw(st.sampled_from(["valid", "drop", "replace", "other"]))
        if kind == "drop":
            record.pop(draw(st.sampled_from(sorted(record))))
        elif kind == "replace":
            record[draw(st.sampled_from(sorted(record)))] = draw(json_values)
        records.append(draw(json_values) if kind == "other" else record)
    text = json.dumps(records).encode()
    if draw(st.booleans()):
        text = text[: draw(st.integers(0, len(text)))]
    return text


@st.composite
def broken_yaml(draw) -> bytes:
    lines = CONFIG.splitlines()
    kind = draw(st.sampled_from(["cut", "replace", "indent", "text"]))
    if kind == "cut":
        return CONFIG.encode()[: draw(st.integers(0, len(CONFIG)))]
    if kind == "replace":
        i = draw(st.integers(0, len(lines) - 1))
        key = lines[i].split(":")[0]
        lines[i] = f"{key}: {json.dumps(draw(json_values))}"
    elif kind == "indent":
        i = draw(st.integers(0, len(lines) - 1))
        lines[i] = " " * draw(st.integers(0, 5)) + lines[i].strip()
    else:
        return draw(st.text(max_size=80)).encode()
    return "\n".join(lines).encode()


def cases(valid_bytes: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.binary(max_size=300), valid_bytes)


class Reader:
    """One reader under test: its file name, the damaged contents to try, and how to read a file."""

    def __init__(self, name: str, filename: str, strategy: st.SearchStrategy, read, line_based: bool) -> None:
        self.name, self.filename, self.strategy, self.read, self.line_based = (
            name, filename, strategy, read, line_based,
        )  # fmt: skip


@functools.cache
def _search_protocol():
    return load_method("search_r1").protocol


def _read_index(path: Path) -> None:
    load_retriever(path.parent)


READERS = {
    "questions": Reader("questions", "q.jsonl", cases(broken_jsonl(QUESTION)), read_examples, True),
    "corpus": Reader("corpus", "corpus.jsonl", cases(broken_jsonl(PASSAGE)), read_corpus, True),
    "predictions": Reader("predictions", "p.jsonl", cases(broken_jsonl(PREDICTION)), read_predictions, True),
    "trajectories": Reader(
        "trajectories", "t.jsonl", cases(broken_jsonl(TRAJECTORY)), read_trajectories, True
    ),
    "completions": Reader(
        "completions",
        "c.jsonl",
        cases(broken_jsonl(COMPLETION)),
        lambda p: read_completions(p, _search_protocol()),
        True,
    ),  # fmt: skip
    "datasets": Reader(
        "datasets",
        "hotpot.json",
        cases(broken_json_document(HOTPOT)),
        lambda p: load_dataset(p, "auto"),
        False,
    ),
    "configs": Reader("configs", "c.yaml", cases(broken_yaml()), load_method, False),
    "index manifests": Reader(
        "index manifests", "manifest.json", cases(broken_jsonl({})), _read_index, False
    ),
}


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    """A real BM25 index whose manifest each case overwrites."""
    from ragrl.data.schema import Passage

    d = tmp_path_factory.mktemp("index") / "idx"
    BM25Retriever.build([Passage.make("Zorvex", "Zorvex was founded by Ana Lind.")]).save(d)
    return d


def check(reader: Reader, path: Path, data: bytes) -> None:
    """Read ``data`` from ``path``: records, or a RagrlError naming the file (and a line for a bad line)."""
    path.write_bytes(data)
    try:
        reader.read(path)
    except RagrlError as e:
        message = str(e)
        assert path.name in message or str(path.parent) in message, message
        assert "\n" not in message.strip(), message
        if reader.line_based and isinstance(e, DataError) and e.line is not None:
            assert re.search(rf"{re.escape(path.name)}:{e.line}\b", message), message


def _target(reader: Reader, tmp_path: Path, index_dir: Path) -> Path:
    if reader.name == "index manifests":
        d = tmp_path / "idx"
        if not d.exists():
            shutil.copytree(index_dir, d)
        return d / "manifest.json"
    return tmp_path / reader.filename


def run_cases(reader: Reader, target: Path, n: int) -> int:
    """Run ``n`` hypothesis cases of ``reader``; returns how many ran."""
    count = 0

    @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=reader.strategy)
    def run(data: bytes) -> None:
        nonlocal count
        count += 1
        check(reader, target, data)

    run()
    return count


@pytest.mark.parametrize("name", list(READERS))
def test_fuzzed_reader_gives_records_or_a_clear_error(name, tmp_path, index_dir):
    reader = READERS[name]
    assert run_cases(reader, _target(reader, tmp_path, index_dir), FAST_CASES) >= FAST_CASES


@pytest.mark.slow
@pytest.mark.parametrize("name", list(READERS))
def test_fuzzed_reader_10k_cases(name, tmp_path, index_dir):
    reader = READERS[name]
    count = run_cases(reader, _target(reader, tmp_path, index_dir), SLOW_CASES)
    print(f"\nfuzz {name}: {count} cases, 0 tracebacks")
    assert count >= SLOW_CASES
