"""TIRESRAG-R1's §4 analysis: over-, good and under-thinking by correctness (Table 1) from trajectories,
with the offline proxy, an OpenAI-compatible judge, and ``ragrl analyze-thinking``."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ragrl.cli import app
from ragrl.errors import RagrlError
from ragrl.methods.tiresrag.analysis import analyze_thinking, categorize, search_prefixes, table1
from ragrl.methods.tiresrag.judges import evidence
from ragrl.rollout.records import write_trajectories
from ragrl.rollout.trajectory import Action, Segment, Trajectory
from tests.methods.tiresrag.test_judges import reply
from tests.methods.tiresrag.test_protocol import EX, engine

ZORVEX = "<think> Who built Zorvex? </think>\n<search> Zorvex </search>"
OSLO = "<think> And Oslo? </think>\n<search> Oslo </search>"
TOLAN = "<think> Mira Tolan. </think>\n<answer> Mira Tolan </answer>"
DONE = "<think> It stands. </think>"

EPISODES = {
    "over": [ZORVEX, OSLO, TOLAN, DONE],  # sufficient after the first of two searches
    "good": [OSLO, ZORVEX, TOLAN, DONE],  # sufficient exactly after the last search
    "under": [OSLO, "<think> Oslo. </think>\n<answer> Oslo </answer>", DONE],
    "guess": [TOLAN, DONE],  # right without any evidence
}


def play(name: str):  # noqa: ANN201
    [t] = engine(EPISODES[name]).run([EX])
    return t


def test_the_cuts_end_after_each_search_s_documents():
    t = play("over")
    cuts = search_prefixes(t)
    assert len(cuts) == 1 + t.num_searches == 3
    assert cuts[0].completion_text == ZORVEX and cuts[0].queries == ["Zorvex"]  # R_1, no documents yet
    assert evidence(cuts[0]) == ""
    assert "Mira Tolan" in evidence(cuts[1]) and "Oslo is the capital" not in evidence(cuts[1])
    assert "Oslo is the capital" in evidence(cuts[2]) and cuts[2].answers == []
    assert t.completion_text.startswith(cuts[2].completion_text)
    assert len(search_prefixes(play("guess"))) == 1  # no search: R_1 alone


@pytest.mark.parametrize(
    ("verdicts", "searches", "category", "first"),
    [
        ([0, 1, 1, 1], 2, "overthinking", 1),
        ([1, 1], 1, "overthinking", 0),  # the question alone sufficed: the one search was not needed
        ([0, 0, 1, 1], 2, "good thinking", 2),
        ([0, 0, 0, 1], 2, "good thinking", 3),  # only the last reasoning completes it
        ([0, 1], 0, "good thinking", 1),
        ([0, 0, 0], 1, "underthinking", None),
    ],
)
def test_categorize(verdicts, searches, category, first):
    assert categorize(verdicts, searches) == (category, first)


def test_table_one_with_the_offline_proxy():
    names = ["over", "good", "under", "guess"]
    verdicts = analyze_thinking([play(n) for n in names], [EX] * 4)
    got = {n: (v.category, v.correct, v.first_sufficient) for n, v in zip(names, verdicts, strict=True)}
    assert got == {
        "over": ("overthinking", True, 1),
        "good": ("good thinking", True, 2),
        "under": ("underthinking", False, None),
        "guess": ("underthinking", True, None),
    }
    assert verdicts[0].sufficient == [0.0, 1.0, 1.0, 1.0]
    assert table1(verdicts) == {
        "overthinking": {"correct": 1, "incorrect": 0},
        "good thinking": {"correct": 1, "incorrect": 0},
        "underthinking": {"correct": 1, "incorrect": 1},
    }
    with pytest.raises(RagrlError, match="2 episodes but 1 questions"):
        analyze_thinking([play("over"), play("good")], [EX])


def test_one_batch_to_a_judge_and_its_unreadable_replies_counted(chat_server):
    judge = {"kind": "openai", "base_url": chat_server.url, "model": "gpt-4o", "concurrency": 1}
    yes, no = (reply(f'{{"Sufficient Context To The Given Answer": {v}}}') for v in (1, 0))
    # "over": cuts 0, 1, 2 and the full episode; "under": cuts 0, 1 and the full episode
    chat_server.script = [no, yes, yes, yes, no, no, reply("no idea")]
    verdicts = analyze_thinking([play("over"), play("under")], [EX, EX], judge=judge)
    assert len(chat_server.requests) == 4 + 3
    assert [v.category for v in verdicts] == ["overthinking", "underthinking"]
    assert verdicts[1].sufficient == [0.0, 0.0, 0.0] and verdicts[1].unreadable == 1
    first = chat_server.requests[0]["body"]["messages"][1]["content"]
    assert (
        "### ANSWER\nMira Tolan" in first
        and "<answer>" not in chat_server.requests[3]["body"]["messages"][1]["content"]
    )


def test_the_command_prints_table_one(tmp_path):
    names = ["over", "good", "under", "guess"]
    trajectories = tmp_path / "trajectories.jsonl"
    write_trajectories(trajectories, [play(n) for n in names])
    gold = tmp_path / "gold.jsonl"
    gold.write_text(
        json.dumps({"id": "q1", "question": EX.question, "golden_answers": ["Mira Tolan"]}) + "\n"
    )
    out = tmp_path / "verdicts.jsonl"
    args = ["analyze-thinking", "--trajectories", str(trajectories), "--gold", str(gold), "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[:2] == ["| category | correct | incorrect |", "|---|---|---|"]
    assert lines[2] == "| overthinking | 1 (33%) | 0 (0%) |"
    assert lines[4] == "| underthinking | 1 (33%) | 1 (100%) |"
    summary = json.loads(lines[-1])
    assert summary["n"] == 4 and summary["judge"] == "proxy" and summary["judge_requests"] == 4 + 4 + 3 + 2
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["category"] for r in rows] == [
        "overthinking",
        "good thinking",
        "underthinking",
        "underthinking",
    ]
    bad = CliRunner().invoke(app, [*args[:5], "--config", "search_r1"])
    assert isinstance(bad.exception, RagrlError) and "no tiresrag_sufficiency component" in str(bad.exception)


def test_replayed_text_a_search_that_never_ran_and_earlier_judges():
    from ragrl.methods.tiresrag.protocol import TiresragProtocol
    from ragrl.rollout.replay import trajectory_from_completion

    live = play("over")
    text = live.completion_text.replace("</information>\n\n", "</information>\n\n  \n", 1)  # blank text
    replayed = trajectory_from_completion("q1", text, TiresragProtocol())
    cuts = search_prefixes(replayed)  # a blank piece of text between observations is no turn
    assert len(cuts) == 3 and [c.segments[-1].kind for c in cuts] == ["policy", "env", "env"]
    assert [len(c.actions) for c in cuts] == [1, 1, 2] and "Oslo is the capital" in evidence(cuts[2])
    [verdict] = analyze_thinking([replayed], [EX])
    assert (verdict.category, verdict.first_sufficient, verdict.searches) == ("overthinking", 1, 2)

    corrected = Trajectory(  # replayed: an observation, blank text, a corrective message, then a turn
        "q1", [0],
        [Segment("policy", [], ZORVEX), Segment("env", [], evidence(cuts[1])), Segment("policy", [], "\n"),
         Segment("env", [], "\nThat was not a valid action.\n"), Segment("policy", [], TOLAN)],
        [Action("search", "Zorvex", turn=0), Action("answer", "Mira Tolan", turn=1)],
        final_answer="Mira Tolan", metadata={"replayed_from_text": True},
    )  # fmt: skip
    assert len(search_prefixes(corrected)) == 2  # one search, one cut after it (not two)
    cut_short = Trajectory(  # the budget ran out on the search: no documents came back
        "q1", [0], [Segment("policy", [1], ZORVEX)], [Action("search", "Zorvex", turn=0)]
    )
    [v] = analyze_thinking([cut_short], [EX])
    assert v.searches == 0 and v.sufficient == [0.0, 0.0] and v.category == "underthinking"

    judged = play("over")
    judged.metadata["judge"] = {"tiresrag_sufficiency": {"reply": "?", "parsed": False}}  # an old judge's
    [v] = analyze_thinking([judged], [EX])
    assert v.unreadable == 0 and judged.metadata["judge"]["tiresrag_sufficiency"]["parsed"] is False
