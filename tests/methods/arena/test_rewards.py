"""ARENA's four rewards (methods/arena.md §2): format, accuracy (EM, F1, a judge), relevance, the bonus
and the total, with every edge case the spec lists."""

import importlib.util
from pathlib import Path

import pytest

from ragrl.data.references import GOLD_REFERENCE_KEY
from ragrl.data.schema import Example
from ragrl.errors import RagrlError
from ragrl.methods import load_method
from ragrl.methods.arena.evidence import gold_ids
from ragrl.methods.arena.protocol import visible_text
from ragrl.methods.arena.rewards import (
    accuracy_score,
    format_score,
    relevance_score,
    think_answer_format_score,
)
from ragrl.metrics.normalize import normalize
from ragrl.rewards import RewardContext, build_reward

_spec = importlib.util.spec_from_file_location("arena_cases", Path(__file__).parent / "cases.py")
cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cases)
PASSAGES, EX, GOOD, traj = cases.PASSAGES, cases.EX, cases.GOOD, cases.traj


# -- §2.1 format ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "score"),
    [
        (GOOD, 1.0),
        ("<relevance>[6,8]</relevance><analysis>a</analysis><answer>b</answer>", 1.0),  # no whitespace needed
        ("<relevance>[6,8]</relevance> \n\t <analysis>a</analysis>\n\n<answer>b</answer>", 1.0),
        ("<relevance>\n [6, 8] \n</relevance>\n<analysis>\n a \n</analysis>\n<answer>  b  </answer>", 1.0),
        ("<relevance></relevance><analysis></analysis><answer></answer>", 1.0),  # empty sections pass
        (" " + GOOD, 0.0),  # must start exactly with <relevance>
        ("\n" + GOOD, 0.0),
        ("Sure! " + GOOD, 0.0),
        ("<relevance>[6]</relevance> so <analysis>a</analysis><answer>b</answer>", 0.0),  # text between
        ("<relevance>[6]</relevance><analysis>a</analysis> thus <answer>b</answer>", 0.0),
        ("<relevance>[6]</relevance><analysis>since a < b</analysis><answer>b</answer>", 0.0),  # '<' inside
        ("<relevance>[6]</relevance><analysis><b>a</b></analysis><answer>b</answer>", 0.0),  # nested tag
        ("<relevance>[6]</relevance><analysis>a</analysis><answer><x></answer>", 0.0),
        (GOOD + " trailing", 0.0),  # extra text on the same line after </answer>
        (GOOD + "<answer>again</answer>", 0.0),
        (GOOD + "\n", 1.0),  # MULTILINE $: a trailing newline passes ...
        (GOOD + "\nand more text on a new line", 1.0),  # ... and so does text on a new line
        (GOOD + "\n<answer>second</answer>", 1.0),
        ("<analysis>a</analysis><relevance>[6]</relevance><answer>b</answer>", 0.0),  # wrong order
        ("<relevance>[6]</relevance><answer>b</answer>", 0.0),  # a section missing
        ("<relevance>[6]</relevance><analysis>a</analysis><answer>b", 0.0),  # unclosed
        ("<RELEVANCE>[6]</RELEVANCE><analysis>a</analysis><answer>b</answer>", 0.0),  # case matters
        ("", 0.0),
    ],
)
def test_format_reward_edge_cases(text, score):
    assert format_score(text) == score
    assert build_reward([{"name": "arena_format"}])(traj(text), EX).total == score


@pytest.mark.parametrize(
    "eos", ["<|eot|>", "<|im_end|>", "<|eot_id|>", "</s>", "<eos>", "<｜end▁of▁sentence｜>"]
)
def test_format_is_scored_with_special_tokens_skipped(eos):
    # the engine decodes policy segments with their special tokens; the authors score without them
    assert format_score(GOOD + eos) == 0.0
    assert visible_text(GOOD + eos) == GOOD
    assert build_reward([{"name": "arena_format"}])(traj(GOOD + eos), EX).total == 1.0


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("<think>reason</think>\n<answer>Republican</answer>", 1.0),
        ("<think></think><answer>x</answer>\n", 1.0),
        ("<think>reason</think>\n<answer>Republican</answer>\nmore", 1.0),
        (" <think>reason</think><answer>x</answer>", 0.0),
        ("<think>a < b</think><answer>x</answer>", 0.0),
        ("<think>r</think> so <answer>x</answer>", 0.0),
        ("<think>r</think><answer>x</answer> trailing", 0.0),
        ("<answer>x</answer>", 0.0),
        (GOOD, 0.0),
    ],
)
def test_think_answer_format(text, score):
    assert think_answer_format_score(text) == score
    assert build_reward([{"name": "think_answer_format"}])(traj(text + "<|eot|>"), EX).total == score


