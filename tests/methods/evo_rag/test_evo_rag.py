"""EVO-RAG's action grammar (§1.6), scheduler (§2.3's weight table) and seven step rewards (§2.1), with
the spec's worked examples (§2.6) as test vectors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.methods import load_method
from ragrl.methods.evo_rag import rewards
from ragrl.methods.evo_rag.protocol import EvoRagProtocol
from ragrl.methods.evo_rag.rewards import evidence_ids, parse_verdict
from ragrl.methods.evo_rag.schedule import COMPONENTS, ScheduleConfig, step_weights
from ragrl.rewards.registry import RewardContext
from ragrl.rollout.backtrack import active_steps
from ragrl.rollout.trajectory import Action, Segment, Trajectory

GOLD = ["g1", "g2"]
EX = Example(
    "q1", "Which state contains the launch site of Mars Pathfinder?", ["Florida"], supporting_ids=GOLD
)


def episode(*steps: tuple) -> Trajectory:
    """An episode as the rollout records it: one policy segment and one action per step, passages after
    a search. A step is ``(kind, content, retrieved_ids)``."""
    traj = Trajectory("q1", [1, 2, 3])
    for t, (kind, content, *ids) in enumerate(steps):
        traj.segments.append(Segment("policy", [5], f"<{kind}>", [0.0]))
        action = Action(kind, content=content, turn=t)
        if kind == "search":
            action.retrieved_ids = list(ids[0]) if ids else []
            traj.segments.append(
                Segment("env", [6], "<information>" + " ".join(action.retrieved_ids) + "</information>")
            )
        traj.actions.append(action)
        if kind in ("answer", "refuse"):
            traj.final_answer = content
    return traj


class FixedCosines:
    """The §2.6 examples state each query's max cosine: vectors with exactly those dot products."""

    def __init__(self, vectors: dict[str, np.ndarray]) -> None:
        self.vectors = vectors

    def embed(self, texts):
        return {t: self.vectors[t] for t in texts}


@pytest.fixture
def cosines(monkeypatch):
    """q0, q1 at cos 0.4; q0, q9 at cos 0.9; q0, q35 at cos 0.35 (unit vectors in the plane)."""

    def unit(c: float) -> np.ndarray:
        return np.array([c, np.sqrt(1 - c * c)], dtype=np.float64)

    fixed = FixedCosines(
        {"q0": unit(1.0), "q1": unit(0.4), "q9": unit(0.9), "q35": unit(0.35), "q_": unit(0.0)}
    )
    monkeypatch.setattr(rewards, "query_encoder", lambda model=None: fixed)


def score(traj: Trajectory, overrides=(), example: Example = EX):
    method = load_method("evo_rag", list(overrides))
    return method.reward.score([traj], [example], RewardContext())[0]


# --- the grammar -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "content"),
    [
        (
            "<think>I need the site.</think> <search> Mars Pathfinder launch site </search>",
            "search",
            "Mars Pathfinder launch site",
        ),
        ("<backtrack/>", "backtrack", ""),
        ("<backtrack> 2 </backtrack>", "backtrack", "2"),  # back to just before step 2
        ("<backtrack>3</backtrack> or rather <backtrack/>", "backtrack", ""),  # the later form counts
        ("<think>nothing found</think><refuse/>", "refuse", "unknown"),
        ("<answer> Florida </answer>", "answer", "Florida"),
        ("<search>a</search> then <search>b</search>", "search", "b"),  # the same kind twice: the last
        ("<think>maybe <answer>x</answer></think><search>q</search>", "search", "q"),  # only after </think>
    ],
)
def test_parse_reads_one_action_after_the_thinking(text, kind, content):
    action = EvoRagProtocol().parse(text, 3)
    assert (action.kind, action.content, action.turn) == (kind, content, 3)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<answer>a</answer><search>b</search>", "more than one action (search, answer)"),
        ("<search>q</search><backtrack/>", "more than one action (search, backtrack)"),
        ("I think it is Florida", "no action tag"),
        ("<think>a <search>q</search>", "unclosed <think>"),
        ("<search>  </search>", "empty query"),
        ("<answer></answer>", "empty answer"),
        ("<backtrack>two</backtrack>", "<backtrack>k</backtrack> takes a step number k >= 1"),
        ("<backtrack>0</backtrack>", "<backtrack>k</backtrack> takes a step number k >= 1"),
        ("<backtrack>1</backtrack><refuse/>", "more than one action (refuse, backtrack)"),
    ],
)
def test_parse_counts_ambiguous_or_missing_actions_as_invalid(text, error):
    action = EvoRagProtocol().parse(text, 0)
    assert (action.kind, action.error) == ("invalid", error)


