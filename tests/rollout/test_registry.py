"""The rollout registry: methods name their rollout; a registered rollout with one sample per step."""

from __future__ import annotations

import pytest

from ragrl.errors import RagrlError
from ragrl.methods import load_method
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.engine import RolloutEngine
from ragrl.rollout.registry import ROLLOUTS, Rollout, build_rollout, register_rollout
from ragrl.rollout.sample import Sample
from ragrl.rollout.trajectory import Segment, Trajectory


class PerTurnRollout(RolloutEngine):
    """The linear engine, but one training sample per policy turn: the prompt is everything the policy
    saw before that turn, the completion is the turn alone (the shape of a tree or agent rollout)."""

    def samples(self, episodes):  # noqa: ANN001, ANN201
        out = []
        for i, t in enumerate(episodes):
            context = list(t.prompt_ids)
            step = 0
            for seg in t.segments:
                if seg.kind == "policy":
                    out.append(
                        Sample(
                            prompt_ids=list(context),
                            completion_ids=list(seg.token_ids),
                            loss_mask=[1] * len(seg.token_ids),
                            completion_logprobs=list(seg.logprobs or [0.0] * len(seg.token_ids)),
                            group=int(t.metadata["group"]),
                            episode=i,
                            step=step,
                            example_id=t.example_id,
                        )
                    )
                    step += 1
                context += seg.token_ids
        return out


if "per_turn_test" not in ROLLOUTS:
    register_rollout("per_turn_test")(PerTurnRollout)


def _episode() -> Trajectory:
    return Trajectory(
        "q0",
        prompt_ids=[1, 2],
        segments=[
            Segment("policy", [10, 11], "ab", logprobs=[-0.1, -0.2]),
            Segment("env", [20, 21], "obs"),
            Segment("policy", [12], "c", logprobs=[-0.3]),
        ],
        metadata={"group": 3},
    )


def test_the_linear_engine_makes_one_sample_per_episode():
    engine = build_rollout(
        "multi_turn", backend=_NoBackend(), retriever=None, protocol=None, config=RolloutConfig()
    )
    assert isinstance(engine, RolloutEngine) and isinstance(engine, Rollout)
    (s,) = engine.samples([_episode()])
    assert (s.prompt_ids, s.completion_ids, s.loss_mask) == ([1, 2], [10, 11, 20, 21, 12], [1, 1, 0, 0, 1])
    assert s.completion_logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3]
    assert (s.group, s.episode, s.step, s.example_id) == (3, 0, 0, "q0")


def test_a_per_step_rollout_makes_one_sample_per_turn_with_its_context_as_prompt():
    rollout = build_rollout(
        "per_turn_test", backend=_NoBackend(), retriever=None, protocol=None, config=RolloutConfig()
    )
    first, second = rollout.samples([_episode(), _episode()])[:2]
    assert (first.prompt_ids, first.completion_ids, first.loss_mask, first.step) == (
        [1, 2],
        [10, 11],
        [1, 1],
        0,
    )
    # the second turn's prompt holds the first turn and the observation; only its own token is trained
    assert (second.prompt_ids, second.completion_ids, second.loss_mask, second.step) == (
        [1, 2, 10, 11, 20, 21],
        [12],
        [1],
        1,
    )
    assert second.completion_logprobs == [-0.3] and second.group == 3
    assert [s.episode for s in rollout.samples([_episode(), _episode()])] == [0, 0, 1, 1]


def test_the_rollout_kind_is_checked_when_the_config_loads():
    with pytest.raises(RagrlError, match=r"rollout.kind: unknown rollout 'tree'; registered: .*multi_turn"):
        load_method("search_r1-tiny", ["rollout.kind=tree"])
    method = load_method("search_r1-tiny", ["rollout.kind=per_turn_test"])
    assert isinstance(method.make_rollout(_NoBackend(), None), PerTurnRollout)
    assert type(load_method("search_r1-tiny").make_rollout(_NoBackend(), None)) is RolloutEngine


def test_a_sample_needs_one_mask_and_log_prob_per_token():
    with pytest.raises(ValueError, match="one entry per token"):
        Sample([1], [2, 3], [1], [0.0, 0.0], group=0)


class _NoBackend:
    tokenizer = None
