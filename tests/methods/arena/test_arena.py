"""ARENA (methods/arena.md): prompt rendering, the parse rule, the single-turn episode, the citation
audit and the packaged configs (the rewards: test_rewards.py)."""

import importlib.util
from pathlib import Path

import pytest

from ragrl.data.references import GOLD_REFERENCE_KEY
from ragrl.data.schema import Example, Passage
from ragrl.errors import RagrlError
from ragrl.methods import load_method
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
    citation_audit,
    relevance_score,
)
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.engine import RolloutEngine
from ragrl.rollout.replay import trajectory_from_completion
from ragrl.rollout.scripted import DemonstratorBackend, ScriptedBackend

_spec = importlib.util.spec_from_file_location("arena_cases", Path(__file__).parent / "cases.py")
cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cases)
PASSAGES, EX, GOOD, traj = cases.PASSAGES, cases.EX, cases.GOOD, cases.traj


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
