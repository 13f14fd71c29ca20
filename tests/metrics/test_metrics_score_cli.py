"""``ragrl score`` end to end."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ragrl.cli import app, main
from ragrl.errors import DataError, RagrlError

GOLD = [
    {
        "id": "q1",
        "question": "Who?",
        "golden_answers": ["Chief of Protocol"],
        "metadata": {
            "supporting_ids": ["p1", "p2"],
            "supporting_facts": [["Kiss and Tell (1945 film)", 0], ["Shirley Temple", 1]],
        },
    },
    {
        "id": "q2",
        "question": "Same country?",
        "golden_answers": ["yes"],
        "metadata": {"supporting_ids": ["p3"], "supporting_facts": [["A", 0]]},
    },
    {"id": "q3", "question": "Where?", "golden_answers": ["U.S.", "United States"]},
    {"id": "q4", "question": "Missing?", "golden_answers": ["nobody"]},
]
PREDS = [
    {
        "id": "q1",
        "prediction": "the chief of protocol",
        "retrieved_ids": ["p9", "p1", "p1", "p2"],
        "supporting_facts": [["Kiss and Tell (1945 film)", 0]],
    },
    {"id": "q2", "prediction": "no", "retrieved_ids": ["p3"], "supporting_facts": [["A", 0]]},
    {"id": "q3", "prediction": "US", "retrieved_ids": ["p5"]},
    {"id": "zz", "prediction": "stray"},
]


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def files(tmp_path):
    return write(tmp_path / "pred.jsonl", PREDS), write(tmp_path / "gold.jsonl", GOLD)


def run(*args):
    result = CliRunner().invoke(app, ["score", *map(str, args)])
    return result


def test_score_end_to_end(files, tmp_path):
    pred, gold = files
    out = tmp_path / "per.jsonl"
    result = run(pred, "--gold", gold, "--per-example", out)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["variant"] == "squad"
    assert summary["n_gold"] == 4 and summary["n_predictions"] == 4 and summary["n_scored"] == 3
    assert summary["missing_predictions"] == {"count": 1, "first_ids": ["q4"]}
    assert summary["unknown_ids"] == {"count": 1, "first_ids": ["zz"]}
    assert summary["em"] == pytest.approx(2 / 3)  # q1 and q3 ("US" == "U.S." under squad)
    assert summary["sp_em"] == 0.5 and summary["joint_em"] == 0.0
    assert summary["n_per_metric"]["sp_em"] == 2 and summary["n_per_metric"]["em"] == 3
    # q3 has no supporting_ids: no id-based retrieval metrics for it, and it is reported
    assert summary["n_without_gold_ids"] == 1
    assert summary["n_per_metric"]["recall@2"] == 2
    assert summary["recall@2"] == pytest.approx((0.5 + 1.0) / 2)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["q1", "q2", "q3"]
    assert rows[1]["f1"] == 0.0 and rows[0]["sp_recall"] == 0.5
    assert rows[0]["precision@2"] == 0.5  # p1 duplicated counts once: top-2 unique = p9, p1


def test_variant_and_metric_selection(files):
    pred, gold = files
    result = run(pred, "--gold", gold, "--variant", "arena", "--metrics", "em,f1,recall@3")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["variant"] == "arena"
    assert {k for k in summary["n_per_metric"]} == {"em", "f1", "recall@3"}
    assert summary["em"] == pytest.approx(1 / 3)  # arena: "US" != "u s"


def test_missing_as_zero_and_bootstrap(files):
    pred, gold = files
    result = run(pred, "--gold", gold, "--metrics", "answer", "--missing-as-zero", "--bootstrap", "200")
    summary = json.loads(result.stdout)
    assert summary["em"] == pytest.approx(2 / 4)
    lo, hi = summary["bootstrap"]["ci95"]["em"]
    assert 0.0 <= lo <= summary["em"] <= hi <= 1.0
    again = json.loads(
        run(pred, "--gold", gold, "--metrics", "answer", "--missing-as-zero", "--bootstrap", "200").stdout
    )
    assert again["bootstrap"] == summary["bootstrap"]  # seeded


def test_unknown_metric_and_variant(files):
    pred, gold = files
    result = run(pred, "--gold", gold, "--metrics", "em,bleu")
    assert isinstance(result.exception, RagrlError)
    assert "bleu" in str(result.exception) and "cover_em" in str(result.exception)
    result = run(pred, "--gold", gold, "--variant", "nope")
    assert isinstance(result.exception, RagrlError) and "tiresrag" in str(result.exception)


@pytest.mark.parametrize(
    "bad, field",
    [
        ('{"id": "q1"}', "prediction"),
        ('{"prediction": "x"}', "id"),
        ('{"id": "q1", "prediction": 3}', "prediction"),
        ('{"id": "q1", "prediction": "x", "retrieved_ids": "p1"}', "retrieved_ids"),
        ('{"id": "q1", "prediction": "x", "supporting_facts": [["A", "0"]]}', "supporting_facts"),
    ],
)
def test_bad_prediction_line(tmp_path, files, bad, field):
    _, gold = files
    pred = tmp_path / "bad.jsonl"
    pred.write_text('{"id": "q2", "prediction": "yes"}\n\n' + bad + "\n")
    result = run(pred, "--gold", gold)
    err = result.exception
    assert isinstance(err, DataError)
    assert (err.path, err.line, err.field) == (str(pred), 3, field)


def test_invalid_json_and_duplicate(tmp_path, files):
    _, gold = files
    pred = write(tmp_path / "p.jsonl", [{"id": "q1", "prediction": "a"}])
    with pred.open("a") as f:
        f.write("{not json\n")
    err = run(pred, "--gold", gold).exception
    assert isinstance(err, DataError) and err.line == 2
    pred = write(tmp_path / "d.jsonl", [{"id": "q1", "prediction": "a"}, {"id": "q1", "prediction": "b"}])
    err = run(pred, "--gold", gold).exception
    assert isinstance(err, DataError) and err.line == 2 and err.field == "id"


def test_main_prints_error_and_exits_2(tmp_path, files, capsys):
    _, gold = files
    pred = tmp_path / "bad.jsonl"
    pred.write_text('{"id": "q1"}\n')
    with pytest.raises(SystemExit) as e:
        main(["score", str(pred), "--gold", str(gold)])
    assert e.value.code == 2
    assert "bad.jsonl:1" in capsys.readouterr().err


def test_bad_gold_supporting_facts_only_matter_when_used(tmp_path):
    gold = write(
        tmp_path / "g.jsonl",
        [{"id": "q1", "question": "Q?", "golden_answers": ["a"], "metadata": {"supporting_facts": "oops"}}],
    )
    ok = write(tmp_path / "p1.jsonl", [{"id": "q1", "prediction": "a"}])
    assert json.loads(run(ok, "--gold", gold).stdout)["em"] == 1.0
    sp = write(tmp_path / "p2.jsonl", [{"id": "q1", "prediction": "a", "supporting_facts": [["A", 0]]}])
    err = run(sp, "--gold", gold).exception
    assert isinstance(err, DataError) and err.field == "metadata.supporting_facts"


def test_retrieved_texts_give_answer_recall(tmp_path, files):
    _, gold = files
    pred = write(
        tmp_path / "p.jsonl",
        [{"id": "q3", "prediction": "x", "retrieved_texts": ["nothing", "born in the U.S."]}],
    )
    summary = json.loads(run(pred, "--gold", gold, "--ks", "1,2").stdout)
    assert summary["answer_recall@1"] == 0.0 and summary["answer_recall@2"] == 1.0
    assert "recall@1" not in summary


def test_nothing_to_score_is_an_error_with_the_reason(tmp_path, files, capsys):
    """No prediction matches a gold id, or the gold file is empty: exit 2, no JSON a script could
    mistake for a score."""
    _, gold = files
    stray = write(
        tmp_path / "stray.jsonl", [{"id": "x1", "prediction": "a"}, {"id": "x2", "prediction": "b"}]
    )
    for args, why in (
        ([stray, "--gold", gold], "none of the 2 predictions in"),
        ([stray, "--gold", gold, "--missing-as-zero"], "none of the 2 predictions in"),
        ([stray, "--gold", write(tmp_path / "empty.jsonl", [])], "holds no questions"),
    ):
        with pytest.raises(SystemExit) as e:
            main(["score", *map(str, args)])
        out = capsys.readouterr()
        assert e.value.code == 2 and why in out.err and out.out == ""
    assert "first prediction ids: x1, x2" in run(stray, "--gold", gold).exception.args[0]


def test_a_metric_asked_for_that_nothing_could_score_is_named(tmp_path, files, capsys):
    """``--metrics`` names a metric the predictions give nothing for: a warning naming what it reads
    beside the metrics that were scored; an error (exit 2, no JSON) when none could be."""
    _, gold = files
    plain = write(tmp_path / "plain.jsonl", [{"id": "q1", "prediction": "chief of protocol"}])
    for metrics, why in (
        ("recall@5", "recall@5: it reads the predictions' retrieved_ids and the gold's supporting passage"),
        ("sp", "sp_em: it reads the predictions' supporting_facts and the gold's supporting facts"),
        ("retrieval", "retrieval: it reads the predictions' retrieved_ids"),
        ("answer_recall@2", "answer_recall@2: it reads the predictions' retrieved_texts"),
    ):
        with pytest.raises(SystemExit) as e:
            main(["score", str(plain), "--gold", str(gold), "--metrics", metrics])
        out = capsys.readouterr()
        assert e.value.code == 2 and out.out == "", out
        assert "no metric --metrics asks for could be scored" in out.err and why in " ".join(out.err.split())
    result = run(plain, "--gold", gold, "--metrics", "em,recall@5")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["em"] == 1.0
    assert "warning: recall@5 was not scored: it reads the predictions' retrieved_ids" in " ".join(
        result.stderr.split()
    )


MIXED = [  # a mixed test file: two datasets, one question without a source
    {"id": "h1", "question": "q", "golden_answers": ["paris"], "metadata": {"source": "hotpotqa", "hops": 2}},
    {"id": "h2", "question": "q", "golden_answers": ["yes"], "metadata": {"source": "hotpotqa", "hops": 10}},
    {
        "id": "h3",
        "question": "q",
        "golden_answers": ["new york"],
        "metadata": {"source": "hotpotqa", "hops": 2},
    },
    {"id": "w1", "question": "q", "golden_answers": ["oslo"], "metadata": {"source": "2wiki", "hops": 4}},
    {"id": "n1", "question": "q", "golden_answers": ["x"]},
]
MIXED_PREDS = [
    {"id": "h1", "prediction": "Paris"},  # em 1
    {"id": "h2", "prediction": "no"},  # em 0
    {"id": "h3", "prediction": "york"},  # em 0, f1 2/3
    {"id": "w1", "prediction": "oslo"},  # em 1
    {"id": "n1", "prediction": "x"},  # em 1
]


def test_by_scores_each_dataset_of_a_mixed_file_apart(tmp_path):
    pred, gold = write(tmp_path / "p.jsonl", MIXED_PREDS), write(tmp_path / "g.jsonl", MIXED)
    result = run(pred, "--gold", gold, "--by", "source", "--metrics", "em,f1")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["em"] == pytest.approx(3 / 5)  # the whole file, as without --by
    assert summary["by"]["key"] == "source"
    groups = summary["by"]["groups"]
    assert list(groups) == ["2wiki", "hotpotqa", "(none)"]  # by name, the questions without one last
    assert groups["hotpotqa"] == {
        "n": 3,
        "em": pytest.approx(1 / 3),
        "f1": pytest.approx((1 + 0 + 2 / 3) / 3),
    }
    assert groups["2wiki"] == {"n": 1, "em": 1.0, "f1": 1.0}
    assert groups["(none)"] == {"n": 1, "em": 1.0, "f1": 1.0}
    # a table on stderr, the whole file last, and a word on the question without a source
    table = result.stderr
    assert "by metadata.source" in table and "0.3333" in table and "0.6000" in table
    assert table.index("hotpotqa") < table.index("(none)") < table.index("all")
    assert "1 scored question without metadata.source: grouped as (none)" in table
    plain = run(pred, "--gold", gold, "--metrics", "em,f1")
    assert "by" not in json.loads(plain.stdout) and "by metadata" not in plain.stderr


def test_by_a_number_orders_numerically_and_bootstraps_each_group_alone(tmp_path):
    from ragrl.metrics.score import bootstrap_ci, score_files

    pred, gold = write(tmp_path / "p.jsonl", MIXED_PREDS), write(tmp_path / "g.jsonl", MIXED)
    result = score_files(pred, gold, metrics="em", by="hops", bootstrap=200, seed=3)
    groups = result.summary["by"]["groups"]
    assert list(groups) == ["2", "4", "10", "(none)"]  # 2 before 10
    from ragrl.data.schema import Example
    from ragrl.metrics.score import _group_order, group_of

    assert sorted(["2", "nan", "10", "1", "inf"], key=_group_order) == ["1", "2", "10", "inf", "nan"]
    assert group_of(Example("x", "q", ["a"], metadata={"hops": 2.0}), "hops") == "2"  # hops 2.0 is hops 2
    assert groups["2"]["n"] == 2 and groups["2"]["em"] == 0.5
    rows_of_2 = [r for r in result.per_example if r["id"] in ("h1", "h3")]
    assert groups["2"]["ci95"] == bootstrap_ci(rows_of_2, ["em"], 200, 3)  # its own rows only
    assert groups["10"]["ci95"] == {"em": [0.0, 0.0]} and groups["4"]["ci95"] == {"em": [1.0, 1.0]}


def test_by_counts_only_what_was_scored_unless_missing_counts_as_zero(tmp_path):
    from ragrl.metrics.score import score_files

    pred = write(tmp_path / "p.jsonl", [p for p in MIXED_PREDS if p["id"] != "h1"])
    gold = write(tmp_path / "g.jsonl", MIXED)
    left_out = score_files(pred, gold, metrics="em", by="source").summary["by"]["groups"]
    assert left_out["hotpotqa"] == {"n": 2, "em": 0.0}
    as_zero = score_files(pred, gold, metrics="em", by="source", missing_as_zero=True).summary["by"]["groups"]
    assert as_zero["hotpotqa"] == {"n": 3, "em": 0.0} and as_zero["2wiki"] == {"n": 1, "em": 1.0}


def test_by_a_key_no_question_has_or_that_names_no_group_is_an_error(tmp_path, capsys):
    pred, gold = write(tmp_path / "p.jsonl", MIXED_PREDS), write(tmp_path / "g.jsonl", MIXED)
    with pytest.raises(SystemExit) as e:
        main(["score", str(pred), "--gold", str(gold), "--by", "level"])
    assert e.value.code == 2
    assert f"{gold}: no question has metadata.level to group by (their metadata keys: hops, source)" in (
        capsys.readouterr().err
    )
    listed = [{**q, "metadata": {"source": ["a", "b"]}} if q["id"] == "w1" else q for q in MIXED]
    with pytest.raises(DataError) as err:
        CliRunner().invoke(app, ["score", str(pred), "--gold", str(write(gold, listed)), "--by", "source"],
                           catch_exceptions=False)  # fmt: skip
    assert err.value.field == "metadata.source" and "'w1'" in str(err.value) and str(gold) in str(err.value)
    with pytest.raises(RagrlError, match="--by: give a metadata key"):
        CliRunner().invoke(
            app, ["score", str(pred), "--gold", str(gold), "--by", " "], catch_exceptions=False
        )
