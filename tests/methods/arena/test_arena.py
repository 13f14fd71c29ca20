"""ARENA (methods/arena.md): the output contract, the four rewards with every edge case the spec lists,
prompt rendering, the parse rule, the single-turn episode, the citation audit and the packaged configs."""

import pytest

from ragrl.data.references import GOLD_REFERENCE_KEY
from ragrl.data.schema import Example, Passage
from ragrl.errors import RagrlError
from ragrl.methods import load_method
from ragrl.methods.arena.evidence import gold_ids
from ragrl.methods.arena.method import ArenaConfig, ArenaOracle, oracle_reply
from ragrl.methods.arena.protocol import (
    ARENA_PROMPT,
    ArenaProtocol,
    ArenaProtocolConfig,
    citation,
    cited_ids,
    visible_text,
)
from ragrl.methods.arena.rewards import (
    accuracy_score,
    citation_audit,
    format_score,
    relevance_score,
    think_answer_format_score,
)
from ragrl.metrics.normalize import normalize
from ragrl.rewards import RewardContext, build_reward
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.engine import RolloutEngine
from ragrl.rollout.replay import trajectory_from_completion
from ragrl.rollout.scripted import DemonstratorBackend, ScriptedBackend
from ragrl.rollout.trajectory import Segment, Trajectory

PASSAGES = [
    Passage(f"p{i}", f"Title {i}", f"Text of passage {i}.") for i in range(1, 11)
]  # 10 references, gold 6 and 8 as in the paper's case study
EX = Example(
    "q1",
    "What party was the secretary of commerce and housing under the 42 Governor of Kansas?",
    ["Republican"],
    supporting_ids=["p6", "p8"],
    passages=PASSAGES,
    metadata={GOLD_REFERENCE_KEY: [6, 8]},
)
GOOD = (
    "<relevance>[6,8]</relevance>\n"
    "<analysis>Finney was governor [6]. Knight served under her [8].</analysis>\n"
    "<answer>Republican</answer>"
)


def traj(text: str, example_id: str = "q1") -> Trajectory:
    """A one-turn trajectory whose policy segment holds ``text``, parsed as the engine would."""
    action = ArenaProtocol().parse(text, 0)
    final = action.content if action.kind == "answer" else None
    return Trajectory(
        example_id, [1], segments=[Segment("policy", [7], text, [0.0])], actions=[action], final_answer=final
    )


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


# -- §1.3 / §1.4 the prompt -----------------------------------------------------------------------------


def test_prompt_numbers_the_passages_in_order_without_titles():
    messages = ArenaProtocol().messages(EX)
    assert [m["role"] for m in messages] == ["user"]  # one user message, no system message
    content = messages[0]["content"]
    block = "\n".join(f"{i}. Text of passage {i}." for i in range(1, 11))
    assert f"<references>\n{block}\n</references>" in content
    assert f"<question>\n{EX.question}\n</question>" in content
    assert "Title" not in content
    assert content.startswith(ARENA_PROMPT.split("{question}")[0])
    for tag in ("<relevance>", "<analysis>", "<answer>"):
        assert tag in content.split("**User**")[0]  # the three-section rule precedes the input


def test_prompt_options_titles_system_and_single_passage():
    titled = ArenaProtocol(ArenaProtocolConfig(reference_template="{index}. {title}: {text}"))
    assert "\n3. Title 3: Text of passage 3.\n" in titled.messages(EX)[0]["content"]
    with_system = ArenaProtocol(ArenaProtocolConfig(system="You answer from references."))
    assert [m["role"] for m in with_system.messages(EX)] == ["system", "user"]
    one = Example("q6", "Who?", ["x"], passages=[Passage("p", "T", "Only one.")])
    assert "<references>\n1. Only one.\n</references>" in ArenaProtocol().messages(one)[0]["content"]
    naive = ArenaProtocol(ArenaProtocolConfig(output="think_answer")).messages(EX)[0]["content"]
    assert "<think>" in naive and "<relevance>" not in naive and "\n10. Text of passage 10." in naive


