"""TIRESRAG-R1's rewards and advantages against the spec's tables (methods/tiresrag.md §2.1, §2.4, §2.8,
§3.2) and an independent numpy computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ragrl.algos.advantages import compute_advantages, difficulty_weight
from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.methods.tiresrag.advantage import advantage_terms, consistency_penalty
from ragrl.methods.tiresrag.rewards import answer_reward, reflection_value
from ragrl.rewards import RewardContext, build_reward
from ragrl.rollout.trajectory import Action, Segment, Trajectory

CTX = RewardContext()


def episode(*answers: str, text: str = "") -> Trajectory:
    actions = [Action("answer", content=a) for a in answers]
    segments = [Segment("policy", [1], text)] if text else []
    return Trajectory(
        "q", [0], segments=segments, actions=actions, final_answer=answers[-1] if answers else None
    )


# --- R^A -----------------------------------------------------------------------------------------------


def test_answer_reward_is_f1_with_the_methods_normalization():
    ex = Example("q", "Who wrote it?", ["Mira Tolan"])
    assert answer_reward(episode("Tolan"), ex, CTX) == pytest.approx(2 / 3)  # p 1, r 1/2
    assert answer_reward(episode("the mira_tolan!"), ex, CTX) == 1.0  # _ and punctuation -> space
    yes = Example("q", "Is it?", ["yes"])
    assert answer_reward(episode("True"), yes, CTX) == 1.0  # True -> yes
    assert answer_reward(episode("yes it is"), yes, CTX) == 0.0  # the yes/no rule


def test_an_episode_without_an_answer_scores_zero_or_its_text():
    ex = Example("q", "Who wrote it?", ["Mira Tolan"])
    silent = episode(text="<think> Mira Tolan wrote it </think>")
    assert answer_reward(silent, ex, CTX) == 0.0
    assert answer_reward(silent, ex, CTX, no_answer="text") == pytest.approx(2 * (2 / 6) / (2 / 6 + 1))
    with pytest.raises(RagrlError, match="no_answer"):
        answer_reward(silent, ex, CTX, no_answer="whole")


# --- R^R: the §2.4 table, both modes -------------------------------------------------------------------

GOLD = ["Mira Tolan"]
RIGHT, PARTLY, WRONG = "Mira Tolan", "Mira Tolan of Oslo in Norway", "Oslo"  # PARTLY: right, F1 0.5 < 1


@pytest.mark.parametrize(
    ("answers", "code", "paper"),
    [
        ([], 0.0, 0.0),
        ([RIGHT], 0.0, 0.0),
        ([WRONG], -1.0, 0.0),
        ([PARTLY, RIGHT], 0.0, 0.0),  # both right, F1 rises
        ([RIGHT, PARTLY], -1.0, 0.0),  # both right, F1 falls
        ([RIGHT, WRONG], -1.0, -1.0),  # reflection broke a right answer
        ([WRONG, RIGHT], 0.0, 1.0),  # reflection fixed a wrong one: only the paper rewards it
        ([WRONG, "Bergen"], -1.0, 0.0),
        ([WRONG, "Bergen", RIGHT], 0.0, 1.0),  # the first against the last
    ],
)
def test_reflection_reward_table(answers, code, paper):
    assert reflection_value(answers, GOLD, "code") == code
    assert reflection_value(answers, GOLD, "paper") == paper


def test_partly_is_right_by_cover_em_with_f1_one_half():
    from ragrl.methods.tiresrag.rewards import answer_f1

    assert answer_f1(PARTLY, GOLD) == pytest.approx(0.5)  # so "right" comes from cover-EM, not F1 > 0.5


def test_code_mode_counts_f1_above_one_half_as_right():
    # "Mira": F1 2/3 (p 1, r 1/2) but not covered; right for the code, wrong for the paper's cover-EM
    assert reflection_value(["Mira"], GOLD, "code") == 0.0
    assert reflection_value([WRONG, "Mira"], GOLD, "code") == 0.0
    assert reflection_value([WRONG, "Mira"], GOLD, "paper") == 0.0
    assert reflection_value(["Mira", WRONG], GOLD, "code") == -1.0
    assert reflection_value([WRONG, "Tolan Mira"], GOLD, "paper") == 1.0  # cover-EM ignores order


def test_unknown_reflection_mode_is_refused():
    with pytest.raises(RagrlError, match="paper"):
        reflection_value([RIGHT], GOLD, "papers")


# --- advantages ---------------------------------------------------------------------------------------

RA = [1.0, 0.0, 0.5, 0.0, 1.0]
RT = [0.9, 0.2, 0.5, 0.8, 0.7]
RS = [1.0, 0.0, 1.0, 1.0, 0.0]


def z(x):
    x = np.asarray(x, dtype=np.float64)
    return (x - x.mean()) / (x.std() + 1e-8)  # population std, as Algorithm 1


def numpy_advantage(ra, rt, rs, scale_t=1.0, scale_s=1.0):
    r = np.asarray(ra) + 0.6 * np.asarray(rt) + 0.3 * np.asarray(rs)
    product = z(ra) * scale_t * z(rt) * scale_s * z(rs)
    penalty = np.where(product < 0, -0.1 * product, 0.0)
    w = 0.4 + 1.1 / (1 + np.exp(10 * (np.mean(rs) - 0.75)))
    return (z(r) - penalty) * w, penalty


def components(ra=RA, rt=RT, rs=RS):
    return {
        "tiresrag_answer": torch.tensor(ra, dtype=torch.float64),
        "tiresrag_thinking": torch.tensor(rt, dtype=torch.float64),
        "tiresrag_sufficiency": torch.tensor(rs, dtype=torch.float64),
    }


def r_sum(ra=RA, rt=RT, rs=RS):
    return torch.tensor(np.asarray(ra) + 0.6 * np.asarray(rt) + 0.3 * np.asarray(rs))


def test_penalty_fires_on_an_odd_number_of_negative_z_scores():
    z_a, z_t, z_s = (torch.tensor(z(x)) for x in (RA, RT, RS))
    p = consistency_penalty(z_a, z_t, z_s)
    assert (p >= 0).all()
    assert p[0] == 0  # answer, thinking, sufficiency all above the mean
    assert p[1] > 0  # all three below the mean
    assert p[3] > 0  # good thinking and evidence, wrong answer
    assert p[2] == 0  # an answer exactly at the mean
    assert p[4] > 0  # a right answer without the evidence: a lucky guess


def test_tiresrag_advantage_matches_the_formula():
    ids = torch.zeros(5, dtype=torch.long)
    got = compute_advantages("tiresrag", r_sum(), ids, components=components())
    want, penalty = numpy_advantage(RA, RT, RS)
    assert got.tolist() == pytest.approx(want.tolist(), abs=1e-9)
    assert float(difficulty_weight(0.6)) == pytest.approx(1.2993, abs=5e-5)  # §3.2 table
    assert (penalty > 0).sum() == 3


def test_code_penalty_scales_by_the_weights_in_force():
    ids = torch.zeros(5, dtype=torch.long)
    weights = {"tiresrag_thinking": 0.6, "tiresrag_sufficiency": 0.3}  # a_t = 1
    got = compute_advantages(
        "tiresrag", r_sum(), ids, components=components(), weights=weights, penalty="code"
    )
    want, penalty = numpy_advantage(RA, RT, RS, 0.6, 0.3)
    assert got.tolist() == pytest.approx(want.tolist(), abs=1e-9)
    _, paper = numpy_advantage(RA, RT, RS)
    assert penalty == pytest.approx(0.18 * paper)  # 0.018 |zA zT zS|, §2.8
    with pytest.raises(RagrlError, match="weights"):
        compute_advantages("tiresrag", r_sum(), ids, components=components(), penalty="code")


def test_groups_are_independent_and_switches_drop_their_term():
    ids = torch.tensor([7] * 5 + [3] * 5)
    rs_easy = [1.0, 1.0, 1.0, 1.0, 0.0]  # ρ = 0.8: W 0.8153
    comps = {k: torch.cat([v, components(rs=rs_easy)[k]]) for k, v in components().items()}
    rewards = torch.cat([r_sum(), r_sum(rs=rs_easy)])
    got = compute_advantages("tiresrag", rewards, ids, components=comps)
    assert got[:5].tolist() == pytest.approx(numpy_advantage(RA, RT, RS)[0].tolist(), abs=1e-9)
    assert got[5:].tolist() == pytest.approx(numpy_advantage(RA, RT, rs_easy)[0].tolist(), abs=1e-9)
    bare = compute_advantages("tiresrag", rewards, ids, components=comps, penalty="none", difficulty=False)
    assert bare[:5].tolist() == pytest.approx(z(r_sum().numpy()).tolist(), abs=1e-9)


def test_an_equal_component_gives_no_penalty_and_an_equal_group_no_advantage():
    ids = torch.zeros(5, dtype=torch.long)
    flat = components(rs=[1.0] * 5)
    got = compute_advantages("tiresrag", r_sum(rs=[1.0] * 5), ids, components=flat)
    w = float(difficulty_weight(1.0))
    assert w == pytest.approx(0.4834, abs=5e-5)
    assert got.tolist() == pytest.approx((z(r_sum(rs=[1.0] * 5).numpy()) * w).tolist(), abs=1e-6)
    same = compute_advantages(
        "tiresrag", torch.ones(5), ids, components=components(ra=[1.0] * 5, rt=[0.5] * 5)
    )
    assert same.abs().max() == 0


def test_a_missing_component_is_named():
    comps = components()
    del comps["tiresrag_thinking"]
    with pytest.raises(RagrlError, match="thinking='tiresrag_thinking'"):
        compute_advantages("tiresrag", r_sum(), torch.zeros(5, dtype=torch.long), components=comps)


def test_weights_reach_only_estimators_that_declare_them():
    r, ids = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    assert compute_advantages("grpo", r, ids, weights={"x": 1.0}).tolist() == pytest.approx(
        [0.7071, -0.7071], abs=1e-4
    )


# --- R_sum: the composite reward with the annealed a_t -------------------------------------------------


def test_r_sum_with_annealed_auxiliary_weights():
    from ragrl.rewards import register_reward, reward_names

    # stand-ins for the judge components (their own tests come with them): fixed values
    if "test_tiresrag_fixed_t" not in reward_names():

        @register_reward("test_tiresrag_fixed_t")
        def fixed_t(trajectory, example, ctx):
            return 0.7

        @register_reward("test_tiresrag_fixed_s")
        def fixed_s(trajectory, example, ctx):
            return 1.0

    decay = {"name": "sigmoid_decay", "center": 0.9, "width": 10}
    reward = build_reward(
        [
            {"name": "tiresrag_answer", "weight": 1.0},
            {"name": "test_tiresrag_fixed_t", "weight": 0.6, "schedule": decay},
            {"name": "test_tiresrag_fixed_s", "weight": 0.3, "schedule": decay},
            {"name": "tiresrag_reflection", "weight": 0.3, "schedule": decay},
        ]
    )
    ex = Example("q", "Who wrote it?", ["Mira Tolan"])
    [early] = reward.score([episode(WRONG, RIGHT)], [ex], RewardContext(step=0, total_steps=144))
    assert early.components["tiresrag_reflection"] == 1.0
    assert early.total == pytest.approx(1.0 + 1.0 * (0.6 * 0.7 + 0.3 * 1.0 + 0.3 * 1.0), abs=1e-3)
    [late] = reward.score([episode(WRONG, RIGHT)], [ex], RewardContext(step=143, total_steps=144))
    a_t = late.weights["tiresrag_reflection"] / 0.3
    assert a_t == pytest.approx(0.192, abs=5e-4)  # §2.6 table, t = 144
    assert late.total == pytest.approx(1.0 + a_t * (0.6 * 0.7 + 0.3 + 0.3))


# --- the Reinforce++ variant (§3.6) ---------------------------------------------------------------------


def test_reinforce_pp_centres_by_group_and_subtracts_the_penalty_without_w():
    ids = torch.tensor([0] * 5 + [1] * 5)
    rs_easy = [1.0, 1.0, 1.0, 1.0, 0.0]
    comps = {k: torch.cat([v, components(rs=rs_easy)[k]]) for k, v in components().items()}
    rewards = torch.cat([r_sum(), r_sum(rs=rs_easy)])
    got = compute_advantages("tiresrag", rewards, ids, components=comps, baseline="reinforce_pp")
    parts = []
    for rs in (RS, rs_easy):  # the code's reinforce_baseline: r - mean_g, minus the penalty, no W
        r = r_sum(rs=rs).numpy()
        parts.append(r - r.mean() - numpy_advantage(RA, RT, rs)[1])
    assert got.tolist() == pytest.approx(np.concatenate(parts).tolist(), abs=1e-9)
    with_w = compute_advantages(
        "tiresrag", rewards, ids, components=comps, baseline="reinforce_pp", difficulty=True
    )
    w = float(difficulty_weight(0.6))
    assert with_w[:5].tolist() == pytest.approx((parts[0] * w).tolist(), abs=1e-6)
    with pytest.raises(RagrlError, match="baseline must be one of"):
        compute_advantages("tiresrag", rewards, ids, components=comps, baseline="ppo")
    with pytest.raises(RagrlError, match=r"takes no \['lambda'\]"):
        compute_advantages("tiresrag", rewards, ids, components=comps, **{"lambda": 0.2})


def test_the_advantage_terms_expose_the_penalty_and_the_weight_it_used():
    ids = torch.zeros(5, dtype=torch.long)
    terms = advantage_terms(r_sum(), ids, components=components())
    want, penalty = numpy_advantage(RA, RT, RS)
    assert terms["advantage"].tolist() == pytest.approx(want.tolist(), abs=1e-9)
    assert terms["penalty"].tolist() == pytest.approx(penalty.tolist(), abs=1e-9)
    assert terms["weight"].tolist() == pytest.approx([float(difficulty_weight(0.6))] * 5)
    off = advantage_terms(r_sum(), ids, components=components(), penalty="none", difficulty=False)
    assert off["penalty"].abs().max() == 0 and off["weight"].tolist() == [1.0] * 5
