"""The GRPO trainer end to end on the test world: an update happens and is logged, resume is exact,
two processes compute the same first update as one, the watchdog stops on NaN."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ragrl.algos import register_advantage
from ragrl.algos.advantages import ADVANTAGES
from ragrl.data.io import read_examples
from ragrl.methods import load_method
from ragrl.rollout.outcomes import OUTCOMES
from ragrl.train.grpo import GRPOTrainer
from ragrl.train.setup import TrainingDiverged

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("grpo_run", HERE / "grpo_run.py")
grpo_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(grpo_run)
small_method = grpo_run.small_method

VOLATILE = {"time", "step_seconds", "rollout_seconds", "logprob_seconds", "update_seconds"}

# Two real processes on the CPU (gloo): torchrun starts them and accelerate joins them. (`accelerate
# launch --cpu --num_processes 2` starts ONE process on a machine without GPUs, whatever it is told.)
TWO_PROCESSES = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def weights(trainer: GRPOTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}


def records(run_dir: Path, kind: str = "train") -> list[dict]:
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["kind"] == kind:
            out.append({k: v for k, v in r.items() if k not in VOLATILE})
    return out


def test_steps_update_the_policy_and_log_diagnostics(world_dir, tmp_path):
    method = small_method(world_dir, tmp_path / "run", "train.steps=2", "train.data.eval_limit=5")
    method.train.data.eval = str(world_dir / "dev.jsonl")
    trainer = GRPOTrainer(method, method.train)
    before = weights(trainer)
    summary = trainer.train()

    after = weights(trainer)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    rows = records(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for key in (
        "reward", "reward/distinct_tokens", "reward/em", "group_reward_std", "zero_variance_frac", "loss",
        "clip_frac", "entropy", "grad_norm", "lr", "response_len", "searches", "answer_rate",
    ):  # fmt: skip
        assert key in rows[0], key
    assert rows[0]["group_reward_std"] > 0 and rows[0]["zero_variance_frac"] < 1.0
    assert 0 < rows[0]["entropy"] < 10 and rows[0]["grad_norm"] > 0
    # response length counts policy tokens only: at most max_turns × max_new_tokens
    assert 0 < rows[0]["response_len"] <= 2 * 12
    evals = records(tmp_path / "run", "eval")
    assert [e["phase"] for e in evals] == ["before", "after"] and evals[0]["eval/n"] == 5
    assert summary["n_eval"] == 5 and summary["steps"] == 2
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 2
    # the exported policy loads with the generation backend
    from ragrl.llm.hf_backend import TransformersBackend

    backend = TransformersBackend(tmp_path / "run" / "policy")
    loaded = backend.model.state_dict()
    assert all(torch.equal(loaded[k], after[k]) for k in loaded)
    assert (tmp_path / "run" / "samples.jsonl").read_text().count("\n") == 4  # the last step's first group


def test_resume_continues_exactly(world_dir, tmp_path):
    full = small_method(world_dir, tmp_path / "full")
    t = GRPOTrainer(full, full.train, eval_examples=[])
    t.train()
    expected = weights(t)

    part = small_method(world_dir, tmp_path / "part", "train.save_every=1")
    GRPOTrainer(part, part.train, eval_examples=[]).train(until=1)  # "stops" after step 1
    assert (tmp_path / "part" / "checkpoints" / "step-000001").is_dir()
    resumed = GRPOTrainer(part, part.train, eval_examples=[])
    resumed.train(resume="latest")

    got = weights(resumed)
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    assert records(tmp_path / "part") == records(tmp_path / "full")


def test_watchdog_stops_on_nan_and_keeps_the_last_good_checkpoint(world_dir, tmp_path):
    if "nan_for_test" not in ADVANTAGES.names():

        @register_advantage("nan_for_test")
        def nan_for_test(rewards, group_ids):  # noqa: ANN001, ANN202
            return torch.full_like(rewards, float("nan"))

    method = small_method(world_dir, tmp_path / "run", "train.save_every=1")
    trainer = GRPOTrainer(method, method.train, eval_examples=[])
    trainer.train(until=1)
    good = weights(trainer)
    trainer.config.grpo.advantage = "nan_for_test"
    with pytest.raises(TrainingDiverged, match=r"step 2: the gradient norm is nan.*step-000001"):
        trainer.step()
    assert all(torch.equal(good[k], v) for k, v in weights(trainer).items())  # the bad update was not applied


@pytest.mark.parametrize("extra", [[], ["train.grpo.whiten=token"]], ids=["grpo", "whitened"])
def test_two_processes_make_the_same_first_update_as_one(world_dir, tmp_path, extra):
    """The same update from one and two processes; whitened, the mean and std are over both."""
    script = str(HERE / "grpo_run.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    one = tmp_path / "one" / "w.pt"
    two = tmp_path / "two" / "w.pt"
    for out in (one, two):
        out.parent.mkdir()
    subprocess.run([sys.executable, script, str(world_dir), str(one), "1", *extra], check=True, env=env)
    launch = TWO_PROCESSES
    subprocess.run([*launch, script, str(world_dir), str(two), "1", *extra], check=True, env=env, timeout=300)
    assert (two.parent / "sampler-1.json").is_file()  # a second process really ran
    a, b = torch.load(one), torch.load(two)
    from safetensors.torch import load_file

    init = load_file(world_dir / "model" / "model.safetensors")
    assert max(float((a[k] - init[k]).abs().max()) for k in init) > 1e-4  # the update did move the weights
    # Adam's first step is about lr·g/(|g| + eps): where a gradient is near eps (1e-8), the reduction
    # order of two processes can move that one weight by ~1% of a step (lr = 1e-3). Every other weight
    # agrees to 1e-6; a wrong loss scale or a per-process normalisation would move most of them.
    diff = torch.cat([(a[k] - b[k]).abs().flatten() for k in a])
    assert float((diff <= 1e-6).float().mean()) > 0.9999 and float(diff.max()) < 1e-4, float(diff.max())


def test_two_processes_refill_and_train_stepwise_samples_in_step(world_dir, tmp_path):
    """Under accelerate with 2 processes, refill rounds are decided together (the samplers stay in
    step) and step-wise samples (uneven counts per process) train without a hang."""
    script = str(HERE / "grpo_run.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    out = tmp_path / "two" / "w.pt"
    out.parent.mkdir()
    launch = TWO_PROCESSES
    extra = [
        "rollout.kind=stepwise",
        "train.grpo.group_filter=drop_zero_variance",
        "train.grpo.refill_rounds=3",
    ]
    env["GRPO_RUN_REWARD"] = "em"  # EM alone: most groups all-wrong, so refill rounds are needed
    subprocess.run([*launch, script, str(world_dir), str(out), "2", *extra], check=True, env=env, timeout=300)
    ranks = [json.loads((out.parent / f"sampler-{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0] == ranks[1]  # the same sampler position and the same refill rounds on both
    assert sum(ranks[0]["refill_rounds"]) > 0  # refills really happened
    epoch, position = ranks[0]["sampler"]
    assert epoch * 400 + position > 2 * 4  # more questions were taken than the two steps' 4 each
    weights_after = torch.load(out)
    assert all(torch.isfinite(v).all() for v in weights_after.values())


class _PerTurnRollout:
    """A registered rollout that trains each policy turn as its own sample (the shape of the tree and
    agent methods): the linear engine plays, ``samples`` cuts every episode at its policy turns."""

    def __init__(self, backend, retriever, protocol, config) -> None:  # noqa: ANN001
        from ragrl.rollout.engine import RolloutEngine

        self.engine = RolloutEngine(backend, retriever, protocol, config)

    def run(self, examples, n=None, seed=None, *, first_group=0):  # noqa: ANN001, ANN201
        return self.engine.run(examples, n, seed, first_group=first_group)

    def samples(self, episodes):  # noqa: ANN001, ANN201
        from ragrl.rollout.sample import Sample

        out = []
        for i, t in enumerate(episodes):
            context = list(t.prompt_ids)
            for step, seg in enumerate(s for s in t.segments if s.kind == "policy"):
                start = t.segments.index(seg)
                context = list(t.prompt_ids) + [x for s in t.segments[:start] for x in s.token_ids]
                out.append(
                    Sample(context, list(seg.token_ids), [1] * len(seg.token_ids), list(seg.logprobs),
                           group=t.metadata["group"], episode=i, step=step, example_id=t.example_id)
                )  # fmt: skip
        return out


def test_a_method_rollout_with_one_sample_per_turn_trains_through_the_same_step(world_dir, tmp_path):
    from ragrl.rollout.registry import ROLLOUTS, register_rollout

    if "per_turn_grpo_test" not in ROLLOUTS:
        register_rollout("per_turn_grpo_test")(_PerTurnRollout)
    method = small_method(world_dir, tmp_path / "run", "rollout.kind=per_turn_grpo_test", "train.steps=1")
    trainer = GRPOTrainer(method, method.train, eval_examples=[])
    assert isinstance(trainer.rollout, _PerTurnRollout)
    before = weights(trainer)
    metrics = trainer.step()
    # 4 questions × 4 episodes, up to 2 policy turns each: more samples than episodes
    assert 16 < metrics["samples"] <= 32
    assert any(not torch.equal(before[k], v) for k, v in weights(trainer).items())


def test_per_token_advantages_equal_to_the_scalar_make_the_same_update(world_dir, tmp_path):
    """A list advantage (one per completion token) goes through the loss as [B, T]; the same value on
    every token is the scalar's update."""
    updates = []
    for per_token in (False, True):
        method = small_method(world_dir, tmp_path / f"run{per_token}", "train.steps=1")
        trainer = GRPOTrainer(method, method.train, eval_examples=[])
        episodes = trainer.rollout.run(trainer.train_examples[:2], n=2, seed=0)
        samples = trainer.rollout.samples(episodes)
        for k, s in enumerate(samples):
            a = [1.0, -1.0, 0.5, -0.5][k]
            s.advantage = [a] * len(s.completion_ids) if per_token else a
        trainer._update(samples)
        updates.append(weights(trainer))
    assert all(torch.allclose(updates[0][k], updates[1][k], atol=1e-7, rtol=0) for k in updates[0])