# -- §2.2 accuracy --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("U.S.", "u s"),  # punctuation becomes a space (SQuAD deletes it: "us")
        ("The Beatles", "beatles"),
        ("a cat and an owl", "cat and owl"),
        ("New_York", "new york"),
        ("It\u2019s `quoted\u00b4", "it s quoted"),
        ("  Many   spaces\n", "many spaces"),
        ("theater", "theater"),  # whole words only
    ],
)
def test_arena_normalization(raw, normalized):
    assert normalize(raw, "arena") == normalized


def test_exact_match_and_f1_take_the_max_over_labels():
    labels = ["New York City", "NYC", "the Big Apple"]
    assert accuracy_score("nyc", labels) == 1.0
    assert accuracy_score("Big Apple.", labels) == 1.0
    assert accuracy_score("New York", labels) == 0.0
    assert accuracy_score("New York", labels, metric="f1") == pytest.approx(0.8)  # vs "new york city"
    assert accuracy_score("U.S.", ["US"]) == 0.0  # "u s" != "us" under ARENA's normalization
    assert accuracy_score("U.S.", ["U S"]) == 1.0
    assert accuracy_score("yes", ["no"], metric="f1") == 0.0
    assert accuracy_score("Republican", []) == 0.0  # no gold answer: nothing to match


@pytest.mark.parametrize(
    ("text", "score"),
    [
        (GOOD, 1.0),
        ("<answer> the Republican Party? </answer>", 0.0),
        ("<answer>\n Republican.\n</answer>", 1.0),
        ("rambling <answer>republican</answer> more rambling", 1.0),  # independent of the format
        ("<answer>Republican</answer><answer>Democratic</answer>", 1.0),  # the first span counts
        ("<answer>Democratic</answer><answer>Republican</answer>", 0.0),
        ("Republican", 0.0),  # no <answer> span: the answer is ""
        ("<answer></answer>", 0.0),
    ],
)
def test_accuracy_reward_reads_the_first_answer_span(text, score):
    assert build_reward([{"name": "arena_accuracy"}])(traj(text), EX).total == score


def test_accuracy_reward_f1_variant():
    reward = build_reward([{"name": "arena_accuracy", "metric": "f1"}])
    ex = Example("q1", "?", ["Republican Party"], passages=PASSAGES, metadata={GOLD_REFERENCE_KEY: [6]})
    assert reward(traj("<answer>Republican</answer>"), ex).total == pytest.approx(2 / 3)
    with pytest.raises(RagrlError, match="metric must be em, f1 or judge"):
        build_reward([{"name": "arena_accuracy", "metric": "bleu"}])(traj(GOOD), EX)


def test_judge_accuracy_variant(monkeypatch):
    import ragrl.metrics.judge_clients
    from ragrl.methods.arena import rewards as arena

    class FakeJudge:
        def __init__(self):
            self.prompts = []

        def complete(self, messages):
            self.prompts.append(messages[-1]["content"])
            prediction = messages[-1]["content"].split("The model's answer is:")[1]
            if "GOP" in prediction:
                return "No, yes would be wrong"  # the reward reads a leading yes / no first
            return "yes" if "Republican" in prediction else "unclear"

    judge = FakeJudge()
    specs = []
    monkeypatch.setattr(ragrl.metrics.judge_clients, "make_judge", lambda spec: specs.append(spec) or judge)
    arena._judge_client.cache_clear()
    settings = {"kind": "openai", "base_url": "http://judge", "model": "m"}
    reward = build_reward([{"name": "arena_accuracy", "metric": "judge", "judge": settings}])
    scores = [
        reward(traj(f"<answer>{a}</answer>"), EX).total
        for a in ("the Republicans", "the Republicans", "GOP", "unsure", " ")
    ]
    assert scores == [1.0, 1.0, 0.0, 0.5, 0.0]
    assert len(judge.prompts) == 3  # a repeated prompt is cached; an empty answer is never sent
    assert specs == [settings]  # one client per settings
    arena._judge_client.cache_clear()
    with pytest.raises(RagrlError, match="needs judge settings"):
        build_reward([{"name": "arena_accuracy", "metric": "judge"}])(traj("<answer>x</answer>"), EX)
    arena._judge_client.cache_clear()


# -- §2.3 relevance -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("span", "score"),
    [
        ("[6,8]", 1.0),
        ("[8,6]", 1.0),  # order does not matter
        ("[8, 6, 6]", 1.0),  # nor do duplicates
        ("\n [6, 8] \n", 1.0),
        ("[6.0,8]", 1.0),  # Python: 6.0 == 6
        ("[6,8,9]", 0.5),  # a superset is only a partial match
        ("[1,2,3,4,5,6,7,8,9,10]", 0.5),  # "list everything" earns 0.5
        ("[6]", 0.5),
        ("[6,9]", 0.5),
        ("[1,2]", 0.0),
        ("[]", 0.0),
        ("6,8", 0.0),  # not a JSON list
        ("6", 0.0),  # an int is not iterable
        ('["6","8"]', 0.0),  # strings never equal ints
        ('[6,"8"]', 0.0),  # mixed types cannot be sorted
        ("[[6],[8]]", 0.0),  # unhashable items
        ("[6,8", 0.0),
        ("none", 0.0),
    ],
)
def test_relevance_reward_cases(span, score):
    text = f"<relevance>{span}</relevance><analysis>a</analysis><answer>b</answer>"
    assert relevance_score(text, [6, 8]) == score
    assert build_reward([{"name": "arena_relevance"}])(traj(text), EX).total == score


