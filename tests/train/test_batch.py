"""sequence_batch: trajectories to right-padded training tensors, and the log-prob alignment they rely on."""

from __future__ import annotations

import math

import pytest
import torch

from ragrl.llm.logprobs import entropy_from_logits, token_logprobs
from ragrl.rollout.trajectory import Segment, Trajectory
from ragrl.train.batch import SequenceBatch, sequence_batch

PAD = 0


def _trajectories() -> list[Trajectory]:
    """Three rollouts with prompts of length 3, 2 and 4 and policy/env/policy segments."""
    t0 = Trajectory(
        "q0",
        prompt_ids=[1, 2, 3],
        segments=[
            Segment("policy", [10, 11], "ab", logprobs=[-0.1, -0.2]),
            Segment("env", [20, 21, 22], "<information>...</information>"),
            Segment("policy", [12], "c", logprobs=[-0.3]),
        ],
    )
    t1 = Trajectory(
        "q1",
        prompt_ids=[4, 5],
        segments=[Segment("policy", [13, 14, 15], "def", logprobs=[-0.4, -0.5, -0.6])],
    )
    t2 = Trajectory(
        "q2",
        prompt_ids=[6, 7, 8, 9],
        segments=[
            Segment("policy", [16], "g", logprobs=[-0.7]),
            Segment("env", [23], "obs"),
            Segment("policy", [17, 18], "hi", logprobs=[-0.8, -0.9]),
        ],
    )
    return [t0, t1, t2]


def test_sequence_batch_hand_computed() -> None:
    b = sequence_batch(_trajectories(), PAD)
    assert isinstance(b, SequenceBatch)
    assert len(b) == 3
    # rows are prompt + completion, right-padded to the longest (9 tokens)
    assert b.input_ids.tolist() == [
        [1, 2, 3, 10, 11, 20, 21, 22, 12],
        [4, 5, 13, 14, 15, PAD, PAD, PAD, PAD],
        [6, 7, 8, 9, 16, 23, 17, 18, PAD],
    ]
    assert b.attention_mask.tolist() == [
        [1, 1, 1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 1, 1, 0],
    ]
    assert b.start == 2  # the shortest prompt
    # columns are positions 2..8 of each row
    assert b.loss_mask.shape == (3, 7)
    assert b.loss_mask.dtype == torch.float32
    assert b.loss_mask.tolist() == [
        [0, 1, 1, 0, 0, 0, 1],  # 3(prompt) 10 11 20 21 22(env) 12
        [1, 1, 1, 0, 0, 0, 0],  # 13 14 15, then padding
        [0, 0, 1, 0, 1, 1, 0],  # 8 9(prompt) 16 23(env) 17 18 pad
    ]
    expected_lp = [
        [0.0, -0.1, -0.2, 0.0, 0.0, 0.0, -0.3],
        [-0.4, -0.5, -0.6, 0.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, -0.7, 0.0, -0.8, -0.9, 0.0],
    ]
    torch.testing.assert_close(b.rollout_logprobs, torch.tensor(expected_lp), rtol=0, atol=1e-7)
    assert b.num_tokens == 9
    assert b.old_logprobs is None and b.ref_logprobs is None


def test_loss_mask_selects_exactly_the_policy_tokens() -> None:
    trajs = _trajectories()
    b = sequence_batch(trajs, PAD)
    for row, t in enumerate(trajs):
        cols = b.loss_mask[row].nonzero().flatten()
        picked = b.input_ids[row, b.start + cols].tolist()
        policy = [tok for s in t.segments if s.kind == "policy" for tok in s.token_ids]
        assert picked == policy
        assert b.rollout_logprobs[row, cols].tolist() == pytest.approx(
            [lp for s in t.segments if s.kind == "policy" for lp in s.logprobs]
        )


def test_sequence_batch_same_prompt_length_and_policy_without_logprobs() -> None:
    trajs = [
        Trajectory("a", [1, 2], [Segment("policy", [3, 4], "x")]),  # no log-probs reported
        Trajectory("b", [5, 6], [Segment("env", [7], "o"), Segment("policy", [8], "y", logprobs=[-1.5])]),
    ]
    b = sequence_batch(trajs, pad_id=49)
    assert b.start == 2
    assert b.input_ids.tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert b.loss_mask.tolist() == [[1, 1], [0, 1]]
    assert b.rollout_logprobs.tolist() == [[0.0, 0.0], [0.0, -1.5]]
    # a trajectory without any segment is all padding in the scored part
    b = sequence_batch([Trajectory("c", [1, 2, 3], []), trajs[0]], pad_id=49)
    assert b.input_ids.tolist() == [[1, 2, 3, 49], [1, 2, 3, 4]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert b.loss_mask.tolist() == [[0, 0], [1, 1]]


def test_sequence_batch_rejects_empty() -> None:
    with pytest.raises(ValueError):
        sequence_batch([], PAD)


# -- end to end: the batched log-probs at the loss-mask positions are the per-sequence log-probs --------


@pytest.fixture(scope="module")
def tiny_llama() -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
    )
    return transformers.LlamaForCausalLM(config).eval()