def test_refuse_and_answer_end_the_episode():
    p = EvoRagProtocol()
    assert p.is_final(Action("refuse")) and p.is_final(Action("answer"))
    assert not p.is_final(Action("search")) and p.is_backtrack(Action("backtrack"))


# --- the scheduler ---------------------------------------------------------------------------------------

TABLE = {  # spec §2.3, Interpretation A: (stage, t) -> (β, λ, γ, δ, ρ, η, κ)
    ("discovery", 0): (2.0, 1.5, 0.1, 0.3, 0.5, 0.02, 0.05),
    ("discovery", 5): (1.75, 1.325, 0.2, 0.35, 0.5, 0.0275, 0.0625),
    ("discovery", 6): (1.7, 1.29, 0.22, 0.36, 0.5, 0.029, 0.065),
    ("discovery", 10): (1.5, 1.15, 0.3, 0.4, 0.5, 0.035, 0.075),
    ("discovery", 15): (1.25, 0.975, 0.4, 0.45, 0.5, 0.0425, 0.0875),
    ("discovery", 19): (1.05, 0.835, 0.48, 0.49, 0.5, 0.0485, 0.0975),
    ("refinement", 0): (1.0, 0.8, 0.5, 0.5, 0.5, 0.05, 0.1),
    ("refinement", 5): (0.875, 0.7, 0.675, 0.625, 0.5, 0.0625, 0.325),
    ("refinement", 6): (0.85, 0.68, 0.71, 0.65, 0.5, 0.065, 0.37),
    ("refinement", 10): (0.75, 0.6, 0.85, 0.75, 0.5, 0.075, 0.55),
    ("refinement", 15): (0.625, 0.5, 1.025, 0.875, 0.5, 0.0875, 0.775),
    ("refinement", 19): (0.525, 0.42, 1.165, 0.975, 0.5, 0.0975, 0.955),
}


def test_the_weights_reproduce_the_spec_table():
    for stage in ("discovery", "refinement"):
        traj = episode(*[("backtrack", "")] * 20)
        result = score(traj, [f"schedule.stage={stage}"])
        for (s, t), expected in TABLE.items():
            if s == stage:
                got = tuple(result.step_weights[k][t] for k in COMPONENTS)
                assert got == pytest.approx(expected, abs=1e-12), (stage, t)


def test_two_stage_fixed_uses_the_stage_mean_and_no_reward_only_the_answer():
    fixed = step_weights(ScheduleConfig(mode="two_stage_fixed", stage="refinement"))
    assert fixed["ans"] == {"weight": pytest.approx(0.55)} and fixed["ret"] == {"weight": pytest.approx(0.75)}
    bare = step_weights(ScheduleConfig(mode="no_reward"))
    assert {k: v["weight"] for k, v in bare.items()} == {k: float(k == "ans") for k in COMPONENTS}


def test_a_mask_keeps_the_named_components_and_combinations():
    best3 = step_weights(ScheduleConfig(keep=["best3"]))
    assert [k for k in COMPONENTS if best3[k]["weight"]] == ["dup", "bt", "ans"]
    single = step_weights(ScheduleConfig(keep=["bt"]))
    assert [k for k in COMPONENTS if single[k]["weight"]] == ["bt"]
    with pytest.raises(RagrlError, match="schedule.keep"):
        step_weights(ScheduleConfig(keep=["bonus"]))
    with pytest.raises(RagrlError, match="schedule.mode"):
        step_weights(ScheduleConfig(mode="dynamic"))


def test_the_piecewise_shape_runs_start_mid_end_inside_one_episode():
    curve = step_weights(ScheduleConfig(shape="piecewise_episode"))["step"]["step_weight"]
    result = score(episode(*[("backtrack", "")] * 20), ["schedule.shape=piecewise_episode"])
    assert curve == {"early": 0.02, "mid": 0.05, "late": 0.10, "horizon": 20}
    assert [result.step_weights["step"][t] for t in (0, 10, 15)] == pytest.approx([0.02, 0.05, 0.075])


# --- the worked examples (§2.6) --------------------------------------------------------------------------


