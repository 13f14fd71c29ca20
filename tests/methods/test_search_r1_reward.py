import pytest

from ragrl.data.schema import Example
from ragrl.methods.search_r1 import SearchR1Config
from ragrl.rewards import build_reward
from ragrl.rollout.search_protocol import well_formed_turn
from ragrl.rollout.trajectory import Action, Segment, Trajectory

EX = Example("q1", "Where was the founder of Zorvex Labs born?", ["Tamrin"])


@pytest.mark.parametrize(
    ("text", "final", "ok"),
    [
        ("<think> need founder </think>\n<search> Who founded Zorvex Labs? </search>", False, True),
        ("<search>Who founded Zorvex Labs?</search>", False, True),
        ("<think>a</think> <think>b</think> <answer> Tamrin </answer>", True, True),
        ("<answer> Tamrin </answer>", False, False),  # an answer where a search was expected
        ("<search> q </search>", True, False),  # ...and the reverse
        ("so <search> q </search>", False, False),  # stray text before
        ("<think> x </think> <search> q </search> trailing", False, False),
        ("<search> q </search><search> r </search>", False, False),  # two actions in one turn
        ("<answer>   </answer>", True, False),  # empty answer
        ("<think> unclosed <search> q </search>", False, False),
        ("", True, False),
    ],
)
def test_well_formed_turn(text, final, ok):
    assert well_formed_turn(text, final) is ok


def _traj(turns, answer):
    segs = []
    for i, t in enumerate(turns):
        segs.append(Segment("policy", [i], t, [0.0]))
        if i < len(turns) - 1:
            segs.append(Segment("env", [99], "\n<information>Doc 1 (Title: T) x</information>\n"))
    actions = [Action("answer", answer, len(turns) - 1)] if answer is not None else []
    return Trajectory("q1", [1], segments=segs, actions=actions, final_answer=answer)


def test_packaged_config_reward_is_em_plus_zero_weight_format():
    cfg = SearchR1Config.load()
    reward = build_reward(cfg.reward)
    good = _traj(["<think>a</think><search>q</search>", "<answer> Tamrin </answer>"], "Tamrin")
    sloppy = _traj(["I will search <search>q</search>", "<answer> Tamrin </answer>"], "Tamrin")
    wrong = _traj(["<think>a</think><search>q</search>", "<answer> Orvale </answer>"], "Orvale")
    assert reward(good, EX).components == {"em": 1.0, "search_r1_format": 1.0}
    assert reward(sloppy, EX).components == {"em": 1.0, "search_r1_format": 0.0}
    assert reward(wrong, EX).components == {"em": 0.0, "search_r1_format": 1.0}
    assert [reward(t, EX).total for t in (good, sloppy, wrong)] == [1.0, 1.0, 0.0]
    with_format = build_reward(SearchR1Config.load(overrides=["reward.1.weight=0.2"]).reward)
    assert [with_format(t, EX).total for t in (good, sloppy, wrong)] == pytest.approx([1.2, 1.0, 0.2])
    assert with_format(_traj(["<search>q</search>"], None), EX).total == 0.0
