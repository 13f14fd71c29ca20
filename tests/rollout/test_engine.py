"""The batched multi-turn rollout engine on a small BM25 index with scripted policies."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ragrl.errors import RagrlError
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.engine import turn_seed

_spec = importlib.util.spec_from_file_location("rollout_world", Path(__file__).parent / "scripted_world.py")
world = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(world)
bm25 = world.bm25  # the module's BM25 index fixture
TOK, EOS, PASSAGES, PROTOCOL = world.TOK, world.EOS, world.PASSAGES, world.PROTOCOL
TWO_SEARCHES = world.TWO_SEARCHES
example, script, engine, turn_of = world.example, world.script, world.engine, world.turn_of


def test_two_searches_then_answer(bm25, counting_retriever):
    retr = counting_retriever(bm25)
    eng, backend = engine(script(TWO_SEARCHES), retr)
    [traj] = eng.run([example()])
    assert [s.kind for s in traj.segments] == ["policy", "env", "policy", "env", "policy"]
    assert [s.text for s in traj.segments if s.kind == "policy"] == TWO_SEARCHES
    assert [s.finish_reason for s in traj.segments if s.kind == "policy"] == ["stop", "stop", "stop"]
    assert traj.queries == ["Alan Turing born", "London capital city England"]
    assert traj.actions[0].retrieved_ids[0] == PASSAGES[0].id
    assert traj.actions[1].retrieved_ids[0] == PASSAGES[1].id
    assert len(traj.actions[0].retrieved_scores) == len(traj.actions[0].retrieved_ids) <= 3
    assert traj.final_answer == "England" and traj.finish_reason == "answer" and not traj.truncated
    assert [a.kind for a in traj.actions] == ["search", "search", "answer"]
    assert [a.turn for a in traj.actions] == [0, 1, 2]
    # observations: exactly the protocol's rendering of the hits, tokenized once
    hits = bm25.search(["Alan Turing born"], 3)[0]
    obs = PROTOCOL.observation(traj.actions[0], hits)
    assert traj.segments[1].text == obs
    assert traj.segments[1].token_ids == TOK.encode(obs, add_special_tokens=False)
    assert obs.startswith("\n<information>Doc 1 (Title: Alan Turing) Alan Turing was born")
    # tokens in / tokens out: policy tokens as generated, mask 1 on them only
    expected_mask = []
    for s in traj.segments:
        expected_mask += [1 if s.kind == "policy" else 0] * len(s.token_ids)
        if s.kind == "policy":
            assert TOK.decode(s.token_ids, skip_special_tokens=False) == s.text
            assert s.logprobs == [0.0] * len(s.token_ids)
    assert traj.loss_mask == expected_mask
    assert traj.prompt_ids == PROTOCOL.prompt_ids(example(), TOK)
    assert traj.metadata["group"] == 0 and traj.metadata["sample"] == 0
    assert set(traj.timings) == {"generate", "retrieve", "total"}
    assert traj.timings["total"] >= traj.timings["generate"] >= 0
    # one generate call and one search call per turn
    assert len(backend.calls) == 3 and len(retr.calls) == 2
    assert backend.calls[0][1].stop == ("</search>", "</answer>")


def test_prompts_are_prompt_plus_segments(bm25):
    seen: list[list[int]] = []

    def policy(prompt_ids, index):
        seen.append(list(prompt_ids))
        return script(TWO_SEARCHES)(prompt_ids, index)

    eng, _ = engine(policy, bm25)
    [traj] = eng.run([example()])
    full = traj.prompt_ids + traj.completion_ids
    assert [len(p) for p in seen] == [
        len(traj.prompt_ids),
        len(traj.prompt_ids) + sum(len(s.token_ids) for s in traj.segments[:2]),
        len(traj.prompt_ids) + sum(len(s.token_ids) for s in traj.segments[:4]),
    ]
    for p in seen:
        assert full[: len(p)] == p


def test_invalid_action_gets_corrective(bm25):
    turns = ["<think> hmm </think> <search>   </search>", "<answer> England </answer>"]
    eng, _ = engine(counted(turns), bm25)  # the corrective has no </information>
    [traj] = eng.run([example()])
    assert [s.kind for s in traj.segments] == ["policy", "env", "policy"]
    bad = traj.actions[0]
    assert bad.kind == "invalid" and bad.error == "empty query"
    assert traj.segments[1].text == PROTOCOL.corrective(bad)
    assert "empty query" in traj.segments[1].text
    assert traj.num_invalid == 1 and traj.final_answer == "England"


def test_turn_cut_by_max_new_tokens_is_recorded_and_corrected(bm25):
    calls = []

    def policy(prompt_ids, index):
        calls.append(1)
        return "word " * 200 if len(calls) == 1 else "<answer> England </answer>"

    eng, backend = engine(policy, bm25, max_new_tokens=10)
    [traj] = eng.run([example()])
    first = traj.segments[0]
    assert first.finish_reason == "length" and len(first.token_ids) == 10
    assert traj.actions[0].kind == "invalid" and traj.segments[1].kind == "env"
    assert traj.finish_reason == "answer"


def test_max_invalid_limit(bm25):
    eng, _ = engine(lambda p, i: "<search></search>", bm25, max_invalid=2)
    [traj] = eng.run([example()])
    assert traj.finish_reason == "invalid_limit" and traj.num_invalid == 2 and not traj.truncated


def test_max_turns(bm25):
    eng, backend = engine(lambda p, i: "<search> Alan Turing </search>", bm25, max_turns=3)
    [traj] = eng.run([example()])
    assert traj.finish_reason == "max_turns" and traj.truncated and traj.final_answer is None
    assert [s.kind for s in traj.segments] == ["policy", "env", "policy", "env", "policy"]
    # the last turn's search is recorded but not executed (no turn would read it)
    assert traj.actions[-1].kind == "search" and traj.actions[-1].retrieved_ids == []
    assert traj.actions[-1].error is not None
    assert len(backend.calls) == 3


def test_final_answer_turn(bm25):
    def policy(prompt_ids, index):
        return "<search> Alan Turing </search>" if turn_of(prompt_ids) < 2 else "<answer> England </answer>"

    eng, backend = engine(policy, bm25, max_turns=2, final_answer_turn=True)
    [traj] = eng.run([example()])
    assert len(backend.calls) == 3
    assert [s.kind for s in traj.segments] == ["policy", "env", "policy", "env", "policy"]
    assert traj.finish_reason == "answer" and traj.final_answer == "England"
    assert traj.metadata["forced_answer"]  # it reached the step limit, then answered

    eng, _ = engine(lambda p, i: "<search> Alan Turing </search>", bm25, max_turns=2, final_answer_turn=True)
    [traj] = eng.run([example()])
    assert traj.finish_reason == "max_turns" and traj.truncated
    assert len([s for s in traj.segments if s.kind == "policy"]) == 3
    assert traj.segments[-1].kind == "policy"  # the final turn's search is not executed


def test_max_total_tokens(bm25):
    turn = "<search> Alan Turing born </search>"
    budget = len(TOK.encode(turn, add_special_tokens=False)) + 5  # the observation cannot fit
    eng, backend = engine(lambda p, i: turn, bm25, max_total_tokens=budget)
    [traj] = eng.run([example()])
    assert len(traj.completion_ids) == budget
    assert traj.finish_reason == "max_tokens" and traj.truncated
    assert traj.segments[-1].kind == "env" and traj.segments[-1].truncated


def test_per_turn_allowance_shrinks_to_budget(bm25):
    eng, backend = engine(
        lambda p, i: "<think> x </think> <search> Paris </search>",
        bm25,
        max_total_tokens=60,
        max_obs_tokens=20,
    )
    [traj] = eng.run([example()])
    assert len(traj.completion_ids) <= 60
    used = 0
    segs = iter(traj.segments)
    for _n_prompt, params in backend.calls:
        assert params.max_new_tokens == min(128, 60 - used)
        # advance past this turn's segments
        for s in segs:
            used += len(s.token_ids)
            if s.kind == "env":
                break
    assert traj.finish_reason == "max_tokens"


def counted(turns: list[str]):
    """A single-episode policy that writes turns[i] at its i-th call."""
    calls = []

    def policy(prompt_ids, index):
        calls.append(1)
        return turns[min(len(calls), len(turns)) - 1]

    return policy


def test_an_invalid_turn_is_resampled_before_it_counts(bm25):
    # two episodes in one batch: the first writes two invalid turns before a search, the second is
    # valid at once; resample_invalid=2 regenerates only the invalid row, one batched call per attempt
    tries: dict[int, int] = {}

    def policy(prompt_ids, index):
        if turn_of(prompt_ids) > 0:
            return "<answer> England </answer>"
        q = 0 if "Turing" in TOK.decode(prompt_ids) else 1
        tries[q] = tries.get(q, 0) + 1
        if q == 1:
            return "<search> Paris capital </search>"
        return ["no action here", "<search> </search>", "<search> Alan Turing born </search>"][tries[q] - 1]

    eng, backend = engine(policy, bm25, resample_invalid=2, seed=3)
    first, second = eng.run([example(0), example(1, "What is Paris?")])
    assert [a.kind for a in first.actions] == ["search", "answer"] and first.num_invalid == 0
    assert [a.kind for a in second.actions] == ["search", "answer"] and "resampled" not in second.metadata
    discarded = first.metadata["resampled"]
    assert [(d["turn"], d["error"]) for d in discarded] == [
        (0, "no <search> or <answer> block"),
        (0, "empty query"),
    ]
    assert discarded[0]["text"].startswith("no action here") and discarded[1]["text"] == "<search> </search>"
    # the record holds the kept turn only, and its step context is the prompt
    assert [s.kind for s in first.segments] == ["policy", "env", "policy"]
    assert first.segments[0].text == "<search> Alan Turing born </search>"
    # turn 0 (2 rows), then a resample of 1 row with its own seed stream, another, then turn 1
    assert [n for n, _ in backend.calls] == [2, 1, 1, 2]
    assert len({p.seeds for _, p in backend.calls[:3]}) == 3


def test_resampling_that_stays_invalid_counts_once_and_gets_the_corrective(bm25):
    turns = ["<search> </search>", "<answer> </answer>", "<answer> England </answer>"]
    eng, backend = engine(counted(turns), bm25, resample_invalid=1)
    [traj] = eng.run([example()])
    assert [a.kind for a in traj.actions] == ["invalid", "answer"] and traj.num_invalid == 1
    assert [(d["text"], d["error"]) for d in traj.metadata["resampled"]] == [
        ("<search> </search>", "empty query")
    ]
    assert traj.segments[0].text == "<answer> </answer>" and traj.actions[0].error == "empty answer"
    assert traj.segments[1].text == PROTOCOL.corrective(traj.actions[0])
    # at temperature 0 a resample would repeat itself: none is made
    turns = ["<search> </search>", "<answer> England </answer>"]
    eng, backend = engine(counted(turns), bm25, resample_invalid=3, temperature=0.0)
    [traj] = eng.run([example()])
    assert [a.kind for a in traj.actions] == ["invalid", "answer"] and "resampled" not in traj.metadata


def test_an_invalid_turn_can_be_taken_as_the_answer(bm25):
    eng, _ = engine(counted(["<think> it is England </think> England, surely </search>"]), bm25,
                    invalid_fallback="answer", max_turns=3)  # fmt: skip
    [traj] = eng.run([example()])
    assert traj.final_answer == "England, surely" and traj.finish_reason == "answer"
    assert [a.kind for a in traj.actions] == ["answer"] and traj.metadata["fallback_answers"] == [0]
    # a turn that ends with EOS: the EOS token is not part of the answer
    eng, _ = engine(counted(["England, surely"]), bm25, invalid_fallback="answer")
    [traj] = eng.run([example()])
    assert traj.segments[0].text.endswith(TOK.eos_token) and traj.final_answer == "England, surely"
    # a turn with nothing after its thinking stays invalid and gets the corrective
    eng, _ = engine(counted(["<think> hmm </think></answer>", "<answer> England </answer>"]), bm25,
                    invalid_fallback="answer")  # fmt: skip
    [traj] = eng.run([example()])
    assert [a.kind for a in traj.actions] == ["invalid", "answer"]
    # so does a thought that never closes (a turn cut inside <think>): a thought is not an answer
    eng, _ = engine(counted(["<think> maybe England </search>", "<answer> England </answer>"]), bm25,
                    invalid_fallback="answer")  # fmt: skip
    [traj] = eng.run([example()])
    assert [a.kind for a in traj.actions] == ["invalid", "answer"] and "fallback_answers" not in traj.metadata
    # a saved completion replays the same way when asked to
    from ragrl.rollout.replay import trajectory_from_completion

    text = "<think> it is England </think> England, surely </search>"
    assert trajectory_from_completion("q", text, PROTOCOL, fallback=True).final_answer == "England, surely"
    assert trajectory_from_completion("q", text, PROTOCOL).final_answer is None
    with pytest.raises(RagrlError, match="invalid_fallback must be one of corrective, answer"):
        RolloutConfig(invalid_fallback="guess")
    with pytest.raises(RagrlError, match="resample_invalid must be >= 0"):
        RolloutConfig(resample_invalid=-1)


def test_max_obs_tokens(bm25):
    # a cut observation loses its closing </information>: count calls, not observations
    eng, _ = engine(counted(TWO_SEARCHES), bm25, max_obs_tokens=7)
    [traj] = eng.run([example()])
    envs = [s for s in traj.segments if s.kind == "env"]
    assert len(envs) == 2 and all(len(s.token_ids) == 7 and s.truncated for s in envs)
    assert envs[0].text == TOK.decode(envs[0].token_ids, skip_special_tokens=False)
    assert traj.finish_reason == "answer" and not traj.truncated


def test_eos_without_answer(bm25):
    eng, _ = engine(lambda p, i: "<think> I give up </think>", bm25)
    [traj] = eng.run([example()])
    assert traj.finish_reason == "eos" and not traj.truncated and traj.final_answer is None
    assert traj.segments[-1].token_ids[-1] == EOS and traj.segments[-1].finish_reason == "eos"
    assert traj.segments[-1].text.endswith(TOK.eos_token)
    assert len(traj.segments) == 1 and traj.actions[0].kind == "invalid"


def test_batching_one_call_per_turn_and_groups(bm25, counting_retriever):
    # example i searches i times before answering
    examples = [
        example(i, q) for i, q in enumerate(["Who was Alan Turing?", "What is Paris?", "Who is Ada?"])
    ]
    searches = {0: 0, 1: 1, 2: 2}
    by_prompt = {tuple(PROTOCOL.prompt_ids(ex, TOK)): i for i, ex in enumerate(examples)}

    def policy(prompt_ids, index):
        ex = next(i for key, i in by_prompt.items() if tuple(prompt_ids[: len(key)]) == key)
        return (
            "<search> Paris capital </search>"
            if turn_of(prompt_ids) < searches[ex]
            else "<answer> x </answer>"
        )

    retr = counting_retriever(bm25)
    eng, backend = engine(policy, retr)
    trajs = eng.run(examples, n=2, seed=5)
    assert [t.example_id for t in trajs] == ["q0", "q0", "q1", "q1", "q2", "q2"]
    assert [(t.metadata["group"], t.metadata["sample"]) for t in trajs] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
        (2, 0),
        (2, 1),
    ]
    assert [t.num_searches for t in trajs] == [0, 0, 1, 1, 2, 2]
    # turn 0: all 6 active; turn 1: 4; turn 2: 2 -> three generate calls, two search calls
    assert [n for n, _ in backend.calls] == [6, 4, 2]
    assert [len(q) for q in retr.calls] == [4, 2]
    assert [p.seed for _, p in backend.calls] == [turn_seed(5, t) for t in range(3)]
    assert all(t.finish_reason == "answer" for t in trajs)


def test_greedy_samples_decode_greedily_beside_the_sampled_ones(bm25):
    eng, backend = engine(script(TWO_SEARCHES), bm25, n=3, greedy_samples=1, temperature=0.8, seed=2)
    trajs = eng.run([example(0), example(1, "What is Paris?")])
    assert [t.metadata.get("greedy", False) for t in trajs] == [True, False, False, True, False, False]
    # each turn: one call for the 2 greedy episodes at temperature 0, one for the 4 sampled ones
    calls = [(n, p.temperature) for n, p in backend.calls]
    assert calls == [(2, 0.0), (4, 0.8)] * 3
    from ragrl.rollout.engine import episode_seed

    # each episode keeps its own seed, whichever call it is in
    assert backend.calls[1][1].seeds == tuple(episode_seed(2, 0, g, s) for g in (0, 1) for s in (1, 2))
    assert all(t.final_answer == "England" for t in trajs)
    # with resampling on, an invalid greedy turn is not resampled (it would repeat itself)
    eng, backend = engine(lambda p, i: "<search> </search>", bm25, n=2, greedy_samples=1, resample_invalid=2,
                          max_turns=1)  # fmt: skip
    greedy, sampled = eng.run([example()])
    assert "resampled" not in greedy.metadata and len(sampled.metadata["resampled"]) == 2
    assert [(n, p.temperature) for n, p in backend.calls] == [(1, 0.0), (1, 1.0), (1, 1.0), (1, 1.0)]
    with pytest.raises(RagrlError, match="greedy_samples must be >= 0"):
        RolloutConfig(greedy_samples=-1)


def test_config_n_and_seed_defaults(bm25):
    eng, backend = engine(script(TWO_SEARCHES), bm25, n=3, seed=None)
    trajs = eng.run([example()])
    assert len(trajs) == 3 and backend.calls[0][1].seed is None
    assert turn_seed(1, 0) != turn_seed(0, 1) and turn_seed(3, 2) == turn_seed(3, 2)
