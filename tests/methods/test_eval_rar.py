"""Eval-RAR (spec ``eval-rar.md`` §7.1): prompt, the search-then-evaluate rollout in both generation
variants, the gated evaluation reward with its switches (§2.5's pitfalls as test vectors), the
diagnostics, the oracle, and why the 0.1 tier matters for GRPO (§7.2 item 2)."""

from __future__ import annotations

import pytest
import torch

from ragrl.algos.advantages import compute_advantages
from ragrl.data.schema import Example, Passage, SubQuestion
from ragrl.errors import RagrlError
from ragrl.llm.tiny import train_tokenizer
from ragrl.methods import load_method
from ragrl.methods.eval_rar import (
    CORRECTIVE,
    EvalRarOracle,
    EvalRarProtocol,
    contains_gold,
    evaluation_text,
    evaluations,
)
from ragrl.retrieval.bm25 import BM25Retriever
from ragrl.rollout.engine import RolloutEngine
from ragrl.rollout.replay import trajectory_from_completion
from ragrl.rollout.scripted import DemonstratorBackend, ScriptedBackend
from ragrl.rollout.search_protocol import TAGS, SearchR1Protocol
from ragrl.rollout.trajectory import Action, Segment, Trajectory

PASSAGES = [
    Passage.make("Checkers speech", "The Checkers speech was given by Richard Nixon on September 23, 1952."),
    Passage.make("Richard Nixon", "Richard Nixon died on April 22, 1994, in New York City."),
    Passage.make("Paris", "Paris is the capital of France, on the river Seine."),
]
QUESTION = Example(
    "q0",
    "When did the person who gave the Checkers speech die",
    ["April 22, 1994"],
    decomposition=[
        SubQuestion("Who gave the Checkers speech?", ["Richard Nixon"]),
        SubQuestion("When did Richard Nixon die?", ["April 22, 1994"]),
    ],
)
TOK = train_tokenizer(
    [p.contents for p in PASSAGES] * 3 + [CORRECTIVE], kind="bpe", vocab_size=700, special_tags=list(TAGS)
)
TOK.chat_template = None  # plain prompts: the decoded prompt is the text


@pytest.fixture(scope="module")
def bm25():
    return BM25Retriever.build(PASSAGES)


def method(*overrides: str):
    return load_method("eval_rar", list(overrides))


def traj(*segments: tuple[str, str], answer: str | None = None) -> Trajectory:
    t = Trajectory("q0", [], segments=[Segment(kind, [], text) for kind, text in segments])
    t.final_answer = answer
    return t


# -- prompt -----------------------------------------------------------------------------------------


def test_prompt_is_one_user_message_with_the_tags_and_a_question_mark():
    m = method()
    messages = m.protocol.messages(QUESTION)
    assert [msg["role"] for msg in messages] == ["user"]
    text = messages[0]["content"]
    for tag in ("<think>", "<search>", "<information>", "<evaluate>", "</evaluate>", "<answer>"):
        assert tag in text
    assert text.endswith("Question: When did the person who gave the Checkers speech die?")
    assert method("protocol.question_mark=false").protocol.messages(QUESTION)[0]["content"].endswith("die")


def test_tags_are_never_read_from_the_prompt(bm25):
    """The prompt shows <evaluate>…</evaluate> and an example <answer>: a real rollout carries them in
    its prompt ids, and none of it is read as policy text."""
    m = method()
    prompt = m.protocol.prompt_text(QUESTION)
    backend = ScriptedBackend(TOK, lambda prompt_ids, i: "<think> hmm </think>")
    (t,) = RolloutEngine(backend, bm25, m.protocol, m.rollout).run([QUESTION], n=1)
    assert "<evaluate>" in TOK.decode(t.prompt_ids) and "<answer> Paris </answer>" in TOK.decode(t.prompt_ids)
    assert "<answer> Paris </answer>" in prompt and evaluations(t) == []
    assert t.final_answer is None
    assert m.reward(t, QUESTION).total == 0.0


# -- the rollout (Algorithm 1) ------------------------------------------------------------------------