def _register_test_filters():
    from ragrl.algos import register_filter
    from ragrl.algos.filters import FILTERS

    if "odd_groups_test" not in FILTERS:

        @register_filter("odd_groups_test")
        def odd_groups(scores, group_ids):  # noqa: ANN001, ANN202
            return group_ids % 2 == 1

        @register_filter("drop_all_test")
        def drop_all(scores, group_ids):  # noqa: ANN001, ANN202
            return torch.zeros_like(group_ids, dtype=torch.bool)

        @register_filter("record_scores_test")
        def record(scores, group_ids):  # noqa: ANN001, ANN202
            RECORDED.append(scores.clone())
            return torch.ones_like(group_ids, dtype=torch.bool)


RECORDED: list[torch.Tensor] = []


def test_refill_plays_new_questions_until_enough_groups_survive(world_dir, tmp_path):
    """4 questions a step; the filter keeps odd group ids only: round 0 keeps groups 1 and 3, one refill
    round (groups 4-7) adds 5 and 7, and the update trains on those 4 groups."""
    _register_test_filters()
    method = small_method(world_dir, tmp_path / "a", "train.grpo.group_filter=odd_groups_test",
                          "train.grpo.refill_rounds=3")  # fmt: skip
    trainer = GRPOTrainer(method, method.train, eval_examples=[])
    m = trainer.step()
    assert m["refill_rounds"] == 1 and m["samples"] == 2 * 16
    assert m["kept_frac"] == pytest.approx(0.5)  # 16 of the 32 episodes played
    # without refill: the 2 surviving groups of round 0 only
    method = small_method(world_dir, tmp_path / "b", "train.grpo.group_filter=odd_groups_test")
    m = GRPOTrainer(method, method.train, eval_examples=[]).step()
    assert m["refill_rounds"] == 0 and m["samples"] == 16 and m["kept_frac"] == pytest.approx(0.5)


