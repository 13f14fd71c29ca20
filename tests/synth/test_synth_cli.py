"""`ragrl data synth` end to end, and `ragrl data stats` on its files."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from ragrl.cli import app
from ragrl.data.io import read_corpus, read_examples
from ragrl.errors import RagrlError

runner = CliRunner()


def test_synth_writes_every_file_and_stats_reads_them(tmp_path):
    out = tmp_path / "world"
    result = runner.invoke(app, ["data", "synth", "--seed", "0", "--size", "small", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "train: 400 questions" in result.output and "memoriser EM" in result.output
    for name in ("train.jsonl", "dev.jsonl", "test.jsonl", "corpus.jsonl", "world.json", "stats.json"):
        assert (out / name).is_file(), name
    train, _ = read_examples(out / "train.jsonl")
    corpus, report = read_corpus(out / "corpus.jsonl")
    assert len(train) == 400 and not report.warnings
    stats = json.loads((out / "stats.json").read_text())
    world = json.loads((out / "world.json").read_text())
    assert stats["corpus"]["passages"] == len(corpus)
    assert set(world["removed_passage_ids"]).isdisjoint(p.id for p in corpus)
    assert stats["splits"]["test"]["questions"] == 100

    result = runner.invoke(app, ["data", "stats", str(out / "test.jsonl"), "--json"])
    assert result.exit_code == 0, result.output
    described = json.loads(result.stdout)
    assert described["questions"] == 100 and described["source"] == {"synth": 100}
    assert described["answerable"] == {"answerable": 90, "unanswerable": 10}

    again = tmp_path / "again"
    assert runner.invoke(app, ["data", "synth", "--out", str(again)]).exit_code == 0
    assert (again / "test.jsonl").read_bytes() == (out / "test.jsonl").read_bytes()


def test_synth_bad_size_is_a_ragrl_error(tmp_path):
    result = runner.invoke(app, ["data", "synth", "--size", "huge", "--out", str(tmp_path)])
    assert isinstance(result.exception, RagrlError)
    assert "unknown synth size" in str(result.exception)
