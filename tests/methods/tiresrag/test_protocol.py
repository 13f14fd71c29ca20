"""TIRESRAG-R1's rollout (the insertion format, one reflection pass, the exact loss mask), its packaged
config, replay of saved text and ``ragrl reward tiresrag``."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from ragrl.cli import app
from ragrl.data.schema import Example, Passage
from ragrl.methods import load_method
from ragrl.methods.tiresrag.protocol import TiresragProtocol, TiresragProtocolConfig
from ragrl.retrieval.bm25 import BM25Retriever
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.engine import RolloutEngine
from ragrl.rollout.replay import trajectory_from_completion
from ragrl.rollout.scripted import ScriptedBackend
from ragrl.rollout.trajectory import Segment
from tests.rollout.test_engine_properties import TOKENIZERS
from tests.rollout.test_protocol import tokenizer

EX = Example("q1", "Who founded the lab that built Zorvex?", ["Mira Tolan"])
PASSAGES = [
    Passage.make("Zorvex", "Zorvex was built by Tolan Labs, founded by Mira Tolan."),
    Passage.make("Oslo", "Oslo is the capital of Norway."),
]


def engine(turns, protocol=None, max_turns=6):
    script = iter(turns)
    return RolloutEngine(
        ScriptedBackend(tokenizer(), lambda p, i: next(script)),
        BM25Retriever.build(PASSAGES),
        protocol or TiresragProtocol(),
        RolloutConfig(max_turns=max_turns, k=1),
    )


def test_think_retrieve_answer_reflect():
    turns = [
        "<think> Who built Zorvex? </think>\n<search> Zorvex built lab </search>",
        "<think> So Oslo. </think>\n<answer> Oslo </answer>",
        "<think> Wait: Mira Tolan founded it. </think>\n<answer> Mira Tolan </answer>",
    ]
    [traj] = engine(turns).run([EX])
    assert [(s.kind, s.text) for s in traj.segments] == [
        ("policy", turns[0]),
        # the code's insertion: "\n\n<information>\n(1)<title> <text>\n</information>\n\n"
        (
            "env",
            "\n\n<information>\n(1)Zorvex Zorvex was built by Tolan Labs, founded by Mira Tolan.\n"
            "</information>\n\n",
        ),
        ("policy", turns[1]),
        ("policy", turns[2]),  # the reflection cue is empty: the policy just goes on
    ]
    assert traj.answers == ["Oslo", "Mira Tolan"] and traj.final_answer == "Mira Tolan"
    assert traj.finish_reason == "answer"
    policy = [t for s in traj.segments if s.kind == "policy" for t in s.token_ids]
    assert [t for t, m in zip(traj.completion_ids, traj.loss_mask, strict=True) if m] == policy
    assert len(traj.loss_mask) == len(traj.completion_ids)


def test_one_reflection_only_and_none_when_switched_off():
    answers = ["<answer> Oslo </answer>", "<answer> Bergen </answer>", "<answer> never </answer>"]
    [traj] = engine(list(answers)).run([EX])
    assert traj.answers == ["Oslo", "Bergen"]
    off = TiresragProtocol(TiresragProtocolConfig(reflect=False))
    [traj] = engine(list(answers), off).run([EX])
    assert traj.answers == ["Oslo"] and len(traj.segments) == 1


def test_no_results_and_the_cue():
    protocol = TiresragProtocol(TiresragProtocolConfig(reflection_cue="\nReflect once.\n"))
    assert protocol.observation(None, []) == "\n\n<information>\nNone</information>\n\n"
    [traj] = engine(["<answer> Oslo </answer>", "<answer> Mira Tolan </answer>"], protocol).run([EX])
    assert [s.text for s in traj.segments][1] == "\nReflect once.\n"


def test_the_packaged_config_is_the_papers_recipe():
    method = load_method("tiresrag")
    assert method.rollout.n == 5 and method.rollout.k == 5 and method.rollout.max_new_tokens == 512
    g = method.train.grpo
    assert (g.advantage, g.group_filter, g.group_filter_on) == (
        "tiresrag",
        "drop_saturated",
        "tiresrag_answer",
    )
    assert g.kl_coef == 0.0 and method.train.optim.lr == 2e-6 and method.train.steps == 144
    assert [c["name"] for c in method.config.reward] == [
        "tiresrag_answer",
        "tiresrag_thinking",
        "tiresrag_sufficiency",
        "tiresrag_reflection",
    ]


COMPLETION = (
    "<think> Who built Zorvex? </think>\n<search> Zorvex lab </search>\n\n<information>\n(1)Zorvex Zorvex "
    "was built by Tolan Labs, founded by Mira Tolan.\n</information>\n\n<think> So Oslo. </think>\n<answer> "
    "Oslo </answer><think> Wait, it says Mira Tolan. </think>\n<answer> Mira Tolan </answer>"
)


def test_replayed_text_keeps_the_reflection():
    traj = trajectory_from_completion("q1", COMPLETION, TiresragProtocol())
    assert traj.answers == ["Oslo", "Mira Tolan"] and traj.final_answer == "Mira Tolan"
    once = trajectory_from_completion(
        "q1", COMPLETION, TiresragProtocol(TiresragProtocolConfig(reflect=False))
    )
    assert once.answers == ["Oslo"] and once.final_answer == "Oslo"


def test_reward_cli(tmp_path):
    gold = tmp_path / "gold.jsonl"
    gold.write_text(
        json.dumps({"id": "q1", "question": EX.question, "golden_answers": ["Mira Tolan"]}) + "\n"
    )
    completions = tmp_path / "c.jsonl"
    completions.write_text(json.dumps({"id": "q1", "completion": COMPLETION}) + "\n")
    args = ["reward", "tiresrag", "--completions", str(completions), "--gold", str(gold)]
    result = CliRunner().invoke(app, [*args, "--step", "143", "--total-steps", "144"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.output.splitlines()[0])
    assert row["id"] == "q1"
    assert (row["tiresrag_answer"], row["tiresrag_reflection"], row["tiresrag_sufficiency"]) == (
        1.0,
        1.0,
        1.0,
    )
    assert row["tiresrag_thinking"] == 1.0  # proxy: searched, and the answer is in the evidence
    a_t = row["a_t"]  # the labelled schedule's multiplier, §2.6 table at t = 144
    assert a_t == pytest.approx(0.192, abs=5e-4)
    assert row["weights"]["tiresrag_reflection"] == pytest.approx(0.3 * a_t)
    assert row["total"] == pytest.approx(1.0 + a_t * (0.6 + 0.3 + 0.3))
    early = CliRunner().invoke(app, [*args, "--step", "0", "--total-steps", "144"])  # t = 1
    assert json.loads(early.output.splitlines()[0])["a_t"] == pytest.approx(1 / (1 + math.exp(-12.86)))


def test_a_declined_reflection_ends_with_the_answer_live_and_replayed():
    turns = ["<answer> Mira Tolan </answer>", "<think> That is right. </think>"]
    [traj] = engine(turns).run([EX])
    assert [a.kind for a in traj.actions] == ["answer", "reflect"]
    assert traj.finish_reason == "answer" and traj.final_answer == "Mira Tolan" and traj.num_invalid == 0
    replayed = trajectory_from_completion("q1", "".join(turns), TiresragProtocol())
    assert [a.kind for a in replayed.actions] == ["answer", "reflect"]
    assert replayed.finish_reason == "answer" and replayed.final_answer == "Mira Tolan"


@pytest.mark.parametrize("tok_name", sorted(set(TOKENIZERS) - {"word"}))  # word-level: lossy
def test_the_loss_mask_is_exact_on_real_tokenizers_with_the_think_prefill(tok_name):
    """Byte-level BPE with ChatML (and SmolLM2's own tokenizer after `make smollm2`): the prompt ends
    with the prefilled <think>, every policy token is trained on, every inserted token is not."""
    tok = TOKENIZERS[tok_name]
    protocol = TiresragProtocol(TiresragProtocolConfig(prefill="<think>", reflection_cue="\nCheck once.\n"))
    turns = [
        " Who built Zorvex? </think>\n<search> Zorvex built lab </search>",
        "<think> Mira Tolan. </think>\n<answer> Mira Tolan </answer>",
        "<think> It stands. </think>\n<answer> Mira Tolan </answer>",
    ]
    script = iter(turns)
    eng = RolloutEngine(
        ScriptedBackend(tok, lambda p, i: next(script)),
        BM25Retriever.build(PASSAGES),
        protocol,
        RolloutConfig(max_turns=6, k=1, max_new_tokens=64, max_total_tokens=1024, max_obs_tokens=256),
    )
    [traj] = eng.run([EX])
    prefill = tok.encode("<think>", add_special_tokens=False)
    assert traj.prompt_ids[-len(prefill) :] == prefill
    assert protocol.prompt_text(EX).endswith("<think>")
    assert [s.kind for s in traj.segments] == ["policy", "env", "policy", "env", "policy"]
    assert [s.text for s in traj.segments if s.kind == "policy"] == turns
    assert traj.answers == ["Mira Tolan", "Mira Tolan"] and traj.finish_reason == "answer"
    pos = 0
    for s in traj.segments:
        assert traj.loss_mask[pos : pos + len(s.token_ids)] == [int(s.kind == "policy")] * len(s.token_ids)
        assert tok.decode(s.token_ids, skip_special_tokens=False) == s.text
        pos += len(s.token_ids)
    assert pos == len(traj.completion_ids) == len(traj.loss_mask)
    assert traj.segments[1].text.startswith("\n\n<information>\n(1)Zorvex ")
    assert traj.segments[3].text == "\nCheck once.\n"


def test_per_episode_diagnostics_reflection_transitions_and_the_format_check():
    from ragrl.methods.tiresrag.method import diagnostics

    search = "<think> Who built Zorvex? </think>\n<search> Zorvex </search>"
    right, wrong = (
        "<think> So. </think>\n<answer> Mira Tolan </answer>",
        "<think> So. </think>\n<answer> Oslo </answer>",
    )
    cases = {
        "wrong_to_right": [search, wrong, right],
        "right_to_wrong": [search, right, wrong],
        "unchanged": [search, right, right],
        "none": [search, right, "<think> It stands. </think>"],  # a declined reflection
    }
    for transition, turns in cases.items():
        [traj] = engine(turns).run([EX])
        d = diagnostics(traj, EX)
        assert d[f"reflect/{transition}"] == 1.0, transition
        assert sum(d[f"reflect/{k}"] for k in cases) == 1.0
        assert d["answers"] == (1.0 if transition == "none" else 2.0) and d["valid_searches"] == 1.0
        assert d["format_valid"] == float(transition != "none"), transition  # the code: last tag </answer>
    [declined] = engine([search, right, ""]).run([EX])  # the reflection: nothing
    assert declined.actions[-1].kind == "reflect" and diagnostics(declined, EX)["format_valid"] == 1.0
    declined.segments[-1] = Segment("policy", [2], "<|im_end|>")  # nothing but the end token
    assert diagnostics(declined, EX)["format_valid"] == 1.0
    [sloppy] = engine(["Zorvex? <search> Zorvex </search>", right, right]).run([EX])
    assert diagnostics(sloppy, EX)["format_valid"] == 0.0  # text outside the tags
    [prefilled] = engine([search.removeprefix("<think>"), right, right]).run([EX])
    assert diagnostics(prefilled, EX, prefill="<think>")["format_valid"] == 1.0
    assert diagnostics(prefilled, EX)["format_valid"] == 0.0