def _single_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Logits of one unpadded sequence, [len(ids), V]."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_batched_logprobs_match_unpadded_sequences(tiny_llama: torch.nn.Module, temperature: float) -> None:
    trajs = _trajectories()
    b = sequence_batch(trajs, PAD)
    with torch.no_grad():
        lp, ent = token_logprobs(
            tiny_llama,
            b.input_ids,
            b.attention_mask,
            start=b.start,
            temperature=temperature,
            with_entropy=True,
        )
    assert lp.shape == ent.shape == b.loss_mask.shape
    checked = 0
    for row, t in enumerate(trajs):
        ids = t.prompt_ids + t.completion_ids
        logits = _single_logits(tiny_llama, ids) / temperature
        logp = torch.log_softmax(logits, dim=-1)
        direct_ent = -(torch.softmax(logits, dim=-1) * logp).sum(-1)
        for j in b.loss_mask[row].nonzero().flatten().tolist():
            pos = b.start + j  # the scored token's position; predicted from position pos - 1
            assert lp[row, j].item() == pytest.approx(logp[pos - 1, ids[pos]].item(), abs=1e-5)
            assert ent[row, j].item() == pytest.approx(direct_ent[pos - 1].item(), abs=1e-5)
            checked += 1
        # every real (non-padding) target matches too, prompt positions included
        for j in range(lp.shape[1]):
            pos = b.start + j
            if pos < len(ids):
                assert lp[row, j].item() == pytest.approx(logp[pos - 1, ids[pos]].item(), abs=1e-5)
            else:  # padding targets are zeroed
                assert lp[row, j].item() == 0.0 and ent[row, j].item() == 0.0
    assert checked == b.num_tokens == 9
    # log-probs are negative, entropies within [0, log V]
    assert (lp[b.loss_mask.bool()] < 0).all()
    assert (ent[b.loss_mask.bool()] > 0).all() and (ent <= math.log(50) + 1e-5).all()


def test_entropy_from_logits() -> None:
    v = 50
    uniform = torch.zeros(2, 3, v)
    h = entropy_from_logits(uniform)
    assert h.shape == (2, 3)
    torch.testing.assert_close(h, torch.full((2, 3), math.log(v)))
    # uniform stays uniform at any temperature
    torch.testing.assert_close(
        entropy_from_logits(uniform + 7.0, temperature=0.3), torch.full((2, 3), math.log(v))
    )
    # a (nearly) one-hot distribution has entropy ~0
    peaked = torch.full((1, v), -1e4)
    peaked[0, 3] = 0.0
    assert entropy_from_logits(peaked).item() == pytest.approx(0.0, abs=1e-6)
    # two equally likely tokens: log 2
    two = torch.full((1, v), -1e4)
    two[0, [1, 2]] = 5.0
    assert entropy_from_logits(two).item() == pytest.approx(math.log(2), abs=1e-6)
    # matches the direct formula on random logits, with temperature
    torch.manual_seed(1)
    z = torch.randn(4, v) * 3
    direct = -(torch.softmax(z / 2.0, -1) * torch.log_softmax(z / 2.0, -1)).sum(-1)
    torch.testing.assert_close(entropy_from_logits(z, temperature=2.0), direct, rtol=1e-5, atol=1e-5)


def test_advantage_tensor_scalars_and_per_token_lists() -> None:
    from ragrl.rollout.sample import Sample
    from ragrl.train.batch import advantage_tensor

    trajs = _trajectories()
    samples = [Sample.from_trajectory(t, i) for i, t in enumerate(trajs)]
    for s, a in zip(samples, (1.0, -2.0, 0.5), strict=True):
        s.advantage = a
    b = sequence_batch(samples, PAD)
    assert advantage_tensor(samples, b).tolist() == [1.0, -2.0, 0.5]
    # one list: every row becomes [L - start], aligned with the loss mask's columns
    samples[2].advantage = [0.1, 0.2, 0.3, 0.4]  # tokens 16 23 17 18
    adv = advantage_tensor(samples, b)
    assert adv.shape == b.loss_mask.shape
    torch.testing.assert_close(
        adv,
        torch.tensor(
            [
                [0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],  # column 0 is row 0's last prompt token
                [-2.0, -2.0, -2.0, 0.0, 0.0, 0.0, 0.0],
                [0.0, 0.0, 0.1, 0.2, 0.3, 0.4, 0.0],
            ]
        ),
    )
    samples[2].advantage = [0.1]
    with pytest.raises(ValueError, match="1 per-token advantages for 4 completion tokens"):
        advantage_tensor(samples, b)
    samples[2].advantage = None
    with pytest.raises(ValueError, match="needs its advantage"):
        advantage_tensor(samples, b)


def test_minibatches_hold_whole_groups_and_chunks_cut_them() -> None:
    from ragrl.train.batch import chunks, group_minibatches

    group_ids = [7, 7, 3, 3, 3, 9, 7]  # groups in order of first appearance: 7, 3, 9
    assert group_minibatches(group_ids, 2) == [[0, 1, 2, 3, 4, 6], [5]]
    assert group_minibatches(group_ids, 1) == [list(range(7))]
    assert group_minibatches([], 2) == [[], []]
    assert chunks([0, 1, 2, 3, 4], 2) == [[0, 1], [2, 3], [4]]
    assert chunks([0, 1, 2], 0) == [[0, 1, 2]]
    assert chunks([], 4) == []
