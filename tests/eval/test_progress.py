"""An evaluation that survives being stopped: ``ragrl.eval.progress`` and ``ragrl eval --resume``."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ragrl.cli import app
from ragrl.errors import DataError, RagrlError
from ragrl.eval.progress import (
    PARTIAL,
    PROGRESS,
    EvalProgress,
    count_partial,
    drop_cut_line,
    model_fingerprint,
    read_partial,
)
from ragrl.rollout.records import read_trajectories
from ragrl.rollout.trajectory import Action, Segment, Trajectory

runner = CliRunner()


def episode(i: int) -> Trajectory:
    return Trajectory(
        f"q{i}", [1, 2], [Segment("policy", [3, i], "text", [-0.5, -0.25])], [Action("answer", str(i))]
    )


def test_episodes_kept_chunk_by_chunk_come_back_and_a_torn_last_line_is_dropped(tmp_path):
    settings = {"model": "m", "seed": 0}
    saved = EvalProgress.start(tmp_path, settings)
    saved.append([episode(0), episode(1)])
    saved.append([episode(2)])
    _, done = EvalProgress.resume(tmp_path, dict(settings))
    assert [t.to_dict() for t in done] == [episode(i).to_dict() for i in range(3)]
    with open(tmp_path / PARTIAL, "a", encoding="utf-8") as f:  # a kill in the middle of a line
        f.write(json.dumps(episode(3).to_dict())[:40])
    assert len(read_partial(tmp_path / PARTIAL)) == 3
    resumed, done = EvalProgress.resume(tmp_path, dict(settings))  # the cut line leaves the file too
    assert len(done) == 3 and resumed.kept == 3
    resumed.append([episode(3), episode(4)])
    _, done = EvalProgress.resume(tmp_path, dict(settings))  # and a second resume reads every episode
    assert [t.example_id for t in done] == ["q0", "q1", "q2", "q3", "q4"]
    with pytest.raises(RagrlError, match=r"this one differs \(seed: 0 then, 1 now\)"):
        EvalProgress.resume(tmp_path, {"model": "m", "seed": 1})
    lines = (tmp_path / PARTIAL).read_text().splitlines()
    (tmp_path / PARTIAL).write_text(lines[0] + "\n{broken\n" + lines[2] + "\n")
    assert count_partial(tmp_path / PARTIAL) == 3
    with pytest.raises(DataError) as e:  # a bad line that is not the last is an error, not dropped
        read_partial(tmp_path / PARTIAL)
    assert e.value.line == 2
    saved.finish()
    assert not (tmp_path / PARTIAL).exists() and not (tmp_path / PROGRESS).exists()
    with pytest.raises(RagrlError, match="holds no interrupted evaluation to resume"):
        EvalProgress.resume(tmp_path, settings)


def test_an_interrupted_evaluation_resumes_to_what_an_uninterrupted_one_gives(
    world_dir, tmp_path, monkeypatch
):
    args = ["eval", "--model", str(world_dir / "model"), "--data", str(world_dir / "test.jsonl"),
            "--index", str(world_dir / "bm25"), "--n", "70", "--temperature", "1", "--seed", "5",
            "--set", "rollout.max_turns=2", "--set", "rollout.max_new_tokens=6"]  # fmt: skip
    straight = runner.invoke(app, [*args, "--out", str(tmp_path / "straight")])
    assert straight.exit_code == 0, straight.output

    append = EvalProgress.append

    def stopped_after_one_chunk(self, episodes):
        append(self, episodes)
        raise KeyboardInterrupt  # Ctrl-C once the first chunk (64 of 70 questions) is on disk

    def crashed_after_one_chunk(self, episodes):
        append(self, episodes)
        raise RagrlError("POST http://retriever/retrieve failed after 4 attempts")  # a server gone

    crashed = tmp_path / "crashed"
    monkeypatch.setattr(EvalProgress, "append", crashed_after_one_chunk)
    result = runner.invoke(app, [*args, "--out", str(crashed)])
    assert f"stopped: 64 questions kept in {crashed}; the same command with --out {crashed} --resume" in (
        result.stderr
    )
    assert f"episodes kept in {crashed} as they are rolled out" in result.stderr
    out = tmp_path / "stopped"
    monkeypatch.setattr(EvalProgress, "append", stopped_after_one_chunk)
    stopped = runner.invoke(app, [*args, "--out", str(out)])
    assert stopped.exit_code != 0 and not (out / "scores.json").exists()
    assert (
        f"stopped: 64 questions kept in {out}; the same command with --out {out} --resume" in stopped.stderr
    )
    monkeypatch.setattr(EvalProgress, "append", append)
    again = runner.invoke(app, [*args, "--out", str(out)])
    assert "holds an interrupted evaluation (64 questions rolled out); --resume continues it" in str(
        again.exception
    )
    other = runner.invoke(
        app, [*args[:-4], "--out", str(out), "--resume"]
    )  # other budgets: another evaluation
    assert "--resume continues the same evaluation, and this one differs (method_sha256" in str(
        other.exception
    )

    resumed = runner.invoke(app, [*args, "--out", str(out), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert "resuming: 64 of 70 questions were rolled out before" in resumed.stderr
    first, then = (read_trajectories(d / "trajectories.jsonl") for d in (tmp_path / "straight", out))
    sampled = [t.completion_ids for t in first]  # at T = 1
    assert [t.completion_ids for t in then] == sampled  # every episode with the seed it had
    assert len({tuple(ids) for ids in sampled}) > 60  # each episode its own sample
    scores = [json.loads((d / "scores.json").read_text()) for d in (tmp_path / "straight", out)]
    assert scores[1].pop("resumed_from") == 64 and scores[1]["n_scored"] == 70
    for s in scores:
        del s["rollout_seconds"]
    assert scores[0] == scores[1]  # every figure, the provenance too
    rows = [(d / "per_example.jsonl").read_text() for d in (tmp_path / "straight", out)]
    assert rows[0] == rows[1]

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("ragrl.commands.eval._write_evaluation", full_disk)
    unwritten = runner.invoke(app, [*args, "--out", str(tmp_path / "full")])
    assert f"stopped: 70 questions kept in {tmp_path / 'full'}" in unwritten.stderr
    monkeypatch.undo()
    finished = runner.invoke(
        app, [*args, "--out", str(tmp_path / "full"), "--resume"]
    )  # nothing left to roll
    assert finished.exit_code == 0, finished.output
    assert json.loads((tmp_path / "full" / "scores.json").read_text())["resumed_from"] == 70

    def breaks(*things):
        raise OSError("the engine would not stop")

    monkeypatch.setattr("ragrl.retrieval.open.close_all", breaks)
    closing = runner.invoke(app, [*args, "--out", str(tmp_path / "closing")])
    assert closing.exit_code == 0 and (tmp_path / "closing" / "scores.json").is_file()
    assert "warning: closing the policy or the retriever failed: the engine would not stop" in closing.stderr
    monkeypatch.undo()
    restarted = runner.invoke(app, [*args, "--out", str(crashed), "--force"])  # --force starts over
    assert restarted.exit_code == 0 and "resuming" not in restarted.stderr
    assert json.loads((crashed / "scores.json").read_text()).get("resumed_from") is None
    assert not (out / PARTIAL).exists() and not (out / PROGRESS).exists()
    missing = runner.invoke(app, [*args, "--out", str(tmp_path / "new"), "--resume"])
    assert "holds no interrupted evaluation" in str(missing.exception)


def test_a_model_fingerprint_sees_a_retrained_checkpoint_without_reading_it_whole(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    weights = bytearray(3 << 20)  # 3 MiB: the middle MiB is never read
    (tmp_path / "model.safetensors").write_bytes(bytes(weights))
    first = model_fingerprint(tmp_path)
    weights[(3 << 20) - 5] = 1  # the last tensors, as a retrained checkpoint's
    (tmp_path / "model.safetensors").write_bytes(bytes(weights))
    assert model_fingerprint(tmp_path) != first
    changed = model_fingerprint(tmp_path)
    weights[(3 << 20) // 2] = 7  # the middle: not read (a cheap fingerprint, not a hash of the weights)
    (tmp_path / "model.safetensors").write_bytes(bytes(weights))
    assert model_fingerprint(tmp_path) == changed
    (tmp_path / "config.json").write_text('{"hidden_size": 16}')
    assert model_fingerprint(tmp_path) != changed
    settled = model_fingerprint(tmp_path)
    (tmp_path / ".cache").mkdir()  # hidden folders: a git clone's second copy, download timestamps
    (tmp_path / ".cache" / "model.safetensors.metadata").write_text("downloaded at 12:00")
    assert model_fingerprint(tmp_path) == settled


def test_a_cut_in_the_middle_of_a_character_is_dropped_and_a_file_without_a_newline_is_emptied(tmp_path):
    settings = {"seed": 0}
    saved = EvalProgress.start(tmp_path, settings)
    saved.append([episode(0)])
    named = episode(1)
    named.segments[0].text = "Élodie Dupré"  # written as UTF-8, two bytes a letter
    whole = json.dumps(named.to_dict(), ensure_ascii=False).encode("utf-8")
    cut = whole[: whole.index("É".encode()) + 1]  # a kill between the two bytes of É
    with open(tmp_path / PARTIAL, "ab") as f:
        f.write(cut)
    _, done = EvalProgress.resume(tmp_path, settings)
    assert [t.example_id for t in done] == ["q0"]
    assert (tmp_path / PARTIAL).read_bytes().endswith(b"\n")  # the cut bytes left the file
    (tmp_path / PARTIAL).write_bytes(b'{"cut before any newline')
    drop_cut_line(tmp_path / PARTIAL)
    assert (tmp_path / PARTIAL).read_bytes() == b""
    drop_cut_line(tmp_path / PARTIAL)  # an empty file stays as it is
    assert read_partial(tmp_path / PARTIAL) == []
