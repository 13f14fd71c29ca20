"""The Protocol abstraction and the shared tag helpers; a method-defined protocol runs in the engine."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from ragrl.data.schema import Example, Passage
from ragrl.errors import RagrlError
from ragrl.retrieval.bm25 import BM25Retriever
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.engine import RolloutEngine
from ragrl.rollout.protocol import (
    Protocol,
    find_spans,
    first_span,
    last_span,
    last_span_of,
    squash_ws,
    strip_tags,
)
from ragrl.rollout.scripted import ScriptedBackend
from ragrl.rollout.trajectory import Action, Trajectory


def tokenizer(chat_template: str | None = None) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["look up the capital of France"], trainer)
    tok.add_tokens(
        [AddedToken(t, normalized=False) for t in ("<lookup>", "</lookup>", "<final>", "</final>")]
    )
    out = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", clean_up_tokenization_spaces=False)
    if chat_template:
        out.chat_template = chat_template
    return out


def test_find_spans_pairs_each_close_with_nearest_open():
    text = "x <s>a</s> <s>b <s>c</s> </s> <s>unclosed"
    spans = find_spans(text, "s")
    assert [s.content for s in spans] == ["a", "c"]
    assert text[spans[1].start : spans[1].end] == "<s>c</s>"
    assert first_span(text, "s").content == "a" and last_span(text, "s").content == "c"
    assert find_spans("</s><s>", "s") == [] and last_span("", "s") is None


def test_last_span_of_picks_the_latest_closing_tag():
    assert last_span_of("<a>1</a><b>2</b>", ("a", "b")).tag == "b"
    assert last_span_of("<b>2</b><a>1</a>", ("a", "b")).tag == "a"
    assert last_span_of("<b>2 <a>1</a></b>", ("a", "b")).tag == "b"
    assert last_span_of("nothing", ("a", "b")) is None


def test_small_helpers():
    assert strip_tags("<a>x</a> <b>y</b>", ("a",)) == "x <b>y</b>"
    assert squash_ws("  a \n\t b  ") == "a b"


def test_protocol_is_abstract():
    with pytest.raises(TypeError):
        Protocol()  # type: ignore[abstract]


class LookupProtocol(Protocol):
    """How a method defines its own grammar: <lookup>q</lookup> and <final>a</final>."""

    name = "lookup"
    stop = ("</lookup>", "</final>")

    def messages(self, example):
        return [
            {
                "role": "user",
                "content": f"Use <lookup> q </lookup>, end with <final> a </final>. {example.question}",
            }
        ]

    def parse(self, text, turn):
        span = last_span_of(text, ("lookup", "final"))
        if span is None or not span.content.strip():
            return Action("invalid", turn=turn, error="no action")
        return Action("search" if span.tag == "lookup" else "answer", content=span.content.strip(), turn=turn)

    def observation(self, action, hits):
        return "\n[" + " | ".join(h.passage.title for h in hits) + "]\n"

    def corrective(self, action):
        return "\n[invalid]\n"


def test_a_method_protocol_runs_in_the_engine():
    retriever = BM25Retriever.build([Passage.make("Paris", "Paris is the capital of France.")])
    turns = iter(["<lookup> capital of France </lookup>", "<final> Paris </final> ignored"])
    tok = tokenizer()
    engine = RolloutEngine(
        ScriptedBackend(tok, lambda p, i: next(turns)), retriever, LookupProtocol(), RolloutConfig()
    )
    [traj] = engine.run([Example("q", "What is the capital of France?", ["Paris"])])
    assert [s.text for s in traj.segments] == [
        "<lookup> capital of France </lookup>",
        "\n[Paris]\n",
        "<final> Paris </final>",
    ]
    assert traj.final_answer == "Paris" and traj.metadata["protocol"] == "lookup"


def test_safe_parse_turns_a_parser_bug_into_an_invalid_action():
    class Broken(LookupProtocol):
        def parse(self, text, turn):
            raise KeyError("boom")

    a = Broken().safe_parse("anything", 3)
    assert a.kind == "invalid" and a.turn == 3 and "KeyError" in a.error


class ReflectingProtocol(LookupProtocol):
    """After the first answer, ask once for a reflection in the same episode."""

    name = "reflecting"

    def after_answer(self, trajectory, action):
        return "\n[reflect]\n" if len(trajectory.answers) < 2 else None


def test_a_reflection_pass_continues_the_episode_and_keeps_every_answer():
    turns = iter(["<final> Lyon </final>", "<final> Paris </final>", "<final> never </final>"])
    tok = tokenizer()
    engine = RolloutEngine(
        ScriptedBackend(tok, lambda p, i: next(turns)), None, ReflectingProtocol(), RolloutConfig(max_turns=4)
    )
    [traj] = engine.run([Example("q", "What is the capital of France?", ["Paris"])])
    assert [(s.kind, s.text) for s in traj.segments] == [
        ("policy", "<final> Lyon </final>"),
        ("env", "\n[reflect]\n"),
        ("policy", "<final> Paris </final>"),
    ]
    assert traj.answers == ["Lyon", "Paris"] and traj.final_answer == "Paris"
    assert traj.finish_reason == "answer" and not traj.truncated
    # the reflection instruction is context, never a target: the mask covers exactly the two answers
    policy = [t for s in traj.segments if s.kind == "policy" for t in s.token_ids]
    assert [t for t, m in zip(traj.completion_ids, traj.loss_mask, strict=True) if m] == policy
    assert sum(traj.loss_mask) == len(policy) and len(traj.loss_mask) == len(traj.completion_ids)


def test_no_reflection_without_a_turn_left():
    turns = iter(["<final> Lyon </final>"])
    engine = RolloutEngine(
        ScriptedBackend(tokenizer(), lambda p, i: next(turns)),
        None,
        ReflectingProtocol(),
        RolloutConfig(max_turns=1),
    )
    [traj] = engine.run([Example("q", "What is the capital of France?", ["Paris"])])
    assert traj.answers == ["Lyon"] and traj.finish_reason == "answer" and len(traj.segments) == 1


class BacktrackingProtocol(LookupProtocol):
    """<lookup>, <final>, and <back/>: drop the previous step from the context."""

    name = "backtracking"
    backtracks = True
    stop = ("</lookup>", "</final>", "<back/>", "</back>")

    def parse(self, text, turn):
        if "<back/>" in text:
            return Action("backtrack", turn=turn)
        if (span := last_span_of(text, ("back",))) is not None:
            return Action("backtrack", content=span.content.strip(), turn=turn)
        return super().parse(text, turn)


def test_a_backtrack_drops_the_previous_step_and_each_step_trains_on_what_the_policy_saw():
    from ragrl.rollout.stepwise import StepwiseRollout

    retriever = BM25Retriever.build(
        [Passage.make("Paris", "Paris is the capital of France."), Passage.make("Lyon", "Lyon is in France.")]
    )
    replies = [
        "<lookup> capital of France </lookup>",
        "<lookup> Lyon </lookup>",
        "<back/>",
        "<final> Paris </final>",
    ]
    seen: list[list[int]] = []

    def policy(prompt, i):  # noqa: ANN001, ANN202
        seen.append(list(prompt))
        return replies[len(seen) - 1]

    tok = tokenizer()
    rollout = StepwiseRollout(
        ScriptedBackend(tok, policy), retriever, BacktrackingProtocol(), RolloutConfig(k=1)
    )
    [traj] = rollout.run([Example("q", "What is the capital of France?", ["Paris"])])
    # the record keeps every segment in time order
    kinds = [(s.kind, s.text) for s in traj.segments]
    assert kinds == [
        ("policy", replies[0]), ("env", "\n[Paris]\n"), ("policy", replies[1]), ("env", "\n[Lyon]\n"),
        ("policy", "<back/>"), ("policy", replies[3]),
    ]  # fmt: skip
    assert traj.final_answer == "Paris" and [a.kind for a in traj.actions] == [
        "search",
        "search",
        "backtrack",
        "answer",
    ]
    seg = [s.token_ids for s in traj.segments]
    prompt = traj.prompt_ids
    # after the backtrack the policy sees its first step only: the Lyon step and the <back/> are gone
    assert seen[3] == prompt + seg[0] + seg[1]
    assert seen[2] == prompt + seg[0] + seg[1] + seg[2] + seg[3]
    samples = rollout.samples([traj])
    assert [s.step for s in samples] == [0, 1, 2, 3]
    for sample, k, policy_index in zip(samples, range(4), (0, 2, 4, 5), strict=True):
        assert sample.prompt_ids == seen[k]  # each step trains on exactly the context it was sampled from
        assert sample.completion_ids == seg[policy_index] and sample.loss_mask == [1] * len(seg[policy_index])
    # the linear engine refuses a protocol whose episodes are not linear
    with pytest.raises(RagrlError, match="backtracks, so its episodes are not linear"):
        RolloutEngine(ScriptedBackend(tok, policy), retriever, BacktrackingProtocol(), RolloutConfig())


def test_reflection_and_backtrack_edge_cases():
    from ragrl.rollout.stepwise import StepwiseRollout

    ex = Example("q", "What is the capital of France?", ["Paris"])
    # an answer that ends with EOS is final: no reflection after it
    turns = iter(["<final> Lyon"])  # no stop string: the scripted backend appends EOS
    engine = RolloutEngine(ScriptedBackend(tokenizer(), lambda p, i: next(turns)), None, ReflectingProtocol(),
                           RolloutConfig(max_turns=3))  # fmt: skip
    [traj] = engine.run([ex])
    assert traj.finish_reason == "eos" and traj.answers == []
    # a reflection text that does not fit the token budget is not appended: the answer stands
    turns = iter(["<final> Lyon </final>"])
    budget = RolloutConfig(max_turns=3, max_total_tokens=len(tokenizer().encode("<final> Lyon </final>")) + 2)
    engine = RolloutEngine(
        ScriptedBackend(tokenizer(), lambda p, i: next(turns)), None, ReflectingProtocol(), budget
    )
    [traj] = engine.run([ex])
    assert traj.finish_reason == "answer" and not traj.truncated and len(traj.segments) == 1

    # a backtrack as the first turn has nothing to take back: it is invalid and gets the corrective
    def stepwise(replies, protocol):  # noqa: ANN001, ANN202
        it = iter(replies)
        backend = ScriptedBackend(tokenizer(), lambda p, i: next(it))
        [t] = StepwiseRollout(backend, None, protocol, RolloutConfig(max_turns=3)).run([ex])
        return t

    traj = stepwise(["<back/>", "<final> Paris </final>"], BacktrackingProtocol())
    assert [(a.kind, a.error) for a in traj.actions] == [
        ("invalid", "backtrack: nothing to take back"),
        ("answer", None),
    ]
    assert traj.final_answer == "Paris" and traj.metadata["contexts"] == [[], [0, 1]]
    assert traj.segments[1].text == "\n[invalid]\n"

    class BackWithoutStop(BacktrackingProtocol):
        stop = ("</lookup>", "</final>")  # "<back/>" does not stop the turn: EOS ends it

    traj = stepwise(["<lookup> Paris </lookup>", "<back/> and that is all"], BackWithoutStop())
    assert traj.finish_reason == "eos" and [a.kind for a in traj.actions] == ["search", "backtrack"]


def test_the_forced_answer_turn_after_a_backtrack_and_its_resumed_prefix_agree():
    """A backtrack in the last regular turn, then the forced answer turn's note: the engine gives the
    note to the context that is left (a step of its own when the backtrack emptied it), and a prefix cut
    before the forced turn resumes with the very same context."""
    from ragrl.rollout.stepwise import StepwiseRollout

    class Noted(BacktrackingProtocol):
        final_turn_note = "\n[answer now]\n"

    retriever = BM25Retriever.build([Passage.make("Paris", "Paris is the capital of France.")])
    ex = Example("q", "What is the capital of France?", ["Paris"])
    cfg = RolloutConfig(k=1, max_turns=3, final_answer_turn=True)
    for replies in (
        ["<lookup> Paris </lookup>", "<back/>", "<final> Paris </final>"],  # the context is emptied
        ["<lookup> Paris </lookup>", "<lookup> France </lookup>", "<back/>", "<final> Paris </final>"],
    ):
        cfg.max_turns = len(replies) - 1
        seen: list[list[int]] = []

        def policy(prompt, i, replies=replies, seen=seen):  # noqa: ANN001, ANN202
            seen.append(list(prompt))
            return replies[len(seen) - 1]

        rollout = StepwiseRollout(ScriptedBackend(tokenizer(), policy), retriever, Noted(), cfg)
        [live] = rollout.run([ex])
        assert live.final_answer == "Paris" and live.metadata["forced_answer"]
        note = len(live.segments) - 2
        assert live.segments[note].text == Noted.final_turn_note
        kept = 0 if len(replies) == 3 else 2  # the first search and its passages, if the backtrack left them
        assert live.metadata["contexts"][-1] == [*range(kept), note]
        # the prefix up to the forced turn, resumed, plays the same forced turn on the same context
        prefix = Trajectory(live.example_id, list(live.prompt_ids), segments=live.segments[:-1],
                            actions=live.actions[:-1], metadata={"group": 0, "sample": 0})  # fmt: skip
        seen.clear()
        seen.extend([[]] * (len(replies) - 1))
        [again] = rollout.resume([prefix], [ex])
        assert again.metadata["contexts"] == live.metadata["contexts"] and again.final_answer == "Paris"


def test_a_numbered_backtrack_goes_back_to_just_before_that_step():
    from ragrl.rollout.backtrack import active_steps, hops_kept
    from ragrl.rollout.stepwise import StepwiseRollout

    retriever = BM25Retriever.build(
        [Passage.make("Paris", "Paris is the capital of France."), Passage.make("Lyon", "Lyon is in France.")]
    )
    replies = [
        "<lookup> Paris </lookup>",  # hop 1
        "<lookup> Lyon </lookup>",  # hop 2
        "<lookup> France </lookup>",  # hop 3
        "<back>4</back>",  # no hop 4: invalid, its corrective becomes hop 4
        "<back>2</back>",  # back to just before hop 2: hops 2, 3 and 4 leave the context
        "<back>x</back>",  # not a number: invalid (hop 2 of the new context)
        "<back/>",  # takes back that invalid step
        "<final> Paris </final>",
    ]
    seen: list[list[int]] = []

    def policy(prompt, i):  # noqa: ANN001, ANN202
        seen.append(list(prompt))
        return replies[len(seen) - 1]

    rollout = StepwiseRollout(
        ScriptedBackend(tokenizer(), policy),
        retriever,
        BacktrackingProtocol(),
        RolloutConfig(k=1, max_turns=8),
    )
    [traj] = rollout.run([Example("q", "What is the capital of France?", ["Paris"])])
    kinds = [a.kind for a in traj.actions]
    assert kinds == ["search", "search", "search", "invalid", "backtrack", "invalid", "backtrack", "answer"]
    assert traj.actions[3].error == "backtrack: no step 4 to go back to (the context holds steps 1 to 3)"
    # this toy protocol passes "x" on; the core finds no step x
    assert traj.actions[5].error == "backtrack: no step x to go back to (the context holds steps 1 to 1)"
    superscript = hops_kept(Action("backtrack", content="²"), 3)  # a digit to str.isdigit, not to int()
    assert superscript == (3, "no step ² to go back to (the context holds steps 1 to 3)")
    contexts = traj.metadata["contexts"]
    seg = traj.segments
    assert contexts[4] == [0, 1, 2, 3, 4, 5, 6, 7]  # the three hops and the corrective
    assert contexts[5] == [0, 1]  # after <back>2</back>: hop 1 only
    assert contexts[6] == [0, 1, 9, 10]  # hop 1, then the invalid step and its corrective
    assert contexts[7] == [0, 1] and seen[7] == traj.prompt_ids + seg[0].token_ids + seg[1].token_ids
    # the rewards' view of the context agrees with the engine's, step by step
    for t, context in enumerate(contexts):
        steps = active_steps(traj.actions, t)
        policy_at = [i for i, s in enumerate(seg) if s.kind == "policy"]
        assert [policy_at[j] for j in steps] == [i for i in context if seg[i].kind == "policy"]