def test_prompt_errors_are_clear():
    with pytest.raises(RagrlError, match="example 'q7' has no passages"):
        ArenaProtocol().messages(Example("q7", "Who?", ["x"]))
    with pytest.raises(RagrlError, match="example 'q8' has no passages"):
        ArenaProtocol().messages(Example("q8", "Who?", ["x"], passages=[]))
    with pytest.raises(RagrlError, match="protocol.user: bad template"):
        ArenaProtocol(ArenaProtocolConfig(user="{question} {passages}"))
    with pytest.raises(RagrlError, match="protocol.output must be one of"):
        ArenaProtocol(ArenaProtocolConfig(output="json"))


def test_prompt_goes_through_the_chat_template(tiny_tokenizer):
    protocol = ArenaProtocol()
    text = tiny_tokenizer.decode(protocol.prompt_ids(EX, tiny_tokenizer), skip_special_tokens=False)
    assert text.startswith("<|bos|><|user|>\n")
    assert text.endswith("</references>\n<|eot|>\n<|assistant|>\n")  # a generation prompt, no system turn


# -- the parse rule and the single-turn episode ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "content"),
    [
        (GOOD, "answer", "Republican"),
        (GOOD + "<|eot|>", "answer", "Republican"),
        ("<answer>\n  New  York \n</answer>", "answer", "New  York"),
        ("<answer> first </answer> <answer>second</answer>", "answer", "first"),
        ("<answer></answer>", "answer", ""),  # an empty answer is still the final answer
        ("<relevance>[6]</relevance><analysis>a</analysis>", "invalid", ""),
        ("<answer>unclosed", "invalid", ""),
    ],
)
def test_parse_rule(text, kind, content):
    action = ArenaProtocol().parse(text, 0)
    assert (action.kind, action.content) == (kind, content)
    assert ArenaProtocol().is_final(action) is (kind == "answer")


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from ragrl.llm.tiny import train_tokenizer

    texts = [ARENA_PROMPT, EX.question, GOOD, oracle_reply(EX), *(p.text for p in PASSAGES), "Democratic"]
    return train_tokenizer(texts, kind="word", vocab_size=2000)


def _run(tokenizer, replies, **rollout):
    cfg = RolloutConfig(**{"max_turns": 1, "max_new_tokens": 64, "max_total_tokens": 64, **rollout})
    backend = ScriptedBackend(tokenizer, lambda prompt, i: replies[i])
    engine = RolloutEngine(backend, None, ArenaProtocol(), cfg)
    return engine.run([EX] * len(replies), n=1, seed=0)


def test_engine_plays_one_turn_and_ends(tiny_tokenizer):
    no_answer = "<relevance>[6]</relevance><analysis>unsure</analysis>"
    long_reply = "<relevance>[6,8]</relevance><analysis>" + "passage " * 80 + "</analysis>"
    good, missing, cut = _run(tiny_tokenizer, [GOOD, no_answer, long_reply])
    for t in (good, missing, cut):
        assert [s.kind for s in t.segments] == ["policy"] and len(t.actions) == 1
    assert (good.finish_reason, good.final_answer, good.truncated) == ("answer", "Republican", False)
    assert good.segments[0].text.endswith("</answer><|eot|>")  # EOS stays in the segment text ...
    method = load_method("arena")
    assert method.reward(good, EX).total == 13.0  # ... and the rewards skip it
    assert (missing.finish_reason, missing.final_answer) == ("eos", None)
    assert missing.actions[0].kind == "invalid"
    assert (cut.finish_reason, cut.truncated, cut.segments[0].finish_reason) == ("max_tokens", True, "length")
    assert method.reward(missing, EX).components["arena_relevance"] == 0.5


def test_oracle_demonstrator_through_the_engine(tiny_tokenizer):
    protocol = ArenaProtocol()
    backend = DemonstratorBackend.for_examples(tiny_tokenizer, ArenaOracle(), [EX], protocol)
    engine = RolloutEngine(backend, None, protocol, RolloutConfig(max_turns=1, max_new_tokens=64))
    (t,) = engine.run([EX], n=1, seed=0)
    assert t.finish_reason == "answer" and load_method("arena").reward(t, EX).total == 13.0
    assert oracle_reply(EX) == (
        "<relevance>[6,8]</relevance>\n<analysis>The passages [6] [8] give the answer.</analysis>\n"
        "<answer>Republican</answer>"
    )
    naive = load_method("arena-naive").reward(traj(oracle_reply(EX, "think_answer")), EX)
    assert naive.components == {"think_answer_format": 1.0, "arena_accuracy": 1.0}


