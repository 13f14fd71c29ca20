"""A small synthetic world with a BM25 index and a tiny policy, shared by the eval tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def world_dir(tmp_path_factory):
    from typer.testing import CliRunner

    from ragrl.cli import app

    d = tmp_path_factory.mktemp("world")
    runner = CliRunner()
    for args in (
        ["data", "synth", "--seed", "3", "--size", "small", "--out", str(d)],
        ["index", str(d / "corpus.jsonl"), "--out", str(d / "bm25")],
        ["model", "tiny", "--data", str(d), "--out", str(d / "model"), "--hidden", "64", "--layers", "2"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    return d
