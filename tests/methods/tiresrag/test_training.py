"""TIRESRAG-R1 in training: the per-step diagnostics (§7.1 "Logging"), the warm start's demonstrator and
one GRPO step of the CPU config (``tiresrag-tiny``) on the test world."""

from __future__ import annotations

import pytest
import torch

from ragrl.algos.advantages import difficulty_weight
from ragrl.config.train import GRPOConfig, TrainConfig
from ragrl.data.io import read_examples
from ragrl.data.schema import Example
from ragrl.methods import load_method
from ragrl.methods.tiresrag.method import TiresragOracle
from ragrl.methods.tiresrag.protocol import REFLECTION_THOUGHT
from ragrl.rewards.registry import RewardResult
from ragrl.rollout.trajectory import Action, Trajectory
from tests.methods.tiresrag.test_tiresrag import numpy_advantage

EX = Example("q1", "Who founded the lab that built Zorvex?", ["Mira Tolan"])
KEYS = ("tiresrag_answer", "tiresrag_thinking", "tiresrag_sufficiency", "tiresrag_reflection")


def tiny(world, out, *extra):  # noqa: ANN001, ANN201
    return load_method(
        "tiresrag-tiny",
        [
            f"train.model.path={world / 'model'}",
            f"train.data.train={world / 'train.jsonl'}",
            f"train.data.index={world / 'bm25'}",
            f"train.out={out}",
            "train.steps=2",
            "train.grpo.prompts_per_step=4",
            "train.grpo.micro_batch_size=20",
            "train.eval_every=0",
            "rollout.temperature=1.0",
            *extra,
        ],
    )


def episode(answer: str | None, group: int) -> Trajectory:
    actions = [Action("answer", content=answer)] if answer else []
    return Trajectory("q1", [0], actions=actions, final_answer=answer, metadata={"group": group})


def result(ra: float, rt: float, rs: float) -> RewardResult:
    components = dict(zip(KEYS, (ra, rt, rs, 0.0), strict=True))
    weights = {"tiresrag_answer": 1.0, "tiresrag_thinking": 0.6, "tiresrag_sufficiency": 0.3,
               "tiresrag_reflection": 0.3}  # fmt: skip
    return RewardResult(sum(weights[k] * v for k, v in components.items()), components, weights)