def test_wrapped_around_the_quoting_oracle_the_analysis_names_cites_and_quotes_each_hop():
    """``ArenaOracle.wrap(QuotingOracle())`` (the warm start from the reader base): for each hop in chain
    order, its entity, its passage's number and the passage from its start through the evidence
    sentence; relevance and answer unchanged, every reward earned."""
    from ragrl.synth.demonstrators import QuotingOracle

    passages = [
        Passage("a", "Zurraes", "Zurraes is a city in Boreora. It has a port."),
        Passage("b", "Other", "Other is a town."),
        Passage(
            "c", "Mertaem Breke", "Mertaem Breke is a musician. He was born in Zurraes in 1965. He sings."
        ),
    ]
    ex = Example("q", "In which country was Mertaem Breke born?", ["Boreora"], supporting_ids=["c", "a"],
                 passages=passages)  # fmt: skip
    reply = ArenaOracle().wrap(QuotingOracle()).next_turn(ex, [])
    assert reply == (
        "<relevance>[1,3]</relevance>\n"
        "<analysis>Mertaem Breke [3]: Mertaem Breke is a musician. He was born in Zurraes in 1965. "
        "Zurraes [1]: Zurraes is a city in Boreora.</analysis>\n"
        "<answer>Boreora</answer>"
    )
    assert load_method("arena").reward(traj(reply), ex).total == 13.0
    naive = ArenaOracle("think_answer").wrap(QuotingOracle()).next_turn(ex, [])
    assert naive.startswith("<think>Mertaem Breke [3]: Mertaem Breke is a musician. He was born")
    with pytest.raises(RagrlError, match="has no read_given"):
        ArenaOracle().wrap(object())


def test_replayed_completion_is_one_turn():
    t = trajectory_from_completion("q1", GOOD + "<|eot|>", ArenaProtocol())
    assert t.final_answer == "Republican" and len(t.segments) == 1
    assert load_method("arena").reward(t, EX).total == 13.0
    t = trajectory_from_completion(
        "q1", "<relevance>[6]</relevance> <information>x</information>", ArenaProtocol()
    )
    assert t.final_answer is None and [s.kind for s in t.segments] == ["policy"]


def test_multi_turn_settings_are_refused():
    with pytest.raises(RagrlError, match="rollout.max_turns: 1"):
        load_method("arena", ["rollout.max_turns=2"])
    with pytest.raises(RagrlError, match="never searches"):
        ArenaProtocol().observation(ArenaProtocol().parse(GOOD, 0), [])


# -- the citation audit ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("span", "parsed", "equal", "overlap", "miss", "precision", "recall"),
    [
        ("[8,6]", 1, 1, 0, 0, 1.0, 1.0),
        ("[6.0, 8, 8]", 1, 1, 0, 0, 1.0, 1.0),
        ("[6,8,9,10]", 1, 0, 1, 0, 0.5, 1.0),
        ("[6]", 1, 0, 1, 0, 1.0, 0.5),
        ("[1,2]", 1, 0, 0, 1, 0.0, 0.0),
        ("[]", 1, 0, 0, 1, 0.0, 0.0),
        ("6,8", 0, 0, 0, 1, 0.0, 0.0),
        ('["6","8"]', 0, 0, 0, 1, 0.0, 0.0),
        ("[true, 6]", 0, 0, 0, 1, 0.0, 0.0),
        ("[6.5]", 0, 0, 0, 1, 0.0, 0.0),
        (None, 0, 0, 0, 1, 0.0, 0.0),
    ],
)
def test_citation_audit(span, parsed, equal, overlap, miss, precision, recall):
    relevance = f"<relevance>{span}</relevance>" if span is not None else ""
    t = traj(f"{relevance}<analysis>a [6]</analysis><answer>Republican</answer><|eot|>")
    d = citation_audit(t, EX)
    assert d == {
        "cite/parsed": parsed,
        "cite/equal": equal,
        "cite/overlap": overlap,
        "cite/miss": miss,
        "cite/precision": precision,
        "cite/recall": recall,
        "bonus_rate": float(equal == 1),
    }
    if parsed:  # with a readable list, equal / overlap / miss is the relevance reward's 1 / 0.5 / 0
        assert relevance_score(visible_text(t.policy_text), [6, 8]) == equal + 0.5 * overlap
    assert load_method("arena").diagnose(t, EX) == d