def test_example_1_a_three_step_trajectory(cosines):
    traj = episode(("search", "q0", ["g1", "x"]), ("search", "q1", ["y"]), ("answer", "Florida"))
    for stage, steps, ret in (("discovery", (1.98, -2.0195, 0.032), -0.0075),
                              ("refinement", (0.95, -1.2415, 0.135), -0.1565)):  # fmt: skip
        result = score(traj, [f"schedule.stage={stage}"])
        raw = {k: result.step_components[k] for k in COMPONENTS}
        assert [tuple(raw[k][t] for k in COMPONENTS) for t in range(3)] == [
            (1, 0, 0, 0, 0, -1, 0),
            (-1, 0, pytest.approx(-0.4), 0, 0, -1, 0),
            (0, 0, 0, 0, 0, -1, 1),
        ]
        assert result.steps == pytest.approx(steps) and result.total == pytest.approx(ret)


def test_example_2_siblings_answer_now_or_search_again(cosines):
    prefix = ("search", "q0", ["g1"])
    a = episode(prefix, ("answer", "Florida"))
    b = episode(prefix, ("search", "q9", ["z"]), ("answer", "Florida"))
    for stage, ra, rb in (("discovery", 0.031, -2.0475), ("refinement", 0.0925, -1.374)):
        suffix_a = score(a, [f"schedule.stage={stage}"]).steps[1:]
        suffix_b = score(b, [f"schedule.stage={stage}"]).steps[1:]
        assert sum(suffix_a) == pytest.approx(ra) and sum(suffix_b) == pytest.approx(rb)


def test_example_3_a_correct_and_a_wrong_answer_differ_by_kappa(cosines):
    prefix = ("search", "q0", ["g1"])
    for stage, gap in (("discovery", 0.0525), ("refinement", 0.145)):
        right = score(episode(prefix, ("answer", "Florida")), [f"schedule.stage={stage}"]).total
        wrong = score(episode(prefix, ("answer", "Texas")), [f"schedule.stage={stage}"]).total
        assert right - wrong == pytest.approx(gap)


def test_example_4_a_late_search_in_refinement(cosines):
    steps = [("search", "q0", ["n"])] + [("backtrack", "")] * 5 + [("search", "q35", ["g2"])]
    result = score(episode(*steps), ["schedule.stage=refinement"])
    assert [result.step_components[k][6] for k in COMPONENTS] == pytest.approx([1, -1, -0.35, 0, 0, -1, 0])
    assert result.steps[6] == pytest.approx(-0.1435)


def test_example_5_a_refusal_the_verifier_backs_or_not():
    searches = [("search", "q0", ["g1"])] * 4
    backed = score(episode(*searches, ("refuse", "unknown")))  # g2 never found: not enough evidence
    refuted = score(episode(*searches[:3], ("search", "q0", ["g2"]), ("refuse", "unknown")))
    assert backed.step_components["ref"][4] == 1.0 and refuted.step_components["ref"][4] == -1.0
    assert backed.steps[4] == pytest.approx(0.474) and refuted.steps[4] == pytest.approx(-0.526)
    assert backed.steps[4] - refuted.steps[4] == pytest.approx(2 * 0.5)
    assert backed.step_components["ans"][4] == 0.0  # r_ans is 0 for a refusal


def test_example_6_a_backtrack_in_refinement():
    traj = episode(
        ("search", "q0", ["n"]), ("search", "q0", ["n"]), ("search", "q0", ["n"]), ("backtrack", "")
    )
    result = score(traj, ["schedule.stage=refinement", "schedule.keep=[bt,step]"])
    assert result.steps[3] == pytest.approx(-0.6325)


# --- the components' rules ------------------------------------------------------------------------------


def test_the_evidence_is_what_backtracking_left_in_context():
    traj = episode(("search", "a", ["g1"]), ("search", "b", ["g2"]), ("backtrack", ""), ("refuse", "unknown"))
    assert active_steps(traj.actions, 3) == [0] and evidence_ids(traj.actions, 3) == ["g1"]
    # the second search's gold passage left the context with the backtrack: the refusal is backed
    assert score(traj).step_components["ref"][3] == 1.0


def test_the_diagnostics_count_resampled_and_fallback_invalid_outputs():
    from ragrl.methods.evo_rag.method import diagnostics

    traj = episode(("search", "a", ["g1"]), ("backtrack", ""), ("invalid", ""), ("answer", "x"))
    traj.metadata.update(resampled=[{"turn": 0}, {"turn": 0}, {"turn": 3}], fallback_answers=[3])
    d = diagnostics(traj, EX)
    assert (d["steps"], d["search_steps"], d["backtracks"], d["invalid_steps"]) == (4.0, 1.0, 1.0, 1.0)
    assert (d["invalid_resampled"], d["fallback_answers"], d["refused"]) == (3.0, 1.0, 0.0)


