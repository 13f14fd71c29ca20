"""R²AG's retrieval tree (§1) and the rollout that grows it: Top-Survivor (§2), the stop rules, the
scripted steerers (the gold-decomposition oracle and single-step retrieval), one training step."""

from __future__ import annotations

import pytest

from ragrl.data.io import read_examples
from ragrl.data.schema import Example, SubQuestion
from ragrl.eval.runner import evaluate
from ragrl.llm.hf_backend import TransformersBackend, load_tokenizer
from ragrl.methods import load_method
from ragrl.methods.r2ag.protocol import CONTEXT_KEY, R2agProtocol, parse_steering
from ragrl.methods.r2ag.rewards import trajectory_step_rewards
from ragrl.methods.r2ag.steering import SingleStepSteering, SteererBackend, SteeringOracle, steering_text
from ragrl.methods.r2ag.tree import RRT, split_steps, tree_diagnostics
from ragrl.retrieval.base import load_retriever


def doc(i: str, text: str = "") -> dict[str, str]:
    return {"id": i, "title": i, "text": text or f"{i} text"}


def test_parents_are_the_vertex_whose_documents_the_query_continues():
    tree = RRT("Who is the mother of the director of Xanadu?")
    a = tree.add("Who directed Xanadu?", "base-Q", 1, [doc("A", "Xanadu was directed by Yolanda Brik.")])
    tree.add("When was Xanadu released?", "base-Q", 1, [doc("N", "Other film, 1990.")])
    b = tree.add(
        "Who is the mother of Yolanda Brik?", "base-Q", 2, [doc("B", "Yolanda Brik's mother is Ann.")]
    )
    c = tree.add("Where does Ann live?", "predicted-Q", 2, [doc("C", "Ann lives in Oslo.")])
    assert (a.parent, b.parent) == (-1, 0)
    assert c.parent == -1  # "Ann" is in a document of the same depth only: no earlier vertex holds it
    assert [d["id"] for d in tree.documents()] == ["A", "N", "B", "C"]


def test_pruning_keeps_the_gold_branches_and_their_ancestors():
    tree = RRT("q")
    tree.add("q1", "base-Q", 1, [doc("A", "alpha beta")])  # 0: no new gold itself, a parent of gold
    tree.add("q2", "base-Q", 1, [doc("N")])  # 1: noise
    tree.add("alpha beta q3", "base-Q", 2, [doc("B")])  # 2: child of 0, new gold
    tree.vertices[2].new_gold = 1
    pruned = tree.prune()
    assert [v.query for v in pruned.vertices] == ["q1", "alpha beta q3"]
    assert [v.parent for v in pruned.vertices] == [-1, 0]
    assert RRT.from_records("q", pruned.to_records()).to_records() == pruned.to_records()


@pytest.fixture(scope="module")
def world(world_dir):
    examples, _ = read_examples(world_dir / "test.jsonl")
    return {
        "tokenizer": load_tokenizer(world_dir / "model"),
        "retriever": load_retriever(world_dir / "bm25"),
        "examples": [e for e in examples if e.metadata.get("answerable", True)][:40],
        "dir": world_dir,
    }


def play(world, steerer, *overrides, examples=None):  # noqa: ANN001, ANN201
    method = load_method("r2ag-tiny", ["rollout.max_new_tokens=200", *overrides])
    backend = SteererBackend(world["tokenizer"], steerer)
    return method, evaluate(backend, world["retriever"], method, examples or world["examples"])


def test_the_oracle_follows_the_decomposition_hop_by_hop_and_beats_single_step_retrieval(world):
    _, oracle = play(world, SteeringOracle(), "rollout.top_t=null", "rollout.top_t_pred=null")
    _, single = play(world, SingleStepSteering(), "rollout.k=5")
    assert oracle.scores["tree_recall"] >= 0.9
    assert single.scores["tree_recall"] < oracle.scores["tree_recall"] - 0.2
    assert single.scores["docs"] == pytest.approx(5.0, abs=0.2) and single.scores["iterations"] == 1.0
    for t, ex in zip(oracle.trajectories, world["examples"], strict=True):
        d = tree_diagnostics(t, ex)
        # a bridge question asks one hop per step, a comparison both sides at once; then a stop step
        steps = ex.metadata["hops"] + 1 if ex.metadata["type"] == "bridge" else 2
        assert d["iterations"] == steps and d["stopped"] == 1.0 and d["llm_calls"] == steps
        assert t.finish_reason == "stop"