def free_policy(turns: list[str]):
    """Writes turns[i] once i observations have been appended."""

    def policy(prompt_ids, index):
        done = TOK.decode(prompt_ids).count("</information>") - 1  # the prompt names the tag once
        return turns[done] if done < len(turns) else "<answer> late </answer>"

    return policy


FREE_TURNS = [
    "<think> first the speaker </think>\n<search> Checkers speech </search> ignored <answer> x </answer>",
    "<evaluate> The speaker is Richard Nixon; missing: his date of death. </evaluate>\n"
    "<search> When did Richard Nixon die </search>",
    "<evaluate> Nixon died on April 22, 1994. </evaluate>\n<answer> April 22, 1994 </answer>",
]


def test_free_variant_search_evaluate_answer(bm25):
    m = method()
    backend = ScriptedBackend(TOK, free_policy(FREE_TURNS))
    (t,) = RolloutEngine(backend, bm25, m.protocol, m.rollout).run([QUESTION], n=1)
    assert t.finish_reason == "answer" and t.final_answer == "April 22, 1994"
    assert t.queries == ["Checkers speech", "When did Richard Nixon die"]
    # generation stops at </search>: the text after it is discarded
    assert t.segments[0].text.endswith("</search>") and "ignored" not in t.completion_text
    # observations are the only environment tokens (loss mask 0); everything else is policy
    assert [s.kind for s in t.segments] == ["policy", "env", "policy", "env", "policy"]
    assert all(s.text.startswith("\n\n<information>Doc 1(Title: ") for s in t.segments if s.kind == "env")
    assert t.loss_mask == [1 if s.kind == "policy" else 0 for s in t.segments for _ in s.token_ids]
    assert evaluations(t) == [
        "The speaker is Richard Nixon; missing: his date of death.",
        "Nixon died on April 22, 1994.",
    ]
    assert len(backend.calls) == 3 and all(p.stop == ("</search>", "</answer>") for _, p in backend.calls)
    r = m.reward(t, QUESTION)
    assert r.total == 1.0 and r.components == {"em": 1.0, "eval_rar_evaluation": 0.0}


def test_invalid_action_gets_the_papers_feedback_and_uses_a_step(bm25):
    m = method("rollout.max_turns=2")
    backend = ScriptedBackend(TOK, lambda prompt, i: "<think> not sure </think><search>  </search>")
    (t,) = RolloutEngine(backend, bm25, m.protocol, m.rollout).run([QUESTION], n=1)
    assert [(a.kind, a.turn, a.error) for a in t.actions] == [
        ("invalid", 0, "empty query"),
        ("invalid", 1, "empty query"),
    ]
    env = [s for s in t.segments if s.kind == "env"]
    assert [s.text for s in env] == ["\nMy action is wrong. Let me try again.\n"]  # none after the last step
    assert t.finish_reason == "max_turns" and t.loss_mask.count(0) == len(env[0].token_ids)


def test_step_limit_and_the_final_answer_turn(bm25):
    searching = free_policy(["<search> Checkers speech </search>"] * 3 + ["<answer> 1994 </answer>"])
    m = method("rollout.max_turns=2")
    (t,) = RolloutEngine(ScriptedBackend(TOK, searching), bm25, m.protocol, m.rollout).run([QUESTION], n=1)
    assert t.finish_reason == "max_turns" and t.final_answer is None
    assert t.num_searches == 2 and t.actions[-1].error == "not executed: no turn left"
    m = method("rollout.max_turns=2", "rollout.final_answer_turn=true")
    policy = free_policy(["<search> Checkers speech </search>"] * 2 + ["<answer> 1994 </answer>"])
    (t,) = RolloutEngine(ScriptedBackend(TOK, policy), bm25, m.protocol, m.rollout).run([QUESTION], n=1)
    assert t.finish_reason == "answer" and t.final_answer == "1994" and t.num_searches == 2


def separate_policy(actions: list[str], evaluation: str, prefilled: bool = False):
    """Algorithm 1 line 17: right after an observation the policy writes the evaluation."""

    def policy(prompt_ids, index):
        text = TOK.decode(prompt_ids)
        if text.endswith("</information>\n\n") or text.endswith("<evaluate>"):
            return f" {evaluation} </evaluate>" if prefilled else f"<evaluate> {evaluation} </evaluate>"
        done = text.count("</information>") - 1
        return actions[done] if done < len(actions) else "<answer> late </answer>"

    return policy


