"""SFT: the loss is the token mean of -log p over policy tokens only, and it goes down."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from ragrl.data.io import read_examples
from ragrl.errors import RagrlError
from ragrl.llm.logprobs import token_logprobs
from ragrl.methods import load_method
from ragrl.retrieval.base import load_retriever
from ragrl.synth.demonstrators import OracleDemonstrator
from ragrl.train.batch import sequence_batch
from ragrl.train.setup import load_policy
from ragrl.train.sft import SFTTrainer, demonstration_trajectories


def test_sft_loss_is_policy_token_mean_and_decreases(world_dir, tmp_path):
    method = load_method(
        "search_r1-tiny",
        [
            f"train.model.path={world_dir / 'model'}",
            f"train.out={tmp_path / 'sft'}",
            "train.sft.batch_size=8",
            "train.sft.max_steps=6",
            "train.sft.lr=3e-3",
            "train.optim.warmup_steps=0",
        ],
    )
    model, tokenizer = load_policy(method.train.model, torch.device("cpu"))
    examples, _ = read_examples(world_dir / "train.jsonl")
    demos = demonstration_trajectories(
        method, tokenizer, OracleDemonstrator(), examples[:8], load_retriever(world_dir / "bm25")
    )
    assert all(t.final_answer == ex.answers[0] for t, ex in zip(demos, examples[:8], strict=True))
    assert all(0 in t.loss_mask and 1 in t.loss_mask for t in demos)  # observations are context

    # the loss by hand: -Σ policy-token log-probs / number of policy tokens, before any update
    b = sequence_batch(demos, tokenizer.pad_token_id)
    with torch.no_grad():
        logp = token_logprobs(model, b.input_ids, b.attention_mask, start=b.start)
    expected = float(-(logp * b.loss_mask).sum() / b.loss_mask.sum())

    trainer = SFTTrainer(method, method.train, demos, eval_examples=[], model=model, tokenizer=tokenizer)
    losses = [trainer.step()["loss"] for _ in range(6)]  # batch 8 of 8 demos: the same batch each step
    assert abs(losses[0] - expected) < 1e-4
    assert losses[-1] < losses[0] - 0.5


def _stepwise_sft(world_dir, tmp_path, *extra: str):  # noqa: ANN202
    """An SFT trainer of a step-wise Search-R1 on the oracle's demonstrations of 4 training questions."""
    method = load_method(
        "search_r1-tiny",
        [f"train.model.path={world_dir / 'model'}", f"train.out={tmp_path / 'sft'}", "rollout.kind=stepwise",
         "train.sft.batch_size=4", "train.sft.max_steps=1", *extra],
    )  # fmt: skip
    model, tokenizer = load_policy(method.train.model, torch.device("cpu"))
    examples, _ = read_examples(world_dir / "train.jsonl")
    demos = demonstration_trajectories(
        method, tokenizer, OracleDemonstrator(), examples[:4], load_retriever(world_dir / "bm25")
    )
    trainer = SFTTrainer(method, method.train, demos, eval_examples=[], model=model, tokenizer=tokenizer)
    return trainer, demos


def test_a_stepwise_method_learns_each_turn_on_the_context_it_saw(world_dir, tmp_path):
    trainer, demos = _stepwise_sft(world_dir, tmp_path)
    turns = sum(1 for t in demos for s in t.segments if s.kind == "policy")
    assert len(trainer.demonstrations) == turns > len(demos)
    first = trainer.demonstrations[1]  # the second turn of the first demonstration
    segs = demos[0].segments
    assert first.prompt_ids == demos[0].prompt_ids + segs[0].token_ids + segs[1].token_ids
    assert first.completion_ids == segs[2].token_ids and set(first.loss_mask) == {1}
    assert trainer.step()["loss"] > 0


def test_a_stepwise_method_renames_each_turn_sample(world_dir, tmp_path):
    trainer, _ = _stepwise_sft(
        world_dir, tmp_path, f"train.data.train={world_dir / 'train.jsonl'}", "train.sft.name_swap=1.0"
    )
    turn = trainer.demonstrations[1]  # a turn's sample (context + the turn), not a whole trajectory
    renamed = trainer._renamed(turn, random.Random(0))
    assert renamed.prompt_ids != turn.prompt_ids and len(renamed.prompt_ids) == len(turn.prompt_ids)
    calls = []
    sample = trainer.name_swap.sample
    trainer.name_swap.sample = lambda row, rng: calls.append(row) or sample(row, rng)
    assert trainer.step()["loss"] > 0
    assert len(calls) == 4 and all(row in trainer.demonstrations for row in calls)  # the batch's samples


def test_turns_last_learns_only_the_answer_turn_on_the_same_sequence(world_dir, tmp_path):
    method = load_method(
        "search_r1-tiny",
        [f"train.model.path={world_dir / 'model'}", f"train.out={tmp_path / 'sft'}", "train.sft.turns=last",
         "train.sft.batch_size=4", "train.sft.max_steps=1", "train.optim.warmup_steps=0"],
    )  # fmt: skip
    model, tokenizer = load_policy(method.train.model, torch.device("cpu"))
    examples, _ = read_examples(world_dir / "train.jsonl")
    demos = demonstration_trajectories(
        method, tokenizer, OracleDemonstrator(), examples[:4], load_retriever(world_dir / "bm25")
    )
    assert all(t.num_searches >= 2 for t in demos)  # multi-hop: earlier turns that are searches
    cut = dataclasses.replace(demos[0], truncated=True, example_id="cut")  # no ending turn: left out
    trainer = SFTTrainer(
        method, method.train, [*demos, cut], eval_examples=[], model=model, tokenizer=tokenizer
    )
    for demo, kept in zip(demos, trainer.demonstrations, strict=True):
        last = [s for s in demo.segments if s.kind == "policy"][-1]
        assert kept.completion_ids == demo.completion_ids and kept.prompt_ids == demo.prompt_ids
        assert kept.num_policy_tokens == len(last.token_ids) < demo.num_policy_tokens
        assert kept.loss_mask[-len(last.token_ids) :] == [1] * len(last.token_ids)
        assert "<answer>" in last.text and kept.actions == demo.actions
    # the loss is the mean over the answer turns' tokens only
    b = sequence_batch(trainer.demonstrations, tokenizer.pad_token_id)
    with torch.no_grad():
        logp = token_logprobs(model, b.input_ids, b.attention_mask, start=b.start)
    expected = float(-(logp * b.loss_mask).sum() / b.loss_mask.sum())
    assert abs(trainer.step()["loss"] - expected) < 1e-4
    with pytest.raises(RagrlError, match="every demonstration was cut short by a budget"):
        SFTTrainer(method, method.train, [cut], eval_examples=[], model=model, tokenizer=tokenizer)


def test_turns_last_is_refused_for_a_stepwise_method_and_checked_when_the_config_loads(world_dir, tmp_path):
    with pytest.raises(RagrlError, match="train.sft.turns: last needs whole-episode demonstrations"):
        _stepwise_sft(world_dir, tmp_path, "train.sft.turns=last")
    with pytest.raises(RagrlError, match=r"train.sft.turns must be all\|last, got 'first'"):
        load_method("search_r1-tiny", ["train.sft.turns=first"])