def test_the_oracle_orders_musique_steps_by_their_references():
    ex = Example(
        "m", "Q?", ["c"], supporting_ids=["a", "b", "c"],
        decomposition=[SubQuestion("Who made X?", ["Ann"]), SubQuestion("Where is Y?", ["Oslo"]),
                       SubQuestion("Where was #1 born near #2?", ["c"])],
    )  # fmt: skip
    oracle = SteeringOracle()
    first = parse_steering(oracle.steer(ex, [], []))
    assert first.base == ("Who made X?", "Where is Y?")
    second = parse_steering(oracle.steer(ex, [], [first]))
    assert second.base == ("Where was Ann born near Oslo?",) and not second.stop
    assert parse_steering(oracle.steer(ex, [], [first, second])).stop


class Writes:
    """A steerer that writes the same output at every step."""

    def __init__(self, base, predicted=(), stop=False, think="t"):  # noqa: ANN001
        self.text = steering_text(base, predicted, stop=stop, think=think)

    def steer(self, example, context, history):  # noqa: ANN001, ANN201
        return self.text


def test_top_survivor_keeps_the_first_t_of_each_kind(world):
    ex = world["examples"][0]
    subs = [s.question for s in ex.decomposition]  # words the tiny tokenizer knows
    base, predicted = [subs[0], subs[1], ex.question], [subs[1], subs[0]]
    _, report = play(
        world,
        Writes(base, predicted, stop=True),
        "rollout.top_t=1",
        "rollout.top_t_pred=1",
        "rollout.k=2",
        examples=[ex],
    )
    (t,) = report.trajectories
    kept = [
        (a.kind, a.tag, a.content, len(a.retrieved_ids)) for a in t.actions if a.kind in ("search", "pruned")
    ]
    assert kept == [
        ("search", "base-Q", subs[0], 2), ("pruned", "base-Q", subs[1], 0),
        ("pruned", "base-Q", ex.question, 0), ("search", "predicted-Q", subs[1], 2),
        ("pruned", "predicted-Q", subs[0], 0),
    ]  # fmt: skip
    _, base_only = play(
        world, Writes(base, predicted, stop=True), "rollout.top_t=2", "rollout.use_pred=false", examples=[ex]
    )
    kinds = [(a.kind, a.tag) for a in base_only.trajectories[0].actions if a.kind in ("search", "pruned")]
    assert kinds == [("search", "base-Q")] * 2 + [("pruned", "base-Q")] + [("pruned", "predicted-Q")] * 2


def test_a_tree_ends_on_stop_after_retrieving_what_was_written_beside_it_or_at_the_iteration_cap(world):
    ex = world["examples"][0]
    _, stop = play(world, Writes([ex.question], stop=True), examples=[ex])
    (t,) = stop.trajectories
    assert t.finish_reason == "stop" and [a.kind for a in t.actions] == ["think", "search", "stop"]
    _, never = play(world, Writes([ex.question]), "rollout.max_iterations=3", examples=[ex])
    (t,) = never.trajectories
    assert t.finish_reason == "max_iterations" and t.truncated and t.metadata["steering_steps"] == 3
    _, unreadable = play(world, Writes([], think="I found it."), examples=[ex])
    assert unreadable.trajectories[0].finish_reason == "invalid"
    assert unreadable.trajectories[0].metadata["steering_steps"] == 1


def test_a_tree_splits_into_the_steps_training_sees(world):
    method, report = play(world, SteeringOracle(), examples=world["examples"][:6])
    protocol: R2agProtocol = method.protocol
    for tree, ex in zip(report.trajectories, world["examples"][:6], strict=True):
        steps = split_steps(tree)
        assert len(steps) == tree.metadata["steering_steps"]
        context: list[dict[str, str]] = []
        for s in steps:
            state = Example(
                ex.id,
                ex.question,
                ex.answers,
                supporting_ids=ex.supporting_ids,
                metadata={CONTEXT_KEY: context},
            )
            assert s.prompt_ids == protocol.prompt_ids(state, world["tokenizer"])
            context = context + [
                {"id": p.id, "title": p.title, "text": p.text}
                for a in s.actions if a.kind == "search" for p in _passages(world, a)
                if p.id not in {c["id"] for c in context}
            ]  # fmt: skip
        per_step = [r for s in steps for r in trajectory_step_rewards(s, ex)]
        assert per_step == trajectory_step_rewards(tree, ex)


def _passages(world, action):  # noqa: ANN001, ANN202
    by_id = {}
    (hits,) = world["retriever"].search([action.content], len(action.retrieved_ids))
    for h in hits:
        by_id[h.passage.id] = h.passage
    return [by_id[i] for i in action.retrieved_ids]


