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


def _episode(turns, observations, answer):
    """An episode: policy turns with an observation after each but the last."""
    segs = []
    for i, t in enumerate(turns):
        segs.append(Segment("policy", [i], t, [0.0]))
        if i < len(observations):
            segs.append(Segment("env", [99], observations[i]))
    actions = [Action("answer", answer, len(turns) - 1)] if answer is not None else []
    return Trajectory("q1", [1], segments=segs, actions=actions, final_answer=answer)


FOUND = "\n<information>Doc 1 (Title: Zorvex Labs) It was founded by Ilsa Varn of Tamrin.</information>\n"
MISSED = "\n<information>Doc 1 (Title: Orvale) Orvale is a river.</information>\n"
SEARCH = "<think> who founded it </think>\n<search> Zorvex Labs founder </search>"

# ragrl's corrective observation after an invalid turn: its example <answer> block is read as the authors'
# function reads theirs (a wrong answer in a broken format)
CORRECTIVE = (
    "\nThat was not a valid action (no <search> or <answer> block). Write a query as <search> query "
    "</search> or the final answer as <answer> answer </answer>.\n"
)

# Search-R1's compute_score_em (verl/utils/reward_score/qa_em_format.py, PeterGriffinJin/Search-R1 at
# a14dc3a) gives these for "<|im_start|>assistant\n" + the episode's text, the answer in a second <answer>
# (its extraction needs two: the prompt holds an example), structure 0.2, final 0.1, retrieval 0.1.
GATED = [
    ("right, valid", [SEARCH, "<think> found </think>\n<answer> Tamrin </answer>"], [FOUND], "Tamrin", 1.0),
    ("wrong, valid, gold retrieved", [SEARCH, "<think> x </think>\n<answer> Orvale </answer>"], [FOUND],
     "Orvale", 0.3),
    ("wrong, valid, gold not retrieved", [SEARCH, "<think> x </think>\n<answer> Orvale </answer>"], [MISSED],
     "Orvale", 0.2),
    ("right, text before the first think", ["So: " + SEARCH, "<think> x </think>\n<answer> Tamrin </answer>"],
     [FOUND], "Tamrin", 0.8),
    ("right, a search with no think after the information",
     [SEARCH, "<search> again </search>", "<think> x </think>\n<answer> Tamrin </answer>"], [FOUND, FOUND],
     "Tamrin", 0.8),
    ("wrong, broken format", ["<search> q </search>", "<answer> Orvale </answer>"], [MISSED], "Orvale", 0.1),
    ("no answer, broken format", [SEARCH, "<think> unsure"], [FOUND], None, 0.0),
    ("right, no search", ["<think> I know </think>\n<answer> tamrin. </answer>"], [], "tamrin.", 1.0),
    ("an invalid turn, never an answer", ["I am not sure", "<think> still unsure"], [CORRECTIVE], None, 0.1),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "turns", "observations", "answer", "expected"), GATED, ids=[g[0] for g in GATED]
)
def test_search_r1_em_format_gates_its_terms_as_the_authors_code(case, turns, observations, answer, expected):
    reward = build_reward([{"name": "search_r1_em_format", "weight": 1.0, "retrieval_score": 0.1}])
    assert reward(_episode(turns, observations, answer), EX).total == pytest.approx(expected)


def test_search_r1_em_format_defaults_are_the_format_scripts_and_the_text_after_the_answer_counts():
    from ragrl.methods.search_r1 import valid_sequence

    reward = build_reward([{"name": "search_r1_em_format", "weight": 1.0}])  # 0.2 / 0.1 / retrieval 0
    wrong = _episode([SEARCH, "<think> x </think>\n<answer> Orvale </answer>"], [FOUND], "Orvale")
    assert reward(wrong, EX).total == pytest.approx(0.2)
    assert valid_sequence("<think> a </think>\n<answer> b </answer>\n")
    assert not valid_sequence("<think> a </think>\n<answer> b </answer> and more")  # nothing after the end
    assert not valid_sequence("<think> a </think><think> b </think><answer> c </answer>")  # one think a step
    assert not valid_sequence("<think> a </think><search> q </search>")  # ends before an answer
