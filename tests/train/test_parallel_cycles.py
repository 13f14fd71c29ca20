"""Preference cycles (``train.algo: cycles``) on two processes under each ``train.parallel`` engine: the
same cycle as one process (rollouts, siblings, the reward models, the DPO epoch), exact resume, and the
pieces that make it so, checked on one process. (A cycle the processes cannot share evenly is refused:
test_parallel.py's refused batches.)"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ragrl.data.io import read_examples
from ragrl.llm.hf_backend import TransformersBackend
from ragrl.methods import load_method
from ragrl.retrieval.base import load_retriever
from ragrl.rewards.registry import RewardContext
from ragrl.train.setup import load_policy
from ragrl.train.siblings import sample_siblings

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("test_parallel", HERE / "test_parallel.py")
test_parallel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(test_parallel)
ENV, TWO_PROCESSES, SHARDED = test_parallel.ENV, test_parallel.TWO_PROCESSES, test_parallel.SHARDED
same_update, close = test_parallel.same_update, test_parallel.close
SCRIPT = str(HERE / "cycles_run.py")
ENGINES = {"ddp": [], **SHARDED}
COUNTS = ("states", "siblings", "rm_pairs", "policy_pairs", "rm/multi/pairs", "rm/multi/val_pairs")
"""Logged values that are counts: equal on one and two processes."""


def engines(*names: str) -> list:
    """FSDP in the default run (a sharded reference and encoder, lockstep padding), the others ``slow``
    (CI runs them after the default suite: ``.ci/run``; the default run stays under 10 minutes)."""
    return [n if n == "fsdp" else pytest.param(n, marks=pytest.mark.slow) for n in names]


def _run(world: Path, folder: Path, mode: str, *extra: str) -> None:
    """cycles_run.py on two processes (the resume test's three launches)."""
    command = [*TWO_PROCESSES, SCRIPT, str(world), str(folder), mode, *extra]
    subprocess.run(command, check=True, env=ENV, timeout=600)


def _heads(folder: Path, rank: int) -> dict[str, torch.Tensor]:
    return {f"{name}.{k}": v for name, state in torch.load(folder / f"heads-{rank}.pt").items()
            for k, v in state.items()}  # fmt: skip


@pytest.mark.parametrize("engine", engines(*ENGINES))
def test_a_cycle_on_two_processes_is_the_cycle_of_one_process(world_dir, engine, launched):
    one = launched("cycles-straight", "train.steps=1", processes=1)
    two = launched("cycles-straight", "train.steps=1", *ENGINES[engine])
    (a,), (b,) = (json.loads((folder / "cycles.json").read_text()) for folder in (one, two))
    # the same episodes, siblings and pairs: every count, and each pair kind, as one process made them
    assert a["policy_pairs"] > 2 and a["rm_pairs"] > 0 and a["dpo/updates"] >= 1
    # uneven shares of each DPO batch (3 pairs over 2 processes): a lockstep engine padded, one process not
    assert a["padding_passes"] == 0 and (b["padding_passes"] > 0 or engine == "ddp")
    for key in (*COUNTS, *(k for k in a if k.startswith("pairs/"))):
        assert b[key] == a[key], key
    for key in ("reward", "steps", "answer_rate", "dpo/loss", "dpo/rewards/accuracy", "rm/multi/train/loss"):
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    # the reward models' heads: the same on both processes, and as one process trained them
    heads_one, heads_two = _heads(one, 0), _heads(two, 0)
    assert sorted(heads_one) == sorted(heads_two) and close(heads_two, _heads(two, 1)) == 0.0
    assert close(heads_one, heads_two) < 1e-5
    # the policy's DPO epoch: one process's update on the pairs of both
    from safetensors.torch import load_file

    init = load_file(world_dir / "model" / "model.safetensors")
    w_one, w_two = torch.load(one / "w.pt"), torch.load(two / "w.pt")
    assert max(float((w_one[k] - init[k]).abs().max()) for k in init) > 1e-4
    same_update(w_one, w_two)


@pytest.mark.parametrize(
    "engine", [pytest.param(e, marks=pytest.mark.slow) for e in ("fsdp", "zero2", "zero3")]
)
def test_cycles_on_two_processes_resume_exactly(world_dir, tmp_path, engine):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _run(world_dir, straight, "straight", *SHARDED[engine])
    _run(world_dir, resumed, "first", *SHARDED[engine])
    _run(world_dir, resumed, "resume", *SHARDED[engine])
    assert close(torch.load(straight / "w.pt"), torch.load(resumed / "w.pt")) == 0.0
    for rank in (0, 1):  # the reward models and their optimizers came back with the checkpoint
        assert close(_heads(straight, rank), _heads(resumed, rank)) == 0.0
    a, b = (json.loads((folder / "cycles.json").read_text())[-1] for folder in (straight, resumed))
    assert a == b


def test_siblings_are_the_same_whichever_process_plays_the_episode(world_dir):
    """A process playing questions 2-3 of a cycle (``first_group=2``) gets the siblings one process gets
    for those questions: the seeds follow the episode's place in the whole cycle."""
    method = load_method(
        "evo_rag-tiny",
        [
            f"train.model.path={world_dir / 'model'}",
            "rollout.max_turns=3",
            "rollout.temperature=1.0",
            "rollout.invalid_fallback=answer",
        ],  # an untrained policy writes no tag: its text is the answer
    )
    model, tokenizer = load_policy(method.train.model, torch.device("cpu"))
    backend = TransformersBackend(model, tokenizer)
    retriever = load_retriever(world_dir / "bm25")
    examples = read_examples(world_dir / "train.jsonl")[0][:4]
    rollout = method.make_rollout(backend, retriever)

    def play(questions, first_group, return_mode):  # noqa: ANN001, ANN202
        episodes = rollout.run(questions, n=1, seed=5, first_group=first_group)
        return sample_siblings(
            method, backend, retriever, episodes, questions, n_candidates=3, temperature=1.0, seed=5,
            ctx=RewardContext(), return_mode=return_mode,
        )  # fmt: skip

    for return_mode in ("prefix", "rollout"):
        whole = play(examples, 0, return_mode)
        share = play(examples[2:], 2, return_mode)
        tail = [s for s in whole if s.episode >= 2]
        assert len(share) == len(tail) > 0
        for a, b in zip(tail, share, strict=True):
            assert (a.episode - 2, a.step, a.prompt_ids) == (b.episode, b.step, b.prompt_ids)
            assert [c.token_ids for c in a.candidates] == [c.token_ids for c in b.candidates]
            returns = [c.rollout_return for c in b.candidates]
            assert [c.rollout_return for c in a.candidates] == pytest.approx(returns)
        assert sum(len(s.candidates) for s in whole) > len(whole)  # some state has siblings


@pytest.mark.slow
def test_the_reward_model_command_on_two_processes_trains_the_heads_of_one(world_dir, tmp_path):
    """``ragrl reward-model`` under torchrun: each process embeds half the pairs (13: shares of 7 and 6),
    the heads train on all of them, and the main process writes the heads one process would."""
    from safetensors.torch import load_file

    path = tmp_path / "pairs.jsonl"
    rows = [
        {"id": f"q{i % 5}#{i}", "prompt": f"Question {i}?", "chosen": f"<answer> Paris {i} </answer>",
         "rejected": "<answer> Lyon </answer>" if i % 3 else "no", "head_signs": {"format": (i % 3 > 0) - 0}}
        for i in range(13)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    outputs = {}
    for name, command in (("one", [sys.executable]), ("two", TWO_PROCESSES)):
        out = tmp_path / name
        args = ["-m", "ragrl", "reward-model", "--pairs", str(path), "--encoder", str(world_dir / "model"),
                "--out", str(out), "--heads", "answer,format", "--epochs", "4", "--val-fraction", "0.4",
                "--batch-size", "4"]  # fmt: skip
        run = subprocess.run([*command, *args], env=ENV, timeout=600, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-2000:]
        outputs[name] = (
            load_file(out / "heads.safetensors"),
            (out / "metrics.jsonl").read_text().splitlines(),
        )
    (heads_one, lines_one), (heads_two, lines_two) = outputs["one"], outputs["two"]
    assert close(heads_one, heads_two) < 1e-5
    assert len(lines_one) == len(lines_two) == 4
    for a, b in zip(map(json.loads, lines_one), map(json.loads, lines_two), strict=True):
        assert a.keys() == b.keys() and "val/accuracy/format" in a
        assert b == pytest.approx(a, rel=1e-5, abs=1e-6)
