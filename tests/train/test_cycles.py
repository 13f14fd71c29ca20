"""Preference cycles (EVO-RAG §3): sibling candidates scored as branches, the Δ / δ pair filters with the
spec's worked examples, and a cycle trainer that trains the reward models and the policy and resumes
exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ragrl.data.io import read_examples
from ragrl.data.schema import Example
from ragrl.llm.hf_backend import TransformersBackend
from ragrl.methods import load_method
from ragrl.retrieval.base import load_retriever
from ragrl.rewards.registry import RewardContext
from ragrl.rollout.trajectory import Action, Trajectory
from ragrl.train.cycles import CycleTrainer
from ragrl.train.setup import load_policy, make_accelerator
from ragrl.train.siblings import Candidate, VisitedState, policy_pairs, reward_model_pairs, sample_siblings


def _method(world: Path, run: Path, *extra: str):
    return load_method(
        "evo_rag-tiny",
        [
            f"train.model.path={world / 'model'}",
            f"train.out={run}",
            f"train.data.train={world / 'train.jsonl'}",
            f"train.data.index={world / 'bm25'}",
            "rollout.max_turns=3",
            "train.cycles.questions_per_cycle=4",
            "train.cycles.n_candidates=3",
            "train.dpo.batch_size=4",
            "train.stages=[]",
            "train.optim.lr=1e-3",
            *extra,
        ],
    )


def test_siblings_are_distinct_actions_scored_as_branches(world_dir):
    method = _method(world_dir, Path("unused"))
    model, tokenizer = load_policy(method.train.model, torch.device("cpu"))
    backend = TransformersBackend(model, tokenizer)
    retriever = load_retriever(world_dir / "bm25")
    examples = read_examples(world_dir / "train.jsonl")[0][:4]
    episodes = method.make_rollout(backend, retriever).run(examples, n=1, seed=3)
    results = method.reward.score(episodes, examples, RewardContext())
    states = sample_siblings(
        method, backend, retriever, episodes, examples, n_candidates=4, temperature=1.0, seed=3
    )
    assert len(states) == sum(len(e.actions) for e in episodes)
    for state in states:
        own = state.candidates[0]
        assert own.sampled and not any(c.sampled for c in state.candidates[1:])
        # the episode's own action, scored as a branch, gets exactly what the episode's reward gave it
        steps = results[state.episode].steps
        assert own.step_reward == pytest.approx(steps[state.step])
        assert own.prefix_return == pytest.approx(sum(steps[: state.step + 1]))
        keys = [(c.action.kind, c.action.content.lower()) for c in state.candidates]
        assert len(set(keys)) == len(keys) <= 4
        for c in state.candidates:
            assert len(c.branch.actions) == state.step + 1 and c.branch.actions[-1] is c.action
            assert c.weighted.keys() == set(method.reward.keys)
            assert sum(c.weighted.values()) == pytest.approx(c.step_reward)
            if c.action.kind == "search" and c.action.error is None:
                assert len(c.action.retrieved_ids) == method.rollout.k and c.branch.segments[-1].kind == "env"


def _state(returns: list[float], weighted: list[dict[str, float]] | None = None) -> VisitedState:
    state = VisitedState(0, 1, Example("q7", "Q?", ["a"]), [1, 2, 3])
    for i, r in enumerate(returns):
        c = Candidate([10 + i], [0.0], f"c{i}", Action("search", f"c{i}"), Trajectory("q7", []))
        c.prefix_return, c.weighted = r, (weighted[i] if weighted else {})
        state.candidates.append(c)
    return state


def test_pairs_follow_delta_and_the_margin_with_the_worked_examples():
    # §2.6 example 2 (Stage 1): answering now (0.031) against a redundant search (−2.0475): both filters pass
    ex2 = _state([-2.0475, 0.031])
    rm = reward_model_pairs([ex2], 0.3)
    assert [(p.pair.id, p.pair.margin) for p in rm] == [("q7#0.1.1.0", pytest.approx(2.0785))]
    assert [p.id for p in policy_pairs([ex2], 0.2)] == ["q7#0.1.1.0"]
    # example 3: a correct and a wrong answer differ by κ(1) = 0.0525 (0.145 in Stage 2): both dropped
    for gap in (0.0525, 0.145):
        ex3 = _state([0.0, gap])
        assert reward_model_pairs([ex3], 0.3) == [] and policy_pairs([ex3], 0.2) == []
    # three siblings: every pair over Δ for the reward model, only best-vs-worst for the policy
    three = _state([0.0, 1.0, 0.5])
    assert sorted(p.pair.id for p in reward_model_pairs([three], 0.3)) == [
        "q7#0.1.1.0",
        "q7#0.1.1.2",
        "q7#0.1.2.0",
    ]
    assert [p.id for p in policy_pairs([three], 0.2)] == ["q7#0.1.1.0"]


def test_per_component_labels_order_each_head_by_its_own_component():
    state = _state([1.0, 0.0], [{"ret": 1.7, "dup": -0.5}, {"ret": -1.7, "dup": 0.0}])
    (pair,) = reward_model_pairs([state], 0.3, "per_component")
    assert pair.pair.id == "q7#0.1.0.1" and pair.signs == {"ret": 1.0, "dup": -1.0}
    flat = _state([1.0, 0.0], [{"ret": 0.1, "dup": 0.1}, {"ret": 0.0, "dup": 0.0}])
    assert reward_model_pairs([flat], 0.3, "per_component") == []  # no component passes Δ


def _trainer(world: Path, run: Path) -> CycleTrainer:
    method = _method(world, run)
    acc = make_accelerator(method.train)
    model, tokenizer = load_policy(method.train.model, acc.device)
    return CycleTrainer(
        method, method.train, accelerator=acc, model=model, tokenizer=tokenizer, eval_examples=[]
    )


def _play_siblings(trainer: CycleTrainer, examples: list, seed: int, **kwargs) -> list[VisitedState]:
    """One episode per question with the trainer's policy, and three siblings at every visited state."""
    rollout = trainer.method.make_rollout(trainer.backend, trainer.retriever)
    episodes = rollout.run(examples, n=1, seed=seed)
    return sample_siblings(
        trainer.method, trainer.backend, trainer.retriever, episodes, examples,
        n_candidates=3, temperature=1.0, seed=seed, **kwargs,
    )  # fmt: skip


