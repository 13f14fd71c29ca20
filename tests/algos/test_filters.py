import pytest
import torch

from ragrl.algos import filter_names, get_advantage, get_filter, group_stats
from ragrl.errors import RagrlError


def test_drop_zero_variance_on_interleaved_groups():
    # group 1: [1, 1, 1] (all equal: dropped); group 2: [0, 1] (kept); group 9: [0.5] (singleton)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 1.0])
    ids = torch.tensor([1, 2, 1, 2, 9, 1])
    keep = get_filter("drop_zero_variance")(rewards, ids)
    assert keep.tolist() == [False, True, False, True, False, False]
    keep = get_filter("drop_zero_variance")(rewards, ids, keep_singletons=True)
    assert keep.tolist() == [False, True, False, True, True, False]
    # tolerance: [0.5, 0.5 + 1e-9] counts as all equal with tol = 1e-6
    near = torch.tensor([0.5, 0.5 + 1e-9], dtype=torch.float64)
    assert get_filter("drop_zero_variance")(near, torch.tensor([0, 0]), tol=1e-6).tolist() == [False, False]
    assert get_filter("drop_zero_variance")(near, torch.tensor([0, 0])).tolist() == [True, True]
    # what it drops is exactly what has zero GRPO advantage
    adv = get_advantage("grpo")(rewards, ids)
    assert (adv[~get_filter("drop_zero_variance")(rewards, ids)] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_drop_saturated_edges_are_inclusive(dtype):
    # TIRESRAG code: drop if max F1 <= 0.1 or min F1 >= 0.9
    f1 = torch.tensor(
        [
            0.1, 0.0, 0.05,  # g0: max = 0.1 exactly -> dropped
            0.11, 0.0, 0.0,  # g1: max = 0.11 -> kept
            0.9, 1.0, 0.95,  # g2: min = 0.9 exactly -> dropped
            0.89, 1.0, 1.0,  # g3: min = 0.89 -> kept
            0.0, 1.0, 0.5,  # g4: mixed -> kept
        ],
        dtype=dtype,
    )  # fmt: skip
    ids = torch.arange(5).repeat_interleave(3)
    keep = get_filter("drop_saturated")(f1, ids)
    assert keep.view(5, 3).all(1).tolist() == [False, True, False, True, True]
    assert (keep.view(5, 3).all(1) == keep.view(5, 3).any(1)).all()  # whole groups only
    # bounds are parameters
    keep = get_filter("drop_saturated")(f1, ids, low=0.0, high=1.01)
    assert keep.all()


def test_keep_all_and_registry():
    assert get_filter("keep_all")(torch.tensor([1.0, 1.0]), torch.tensor([0, 0])).tolist() == [True, True]
    assert filter_names() == ["drop_saturated", "drop_zero_variance", "keep_all"]
    with pytest.raises(RagrlError, match=r"unknown group filter 'dapo'; registered: drop_saturated"):
        get_filter("dapo")


def test_group_stats_by_hand():
    # g0 [1, 0] population std 0.5; g1 [1, 1, 1] std 0 (zero variance); g2 [0.25] std 0 (zero variance)
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.25, 1.0])
    ids = torch.tensor([0, 1, 0, 1, 2, 1])
    stats = group_stats(rewards, ids)
    assert stats == pytest.approx(
        {
            "num_groups": 3.0,
            "group_size_mean": 2.0,
            "reward_mean": 4.25 / 6,
            "reward_std_in_group": 0.5 / 3,
            "zero_variance_share": 2 / 3,
        }
    )
