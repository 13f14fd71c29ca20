"""``ragrl train``, ``ragrl sft`` and ``ragrl demo`` from the command line (tiny budgets)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ragrl.cli import app
from ragrl.data.io import read_examples
from ragrl.train.demo import MISSES, summary_table

runner = CliRunner()

TINY = [
    "train.grpo.prompts_per_step=2",
    "rollout.n=2",
    "rollout.max_turns=2",
    "rollout.max_new_tokens=8",
    "train.data.eval_limit=3",
    "train.sft.max_steps=2",
    "train.sft.batch_size=4",
]


def sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def summary_of(output: str) -> dict:
    return json.loads(output[output.index("{") :])


def test_train_writes_the_run_folder_and_resumes(world_dir, tmp_path):
    paths = (
        f"train.model.path={world_dir / 'model'}",
        f"train.data.train={world_dir / 'train.jsonl'}",
        f"train.data.eval={world_dir / 'dev.jsonl'}",
        f"train.data.index={world_dir / 'bm25'}",
    )
    out = tmp_path / "run"
    args = ["train", "search_r1-tiny", "--out", str(out), *sets(*paths, *TINY, "train.steps=1")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = summary_of(result.stdout)
    assert summary["steps"] == 1 and summary["n_eval"] == 3
    assert "step 1/1 TRAIN reward" in result.stderr  # a log (not a terminal) gets one line per step
    files = ("config.yaml", "environment.json", "metrics.jsonl", "samples.jsonl", "summary.json", "report.md")
    for name in (*files, "curves.png"):
        assert (out / name).is_file(), name
    assert "steps: 1" in (out / "config.yaml").read_text()  # the resolved config, overrides applied
    assert "## Environment" in (out / "report.md").read_text()

    again = runner.invoke(app, args)
    assert again.exit_code != 0 and "--resume latest" in str(again.exception)

    more = ["train", "search_r1-tiny", "--out", str(out), "--resume", "latest"]
    result = runner.invoke(app, [*more, *sets(*paths, *TINY, "train.steps=2")])
    assert result.exit_code == 0, result.output
    assert summary_of(result.stdout)["steps"] == 2
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    # eval before, step 1, the first run's eval after step 1, then the resumed step 2 and its eval after
    assert steps == [0, 1, 1, 2, 2]
    starts = json.loads((out / "environment.json").read_text())  # the first start and the resume's
    assert [s["step"] for s in starts] == [0, 1]
    assert starts[0]["packages_sha256"] == starts[1]["packages_sha256"]
    assert "another environment" not in result.stderr


def test_train_on_two_processes_is_one_run(world_dir, tmp_path):
    """``ragrl train`` under torchrun on CPU (ACCELERATE_USE_CPU) trains one run on two processes: one
    summary that says so, and one per-step line. The command used to make every process a
    single-process run of its own, all writing the same folder."""
    import os
    import subprocess
    import sys

    paths = (
        f"train.model.path={world_dir / 'model'}",
        f"train.data.train={world_dir / 'train.jsonl'}",
        f"train.data.index={world_dir / 'bm25'}",
    )
    out = tmp_path / "run"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    ragrl = [*launch, "-m", "ragrl", "train", "search_r1-tiny", "--out", str(out)]
    args = sets(*paths, *TINY, "train.steps=2", "train.eval_every=0")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    result = subprocess.run([*ragrl, *args], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert summary_of(result.stdout)["processes"] == 2
    assert result.stdout.count('"trainer"') == 1
    assert json.loads((out / "summary.json").read_text())["processes"] == 2
    assert result.stderr.count("step 2/2 TRAIN reward") == 1


def test_train_without_a_model_is_a_clear_error(tmp_path):
    result = runner.invoke(app, ["train", "search_r1-tiny", "--out", str(tmp_path / "r")])
    assert result.exit_code != 0 and "train.model.path" in str(result.exception)


def test_sft_on_oracle_demonstrations(world_dir, tmp_path):
    args = [
        "sft", "search_r1-tiny", "--demos", "oracle", "--out", str(tmp_path / "sft"),
        *sets(
            f"train.model.path={world_dir / 'model'}", f"train.data.train={world_dir / 'train.jsonl'}",
            f"train.data.index={world_dir / 'bm25'}", *TINY,
        ),
    ]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = summary_of(result.stdout)
    assert summary["trainer"] == "sft" and summary["steps"] == 2
    rows = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "sft"] == [1, 2]
    assert all(r["loss"] > 0 and r["tokens"] > 0 for r in rows if r["kind"] == "sft")


def test_sft_on_quoting_oracle_demonstrations_and_its_guard(world_dir, tmp_path):
    paths = (
        f"train.model.path={world_dir / 'model'}", f"train.data.train={world_dir / 'train.jsonl'}",
        f"train.data.index={world_dir / 'bm25'}", *TINY,
    )  # fmt: skip
    args = ["sft", "search_r1-tiny", "--demos", "quote", "--out", str(tmp_path / "sft"), *sets(*paths)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert summary_of(result.stdout)["steps"] == 2
    # a method whose oracle cannot play another demonstrator (R²AG's steering) refuses the quoting oracle
    args = ["sft", "r2ag-tiny", "--demos", "quote", "--out", str(tmp_path / "e"), *sets(*paths)]
    result = runner.invoke(app, args)
    assert result.exit_code != 0 and "has its own grammar" in str(result.exception)
    # a demonstrations file with nothing in it is named, not an SFT run on nothing
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    args = ["sft", "search_r1-tiny", "--demos", str(empty), "--out", str(tmp_path / "f"), *sets(*paths)]
    result = runner.invoke(app, args)
    assert result.exit_code != 0 and f"{empty}: no demonstrations (an empty file)" in str(result.exception)


@pytest.mark.parametrize("config", ["evo_rag-tiny", "eval_rar-tiny", "tiresrag-tiny"])
def test_a_method_speaks_the_quoting_oracle_in_its_own_grammar(world_dir, tmp_path, config):
    from ragrl.data.io import read_examples
    from ragrl.rollout.records import read_trajectories
    from ragrl.synth.demonstrators import supporting_titles

    paths = (
        f"train.model.path={world_dir / 'model'}", f"train.data.train={world_dir / 'train.jsonl'}",
        f"train.data.index={world_dir / 'bm25'}", *TINY, "rollout.max_turns=8", "rollout.max_new_tokens=96",
        "rollout.max_total_tokens=1024",
    )  # fmt: skip
    args = ["sft", config, "--demos", "quote", "--out", str(tmp_path / "q"), *sets(*paths)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    examples = {e.id: e for e in read_examples(world_dir / "train.jsonl")[0]}
    demos = read_trajectories(tmp_path / "q" / "demonstrations.jsonl")
    assert len(demos) == len(examples)
    for traj in demos:
        example = examples[traj.example_id]
        kinds = [a.kind for a in traj.actions]
        assert "invalid" not in kinds, traj.example_id  # every quoted turn parses in the method's grammar
        queries = [a.content for a in traj.actions if a.kind == "search"]
        if example.answerable:  # one search per hop, by the entity it is about, then the answer
            assert queries == supporting_titles(example) and kinds[-1] == "answer"
            assert traj.final_answer == example.answers[0]
        elif config == "evo_rag-tiny":  # the corpus cannot answer: it refuses where the oracle says unknown
            assert kinds[-1] == "refuse"
        else:
            assert traj.final_answer == "unknown"
        if config == "eval_rar-tiny":  # an evaluation after every observation
            from ragrl.methods.eval_rar import evaluations

            assert len(evaluations(traj, after_observation_only=True)) == len(queries), traj.example_id
        if config == "tiresrag-tiny" and example.answerable:  # the reflection pass repeats the answer
            assert kinds.count("answer") == 2, kinds
    assert {examples[t.example_id].answerable for t in demos} == {True, False}


def test_demo_end_to_end_on_a_tiny_budget(tmp_path):
    out = tmp_path / "demo"
    args = [
        "demo",
        "--out",
        str(out),
        "--base",
        "scratch",
        "--copy-steps",
        "3",
        *sets(*TINY, "train.steps=1"),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["split"] == "facts" and summary["copy_steps"] == 3 and summary["base"] is None
    # where the numbers came from: the GRPO run's start and the warm start's, each beside its metrics
    for folder in (out, out / "warm_start"):
        assert [s["step"] for s in json.loads((folder / "environment.json").read_text())] == [0]
    assert json.loads((out / "tiny-policy" / "ragrl_tiny.json").read_text())["copy_pretraining"]["steps"] == 3
    rows = summary["held_out"]
    assert list(rows) == [
        "heuristic demonstrator",
        "warm start (SFT)",
        "after GRPO",
        "after GRPO, closed-book",
    ]
    assert rows["after GRPO"]["em"] == summary["em_after"]
    assert rows["warm start (SFT)"]["em_answerable"] == summary["em_answerable_before"]
    assert rows["after GRPO, closed-book"]["em_answerable"] == summary["em_answerable_closed_book"]
    # GRPO was evaluated on the first 3 dev questions, before and after its one step; the rows are test
    assert summary["n_dev"] == 3 and set(summary["dev_em_answerable"]) == {"0", "1"}
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(e["step"], e["eval/n"]) for e in evals if e["kind"] == "eval"] == [(0, 3), (1, 3)]
    for e in (e for e in evals if e["kind"] == "eval"):  # the outcomes' shares of the dev questions
        assert sum(v for k, v in e.items() if k.startswith("eval/outcome/")) == pytest.approx(1.0, abs=1e-3)
    assert 0 <= summary["em_answerable_heuristic"] <= 1
    # every row is measured on the same held-out questions (train.data.eval_limit=3)
    assert {row["n"] for row in rows.values()} == {3}
    answerable = sum(ex.answerable for ex in read_examples(out / "world" / "test.jsonl")[0][:3])
    for row in rows.values():
        assert {"em", "em_answerable", "top_answer", "top_answer_share", "searches"} <= set(row)
        # every answerable question has one outcome; EM on them counts the right ones
        assert sum(row["outcomes_answerable"].values()) == answerable
        assert row["outcomes_answerable"]["right"] == round(row["em_answerable"] * answerable)
    table = summary_table(summary)
    assert table.columns[3].header == MISSES
    for row, cell in zip(rows.values(), table.columns[3].cells, strict=True):
        o = row["outcomes_answerable"]
        misses = [int(x) for x in cell.split(" / ")]
        assert misses == [o["wrong_missing_evidence"] + o["wrong_no_search"], o["wrong_with_all_evidence"],
                          o["no_answer"]]  # fmt: skip
        assert o["right"] + sum(misses) == answerable
    assert "closed-book" in result.output and "held-out questions (3, seed 0, facts split)" in result.output
    for key in ("em_before", "em_after", "n_eval", "seed", "wall_seconds", "peak_memory_mb",
                "em_answerable_after", "top_answer_after", "top_answer_share_after"):  # fmt: skip
        assert key in summary, key
    assert 0 < summary["top_answer_share_after"] <= 1
    assert summary["n_eval"] == 3 and summary["warm_start_steps"] == 2
    assert (out / "report.md").read_text().count("curves.png") == 1
    assert (out / "warm_start" / "metrics.jsonl").is_file()
    exists = runner.invoke(app, ["demo", "--out", str(out), "--base", "scratch"])
    assert exists.exit_code != 0 and "--force" in str(exists.exception)


def test_train_runs_the_stages_of_a_staged_config_and_resumes_them(world_dir, tmp_path):
    paths = (
        f"train.model.path={world_dir / 'model'}",
        f"train.data.train={world_dir / 'train.jsonl'}",
        f"train.data.eval={world_dir / 'dev.jsonl'}",
        f"train.data.index={world_dir / 'bm25'}",
    )
    stages = (
        "train.stages=[{name: first, overrides: [train.steps=1]}, {name: second, overrides: [train.steps=1]}]"
    )
    out = tmp_path / "run"
    args = ["train", "search_r1-tiny", "--out", str(out), *sets(*paths, *TINY, stages)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = summary_of(result.output)
    assert [s["steps"] for s in report["stages"]] == [1, 1]
    for stage in ("stage-0-first", "stage-1-second"):
        assert (out / stage / "policy" / "model.safetensors").is_file()
        assert (out / stage / "report.md").is_file()
    again = runner.invoke(app, args)
    assert again.exit_code != 0 and "a staged run is already there" in str(again.exception)
    resumed = runner.invoke(app, [*args, "--resume", "latest"])
    assert resumed.exit_code == 0 and [s["steps"] for s in summary_of(resumed.output)["stages"]] == [1, 1]


def test_a_run_without_a_complete_checkpoint_restarts_on_resume(world_dir, tmp_path):
    """A kill during the first checkpoint write leaves metrics but no complete checkpoint: `--resume
    latest` starts the run again instead of refusing both ways, and clears only the run's own files.
    A finished run whose checkpoints were deleted is never cleared."""
    import shutil

    paths = (
        f"train.model.path={world_dir / 'model'}",
        f"train.data.train={world_dir / 'train.jsonl'}",
        f"train.data.index={world_dir / 'bm25'}",
    )
    out = tmp_path / "run"
    args = ["train", "search_r1-tiny", "--out", str(out), *sets(*paths, *TINY, "train.steps=1")]
    assert runner.invoke(app, args).exit_code == 0
    shutil.rmtree(out / "checkpoints")
    finished = runner.invoke(app, [*args, "--resume", "latest"])
    assert finished.exit_code != 0 and "the run has finished (summary.json, policy)" in str(
        finished.exception
    )
    assert (out / "policy" / "model.safetensors").is_file()  # nothing was removed
    # now as a kill during the first checkpoint write leaves it: no summary, no policy, a .tmp checkpoint
    (out / "summary.json").unlink()
    shutil.rmtree(out / "policy")
    (out / "checkpoints" / "step-000001.tmp").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    result = runner.invoke(app, [*args, "--resume", "latest"])
    assert result.exit_code == 0, result.output
    assert "starting again from step 0" in result.output
    assert summary_of(result.stdout)["steps"] == 1 and (out / "notes.txt").read_text() == "mine"
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1]  # one fresh run (no held-out set: no evaluation), nothing appended
    assert not (out / "checkpoints" / "step-000001.tmp").exists()
    assert (out / "policy" / "model.safetensors").is_file() and (out / "summary.json").is_file()


@pytest.mark.parametrize(
    "bad, why",
    [
        (["rollout.n=1"], "a group of one"),
        (["rollout.temperature=0"], "greedy"),
        (["rollout.n=4", "rollout.greedy_samples=4"], "every episode of a group would be greedy"),
        (["rollout.greedy_samples=1", "train.grpo.old_logprobs=rollout"], "importance ratio would be wrong"),
    ],
)
def test_grpo_settings_that_cannot_learn_are_refused_before_loading(tmp_path, bad, why):
    sets = [x for b in bad for x in ("--set", b)]
    result = runner.invoke(app, ["train", "search_r1-tiny", "--out", str(tmp_path / "r"), *sets])
    assert result.exit_code != 0 and why in str(result.exception)
    assert not (tmp_path / "r").exists()  # refused before the run folder is made


def test_demo_from_a_reader_base(tmp_path, toy_base):
    """The demo's path from a pretrained base: no tiny policy is built, the base's BPE tokenizer is
    used as it is (no name swap), and the base folder is left untouched (its SHA256SUMS still holds)."""
    from ragrl.llm.checksums import verify_checksums

    toy_base, _ = toy_base
    out = tmp_path / "demo"
    # the warm start learns the demonstrations' answer turns, which TINY's 2 turns of 8 tokens cut off
    args = [
        "demo",
        "--out",
        str(out),
        "--base",
        str(toy_base),
        *sets(*TINY, "train.steps=1", "rollout.max_turns=4", "rollout.max_new_tokens=96"),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["base"] == str(toy_base) and summary["copy_steps"] == 0
    assert not (out / "tiny-policy").exists()
    assert list(summary["held_out"]) == [
        "heuristic demonstrator", "warm start (SFT)", "after GRPO", "after GRPO, closed-book",
    ]  # fmt: skip
    config = (out / "config.yaml").read_text()
    assert f"path: {toy_base}" in config and "name_swap: 0.0" in config
    assert "turns: last" in config  # the warm start learns the answer turns: reading, not searching
    assert "micro_batch_size: 32" in config  # GRPO's update in halves: the base's sequences are long
    assert verify_checksums(toy_base) > 0
    # the SFT-only control: the warm start trained on for the RL stage's time, then the same evaluation
    from ragrl.train.demo import sft_control

    control = sft_control(out, seconds=0.01)
    assert control["steps"] == 1 and control["n"] == summary["held_out"]["after GRPO"]["n"]
    assert control["turns"] == "all"  # plain SFT: the searches are learned too
    tokens = {  # the policy tokens a step learns: every turn's against the answer turns'
        part: [
            r["tokens"]
            for r in map(json.loads, (out / part / "metrics.jsonl").read_text().splitlines())
            if "tokens" in r
        ]
        for part in ("warm_start", "sft_control")
    }
    assert min(tokens["sft_control"]) > 1.5 * max(tokens["warm_start"])
    assert json.loads((out / "sft_control" / "scores.json").read_text()) == control
    assert summary["rl_seconds"] > 0
    bad = runner.invoke(app, ["demo", "--out", str(tmp_path / "x"), "--base", str(tmp_path / "none")])
    assert bad.exit_code != 0 and "is not a folder" in str(bad.exception)
    # a base whose weights changed does not load
    import shutil

    tampered = tmp_path / "tampered"
    shutil.copytree(toy_base, tampered)
    weights = tampered / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    bad = runner.invoke(app, ["demo", "--out", str(tmp_path / "y"), "--base", str(tampered), *sets(*TINY)])
    assert bad.exit_code != 0 and "model.safetensors: sha256" in str(bad.exception)


def test_arena_speaks_the_quoting_oracle_over_its_given_passages(world_dir, tmp_path):
    """``ragrl sft arena-tiny --demos quote``: one reply per question, each naming every hop's entity
    with its passage's number, in ARENA's grammar, with the gold answer."""
    from ragrl.data.io import read_examples
    from ragrl.methods.arena.protocol import first_content
    from ragrl.rollout.records import read_trajectories
    from ragrl.synth.demonstrators import supporting_titles

    tiny = [s for s in TINY if not s.startswith("rollout.")]  # ARENA replies once (max_turns 1)
    paths = (f"train.model.path={world_dir / 'model'}", f"train.data.train={world_dir / 'train.jsonl'}",
             *tiny, "rollout.max_new_tokens=256", "rollout.max_total_tokens=256")  # fmt: skip
    args = ["sft", "arena-tiny", "--demos", "quote", "--out", str(tmp_path / "a"), *sets(*paths)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    demos = read_trajectories(tmp_path / "a" / "demonstrations.jsonl")
    examples = {e.id: e for e in read_examples(world_dir / "train.jsonl")[0]}
    assert demos and {t.example_id for t in demos} <= set(examples)
    for traj in demos:
        example = examples[traj.example_id]
        assert [a.kind for a in traj.actions] == ["answer"] and traj.final_answer == example.answers[0]
        analysis = first_content(traj.policy_text, "analysis")
        number = {p.title: i for i, p in reversed(list(enumerate(example.passages, 1)))}
        for title in supporting_titles(example):
            assert f"{title} [{number[title]}]: " in analysis, traj.example_id


def test_sft_and_train_ask_a_retrieval_server_named_by_its_url(
    world_dir, tmp_path, serve, counting_retriever, monkeypatch
):
    pytest.importorskip("fastapi")
    from ragrl.retrieval.base import load_retriever
    from ragrl.retrieval.server import create_app

    served = counting_retriever(load_retriever(world_dir / "bm25"))
    with serve(create_app(served)) as url:
        paths = (
            f"train.model.path={world_dir / 'model'}",
            f"train.data.train={world_dir / 'train.jsonl'}",
            f"train.data.index={url}",
        )
        sft = [
            "sft",
            "search_r1-tiny",
            "--demos",
            "oracle",
            "--out",
            str(tmp_path / "sft"),
            *sets(*paths, "train.sft.max_steps=2", "train.sft.batch_size=4"),
        ]  # whole turns (TINY's 8 new tokens would cut the oracle's searches)
        result = runner.invoke(app, sft)
        assert result.exit_code == 0, result.output
        assert len(served.calls) > 100  # the oracle's searches went to the server
        assert f"index: {url}" in (tmp_path / "sft" / "config.yaml").read_text()
        grpo = [
            "train",
            "search_r1-tiny",
            "--out",
            str(tmp_path / "run"),
            *sets(*paths, f"train.data.eval={world_dir / 'dev.jsonl'}", *TINY, "train.steps=1"),
        ]
        result = runner.invoke(app, grpo)
        assert result.exit_code == 0, result.output
        assert summary_of(result.stdout)["steps"] == 1
    monkeypatch.setattr("ragrl.retrieval.http.time.sleep", lambda s: None)  # the retries' back-off

    def never(*args, **kwargs):
        raise AssertionError("the model loaded before the retriever was checked")

    monkeypatch.setattr("ragrl.train.base.load_policy", never)
    monkeypatch.setattr("ragrl.train.setup.load_policy", never)
    gone = runner.invoke(app, [*grpo[:3], str(tmp_path / "again"), *grpo[4:]])  # the server has stopped
    assert gone.exit_code != 0 and f"{url} does not answer as a retrieval server" in str(gone.exception)
    sft_gone = runner.invoke(app, [*sft[:5], str(tmp_path / "sft-again"), *sft[6:]])
    assert f"{url} does not answer as a retrieval server" in str(sft_gone.exception)
