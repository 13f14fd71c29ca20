import pytest

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.rewards import RewardContext, build_reward, register_reward, reward_names
from ragrl.rollout.trajectory import Action, Trajectory

EX = Example("q1", "Who founded Zorvex Labs?", ["Mira Tolan", "Tolan"])


def _traj(answer):
    actions = [Action("search", "Zorvex Labs founder", 0, ["p1"], [3.2])]
    if answer is not None:
        actions.append(Action("answer", answer, 1))
    return Trajectory("q1", [1, 2], actions=actions, final_answer=answer)


def test_shared_answer_rewards_and_weighted_total():
    reward = build_reward(
        [
            {"name": "em", "weight": 1.0},
            {"name": "f1", "weight": 0.5},
            {"name": "em", "key": "em_exact", "weight": 0.0, "variant": "none"},
            {"name": "answered", "weight": 0.1},
        ]
    )
    result = reward(_traj("the mira tolan."), EX)
    assert result.components == {"em": 1.0, "f1": 1.0, "em_exact": 0.0, "answered": 1.0}
    assert result.total == pytest.approx(1.0 + 0.5 + 0.1)
    partial = reward(_traj("Mira Tolan Jr"), EX)
    # F1 vs "Mira Tolan": p = 2/3, r = 1 -> 0.8; vs "Tolan": p = 1/3, r = 1 -> 0.5
    assert partial.components["em"] == 0.0 and partial.components["f1"] == pytest.approx(0.8)
    assert partial.total == pytest.approx(0.5 * 0.8 + 0.1)
    none = reward(_traj(None), EX)
    assert none.total == 0.0 and none.components["answered"] == 0.0
    assert reward.keys == ["em", "f1", "em_exact", "answered"]


def test_spec_errors_name_the_entry():
    with pytest.raises(RagrlError, match=r"unknown reward 'nope'"):
        build_reward([{"name": "nope"}])
    with pytest.raises(RagrlError, match=r"reward\[0\] \(em\): unknown parameter 'varient'"):
        build_reward([{"name": "em", "varient": "arena"}])
    with pytest.raises(RagrlError, match=r"reward\[1\]: two components are reported as 'em'"):
        build_reward([{"name": "em"}, {"name": "em"}])
    with pytest.raises(RagrlError, match=r"reward\[0\]: missing 'name'"):
        build_reward([{"weight": 1.0}])


def test_methods_register_their_own_components_and_non_finite_values_are_errors():
    @register_reward("test_step_schedule")
    def step_schedule(trajectory, example, ctx, scale: float = 1.0):
        return scale * ctx.step / max(ctx.total_steps, 1)

    assert "test_step_schedule" in reward_names() and "em" in reward_names()
    reward = build_reward([{"name": "test_step_schedule", "scale": 2.0}])
    assert reward(_traj("x"), EX, RewardContext(step=5, total_steps=10)).total == pytest.approx(1.0)

    @register_reward("test_nan")
    def nan_reward(trajectory, example, ctx):
        return float("nan")

    with pytest.raises(RagrlError, match="returned nan for example 'q1'"):
        build_reward([{"name": "test_nan"}])(_traj("x"), EX)


BATCH_CALLS: list[int] = []


@register_reward("test_batched_length", batched=True)
def batched_length(trajectories, examples, ctx, per: float = 1.0):
    BATCH_CALLS.append(len(trajectories))
    return [per * len(t.final_answer or "") for t in trajectories]


def test_a_batched_component_sees_the_whole_batch_in_one_call():
    BATCH_CALLS.clear()
    reward = build_reward([{"name": "test_batched_length", "per": 0.5}, {"name": "em", "weight": 2.0}])
    results = reward.score([_traj("Mira Tolan"), _traj("Tolan"), _traj(None)], [EX, EX, EX])
    assert BATCH_CALLS == [3]
    assert [r.components["test_batched_length"] for r in results] == [5.0, 2.5, 0.0]
    assert [r.total for r in results] == [5.0 + 2.0, 2.5 + 2.0, 0.0]
    with pytest.raises(
        RagrlError, match=r"reward\[0\] \(test_batched_length\): unknown parameter 'trajectory'"
    ):
        build_reward([{"name": "test_batched_length", "trajectory": 1}])


def test_a_scheduled_weight_changes_with_training_progress():
    reward = build_reward(
        [{"name": "em"}, {"name": "f1", "weight": 0.6, "schedule": {"name": "sigmoid_decay", "center": 0.9}}]
    )
    assert reward.scheduled and reward.describe()[1]["schedule"] == {"name": "sigmoid_decay", "center": 0.9}
    early = reward(_traj("Tolan"), EX, RewardContext(step=0, total_steps=144))
    late = reward(_traj("Tolan"), EX, RewardContext(step=143, total_steps=144))
    assert early.weights["f1"] == pytest.approx(0.6 * 0.99988, abs=1e-4)
    assert late.weights["f1"] == pytest.approx(0.6 * 0.192, abs=5e-4) and late.weights["em"] == 1.0
    assert late.total == pytest.approx(1.0 + 0.6 * 0.192, abs=5e-4)
    with pytest.raises(RagrlError, match=r"reward\[0\] \(em\) schedule: unknown weight schedule 'nope'"):
        build_reward([{"name": "em", "schedule": {"name": "nope"}}])