@pytest.mark.parametrize("prefill", [False, True])
def test_separate_variant_generates_the_evaluation_after_each_observation(bm25, prefill):
    m = method("protocol.evaluate=separate", f"protocol.prefill_evaluate={prefill}", "rollout.seed=7")
    actions = [
        "<search> Checkers speech </search>",
        "<search> Nixon died </search>",
        "<answer> 1994 </answer>",
    ]
    backend = ScriptedBackend(TOK, separate_policy(actions, "Nixon gave it.", prefill))
    (t,) = RolloutEngine(backend, bm25, m.protocol, m.rollout).run([QUESTION], n=1)
    # two steps with a search (search + evaluation each), then the answer: 5 generate calls
    assert [p.stop for _, p in backend.calls] == [
        ("</search>", "</answer>"), ("</evaluate>",), ("</search>", "</answer>"), ("</evaluate>",),
        ("</search>", "</answer>"),
    ]  # fmt: skip
    # the evaluation samples with its own seed stream, not the next turn's
    assert len({p.seed for _, p in backend.calls}) == 5
    assert [a.kind for a in t.actions] == ["search", "evaluate", "search", "evaluate", "answer"]
    assert [a.turn for a in t.actions] == [0, 0, 1, 1, 2]  # the evaluation belongs to its search's step
    assert [a.content for a in t.actions if a.kind == "evaluate"] == ["Nixon gave it."] * 2
    assert [s.kind for s in t.segments] == ["policy", "env", "policy", "policy", "env", "policy", "policy"]
    assert t.segments[1].text.endswith("<evaluate>") is prefill  # the prefilled tag is environment text
    assert evaluations(t) == ["Nixon gave it.", "Nixon gave it."]
    assert t.final_answer == "1994"
    # max_turns counts steps, not generations: 3 steps fit in max_turns=3
    m3 = method("protocol.evaluate=separate", "rollout.max_turns=3")
    (t3,) = RolloutEngine(
        ScriptedBackend(TOK, separate_policy(actions, "x")), bm25, m3.protocol, m3.rollout
    ).run([QUESTION], n=1)
    assert t3.finish_reason == "answer"


def test_separate_evaluation_ending_with_eos_ends_the_episode(bm25):
    m = method("protocol.evaluate=separate")

    def policy(prompt_ids, index):
        text = TOK.decode(prompt_ids)
        return "<evaluate> not closed" if text.endswith("</information>\n\n") else "<search> Nixon </search>"

    (t,) = RolloutEngine(ScriptedBackend(TOK, policy), bm25, m.protocol, m.rollout).run([QUESTION], n=1)
    assert t.finish_reason == "eos" and t.actions[-1].kind == "evaluate"
    assert t.actions[-1].error == "no <evaluate> block"


VARIANTS = (
    [],
    ["protocol.evaluate=separate"],
    ["protocol.evaluate=separate", "protocol.prefill_evaluate=true"],
)


def test_oracle_demonstrations_in_both_variants(bm25):
    for overrides in VARIANTS:
        m = method(*overrides)
        backend = DemonstratorBackend.for_examples(TOK, m.oracle, [QUESTION], m.protocol, bm25, m.rollout.k)
        (t,) = RolloutEngine(backend, bm25, m.protocol, m.rollout).run([QUESTION], n=1)
        assert t.final_answer == "April 22, 1994", overrides
        assert t.queries == ["Who gave the Checkers speech?", "When did Richard Nixon die?"]
        assert evaluations(t) == [
            "The documents give Richard Nixon. Still missing: When did Richard Nixon die?",
            "The documents give April 22, 1994. This answers the question: April 22, 1994.",
        ], overrides
        d = m.diagnose(t, QUESTION)
        assert d["evaluate_blocks"] == 2 and d["evaluate_contains_gold"] == 1 and d["tier/answer"] == 1
    with pytest.raises(RagrlError, match="free or separate"):
        EvalRarOracle("none")


