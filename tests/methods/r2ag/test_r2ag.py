"""R²AG's steering grammar (§1.2) and its reward, Eq. 5 (§3.2), with the spec's worked example."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ragrl.cli import app
from ragrl.data.schema import Example
from ragrl.methods import load_method
from ragrl.methods.r2ag.protocol import (
    BASE,
    PREDICTED,
    R2agProtocol,
    format_segments,
    parse_steering,
    step_actions,
    step_records,
)
from ragrl.methods.r2ag.rewards import step_reward, top_ap, trajectory_step_rewards
from ragrl.rewards.registry import RewardContext
from ragrl.rollout.trajectory import Segment, Trajectory

GOLD = ["A", "B"]
EX = Example("q1", "Who is the mother of the director of X?", ["Ann"], supporting_ids=GOLD)


def step(
    text: str, retrieved: dict[str, list[str]], prior: list[str] = (), truncated: bool = False
) -> Trajectory:
    """A recorded steering step, built as the rollout records it."""
    s = parse_steering(text)
    traj = Trajectory("q1", [], metadata={"prior_ids": list(prior), "steering_steps": 1})
    traj.segments.append(Segment("policy", [], text, [], finish_reason="length" if truncated else "eos"))
    traj.actions = step_actions(s, 0, [retrieved[q] for _, q in s.queries])
    return traj


ROUND_1 = (
    "<think> X was directed by Y, whose mother I may know. </think>\n"
    "<base-Q> Who directed X? </base-Q>\n<base-Q> When was X released? </base-Q>\n"
    "<predicted-Q> Who is the mother of Y? </predicted-Q>"
)
ROUND_1_DOCS = {"Who directed X?": ["A"], "When was X released?": ["N"], "Who is the mother of Y?": ["B"]}
ROUND_2 = (
    "<think> Both facts are here. </think><base-Q>stop retrieval</base-Q><predicted-Q>none</predicted-Q>"
)


def total(traj: Trajectory, example: Example = EX) -> float:
    method = load_method("r2ag")
    return method.reward.score([traj], [example], RewardContext())[0].total


# --- the grammar ------------------------------------------------------------------------------------


def test_parse_reads_several_queries_of_each_kind_in_written_order():
    s = parse_steering(ROUND_1)
    assert s.think == "X was directed by Y, whose mother I may know."
    assert s.base == ("Who directed X?", "When was X released?")
    assert s.predicted == ("Who is the mother of Y?",)
    assert not s.stop and s.valid
    assert s.queries == [
        (BASE, "Who directed X?"),
        (BASE, "When was X released?"),
        (PREDICTED, "Who is the mother of Y?"),
    ]


@pytest.mark.parametrize(
    "stop", ["stop retrieval", " Stop   retrieval. ", '"STOP RETRIEVAL"', "stop retrieval!"]
)
def test_the_stop_sentinel_ignores_case_space_quotes_and_final_punctuation(stop):
    s = parse_steering(f"<think>t</think><base-Q>{stop}</base-Q><predicted-Q> None. </predicted-Q>")
    assert s.stop and s.base == () and s.predicted == () and s.valid


def test_tags_inside_think_are_not_queries_and_empty_tags_are_counted():
    s = parse_steering(
        "<think> maybe <base-Q> Q0 </base-Q> </think> <base-Q>  </base-Q> <base-Q> Q1 </base-Q>"
    )
    assert s.base == ("Q1",) and s.empty_queries == 1
    assert not parse_steering("<think> nothing to ask </think>").valid
    assert not parse_steering("<base-Q> unclosed").valid
    assert parse_steering("<base-Q> Q </base-Q>").think is None


def test_format_segments_count_query_tags_after_the_first_think_sentinels_included():
    assert format_segments(ROUND_2) == 2
    assert format_segments("<base-Q> Q </base-Q><think> t </think><base-Q> R </base-Q>") == 1
    assert format_segments("<base-Q> Q </base-Q>") == 0


def test_the_prompt_shows_the_question_and_the_context_documents():
    protocol = R2agProtocol()
    state = Example(
        "q", "Who?", ["a"], metadata={"r2ag_context": [{"id": "A", "title": "T", "text": "Body."}]}
    )
    (message,) = protocol.messages(state)
    assert message["content"].endswith("Question: Who?\nEvidence:\n[1] T: Body.")
    (root,) = protocol.messages(Example("q", "Who?", ["a"]))
    assert root["content"].endswith("Evidence:\n(none yet)")


def test_a_bad_template_is_refused_with_its_key():
    from ragrl.errors import RagrlError

    with pytest.raises(RagrlError, match=r"protocol.user: bad template .*\{question\} and \{evidence\}"):
        load_method("r2ag", ["protocol.user=Question {q}"])


# --- the reward, Eq. 5 ----------------------------------------------------------------------------------


def test_the_worked_example_round_1_is_067():
    traj = step(ROUND_1, ROUND_1_DOCS)
    (r,) = trajectory_step_rewards(traj, EX)
    assert r.multi_hit == pytest.approx(1 + 1.25 * 1)  # A by a base query, B by a predicted one
    assert r.ap == pytest.approx(0.5 + 0.5)
    assert r.joint_hit == 0.0 and r.format == pytest.approx(0.02) and r.zeroed is None
    assert total(traj) == pytest.approx(0.67)


def test_the_worked_example_round_2_stops_with_everything_and_scores_032():
    traj = step(ROUND_2, {}, prior=["A", "B"])
    assert total(traj) == pytest.approx(0.32)


def test_a_premature_stop_zeroes_everything():
    text = ROUND_1.replace("<predicted-Q>", "<base-Q> stop retrieval </base-Q><predicted-Q>")
    traj = step(text, {**ROUND_1_DOCS, "Who is the mother of Y?": ["N"]})  # B is not found
    (r,) = trajectory_step_rewards(traj, EX)
    assert r.zeroed == "premature stop" and total(traj) == 0.0
    # the same stop, when this step's own retrievals complete the gold set, is no longer premature
    traj = step(text, ROUND_1_DOCS)
    assert total(traj) == pytest.approx(0.2 * 2.25 + 0.3 + 0.2 * 1.0 + 0.02)


def test_no_think_or_a_truncated_output_zeroes_everything():
    no_think = ROUND_1.split("</think>\n", 1)[1]
    assert trajectory_step_rewards(step(no_think, ROUND_1_DOCS), EX)[0].zeroed == "no <think>"
    assert total(step(no_think, ROUND_1_DOCS)) == 0.0
    assert trajectory_step_rewards(step(ROUND_1, ROUND_1_DOCS, truncated=True), EX)[0].zeroed == "truncated"


def test_ap_rewards_order_and_needs_no_new_gold():
    assert top_ap(["N", "A"], {"A", "B"}, 4) == pytest.approx(0.25)
    assert top_ap(["A", "N"], {"A", "B"}, 4) == pytest.approx(0.5)
    assert top_ap(["A", "B"], {"A", "B"}, 4) == pytest.approx(1.0)
    assert top_ap(["N", "N", "A"], {"A", "B"}, 2) == 0.0  # only the first t count
    # a gold document counts once: four queries that all find A are worth A once
    assert top_ap(["A", "A", "A", "A"], {"A", "B"}, 4) == pytest.approx(0.5)
    assert top_ap(["A", "A", "B"], {"A", "B"}, 4) == pytest.approx((1 / 1 + 2 / 3) / 2)
    a = step("<think>t</think><base-Q> q1 </base-Q><base-Q> q2 </base-Q>", {"q1": ["N"], "q2": ["A"]})
    b = step("<think>t</think><base-Q> q2 </base-Q><base-Q> q1 </base-Q>", {"q1": ["N"], "q2": ["A"]})
    assert total(a) == pytest.approx(0.2 * 1 + 0.2 * 0.25 + 0.02)
    assert total(b) == pytest.approx(0.2 * 1 + 0.2 * 0.5 + 0.02)
    # a gold document found before: no multi-hit, still in AP
    (r,) = trajectory_step_rewards(
        step("<think>t</think><base-Q> q2 </base-Q>", {"q2": ["A"]}, prior=["A"]), EX
    )
    assert r.multi_hit == 0.0 and r.ap == pytest.approx(0.5)


def test_multi_hit_counts_each_new_gold_document_once():
    text = "<think>t</think><base-Q> q1 </base-Q><base-Q> q1 again </base-Q><predicted-Q> p </predicted-Q>"
    (r,) = trajectory_step_rewards(step(text, {"q1": ["A"], "q1 again": ["A"], "p": ["A"]}), EX)
    assert r.multi_hit == 1.0  # the first query that found A; the repeats add nothing
    # a predicted query that finds a new gold document first earns the predicted weight
    (rec,) = step_records(step(text, {"q1": ["N"], "q1 again": ["N"], "p": ["A"]}))
    assert step_reward(rec, [], GOLD, pred_weight=2.0).multi_hit == 2.0


def test_a_tree_trajectory_sums_its_steps_each_against_what_came_before():
    s1, s2 = parse_steering(ROUND_1), parse_steering(ROUND_2)
    traj = Trajectory("q1", [], metadata={"prior_ids": [], "steering_steps": 2})
    traj.segments += [Segment("policy", [], ROUND_1, [], "eos"), Segment("policy", [], ROUND_2, [], "eos")]
    traj.actions = step_actions(s1, 0, [ROUND_1_DOCS[q] for _, q in s1.queries]) + step_actions(s2, 1, [])
    rewards = trajectory_step_rewards(traj, EX)
    assert [r.joint_hit for r in rewards] == [0.0, 1.0]
    assert total(traj) == pytest.approx(0.67 + 0.32)


# --- ragrl reward r2ag -------------------------------------------------------------------------------


def test_ragrl_reward_scores_recorded_steps(tmp_path):
    gold = tmp_path / "gold.jsonl"
    gold.write_text(json.dumps(EX.to_record()) + "\n")
    steps = tmp_path / "steps.jsonl"
    records = [
        {
            "id": "q1",
            "completion": ROUND_1,
            "retrieved": {
                "Who directed X?": "A",
                "When was X released?": ["N"],
                "Who is the mother of Y?": ["B", "N"],
            },
        },
        {"id": "q1", "completion": ROUND_2, "retrieved": {}, "context": ["A", "B"]},
        {"id": "q1", "completion": ROUND_1, "retrieved": ROUND_1_DOCS, "truncated": True},
    ]
    steps.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = CliRunner().invoke(app, ["reward", "r2ag", "--completions", str(steps), "--gold", str(gold)])
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in result.stdout.strip().splitlines()]
    assert [x["total"] for x in lines[:3]] == pytest.approx([0.67, 0.32, 0.0])
    assert lines[0] == {
        "id": "q1",
        "r2ag_multi_hit": 2.25,
        "r2ag_joint_hit": 0.0,
        "r2ag_ap": 1.0,
        "r2ag_format": 0.02,
        "total": pytest.approx(0.67),
    }
    assert lines[3]["n"] == 3


def test_ragrl_reward_names_the_line_and_field_of_a_bad_step(tmp_path):
    gold = tmp_path / "gold.jsonl"
    gold.write_text(json.dumps(EX.to_record()) + "\n")
    steps = tmp_path / "steps.jsonl"
    steps.write_text(
        json.dumps({"id": "q1", "completion": ROUND_1, "retrieved": {"Who directed X?": ["A"]}}) + "\n"
    )
    result = CliRunner().invoke(app, ["reward", "r2ag", "--completions", str(steps), "--gold", str(gold)])
    assert result.exit_code != 0
    message = str(result.exception)
    assert message.startswith(f"{steps}:1: field 'retrieved'") and "'When was X released?'" in message