def test_training_retrieves_every_candidate_unless_told_to_cut(world):
    ex = world["examples"][0]
    subs = [s.question for s in ex.decomposition]
    steerer = Writes([subs[0], subs[1], ex.question], [subs[1]])
    for survivors, kinds in ((False, ["search"] * 4), (True, ["search", "pruned", "pruned", "search"])):
        method = load_method(
            "r2ag-tiny",
            ["rollout.top_t=1", "rollout.top_t_pred=1", f"rollout.survivors_in_training={survivors}"],
        )
        rollout = method.make_rollout(SteererBackend(world["tokenizer"], steerer), world["retriever"])
        (t,) = rollout.run([ex], n=1, seed=0)
        assert [a.kind for a in t.actions if a.kind in ("search", "pruned")] == kinds


def test_the_oracle_asks_again_what_top_survivor_left_out(world):
    ex = next(e for e in world["examples"] if e.metadata["type"] == "comparison")
    _, cut = play(world, SteeringOracle(), "rollout.top_t=1", examples=[ex])
    (t,) = cut.trajectories
    asked = [(a.turn, a.content) for a in t.actions if a.kind == "search"]
    subs = [s.question for s in ex.decomposition]
    assert asked == [(0, subs[0]), (1, subs[1])]  # both sides of the comparison, one a step
    assert t.finish_reason == "stop" and t.metadata["steering_steps"] == 3


def test_a_tree_whose_prompt_outgrows_the_budget_ends_there(world):
    ex = world["examples"][0]
    first = len(R2agProtocol().prompt_ids(ex, world["tokenizer"]))
    _, report = play(
        world, Writes([ex.question]), f"rollout.max_prompt_tokens={first + 5}", "rollout.k=2", examples=[ex]
    )
    (t,) = report.trajectories
    assert t.finish_reason == "prompt_limit" and t.truncated and t.metadata["steering_steps"] == 1


def test_few_shot_steering_shows_the_oracles_steps(world):
    from ragrl.methods.r2ag.steering import few_shot

    method = load_method("r2ag-tiny")
    pool, _ = read_examples(world["dir"] / "train.jsonl")
    protocol, records = few_shot(
        method, world["tokenizer"], method.prepare_examples(pool, "pool"), world["retriever"], 3
    )
    first, later, stop = protocol.shots
    assert first[0].metadata[CONTEXT_KEY] == [] and parse_steering(first[1]).base
    assert later[0].metadata[CONTEXT_KEY] and parse_steering(later[1]).base
    assert parse_steering(stop[1]).stop and len(records) == 3
    messages = protocol.messages(world["examples"][0])
    assert [m["role"] for m in messages] == ["user", "assistant"] * 3 + ["user"]
    assert (
        messages[1]["content"] == first[1]
        and messages[-1] == method.protocol.messages(world["examples"][0])[0]
    )


def test_one_training_step_samples_a_group_and_retrieves_every_candidate(world):
    method = load_method("r2ag-tiny", ["rollout.top_t=1", "rollout.n=3", "rollout.temperature=1.0"])
    backend = TransformersBackend(str(world["dir"] / "model"), device="cpu")
    rollout = method.make_rollout(backend, world["retriever"])
    examples = world["examples"][:2]
    episodes = rollout.run(examples, seed=5)
    assert [t.metadata["group"] for t in episodes] == [0, 0, 0, 1, 1, 1]
    samples = rollout.samples(episodes)
    for t, s in zip(episodes, samples, strict=True):
        assert t.metadata["steering_steps"] == 1 and len(t.segments) == 1
        assert s.completion_ids == t.segments[0].token_ids and all(s.loss_mask)
        assert s.prompt_ids == method.protocol.prompt_ids(examples[s.group], backend.tokenizer)
    again = rollout.run(examples, seed=5)
    assert [t.segments[0].token_ids for t in again] == [t.segments[0].token_ids for t in episodes]


def test_the_reader_answers_from_the_tree(world):
    method = load_method("r2ag-tiny", ["rollout.read=true", "rollout.max_iterations=2"])
    backend = TransformersBackend(str(world["dir"] / "model"), device="cpu")
    report = evaluate(backend, world["retriever"], method, world["examples"][:3])
    for t, ex in zip(report.trajectories, world["examples"][:3], strict=True):
        steps = t.metadata["steering_steps"]
        assert len([s for s in t.segments if s.kind == "policy"]) == steps + 1
        assert tree_diagnostics(t, ex)["llm_calls"] == steps + 1
    assert "em" in report.scores and "tree_recall" in report.scores


def test_the_readers_answer_is_its_answer_block_else_its_first_line():
    from ragrl.methods.r2ag.rollout import reader_answer

    assert reader_answer("<answer> Oslo </answer>", "Oslo") == "Oslo"
    assert reader_answer("It is Oslo.\nBecause ...<|im_end|>", "It is Oslo.\nBecause ...") == "It is Oslo."
    assert reader_answer("<|im_end|>", "") is None
