"""EVO-RAG from the command line: ``ragrl reward evo_rag`` prints every step's seven rewards, weights and
R_t with what the step did; ``ragrl train evo_rag-tiny`` runs both curriculum stages of preference
cycles; ``ragrl eval`` reports the agent's measurements."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from ragrl.cli import app

GOLD = {
    "id": "q1",
    "question": "Which state contains the launch site of Mars Pathfinder?",
    "golden_answers": ["Florida"],
    "metadata": {"supporting_ids": ["g1", "g2"]},
}
FOUND = {
    "id": "q1",
    "completion": "<think>find the site</think><search> Mars Pathfinder launch site </search>\n"
    "<information>Doc 1 (Title: Pathfinder) launched from Cape Canaveral</information>\n"
    "<search> Cape Canaveral state </search>\n"
    "<information>Doc 1 (Title: Cape Canaveral) a cape in Florida</information>\n"
    "<answer> Florida </answer>",
    "retrieved_ids": [["g1"], ["g2"]],
    "retrieved_titles": [["Pathfinder"], ["Cape Canaveral"]],
}
GAVE_UP = {
    "id": "q1",
    "completion": "<search>Mars Pathfinder</search>\n<information>Doc 1 (Title: X) nothing</information>\n"
    "<backtrack/><refuse/>",
    "retrieved_ids": [["n"]],
}


def _files(tmp_path, *records):
    gold, completions = tmp_path / "gold.jsonl", tmp_path / "completions.jsonl"
    gold.write_text(json.dumps(GOLD) + "\n")
    completions.write_text("".join(json.dumps(r) + "\n" for r in records))
    return gold, completions


def test_reward_prints_every_step_and_each_episode_return(tmp_path):
    gold, completions = _files(tmp_path, FOUND, GAVE_UP)
    result = CliRunner().invoke(
        app, ["reward", "evo_rag", "--completions", str(completions), "--gold", str(gold)]
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in result.output.splitlines()]
    steps = [x for x in lines if "t" in x]
    assert [(x["t"], x["action"]["kind"]) for x in steps] == [
        (0, "search"),
        (1, "search"),
        (2, "answer"),
        (0, "search"),
        (1, "backtrack"),
        (2, "refuse"),
    ]
    first = steps[0]
    assert first["action"]["doc_ids"] == ["g1"] and first["action"]["titles"] == ["Pathfinder"]
    assert (first["ret"], first["step"], first["R_t"]) == (1.0, -1.0, 1.98)  # β(0)·1 − η(0)
    assert first["weights"] == {
        "ret": 2.0,
        "act": 1.5,
        "dup": 0.1,
        "bt": 0.3,
        "ref": 0.5,
        "step": 0.02,
        "ans": 0.05,
    }
    assert steps[2]["ans"] == 1.0 and steps[4]["bt"] == -1.0
    # the refusal: its search was taken back, so no gold is in context and the verifier backs it
    assert steps[5]["ref"] == 1.0 and steps[5]["action"]["verdict"] == "no"
    episodes = [x for x in lines if "return" in x]
    assert len(episodes) == 2 and episodes[0]["return"] == pytest.approx(sum(x["R_t"] for x in steps[:3]))


def test_the_step_log_can_show_each_query_embedding(tmp_path):
    gold, completions = _files(tmp_path, FOUND)
    args = ["reward", "evo_rag", "--completions", str(completions), "--gold", str(gold)]
    plain = [json.loads(x) for x in CliRunner().invoke(app, args).output.splitlines()]
    assert not any("embedding" in x.get("action", {}) for x in plain)
    result = CliRunner().invoke(app, [*args, "--set", "rewards.log_embeddings=true"])
    assert result.exit_code == 0, result.output
    steps = [x for x in map(json.loads, result.output.splitlines()) if "t" in x]
    first, second = (np.array(x["action"]["embedding"]) for x in steps[:2])
    assert first.shape == (384,) and np.linalg.norm(first) == pytest.approx(1.0, abs=1e-4)  # all-MiniLM-L6-v2
    assert steps[1]["action"]["max_cos"] == pytest.approx(float(first @ second), abs=1e-4)
    assert "embedding" not in steps[2]["action"]  # the answer has no query
    assert [x["R_t"] for x in steps] == [x["R_t"] for x in plain if "t" in x]  # the rewards are the same


def test_a_saved_backtrack_with_nothing_to_take_back_is_scored_as_invalid(tmp_path):
    # as in the live rollout: no step to take back, so no r_bt, only the step cost
    record = {
        "id": "q1",
        "completion": "<backtrack/>\nThat was not a valid action.\n<refuse/>",
        "retrieved_ids": [],
    }
    gold, completions = _files(tmp_path, record)
    result = CliRunner().invoke(
        app, ["reward", "evo_rag", "--completions", str(completions), "--gold", str(gold)]
    )
    assert result.exit_code == 0, result.output
    steps = [x for x in map(json.loads, result.output.splitlines()) if "t" in x]
    assert [x["action"]["kind"] for x in steps] == ["invalid", "refuse"]
    assert (steps[0]["bt"], steps[0]["step"]) == (0.0, -1.0)


def test_reward_names_the_line_of_a_bad_ids_field(tmp_path):
    gold, completions = _files(tmp_path, {**FOUND, "retrieved_ids": [["g1"]]})
    result = CliRunner().invoke(
        app, ["reward", "evo_rag", "--completions", str(completions), "--gold", str(gold)]
    )
    message = str(result.exception)
    assert result.exit_code != 0 and "completions.jsonl:1" in message and "retrieved_ids" in message
    assert "1 lists but the completion makes 2 searches" in message


def test_train_runs_both_curriculum_stages_from_the_cli(world_dir, tmp_path):
    out = tmp_path / "run"
    args = [
        "train",
        "evo_rag-tiny",
        "--out",
        str(out),
        "--set",
        f"train.model.path={world_dir / 'model'}",
        "--set",
        f"train.data.train={world_dir / 'train.jsonl'}",
        "--set",
        f"train.data.eval={world_dir / 'dev.jsonl'}",
        "--set",
        f"train.data.index={world_dir / 'bm25'}",
        "--set",
        "train.data.eval_limit=6",
        "--set",
        "train.steps=1",
        "--set",
        "rollout.max_turns=3",
        "--set",
        "train.cycles.questions_per_cycle=4",
        "--set",
        "train.cycles.n_candidates=3",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    stages = json.loads((out / "stages.json").read_text())["finished"]
    assert [s["name"] for s in stages] == ["discovery", "refinement"]
    assert stages[1]["start"].endswith("stage-0-discovery/best")
    for stage in stages:
        run = out / f"stage-{stages.index(stage)}-{stage['name']}"
        assert (run / "reward_model" / "heads.safetensors").is_file()
        assert (run / "reward_model_single" / "heads.safetensors").is_file()
        records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["kind"] for r in records if r["kind"] == "cycle"] == ["cycle"]
        assert any("eval/method/steps" in r for r in records if r["kind"] == "eval")
    config = (out / "stage-1-refinement" / "config.yaml").read_text()
    assert "stage: refinement" in config
