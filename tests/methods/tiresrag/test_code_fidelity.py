"""TIRESRAG-R1 against the authors' reward code (probe2/TIRESRAG-R1 at a457873,
``reward/answer_reflection_reward.py`` and the advantage in ``experience_maker.py``): the five
disagreements an outside check found, each pinned by a vector whose expected number is worked out by
hand from the code's rules (``extract_answer_math``, ``extract_all_answers``, ``normalize_answer``,
``f1_score``, ``reflect_results``, ``compute_consistency_penalty``, ``group_norm``)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from ragrl.cli import app
from ragrl.data.schema import Example, Passage
from ragrl.errors import RagrlError
from ragrl.methods import load_method
from ragrl.methods.tiresrag.advantage import advantage_terms
from ragrl.methods.tiresrag.protocol import TiresragProtocol, TiresragProtocolConfig
from ragrl.methods.tiresrag.rewards import answer_f1, answer_reward, code_prediction, reflection_value
from ragrl.metrics.answer import f1
from ragrl.retrieval.bm25 import BM25Retriever
from ragrl.rewards import RewardContext
from ragrl.rollout.config import RolloutConfig
from ragrl.rollout.engine import RolloutEngine
from ragrl.rollout.replay import trajectory_from_completion
from ragrl.rollout.scripted import ScriptedBackend
from ragrl.rollout.trajectory import Segment, Trajectory
from tests.rollout.test_protocol import tokenizer

CTX = RewardContext()
EX = Example("q1", "Who founded the lab that built Zorvex?", ["Mira Tolan"])


# --- 1. three or more answers in saved text: the last is the prediction ------------------------------

THREE = (
    "<think> A guess. </think>\n<answer> Oslo </answer><think> Or else. </think>\n<answer> Norway </answer>"
    "<think> No: the lab's founder. </think>\n<answer> Mira Tolan </answer>"
)


def test_a_saved_completion_is_read_to_its_last_answer():
    traj = trajectory_from_completion("q1", THREE, TiresragProtocol())
    assert traj.answers == ["Oslo", "Norway", "Mira Tolan"]  # the code's extract_all_answers
    assert traj.final_answer == "Mira Tolan"  # extract_answer_math: the last one
    # wrong -> wrong -> gold: F1 1; code R^R 0 (first not ok, last ok); paper +1 (CEM 0 -> 1)
    assert answer_reward(traj, EX, CTX) == 1.0
    assert reflection_value(traj.answers, EX.answers, "code") == 0.0
    assert reflection_value(traj.answers, EX.answers, "paper") == 1.0
    # without reflection the first answer ends the episode, as before
    once = trajectory_from_completion("q1", THREE, TiresragProtocol(TiresragProtocolConfig(reflect=False)))
    assert once.answers == ["Oslo"]


def test_the_reward_cli_scores_the_last_of_three_answers(tmp_path):
    gold = tmp_path / "gold.jsonl"
    gold.write_text(
        json.dumps({"id": "q1", "question": EX.question, "golden_answers": ["Mira Tolan"]}) + "\n"
    )
    completions = tmp_path / "c.jsonl"
    rows = [
        {"id": "q1", "completion": THREE},
        {"id": "q1", "completion": THREE.replace("Mira Tolan", "Oslo")},
    ]
    completions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for mode, reflections in (("code", [0.0, -1.0]), ("paper", [1.0, 0.0])):
        result = CliRunner().invoke(
            app,
            ["reward", "tiresrag", "--completions", str(completions), "--gold", str(gold),
             "--set", f"reward.3.mode={mode}"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        got = [json.loads(line) for line in result.output.splitlines()[:2]]
        assert [g["tiresrag_answer"] for g in got] == [1.0, 0.0]
        assert [g["tiresrag_reflection"] for g in got] == reflections


def test_a_live_rollout_still_stops_after_one_reflection():
    turns = iter(["<answer> Oslo </answer>", "<answer> Norway </answer>", "<answer> Mira Tolan </answer>"])
    engine = RolloutEngine(
        ScriptedBackend(tokenizer(), lambda p, i: next(turns)),
        BM25Retriever.build([Passage.make("Zorvex", "Zorvex was built by Tolan Labs.")]),
        TiresragProtocol(),
        RolloutConfig(max_turns=6, k=1),
    )
    [traj] = engine.run([EX])
    assert traj.answers == ["Oslo", "Norway"] and traj.final_answer == "Norway"


# --- 2. an empty answer is the answer "" -------------------------------------------------------------


def test_an_empty_answer_is_the_empty_answer_live_and_replayed():
    protocol = TiresragProtocol()
    action = protocol.parse("<think> Hm. </think>\n<answer> </answer>", 0)
    assert (action.kind, action.content) == ("answer", "")
    replayed = trajectory_from_completion("q1", "<answer> Mira Tolan </answer><answer> </answer>", protocol)
    assert replayed.answers == ["Mira Tolan", ""] and replayed.final_answer == ""
    assert answer_reward(replayed, EX, CTX) == 0.0  # f1_score("", gold): no common token
    # right -> empty: code −1 (the last is not ok), paper −1 (CEM 1 -> 0)
    assert reflection_value(replayed.answers, EX.answers, "code") == -1.0
    assert reflection_value(replayed.answers, EX.answers, "paper") == -1.0
    assert reflection_value([""], EX.answers, "code") == -1.0  # one answer, not ok


def test_the_empty_answer_switch_and_search_r1_keep_it_invalid():
    switched = TiresragProtocol(TiresragProtocolConfig(empty_answer="invalid"))
    assert switched.parse("<answer> </answer>", 0).kind == "invalid"
    search_r1 = load_method("search_r1").protocol
    assert search_r1.parse("<answer>  </answer>", 0).kind == "invalid"
    with pytest.raises(RagrlError, match="protocol.empty_answer"):
        TiresragProtocol(TiresragProtocolConfig(empty_answer="skip"))


# --- 3. the curly apostrophe stays under the code's normalize_answer ---------------------------------


def test_the_curly_apostrophe_is_not_punctuation_for_tiresrag():
    # code: "denise levertov’s" vs "denise levertov": 1 common token of 2 and 2 -> F1 0.5
    assert answer_f1("Denise Levertov’s", ["Denise Levertov"]) == 0.5
    # ARENA strips ’: "denise levertov s", P 2/3, R 1 -> 0.8
    assert f1("Denise Levertov’s", ["Denise Levertov"], variant="arena")[0] == pytest.approx(0.8)
    assert answer_f1("Denise Levertov's", ["Denise Levertov"]) == pytest.approx(0.8)  # ' goes


# --- 4. whole-text F1 without an answer reads the prefill too ----------------------------------------


def silent(text: str) -> Trajectory:
    return Trajectory("q1", [0], segments=[Segment("policy", [1], text)])


def test_no_answer_text_mode_scores_what_extract_answer_math_reads_with_the_prefill():
    t = silent(" Mira Tolan wrote it </think><|im_end|> trailing")
    # response "<think> Mira Tolan wrote it </think>" (cut at <|im_end|>): normalized
    # "think mira tolan wrote it think", 6 tokens, 2 common: P 1/3, R 1 -> F1 0.5
    assert answer_reward(t, EX, CTX, no_answer="text", prefill="<think>") == pytest.approx(0.5)
    # without the prefill: 5 tokens, P 2/5 -> F1 4/7
    assert answer_reward(t, EX, CTX, no_answer="text") == pytest.approx(4 / 7)
    assert answer_reward(t, EX, CTX) == 0.0  # the default: zero
    # an unclosed answer: the text after the last <answer>
    assert code_prediction("<think> x </think><answer> Mira") == "Mira"
    assert answer_reward(
        silent(" x </think><answer> Mira"), EX, CTX, no_answer="text", prefill="<think>"
    ) == (pytest.approx(2 / 3))


def test_the_method_hands_the_protocols_prefill_to_the_components_that_read_the_response():
    method = load_method("tiresrag", ["reward.0.no_answer=text"])
    params = {c.name: dict(c.params) for c in method.reward.components}
    for name in ("tiresrag_answer", "tiresrag_sufficiency", "tiresrag_thinking"):
        assert params[name]["prefill"] == "<think>"
    t = silent(" Mira Tolan wrote it </think>")
    result = method.reward.score([t], [EX], CTX)[0]
    assert result.components["tiresrag_answer"] == pytest.approx(0.5)
    with pytest.raises(RagrlError, match=r"reward\.0\.prefill"):
        load_method("tiresrag", ["reward.0.prefill=<search>"])


# --- 5. the consistency penalty keeps the population std whatever A_i uses ---------------------------

RA = [1.0, 0.0, 0.0, 0.0, 0.0]
RT = [1.0, 0.0, 0.0, 0.0, 0.0]
RS = [0.0, 1.0, 1.0, 1.0, 1.0]
R_SUM = [1.6, 0.3, 0.3, 0.3, 0.3]  # R^A + 0.6 R^T + 0.3 R^S


def test_std_sample_moves_the_advantage_not_the_penalty():
    comps = {k: torch.tensor(v, dtype=torch.float64) for k, v in
             (("tiresrag_answer", RA), ("tiresrag_thinking", RT), ("tiresrag_sufficiency", RS))}  # fmt: skip
    ids = torch.zeros(5, dtype=torch.long)
    terms = advantage_terms(
        torch.tensor(R_SUM, dtype=torch.float64), ids, components=comps, std="sample", eps=1e-9
    )
    # penalty (np.std, population): z = ±2 for rollout 0 (std of [1,0,0,0,0] is 0.4), product
    # 2·2·(−2) = −8 -> 0.8; the others: (−0.5)(−0.5)(0.5) > 0 -> 0
    penalty = 0.1 * (0.8 / (0.4 + 1e-8)) ** 3  # the code's eps: 1e-8 on each std
    assert terms["penalty"].tolist() == pytest.approx([penalty, 0.0, 0.0, 0.0, 0.0], abs=1e-12)
    # A_i (group_norm: torch.std, unbiased, + 1e-9): mean 0.56, deviations 1.04 and −0.26, var 0.338
    w = 0.4 + 1.1 / (1 + math.exp(10 * (0.8 - 0.75)))  # W(ρ = 0.8)
    a0 = 1.04 / (math.sqrt(0.338) + 1e-9)
    rest = -0.26 / (math.sqrt(0.338) + 1e-9)
    assert terms["advantage"].tolist() == pytest.approx([(a0 - penalty) * w] + [rest * w] * 4, abs=1e-12)
    # the penalty's std is its own switch
    sample = advantage_terms(
        torch.tensor(R_SUM, dtype=torch.float64), ids, components=comps, penalty_std="sample"
    )
    assert sample["penalty"][0].item() == pytest.approx(0.1 * (0.8 / (math.sqrt(0.2) + 1e-8)) ** 3, abs=1e-12)


# --- what review found: end tokens, the format check, the method's judges, the switches --------------


def test_replay_stops_at_an_end_token_as_the_code_and_a_live_rollout_do():
    text = "<answer> Oslo </answer><answer> Mira Tolan </answer><|im_end|><answer> Norway </answer>"
    traj = trajectory_from_completion("q1", text, TiresragProtocol())
    assert traj.answers == ["Oslo", "Mira Tolan"] and traj.final_answer == "Mira Tolan"
    # the code's response: cut at <|im_end|>, last answer "Mira Tolan"
    assert code_prediction(text.split("<|im_end|>")[0]) == "Mira Tolan"
    # a first turn that ends at EOS without an answer ends the episode (Search-R1's replay too)
    search_r1 = load_method("search_r1").protocol
    silent_end = trajectory_from_completion(
        "q1", "<think> hm </think><|im_end|><answer> x </answer>", search_r1
    )
    assert silent_end.final_answer is None and [a.kind for a in silent_end.actions] == ["invalid"]


def test_an_empty_answer_is_well_formed_for_the_format_check():
    from ragrl.methods.tiresrag.protocol import format_valid

    traj = trajectory_from_completion("q1", "<think>a</think>\n<answer> </answer>", TiresragProtocol())
    assert traj.final_answer == "" and format_valid(traj)
    assert not format_valid(traj, empty_answer=False)


def test_the_judges_get_the_prefill_from_the_method(chat_server):
    from tests.methods.tiresrag.test_judges import reply

    judge = {"kind": "openai", "base_url": chat_server.url, "model": "judge", "concurrency": 1}
    method = load_method(
        "tiresrag", [f"reward.1.judge={json.dumps(judge)}", f"reward.2.judge={json.dumps(judge)}"]
    )
    chat_server.script = [reply("0.5"), reply("0.5")]
    t = silent(" Mira Tolan wrote it </think>")
    method.reward.score([t], [EX], CTX)
    users = [r["body"]["messages"][1]["content"] for r in chat_server.requests]
    assert any("### MODEL THINKING PROCESS\n<think> Mira Tolan wrote it </think>" in u for u in users)
    assert any("### REFERENCES\n<think> Mira Tolan wrote it </think>" in u for u in users)


def test_eval_rar_keeps_an_empty_answer_invalid_and_evo_rag_refuses_the_switch():
    assert load_method("eval_rar").protocol.parse("<answer> </answer>", 0).kind == "invalid"
    with pytest.raises(RagrlError, match="protocol.empty_answer"):
        load_method("evo_rag", ["protocol.empty_answer=answer"])


def test_a_bad_std_is_named():
    comps = {k: torch.zeros(5, dtype=torch.float64) for k in ("tiresrag_answer", "tiresrag_thinking",
                                                               "tiresrag_sufficiency")}  # fmt: skip
    ids = torch.zeros(5, dtype=torch.long)
    with pytest.raises(RagrlError, match="advantage_params.penalty_std"):
        advantage_terms(torch.zeros(5, dtype=torch.float64), ids, components=comps, penalty_std="unbiased")
    with pytest.raises(RagrlError, match="advantage_params.std"):
        advantage_terms(torch.zeros(5, dtype=torch.float64), ids, components=comps, std="pop")