def test_refill_stops_at_its_bound_when_nothing_survives(world_dir, tmp_path):
    _register_test_filters()
    method = small_method(world_dir, tmp_path / "a", "train.grpo.group_filter=drop_all_test",
                          "train.grpo.refill_rounds=2")  # fmt: skip
    trainer = GRPOTrainer(method, method.train, eval_examples=[])
    before = weights(trainer)
    m = trainer.step()
    assert m["refill_rounds"] == 2 and m["samples"] == 3 * 16 and m["kept_frac"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in weights(trainer).items())  # nothing to learn from


def test_the_filter_reads_the_component_the_config_names(world_dir, tmp_path):
    from ragrl.errors import RagrlError

    _register_test_filters()
    RECORDED.clear()
    method = small_method(world_dir, tmp_path / "a", "train.grpo.group_filter=record_scores_test",
                          "train.grpo.group_filter_on=em")  # fmt: skip
    trainer = GRPOTrainer(method, method.train, eval_examples=[])
    trainer.step()
    (scores,) = RECORDED
    assert set(scores.tolist()) <= {0.0, 1.0}  # EM, not the distinct-token total
    with pytest.raises(RagrlError, match="group_filter_on: 'f1' is neither 'total' nor a reward component"):
        load_method("search_r1-tiny", ["train.grpo.group_filter_on=f1"])


def test_the_stepwise_rollout_trains_one_sample_per_turn(world_dir, tmp_path):
    from ragrl.rollout.stepwise import StepwiseRollout

    method = small_method(world_dir, tmp_path / "run", "rollout.kind=stepwise", "train.steps=1")
    trainer = GRPOTrainer(method, method.train, eval_examples=[])
    assert isinstance(trainer.rollout, StepwiseRollout)
    before = weights(trainer)
    metrics = trainer.step()
    assert 16 < metrics["samples"] <= 32
    assert any(not torch.equal(before[k], v) for k, v in weights(trainer).items())


def test_a_sample_is_rewarded_with_the_return_from_its_step():
    from ragrl.rollout.sample import Sample, return_to_go

    samples = [Sample([1], [2], [1], [0.0], group=0, step=k) for k in range(3)]
    assert [return_to_go(6.0, [1.0, 2.0, 3.0], x) for x in samples] == [6.0, 5.0, 3.0]
    assert return_to_go(0.7, None, samples[2]) == 0.7


