"""``ragrl compare``: a paired comparison of two scored runs."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from ragrl.cli import app
from ragrl.errors import DataError, RagrlError
from ragrl.metrics.compare import mcnemar_exact, pair_rows, paired_comparison


def test_mcnemar_is_the_exact_binomial_test_of_the_discordant_pairs():
    # b = 10, c = 2: P(X <= 2) for X ~ Binomial(12, 1/2) is (1 + 12 + 66) / 4096
    assert mcnemar_exact(10, 2) == 2 * 79 / 4096 == mcnemar_exact(2, 10)
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(5, 5) == 1.0  # capped at 1
    assert mcnemar_exact(6, 0) == 2 / 64
    scipy_stats = pytest.importorskip("scipy.stats")
    for b, c in [(10, 2), (7, 3), (30, 18), (1, 0), (40, 41), (12_690, 11_513)]:  # the last: ~50k questions
        assert mcnemar_exact(b, c) == pytest.approx(scipy_stats.binomtest(b, b + c, 0.5).pvalue, rel=1e-9)


def test_the_permutation_p_value_matches_every_sign_flip_enumerated():
    a = [0.0, 1.0, 0.5, 0.25, 0.0, 1.0, 0.0, 0.75]
    b = [1.0, 1.0, 0.75, 0.0, 1.0, 1.0, 1.0, 0.5]
    d = np.array(b) - np.array(a)
    observed = abs(d.mean())
    flips = [abs((np.array(s) * d).mean()) for s in itertools.product((-1, 1), repeat=len(d))]
    exact = sum(f >= observed - 1e-12 for f in flips) / len(flips)  # 256 flips: exactly 20 as extreme
    stats = paired_comparison(a, b, resamples=40_000, seed=1)
    assert stats["delta"] == pytest.approx(d.mean()) and stats["n"] == 8
    assert stats["a"] == pytest.approx(np.mean(a)) and stats["b"] == pytest.approx(np.mean(b))
    assert stats["p_value"] == pytest.approx(exact, abs=0.005)
    lo, hi = stats["ci95"]
    assert lo < stats["delta"] < hi and "mcnemar" not in stats  # not a 0/1 metric


def test_identical_runs_differ_by_nothing_and_a_clear_win_is_significant():
    same = paired_comparison([1, 0, 1, 0, 1], [1, 0, 1, 0, 1], resamples=500)
    assert same["delta"] == 0.0 and same["p_value"] == 1.0 and same["ci95"] == [0.0, 0.0]
    assert same["mcnemar"] == {"b_only": 0, "a_only": 0, "p_value": 1.0}
    win = paired_comparison([0] * 30, [1] * 30, resamples=2_000, seed=0)
    assert win["delta"] == 1.0 and win["p_value"] == 1 / 2_001 and win["ci95"] == [1.0, 1.0]
    assert win["mcnemar"] == {"b_only": 30, "a_only": 0, "p_value": 2 / 2**30}
    with pytest.raises(RagrlError, match="no question is scored by both runs"):
        paired_comparison([], [])
    with pytest.raises(RagrlError, match="paired scores must be finite numbers"):
        paired_comparison([0, 1, float("nan")], [1, 1, 0])  # a NaN would make any delta "significant"


def test_rows_pair_by_id_and_what_is_left_out_is_named():
    a = [{"id": "q1", "em": 1}, {"id": "q2", "em": 0}, {"id": "q3", "em": 1}, {"id": 4, "em": 0}]
    b = [{"id": "4", "em": 1}, {"id": "q1", "em": 1}, {"id": "q3"}, {"id": "q9", "em": 1}]
    xs, ys, left_out = pair_rows(a, b, "em")
    assert (xs, ys) == ([1.0, 0.0], [1.0, 1.0])  # q1 and 4, in A's order
    assert left_out == {"a_only": ["q2"], "b_only": ["q9"], "unscored": ["q3"]}
    with pytest.raises(RagrlError, match=r"B: no row has the metric 'f1' \(numbers there: em\)"):
        pair_rows([{"id": "q1", "f1": 1.0}], b, "f1")  # A has it, B does not


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_compare_from_the_cli(tmp_path):
    rng = np.random.default_rng(0)
    a = [{"id": f"q{i}", "em": float(rng.random() < 0.4), "f1": float(rng.random())} for i in range(60)]
    b = [{**r, "em": 1.0 if i % 3 == 0 else r["em"]} for i, r in enumerate(a)]  # B gets some more right
    (tmp_path / "eval-a").mkdir()
    write(tmp_path / "eval-a" / "per_example.jsonl", a + [{"id": "only-a", "em": 1.0, "f1": 1.0}])
    b_file = write(tmp_path / "b.jsonl", b)
    result = CliRunner().invoke(
        app, ["compare", str(tmp_path / "eval-a"), str(b_file), "--resamples", "3000"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    em = out["metrics"]["em"]
    gained = sum(1 for x, y in zip(a, b, strict=True) if y["em"] > x["em"])
    assert em["n"] == 60 and em["delta"] == pytest.approx(gained / 60)
    assert em["mcnemar"] == {"b_only": gained, "a_only": 0, "p_value": mcnemar_exact(gained, 0)}
    assert em["p_value"] == 1 / 3_001 and em["ci95"][0] > 0  # no sign flip as extreme: the floor
    assert "≤ 3.3e-04" in result.stderr
    assert out["metrics"]["f1"]["delta"] == 0.0 and out["metrics"]["f1"]["p_value"] == 1.0
    assert out["a_only"] == {"count": 1, "first_ids": ["only-a"]} and out["b_only"]["count"] == 0
    assert out["a"] == str(tmp_path / "eval-a" / "per_example.jsonl")
    assert "B − A" in result.stderr and "only-a" in result.stderr
    assert (
        f"1 question of {tmp_path / 'eval-a' / 'per_example.jsonl'} not in {b_file}: left out"
        in result.stderr
    )


def test_compare_refuses_what_it_cannot_pair(tmp_path):
    a = write(tmp_path / "a.jsonl", [{"id": "q1", "em": 1.0}, {"id": "q2", "em": 0.0}])
    dup = write(tmp_path / "dup.jsonl", [{"id": "q1", "em": 1.0}, {"id": "q1", "em": 0.0}])
    other = write(tmp_path / "o.jsonl", [{"id": "x1", "em": 1.0}])
    runner = CliRunner()
    with pytest.raises(DataError) as e:
        runner.invoke(app, ["compare", str(a), str(dup)], catch_exceptions=False)
    assert e.value.line == 2 and e.value.field == "id" and "duplicate id 'q1'" in str(e.value)
    missing = runner.invoke(app, ["compare", str(a), str(a), "-m", "em,recall@5"])
    assert "no row has the metric 'recall@5' (numbers there: em)" in str(missing.exception)
    apart = runner.invoke(app, ["compare", str(a), str(other), "-m", "em"])
    assert "no question is scored on em by both" in str(apart.exception)
    folder = runner.invoke(app, ["compare", str(tmp_path), str(a)])
    assert "holds no per_example.jsonl" in str(folder.exception)


def test_compare_names_what_it_left_out_and_warns_when_the_runs_scored_other_data(tmp_path):
    for name, data, f1 in (("a", "test.jsonl", 0.5), ("b", "dev.jsonl", None)):
        (tmp_path / name).mkdir()
        rows = [{"id": "q1", "em": 1.0, "f1": 1.0}, {"id": "q2", "em": 0.0, **({"f1": f1} if f1 else {})}]
        write(tmp_path / name / "per_example.jsonl", rows)
        scores = {"variant": "squad", "provenance": {"data": data}}
        (tmp_path / name / "scores.json").write_text(json.dumps(scores))
    result = CliRunner().invoke(
        app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--resamples", "50"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert (
        out["metrics"]["f1"]["unscored"] == {"count": 1, "first_ids": ["q2"]}
        and out["metrics"]["f1"]["n"] == 1
    )
    assert out["metrics"]["em"]["unscored"] == {"count": 0, "first_ids": []}
    assert "1 question of both runs left out of f1: one run has no f1 for them (first: q2)" in result.stderr
    assert "A and B scored other question files: test.jsonl and dev.jsonl" in result.stderr  # by path


@pytest.mark.parametrize(
    ("a", "b", "warned"),
    [
        (
            {"data": "runs/test.jsonl", "data_sha256": "ab"},
            {"data": "/abs/test.jsonl", "data_sha256": "ab"},
            False,
        ),
        ({"data": "test.jsonl", "data_sha256": "ab"}, {"data": "test.jsonl", "data_sha256": "cd"}, True),
        ({"data": "test.jsonl", "data_sha256": "ab"}, {"data": "test.jsonl"}, False),  # an older scores.json
        ({"data": "test.jsonl", "data_sha256": "ab"}, {"data": "dev.jsonl"}, True),
    ],
)
def test_compare_tells_question_files_apart_by_content_where_both_runs_recorded_it(tmp_path, a, b, warned):
    for name, provenance in (("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        write(tmp_path / name / "per_example.jsonl", [{"id": "q1", "em": 1.0}, {"id": "q2", "em": 0.0}])
        (tmp_path / name / "scores.json").write_text(
            json.dumps({"variant": "squad", "provenance": provenance})
        )
    result = CliRunner().invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "-m", "em"])
    assert result.exit_code == 0, result.output
    assert ("scored other question files" in result.stderr) is warned
