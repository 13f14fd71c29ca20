"""The scripted backends: a demonstrator driving the real engine, and scripted text cut as a model's
generation would be (stop strings, EOS, the token limit)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.engine import RolloutEngine
from ragrl.rollout.scripted import DemonstratorBackend

_spec = importlib.util.spec_from_file_location("rollout_world", Path(__file__).parent / "scripted_world.py")
world = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(world)
bm25 = world.bm25  # the module's BM25 index fixture
TOK, EOS, PROTOCOL, example = world.TOK, world.EOS, world.PROTOCOL, world.example


class TitleDemonstrator:
    """Searches the question, then answers with the title of the first passage it was shown."""

    def __init__(self):
        self.histories = []

    def next_turn(self, example, history):
        self.histories.append((example.id, list(history)))
        if not history:
            return f"<search> {example.question} </search>"
        passages = history[-1].passages
        title = passages[0].title if passages else "unknown"
        return f"<think> read it </think> <answer> {title} </answer> trailing text after the stop"


def test_demonstrator_backend_drives_the_engine(bm25):
    examples = [example(0, "Where was Alan Turing born?"), example(1, "What is the capital of France?")]
    demo = TitleDemonstrator()
    backend = DemonstratorBackend.for_examples(TOK, demo, examples, PROTOCOL, bm25, RolloutConfig().k)
    eng = RolloutEngine(backend, bm25, PROTOCOL, RolloutConfig())
    trajs = eng.run(examples, n=2)
    assert [t.final_answer for t in trajs] == ["Alan Turing", "Alan Turing", "Paris", "Paris"]
    assert backend.calls == 2
    # the history the demonstrator saw, typed: its own (stop-cut) text, the exact observation text, the
    # protocol's parse of its text, and the very passages the engine retrieved for that search
    second = [h for ex_id, h in demo.histories if h]
    assert len(second) == 4
    t0 = trajs[0]
    (turn,) = second[0]
    assert (turn.text, turn.observation) == (t0.segments[0].text, t0.segments[1].text)
    assert (turn.action.kind, turn.action.content) == ("search", t0.actions[0].content)
    assert [p.id for p in turn.passages] == t0.actions[0].retrieved_ids
    assert t0.segments[-1].text.endswith("</answer>")  # cut at the stop string


def test_demonstrator_backend_unknown_prompt():
    from ragrl.errors import RagrlError
    from ragrl.llm.backend import SamplingParams

    backend = DemonstratorBackend.for_examples(TOK, TitleDemonstrator(), [example()], PROTOCOL)
    with pytest.raises(RagrlError, match="matches no known example"):
        backend.generate([[1, 2, 3]], SamplingParams())


def test_scripted_generation_rules():
    from ragrl.llm.backend import SamplingParams
    from ragrl.rollout.scripted import scripted_generation

    p = SamplingParams(max_new_tokens=50, stop=("</search>", "</answer>"))
    g, kept = scripted_generation(TOK, "a <answer> b </answer> <search> c </search> z", p)
    assert kept == "a <answer> b </answer>" and g.finish_reason == "stop" and g.stop == "</answer>"
    g, kept = scripted_generation(TOK, "no stop here", p)
    assert g.finish_reason == "eos" and g.token_ids[-1] == EOS and g.stop == EOS
    g, _ = scripted_generation(TOK, f"early{TOK.eos_token} more <search> q </search>", p)
    assert g.finish_reason == "eos" and g.token_ids[-1] == EOS  # whichever comes first ends it
    g, _ = scripted_generation(TOK, f"early{TOK.eos_token} more", p)
    assert g.finish_reason == "eos" and TOK.decode(g.token_ids) == f"early{TOK.eos_token}"
    g, _ = scripted_generation(TOK, "x " * 100 + "<search> q </search>", SamplingParams(max_new_tokens=5))
    assert g.finish_reason == "length" and len(g.token_ids) == 5 and g.stop is None
    assert g.logprobs == [0.0] * 5