def test_a_cycle_trains_both_reward_models_and_the_policy_and_resumes_exactly(world_dir, tmp_path):
    whole = _trainer(world_dir, tmp_path / "whole")
    first = whole.step()
    assert first["states"] > 0 and first["rm_pairs"] > 0 and first["policy_pairs"] > 0
    assert first["dpo/updates"] >= 1 and 0.0 < first["dpo/loss"] < 1.0
    assert {"rm/multi/train/loss", "rm/single/train/loss"} <= first.keys()
    assert sorted(whole.reward_models) == ["multi", "single"]
    assert whole.reward_models["multi"][0].head_names == ["ret", "act", "dup", "bt", "ref", "step", "ans"]
    assert sum(v for k, v in first.items() if k.startswith("pairs/")) == first["policy_pairs"]
    whole.save()
    second = whole.step()

    resumed = _trainer(world_dir, tmp_path / "whole")
    resumed.load("latest")
    again = resumed.step()
    timing = ("step_seconds", "seconds_rollout")
    assert again.keys() == second.keys()
    for key in second.keys() - set(timing):
        assert again[key] == pytest.approx(second[key], rel=1e-5, abs=1e-7), key
    for (name, (a, _)), (_, (b, _)) in zip(
        sorted(whole.reward_models.items()), sorted(resumed.reward_models.items()), strict=True
    ):
        assert torch.allclose(a.heads.weight, b.heads.weight, atol=1e-6), name
    for pa, pb in zip(whole.policy.parameters(), resumed.policy.parameters(), strict=True):
        assert torch.allclose(pa, pb, atol=1e-6)


