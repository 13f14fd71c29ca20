"""R²AG's RR-Forest rounds (Algorithm 1, §3.3): what a rollout leaves for the next round, de-duplication,
rounds, the round limit, the forest's saved state, and GRPO training through the rounds with exact resume."""

from __future__ import annotations

import json

import pytest
import torch

from ragrl.data.io import read_examples
from ragrl.data.schema import Example
from ragrl.llm.hf_backend import load_tokenizer
from ragrl.methods import load_method
from ragrl.methods.r2ag.forest import RRForest, next_state
from ragrl.methods.r2ag.protocol import CONTEXT_KEY, parse_steering, step_actions
from ragrl.methods.r2ag.steering import SteererBackend, SteeringOracle, steering_text
from ragrl.methods.r2ag.tree import RRT, TREE_KEY
from ragrl.retrieval.base import load_retriever
from ragrl.rollout.trajectory import Segment, Trajectory
from ragrl.train.grpo import GRPOTrainer

GOLD = ["A", "B"]


def doc(i: str) -> dict[str, str]:
    return {"id": i, "title": f"T{i}", "text": f"text {i}"}


def root(i: str = "q1") -> Example:
    return Example(i, "Who is the mother of the director of X?", ["Ann"], supporting_ids=list(GOLD))


def rolled(state: Example, base: list[str], hits: dict[str, str], stop: bool = False) -> Trajectory:
    """A training rollout of ``state`` as ``R2agRollout`` records it (actions and the tree)."""
    text = steering_text(base, stop=stop)
    s = parse_steering(text)
    t = Trajectory(state.id, [], metadata={"steering_steps": 1})
    t.segments.append(Segment("policy", [], text, [], "eos"))
    t.actions = step_actions(s, 0, [[hits[q]] for _, q in s.queries])
    tree = RRT.from_records(state.question, state.metadata.get(TREE_KEY) or [])
    for q in base:
        tree.add(q, "base-Q", len(tree.vertices) + 1, [doc(hits[q])])
    t.metadata[TREE_KEY] = tree.to_records()
    return t


def test_a_rollout_leaves_a_pruned_tree_with_the_gold_it_found():
    state = root()
    child = next_state(
        rolled(state, ["who directed X", "when X"], {"who directed X": "A", "when X": "N"}), state, 1
    )
    assert [p["id"] for p in child.metadata[CONTEXT_KEY]] == ["A"]  # case (i): partial gold, no noise
    assert [(v["query"], v["new_gold"]) for v in child.metadata[TREE_KEY]] == [("who directed X", 1)]
    assert child.id.startswith("q1@r1-") and child.metadata["r2ag_root"] == "q1"
    nothing = next_state(rolled(state, ["when X"], {"when X": "N"}), state, 1)  # case (ii): root only
    assert nothing.metadata[CONTEXT_KEY] == [] and nothing.metadata[TREE_KEY] == []
    # case (iii): all gold, no stop -> a tree to learn to stop on; with the stop it is finished
    both = next_state(rolled(child, ["mother of Y"], {"mother of Y": "B"}), child, 2)
    assert [p["id"] for p in both.metadata[CONTEXT_KEY]] == ["A", "B"]
    assert [v["parent"] for v in both.metadata[TREE_KEY]] == [-1, -1]
    assert next_state(rolled(both, [], {}, stop=True), both, 3) is None
    # a premature stop (B missing) still leaves the gold it found
    early = next_state(rolled(state, ["who directed X"], {"who directed X": "A"}, stop=True), state, 1)
    assert [p["id"] for p in early.metadata[CONTEXT_KEY]] == ["A"]