class _ScriptedTreeRollout:
    """A two-level tree per question: G children of the prompt, then G children of the first child.
    One record per tree; one sample per node, grouped by (tree, level); a node trains on its own
    reward (the shape of R²AG's steering tree)."""

    def __init__(self, backend, retriever, protocol, config) -> None:  # noqa: ANN001
        self.backend, self.protocol, self.config = backend, protocol, config

    def run(self, examples, n=None, seed=None, *, first_group=0):  # noqa: ANN001, ANN201
        from ragrl.rollout.trajectory import Trajectory

        g_size = n or self.config.n
        params = self.config.sampling(self.config.max_new_tokens, self.protocol.stop, seed)
        trees = []
        for g, ex in enumerate(examples):
            prompt = self.protocol.prompt_ids(ex, self.backend.tokenizer)
            first = self.backend.generate([prompt] * g_size, params)
            second = self.backend.generate([prompt + list(first[0].token_ids)] * g_size, params)
            nodes = [
                {"level": 0, "parent": None, "ids": list(x.token_ids), "lp": list(x.logprobs)} for x in first
            ]
            nodes += [
                {"level": 1, "parent": 0, "ids": list(x.token_ids), "lp": list(x.logprobs)} for x in second
            ]
            trees.append(Trajectory(ex.id, list(prompt), metadata={"group": first_group + g, "nodes": nodes}))
        return trees

    def samples(self, episodes):  # noqa: ANN001, ANN201
        from ragrl.rollout.sample import Sample

        out = []
        for e, tree in enumerate(episodes):
            nodes = tree.metadata["nodes"]
            for i, node in enumerate(nodes):
                context = [] if node["parent"] is None else nodes[node["parent"]]["ids"]
                out.append(
                    Sample(tree.prompt_ids + context, node["ids"], [1] * len(node["ids"]), node["lp"],
                           group=2 * tree.metadata["group"] + node["level"], episode=e, step=i)
                )  # fmt: skip
        return out

    def sample_reward(self, total, steps, sample):  # noqa: ANN001, ANN201
        return steps[sample.step]  # the node's own reward, not a return


def test_a_tree_rollout_trains_each_node_in_its_level_group(world_dir, tmp_path):
    from ragrl.rewards import build_reward, register_reward, reward_names
    from ragrl.rollout.registry import ROLLOUTS, register_rollout

    if "tree_test" not in ROLLOUTS:
        register_rollout("tree_test")(_ScriptedTreeRollout)
    if "test_node_distinct" not in reward_names():

        @register_reward("test_node_distinct", per_step=True)
        def node_distinct(trajectory, example, ctx):  # noqa: ANN001, ANN202
            # a number that differs between sampled nodes, whatever the tokenizer (no zero-variance group)
            return [sum(n["ids"]) % 97 / 97 for n in trajectory.metadata["nodes"]]

    method = small_method(world_dir, tmp_path / "run", "rollout.kind=tree_test", "train.steps=1")
    method.reward = build_reward([{"name": "test_node_distinct"}])
    trainer = GRPOTrainer(method, method.train, eval_examples=[])
    trees = trainer.rollout.run(trainer.train_examples[:2], seed=0)
    samples = trainer.rollout.samples(trees)
    assert len(samples) == 2 * 8 and sorted({s.group for s in samples}) == [0, 1, 2, 3]
    child0 = trees[0].metadata["nodes"][0]["ids"]
    level1 = [s for s in samples if s.group == 1]
    assert len(level1) == 4 and all(s.prompt_ids == trees[0].prompt_ids + child0 for s in level1)
    assert all(s.loss_mask == [1] * len(s.completion_ids) for s in samples)
    before = weights(trainer)
    metrics = trainer.step()
    assert metrics["samples"] == 4 * 8  # 4 questions, 8 nodes each
    assert any(not torch.equal(before[k], v) for k, v in weights(trainer).items())


SEEN_WEIGHTS: list[dict] = []


def test_an_estimator_that_declares_weights_gets_the_scheduled_ones(world_dir, tmp_path):
    from ragrl.rewards import build_reward

    if "record_weights_test" not in ADVANTAGES:

        @register_advantage("record_weights_test")
        def record(rewards, group_ids, *, components, weights):  # noqa: ANN001, ANN202
            SEEN_WEIGHTS.append({"weights": dict(weights), "components": sorted(components)})
            return torch.zeros_like(rewards)

    SEEN_WEIGHTS.clear()
    method = small_method(world_dir, tmp_path / "w", "train.grpo.advantage=record_weights_test")
    method.reward = build_reward(
        [
            {"name": "em", "weight": 1.0},
            {"name": "distinct_tokens", "weight": 0.6, "schedule": {"name": "sigmoid_decay", "center": 0.9}},
        ]
    )
    GRPOTrainer(method, method.train, eval_examples=[]).step()
    [seen] = SEEN_WEIGHTS
    a_t = 1 / (1 + math.exp((1 - 0.9 * 3) / 10))  # step 1 of 3 (t counts from 1, as in the code)
    assert seen["components"] == ["distinct_tokens", "em"]
    assert seen["weights"]["em"] == 1.0
    assert seen["weights"]["distinct_tokens"] == pytest.approx(0.6 * a_t)