def test_step_diagnostics_on_two_hand_built_groups():
    from ragrl.methods.tiresrag.advantage import step_diagnostics

    # group 0: every answer wrong (F1 0: saturated low); group 1: mixed, as test_tiresrag's RA/RT/RS
    answers = [None, "Oslo", "Oslo", "Bergen", None] + [
        "Mira Tolan",
        "Oslo",
        "Tolan Labs",
        "Oslo",
        "Mira Tolan",
    ]
    ra = [0.0] * 5 + [1.0, 0.0, 0.5, 0.0, 1.0]
    rt = [0.1, 0.2, 0.3, 0.4, 0.5] + [0.9, 0.2, 0.5, 0.8, 0.7]
    rs = [0.0, 0.0, 1.0, 0.0, 0.0] + [1.0, 0.0, 1.0, 1.0, 0.0]
    trajectories = [episode(a, i // 5) for i, a in enumerate(answers)]
    results = [result(*x) for x in zip(ra, rt, rs, strict=True)]
    grpo = GRPOConfig(
        advantage="tiresrag", advantage_params={"penalty": "paper"}, group_filter="drop_saturated",
        group_filter_on="tiresrag_answer",
    )  # fmt: skip
    out = step_diagnostics(trajectories, [EX] * 10, results, TrainConfig(grpo=grpo))
    assert out["filter/low_frac"] == 0.5 and out["filter/high_frac"] == 0.0
    # correct (cover-EM) x sufficient (R^S): right + sufficient: episode 5; right without: episode 9
    assert out["suff/correct_sufficient"] == pytest.approx(0.1)
    assert out["suff/correct_insufficient"] == pytest.approx(0.1)
    assert out["suff/wrong_sufficient"] == pytest.approx(0.3)  # 2, 7 (Tolan Labs is not cover-EM), 8
    assert out["suff/wrong_insufficient"] == pytest.approx(0.5)
    w_low, w_mixed = float(difficulty_weight(0.2)), float(difficulty_weight(0.6))
    assert out["adv/W_min"] == pytest.approx(w_mixed) and out["adv/W_max"] == pytest.approx(w_low)
    assert out["adv/W_mean"] == pytest.approx((w_low + w_mixed) / 2)
    # the penalty by hand (test_tiresrag's formula): group 1 is that file's example group (3 episodes
    # penalised); in group 0 every R^A is 0, so z^A = 0 and nothing is
    _, mixed = numpy_advantage(ra[5:], rt[5:], rs[5:])
    assert out["adv/penalty_share"] == pytest.approx(3 / 10)
    assert out["adv/penalty_mean"] == pytest.approx(float(mixed.sum()) / 10)
    assert out["adv/penalty_max"] == pytest.approx(float(mixed.max()))
    # another estimator: the advantage parts are not logged; the 2x2 and saturation still are
    plain = step_diagnostics(trajectories, [EX] * 10, results, TrainConfig(grpo=GRPOConfig(advantage="grpo")))
    assert "adv/W_mean" not in plain and plain["filter/low_frac"] == 0.5
    # the filter's own edges and component: R^T of group 1 is all >= 0.2, of group 0 not all <= 0.3
    on_thinking = GRPOConfig(
        advantage="grpo", group_filter="drop_saturated", group_filter_on="tiresrag_thinking",
        group_filter_params={"low": 0.3, "high": 0.2},
    )  # fmt: skip
    edges = step_diagnostics(trajectories, [EX] * 10, results, TrainConfig(grpo=on_thinking))
    assert (edges["filter/low_frac"], edges["filter/high_frac"]) == (0.0, 0.5)


def test_the_oracle_searches_answers_and_reflects_once(world_dir):
    from ragrl.llm.hf_backend import load_tokenizer
    from ragrl.retrieval.base import load_retriever
    from ragrl.train.sft import demonstration_trajectories

    method = tiny(world_dir, world_dir / "unused")
    assert isinstance(method.oracle, TiresragOracle)
    examples = read_examples(world_dir / "train.jsonl")[0][:6]
    tokenizer = load_tokenizer(world_dir / "model")
    demos = demonstration_trajectories(
        method, tokenizer, method.oracle, examples, load_retriever(world_dir / "bm25")
    )
    for demo, ex in zip(demos, examples, strict=True):
        kinds = [a.kind for a in demo.actions]
        assert kinds[-2:] == ["answer", "answer"] and set(kinds[:-2]) == {"search"}, kinds
        assert demo.answers == [ex.answers[0]] * 2 and demo.finish_reason == "answer"
        assert REFLECTION_THOUGHT in demo.completion_text


def test_one_grpo_step_of_the_cpu_config_logs_the_papers_diagnostics(world_dir, tmp_path):
    from ragrl.train.grpo import GRPOTrainer

    keep_all = ["train.grpo.group_filter_params.low=-1", "train.grpo.group_filter_params.high=2"]
    method = tiny(world_dir, tmp_path / "run", "train.grpo.refill_rounds=0", *keep_all)
    trainer = GRPOTrainer(method, method.train, eval_examples=[])
    metrics = trainer.step()
    assert metrics["schedule/a_t"] == pytest.approx(1 / (1 + torch.e ** ((1 - 0.9 * 2) / 3)))
    logged = ("filter/low_frac", "filter/high_frac", "suff/correct_sufficient", "adv/W_mean",
              "adv/penalty_share", "reflect/none", "answers", "searches")  # fmt: skip
    for key in (*logged, *(f"reward/{k}" for k in KEYS)):
        assert key in metrics, key
    cells = [metrics[f"suff/{c}_{s}"] for c in ("correct", "wrong") for s in ("sufficient", "insufficient")]
    assert sum(cells) == pytest.approx(1.0)
    assert 0.4 < metrics["adv/W_min"] <= metrics["adv/W_max"] < 1.5


def test_the_filter_and_refill_keep_only_groups_that_are_not_saturated(world_dir, tmp_path):
    """An untrained policy answers nothing right: every group is saturated low, the refill rounds run
    out, and the update gets no sample."""
    from ragrl.train.grpo import GRPOTrainer

    method = tiny(world_dir, tmp_path / "run", "train.grpo.refill_rounds=1")
    trainer = GRPOTrainer(method, method.train, eval_examples=[])
    metrics = trainer.step()
    assert metrics["refill_rounds"] == 1 or metrics["kept_frac"] > 0
    assert metrics["kept_frac"] == pytest.approx(
        1.0 - metrics["filter/low_frac"] - metrics["filter/high_frac"]
    )


def test_the_oracle_continues_a_prefilled_think():
    first = TiresragOracle("<think>").next_turn(EX, [])
    assert first == " I know it. </think>\n<answer> Mira Tolan </answer>"  # no search plan: it answers
    assert TiresragOracle().next_turn(EX, []).startswith("<think> I know it.")
