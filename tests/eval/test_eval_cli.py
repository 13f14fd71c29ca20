import json

import pytest
from typer.testing import CliRunner

from ragrl.cli import app
from ragrl.data.io import read_examples
from ragrl.methods import load_method
from ragrl.rollout.outcomes import OUTCOMES
from ragrl.rollout.records import read_trajectories

runner = CliRunner()


def _eval(world_dir, out, *extra, index=None):
    args = [
        "eval",
        "--model",
        str(world_dir / "model"),
        "--data",
        str(world_dir / "test.jsonl"),
        "--index",
        index or str(world_dir / "bm25"),
        "--out",
        str(out),
        *extra,
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "evaluating " in result.stderr and "rolled out " in result.stderr  # never silent for long
    return json.loads((out / "scores.json").read_text())


def test_oracle_demonstrator_scores_as_expected(world_dir, tmp_path):
    scores = _eval(world_dir, tmp_path / "oracle", "--demonstrator", "oracle", "--n", "40")
    examples, _ = read_examples(world_dir / "test.jsonl")
    examples = examples[:40]
    decomposition_steps = sum(len(ex.decomposition) for ex in examples) / len(examples)
    # the oracle answers every question right (``unknown`` for unanswerable ones), one search per
    # gold sub-question, and its searches find every passage that is still in the corpus
    assert scores["em"] == 1.0 and scores["answer_rate"] == 1.0
    assert scores["searches_per_question"] == pytest.approx(decomposition_steps)
    assert scores["repeated_searches_per_question"] == 0.0  # each sub-question asked once
    answerable = sum(ex.metadata["answerable"] for ex in examples) / len(examples)
    assert scores["full_recall@10"] == pytest.approx(answerable)
    assert scores["reward/em"] == 1.0 and scores["reward/search_r1_format"] == 1.0
    assert scores["n_scored"] == 40 and scores["finish_reasons"] == {"answer": 40}
    preds = [
        json.loads(line) for line in (tmp_path / "oracle" / "predictions.jsonl").read_text().splitlines()
    ]
    assert [p["id"] for p in preds] == [ex.id for ex in examples]
    trajs = read_trajectories(tmp_path / "oracle" / "trajectories.jsonl")
    assert all(t.final_answer is not None and t.num_searches >= 1 for t in trajs)
    # the resolved config, every default filled in, as a training run folder's: it loads back as the same
    saved = (tmp_path / "oracle" / "config.yaml").read_text()
    method = load_method(str(tmp_path / "oracle" / "config.yaml"))
    assert method.name == "search_r1" and method.resolved_yaml() == saved
    assert "long_questions:" in saved and "max_question_chars:" in saved  # defaults the file does not set
    (env,) = json.loads((tmp_path / "oracle" / "environment.json").read_text())  # where the scores came from
    assert env["step"] == 0 and env["versions"]["torch"]
    assert any(p.startswith("torch==") for p in env["packages"])


def test_an_earlier_evaluation_is_replaced_only_with_force(world_dir, tmp_path):
    out = tmp_path / "e"
    assert _eval(world_dir, out, "--demonstrator", "oracle", "--n", "4")["n_scored"] == 4
    (out / "shots.jsonl").write_text("{}\n")  # as a few-shot evaluation leaves: must not outlive the next
    (out / "notes.txt").write_text("mine\n")  # not an evaluation's file: kept
    args = ["eval", "--model", str(world_dir / "model"), "--data", str(world_dir / "test.jsonl")]
    again = runner.invoke(
        app, [*args, "--index", str(world_dir / "bm25"), "--out", str(out), "--demonstrator", "oracle"]
    )
    assert again.exit_code != 0 and str(again.exception).startswith(
        f"{out}: holds an earlier evaluation (scores.json, predictions.jsonl, per_example.jsonl, "
        "trajectories.jsonl, shots.jsonl, config.yaml, environment.json); pass --force"
    )
    assert _eval(world_dir, out, "--demonstrator", "oracle", "--n", "3", "--force")["n_scored"] == 3
    assert not (out / "shots.jsonl").exists() and (out / "notes.txt").read_text() == "mine\n"
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 3
    (out / "metrics.jsonl").write_text("")  # a training run's folder: its config and environment are its own
    run = runner.invoke(app, [*args, "--index", str(world_dir / "bm25"), "--out", str(out), "--force"])
    assert run.exit_code != 0 and "a training run's folder (metrics.jsonl); choose another --out" in str(
        run.exception
    )


def test_heuristic_is_weaker_than_oracle_and_untrained_model_runs(world_dir, tmp_path):
    heuristic = _eval(world_dir, tmp_path / "heuristic", "--demonstrator", "heuristic", "--n", "40")
    assert 0.05 <= heuristic["em"] <= 0.6
    assert heuristic["searches_per_question"] == 1.0
    untrained = _eval(
        world_dir,
        tmp_path / "untrained",
        "--n",
        "4",
        "--set",
        "rollout.max_new_tokens=24",
        "--set",
        "rollout.max_turns=2",
    )
    assert untrained["n_scored"] == 4 and untrained["method"] == "search_r1"
    assert untrained["prompt_unk_rate"] == 0.0  # the tiny tokenizer was built from this world
    assert untrained["policy_tokens_mean"] <= 48
    assert untrained["provenance"]["index_fingerprint"]
    trajs = read_trajectories(tmp_path / "untrained" / "trajectories.jsonl")
    for t in trajs:  # a real model's trajectory: policy tokens with log-probs, mask aligned
        assert len(t.loss_mask) == len(t.completion_ids) == len(t.completion_logprobs)
        assert all(lp <= 0 for s in t.segments if s.kind == "policy" for lp in s.logprobs)


def test_reward_rescoring_of_completions_and_trajectories(world_dir, tmp_path):
    _eval(world_dir, tmp_path / "oracle", "--demonstrator", "oracle", "--n", "6")
    trajs = read_trajectories(tmp_path / "oracle" / "trajectories.jsonl")
    completions = tmp_path / "completions.jsonl"
    lines = [json.dumps({"id": t.example_id, "completion": t.completion_text}) for t in trajs]
    lines.append(json.dumps({"id": trajs[0].example_id, "completion": "<answer> surely wrong </answer>"}))
    completions.write_text("\n".join(lines) + "\n")
    result = runner.invoke(
        app,
        [
            "reward",
            "search_r1",
            "--completions",
            str(completions),
            "--gold",
            str(world_dir / "test.jsonl"),
            "--set",
            "reward.1.weight=0.5",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    per_example, summary = rows[:-1], rows[-1]
    assert [r["em"] for r in per_example] == [1.0] * 6 + [0.0]
    assert [r["search_r1_format"] for r in per_example] == [1.0] * 7
    assert per_example[0]["total"] == 1.5 and per_example[-1]["total"] == 0.5
    assert summary["n"] == 7 and summary["mean"]["em"] == pytest.approx(6 / 7)
    # saved trajectories score the same as their text
    result = runner.invoke(
        app,
        [
            "reward",
            "search_r1",
            "--completions",
            str(tmp_path / "oracle" / "trajectories.jsonl"),
            "--gold",
            str(world_dir / "test.jsonl"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.splitlines()[-1])["mean"]["em"] == 1.0


def test_bad_inputs_are_clear_errors(world_dir, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x"}\n')
    result = runner.invoke(
        app, ["reward", "search_r1", "--completions", str(bad), "--gold", str(world_dir / "test.jsonl")]
    )
    assert result.exit_code != 0 and "field 'completion': missing" in str(result.exception)
    result = runner.invoke(
        app,
        [
            "eval",
            "--model",
            str(world_dir / "model"),
            "--data",
            str(world_dir / "test.jsonl"),
            "--index",
            str(world_dir / "bm25"),
            "--method",
            "nonexistent",
        ],
    )
    assert result.exit_code != 0 and "unknown method 'nonexistent'" in str(result.exception)
    base = ["eval", "--model", str(world_dir / "model"), "--data", str(world_dir / "test.jsonl"),
            "--index", str(world_dir / "bm25"), "--out", str(tmp_path / "never")]  # fmt: skip
    for extra, message in (
        (["--world", "w.json"], "--world w.json: only the heuristic demonstrator reads a world"),
        (["--batch-size", "0"], "Invalid value for '--batch-size'"),
        (["--bootstrap", "-5"], "Invalid value for '--bootstrap'"),
        (["--device", "banana"], "device 'banana': not a device name"),
        (["--set", "reward.0.weight=abc"], "reward[0] (em): weight must be a number, got 'abc'"),
    ):
        result = runner.invoke(app, [*base, *extra])
        assert result.exit_code != 0, extra
        assert message in " ".join((result.output + str(result.exception)).split()), (extra, result.output)
    assert not (tmp_path / "never").exists()


def test_closed_book_searches_find_nothing(world_dir, tmp_path):
    out = tmp_path / "closed"
    args = ["eval", "--model", str(world_dir / "model"), "--data", str(world_dir / "test.jsonl")]
    args += ["--out", str(out), "--closed-book", "--demonstrator", "oracle", "--n", "10"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    scores = json.loads((out / "scores.json").read_text())
    # the oracle still searches every sub-question (and reads its answers from gold fields), but no
    # search retrieves anything
    assert scores["searches_per_question"] >= 2 and scores["full_recall@10"] == 0.0
    assert scores["provenance"]["closed_book"] is True and scores["provenance"]["index"] is None
    for t in read_trajectories(out / "trajectories.jsonl"):
        observations = [s.text for s in t.segments if s.kind == "env"]
        assert observations and all("No passages found." in o for o in observations)
    both = runner.invoke(
        app, [*args[:5], "--closed-book", "--index", str(world_dir / "bm25"), "--out", str(tmp_path / "both")]
    )
    assert both.exit_code != 0 and "leave out --index" in str(both.exception)


def test_null_retriever():
    from ragrl.errors import RagrlError
    from ragrl.retrieval.null import NullRetriever

    r = NullRetriever()
    assert r.search(["a", "b"], k=3) == [[], []] and r.fingerprint == "closed-book"
    with pytest.raises(RagrlError, match="bad k|positive integer"):
        r.search(["a"], k=0)
    with pytest.raises(RagrlError, match="no index to save"):
        r.save("somewhere")


def test_reward_prints_one_line_per_step_with_per_step_components(world_dir, tmp_path):
    from ragrl.rewards import register_reward, reward_names

    if "test_cli_per_step" not in reward_names():

        @register_reward("test_cli_per_step", per_step=True)
        def per_step(trajectory, example, ctx):  # noqa: ANN001, ANN202
            return [1.0 if a.kind == "search" else 0.0 for a in trajectory.actions]

    _eval(world_dir, tmp_path / "oracle", "--demonstrator", "oracle", "--n", "2")
    spec = (
        "reward=[{name: test_cli_per_step, step_weight: {early: 2.0, late: 1.0, horizon: 4}}, "
        "{name: em, weight: 0.5}]"
    )
    result = runner.invoke(
        app,
        ["reward", "search_r1", "--completions", str(tmp_path / "oracle" / "trajectories.jsonl"),
         "--gold", str(world_dir / "test.jsonl"), "--set", spec],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    first = rows[0]["id"]
    steps = [r for r in rows if r.get("id") == first and "t" in r]
    (episode,) = [r for r in rows if r.get("id") == first and "return" in r]
    trajs = read_trajectories(tmp_path / "oracle" / "trajectories.jsonl")
    actions = next(t for t in trajs if t.example_id == first).actions
    assert [r["t"] for r in steps] == list(range(len(actions)))
    assert [r["test_cli_per_step"] for r in steps] == [1.0 if a.kind == "search" else 0.0 for a in actions]
    assert steps[0]["weights"]["test_cli_per_step"] == 2.0 and steps[-1]["weights"]["em"] == 0.5
    assert episode["return"] == pytest.approx(sum(r["R_t"] for r in steps)) and episode["em"] == 1.0


def test_a_megabyte_question_is_cut_and_reported(world_dir, tmp_path):
    lines = (world_dir / "test.jsonl").read_text().splitlines()[:3]
    record = json.loads(lines[1])
    record["question"] = "Who? " + "x " * 500_000  # 1 MB
    data = tmp_path / "long.jsonl"
    data.write_text("\n".join([lines[0], json.dumps(record), lines[2]]) + "\n")
    base = [
        "eval",
        "--model",
        str(world_dir / "model"),
        "--data",
        str(data),
        "--index",
        str(world_dir / "bm25"),
    ]
    result = runner.invoke(app, [*base, "--out", str(tmp_path / "e")])
    assert result.exit_code == 0, result.output
    assert f"{data}: cut 1 question(s) to rollout.max_question_chars=2,000 characters" in result.stderr
    scores = json.loads((tmp_path / "e" / "scores.json").read_text())
    # every question scored, the long one cut (a wall-time bound here failed on a slow machine: 41.9 s
    # against 30; timings belong in benchmarks/)
    assert scores["questions_cut"] == 1 and scores["n_scored"] == 3

    refused = runner.invoke(
        app, [*base, "--out", str(tmp_path / "r"), "--set", "rollout.long_questions=reject"]
    )
    assert refused.exit_code != 0
    assert f"{data}: question '{record['id']}' has 1,000,005 characters" in str(refused.exception)


def test_few_shot_puts_oracle_replies_to_other_questions_in_front(world_dir, tmp_path):
    from ragrl.llm.hf_backend import load_tokenizer

    out = tmp_path / "few"
    scores = _eval(world_dir, out, "--n", "3", "--few-shot", str(world_dir / "dev.jsonl"), "--shots", "1")
    shots = read_trajectories(out / "shots.jsonl")
    assert len(shots) == 1 and shots[0].finish_reason == "answer" and shots[0].num_searches >= 1
    evaluated = {t.example_id for t in read_trajectories(out / "trajectories.jsonl")}
    assert scores["provenance"]["few_shot"]["ids"] == [shots[0].example_id] and not evaluated & {
        shots[0].example_id
    }
    tokenizer = load_tokenizer(world_dir / "model")
    shot_question = {e.id: e.question for e in read_examples(world_dir / "dev.jsonl")[0]}[shots[0].example_id]
    for t in read_trajectories(out / "trajectories.jsonl"):
        prompt = tokenizer.decode(t.prompt_ids)
        # the shot's question, and the passages its searches found, come before the question
        assert shot_question in prompt and prompt.count("(Title: ") == len(shots[0].retrieved_ids) > 0

    base = ["eval", "--model", str(world_dir / "model"), "--data", str(world_dir / "test.jsonl")]
    base += ["--index", str(world_dir / "bm25"), "--out", str(tmp_path / "refused")]
    result = runner.invoke(app, [*base, "--few-shot", str(world_dir / "test.jsonl")])
    assert result.exit_code != 0 and "not evaluated" in str(result.exception)
    result = runner.invoke(app, [*base, "--shots", "3"])
    assert result.exit_code != 0 and "pass --few-shot FILE too" in str(result.exception)
    result = runner.invoke(
        app, [*base, "--few-shot", str(world_dir / "dev.jsonl"), "--demonstrator", "oracle"]
    )
    assert result.exit_code != 0 and "cannot be combined" in str(result.exception)


def test_eval_reports_the_outcome_of_every_question(world_dir, tmp_path):
    out = tmp_path / "heuristic"
    scores = _eval(world_dir, out, "--demonstrator", "heuristic", "--n", "40")
    rows = [json.loads(line) for line in (out / "per_example.jsonl").read_text().splitlines()]
    examples = {ex.id: ex for ex in read_examples(world_dir / "test.jsonl")[0]}
    assert sum(scores["outcomes"].values()) == 40 == len(rows)
    assert scores["outcomes"]["right"] == round(40 * scores["em"])
    unanswerable = sum(not examples[r["id"]].answerable for r in rows if r["em"] == 0.0)
    assert unanswerable > 0 and scores["outcomes"]["wrong_unanswerable"] == unanswerable
    # the heuristic answers every question after one search: none of its misses on this world's first
    # 40 questions had found every supporting passage
    right = scores["outcomes"]["right"]
    missed = 40 - right - unanswerable
    expected = {"right": right, "wrong_unanswerable": unanswerable, "wrong_missing_evidence": missed}
    assert scores["outcomes"] == {**dict.fromkeys(OUTCOMES, 0), **expected}
    for t, row in zip(read_trajectories(out / "trajectories.jsonl"), rows, strict=True):
        found = set(examples[t.example_id].supporting_ids) <= set(t.retrieved_ids)
        assert row["outcome"] != "wrong_missing_evidence" or not found


def test_a_wrong_answer_after_the_oracle_searches_is_a_reading_miss(world_dir, tmp_path):
    from ragrl.eval.runner import score_trajectories
    from ragrl.methods import load_method

    _eval(world_dir, tmp_path / "oracle", "--demonstrator", "oracle", "--n", "20")
    examples = read_examples(world_dir / "test.jsonl")[0][:20]
    trajectories = read_trajectories(tmp_path / "oracle" / "trajectories.jsonl")
    for t in trajectories:  # the oracle's searches, then a wrong answer
        t.final_answer = "surely wrong"
    scores, rows = score_trajectories(trajectories, examples, load_method("search_r1"))
    # the oracle finds every passage still in the corpus: every answerable question is a reading miss
    expected = ["wrong_with_all_evidence" if ex.answerable else "wrong_unanswerable" for ex in examples]
    assert [r["outcome"] for r in rows] == expected
    assert scores["outcomes"]["wrong_with_all_evidence"] == sum(ex.answerable for ex in examples) > 10


@pytest.mark.vllm
def test_the_vllm_backend_scores_what_the_transformers_backend_scores(world_dir, tmp_path):
    """``ragrl eval --backend vllm`` with the real engine (``make test-vllm``): greedy, the same tokens,
    so the same answers and scores as the transformers backend."""
    pytest.importorskip("vllm")
    model = tmp_path / "model"  # head size 32: vLLM's CPU attention has no kernel for the fixture's 16
    tiny = ["model", "tiny", "--data", str(world_dir), "--out", str(model), "--hidden", "64", "--layers", "2"]
    built = runner.invoke(app, [*tiny, "--heads", "2"])
    assert built.exit_code == 0, built.output
    common = ["--n", "12", "--set", "rollout.max_new_tokens=24", "--set", "rollout.max_turns=2"]
    scores = {}
    for backend in ("transformers", "vllm"):
        args = ["eval", "--model", str(model), "--data", str(world_dir / "test.jsonl"), "--index",
                str(world_dir / "bm25"), "--out", str(tmp_path / backend), "--backend", backend,
                *common]  # fmt: skip
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        scores[backend] = json.loads((tmp_path / backend / "scores.json").read_text())
    predictions = {b: (tmp_path / b / "predictions.jsonl").read_text() for b in scores}
    assert predictions["vllm"] == predictions["transformers"]
    for key in ("em", "f1", "policy_tokens_mean", "searches_per_question"):
        assert scores["vllm"][key] == scores["transformers"][key], key


def test_by_scores_each_question_type_apart_and_a_wrong_key_fails_before_the_rollout(world_dir, tmp_path):
    scores = _eval(world_dir, tmp_path / "by", "--demonstrator", "heuristic", "--n", "60", "--by", "type")
    examples, _ = read_examples(world_dir / "test.jsonl")
    type_of = {ex.id: ex.metadata["type"] for ex in examples[:60]}
    rows = [json.loads(line) for line in (tmp_path / "by" / "per_example.jsonl").read_text().splitlines()]
    groups = scores["by"]["groups"]
    assert scores["by"]["key"] == "type" and list(groups) == ["bridge", "comparison"]
    for name, entry in groups.items():
        ems = [r["em"] for r in rows if type_of[r["id"]] == name]
        assert entry["n"] == len(ems) and entry["em"] == pytest.approx(sum(ems) / len(ems))
    assert 0 < groups["bridge"]["n"] < 60 and groups["bridge"]["em"] != groups["comparison"]["em"]
    args = ["eval", "--model", str(world_dir / "model"), "--data", str(world_dir / "test.jsonl")]
    wrong = runner.invoke(app, [*args, "--index", str(world_dir / "bm25"), "--out", str(tmp_path / "w"),
                                "--demonstrator", "heuristic", "--by", "dataset"])  # fmt: skip
    assert wrong.exit_code != 0 and "no question has metadata.dataset to group by" in str(wrong.exception)
    assert not (tmp_path / "w").exists()


def test_eval_asks_a_retrieval_server_and_replays_its_cache_without_it(world_dir, tmp_path, serve):
    pytest.importorskip("fastapi")
    from ragrl.retrieval.base import load_retriever, read_manifest
    from ragrl.retrieval.server import create_app

    def retrieved(out):
        return [t.retrieved_ids for t in read_trajectories(out / "trajectories.jsonl")]

    oracle = ("--demonstrator", "oracle", "--n", "20")
    local = _eval(world_dir, tmp_path / "local", *oracle)
    fingerprint = read_manifest(world_dir / "bm25")["fingerprint"]
    cache = tmp_path / "hits.sqlite"
    with serve(create_app(load_retriever(world_dir / "bm25"))) as url:
        remote = _eval(world_dir, tmp_path / "remote", *oracle, "--retrieval-cache", str(cache), index=url)
    assert remote["provenance"]["index"] == url and remote["provenance"]["index_fingerprint"] == fingerprint
    assert (
        remote["retrieval_cache"]["mode"] == "readwrite" and remote["retrieval_cache"]["queries_searched"] > 0
    )
    replayed = _eval(world_dir, tmp_path / "replayed", *oracle, "--retrieval-cache", str(cache),
                     "--cache-mode", "replay", index=url)  # fmt: skip
    assert replayed["retrieval_cache"]["queries_searched"] == 0  # the server is gone: nothing searched
    asked = remote["retrieval_cache"]["queries_searched"] + remote["retrieval_cache"]["queries_from_cache"]
    assert replayed["retrieval_cache"]["queries_from_cache"] == asked  # every query the same run asked
    for scores in (remote, replayed):
        assert {k: scores[k] for k in ("em", "full_recall@10", "searches_per_question")} == {
            k: local[k] for k in ("em", "full_recall@10", "searches_per_question")
        }
    assert retrieved(tmp_path / "remote") == retrieved(tmp_path / "replayed") == retrieved(tmp_path / "local")
    args = ["eval", "--model", str(world_dir / "model"), "--data", str(world_dir / "test.jsonl")]
    alone = runner.invoke(app, [*args, "--retrieval-cache", str(cache), "--out", str(tmp_path / "x")])
    assert "--retrieval-cache keeps the searches of --index: pass --index too" in str(alone.exception)
    closed = runner.invoke(
        app, [*args, "--retrieval-cache", str(cache), "--closed-book", "--out", str(tmp_path / "x")]
    )
    assert "--retrieval-cache keeps the searches of --index: --closed-book searches nothing" in str(
        closed.exception
    )
    no_file = runner.invoke(
        app, [*args, "--index", url, "--cache-mode", "replay", "--out", str(tmp_path / "x")]
    )
    assert "--cache-mode replay says how to use --retrieval-cache: give the file too" in str(
        no_file.exception
    )


def test_a_policy_of_a_training_run_is_evaluated_with_that_runs_method(world_dir, tmp_path):
    import shutil

    from ragrl.commands.ask import trained_with

    run = tmp_path / "run"
    shutil.copytree(world_dir / "model", run / "policy")
    shutil.copytree(world_dir / "model", run / "checkpoints" / "step-000002" / "policy")
    config = load_method("search_r1-tiny", ["rollout.max_turns=3", "rollout.k=2"]).resolved_yaml()
    (run / "config.yaml").write_text(config)
    (run / "metrics.jsonl").write_text("")
    assert trained_with(run / "policy") == trained_with(run / "checkpoints" / "step-000002" / "policy")
    assert trained_with(run / "policy") == (run / "config.yaml").absolute()
    assert trained_with(world_dir / "model") is None
    shutil.copytree(world_dir / "model", run / "tiny-policy")  # the demo's untrained start, beside its run
    shutil.copytree(world_dir / "model", run / "warm_start" / "policy")
    assert trained_with(run / "tiny-policy") is None
    assert trained_with(run / "warm_start" / "policy") == (run / "config.yaml").absolute()
    args = ["eval", "--data", str(world_dir / "test.jsonl"), "--index", str(world_dir / "bm25"), "--n", "2"]
    result = runner.invoke(app, [*args, "--model", str(run / "policy"), "--out", str(tmp_path / "e")])
    assert result.exit_code == 0, result.output
    assert (
        f"method: {(run / 'config.yaml').absolute()}, the run that trained {run / 'policy'}" in result.stderr
    )
    assert (tmp_path / "e" / "config.yaml").read_text() == config  # played as it was trained
    chosen = runner.invoke(app, [*args, "--model", str(run / "policy"), "--out", str(tmp_path / "f"),
                                 "--method", "search_r1"])  # fmt: skip
    assert chosen.exit_code == 0 and "the run that trained" not in chosen.stderr
    assert "max_turns: 3" not in (tmp_path / "f" / "config.yaml").read_text()


def test_eval_asks_a_search_r1_server_that_reports_no_fingerprint(world_dir, tmp_path, serve, search_r1_app):
    from ragrl.retrieval.base import load_retriever

    oracle = ("--demonstrator", "oracle", "--n", "5")
    local = _eval(world_dir, tmp_path / "local", *oracle)
    with serve(search_r1_app(load_retriever(world_dir / "bm25"))) as url:
        remote = _eval(world_dir, tmp_path / "remote", *oracle, index=url)  # no /health: nothing to key on
    assert remote["provenance"]["index"] == url and remote["provenance"]["index_fingerprint"] is None
    assert remote["em"] == local["em"] == 1.0 and remote["full_recall@10"] == local["full_recall@10"]


def test_the_index_fingerprint_is_taken_while_the_retriever_is_open(world_dir, tmp_path, monkeypatch):
    from ragrl.retrieval.base import load_retriever

    class ClosesForGood:  # as an HTTP client: nothing can be asked once it is closed
        def __init__(self, inner):
            self.inner, self.closed = inner, False

        @property
        def fingerprint(self):
            if self.closed:
                raise RuntimeError("Cannot send a request, as the client has been closed")
            return "served-" + self.inner.fingerprint

        def search(self, queries, k):
            return self.inner.search(queries, k)

        def close(self):
            self.closed = True

    opened = []

    def open_stub(where, **options):
        opened.append(ClosesForGood(load_retriever(world_dir / "bm25")))
        return opened[-1]

    monkeypatch.setattr("ragrl.retrieval.open.open_retriever", open_stub)
    scores = _eval(
        world_dir, tmp_path / "e", "--demonstrator", "oracle", "--n", "3", index="http://served:8000"
    )
    assert opened[0].closed and scores["provenance"]["index_fingerprint"].startswith("served-")
