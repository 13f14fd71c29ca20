import pytest

from ragrl.data.schema import Example
from ragrl.rewards import build_reward
from ragrl.rollout.trajectory import Action, Trajectory

# a 3-hop question: three supporting passages
EX = Example("q1", "Who founded the company the author of Lidaerguth River works for?", ["Fegios Redaevu"],
             supporting_ids=["p1", "p2", "p3"])  # fmt: skip


def _traj(*searches, answer=None):
    actions = [
        Action("search", f"query {i}", i, list(ids), [1.0] * len(ids)) for i, ids in enumerate(searches)
    ]
    actions.append(Action("invalid", "", len(actions)))
    if answer is not None:
        actions.append(Action("answer", answer, len(actions)))
    return Trajectory("q1", [1, 2], actions=actions, final_answer=answer)


def test_support_recall_counts_each_gold_passage_once_over_every_search():
    reward = build_reward([{"name": "em", "weight": 1.0}, {"name": "support_recall", "weight": 0.25}])
    nothing = reward(_traj(["p7", "p8"]), EX)
    assert nothing.components == {"em": 0.0, "support_recall": 0.0} and nothing.total == 0.0
    # p1 twice and p2 once: 2 of the 3 gold passages; a wrong answer still earns the search its share
    two = reward(_traj(["p1", "p9"], ["p1", "p2"], answer="Sopaex Daedogael"), EX)
    assert two.components["support_recall"] == pytest.approx(2 / 3)
    assert two.total == pytest.approx(0.25 * 2 / 3)
    everything = reward(_traj(["p3", "p1"], ["p2"], answer="Fegios Redaevu"), EX)
    assert everything.components == {"em": 1.0, "support_recall": 1.0}
    assert everything.total == pytest.approx(1.25)


def test_support_recall_is_zero_without_gold_evidence_and_ignores_non_search_actions():
    no_gold = Example("q2", "Is it raining?", ["unknown"])
    assert build_reward([{"name": "support_recall"}])(_traj(["p1"]), no_gold).total == 0.0
    # an answer action carrying ids (it never does in practice) is not a search
    traj = _traj([])
    traj.actions.append(Action("answer", "x", 5, ["p1", "p2", "p3"]))
    assert build_reward([{"name": "support_recall"}])(traj, EX).total == 0.0