def test_retrieval_bonus_counts_novel_hits_only_when_asked(cosines):
    traj = episode(("search", "q0", ["g1"]), ("search", "q_", ["g1", "x"]), ("answer", "x"))
    assert score(traj).step_components["ret"] == [1, 1, 0]
    assert score(traj, ["rewards.novel_hits_only=true"]).step_components["ret"] == [1, -1, 0]
    assert score(traj, ["rewards.top_k=1"]).step_components["ret"] == [1, 1, 0]


def test_action_penalty_reads_the_denominator_and_threshold(cosines):
    traj = episode(("search", "q0", ["n"]), ("search", "q1", ["n"]), ("answer", "x"))
    assert score(traj).step_components["act"] == [0, 0, 0]  # p(1) = 0.05 < 0.3
    grpo = ["train.algo=grpo", "train.stages=[]"]  # t/T_episode: not under preference cycles (below)
    per_episode = score(traj, ["rewards.act_denominator=episode", *grpo]).step_components["act"]
    assert per_episode == [0, -1, 0]  # p(1) = 1/3 ≥ 0.3 and cos 0.4 > 0
    strict = ["rewards.act_denominator=episode", "rewards.act_dup_threshold=0.5", *grpo]
    assert score(traj, strict).step_components["act"] == [0, 0, 0]
    with pytest.raises(RagrlError, match="preference cycles need t_max"):
        load_method("evo_rag", ["rewards.act_denominator=episode"])
    with pytest.raises(RagrlError, match="rewards.verifier.kind"):
        load_method("evo_rag", ["rewards.verifier={kind: gpt4}"])


def test_overlap_penalty_with_the_real_encoder():
    traj = episode(
        ("search", "Mars Pathfinder launch site", ["n"]),
        ("search", "Mars Pathfinder launch site", ["n"]),
        ("search", "launch location of the Mars Pathfinder probe", ["n"]),
        ("search", "recipe for banana bread", ["n"]),
        ("answer", "x"),
    )
    dup = score(traj).step_components["dup"]
    assert dup[0] == 0.0 and dup[1] == pytest.approx(-1.0, abs=1e-5)
    assert -1.0 < dup[2] < -0.6 and dup[3] > -0.3 and dup[4] == 0.0
    assert score(traj, ["rewards.clip_dup_at_zero=true"]).step_components["dup"][3] <= 0.0


def test_the_answer_verifier_and_a_judge_verdict_parser():
    traj = episode(("search", "q", ["Cape Canaveral is in Florida"]), ("refuse", "unknown"))
    assert score(traj, ["rewards.verifier={kind: answer}"]).step_components["ref"][1] == -1.0
    assert parse_verdict('sure: {"enough_evidence": "No"}') == "no" and parse_verdict("maybe") is None
    with pytest.raises(RagrlError, match="takes no settings"):
        score(traj, ["rewards.verifier={kind: gold, model: x}"])


def test_the_corpus_verifier_judges_a_refusal_by_the_questions_answerability():
    # an immediate refusal: the gold verifier backs it (no evidence in context), the corpus one does not
    # when the corpus can answer the question, and does when it cannot
    refuse_at_once = episode(("refuse", "unknown"))
    assert score(refuse_at_once).step_components["ref"] == [1.0]
    assert score(refuse_at_once, ["rewards.verifier={kind: corpus}"]).step_components["ref"] == [-1.0]
    unanswerable = dataclasses.replace(EX, metadata={"answerable": False})
    assert score(refuse_at_once, ["rewards.verifier={kind: corpus}"], unanswerable).step_components[
        "ref"
    ] == [1.0]
    # whatever the evidence: every gold passage found, the corpus verdict is still the question's own
    found = episode(("search", "q0", ["g1", "g2"]), ("refuse", "unknown"))
    assert score(found, ["rewards.verifier={kind: corpus}"], unanswerable).step_components["ref"][1] == 1.0
    with pytest.raises(RagrlError, match="takes no settings"):
        score(found, ["rewards.verifier={kind: corpus, strict: true}"])


def test_truncation_and_the_step_cost():
    traj = episode(("search", "q", ["g1"]), ("answer", "Florida"))
    traj.truncated = True  # the forced answer of a truncated episode is still scored
    result = score(traj, ["rewards.step_cost=-2"])
    assert result.step_components["ans"] == [0, 1] and result.step_components["step"] == [-2, -2]


def test_an_episode_without_gold_documents_is_an_error():
    with pytest.raises(RagrlError, match="no gold documents"):
        score(episode(("search", "q", ["a"]), ("answer", "x")), example=Example("q1", "Q?", ["x"]))
