from ragrl.rollout.replay import trajectory_from_completion
from ragrl.rollout.search_protocol import SearchR1Protocol


def test_completion_text_is_split_at_observations_and_corrective_messages():
    protocol = SearchR1Protocol()
    invalid = protocol.corrective(protocol.parse("no tags at all", 1))
    text = (
        "<think> first </think>\n<search> who founded Zorvex Labs </search>"
        "\n<information>Doc 1 (Title: Zorvex Labs) Zorvex Labs was founded by Mira Tolan."
        " <answer> x </answer></information>\n"
        "I am not sure" + invalid + "<answer> Mira Tolan </answer> trailing <search> ignored </search>"
    )
    traj = trajectory_from_completion("q1", text, protocol)
    assert [a.kind for a in traj.actions] == ["search", "invalid", "answer"]
    assert traj.queries == ["who founded Zorvex Labs"]
    assert traj.final_answer == "Mira Tolan" and traj.finish_reason == "answer"
    assert [s.kind for s in traj.segments] == ["policy", "env", "policy", "env", "policy"]
    assert traj.segments[-1].text == "<answer> Mira Tolan </answer>"  # a backend stops at </answer>
    assert traj.segments[3].text == invalid  # the corrective message (which shows <search> tags) is env text
    assert trajectory_from_completion("q2", "<search> a </search>", protocol).final_answer is None
