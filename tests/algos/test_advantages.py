import math

import pytest
import torch

from ragrl.algos import Groups, advantage_names, compute_advantages, difficulty_weight, get_advantage
from ragrl.errors import RagrlError

R = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0], dtype=torch.float64)
ONE_GROUP = torch.zeros(5, dtype=torch.long)


def test_grpo_one_group_sample_vs_population_std():
    # mean = 0.6; deviations +0.4 (x3), -0.6 (x2); Σ dev² = 3·0.16 + 2·0.36 = 1.2
    # sample std = sqrt(1.2 / 4) = sqrt(0.3) = 0.5477226; population std = sqrt(1.2 / 5) = 0.4898979
    sample = get_advantage("grpo")(R, ONE_GROUP, eps=0.0)
    assert sample.tolist() == pytest.approx([0.7302967, -1.0954451, -1.0954451, 0.7302967, 0.7302967])
    population = get_advantage("grpo")(R, ONE_GROUP, std="population", eps=0.0)
    assert population.tolist() == pytest.approx([0.8164966, -1.2247449, -1.2247449, 0.8164966, 0.8164966])
    # ARENA / TRL: eps = 1e-4 on the sample std -> 0.4 / 0.5478226 = 0.7301634
    arena = get_advantage("grpo")(R, ONE_GROUP, eps=1e-4)
    assert arena[0].item() == pytest.approx(0.4 / (math.sqrt(0.3) + 1e-4), abs=1e-12)
    assert arena[0].item() == pytest.approx(0.7301634, abs=1e-7)
    assert sample.sum().item() == pytest.approx(0.0, abs=1e-12)


def test_two_interleaved_groups_of_different_sizes():
    # group 7: rewards [1, 0] at positions 0, 2 -> mean 0.5, sample std sqrt(0.5) = 0.7071068
    # group 3: rewards [2, 4, 6] at positions 1, 3, 4 -> mean 4, sample std 2
    rewards = torch.tensor([1.0, 2.0, 0.0, 4.0, 6.0])
    ids = torch.tensor([7, 3, 7, 3, 3])
    adv = get_advantage("grpo")(rewards, ids, eps=0.0)
    assert adv.tolist() == pytest.approx([0.7071068, -1.0, -0.7071068, 0.0, 1.0], abs=1e-6)
    assert get_advantage("grpo_mean_only")(rewards, ids).tolist() == [0.5, -2.0, -0.5, 0.0, 2.0]


def test_all_equal_group_gives_exactly_zero_with_arenas_epsilon_and_singletons_give_zero():
    # group 0 all 13.0 (ARENA's all-perfect group), group 1 mixed, group 2 a single rollout
    rewards = torch.tensor([13.0, 13.0, 13.0, 1.0, 0.0, 5.0])
    ids = torch.tensor([0, 0, 0, 1, 1, 2])
    for name in ("grpo", "grpo_mean_only", "rloo"):
        adv = get_advantage(name)(rewards, ids, **({"eps": 1e-4} if name == "grpo" else {}))
        assert adv[[0, 1, 2, 5]].tolist() == [0.0, 0.0, 0.0, 0.0], name
        assert adv[3] > 0 > adv[4]
    # even eps = 0 and a mean that does not round-trip (0.1 + 0.1 + 0.1) / 3 != 0.1 give exact zeros
    tenths = torch.tensor([0.1, 0.1, 0.1], dtype=torch.float64)
    assert tenths.mean().item() != 0.1
    assert get_advantage("grpo")(tenths, torch.zeros(3, dtype=torch.long), eps=0.0).tolist() == [0.0] * 3


def test_rloo_by_hand():
    # [1, 0, 0, 1, 1]: for a 1, the other four average (3 - 1) / 4 = 0.5 -> +0.5;
    # for a 0, the others average 3 / 4 = 0.75 -> -0.75
    assert get_advantage("rloo")(R, ONE_GROUP).tolist() == pytest.approx([0.5, -0.75, -0.75, 0.5, 0.5])


