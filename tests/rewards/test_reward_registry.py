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
    # a weight from the command line (--set reward.0.weight=...) is a finite number, or named
    with pytest.raises(RagrlError, match=r"reward\[1\] \(f1\): weight must be a number, got 'abc'"):
        build_reward([{"name": "em"}, {"name": "f1", "weight": "abc"}])
    for bad in ("nan", "1e400", float("inf")):
        with pytest.raises(RagrlError, match=r"reward\[0\] \(em\): weight must be finite"):
            build_reward([{"name": "em", "weight": bad}])
    assert build_reward([{"name": "em", "weight": "0.5"}]).components[0].weight == 0.5


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


def test_a_labelled_schedule_reports_its_multiplier_and_one_label_means_one_schedule():
    a_t = {"name": "sigmoid_decay", "center": 0.9, "width": 10, "label": "a_t"}
    reward = build_reward([{"name": "em"}, {"name": "f1", "weight": 0.6, "schedule": a_t}])
    assert reward.describe()[1]["schedule"]["label"] == "a_t"
    late = reward(_traj("Tolan"), EX, RewardContext(step=143, total_steps=144))
    assert late.factors == {"a_t": pytest.approx(0.192, abs=5e-4)}
    assert late.weights["f1"] == pytest.approx(0.6 * late.factors["a_t"])
    assert reward(_traj("Tolan"), EX).factors == {"a_t": 1.0}  # outside training
    assert build_reward([{"name": "em"}]).factors(RewardContext()) == {}
    other = {**a_t, "center": 0.5}
    with pytest.raises(RagrlError, match="the schedule label 'a_t' names two different schedules"):
        build_reward([{"name": "em", "schedule": a_t}, {"name": "f1", "schedule": other}])
    with pytest.raises(RagrlError, match="schedule label 'em' is already a reward component's key"):
        build_reward([{"name": "em"}, {"name": "f1", "schedule": {**a_t, "label": "em"}}])
    with pytest.raises(RagrlError, match="schedule label 'total' is already"):
        build_reward([{"name": "f1", "schedule": {**a_t, "label": "total"}}])
    with pytest.raises(RagrlError, match="label must be a non-empty string"):
        build_reward([{"name": "em", "schedule": {"name": "constant", "label": ""}}])


@register_reward("test_searched_per_step", per_step=True)
def searched_per_step(trajectory, example, ctx):
    """1 for every step that searched, 0 otherwise (one value per policy turn)."""
    return [1.0 if a.kind == "search" else 0.0 for a in trajectory.actions]


def test_evo_rag_step_weights_match_the_spec_table():
    from ragrl.rewards.registry import StepWeight

    beta_stage1 = StepWeight(early=2.0, late=1.0, horizon=20)
    kappa_stage2 = StepWeight(early=0.10, late=1.00, horizon=20)
    eta_stage2 = StepWeight(early=0.05, late=0.10, horizon=20)
    assert [beta_stage1(t) for t in (0, 5, 6, 10, 15, 19)] == pytest.approx([2.0, 1.75, 1.7, 1.5, 1.25, 1.05])
    assert [kappa_stage2(t) for t in (0, 5, 6, 10, 15, 19)] == pytest.approx(
        [0.1, 0.325, 0.37, 0.55, 0.775, 0.955]
    )
    assert eta_stage2(19) == pytest.approx(0.0975) and eta_stage2(40) == pytest.approx(0.10)  # p capped at 1


def test_per_step_rewards_give_every_step_its_reward_and_the_episode_its_return():
    reward = build_reward(
        [
            {"name": "test_searched_per_step", "step_weight": {"early": 2.0, "late": 1.0, "horizon": 2}},
            {"name": "em", "weight": 0.5},
        ]
    )
    assert reward.per_step and reward.describe()[0]["step_weight"] == {
        "early": 2.0,
        "late": 1.0,
        "horizon": 2,
    }
    traj = _traj("Tolan")  # a search (step 0), then the answer (step 1)
    traj.actions.insert(1, Action("search", "again", 1))  # search, search, answer
    (r,) = reward.score([traj], [EX])
    # step weights 2, 1.5, 1; searched 1, 1, 0; em 1 × 0.5 counts at the last step
    assert r.steps == pytest.approx([2.0, 1.5, 0.5]) and r.total == pytest.approx(4.0)
    assert r.step_components == {"test_searched_per_step": [1.0, 1.0, 0.0]}
    assert r.step_weights["test_searched_per_step"] == pytest.approx([2.0, 1.5, 1.0])
    assert r.step_weights["em"] == [0.0, 0.0, 0.5] and r.components == {
        "test_searched_per_step": 2.0,
        "em": 1.0,
    }


def test_per_step_errors():
    with pytest.raises(RagrlError, match=r"reward\[0\] \(em\): step_weight needs a per-step component"):
        build_reward([{"name": "em", "step_weight": {"early": 1, "late": 2, "horizon": 3}}])
    with pytest.raises(RagrlError, match="step_weight is"):
        build_reward([{"name": "test_searched_per_step", "step_weight": {"early": 1}}])

    if "test_bad_per_step" not in reward_names():

        @register_reward("test_bad_per_step", per_step=True)
        def bad(trajectory, example, ctx):
            return 1.0

    with pytest.raises(RagrlError, match="is per step: it must return a non-empty list"):
        build_reward([{"name": "test_bad_per_step"}])(_traj("Tolan"), EX)