def test_citation_record_and_eval_audit_hook():
    t = traj(GOOD + "<|eot|>")
    record = {
        "cited_ids": [6, 8],
        "analysis": "Finney was governor [6]. Knight served under her [8].",
        "answer": "Republican",
    }
    assert citation(t) == record
    assert ArenaProtocol().audit(t) == record
    assert citation(traj("nothing")) == {"cited_ids": None, "analysis": None, "answer": None}
    assert cited_ids("<relevance>[3, 1, 3]</relevance>") == [1, 3]


def test_eval_rows_carry_the_audit():
    from ragrl.eval.runner import score_trajectories

    method = load_method("arena")
    ex2 = Example("q2", EX.question, EX.answers, passages=PASSAGES, metadata={GOLD_REFERENCE_KEY: [6, 8]})
    trajectories = [
        traj(GOOD + "<|eot|>"),
        traj("<relevance>[6]</relevance><answer>Democratic</answer>", "q2"),
    ]
    summary, rows = score_trajectories(trajectories, [EX, ex2], method, variant="arena")
    assert rows[0]["cited_ids"] == [6, 8] and rows[0]["answer"] == "Republican" and rows[0]["em"] == 1.0
    assert rows[1]["cited_ids"] == [6] and rows[1]["analysis"] is None and rows[1]["cite/overlap"] == 1.0
    assert summary["cite/equal"] == 0.5 and summary["bonus_rate"] == 0.5
    assert summary["reward"] == pytest.approx((13.0 + 0.5) / 2)  # 13, and 0 + 0 + 0.5 + 0


# -- packaged configs -----------------------------------------------------------------------------------


def test_packaged_configs_build():
    arena = load_method("arena")
    assert arena.name == "arena" and arena.protocol.needs_retriever is False and arena.protocol.stop == ()
    assert arena.reward.keys == ["arena_format", "arena_accuracy", "arena_relevance", "arena_bonus"]
    assert [c.weight for c in arena.reward.components] == [1.0, 1.0, 1.0, 1.0]
    r, g = arena.rollout, arena.train.grpo
    assert (r.max_turns, r.n, r.temperature, r.max_new_tokens) == (1, 7, 0.9, 256)
    assert (g.kl, g.kl_coef, g.clip_low, g.clip_high, g.ppo_epochs, g.loss_agg) == (
        "k2",
        0.04,
        0.2,
        0.2,
        1,
        "token_mean",
    )
    assert (g.advantage, g.advantage_params) == ("grpo", {"std": "sample", "eps": 1e-4})
    assert g.prompts_per_step == 256 and arena.train.steps == 95
    o = arena.train.optim
    assert (o.lr, o.schedule, o.warmup_steps) == (3e-6, "cosine", 10)
    assert arena.train.mixed_precision == "bf16" and arena.train.model.gradient_checkpointing
    assert arena.train.data.index is None

    tiny = load_method("arena-tiny")
    assert (tiny.rollout.n, tiny.rollout.max_turns, tiny.train.grpo.kl, tiny.train.grpo.kl_coef) == (
        7,
        1,
        "k2",
        0.04,
    )
    assert tiny.train.grpo.prompts_per_step == 16 and tiny.train.data.index is None
    assert tiny.reward.keys == arena.reward.keys

    for name in ("arena-naive", "arena-naive-tiny"):
        naive = load_method(name)
        assert naive.name == "arena-naive" and naive.protocol.name == "arena_naive"
        assert naive.reward.keys == ["think_answer_format", "arena_accuracy"]
        assert naive.train.grpo.kl == "k3" and naive.diagnostics is None
    for name in ("arena", "arena-tiny", "arena-naive", "arena-naive-tiny"):
        load_method(name).train.validate()
    assert ArenaConfig.load("arena-tiny").rollout.max_new_tokens == 64