def test_whitening_normalises_what_reaches_the_update(world_dir, tmp_path):
    from ragrl.rollout.sample import Sample

    method = small_method(world_dir, tmp_path / "w", "train.grpo.whiten=sample")
    trainer = GRPOTrainer(method, method.train, eval_examples=[])

    def samples():  # noqa: ANN202
        return [
            Sample([1], [5] * n, [1] * n, [0.0] * n, group=0, episode=i, step=0, advantage=a)
            for i, (n, a) in enumerate([(1, 3.0), (3, -1.0), (4, 0.0)])
        ]

    by_sample = samples()
    trainer._whiten(by_sample, by_tokens=False)
    a = np.array([3.0, -1.0, 0.0])
    assert [s.advantage for s in by_sample] == pytest.approx(((a - a.mean()) / a.std()).tolist())
    by_token = samples()
    trainer._whiten(by_token, by_tokens=True)  # 1, 3 and 4 tokens
    tokens = np.repeat(a, [1, 3, 4])
    assert [s.advantage for s in by_token] == pytest.approx(((a - tokens.mean()) / tokens.std()).tolist())
    metrics = trainer.step()  # a whole step runs whitened
    assert math.isfinite(metrics["loss"])


def test_name_swap_renames_what_reaches_the_update_and_only_the_names(world_dir, tmp_path):
    method = small_method(world_dir, tmp_path / "n", "train.grpo.name_swap=1.0")
    trainer = GRPOTrainer(method, method.train, eval_examples=[])
    swap = trainer.name_swap
    assert swap is not None and swap.size > 100
    names = set(swap.spaced) | set(swap.bare)
    played = trainer._play(0, 4).samples
    renamed = trainer._renamed(played)
    assert [s.completion_ids for s in trainer._renamed(played)] == [s.completion_ids for s in renamed]
    changed = 0
    for before, after in zip(played, renamed, strict=True):
        old, new = before.prompt_ids + before.completion_ids, after.prompt_ids + after.completion_ids
        pairs = list(zip(old, new, strict=True))
        assert all(a == b for a, b in pairs if a not in names)  # only name tokens change
        mapping = {a: b for a, b in pairs if a in names}
        assert all(mapping[a] == b for a, b in pairs if a in names)  # consistently
        changed += any(a != b for a, b in mapping.items())
        for key in ("advantage", "loss_mask", "group"):
            assert getattr(after, key) == getattr(before, key)
    assert changed >= len(played) - 1  # every question names an entity
    seen = []
    update = trainer._update
    trainer._update = lambda samples: seen.append(samples) or update(samples)
    metrics = trainer.step()
    assert math.isfinite(metrics["loss"]) and seen and all(s.completion_ids for s in seen[0])
    assert metrics["kept_frac"] == 1.0  # keep_all: every episode reached the update, renamed or not


def test_name_swap_config_errors(world_dir, tmp_path):
    from ragrl.errors import RagrlError

    with pytest.raises(RagrlError, match=r"train.grpo.name_swap is a share of samples in \[0, 1\]"):
        small_method(world_dir, tmp_path / "a", "train.grpo.name_swap=2").train.validate()
    with pytest.raises(RagrlError, match="rollout log-probs no longer apply"):
        small_method(
            world_dir, tmp_path / "b", "train.grpo.name_swap=1", "train.grpo.old_logprobs=rollout"
        ).train.validate()
    method = small_method(
        world_dir, tmp_path / "c", "train.grpo.name_swap=1", f"train.sft.world={tmp_path / 'none.json'}"
    )
    with pytest.raises(RagrlError, match=r"train.grpo.name_swap needs the world's names: .*none.json"):
        GRPOTrainer(method, method.train, eval_examples=[])


def _evaluated_every_step(world_dir, out, *overrides):
    """A small GRPO run evaluated on the dev questions after every step, and its summary."""
    method = small_method(world_dir, out, "train.eval_every=1", *overrides)
    method.train.data.eval = str(world_dir / "dev.jsonl")
    return method, GRPOTrainer(method, method.train).train()


def test_patience_stops_a_run_without_a_new_best_and_a_resume_keeps_it_stopped(world_dir, tmp_path):
    # eval/n never changes, and a tie keeps the earlier best: the evaluation before training stays best
    method, summary = _evaluated_every_step(
        world_dir, tmp_path / "run", "train.steps=6", "train.data.eval_limit=2",
        "train.best_metric=eval/n", "train.patience=2",
    )  # fmt: skip
    assert summary["steps"] == 2 and summary["best"]["step"] == 0
    evals = records(tmp_path / "run", "eval")
    phases = [r["phase"] for r in evals]
    assert phases == ["before", "train", "train", "after"]
    # the run ended right after its step-2 evaluation: the same record, not a second evaluation
    assert {k: v for k, v in evals[3].items() if k != "phase"} == {
        k: v for k, v in evals[2].items() if k != "phase"
    }
    again = GRPOTrainer(method, method.train)
    assert again.train(resume="latest")["steps"] == 2
    assert [r["phase"] for r in records(tmp_path / "run", "eval")] == phases


