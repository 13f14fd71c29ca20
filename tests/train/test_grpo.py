"""The GRPO trainer end to end on the test world: an update happens and is logged, resume is exact,
two processes compute the same first update as one, the watchdog stops on NaN."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from ragrl.algos import register_advantage
from ragrl.algos.advantages import ADVANTAGES
from ragrl.methods import load_method
from ragrl.train.grpo import GRPOTrainer
from ragrl.train.setup import TrainingDiverged

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("grpo_run", HERE / "grpo_run.py")
grpo_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(grpo_run)
small_method, weights, records = grpo_run.small_method, grpo_run.weights, grpo_run.records
_spec = importlib.util.spec_from_file_location("launch", HERE / "launch.py")
launch = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launch)


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


@pytest.mark.parametrize(
    "extra",
    [
        # 45 s of two processes: slow, for the default run's 10 minutes (CI runs both; the default run keeps
        # tests/train/test_cli.py's two-process run)
        pytest.param([], id="grpo", marks=pytest.mark.slow),
        pytest.param(launch.WHITENED, id="whitened", marks=pytest.mark.slow),
    ],
)
def test_two_processes_make_the_same_first_update_as_one(world_dir, extra, launched):
    """The same update from one and two processes; whitened, the mean and std are over both."""
    one, two = (launched("update", "1", *extra, processes=n) / "w.pt" for n in (1, 2))
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


def test_two_processes_refill_and_train_stepwise_samples_in_step(launched):
    """Under accelerate with 2 processes, refill rounds are decided together (the samplers stay in
    step) and step-wise samples (uneven counts per process) train without a hang."""
    out = launched("update-em", "2", *launch.REFILL) / "w.pt"  # EM alone: most groups all wrong, refills
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