# -- the reward (Eqs. 2-5) and its switches ------------------------------------------------------------

SEARCH = ("policy", "<search> Checkers speech </search>")
INFO = ("env", "\n\n<information>Doc 1(Title: Richard Nixon) died April 22, 1994</information>\n\n")


@pytest.mark.parametrize(
    ("evaluate", "answer", "total", "tiers"),
    [
        ("Nixon died on April 22, 1994.", "April 22, 1994", 1.0, (1.0, 0.0)),  # correct: 1, never 1.1
        ("Nixon died on April 22, 1994.", "September 23, 1952", 0.1, (0.0, 1.0)),  # wrong, eval has gold
        ("The speaker was Nixon.", "September 23, 1952", 0.0, (0.0, 0.0)),  # wrong, eval lacks gold
        ("The speaker was Nixon.", "april 22 1994", 1.0, (1.0, 0.0)),  # SQuAD normalization
    ],
)
def test_reward_tiers(evaluate, answer, total, tiers):
    m = method()
    t = traj(
        SEARCH,
        INFO,
        ("policy", f"<evaluate> {evaluate} </evaluate><answer> {answer} </answer>"),
        answer=answer,
    )
    r = m.reward(t, QUESTION)
    assert r.total == pytest.approx(total)
    assert (r.components["em"], r.components["eval_rar_evaluation"]) == tiers


def test_gold_in_the_information_block_does_not_count():
    """y_eval is the model's own evaluation text, never the retrieved passages."""
    t = traj(
        SEARCH, INFO, ("policy", "<evaluate> Nixon, yes. </evaluate><answer> 1952 </answer>"), answer="1952"
    )
    assert method().reward(t, QUESTION).total == 0.0


def test_evaluations_are_concatenated_across_steps():
    """Eq. 3: the blocks are joined with a space before the containment test."""
    t = traj(
        SEARCH, INFO, ("policy", "<evaluate> April 22, </evaluate><search> more </search>"), INFO,
        ("policy", "<evaluate> 1994 was the date </evaluate><answer> no idea </answer>"), answer="no idea",
    )  # fmt: skip
    assert evaluation_text(t) == "April 22, 1994 was the date"
    assert method().reward(t, QUESTION).total == pytest.approx(0.1)


def test_no_answer_paper_vs_code():
    t = traj(SEARCH, INFO, ("policy", "<evaluate> He died April 22, 1994. </evaluate><search> x </search>"))
    assert method().reward(t, QUESTION).total == pytest.approx(0.1)  # Eq. 5 read literally
    code = method("reward.1.if_no_answer=code")
    assert code.reward(t, QUESTION).total == 0.0  # AutoRefine's code


def test_yes_no_loophole_and_the_word_boundary_switch():
    """§2.5: gold "no" is a substring of "not" and "know" under the paper's character test."""
    yes_no = Example("c", "Were both born in 1950?", ["no"])
    t = traj(
        SEARCH,
        INFO,
        ("policy", "<evaluate> I do not know yet. </evaluate><answer> yes </answer>"),
        answer="yes",
    )
    char, word = method(), method("reward.1.containment=word")
    assert char.reward(t, yes_no).total == pytest.approx(0.1)
    assert word.reward(t, yes_no).total == 0.0
    assert char.diagnose(t, yes_no)["loophole"] == 1.0 and word.diagnose(t, yes_no)["loophole"] == 1.0
    assert word.diagnose(t, yes_no)["tier/evaluation"] == 0.0
    honest = traj(("policy", "<evaluate> The answer is no. </evaluate><answer> yes </answer>"), answer="yes")
    assert word.reward(honest, yes_no).total == pytest.approx(0.1)
    assert word.diagnose(honest, yes_no)["loophole"] == 0.0


