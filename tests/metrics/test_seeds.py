"""Mean ± standard deviation over runs (``ragrl aggregate``, ``ragrl.metrics.seeds``)."""

from __future__ import annotations

import json
import statistics

import pytest
from typer.testing import CliRunner

from ragrl.cli import app
from ragrl.errors import RagrlError
from ragrl.metrics.seeds import aggregate_runs

RUNS = [
    {"em": 0.30, "f1": 0.40, "variant": "squad", "held_out": {"after": {"em": 0.2}}, "ok": True},
    {"em": 0.20, "f1": 0.35, "variant": "squad", "held_out": {"after": {"em": 0.3}}, "ok": True},
    {"em": 0.10, "variant": "squad", "held_out": {"after": {"em": 0.1}}, "ok": False},
]


def test_every_number_gets_its_mean_and_sample_std_over_the_runs_that_have_it():
    out = aggregate_runs(RUNS)
    em = out["metrics"]["em"]
    # 0.3, 0.2, 0.1: mean 0.2, sample std sqrt(((0.1)^2 + 0 + (0.1)^2) / 2) = 0.1
    assert em["mean"] == pytest.approx(0.2) and em["std"] == pytest.approx(0.1) and em["n"] == 3
    assert em["values"] == [0.3, 0.2, 0.1]
    f1 = out["metrics"]["f1"]  # missing in one run: averaged over the two that have it, not as a zero
    assert (
        f1["n"] == 2
        and f1["mean"] == pytest.approx(0.375)
        and f1["std"] == pytest.approx(statistics.stdev([0.4, 0.35]))
    )
    assert out["metrics"]["held_out/after/em"]["mean"] == pytest.approx(0.2)
    assert out["partial"] == ["f1"] and out["not_numbers"] == ["ok", "variant"] and out["runs"] == 3
    assert aggregate_runs(RUNS[:1])["metrics"]["em"]["std"] is None  # one run has no spread


def test_the_cli_prints_a_table_and_json_and_names_bad_files(tmp_path):
    paths = []
    for i, run in enumerate(RUNS):
        paths.append(tmp_path / f"seed-{i}.json")
        paths[-1].write_text(json.dumps(run))
    result = CliRunner().invoke(app, ["aggregate", *map(str, paths), "--only", "em,f1"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert list(out["metrics"]) == ["em", "f1"] and out["metrics"]["em"]["std"] == pytest.approx(0.1)
    assert "0.2000" in result.stderr and "0.1000" in result.stderr
    assert "f1 is in 2 of the 3 runs only" in result.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    result = CliRunner().invoke(app, ["aggregate", str(paths[0]), str(bad)])
    assert result.exit_code != 0 and isinstance(result.exception, RagrlError)
    assert str(result.exception) == f"{bad}: expected a JSON object, got list"
    result = CliRunner().invoke(app, ["aggregate", str(paths[0]), "--only", "accuracy"])
    assert "--only: accuracy is not a number in any run" in str(result.exception)