def test_the_cycles_config_is_checked_when_it_loads(world_dir):
    from ragrl.errors import RagrlError

    with pytest.raises(RagrlError, match="train.algo"):
        load_method("evo_rag-tiny", ["train.algo=ppo"])
    with pytest.raises(RagrlError, match="policy_pair_scorer"):
        load_method("evo_rag-tiny", ["train.cycles.policy_pair_scorer=judge"])
    with pytest.raises(RagrlError, match="n_candidates"):
        load_method("evo_rag-tiny", ["train.cycles.n_candidates=1"])


def test_the_reward_model_can_score_the_policy_pairs(world_dir, tmp_path):
    trainer = _trainer(world_dir, tmp_path / "rm")
    trainer.step()  # trains the reward models
    states = _play_siblings(trainer, read_examples(world_dir / "train.jsonl")[0][4:7], seed=9)
    trainer._score_with_reward_model(states)
    scores = [c.rm_score for s in states for c in s.candidates]
    assert len(set(scores)) > 1  # the heads score the candidates, differently
    for pair in policy_pairs(states, 0.0, "rm_score"):
        prefix, i, j = pair.id.rsplit(".", 2)
        state = next(s for s in states if s.pair_prefix == prefix)
        assert state.candidates[int(i)].rm_score == max(c.rm_score for c in state.candidates)
        assert state.candidates[int(j)].rm_score == min(c.rm_score for c in state.candidates)


def test_a_sibling_search_runs_only_where_the_engine_would_run_it():
    from ragrl.rollout.config import RolloutConfig
    from ragrl.train.siblings import _not_executed

    open_end = RolloutConfig(max_turns=4, final_answer_turn=True)
    closed = RolloutConfig(max_turns=4, final_answer_turn=False)
    assert _not_executed(3, "stop", open_end, object()) == ""
    assert _not_executed(4, "stop", open_end, object()) == "not executed: no turn left"  # the forced turn
    assert _not_executed(3, "stop", closed, object()) == "not executed: no turn left"
    assert _not_executed(1, "eos", closed, object()) == "not executed: the turn ended with EOS"
    assert _not_executed(1, "stop", closed, None) == "no retriever"


def test_a_sibling_backtrack_is_carried_out_as_the_engine_would(world_dir):
    from ragrl.rollout.scripted import ScriptedBackend

    method = _method(world_dir, Path("unused"))
    _, tokenizer = load_policy(method.train.model, torch.device("cpu"))
    retriever = load_retriever(world_dir / "bm25")
    examples = read_examples(world_dir / "train.jsonl")[0][:1]
    script = {"mode": "play"}

    def policy(prompt_ids, index):  # the episode searches, then answers; every sibling backtracks
        if script["mode"] == "siblings":
            return "<backtrack/>"
        return (
            "<answer> x </answer>"
            if "</information>" in tokenizer.decode(prompt_ids[-3:])
            else "<search> a </search>"
        )

    backend = ScriptedBackend(tokenizer, policy)
    episodes = method.make_rollout(backend, retriever).run(examples, n=1, seed=1)
    assert [a.kind for a in episodes[0].actions] == ["search", "answer"]
    script["mode"] = "siblings"
    states = sample_siblings(
        method, backend, retriever, episodes, examples, n_candidates=2, temperature=1.0, seed=1
    )
    first, second = (s.candidates[1] for s in states)
    # at step 0 there is nothing to take back: invalid, answered with the corrective, no r_bt
    assert (first.action.kind, first.action.error) == ("invalid", "backtrack: nothing to take back")
    assert first.branch.segments[-1].text == method.protocol.corrective(first.action)
    assert first.weighted["bt"] == 0.0
    # at step 1 it takes back the search: r_bt = -1, weighted by δ(1)
    assert second.action.kind == "backtrack" and second.weighted["bt"] < 0
    # under invalid_fallback: answer an unreadable sibling is an answer, as the live rollout reads it
    method = _method(world_dir, Path("unused"), "rollout.invalid_fallback=answer")
    script["mode"] = "play"
    episodes = method.make_rollout(backend, retriever).run(examples, n=1, seed=1)
    script["mode"] = "siblings"
    policy_fn = backend.policy_fn
    backend.policy_fn = lambda prompt_ids, index: "it is no"  # no action tag, ends with EOS
    states = sample_siblings(
        method, backend, retriever, episodes, examples, n_candidates=2, temperature=1.0, seed=1
    )
    backend.policy_fn = policy_fn
    for state in states:
        sibling = state.candidates[1]
        assert (sibling.action.kind, sibling.action.content) == ("answer", "it is no")
        assert sibling.branch.final_answer == "it is no" and "ans" in sibling.weighted