def test_containment_rules():
    assert contains_gold("Nixon died on April 22, 1994", ["1994"])
    assert contains_gold("x", ["y", "X"])  # any alias
    assert not contains_gold("The documents", ["the"])  # a gold that normalizes to nothing never matches
    assert not contains_gold("", ["no"])
    assert contains_gold("born in 19940", ["1994"]) and not contains_gold(
        "born in 19940", ["1994"], containment="word"
    )
    assert contains_gold("new york city", ["New York"], containment="word")
    with pytest.raises(RagrlError, match="containment"):
        contains_gold("a", ["a"], containment="token")


def test_bad_switches_are_config_errors():
    with pytest.raises(RagrlError, match=r"reward\.1\.if_no_answer"):
        method("reward.1.if_no_answer=sometimes")
    with pytest.raises(RagrlError, match=r"reward\.1\.containment"):
        method("reward.1.containment=token")
    with pytest.raises(RagrlError, match="protocol.evaluate must be free or separate"):
        method("protocol.evaluate=none")
    with pytest.raises(RagrlError, match="free or separate, got 'always'"):
        method("protocol.evaluate=always")
    with pytest.raises(RagrlError, match="free or separate, got 'False' .YAML reads"):
        method("protocol.evaluate=off")
    with pytest.raises(RagrlError, match="prefill_evaluate needs"):
        method("protocol.prefill_evaluate=true")


def test_ablation_without_the_evaluation_reward_still_logs_it():
    m = method("reward.1.weight=0")
    t = traj(
        SEARCH,
        INFO,
        ("policy", "<evaluate> April 22, 1994 </evaluate><answer> 1952 </answer>"),
        answer="1952",
    )
    r = m.reward(t, QUESTION)
    assert r.total == 0.0 and r.components["eval_rar_evaluation"] == 1.0


def test_diagnostics():
    m = method()
    t = traj(
        SEARCH,
        INFO,
        ("policy", "<evaluate> April 22, 1994 </evaluate><answer> 1952 </answer>"),
        answer="1952",
    )
    t.actions = [
        Action("search", "a", 0, ["p1"]),
        Action("search", "b", 1, error="not executed: no turn left"),
    ]
    d = m.diagnose(t, QUESTION)
    assert d == {
        "valid_searches": 1.0,
        "response_len_with_info": 0.0,  # these segments carry no token ids
        "evaluate_blocks": 1.0,
        "evaluate_blocks_unprompted": 0.0,
        "evaluate_words": 3.0,
        "evaluate_contains_gold": 1.0,
        "tier/answer": 0.0,
        "tier/evaluation": 1.0,
        "tier/zero": 0.0,
        "loophole": 0.0,
    }


def test_saved_completions_replay_with_the_papers_corrective():
    """``ragrl reward eval_rar`` splits a saved completion at observations and the fixed feedback."""
    m = method()
    completion = (
        "<think> hm </think>" + CORRECTIVE + "<search> Checkers speech </search>"
        + INFO[1] + "<evaluate> died April 22, 1994 </evaluate><answer> 1952 </answer>"
    )  # fmt: skip
    t = trajectory_from_completion("q0", completion, m.protocol)
    assert [s.kind for s in t.segments] == ["policy", "env", "policy", "env", "policy"]
    assert [a.kind for a in t.actions] == ["invalid", "search", "answer"]
    assert m.reward(t, QUESTION).total == pytest.approx(0.1)


# -- why the tier matters (spec §7.2, item 2) -------------------------------------------------------------


def test_the_evaluation_tier_breaks_ties_in_all_wrong_groups():
    """A group of G = 5 all-wrong trajectories has zero advantage under EM alone; when two of the five
    evaluations name the gold answer, those two get a positive advantage and the rest a negative one."""
    em_only = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0])
    eval_rar = torch.tensor([0.1, 0.0, 0.1, 0.0, 0.0])
    groups = torch.zeros(5, dtype=torch.long)
    assert torch.equal(compute_advantages("grpo", em_only, groups, eps=1e-6), torch.zeros(5))
    adv = compute_advantages("grpo", eval_rar, groups, std="sample", eps=1e-6)
    # (0.1 - 0.04) / std([.1, 0, .1, 0, 0], unbiased) = 0.06 / 0.0547723 = 1.0954
    assert adv.tolist() == pytest.approx([1.0954, -0.7303, 1.0954, -0.7303, -0.7303], abs=1e-4)
    # with one correct answer, the tier only reorders the wrong ones, far below the correct one
    adv = compute_advantages("grpo", torch.tensor([1.0, 0.1, 0.0, 0.0, 0.0]), groups, std="sample", eps=1e-6)
    assert adv[0] > 1.7 and 0 > adv[1] > adv[2]