def test_relevance_reward_span_rules():
    assert relevance_score("no relevance section", [6, 8]) == 0.0
    assert relevance_score("<relevance>[1]</relevance> <relevance>[6,8]</relevance>", [6, 8]) == 0.0
    assert relevance_score("prefix <relevance>[6,8]</relevance> suffix", [6, 8]) == 1.0  # format-free
    # the authors' json.loads reading keeps Python's quirks: true == 1
    assert relevance_score("<relevance>[true, 6]</relevance>", [1, 6]) == 1.0


def test_unresolved_gold_id_makes_full_relevance_credit_impossible():
    ex = Example("q2", "?", ["x"], passages=PASSAGES, metadata={GOLD_REFERENCE_KEY: [-1, 6]})
    reward = build_reward([{"name": "arena_relevance"}])
    assert reward(traj("<relevance>[6]</relevance>"), ex).total == 0.5
    assert reward(traj("<relevance>[6,8]</relevance>"), ex).total == 0.5
    assert gold_ids(ex) == [-1, 6]


def test_gold_ids_from_metadata_are_sorted_and_validated():
    ex = Example("q3", "?", ["x"], passages=PASSAGES, metadata={GOLD_REFERENCE_KEY: [8, 6, 8]})
    assert gold_ids(ex) == [6, 8]
    bad = Example("q4", "?", ["x"], passages=PASSAGES, metadata={GOLD_REFERENCE_KEY: ["6"]})
    with pytest.raises(RagrlError, match="'q4'.*gold_reference_ids must be a list of integers"):
        gold_ids(bad)


def test_gold_ids_computed_by_the_references_module():
    from ragrl.data import references

    assert references.GOLD_REFERENCE_KEY == GOLD_REFERENCE_KEY
    ex = Example("q5", "?", ["x"], supporting_ids=["p8", "p3"], passages=PASSAGES)
    assert gold_ids(ex) == [3, 8]
    missing = Example("q6", "?", ["x"], supporting_ids=["p8", "p99"], passages=PASSAGES)
    assert gold_ids(missing) == [-1, 8]  # an unresolved fact: full relevance credit is impossible
    reward = build_reward([{"name": "arena_relevance"}])
    assert reward(traj("<relevance>[8]</relevance>"), missing).total == 0.5


# -- §2.4 / §2.5 bonus and total ------------------------------------------------------------------------

WITH_ANALYSIS = "<analysis>a</analysis>"


@pytest.mark.parametrize(
    ("text", "components", "total"),
    [
        # format, accuracy, relevance, bonus -> total (arena.md §2.5)
        (GOOD, (1, 1, 1, 10), 13.0),
        (f"<relevance>[6]</relevance>{WITH_ANALYSIS}<answer>Republican</answer>", (1, 1, 0.5, 0), 2.5),
        (f"<relevance>[1]</relevance>{WITH_ANALYSIS}<answer>Republican</answer>", (1, 1, 0, 0), 2.0),
        (f"<relevance>[6,8]</relevance>{WITH_ANALYSIS}<answer>Democratic</answer>", (1, 0, 1, 0), 2.0),
        (f"<relevance>[8,9]</relevance>{WITH_ANALYSIS}<answer>Democratic</answer>", (1, 0, 0.5, 0), 1.5),
        (f"<relevance>[]</relevance>{WITH_ANALYSIS}<answer>Democratic</answer>", (1, 0, 0, 0), 1.0),
        (" " + GOOD, (0, 1, 1, 0), 2.0),  # format fails: no bonus, the rest still counts
        ("I think <relevance>[6]</relevance> <answer>Republican</answer>", (0, 1, 0.5, 0), 1.5),
        (
            "<relevance>[6,8]</relevance><analysis>1 < 2</analysis><answer>Democratic</answer>",
            (0, 0, 1, 0),
            1.0,
        ),
        ("no tags at all", (0, 0, 0, 0), 0.0),
    ],
)
def test_reward_totals_table(text, components, total):
    reward = load_method("arena").reward
    result = reward(traj(text + "<|eot|>"), EX, RewardContext())
    names = ("arena_format", "arena_accuracy", "arena_relevance", "arena_bonus")
    assert tuple(result.components[n] for n in names) == components
    assert result.total == total


def test_bonus_value_is_a_parameter():
    reward = build_reward([{"name": "arena_bonus", "value": 3.0}])
    assert reward(traj(GOOD), EX).total == 3.0
    assert reward(traj(GOOD.replace("[6,8]", "[6]")), EX).total == 0.0