def test_a_time_budget_ends_the_run_after_the_step_that_reaches_it_and_a_resume_keeps_it(world_dir, tmp_path):
    # a budget any step exceeds: the run ends after its first step, evaluated and saved as finished
    method = small_method(world_dir, tmp_path / "run", "train.steps=3", "train.max_seconds=1e-6")
    method.train.data.eval, method.train.data.eval_limit = str(world_dir / "dev.jsonl"), 2
    summary = GRPOTrainer(method, method.train).train()
    assert summary["steps"] == 1 and summary["stopped"] == "time"
    assert [r["phase"] for r in records(tmp_path / "run", "eval")] == ["before", "after"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["stopped"] == "time"
    assert (tmp_path / "run" / "policy" / "config.json").is_file()
    # resumed under the same budget it stays stopped; with the budget lifted it trains to the end
    assert GRPOTrainer(method, method.train).train(resume="latest")["steps"] == 1
    lifted = small_method(world_dir, tmp_path / "run", "train.steps=3", "train.max_seconds=0")
    summary = GRPOTrainer(lifted, lifted.train).train(resume="latest")
    assert summary["steps"] == 3 and "stopped" not in summary


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_a_bad_time_budget_is_refused_with_its_key(world_dir, tmp_path, value):
    from ragrl.errors import RagrlError

    with pytest.raises(RagrlError, match="train.max_seconds must be >= 0"):
        small_method(world_dir, tmp_path / "run", f"train.max_seconds={value}")


def test_an_outcome_share_is_logged_and_can_pick_the_best_policy(world_dir, tmp_path):
    _, summary = _evaluated_every_step(
        world_dir, tmp_path / "run", "train.steps=1", "train.data.eval_limit=3",
        "train.best_metric=eval/outcome/no_answer", "train.best_mode=min",
    )  # fmt: skip
    evals = records(tmp_path / "run", "eval")
    for e in evals:  # every outcome's share of the 3 questions, summing to 1
        shares = {k: v for k, v in e.items() if k.startswith("eval/outcome/")}
        assert len(shares) == len(OUTCOMES) and sum(shares.values()) == pytest.approx(1.0, abs=1e-3)
        assert all(round(3 * v, 3) == round(3 * v) for v in shares.values())
    assert summary["best"]["metric"] == "eval/outcome/no_answer"
    lowest = min(e["eval/outcome/no_answer"] for e in evals)  # min mode; a tie keeps the earlier policy
    first = next(e["step"] for e in evals if e["eval/outcome/no_answer"] == lowest)
    assert summary["best"] == {"step": first, "metric": "eval/outcome/no_answer", "value": lowest}


def test_patience_needs_a_best_metric(world_dir, tmp_path):
    from ragrl.errors import RagrlError

    with pytest.raises(RagrlError, match="train.patience must be >= 0 and needs train.best_metric"):
        small_method(world_dir, tmp_path / "run", "train.patience=2")


def test_train_answerable_only_leaves_the_unanswerable_questions_out_and_says_so(world_dir, tmp_path, capsys):
    from ragrl.data.io import read_examples
    from ragrl.errors import RagrlError

    questions, _ = read_examples(world_dir / "train.jsonl")
    unanswerable = {e.id for e in questions if not e.answerable}
    assert 0 < len(unanswerable) < len(questions)  # the test world has both kinds
    method = small_method(world_dir, tmp_path / "a", "train.data.train_answerable_only=true")
    trainer = GRPOTrainer(method, method.train, eval_examples=questions)
    kept = {e.id for e in trainer.train_examples}
    assert kept == {e.id for e in questions} - unanswerable
    assert len(trainer.eval_examples) == len(questions)  # the evaluation keeps every question
    out = capsys.readouterr().err  # the console writes to stderr
    assert f"training on {len(kept)} of {len(questions)} questions ({len(unanswerable)} marked" in out
    # the default trains on all of them
    method = small_method(world_dir, tmp_path / "b")
    assert len(GRPOTrainer(method, method.train, eval_examples=[]).train_examples) == len(questions)
    only_unanswerable = [e for e in questions if not e.answerable]
    method = small_method(world_dir, tmp_path / "c", "train.data.train_answerable_only=true")
    with pytest.raises(RagrlError, match=f"all {len(only_unanswerable)} training questions are marked"):
        GRPOTrainer(method, method.train, train_examples=only_unanswerable, eval_examples=[])


def test_rename_world_plays_each_step_in_a_renamed_world_and_evaluates_in_the_real_one(world_dir, tmp_path):
    from ragrl.rollout.scripted import ScriptedBackend
    from ragrl.train.augment import RenamedRetriever

    method = small_method(
        world_dir,
        tmp_path / "w",
        "train.grpo.rename_world=true",
        "train.eval_every=1",
        "train.data.eval_limit=2",
    )
    examples, _ = read_examples(world_dir / "dev.jsonl")
    trainer = GRPOTrainer(method, method.train, eval_examples=examples[:2])
    assert isinstance(trainer.rollout_retriever, RenamedRetriever)
    drawn, searched = [], []  # the worlds drawn, and what the real index returned (real queries)
    draw, search = trainer.world.draw, trainer.retriever.search
    trainer.world.draw = lambda rng: drawn.append(draw(rng)) or drawn[-1]
    trainer.retriever.search = lambda queries, k: (
        searched.append((queries, search(queries, k))) or searched[-1][1]
    )

    def policy(prompt_ids: list[int], index: int) -> str:  # search the question, then answer
        text = trainer.tokenizer.decode(prompt_ids)
        if "(Title:" in text:  # a search came back
            return "<answer> x </answer>"
        names = [w for w in text.split("Question:")[-1].split() if w.strip("?.,") in drawn[-1].inverse]
        return f"<search> {' '.join(w.strip('?.,') for w in names[:3])} </search>"  # the renamed names

    trainer.rollout = method.make_rollout(
        ScriptedBackend(trainer.tokenizer, policy), trainer.rollout_retriever
    )
    real = {e.id: e for e in trainer.train_examples}
    played = trainer._play(0, 4)
    (renaming,) = drawn
    for owner in played.owners:  # the questions and gold answers the reward read are the renamed ones
        assert owner.question == renaming.forward(real[owner.id].question) != real[owner.id].question
        assert owner.answers == [renaming.forward(a) for a in real[owner.id].answers]
    # the policy's queries were read back into the real names, and it read the hits renamed
    queries = [
        a.content for t in played.episodes for a in t.actions if a.kind == "search" and a.error is None
    ]
    asked = [q for batch, _ in searched for q in batch]
    assert queries and sorted(asked) == sorted(renaming.backward(q) for q in queries)
    seen = " ".join(s.text for t in played.episodes for s in t.segments if s.kind == "env")
    titles = {h.passage.title for _, found in searched for hits in found for h in hits}
    assert titles and all(f"(Title: {renaming.forward(title)})" in seen for title in titles)
    assert any(renaming.forward(title) != title for title in titles)
    assert trainer.rollout_retriever.renaming is None  # only the round's episodes play the renamed world
    # the same step of a rerun draws the same world; the next step another
    again = GRPOTrainer(method, method.train, eval_examples=[])
    again.world.draw = lambda rng: drawn.append(draw(rng)) or drawn[-1]
    again._play(0, 4)
    assert drawn[1].mapping == renaming.mapping
    trainer.step()  # step 0 again (the same world), then step 1's
    assert drawn[-1].mapping == renaming.mapping
    trainer._play(0, 4)
    assert drawn[-1].mapping != renaming.mapping
    # evaluation searches the real world (the real index, no renaming)
    searched.clear()
    trainer.backend = ScriptedBackend(trainer.tokenizer, policy)
    evaluated = trainer.evaluate("after")
    assert evaluated["eval/n"] == 2 and trainer.rollout_retriever.renaming is None
    questions = " ".join(e.question for e in examples[:2])
    asked = [q for batch, _ in searched for q in batch]
    assert asked and all(w in questions for q in asked for w in q.split())  # the real names, as written


def test_rename_world_config_errors(world_dir, tmp_path):
    from ragrl.errors import RagrlError

    method = small_method(
        world_dir, tmp_path / "c", "train.grpo.rename_world=true", f"train.sft.world={tmp_path / 'none.json'}"
    )
    with pytest.raises(RagrlError, match=r"train.grpo.rename_world needs the world's names: .*none.json"):
        GRPOTrainer(method, method.train, eval_examples=[])
    with pytest.raises(
        RagrlError, match=r"rename_world renames the worlds of GRPO's rollouts; train.algo 'cycles'"
    ):
        small_method(
            world_dir, tmp_path / "d", "train.grpo.rename_world=true", "train.algo=cycles"
        ).train.validate()
    r2ag = load_method(
        "r2ag-tiny",
        [
            f"train.model.path={world_dir / 'model'}",
            f"train.data.train={world_dir / 'train.jsonl'}",
            f"train.data.index={world_dir / 'bm25'}",
            f"train.out={tmp_path / 'e'}",
            "train.grpo.rename_world=true",
        ],
    )
    with pytest.raises(
        RagrlError, match="the r2ag method grows its next questions from each step's episodes"
    ):
        GRPOTrainer(r2ag, r2ag.train, eval_examples=[])


def test_a_recomputed_pi_old_is_compared_with_the_backends_logprobs_and_can_weight_the_loss(
    world_dir, tmp_path
):
    """With π_old recomputed, every step logs how far the backend's log-probs of its sampled tokens are
    from the trainer's (the transformers backend decodes with a KV cache, the trainer in one pass: the
    same up to float order); ``tis_cap`` weights the loss by the capped ratio, which here cuts nothing."""
    method = small_method(world_dir, tmp_path / "a", "train.steps=1", "train.grpo.old_logprobs=recompute")
    row = GRPOTrainer(method, method.train, eval_examples=[]).step()
    assert 0 <= row["engine/logprob_diff"] < 1e-4 and abs(row["engine/kl"]) < 1e-6
    assert 0 <= row["engine/prob_diff"] < 1e-4 and "engine/tis_cut_frac" not in row
    assert "engine/staleness" not in row  # the policy decodes: no engine to keep current
    method = small_method(world_dir, tmp_path / "b", "train.steps=1", "train.grpo.tis_cap=2")
    row = GRPOTrainer(method, method.train, eval_examples=[]).step()  # auto: recomputed for the weights
    assert row["engine/tis_cut_frac"] == 0.0 and row["engine/logprob_diff"] < 1e-4 and row["grad_norm"] > 0
    # the default (one update, no engine): π_old is π_θ detached and nothing is compared
    method = small_method(world_dir, tmp_path / "c", "train.steps=1")
    assert "engine/logprob_diff" not in GRPOTrainer(method, method.train, eval_examples=[]).step()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["train.engine.backend=sglang"],
            "train.engine.backend must be one of transformers, vllm, got 'sglang'",
        ),
        (["train.engine.sync_every=0"], "train.engine.sync_every must be >= 1, got 0"),
        (["train.grpo.tis_cap=0.5"], "train.grpo.tis_cap must be 0 .off. or >= 1"),
        (["train.grpo.tis_cap=2", "train.grpo.old_logprobs=rollout"], "with 'rollout'"),
        (["train.engine.backend=vllm", "train.algo=cycles"], "train.algo 'cycles' generates with the policy"),
        (["train.engine.backend=vllm", "train.parallel.mode=fsdp"], "not with train.model.lora nor"),
        (
            ["train.engine.backend=vllm", "train.engine.sync_every=3", "train.save_every=4"],
            r"train.save_every \(4\) must be a multiple of train.engine.sync_every \(3\)",
        ),
        (
            ["train.engine.backend=vllm", "train.grpo.old_logprobs=rollout"],
            "up to sync_every - 1 steps stale",
        ),
    ],
)
def test_engine_config_errors_name_the_key(world_dir, tmp_path, overrides, message):
    from ragrl.errors import RagrlError

    with pytest.raises(RagrlError, match=message):
        small_method(world_dir, tmp_path / "run", *overrides).train.validate()