def test_reinforce_pp_baseline_centres_per_group_then_whitens_the_batch():
    # group a [1, 0] -> centred [0.5, -0.5]; group b [3, 3, 6] -> mean 4 -> [-1, -1, 2]
    # batch c = [0.5, -0.5, -1, -1, 2]: mean 0, Σc² = 0.25 + 0.25 + 1 + 1 + 4 = 6.5, sample std sqrt(6.5/4)
    rewards = torch.tensor([1.0, 0.0, 3.0, 3.0, 6.0], dtype=torch.float64)
    ids = torch.tensor([0, 0, 1, 1, 1])
    adv = get_advantage("reinforce_pp_baseline")(rewards, ids, eps=0.0)
    s = math.sqrt(6.5 / 4)
    assert adv.tolist() == pytest.approx([0.5 / s, -0.5 / s, -1 / s, -1 / s, 2 / s])
    # token_counts = per-rollout lengths reproduce token-level whitening (verl masked_whiten)
    lengths = torch.tensor([1, 3, 2, 1, 2])
    token_level = torch.repeat_interleave(adv.new_tensor([0.5, -0.5, -1, -1, 2]), lengths)
    expected = (token_level - token_level.mean()) / token_level.std()
    weighted = get_advantage("reinforce_pp_baseline")(rewards, ids, eps=0.0, token_counts=lengths)
    assert torch.repeat_interleave(weighted, lengths).tolist() == pytest.approx(expected.tolist())


def test_vectorised_matches_a_per_group_loop_on_random_uneven_groups():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 6, (40,), generator=g) * 10 + 5  # non-contiguous, uneven sizes
    rewards = torch.rand(40, generator=g, dtype=torch.float64)
    adv = compute_advantages("grpo", rewards, ids, eps=1e-6)
    expected = torch.empty_like(rewards)
    for gid in ids.unique():
        sel = ids == gid
        r = rewards[sel]
        expected[sel] = (r - r.mean()) / (r.std() + 1e-6) if r.numel() > 1 else 0.0
    assert torch.allclose(adv, expected, atol=1e-12)
    groups = Groups.of(ids)
    assert torch.allclose(groups.sum(adv), torch.zeros(groups.num, dtype=torch.float64), atol=1e-9)


def test_difficulty_weight_matches_tiresrag_table():
    # tiresrag.md §3.2: W for ρ = 0, 0.2, ..., 1 with A=0.4, B=1.5, ρ0=0.75, k=10
    w = difficulty_weight(torch.tensor([0.0, 0.2, 0.4, 0.6, 0.8, 1.0], dtype=torch.float64))
    assert w.tolist() == pytest.approx([1.4994, 1.4955, 1.4678, 1.2993, 0.8153, 0.4834], abs=5e-5)
    assert float(difficulty_weight(0.75)) == pytest.approx((0.4 + 1.5) / 2)


def test_registry_and_input_errors():
    # the core's own; a method module adds its estimator when imported (tiresrag)
    assert {"grpo", "grpo_mean_only", "reinforce_pp_baseline", "rloo"} <= set(advantage_names())
    with pytest.raises(RagrlError, match=r"unknown advantage 'ppo'; registered: grpo, "):
        get_advantage("ppo")
    with pytest.raises(RagrlError, match="std must be 'sample' or 'population'"):
        get_advantage("grpo")(R, ONE_GROUP, std="bessel")
    with pytest.raises(RagrlError, match="rewards has 5 entries but group_ids has 4"):
        get_advantage("grpo")(R, ONE_GROUP[:4])
    # integer rewards are accepted and promoted to float
    assert get_advantage("grpo_mean_only")(torch.tensor([1, 0]), torch.tensor([0, 0])).tolist() == [0.5, -0.5]


SEEN: dict = {}


def test_components_reach_only_the_estimators_that_ask_for_them():
    from ragrl.algos import register_advantage

    seen = SEEN
    seen.clear()
    if "test_sufficiency_weighted" not in advantage_names():

        @register_advantage("test_sufficiency_weighted")
        def sufficiency_weighted(rewards, group_ids, *, components, scale: float = 1.0):
            SEEN.update(components)
            return get_advantage("grpo")(rewards, group_ids) * components["sufficiency"] * scale

    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1])
    comps = {"sufficiency": torch.tensor([1.0, 1.0, 0.5, 0.5]), "em": rewards}
    out = compute_advantages("test_sufficiency_weighted", rewards, groups, components=comps, scale=2.0)
    # grpo (Bessel std of {1, 0} is 0.7071) -> ±0.7071, times sufficiency, times 2
    assert out.tolist() == pytest.approx([1.41421, -1.41421, 0.70711, -0.70711], abs=1e-4)
    assert set(seen) == {"sufficiency", "em"}
    # an estimator without the parameter is called as before
    assert torch.equal(
        compute_advantages("grpo", rewards, groups, components=comps), get_advantage("grpo")(rewards, groups)
    )
