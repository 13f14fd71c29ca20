"""The multi-head reward model: the pairwise loss by hand, last-token embeddings of a frozen encoder,
heads that learn the order they are given (shared or per head), save/load, the pair file and the CLI."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from torch.nn import functional as F
from typer.testing import CliRunner

from ragrl.cli import app
from ragrl.errors import DataError, RagrlError
from ragrl.rollout.sample import PreferencePair, Sample
from ragrl.train.reward_model import (
    MultiHeadRewardModel,
    RewardModelConfig,
    RewardModelTrainer,
    RewardPair,
    embed_sequences,
    pairwise_loss,
    read_reward_pairs,
)


def test_pairwise_loss_by_hand():
    chosen = torch.tensor([[2.0, 0.0, 5.0]])
    rejected = torch.tensor([[0.0, 1.0, 0.0]])
    signs = torch.tensor([[1.0, -1.0, 0.0]])  # head 2 prefers the rejected one; head 3 has no label
    loss, accuracy = pairwise_loss(chosen, rejected, signs)
    assert float(loss) == pytest.approx(
        -(math.log(1 / (1 + math.exp(-2))) + math.log(1 / (1 + math.exp(-1)))) / 2
    )
    assert float(accuracy) == 1.0
    with pytest.raises(RagrlError, match="no \\(pair, head\\) has a label"):
        pairwise_loss(chosen, rejected, torch.zeros(1, 3))


class PlantedEncoder(torch.nn.Module):
    """A stand-in for a frozen LM: token 1 embeds along +e0, token 2 along −e0, others at random; the
    last hidden state is the token's own embedding."""

    def __init__(self, vocab: int = 20, dim: int = 8) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        table = torch.randn(vocab, dim, generator=g) * 0.3
        table[1, 0], table[2, 0] = 2.0, -2.0
        self.table = torch.nn.Parameter(table)

    def forward(self, input_ids, attention_mask=None, output_hidden_states=False):  # noqa: ANN001, ANN201
        return SimpleNamespace(hidden_states=(self.table[input_ids],))


def _pairs(n: int, signs: dict[str, float] | None = None) -> list[RewardPair]:
    out = []
    for i in range(n):
        prompt = [3 + i % 10, 4]
        chosen = Sample(prompt, [5, 1], [1, 1], [0.0, 0.0], group=0)  # ends with the "good" token
        rejected = Sample(prompt, [5, 2], [1, 1], [0.0, 0.0], group=0)
        out.append(RewardPair(PreferencePair(chosen, rejected, id=f"q{i}#0"), dict(signs or {})))
    return out


def test_heads_learn_the_order_they_are_given_and_the_encoder_stays_frozen():
    encoder = PlantedEncoder()
    frozen = encoder.table.detach().clone()
    config = RewardModelConfig(heads=["helpful", "harmful"], epochs=30, lr=5e-2, val_fraction=0.2)
    trainer = RewardModelTrainer(encoder, 0, _pairs(40, {"harmful": -1}), config)
    assert len(trainer.val_rows) == 8 and len(trainer.train_rows) == 32  # whole questions held out
    before = trainer.evaluate(trainer.val_rows)
    history = trainer.train()
    last = history[-1]
    assert last["val/loss"] < before["loss"] and last["val/loss"] < 0.1
    assert last["val/accuracy/helpful"] == 1.0 and last["val/accuracy/harmful"] == 1.0
    good, bad = trainer.model.scores(torch.stack([trainer.chosen[0], trainer.rejected[0]]))
    assert good["helpful"] > bad["helpful"] and good["harmful"] < bad["harmful"]  # opposite orders
    assert torch.equal(encoder.table.detach(), frozen)


def test_embeddings_are_the_last_real_token_whatever_the_padding(world_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(world_dir / "model").eval()
    seqs = [[5, 6, 7, 8, 9], [5, 6], [7]]
    together = embed_sequences(model, seqs, pad_id=0, batch_size=3)
    alone = torch.cat([embed_sequences(model, [s], pad_id=0) for s in seqs])
    assert together.shape == (3, model.config.hidden_size)
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-5)
    with pytest.raises(RagrlError, match="at least one token"):
        embed_sequences(model, [[]], pad_id=0)