def test_rounds_dedupe_fill_their_last_batch_and_stop_at_the_limit():
    forest = RRForest([root("q1"), root("q2"), root("q3")], max_rounds=2, seed=0)
    first = forest.take(2)
    second = forest.take(2)  # one tree left: the batch is filled with the round's first tree again
    assert len({e.id for e in first + second[:1]}) == 3 and second[1].id == first[0].id
    assert forest.done  # nothing grown yet
    found_a = rolled(first[0], ["who directed X"], {"who directed X": "A"})
    again_a = rolled(first[0], ["director of X"], {"director of X": "A"})
    finished = rolled(first[1], ["a", "b"], {"a": "A", "b": "B"}, stop=True)
    forest.add(forest.grow([found_a, again_a, finished], [first[0], first[0], first[1]]))
    kept = next(iter(forest.next.values()))
    assert [v["query"] for v in kept.metadata[TREE_KEY]] == ["who directed X"]  # the first of two duplicates
    assert forest.metrics() == {
        "forest/round": 0.0,
        "forest/trees": 3.0,
        "forest/next": 1.0,
        "forest/finished": 1.0,
    }
    assert not forest.done
    (child,) = forest.take(1)
    assert forest.round == 1 and child.metadata["r2ag_round"] == 1
    forest.add(forest.grow([rolled(child, ["x"], {"x": "N"})], [child]))
    assert forest.done  # round 1 was the last (max_rounds = 2), though a tree is left


def test_the_forest_state_is_json_and_resumes_exactly():
    forest = RRForest([root(f"q{i}") for i in range(5)], max_rounds=5, seed=3)
    batch = forest.take(2)
    forest.add(forest.grow([rolled(e, ["d"], {"d": "A"}) for e in batch], batch))
    state = json.loads(json.dumps(forest.state_dict()))
    twin = RRForest([root(f"q{i}") for i in range(5)], max_rounds=5, seed=3)
    twin.load_state_dict(state)
    for _ in range(3):
        assert [e.id for e in twin.take(2)] == [e.id for e in forest.take(2)]
    with pytest.raises(Exception, match="seeded 3, this run 4"):
        RRForest([root()], max_rounds=5, seed=4).load_state_dict(state)


def test_the_oracle_empties_the_forest_hop_by_hop(world_dir):
    examples, _ = read_examples(world_dir / "train.jsonl")
    bridge = [e for e in examples if e.metadata["type"] == "bridge" and e.metadata.get("answerable", True)][
        :6
    ]
    method = load_method("r2ag-tiny")
    backend = SteererBackend(load_tokenizer(world_dir / "model"), SteeringOracle())
    rollout = method.make_rollout(backend, load_retriever(world_dir / "bm25"))
    forest, rounds = RRForest(bridge, max_rounds=5, seed=0), []
    while not forest.done:
        batch = forest.take(3)
        episodes = rollout.run(batch, n=2, seed=0)
        forest.add(forest.grow(episodes, [batch[t.metadata["group"]] for t in episodes]))
        rounds.append(forest.round)
    # a tree of h hops takes h rounds to find its gold (each hop at top-1 here) and one more to stop; the 2
    # identical samples of each oracle step leave one tree (de-duplicated). Five 2-hop trees stop in
    # round 2 (2 samples each); the 3-hop one stops alone in round 3, in a batch filled to 3 trees.
    assert [e.metadata["hops"] for e in bridge] == [2, 2, 2, 2, 2, 3]
    assert rounds == [0, 0, 1, 1, 2, 2, 3] and forest.finished == 5 * 2 + 3 * 2


def tiny(world_dir, out, *extra):  # noqa: ANN001, ANN201
    return load_method(
        "r2ag-tiny",
        [
            f"train.model.path={world_dir / 'model'}",
            f"train.data.train={world_dir / 'train.jsonl'}",
            f"train.data.index={world_dir / 'bm25'}",
            f"train.out={out}",
            "train.steps=3",
            "train.grpo.prompts_per_step=2",
            "train.grpo.micro_batch_size=16",
            "train.eval_every=0",
            "rollout.n=4",
            "rollout.temperature=1.0",
            *extra,
        ],
    )