class _ReportsLower:
    """The trainer's own backend, reporting every log-prob ``log 4`` lower: π_old / π_backend = 4."""

    def __init__(self, backend) -> None:  # noqa: ANN001
        self.backend, self.tokenizer = backend, backend.tokenizer

    def generate(self, prompts, params):  # noqa: ANN001, ANN201
        import dataclasses

        gens = self.backend.generate(prompts, params)
        return [dataclasses.replace(g, logprobs=[x - math.log(4) for x in g.logprobs]) for g in gens]


def test_truncated_importance_weights_reach_the_loss(world_dir, tmp_path):
    """Every token's ratio is 4, cut to the cap of 2: the gradient is exactly twice TIS-off's (no KL term,
    a pre-clip norm), and every token counts as cut."""
    rows = {}
    for cap in (0, 2):
        method = small_method(
            world_dir, tmp_path / f"cap{cap}", "train.steps=1", "train.grpo.old_logprobs=recompute",
            f"train.grpo.tis_cap={cap}",
        )  # fmt: skip
        trainer = GRPOTrainer(method, method.train, eval_examples=[])
        trainer.rollout = method.make_rollout(_ReportsLower(trainer.backend), trainer.rollout_retriever)
        rows[cap] = trainer.step()
        assert rows[cap]["engine/logprob_diff"] == pytest.approx(math.log(4), abs=1e-4)
    assert rows[2]["engine/tis_cut_frac"] == 1.0 and "engine/tis_cut_frac" not in rows[0]
    assert rows[2]["grad_norm"] == pytest.approx(2 * rows[0]["grad_norm"], rel=1e-4)


def test_tis_is_refused_where_the_backends_logprobs_do_not_describe_the_trained_tokens(world_dir, tmp_path):
    from ragrl.errors import RagrlError

    method = small_method(world_dir, tmp_path / "a", "train.grpo.tis_cap=2", "rollout.greedy_samples=1")
    with pytest.raises(RagrlError, match="a greedy token has no sampling probability"):
        GRPOTrainer(method, method.train, eval_examples=[])
    with pytest.raises(RagrlError, match="renamed tokens were not sampled"):
        small_method(
            world_dir, tmp_path / "b", "train.grpo.tis_cap=2", "train.grpo.name_swap=0.5"
        ).train.validate()