def test_saved_prefilled_completions_replay():
    """With ``prefill_evaluate`` the observation ends with ``<evaluate>`` (environment text) and the
    policy writes only the body; the replayed trajectory reads the same evaluation."""
    m = method("protocol.evaluate=separate", "protocol.prefill_evaluate=true")
    completion = "<search> Checkers speech </search>" + INFO[1] + "<evaluate> died April 22, 1994 </evaluate>"
    completion += "<answer> 1952 </answer>"
    t = trajectory_from_completion("q0", completion, m.protocol)
    assert [s.kind for s in t.segments] == ["policy", "env", "policy"]
    assert t.segments[1].text.endswith("<evaluate>") and evaluations(t) == ["died April 22, 1994"]
    assert m.reward(t, QUESTION).total == pytest.approx(0.1)


def test_after_observation_only_reads_the_evaluations_algorithm_1_asks_for():
    """An opt-in guard (not in the paper): only the block that opens the policy text right after an
    ``<information>`` observation counts. Blocks written without a search, after the feedback string,
    or later in a turn are what a policy writes to game the tier (gold ``no`` / ``unknown`` / digit runs
    with no search at all, seen on the CPU)."""
    t = traj(
        ("policy", "<evaluate> no unknown 1999 </evaluate><search> Checkers </search>"),  # before any search
        INFO,
        ("policy", "  <evaluate> Nixon gave it. </evaluate><evaluate> April 22, 1994 </evaluate><search> a"),
        ("env", CORRECTIVE),
        ("policy", "<evaluate> April 22, 1994 </evaluate><answer> 1952 </answer>"),  # after the feedback
        answer="1952",
    )  # fmt: skip
    assert evaluations(t) == ["no unknown 1999", "Nixon gave it.", "April 22, 1994", "April 22, 1994"]
    assert evaluations(t, after_observation_only=True) == ["Nixon gave it."]
    guarded = method("reward.1.after_observation_only=true")
    assert method().reward(t, QUESTION).total == pytest.approx(0.1)
    assert guarded.reward(t, QUESTION).total == 0.0
    d = guarded.diagnose(t, QUESTION)
    assert d["evaluate_blocks"] == 1 and d["evaluate_blocks_unprompted"] == 3
    # the separate variant's follow-up, prefilled or not, is the evaluation right after the observation
    search = ("policy", "<search> a </search>")
    prefilled = traj(search, ("env", INFO[1] + "<evaluate>"), ("policy", " ok </evaluate>"))
    follow_up = traj(search, INFO, ("policy", "<evaluate> ok </evaluate>"))
    assert evaluations(prefilled, True) == evaluations(follow_up, True) == ["ok"]
    with pytest.raises(RagrlError, match="after_observation_only must be true or false"):
        method("reward.1.after_observation_only=sometimes")


def test_the_search_r1_protocol_knows_nothing_of_the_evaluation():
    """Eval-RAR's evaluation step lives in its own protocol; Search-R1 takes no evaluate setting."""
    assert isinstance(method().protocol, EvalRarProtocol) and method().protocol.name == "eval_rar"
    plain = load_method("search_r1")
    assert type(plain.protocol) is SearchR1Protocol and plain.protocol.followup_stop == ()
    with pytest.raises(RagrlError, match="evaluate"):
        load_method("search_r1", ["protocol.evaluate=free"])
    separate = method("protocol.evaluate=separate", "protocol.prefill_evaluate=true").protocol
    assert separate.followup_stop == ("</evaluate>",) and separate.observation_tail == "<evaluate>"
    observation = separate.observation(Action("search", "q"), [])
    body, tail = observation.removesuffix("<evaluate>"), observation[-len("<evaluate>") :]
    assert tail == "<evaluate>" and body.strip().endswith("</information>")