def test_grpo_trains_through_the_rounds_and_resumes_exactly(world_dir, tmp_path):
    train, _ = read_examples(world_dir / "train.jsonl")
    few = [e for e in train if e.metadata.get("answerable", True)][:3]
    full = tiny(world_dir, tmp_path / "full")
    trainer = GRPOTrainer(full, full.train, train_examples=few, eval_examples=[])
    trainer.train()
    expected = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    rows = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["kind"] == "train"]
    assert [r["forest/round"] for r in rows] == [0.0, 0.0, 1.0] and rows[0]["forest/trees"] == 3.0
    for key in ("reward/r2ag_multi_hit", "reward/r2ag_joint_hit", "reward/r2ag_ap", "reward/r2ag_format"):
        assert key in rows[0]
    part = tiny(world_dir, tmp_path / "part", "train.save_every=1")
    GRPOTrainer(part, part.train, train_examples=few, eval_examples=[]).train(until=2)
    resumed = GRPOTrainer(part, part.train, train_examples=few, eval_examples=[])
    resumed.train(resume="latest")
    got = resumed.policy.state_dict()
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    assert resumed.source.state_dict() == trainer.source.state_dict()


def test_training_refuses_refill_rounds_with_the_forest(world_dir, tmp_path):
    from ragrl.errors import RagrlError

    method = tiny(world_dir, tmp_path / "run", "train.grpo.refill_rounds=2")
    with pytest.raises(RagrlError, match="refill_rounds"):
        GRPOTrainer(method, method.train, eval_examples=[])


def test_a_run_ends_early_evaluated_and_saved_when_the_forest_is_empty(world_dir, tmp_path):
    train, _ = read_examples(world_dir / "train.jsonl")
    test, _ = read_examples(world_dir / "test.jsonl")
    few = [e for e in train if e.metadata.get("answerable", True)][:3]
    method = tiny(world_dir, tmp_path / "run", "train.steps=50", "rollout.rounds=1")
    summary = GRPOTrainer(method, method.train, train_examples=few, eval_examples=test[:2]).train()
    assert summary["steps"] == 2  # one round of 3 trees, 2 a step
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows if r["kind"] == "eval"] == ["before", "after"]
    assert (tmp_path / "run" / "checkpoints" / "step-000002").is_dir() and (
        tmp_path / "run" / "policy"
    ).is_dir()


def test_a_state_grows_its_pruned_tree_one_level_deeper(world_dir):
    examples, _ = read_examples(world_dir / "train.jsonl")
    ex = next(e for e in examples if e.metadata["type"] == "bridge" and e.metadata["hops"] == 3)
    method = load_method("r2ag-tiny")
    backend = SteererBackend(load_tokenizer(world_dir / "model"), SteeringOracle())
    rollout = method.make_rollout(backend, load_retriever(world_dir / "bm25"))
    state = RRForest([ex], max_rounds=5, seed=0).take(1)[0]
    depths = []
    for round_index in range(1, 3):
        (t,) = rollout.run([state], n=1, seed=0)
        state = next_state(t, state, round_index)
        depths.append([v["depth"] for v in state.metadata[TREE_KEY]])
    assert depths == [[1], [1, 2]]  # the oracle's hops found their gold at top-1 (a chain)
    assert [v["parent"] for v in state.metadata[TREE_KEY]] == [-1, 0]


@pytest.mark.slow  # 23 s of two processes: CI's slow phase runs it (the default run's 10 minutes)
def test_two_processes_grow_the_same_forest_as_one(world_dir, tmp_path):
    """Each process holds half of a step's trees; the next round's trees are gathered from both in
    process order, so both processes, and a single process, hold the same forest after every step."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = str(Path(__file__).parent / "r2ag_run.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    subprocess.run([sys.executable, script, str(world_dir), str(one), "2"], check=True, env=env, timeout=300)
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    subprocess.run([*launch, script, str(world_dir), str(two), "2"], check=True, env=env, timeout=300)
    single = json.loads((one / "forest-0.json").read_text())
    ranks = [json.loads((two / f"forest-{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1] == single
    # round 0 (6 trees, 4 a step) is used up and has left trees for round 1
    assert single["round"] == 0 and single["position"] == 6 and single["next"]
    a, b = torch.load(one / "weights.pt"), torch.load(two / "weights.pt")
    diff = torch.cat([(a[k] - b[k]).abs().flatten() for k in a])
    assert float((diff <= 1e-5).float().mean()) > 0.999 and float(diff.max()) < 1e-3, float(diff.max())
