"""Shared test fixtures.

Real dataset samples live in ``../shared/data`` beside the repository (see its SOURCES.md). Tests
that read them use the ``shared_data`` fixture, which skips cleanly when the folder is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# No per-example deadline (a loaded CI machine must not turn slow examples into failures); in CI
# (CI=true) the examples are derandomized so a run is reproducible.
settings.register_profile("dev", deadline=None)
settings.register_profile("ci", deadline=None, derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("RAGRL_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared dataset samples not found at {SHARED_DATA}")
    return SHARED_DATA


# A small synthetic world with a BM25 index and a tiny policy (hidden 64, 2 layers), shared by the
# eval and train tests.
@pytest.fixture(scope="session")
def world_dir(tmp_path_factory):
    from typer.testing import CliRunner

    from ragrl.cli import app

    d = tmp_path_factory.mktemp("world")
    runner = CliRunner()
    for args in (
        ["data", "synth", "--seed", "3", "--size", "small", "--split", "entities", "--out", str(d)],
        ["index", str(d / "corpus.jsonl"), "--out", str(d / "bm25")],
        ["model", "tiny", "--data", str(d), "--out", str(d / "model"), "--hidden", "64", "--layers", "2"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    return d