def test_resuming_an_episode_prefix_replays_the_episode(world_dir):
    """The step-wise engine rebuilt from a recorded prefix (its context, a backtrack's effect) and played
    on with the same seeds gives back the very episode the prefix was cut from."""
    method = _method(world_dir, Path("unused"), "rollout.max_turns=5", "rollout.temperature=1.0")
    model, tokenizer = load_policy(method.train.model, torch.device("cpu"))
    rollout = method.make_rollout(TransformersBackend(model, tokenizer), load_retriever(world_dir / "bm25"))
    examples = read_examples(world_dir / "train.jsonl")[0][:6]
    episodes = rollout.run(examples, n=1, seed=11)
    from ragrl.train.siblings import visited_states

    states = [
        s
        for s in visited_states(rollout, episodes, examples)
        if s.step < len(episodes[s.episode].actions) - 1
    ]
    assert states, "no episode had two steps"
    prefixes = [s.candidates[0].branch for s in states]
    for prefix in prefixes:
        prefix.metadata["sample"] = 0
    replayed = rollout.resume(prefixes, [s.example for s in states], seed=11)
    for state, again in zip(states, replayed, strict=True):
        original = episodes[state.episode]
        assert [a.kind for a in again.actions] == [a.kind for a in original.actions]
        assert [s.token_ids for s in again.segments] == [s.token_ids for s in original.segments]
        assert again.metadata["contexts"] == original.metadata["contexts"]
        assert again.final_answer == original.final_answer


def test_rollout_returns_credit_a_step_with_where_it_leads(world_dir, tmp_path):
    trainer = _trainer(world_dir, tmp_path / "rollout")
    trainer.config.cycles.return_mode = "rollout"
    method = trainer.method
    states = _play_siblings(
        trainer, read_examples(world_dir / "train.jsonl")[0][:3], seed=5, return_mode="rollout"
    )
    for state in states:
        for c in state.candidates:
            if method.protocol.is_final(c.action):
                assert c.rollout_return == pytest.approx(c.prefix_return)  # nothing follows an answer
    assert any(c.rollout_return != pytest.approx(c.prefix_return) for s in states for c in s.candidates)
    out = trainer.step()
    assert out["states"] > 0


def test_a_cycle_without_an_encoder_for_its_reward_model_is_refused_before_it_plays(world_dir, tmp_path):
    from ragrl.errors import RagrlError

    method = _method(world_dir, tmp_path / "run", "train.dpo.reference_free=true")
    acc = make_accelerator(method.train)
    model, tokenizer = load_policy(method.train.model, acc.device)
    with pytest.raises(RagrlError, match="the reward model embeds with the frozen reference"):
        CycleTrainer(
            method, method.train, accelerator=acc, model=model, tokenizer=tokenizer, eval_examples=[]
        )