def test_save_and_load_keep_the_heads_and_their_names(tmp_path):
    model = MultiHeadRewardModel(8, ["a", "b"], encoder="enc")
    x = torch.randn(3, 8)
    loaded = MultiHeadRewardModel.load(model.save(tmp_path / "rm"))
    assert loaded.head_names == ["a", "b"] and loaded.encoder == "enc"
    assert loaded.scores(x) == model.scores(x)
    with pytest.raises(RagrlError, match="not a reward model folder"):
        MultiHeadRewardModel.load(tmp_path)
    with pytest.raises(RagrlError, match="distinct names"):
        MultiHeadRewardModel(8, ["a", "a"])


def test_reward_pairs_file_and_the_command(world_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(world_dir / "model")
    path = tmp_path / "pairs.jsonl"
    rows = [
        {"id": f"q{i}#0", "prompt": f"Question {i}?", "chosen": "<answer> Paris </answer>",
         "rejected": "<answer> Lyon </answer>", "head_signs": {"answer": 1, "format": 0}}
        for i in range(12)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    pairs = read_reward_pairs(path, tokenizer)
    assert len(pairs) == 12 and pairs[0].signs == {"answer": 1.0, "format": 0.0}
    out = tmp_path / "rm"
    args = ["reward-model", "--pairs", str(path), "--encoder", str(world_dir / "model"), "--out", str(out),
            "--heads", "answer,format", "--epochs", "3", "--val-fraction", "0.25"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{") :])
    assert summary["pairs"] == 12 and summary["epoch"] == 3 and "val/accuracy/answer" in summary
    assert "val/accuracy/format" not in summary  # no pair labels the format head
    assert MultiHeadRewardModel.load(out).head_names == ["answer", "format"]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
    assert [s["step"] for s in json.loads((out / "environment.json").read_text())] == [0]
    bad = dict(rows[0], head_signs={"answer": 2})
    path.write_text(json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"pairs.jsonl:1: field 'head_signs'"):
        read_reward_pairs(path, tokenizer)
    unknown = RewardModelConfig(heads=["answer"])
    with pytest.raises(RagrlError, match=r"label heads \['format'\]"):
        RewardModelTrainer(PlantedEncoder(), 0, _pairs(2, {"format": 1}), unknown)


def test_the_loss_is_the_logistic_loss_of_the_score_gap():
    c, r = torch.randn(5, 3), torch.randn(5, 3)
    loss, _ = pairwise_loss(c, r, torch.ones(5, 3))
    assert float(loss) == pytest.approx(float(-F.logsigmoid(c - r).mean()), abs=1e-6)


def test_extra_passes_embed_nothing_and_change_no_embedding(world_dir):
    """A process with fewer sequences than another makes as many forward passes (a sharded encoder's
    are collective): the extra ones add no row; with no sequence at all, an empty [0, hidden]."""
    from ragrl.config.train import ModelConfig
    from ragrl.train.reward_model import embedding_passes
    from ragrl.train.setup import load_policy

    model, _ = load_policy(ModelConfig(path=str(world_dir / "model")), torch.device("cpu"))
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    sequences = [[5, 6, 7], [8, 9], [10]] * 7  # 21 sequences: 2 passes of 16
    plain = embed_sequences(model, sequences, 0)
    assert len(calls) == embedding_passes(21) == 2
    padded = embed_sequences(model, sequences, 0, passes=4)
    assert len(calls) == 2 + 4 and torch.equal(plain, padded)
    empty = embed_sequences(model, [], 0, passes=1)
    assert empty.shape == (0, model.config.hidden_size) and len(calls) == 7
    with pytest.raises(RagrlError, match="no sequences"):
        embed_sequences(model, [], 0)
